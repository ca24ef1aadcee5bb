"""GPT-2: one fused Conv1D per layer, h.{i}.attn.c_attn, holding W_q, W_k and W_v side by side; learned positions.

Conv1D stores its weight as (in, out), the transpose of nn.Linear's (out, in): c_attn's
(D, 3D) splits into three (D, D) blocks, each transposed, and c_proj is transposed too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.models.families.family import DECODER, Family


@dataclass(frozen=True)
class Gpt2(Family):
    final_norm = "ln_f"
    attention_norm = "h.{index}.ln_1"

    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        base = f"h.{index}.attn"
        return base, {"w_q": f"{base}.c_attn", "w_k": f"{base}.c_attn", "w_v": f"{base}.c_attn", "w_o": f"{base}.c_proj"}

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        return f"h.{index}.mlp"

    def projection_shapes(self, config: dict, stack: str | None) -> dict[str, tuple[tuple[int, ...], str]]:
        hidden = self.size(config, "hidden")
        fused = ((hidden, 3 * hidden), "n_embd by 3 × n_embd (Conv1D: in by out)")
        return {"w_q": fused, "w_k": fused, "w_v": fused, "w_o": ((hidden, hidden), "n_embd by n_embd")}

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        hidden = self.size(config, "hidden")
        return {
            "wte.weight": ((self.size(config, "vocab"), hidden), "vocab_size by n_embd"),
            "wpe.weight": ((self.size(config, "positions"), hidden), "n_positions by n_embd"),
        }

    def projections(self, model: Any, names: dict[str, str]) -> list[tuple[Any, Any]]:
        """c_attn split into W_q, W_k, W_v, and c_proj: each transposed into nn.Linear's (out, in)."""
        c_attn, c_proj = model.get_submodule(names["w_q"]), model.get_submodule(names["w_o"])
        weight, bias = c_attn.weight.detach(), c_attn.bias.detach()  # (D, 3D), (3D,)
        size = weight.shape[1] // 3
        projections = [(weight[:, part * size : (part + 1) * size].T, bias[part * size : (part + 1) * size]) for part in range(3)]
        return [*projections, (c_proj.weight.detach().T, c_proj.bias.detach())]

    def add_position_scheme(self, weights: Any, model: Any, module: Any, stack: str | None) -> None:
        weights.fused_qkv = weights.names["w_q"]  # for traces: the model's one projection holding W_q, W_k, W_v


FAMILIES = (
    Gpt2(
        "GPT-2",
        ("gpt2",),
        DECODER,
        {
            "layers": ("n_layer", 12),
            "heads": ("n_head", 12),
            "hidden": ("n_embd", 768),
            "positions": ("n_positions", 1024),
            "vocab": ("vocab_size", 50257),
        },
        "GPT2Model",
    ),
)

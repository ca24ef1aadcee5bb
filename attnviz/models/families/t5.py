"""T5: an encoder-decoder with relative positions, and no 1/sqrt(d) scaling.

Each block's self-attention is {encoder,decoder}.block.{i}.layer.0.SelfAttention, a decoder
block's attention over the encoder's output decoder.block.{i}.layer.1.EncDecAttention, each
with q, k, v and o (no biases). Positions enter as a learned bias per head and relative
distance (bucketed), added to the scores: the first block of each stack holds its table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.models.families.family import ENCODER_DECODER, Family


@dataclass(frozen=True)
class T5(Family):
    position_bias = True
    final_norm = "{side}.final_layer_norm"
    cross_attention_norm = "decoder.block.{index}.layer.1.layer_norm"

    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        side = "decoder" if stack in ("decoder", "cross") else "encoder"
        base = f"{side}.block.{index}.layer.1.EncDecAttention" if stack == "cross" else f"{side}.block.{index}.layer.0.SelfAttention"
        return base, {"w_q": f"{base}.q", "w_k": f"{base}.k", "w_v": f"{base}.v", "w_o": f"{base}.o"}

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        decoder = stack in ("decoder", "cross")  # a decoder's block: self-attention, cross-attention, then the MLP
        return f"{'decoder' if decoder else 'encoder'}.block.{index}.layer.{2 if decoder else 1}.DenseReluDense"

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"shared.weight": ((self.size(config, "vocab"), self.size(config, "hidden")), "vocab_size by d_model")}

    def add_position_scheme(self, weights: Any, model: Any, module: Any, stack: str | None) -> None:
        weights.position_bias = stack != "cross"  # cross-attention has no relative positions: two texts

    def relative_bias(self, model: Any, stack: str | None, num_queries: int, num_keys: int, device: str) -> Any:
        """The stack's relative position bias (1, H, Nq, Nk), from its first block's bucket table; None for cross-attention."""
        import torch

        if stack == "cross":
            return None
        side = "decoder" if stack == "decoder" else "encoder"
        first = model.get_submodule(f"{side}.block.0.layer.0.SelfAttention")
        with torch.inference_mode():
            return first.compute_bias(num_queries, num_keys, device=device)


FAMILIES = (
    T5(
        "T5",
        ("t5",),
        ENCODER_DECODER,
        {
            "layers": ("num_layers", 6),
            "heads": ("num_heads", 8),
            "decoder_layers": ("num_decoder_layers", None),
            "decoder_heads": ("num_heads", 8),
            "hidden": ("d_model", 512),
            "head_dim": ("d_kv", 64),
            "positions": ("n_positions", 512),  # relative positions have no end; 512 is what T5 was trained on
            "vocab": ("vocab_size", 32128),
        },
        "T5Model",
    ),
)

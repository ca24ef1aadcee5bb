"""Llama's layout: Llama, Mistral, Qwen2 and Qwen3 (and any model of Llama's architecture).

Each layer's attention is layers.{i}.self_attn with q_proj, k_proj, v_proj and o_proj; the key
and value projections may have fewer heads than the queries (grouped-query attention), each
shared by a group of query heads. Positions are rotary (RoPE): q and k are rotated by position
with the frequencies of the model's rotary embedding, whose rope type and scaling (llama3,
yarn, linear, ...) come from config.json. A split into other heads (--heads) gets the
frequencies for its head size from the same rotary embedding class, built with that head size.
Qwen3 normalises each head's q and k (RMSNorm) before the rotation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from typing import Any

from attnviz.models.families.family import DECODER, Family


@dataclass(frozen=True)
class LlamaLayout(Family):
    rotary = True
    final_norm = "norm"
    attention_norm = "layers.{index}.input_layernorm"
    attention_is_one_module = True

    def check_config(self, config: dict) -> None:
        super().check_config(config)
        theta = rope_theta(config)
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise ValueError(f"config.json: rope_theta must be a positive number, not {theta!r}")

    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        base = f"layers.{index}.self_attn"
        return base, {"w_q": f"{base}.q_proj", "w_k": f"{base}.k_proj", "w_v": f"{base}.v_proj", "w_o": f"{base}.o_proj"}

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        return f"layers.{index}.mlp"

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"embed_tokens.weight": ((self.size(config, "vocab"), self.size(config, "hidden")), "vocab_size by hidden_size")}

    def add_position_scheme(self, weights: Any, model: Any, module: Any, stack: str | None) -> None:
        rotary = model.rotary_emb
        weights.rotary_inv_freq = rotary.inv_freq.detach().float()
        weights.rotary_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        weights.rope_theta = float(rope_theta(model.config.to_dict()))
        weights.rotary_for = partial(rotary_for_head_dim, type(rotary), model.config)
        if getattr(module, "q_norm", None) is not None:  # Qwen3
            weights.q_norm = (module.q_norm.weight.detach(), module.q_norm.variance_epsilon)
            weights.k_norm = (module.k_norm.weight.detach(), module.k_norm.variance_epsilon)


def rotary_for_head_dim(rotary_class: type, config: Any, head_dim: int) -> tuple[Any, float]:
    """RoPE's frequencies (d/2,) and attention factor for heads of head_dim features, with the model's own rope type and scaling.

    The model's rotary embedding class, built from its config with head_dim changed: what
    transformers' own attention would use with heads of that size.
    """
    resized = copy.deepcopy(config)
    resized.head_dim = head_dim
    rotary = rotary_class(resized)
    return rotary.inv_freq.detach().float(), float(getattr(rotary, "attention_scaling", 1.0))


def rope_theta(config: dict) -> object:
    """RoPE's base: in rope_parameters (transformers 5), rope_scaling, or at the top of config.json; 10000 by default."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    parameters = parameters if isinstance(parameters, dict) else {}
    theta = parameters.get("rope_theta", config.get("rope_theta"))
    return 10000.0 if theta is None else theta


LLAMA_KEYS = {
    "layers": ("num_hidden_layers", 32),
    "heads": ("num_attention_heads", 32),
    "kv_heads": ("num_key_value_heads", None),
    "hidden": ("hidden_size", 4096),
    "head_dim": ("head_dim", None),
    "positions": ("max_position_embeddings", 2048),
    "vocab": ("vocab_size", 32000),
}
QWEN_KEYS = {  # Qwen2Config's and Qwen3Config's defaults: 32 key/value heads, a vocabulary of 151936
    **LLAMA_KEYS,
    "kv_heads": ("num_key_value_heads", 32),
    "positions": ("max_position_embeddings", 32768),
    "vocab": ("vocab_size", 151936),
}

FAMILIES = (
    LlamaLayout("Llama", ("llama",), DECODER, LLAMA_KEYS, "LlamaModel"),
    LlamaLayout(
        "Mistral", ("mistral",), DECODER,
        {**LLAMA_KEYS, "kv_heads": ("num_key_value_heads", 8), "positions": ("max_position_embeddings", 131072)}, "MistralModel",
    ),
    LlamaLayout("Qwen2", ("qwen2",), DECODER, QWEN_KEYS, "Qwen2Model"),
    LlamaLayout("Qwen3", ("qwen3",), DECODER, {**QWEN_KEYS, "head_dim": ("head_dim", 128)}, "Qwen3Model"),
)

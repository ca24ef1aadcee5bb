"""BART's layout: BART and Marian, encoder-decoders whose stacks' layers are {encoder,decoder}.layers.{i}.

Each layer's self-attention is self_attn, and a decoder layer's attention over the encoder's
output encoder_attn, each with q_proj, k_proj, v_proj and out_proj. Positions are learned
(BART's numbered from 2) or sinusoidal (Marian's), added to the embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnviz.models.families.family import ENCODER_DECODER, Family


@dataclass(frozen=True)
class BartLayout(Family):
    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        side = "decoder" if stack in ("decoder", "cross") else "encoder"
        base = f"{side}.layers.{index}.{'encoder_attn' if stack == 'cross' else 'self_attn'}"
        return base, {"w_q": f"{base}.q_proj", "w_k": f"{base}.k_proj", "w_v": f"{base}.v_proj", "w_o": f"{base}.out_proj"}

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        return f"{'decoder' if stack in ('decoder', 'cross') else 'encoder'}.layers.{index}.fc2"  # before final_layer_norm

    def sublayer_norms(self, index: int, stack: str | None) -> tuple[str, ...]:
        if stack in ("decoder", "cross"):
            return tuple(f"decoder.layers.{index}.{name}" for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"))
        return tuple(f"encoder.layers.{index}.{name}" for name in ("self_attn_layer_norm", "final_layer_norm"))

    def embedding_norm_name(self, stack: str | None) -> str | None:
        return f"{'decoder' if stack in ('decoder', 'cross') else 'encoder'}.layernorm_embedding"  # Marian has none

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"shared.weight": ((self.size(config, "vocab"), self.size(config, "hidden")), "vocab_size by d_model")}


BART_KEYS = {
    "layers": ("encoder_layers", 12),
    "heads": ("encoder_attention_heads", 16),
    "decoder_layers": ("decoder_layers", 12),
    "decoder_heads": ("decoder_attention_heads", 16),
    "hidden": ("d_model", 1024),
    "positions": ("max_position_embeddings", 1024),
    "vocab": ("vocab_size", 50265),
}

FAMILIES = (
    BartLayout("BART", ("bart",), ENCODER_DECODER, BART_KEYS, "BartModel", position_offset=2),
    BartLayout("Marian", ("marian",), ENCODER_DECODER, {**BART_KEYS, "vocab": ("vocab_size", 58101)}, "MarianModel"),
)

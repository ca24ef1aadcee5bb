"""DistilBERT: BERT's layout renamed, transformer.layer.{i}.attention with q_lin, k_lin, v_lin and out_lin; learned positions."""

from __future__ import annotations

from dataclasses import dataclass

from attnviz.models.families.family import ENCODER, Family, MaskedLM


@dataclass(frozen=True)
class DistilBert(Family):
    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        base = f"transformer.layer.{index}.attention"
        return base, {"w_q": f"{base}.q_lin", "w_k": f"{base}.k_lin", "w_v": f"{base}.v_lin", "w_o": f"{base}.out_lin"}

    def post_norm_names(self, index: int) -> tuple[str, str]:
        return f"transformer.layer.{index}.sa_layer_norm", f"transformer.layer.{index}.output_layer_norm"

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        return f"transformer.layer.{index}.ffn"  # lin1, the activation, lin2: before output_layer_norm

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        hidden = self.size(config, "hidden")
        return {
            "embeddings.word_embeddings.weight": ((self.size(config, "vocab"), hidden), "vocab_size by dim"),
            "embeddings.position_embeddings.weight": ((self.size(config, "positions"), hidden), "max_position_embeddings by dim"),
        }


FAMILIES = (
    DistilBert(
        "DistilBERT",
        ("distilbert",),
        ENCODER,
        {
            "layers": ("n_layers", 6),
            "heads": ("n_heads", 12),
            "hidden": ("dim", 768),
            "positions": ("max_position_embeddings", 512),
            "vocab": ("vocab_size", 30522),
        },
        "DistilBertModel",
        # DistilBertForMaskedLM's head: config.json's activation, its LayerNorm's eps fixed
        masked_lm=MaskedLM("vocab_transform", "vocab_layer_norm", "vocab_projector.bias", "vocab_projector.weight",
                           activation=("activation", "gelu"), eps=(None, 1e-12)),
    ),
)

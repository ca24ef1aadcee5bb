"""ALBERT: BERT's attention with parameters shared across layers, and embeddings narrower than the layers.

num_hidden_layers layers share num_hidden_groups groups of weights (one, in every released
ALBERT): layer i computes with group i * groups // layers, stored as
encoder.albert_layer_groups.{g}.albert_layers.0.attention (query, key, value, dense).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnviz.models.families.bert import BERT_KEYS
from attnviz.models.families.family import ENCODER, Family, MaskedLM


@dataclass(frozen=True)
class Albert(Family):
    unused_weights = ("pooler.",)

    def check_config(self, config: dict) -> None:
        super().check_config(config)
        if config.get("inner_group_num", 1) != 1:
            raise ValueError("ALBERT with inner_group_num other than 1 is not supported: every released ALBERT has 1")
        groups = config.get("num_hidden_groups", 1)
        if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= self.size(config, "layers"):
            raise ValueError(f"config.json: num_hidden_groups must be a whole number from 1 to num_hidden_layers, not {groups!r}")

    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        base = f"encoder.albert_layer_groups.{index}.albert_layers.0.attention"
        return base, {"w_q": f"{base}.query", "w_k": f"{base}.key", "w_v": f"{base}.value", "w_o": f"{base}.dense"}

    embedding_projection = "encoder.embedding_hidden_mapping_in"  # the embeddings (embedding_size) up to the layers' width

    def post_norm_names(self, index: int) -> tuple[str, str]:
        layer = f"encoder.albert_layer_groups.{index}.albert_layers.0"
        return f"{layer}.attention.LayerNorm", f"{layer}.full_layer_layer_norm"

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        return f"encoder.albert_layer_groups.{index}.albert_layers.0.ffn_output"  # before full_layer_layer_norm

    def stored_index(self, config: dict, layer: int, stack: str | None) -> int:
        return layer * config.get("num_hidden_groups", 1) // self.size(config, "layers")

    def stored_layers(self, config: dict, stack: str | None) -> tuple[int, str]:
        return config.get("num_hidden_groups", 1), "num_hidden_groups"

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        width = self.size(config, "embedding")
        return {
            "embeddings.word_embeddings.weight": ((self.size(config, "vocab"), width), "vocab_size by embedding_size"),
            "embeddings.position_embeddings.weight": ((self.size(config, "positions"), width), "max_position_embeddings by embedding_size"),
        }


FAMILIES = (
    Albert(
        "ALBERT",
        ("albert",),
        ENCODER,
        {
            **BERT_KEYS,
            "hidden": ("hidden_size", 4096),
            "heads": ("num_attention_heads", 64),
            "vocab": ("vocab_size", 30000),
            "embedding": ("embedding_size", 128),
        },
        "AlbertModel",
        # AlbertMLMHead: dense from the layers' width down to the embeddings'; AlbertConfig's hidden_act is gelu_new
        masked_lm=MaskedLM("predictions.dense", "predictions.LayerNorm", "predictions.bias", "predictions.decoder.weight",
                           activation=("hidden_act", "gelu_new")),
    ),
)

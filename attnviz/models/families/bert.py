"""BERT's layout: BERT itself (read by attnviz, models/bert.py), and RoBERTa and XLM-RoBERTa through transformers.

Each layer's attention is encoder.layer.{i}.attention: self.query, self.key, self.value, and
output.dense beside self. Positions are learned (RoBERTa's and XLM-RoBERTa's numbered from 2,
after the padding token's): the embeddings add them before the first layer. ELECTRA
(electra.py) keeps this layout too.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnviz.models.families.family import ENCODER, Family, MaskedLM


@dataclass(frozen=True)
class BertLayout(Family):
    unused_weights = ("pooler.",)  # after the last layer: hub checkpoints often lack it

    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        base = f"encoder.layer.{index}.attention"
        return f"{base}.self", {
            "w_q": f"{base}.self.query", "w_k": f"{base}.self.key", "w_v": f"{base}.self.value", "w_o": f"{base}.output.dense",
        }

    embedding_projection = "embeddings_project"  # ELECTRA's, where its embeddings are narrower than its layers

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        return f"encoder.layer.{index}.output.dense"  # before the dropout, the residual and output.LayerNorm

    def post_norm_names(self, index: int) -> tuple[str, str]:
        return f"encoder.layer.{index}.attention.output.LayerNorm", f"encoder.layer.{index}.output.LayerNorm"

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        # ELECTRA's embeddings may be narrower than the layers (embedding_size), projected up to them
        width_key = self.key_name("embedding" if "embedding" in self.keys else "hidden")
        width = self.size(config, "embedding") or self.size(config, "hidden")
        return {
            "embeddings.word_embeddings.weight": ((self.size(config, "vocab"), width), f"{self.keys['vocab'][0]} by {width_key}"),
            "embeddings.position_embeddings.weight": ((self.size(config, "positions"), width), f"{self.keys['positions'][0]} by {width_key}"),
        }


BERT_KEYS = {
    "layers": ("num_hidden_layers", 12),
    "heads": ("num_attention_heads", 12),
    "hidden": ("hidden_size", 768),
    "positions": ("max_position_embeddings", 512),
    "vocab": ("vocab_size", 30522),
}

# BertForMaskedLM's head (BertLMPredictionHead), and RobertaLMHead's (GELU fixed)
BERT_MLM = MaskedLM("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias", "cls.predictions.decoder.weight")
ROBERTA_MLM = MaskedLM("lm_head.dense", "lm_head.layer_norm", "lm_head.bias", "lm_head.decoder.weight", activation=(None, "gelu"))

FAMILIES = (
    BertLayout("BERT", ("bert",), ENCODER, BERT_KEYS, masked_lm=BERT_MLM),  # attnviz reads it itself: no transformers class
    BertLayout("RoBERTa", ("roberta",), ENCODER, {**BERT_KEYS, "vocab": ("vocab_size", 50265)}, "RobertaModel", position_offset=2,
               masked_lm=ROBERTA_MLM),  # fmt: skip
    BertLayout("XLM-RoBERTa", ("xlm-roberta",), ENCODER, BERT_KEYS, "XLMRobertaModel", position_offset=2, masked_lm=ROBERTA_MLM),
)

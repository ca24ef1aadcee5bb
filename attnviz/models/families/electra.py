"""ELECTRA: BERT's layout (bert.py), with embeddings narrower than the layers (embedding_size), projected up to them."""

from __future__ import annotations

from attnviz.models.families.bert import BERT_KEYS, BertLayout
from attnviz.models.families.family import ENCODER, MaskedLM

FAMILIES = (
    BertLayout(
        "ELECTRA",
        ("electra",),
        ENCODER,
        {**BERT_KEYS, "hidden": ("hidden_size", 256), "heads": ("num_attention_heads", 4), "embedding": ("embedding_size", 128)},
        "ElectraModel",
        # ElectraForMaskedLM, the generator: ElectraGeneratorPredictions (GELU fixed), then generator_lm_head
        masked_lm=MaskedLM("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias",
                           "generator_lm_head.weight", activation=(None, "gelu")),
    ),
)

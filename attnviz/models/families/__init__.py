"""The model families attnviz loads, one adapter module per layout of weights: plain data, no torch.

Each module (bert.py, distilbert.py, albert.py, electra.py, gpt2.py, llama.py, bart.py, t5.py) holds its
families: config keys, transformers class, module names, weight splitting and position scheme
(family.py says what an adapter is). A new family is one entry in the module of its layout, or
a new module listed in ADAPTERS, plus its tiny test checkpoint (tests/tiny_families.py). The
families' list, `attnviz models`, the --model help and the errors that name the supported
families all derive from ADAPTERS.
"""

from __future__ import annotations

from attnviz.models.families import albert, bart, bert, distilbert, electra, gpt2, llama, t5
from attnviz.models.families.family import DECODER, ENCODER, ENCODER_DECODER, Family

__all__ = ["DECODER", "ENCODER", "ENCODER_DECODER", "FAMILIES", "Family", "family_of", "supported_names"]

ADAPTERS = (bert, distilbert, albert, electra, gpt2, llama, bart, t5)  # in the order people read them: encoders first
FAMILIES: tuple[Family, ...] = tuple(family for adapter in ADAPTERS for family in adapter.FAMILIES)

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def family_of(config: dict) -> Family | None:
    """The family of a config.json's values, None when attnviz does not support it."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None


def supported_names(kind: str | None = None) -> str:
    """'BERT, RoBERTa, ..., T5': for the error that refuses another family; with kind (DECODER, ...), its families'."""
    return ", ".join(family.name for family in FAMILIES if kind in (None, family.kind))

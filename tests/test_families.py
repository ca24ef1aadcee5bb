"""The family table (the adapters in attnviz/models/families/) against transformers' own config and model classes.

The expectation is what transformers' config object says once built from the same values: its
attributes (num_hidden_layers, num_attention_heads, num_key_value_heads, ..., through each class's
attribute_map), or, for a size a config object does not keep, the expression transformers' own
attention modules use (head_dim: `getattr(config, "head_dim", None) or hidden_size // num_attention_heads`).
Each family is read three ways: a config.json with nothing but its model_type (the class's
defaults), a config.json with a few sizes given and the rest left out, and the whole config.json
that save_pretrained writes.
"""

from __future__ import annotations

import pytest
import transformers

from attnviz.models.families import DECODER, ENCODER, ENCODER_DECODER, FAMILIES, family_of, supported_names

CONFIG_CLASSES = {
    "bert": "BertConfig",
    "roberta": "RobertaConfig",
    "xlm-roberta": "XLMRobertaConfig",
    "distilbert": "DistilBertConfig",
    "albert": "AlbertConfig",
    "electra": "ElectraConfig",
    "gpt2": "GPT2Config",
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "bart": "BartConfig",
    "marian": "MarianConfig",
    "t5": "T5Config",
}

# A few sizes given, in each class's own argument names; the rest left to the class's defaults.
GIVEN = {
    "bert": [{"num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 32, "vocab_size": 99}],
    "roberta": [{"num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 32, "max_position_embeddings": 66}],
    "xlm-roberta": [{"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 16, "vocab_size": 250002}],
    "distilbert": [{"n_layers": 3, "n_heads": 4, "dim": 32, "hidden_dim": 64, "max_position_embeddings": 40}],
    "albert": [{"num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 32, "embedding_size": 16}],
    "electra": [{"num_hidden_layers": 3, "num_attention_heads": 2, "hidden_size": 32, "embedding_size": 16}],
    "gpt2": [{"n_layer": 3, "n_head": 4, "n_embd": 32, "n_positions": 64, "vocab_size": 101}],
    "llama": [
        {"num_hidden_layers": 3, "num_attention_heads": 6, "hidden_size": 48},  # no key/value head count, no head_dim
        {"num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 48, "head_dim": 16},
    ],
    "mistral": [
        {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 64},
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_size": 32},
    ],
    "qwen2": [
        {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32},  # Qwen2Config keeps its 32 key/value heads
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "vocab_size": 77},
    ],
    "qwen3": [{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "head_dim": 12}],
    "bart": [{"encoder_layers": 3, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 2, "d_model": 32}],
    "marian": [{"encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 4, "d_model": 16}],
    "t5": [
        {"num_layers": 3, "num_heads": 4, "d_model": 32, "d_kv": 8},  # no decoder depth: as deep as the encoder
        {"num_layers": 3, "num_decoder_layers": 1, "num_heads": 2, "d_model": 32, "d_kv": 16, "vocab_size": 55},
    ],
}


def config_object(model_type: str, given: dict):
    return getattr(transformers, CONFIG_CLASSES[model_type])(**given)


def expected_sizes(model_type: str, config) -> dict:
    """What transformers makes of each size: the config object's attributes, independent of attnviz's table."""
    heads = config.num_attention_heads
    sizes = {
        "layers": config.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,  # no grouped-query attention: one per head
        "hidden": config.hidden_size,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "vocab": config.vocab_size,
        "positions": config.max_position_embeddings if model_type != "t5" else None,
        "decoder_layers": None,
        "decoder_heads": None,
    }
    if model_type == "t5":  # one head count for both stacks
        sizes.update(decoder_layers=config.num_decoder_layers, decoder_heads=config.num_heads)
    elif model_type in ("bart", "marian"):
        sizes.update(decoder_layers=config.decoder_layers, decoder_heads=config.decoder_attention_heads)
    return sizes


def attnviz_sizes(config_json: dict, skip_positions: bool) -> dict:
    family = family_of(config_json)
    keys = ("layers", "heads", "kv_heads", "hidden", "head_dim", "vocab", "positions", "decoder_layers", "decoder_heads")
    sizes = {key: family.size(config_json, key) for key in keys}
    if skip_positions:  # T5's relative positions: transformers keeps no count (attnviz's 512 is what T5 was trained on)
        sizes["positions"] = None
    return sizes


CASES = [(model_type, given) for model_type, givens in GIVEN.items() for given in givens]


def test_every_family_is_checked_here():
    assert {model_type for family in FAMILIES for model_type in family.model_types} == CONFIG_CLASSES.keys() == GIVEN.keys()


@pytest.mark.parametrize("model_type", CONFIG_CLASSES)
def test_a_config_json_with_only_its_model_type_reads_as_transformers_defaults(model_type):
    expected = expected_sizes(model_type, config_object(model_type, {}))
    assert attnviz_sizes({"model_type": model_type}, skip_positions=model_type == "t5") == expected


@pytest.mark.parametrize(("model_type", "given"), CASES)
def test_a_config_json_with_some_sizes_given_reads_as_transformers_does(model_type, given):
    expected = expected_sizes(model_type, config_object(model_type, given))
    assert attnviz_sizes({"model_type": model_type, **given}, skip_positions=model_type == "t5") == expected


@pytest.mark.parametrize(("model_type", "given"), CASES)
def test_the_config_json_save_pretrained_writes_reads_as_the_config_object(model_type, given):
    config = config_object(model_type, given)
    config_json = config.to_dict()
    assert family_of(config_json).model_types == (model_type,)
    assert attnviz_sizes(config_json, skip_positions=model_type == "t5") == expected_sizes(model_type, config)


def test_the_grouped_query_sizes_are_the_ones_given():
    """The point of the table for GQA: 6 query heads sharing 2 key/value heads, each of 16 dimensions."""
    config_json = config_object("llama", GIVEN["llama"][1]).to_dict()
    llama = family_of(config_json)
    assert (llama.size(config_json, "heads"), llama.size(config_json, "kv_heads"), llama.size(config_json, "head_dim")) == (6, 2, 16)


@pytest.mark.parametrize(
    ("model_type", "kind", "causal"),
    [("bert", ENCODER, False), ("gpt2", DECODER, True), ("llama", DECODER, True), ("t5", ENCODER_DECODER, False)],
)
def test_kinds_and_causality(model_type, kind, causal):
    family = family_of({"model_type": model_type})
    assert (family.kind, family.causal) == (kind, causal)


@pytest.mark.parametrize("config_json", [{"model_type": "whisper"}, {}, {"model_type": 3}, ["bert"], "bert"])
def test_an_unsupported_or_malformed_config_has_no_family(config_json):
    assert family_of(config_json) is None


def test_supported_names_lists_every_family_once():
    assert supported_names().split(", ") == [family.name for family in FAMILIES]


@pytest.mark.parametrize("family", [family for family in FAMILIES if family.model_class], ids=lambda family: family.name)
def test_each_adapter_names_the_transformers_class_of_its_model_type(family):
    """The adapter's base model class is the one transformers builds for its model_type (no task head)."""
    model_class = getattr(transformers, family.model_class)
    assert model_class.config_class.model_type in family.model_types
    assert model_class.__name__ == transformers.MODEL_MAPPING[model_class.config_class].__name__


def test_only_bert_is_read_by_attnviz_itself():
    assert [family.name for family in FAMILIES if family.model_class is None] == ["BERT"]

"""Shared fixtures: the bundled model as attnviz loads it, and transformers' own BERT as the reference."""

import pytest


@pytest.fixture(scope="session")
def bundled_bert():
    from attnviz.models.loading import load_model

    return load_model("bundled", "cpu")


@pytest.fixture(scope="session")
def reference_bert():
    """transformers' BertModel (eager attention, so it returns its attention weights) and tokenizer."""
    from transformers import AutoTokenizer, BertModel

    from attnviz.models.loading import bundled_model_path

    folder = bundled_model_path()
    model = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    return AutoTokenizer.from_pretrained(folder), model


@pytest.fixture(scope="session")
def plain_spec(bundled_bert):
    """The settings of a plain run of the bundled model: layer 0, its own heads, pretrained, on the CPU."""
    from attnviz.spec import RunSpec

    return RunSpec(
        model="bundled", resolved_model=bundled_bert.name, model_source=bundled_bert.source, layer=0,
        num_heads=bundled_bert.num_heads, weights="pretrained", seed=0, causal=False, kv_text=None, device="cpu",
        truncate=False,
    )  # fmt: skip

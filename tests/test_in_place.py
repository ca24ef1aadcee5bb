"""attnviz's layers in the place of a transformers model's attention (passes.in_models_place, blocks_in_place): one
pass whose every layer's attention is attnviz's layer over what entered it, the model's W_o and the rest of its layers
going on from there, as attnviz's BERT has always run (in_berts_place).

Each layer's input from that pass against transformers' own eager forward pass, with pre-hooks written out here, within
float32 (its attention and attnviz's round differently); the summaries' pass and a capture of the layers' inputs are
one pass's floats, bit for bit; where attnviz's layers do not compute what the model's attention does, no pass runs so.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attnviz.layer_inputs import encode_texts
from attnviz.models.loading import load_model
from attnviz.own_layer import build_layers
from attnviz.passes import capture_states, in_models_place
from attnviz.spec import run_spec

TEXTS = ["The cat sat on the mat because it was tired.", "Attention is all."]


def eager_inputs(loaded, inputs: dict) -> list[torch.Tensor]:
    """What entered each layer's attention module in transformers' own eager forward pass, by this test's pre-hooks."""
    model = loaded.model.model
    modules = loaded.model.hook_points().attention
    entered: list[torch.Tensor] = []
    handles = [module.register_forward_pre_hook(lambda module, args, kwargs: entered.append((args[0] if args else kwargs["hidden_states"]).clone()),
                                                with_kwargs=True) for module in dict.fromkeys(modules)]  # fmt: skip
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return entered  # in call order: layer by layer (ALBERT's one module, once per layer)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2", "roberta", "albert", "distilbert"])
def test_each_layers_input_in_the_models_place_is_transformers_own_within_float32(family, tmp_path):
    """Three layers: the input of the last is made by two layers' attention in the model's place."""
    from tiny_families import FAMILY_CHECKPOINTS, save_checkpoint

    config, model_class, tokenizer = FAMILY_CHECKPOINTS[family]()
    config.num_hidden_layers = 3
    if getattr(config, "layer_types", None):  # Qwen3's, one per layer
        config.layer_types = config.layer_types[:1] * 3
    save_checkpoint(config, model_class, tokenizer(), tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.num_layers == 3
    spec = run_spec(loaded, str(tmp_path), layer=None)
    assert in_models_place(loaded, spec)
    encoded = encode_texts(loaded, TEXTS, spec)  # a padded batch: the mask of the shorter text too
    layers = list(range(loaded.num_layers))
    states = capture_states(loaded, encoded, layers, spec)
    inputs = {"input_ids": encoded.queries.input_ids, "attention_mask": encoded.queries.attention_mask}
    for layer, expected in zip(layers, eager_inputs(loaded, inputs)):
        real = encoded.queries.attention_mask.bool()  # padding's rows are nobody's numbers
        torch.testing.assert_close(states[layer].queries[real], expected[real], rtol=0, atol=1e-5)
    assert torch.equal(states[0].queries, eager_inputs(loaded, inputs)[0])  # no attention before layer 0: the same floats


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_where_the_attention_module_is_one_attnviz_runs_in_its_place_and_its_own_q_k_v_never_run(family, tmp_path):
    """Llama's self_attn (Family.attention_is_one_module): the pass runs attnviz's layer and the module's W_o in its
    place, its q, k and v projections never called; after the pass the module is the class's again."""
    from tiny_families import FAMILY_CHECKPOINTS, save_checkpoint

    config, model_class, tokenizer = FAMILY_CHECKPOINTS[family]()
    save_checkpoint(config, model_class, tokenizer(), tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.family.attention_is_one_module
    spec = run_spec(loaded, str(tmp_path), layer=None)
    encoded = encode_texts(loaded, TEXTS, spec)
    points = loaded.model.hook_points()
    calls = {role: 0 for role in ("q", "k", "v", "o")}
    modules = {role: points.projections[role] for role in ("q", "k", "v")} | {"o": points.stack.projections}

    def counter(role):
        def count(*ignored):
            calls[role] += 1

        return count

    handles = [module.register_forward_hook(counter(role)) for role, each in modules.items() for module in each]
    try:
        capture_states(loaded, encoded, list(range(loaded.num_layers)), spec)  # stops before the last layer attends
        assert calls == {"q": 0, "k": 0, "v": 0, "o": loaded.num_layers - 1}
        assert not any("forward" in vars(module) for module in points.attention)
        with torch.inference_mode():
            loaded.model.model(input_ids=encoded.queries.input_ids, attention_mask=encoded.queries.attention_mask)
        assert calls == {"q": loaded.num_layers, "k": loaded.num_layers, "v": loaded.num_layers, "o": 2 * loaded.num_layers - 1}
    finally:
        for handle in handles:
            handle.remove()


def test_the_summaries_pass_and_a_capture_are_one_passs_floats(decoder_folder):
    from attnviz.analysis.head_summaries import summarise_in_place
    from attnviz.budgets import block_budget

    loaded = load_model(str(decoder_folder))
    spec = run_spec(loaded, str(decoder_folder), layer=None)
    encoded = encode_texts(loaded, TEXTS[:1], spec)
    layers = build_layers(loaded, spec)
    _, kept = summarise_in_place(loaded, TEXTS[0], encoded, layers, spec, block_budget(spec), keep=range(len(layers)))
    captured = capture_states(loaded, encoded, list(range(len(layers))), spec)
    for layer in range(len(layers)):
        assert torch.equal(kept[layer].queries, captured[layer].queries)


def test_attnviz_runs_in_the_models_place_only_where_it_computes_what_the_models_attention_does(decoder_folder):
    loaded = load_model(str(decoder_folder))
    spec = run_spec(loaded, str(decoder_folder), layer=None)
    assert in_models_place(loaded, spec)
    assert not in_models_place(loaded, replace(spec, weights="random"))
    assert not in_models_place(loaded, replace(spec, num_heads=2))  # the projections split into other heads
    assert not in_models_place(loaded, replace(spec, causal=False))  # a decoder seen without its mask
    assert not in_models_place(loaded, replace(spec, kv_text="Attention is all."))
    assert not in_models_place(load_model("bundled"), run_spec(load_model("bundled"), layer=None))  # BERT's own: in_berts_place

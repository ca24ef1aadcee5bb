"""roles' one pass over its text (analysis/roles.text_roles): the capture of every layer's input gives the role numbers,
the summaries and the report, and layer 0's run, which the report shows, is the one whose map gave that layer's numbers.

Bit for bit, because each is the same computation as before on the same input: the report's layer 0 against
pipeline.run_attention's own run of the text, every layer against run_layers' own pass, and the numbers against a pass
of blocks over a capture of their own (the way they were computed before the capture was shared). Where attnviz's layer
made the whole map at once (a short text), that map is bitwise the one block a pass of blocks makes of it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import attnviz
from attnviz.analysis.head_numbers import RoleSettings
from attnviz.analysis.head_summaries import summarise_layers
from attnviz.analysis.roles import RoleSums, text_roles
from attnviz.attention.layer import rows_per_block
from attnviz.budgets import block_budget
from attnviz.layer_inputs import encode_texts, layer_states, threads_for
from attnviz.models.loading import load_model
from attnviz.own_layer import build_layers
from attnviz.passes import iter_layer_blocks
from attnviz.pipeline import run_attention, run_layers
from attnviz.spec import run_spec

TEXTS = ("The cat sat on the mat because it was tired.", "The cat sat on the mat. The cat sat on the mat because it was tired, the cat.")


@pytest.fixture(scope="module", params=["llama", "bert"])
def model(request, decoder_folder):
    loaded = load_model(str(decoder_folder) if request.param == "llama" else "bundled", "cpu")
    return loaded, run_spec(loaded, layer=None, device="cpu")


def own_numbers(loaded, text: str, spec, budget: int) -> dict:
    """The text's TEXT_SCORES as text_roles computed them before its capture was shared: RoleSums fed every block of a
    pass of blocks over a capture of its own (in BERT's place: the in-place pass)."""
    from attnviz.passes import in_berts_place

    encoded = encode_texts(loaded, [text], spec)
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    sums = RoleSums(len(layers), max(layer.num_heads for layer in layers), list(encoded.queries.ids[0]), causal=spec.causal,
                    settings=RoleSettings())  # fmt: skip
    for layer, first_query, weights in iter_layer_blocks(loaded, encoded, layers, spec, budget, in_berts_place(loaded, spec)):
        sums.add(layer, first_query, weights[0])
    return sums.scores()


@pytest.mark.parametrize("text", TEXTS)
def test_the_roles_pass_numbers_and_maps_are_those_of_each_stage_run_alone_bit_for_bit(model, text):
    loaded, spec = model
    budget = block_budget(spec)
    passed = text_roles(loaded, text, spec, budget, RoleSettings(), keep=lambda tokens, run: True)
    (alone,) = run_attention(loaded, [text], replace(spec, layer=0))
    assert passed.run.layer == 0 and np.array_equal(passed.run.attention, alone.attention)  # the report's layer 0
    assert np.array_equal(passed.run.output, alone.output)
    for name, values in own_numbers(loaded, text, spec, budget).items():
        assert np.array_equal(passed.scores[name], values), name
    summaries = summarise_layers(loaded, text, spec, budget)
    for name, values in summaries.values.items():
        assert np.array_equal(passed.summaries.values[name], values), name
    assert np.array_equal(passed.summaries.top_keys, summaries.top_keys)
    assert np.array_equal(passed.summaries.top_shares, summaries.top_shares)
    (captured,) = run_layers(loaded, [text], spec, captured=passed.capture)  # the report's every layer, from the capture
    (own,) = run_layers(loaded, [text], spec)
    assert [run.layer for run in captured] == list(range(len(own)))
    if loaded.is_bert:  # BERT's own run_layers runs attnviz's layers in its place: within float32 of its own pass
        for mine, theirs in zip(captured, own):
            np.testing.assert_allclose(mine.attention, theirs.attention, atol=1e-5, rtol=0)
        return
    for mine, theirs in zip(captured, own):
        assert np.array_equal(mine.attention, theirs.attention) and np.array_equal(mine.output, theirs.output)


@pytest.mark.parametrize("text", TEXTS)
def test_a_short_texts_whole_map_is_bitwise_the_one_block_of_a_pass_of_blocks(model, text):
    """So layer 0's numbers may come from the run's map: the pass would have made the same weights."""
    loaded, spec = model
    encoded = encode_texts(loaded, [text], spec)
    num_tokens = len(encoded.queries.ids[0])
    with threads_for(encoded), torch.inference_mode():
        layers = build_layers(loaded, spec)
        states = layer_states(loaded, encoded, list(range(len(layers))), spec)
        valid_lens = encoded.queries.valid_lens
        for layer, attention in enumerate(layers):
            state = states[layer]
            rows = rows_per_block(block_budget(spec), 1, attention.num_heads, num_tokens)
            assert rows >= num_tokens  # one block
            _, whole = attention(state.queries, state.keys, state.keys, valid_lens=valid_lens, causal=spec.causal)
            (block,) = attention.blocks(state.queries, state.keys, state.keys, valid_lens=valid_lens, causal=spec.causal,
                                        rows=rows, narrow=True, outputs=False)  # fmt: skip
            assert block[0] == 0 and torch.equal(block[2], whole), layer


def test_roles_keeps_its_report_and_its_report_runs_nothing(decoder_folder, tmp_path):
    from helpers import model_runs

    result = attnviz.roles(TEXTS[0], model=str(decoder_folder), device="cpu")
    with model_runs() as runs:
        report = result.report()
        paths = result.save(tmp_path / "roles")
    assert not runs and report.record["texts"][0]["roles"]["scores"].keys() >= {"induction", "prefix_matching"}
    assert sorted(path.name for path in paths) == ["report.html", "roles.json", "roles.png"]
    assert result.report() is report  # assembled once, by attnviz.roles


def test_retrieval_joined_later_reaches_the_kept_reports_roles_view(decoder_folder):
    from attnviz.html.record import roles_of
    from attnviz.output.retrieval_heads import RetrievalHeads

    result = attnviz.roles(TEXTS[0], model=str(decoder_folder), device="cpu")
    num_layers, num_heads = result.scores["induction"].shape
    scores = np.linspace(0, 1, num_layers * num_heads).reshape(num_layers, num_heads)
    joined = result.with_retrieval(RetrievalHeads(scores, [], [100], [0.5]))
    shown = joined.report().record["texts"][0]["roles"]
    assert shown == roles_of(joined.roles, replace(result.spec, layer=0))  # as the report of the joined roles holds it
    assert "retrieval" in shown["scores"] and "retrieval" not in result.report().record["texts"][0]["roles"]["scores"]
    rest = {key: value for key, value in joined.report().record["texts"][0].items() if key != "roles"}
    assert rest == {key: value for key, value in result.report().record["texts"][0].items() if key != "roles"}


def test_the_served_pages_roles_answer_runs_the_model_twice(decoder_folder):
    from helpers import model_runs

    from attnviz.serve.explorer import Explorer, ServeSettings

    explorer = Explorer({"tiny": attnviz.load(str(decoder_folder), device="cpu")}, ServeSettings())
    with model_runs() as runs:
        explorer.roles({"text": TEXTS[0], "model": "tiny"})
    assert runs["LlamaModel"] == 2  # the text's and prefix matching's random sequences'


def test_the_roles_two_passes_build_each_of_attnvizs_layers_once(decoder_folder, monkeypatch):
    """The text's pass and prefix matching's run through the same layers: each layer's projections copied once."""
    import attnviz.own_layer as own_layer
    from attnviz.analysis.roles import head_roles

    loaded = load_model(str(decoder_folder), "cpu")
    spec = run_spec(loaded, layer=None, device="cpu")
    built = []
    build_layer = own_layer.build_layer
    monkeypatch.setattr(own_layer, "build_layer", lambda loaded, spec: built.append(spec.layer) or build_layer(loaded, spec))
    passed = head_roles(loaded, TEXTS[0], spec, block_budget(spec))
    assert "prefix_matching" in passed.roles.scores
    assert sorted(built) == list(range(passed.roles.scores["induction"].shape[0]))


def test_a_text_too_long_to_keep_its_capture_keeps_no_layers_input_past_layer_0s(decoder_folder, monkeypatch):
    """A text whose capture the report will not read (keep says no before the pass: a long text's) has the pass keep
    layer 0's input alone, which its run reads, not every layer's (570 MB of SmolLM2's at 8,192 tokens); its numbers and
    layer 0's run are those of the pass that kept them all."""
    import attnviz.analysis.head_summaries as head_summaries

    loaded = load_model(str(decoder_folder), "cpu")
    spec = run_spec(loaded, layer=None, device="cpu")
    asked, kept = [], []
    summarise_in_place = head_summaries.summarise_in_place

    def recording(*args, keep, **kwargs):
        summaries, states = summarise_in_place(*args, keep=keep, **kwargs)
        kept.append(sorted(states))
        return summaries, states

    monkeypatch.setattr(head_summaries, "summarise_in_place", recording)
    every = text_roles(loaded, TEXTS[1], spec, block_budget(spec), RoleSettings(), keep=lambda tokens, run: True)
    first = text_roles(loaded, TEXTS[1], spec, block_budget(spec), RoleSettings(),
                       keep=lambda tokens, run: asked.append((tokens, run)) or False)  # fmt: skip
    num_layers = len(every.capture[1])
    assert kept == [list(range(num_layers)), [0]] and num_layers > 1
    assert asked[0] == (len(first.ids), None) and asked[1][1] is first.run and first.capture is None
    assert np.array_equal(first.run.attention, every.run.attention)
    for name, values in every.scores.items():
        assert np.array_equal(first.scores[name], values), name

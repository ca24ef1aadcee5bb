"""The command line is a face of the API: its commands compute through attnviz.api, and nothing twice."""

import pytest

import attnviz
import attnviz.pipeline
from attnviz.api import functions
from attnviz.api.models import loaded_models
from attnviz.cli import run

TEXTS = ["我想吃酸菜鱼", "the cat sat on the mat", "hi"]


@pytest.mark.parametrize(
    "command, args",
    [
        ("heads", ["我想吃酸菜鱼"]),
        ("stats", ["我想吃酸菜鱼"]),
        ("layers", ["我想吃酸菜鱼"]),
        ("compare", ["我想吃酸菜鱼", "--heads", "1,12"]),
        ("position", ["我想吃酸菜鱼"]),
        ("trace", ["我想吃酸菜鱼"]),
    ],
)
def test_each_command_computes_through_its_api_function_once_and_keeps_no_model_handle(command, args, tmp_path, monkeypatch):
    calls = []
    api_function = getattr(functions, command)
    monkeypatch.setattr(functions, command, lambda *a, **k: calls.append(command) or api_function(*a, **k))
    handles_before = len(loaded_models())
    assert run([command, *args, "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "run")]) == 0
    assert calls == [command]
    assert len(loaded_models()) == handles_before  # one command, one load: the CLI keeps no cached handle


def counting_run_attention(monkeypatch) -> list[int]:
    calls = []
    original = attnviz.pipeline.run_attention
    monkeypatch.setattr(attnviz.pipeline, "run_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def test_stats_runs_no_layer_again_for_its_setup_and_its_first_run_is_run_attentions(monkeypatch, plain_spec, bundled_bert):
    from dataclasses import replace

    calls = counting_run_attention(monkeypatch)
    progress = []
    result = attnviz.stats(TEXTS, model="bundled", device="cpu", progress=progress.append)
    assert calls == [] and sum(progress) == len(TEXTS)

    monkeypatch.undo()
    (expected,) = attnviz.pipeline.run_attention(bundled_bert, TEXTS[:1], replace(plain_spec, layer=0))
    first = result.first_run
    assert (first.text, first.layer, first.query_tokens, first.query_ids) == (
        expected.text, 0, expected.query_tokens, expected.query_ids
    )  # fmt: skip
    assert (first.num_heads, first.head_dim, first.weights, first.causal) == (
        expected.num_heads, expected.head_dim, expected.weights, expected.causal
    )  # fmt: skip
    assert abs(first.attention - expected.attention).max() < 1e-5  # cut from a padded batch: the same rows


def test_stats_notes_are_the_results(tmp_path):
    result = attnviz.stats(["hi", "☃ ☃ ☃"], model="bundled", device="cpu")
    assert any("[UNK]" in note for note in result.notes)


@pytest.mark.slow
def test_heads_with_trace_runs_the_layer_once(tmp_path, monkeypatch):
    calls = counting_run_attention(monkeypatch)
    assert run(["heads", "我想吃酸菜鱼", "--trace", "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "r")]) == 0
    assert len(calls) == 1
    assert {"attention.json", "trace.json", "trace.md", "heads.png"} <= {path.name for path in (tmp_path / "r").iterdir()}

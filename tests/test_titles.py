"""Every figure's title names its text, model, layer and head, says causal or cross-attention, and
records the seed of random parameters; "1 head", never "1 heads".

The titles are read back from the drawn SVG files: matplotlib writes each text line it draws as
an XML comment beside its glyph outlines, so a test sees what a reader sees.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from attnviz.render.heatmap import write_head_heatmaps, write_heads_grid
from attnviz.render.stats_figures import write_js_distance, write_layers_grid, write_rollout
from attnviz.render.titles import figure_title
from dataclasses import replace

from attnviz.run_data import AttentionRun, UnknownTokens
from attnviz.spec import run_spec

TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]"]
KEY_TOKENS = ["[CLS]", "a", "dog", "[SEP]"]
LONG_TEXT = "The animal didn't cross the street because it was too tired, and then it went home to sleep"


def drawn_lines(path) -> list[str]:
    """The text lines drawn in an SVG figure, in drawing order."""
    return re.findall(r"<!-- (.*?) -->", path.read_text(encoding="utf-8"))


def make_run(num_heads=2, weights="pretrained", causal=False, kv_text=None, text="the cat sat", layer=2):
    rng = np.random.default_rng(0)
    keys = KEY_TOKENS if kv_text else TOKENS
    attention = rng.random((num_heads, len(TOKENS), len(keys)))
    if causal:
        attention = np.tril(attention)
    return AttentionRun(
        text=text, model="org/all-MiniLM-L6-v2", layer=layer, weights=weights, num_heads=num_heads, device="cpu",
        query_tokens=TOKENS, key_tokens=keys, query_ids=[0] * len(TOKENS), key_ids=[0] * len(keys),
        attention=attention / attention.sum(-1, keepdims=True), output=np.zeros((len(TOKENS), 8)),
        kv_text=kv_text, causal=causal,
    )


def test_a_head_figure_names_model_layer_head_text_and_the_seed_of_random_parameters(tmp_path):
    run = make_run(weights="random", causal=True, layer=0)
    paths = write_head_heatmaps(run, tmp_path, "svg", seed=7)
    lines = drawn_lines(paths[1])
    assert "all-MiniLM-L6-v2 · layer 0 · head 1 · causal" in lines
    assert "“the cat sat” · random parameters, seed 7" in lines


def test_a_causal_mask_past_layer_0_says_it_is_over_a_bidirectional_models_hidden_states(tmp_path):
    """Layer 0's input (the embeddings) holds no later token; layer 2's comes from a bidirectional pass."""
    for layer in (0, 2):
        (tmp_path / str(layer)).mkdir()
        paths = write_head_heatmaps(make_run(causal=True, layer=layer), tmp_path / str(layer), "svg")
        text = " ".join(drawn_lines(paths[0]))
        assert ("causal mask over a bidirectional model's hidden states" in text) == (layer > 0)


def test_pretrained_parameters_need_no_seed(tmp_path):
    lines = drawn_lines(write_head_heatmaps(make_run(), tmp_path, "svg", seed=7)[0])
    assert "all-MiniLM-L6-v2 · layer 2 · head 0" in lines and "“the cat sat”" in lines
    assert not [line for line in lines if "seed" in line or "random" in line or "causal" in line]


def test_one_head_reads_1_head_and_cross_attention_names_the_keys_text(tmp_path):
    run = make_run(num_heads=1, kv_text="a dog")
    lines = drawn_lines(write_heads_grid(run, tmp_path, "svg"))
    assert "all-MiniLM-L6-v2 · layer 2 · 1 head" in lines
    assert any(line.startswith("“the cat sat”") for line in lines)
    assert "cross-attention (keys from: “a dog”)" in " · ".join(lines)
    assert not [line for line in lines if "1 heads" in line]


def test_a_long_text_is_shortened_on_one_line_with_an_ellipsis(tmp_path):
    lines = drawn_lines(write_heads_grid(make_run(num_heads=4, text=LONG_TEXT), tmp_path, "svg"))
    (quoted,) = [line for line in lines if line.startswith("“The animal")]
    assert quoted.endswith("…”") and len(quoted) < len(LONG_TEXT)
    assert LONG_TEXT.startswith(quoted.strip("“”…"))


@pytest.mark.slow
def test_the_layers_rollout_and_js_distance_figures_use_the_same_title(tmp_path):
    layer_runs = [make_run(weights="random", causal=True, layer=layer) for layer in range(3)]
    rollout = np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None]
    layers = " · ".join(drawn_lines(write_layers_grid(layer_runs, tmp_path, "svg", seed=3)))
    assert "all-MiniLM-L6-v2 · 3 layers × 2 heads · 5 tokens · causal" in layers
    assert "“the cat sat” · random parameters, seed 3" in layers
    rolled = " · ".join(drawn_lines(write_rollout(layer_runs, rollout, tmp_path, "svg", seed=3)))
    assert "attention rollout through 3 layers" in rolled and "causal" in rolled
    assert "“the cat sat” · random parameters, seed 3" in rolled
    distances = np.zeros((3, 2, 2))
    one = " · ".join(drawn_lines(write_js_distance(distances, layer_runs[0], ["the cat sat"], tmp_path, "svg", seed=3)))
    assert "“the cat sat” · random parameters, seed 3" in one
    many = " · ".join(drawn_lines(write_js_distance(distances, layer_runs[0], ["a", "b", "c"], tmp_path, "svg", 3)))
    assert "averaged over 3 texts · random parameters, seed 3" in many


@pytest.mark.slow  # every figure of a run drawn
def test_a_fallback_model_and_a_text_mostly_unknown_are_in_every_run_figures_title(tmp_path):
    """The headline offline: the bundled model in place of bert-base-chinese, 5 of the 6 characters [UNK]."""
    run = replace(make_run(), fallback_for="bert-base-chinese", unknown=UnknownTokens(5, 6))
    layer_runs = [replace(run, layer=layer) for layer in range(3)]
    rollout = np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None]
    figures = {
        "head": write_head_heatmaps(run, tmp_path, "svg")[0],
        "grid": write_heads_grid(run, tmp_path, "svg"),
        "layers": write_layers_grid(layer_runs, tmp_path, "svg"),
        "rollout": write_rollout(layer_runs, rollout, tmp_path, "svg"),
        "js of one text": write_js_distance(np.zeros((3, 2, 2)), run, ["the cat sat"], tmp_path, "svg"),
    }
    for name, path in figures.items():
        assert "fallback for bert-base-chinese · 5 of 6 tokens [UNK]" in " · ".join(drawn_lines(path)), name
    # Over several texts the first text's count would mislead: the fallback stays, the count goes.
    many = " · ".join(drawn_lines(write_js_distance(np.zeros((3, 2, 2)), run, ["a", "b"], tmp_path, "svg")))
    assert "fallback for bert-base-chinese" in many and "[UNK]" not in many


@pytest.mark.parametrize("count, of, said", [(0, 6, False), (1, 6, False), (1, 5, True), (6, 6, True)])
def test_the_unknown_share_is_said_from_a_fifth_of_the_texts_tokens(count, of, said):
    title = figure_title("m", ["layer 0"], text="t", unknown=[UnknownTokens(count, of)])
    assert (f"{count} of {of} tokens [UNK]" in title) == said
    assert "fallback" not in title  # the model asked for loaded


@pytest.mark.slow
def test_the_compare_and_position_figures_name_their_text_and_seed(bundled_bert, tmp_path):
    from attnviz.analysis.compare import compare_splits
    from attnviz.analysis.position import position_experiment
    from attnviz.render.compare_figures import write_comparison_figure
    from attnviz.render.position_figure import write_position_figure

    shared = run_spec(bundled_bert, layer=1, seed=5)
    splits = compare_splits(bundled_bert, "the cat sat", [1, 2], ["pretrained", "random"], shared)
    compared = drawn_lines(write_comparison_figure(splits, tmp_path, "svg", seed=5))
    assert any(line.startswith("all-MiniLM-L6-v2 · layer 1") for line in compared)
    assert "“the cat sat”" in compared  # pretrained and random rows: the title names neither, each row its own
    assert not any("random parameters" in line for line in compared)
    assert "pretrained · 1 head × d=384" in compared and "random, seed 5 · 2 heads × d=192" in compared
    position = drawn_lines(write_position_figure(position_experiment(bundled_bert, "the cat sat", head=2), tmp_path, "svg"))
    assert any(line.startswith("all-MiniLM-L6-v2 · layer 0 · head 2") for line in position)
    assert "“the cat sat”" in position


@pytest.mark.parametrize("line_chars", [45, 60, 100])  # a figure is at least 5 inches: 50 characters
def test_title_lines_wrap_between_parts_within_the_width_they_are_given(line_chars):
    title = figure_title(
        "all-MiniLM-L6-v2", ["layer 0", "head 11"], text=LONG_TEXT, kv_text=LONG_TEXT,
        weights="random", seed=12, line_chars=line_chars,
    )
    lines = title.split("\n")
    assert all(len(line) <= line_chars for line in lines), lines
    assert "random parameters, seed 12" in title and lines[0].startswith("all-MiniLM-L6-v2 · layer 0")


def test_a_part_longer_than_a_line_is_cut_at_its_spaces_so_no_line_runs_off_the_figure():
    """A T5 head's cross-attention title: its source phrase alone is longer than a small figure's line."""
    title = figure_title("t5", ["layer 0", "head 1"], text="The cat sat.", kv_text="Le chat.", stack="cross", line_chars=50)
    lines = title.split("\n")
    assert all(len(line) <= 50 for line in lines), lines
    assert " ".join(lines[1:]).replace(" · ", " ") == "“The cat sat.” decoder cross-attention (keys: the encoder's output for: “Le chat.”)"

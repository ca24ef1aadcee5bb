"""`attnviz stats` and `attnviz layers` end to end on the bundled model, and what they rest on:
every layer from one BERT pass, batches that equal single texts, and the layers-grid figure.

Expected numbers come from run_attention (checked against transformers in test_bert.py) one
layer and one text at a time, fed to the analysis functions of test_analysis.py.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_records_match, layers_grid_panels, read_png

from attnviz.analysis.rollout import attention_rollout
from attnviz.analysis.statistics import (
    CAUSAL_OVER_BIDIRECTIONAL as CAUSAL_NOTE,
    CLARK_DIFFERENCES,
    STATISTICS,
    StatisticsAccumulator,
    head_label,
    head_statistics,
    js_distance,
)
from attnviz.cli import run
from attnviz.output.runs import MANIFEST
from attnviz.pipeline import run_attention, run_layers
from attnviz.render.heatmap import MASKED_COLOR
from attnviz.run_data import AttentionRun
from attnviz.spec import run_spec

TOLERANCE = 1e-5
ENGLISH = "The animal didn't cross the street because it was too tired."
SHORT = "The cat sat on the mat."
THIRD = "Attention lets every token look at every other token."
NUM_LAYERS, NUM_HEADS = 6, 12


@pytest.fixture(scope="module")
def bert(bundled_bert):
    return bundled_bert


def stats(*args):
    return run(["stats", *args, "--model", "bundled"])


def layers(*args):
    return run(["layers", *args, "--model", "bundled"])


def read_csv(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file))


def csv_values(rows: list[dict], layer: int) -> np.ndarray:
    """(H, S) statistics of one layer from stats.csv."""
    layer_rows = sorted((row for row in rows if int(row["layer"]) == layer), key=lambda row: int(row["head"]))
    return np.array([[float(row[name]) for name in STATISTICS] for row in layer_rows])


def hex_rgb(color: str) -> np.ndarray:
    return np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])


# --- every layer from one pass --------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"weights": "random", "seed": 3, "num_heads": 4}])
def test_each_layer_equals_run_attention_for_that_layer_and_text(bert, options):
    runs = run_layers(bert, [ENGLISH, SHORT], run_spec(bert, **options))
    assert len(runs) == 2 and all(len(text_runs) == NUM_LAYERS for text_runs in runs)
    for layer in range(NUM_LAYERS):
        # run_attention's batch equals each text alone (test_bert.py), so one call per layer will do.
        batch = run_attention(bert, [ENGLISH, SHORT], run_spec(bert, layer=layer, **options))
        for layer_run, alone in zip([text_runs[layer] for text_runs in runs], batch):
            assert layer_run.layer == layer and layer_run.query_tokens == alone.query_tokens
            np.testing.assert_allclose(layer_run.attention, alone.attention, atol=TOLERANCE, rtol=0)
            np.testing.assert_allclose(layer_run.output, alone.output, atol=TOLERANCE, rtol=0)


def test_bert_runs_once_for_all_layers(bert):
    calls = []
    handle = bert.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        run_layers(bert, [ENGLISH, SHORT], run_spec(bert))
    finally:
        handle.remove()
    assert len(calls) == 1


@pytest.mark.parametrize(
    "options, berts_own_attention_runs",
    [({}, 0), ({"num_heads": NUM_HEADS}, 0), ({"causal": True}, NUM_LAYERS - 1), ({"num_heads": 4}, NUM_LAYERS - 1),
     ({"weights": "random"}, NUM_LAYERS - 1)],
)
def test_attnviz_layers_stand_in_for_berts_attention_only_when_they_compute_the_same(
    bert, monkeypatch, options, berts_own_attention_runs
):
    """With BERT's projections and heads and no causal mask, the attention is computed once per layer."""
    from attnviz.models.bert_encoder import BertLayer

    calls = []
    attend = BertLayer.attend
    monkeypatch.setattr(BertLayer, "attend", lambda self, *args: calls.append(1) or attend(self, *args))
    run_layers(bert, [ENGLISH, SHORT], run_spec(bert, **options))
    assert len(calls) == berts_own_attention_runs


def test_causal_maps_have_zeros_above_the_diagonal_in_every_layer(bert):
    (text_runs,) = run_layers(bert, [SHORT], run_spec(bert, causal=True))
    above = np.triu(np.ones((9, 9), dtype=bool), k=1)
    for layer_run in text_runs:
        assert np.all(layer_run.attention[:, above] == 0)
        np.testing.assert_allclose(layer_run.attention.sum(-1), 1, atol=TOLERANCE)


def test_statistics_of_a_padded_batch_equal_the_average_of_each_text_alone(bert):
    texts = [ENGLISH, SHORT]
    batched = StatisticsAccumulator(NUM_LAYERS)
    for text_runs in run_layers(bert, texts, run_spec(bert)):
        for layer_run in text_runs:
            batched.add(layer_run.layer, layer_run.attention, layer_run.query_tokens)
    alone = []
    for text in texts:
        (text_runs,) = run_layers(bert, [text], run_spec(bert))
        alone.append(np.stack([head_statistics(r.attention, r.query_tokens) for r in text_runs]))  # (L, H, S)
    np.testing.assert_allclose(batched.result().values, np.mean(alone, axis=0), atol=TOLERANCE, rtol=0)


# --- attnviz stats --------------------------------------------------------------------------------


@pytest.mark.slow
def test_stats_files_hold_the_analysis_of_run_attentions_weights(tmp_path, capsys, bert):
    assert stats(ENGLISH, "--out", str(tmp_path)) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [MANIFEST, "js_distance.png", "stats.csv", "stats.json"]
    read_png(tmp_path / "js_distance.png")

    rows = read_csv(tmp_path / "stats.csv")
    assert len(rows) == NUM_LAYERS * NUM_HEADS
    assert list(rows[0]) == ["layer", "head", "label", *STATISTICS]
    record = json.loads((tmp_path / "stats.json").read_text(encoding="utf-8"))
    for layer in (0, 3):
        (single,) = run_attention(bert, [ENGLISH], run_spec(bert, layer=layer))
        expected = head_statistics(single.attention, single.query_tokens)  # (H, S)
        np.testing.assert_allclose(csv_values(rows, layer), expected, atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(record["js_distance"][layer], js_distance(single.attention), atol=TOLERANCE)
        for head in range(NUM_HEADS):
            label = head_label(dict(zip(STATISTICS, expected[head])))
            assert rows[layer * NUM_HEADS + head]["label"] == (label or "")

    assert record["format"] == "attnviz-stats" and record["num_texts"] == 1 and record["texts"] == [ENGLISH]
    assert record["statistics"] == list(STATISTICS) and record["causal"] is False and record["causal_note"] is None
    assert (record["num_layers"], record["num_heads"], record["head_dim"]) == (NUM_LAYERS, NUM_HEADS, 32)
    for row, head in zip(rows, record["heads"]):
        assert (int(row["layer"]), int(row["head"]), row["label"]) == (head["layer"], head["head"], head["label"] or "")
        assert all(float(row[name]) == pytest.approx(head[name], abs=1e-6) for name in STATISTICS)

    # BERT's layer 0 of this model has a clear previous-token head; the table and the list say so.
    assert any(row["label"] == "previous-token" for row in rows if row["layer"] == "0")
    shown = capsys.readouterr().out
    for expected_text in ("head labels by layer", "prv", "previous-token", "stats.csv", "L5", "H11"):
        assert expected_text in shown
    assert CAUSAL_NOTE not in shown
    assert max(len(line) for line in shown.splitlines()) <= 80


@pytest.mark.slow
def test_stats_of_a_file_average_its_non_blank_lines(tmp_path, bert):
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text(f"{ENGLISH}\n\n   \n{SHORT}\n{THIRD}\n", encoding="utf-8")
    out = tmp_path / "run"
    assert stats("--file", str(texts_file), "--js", "--out", str(out)) == 0
    record = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert record["num_texts"] == 3 and record["texts"] == [ENGLISH, SHORT, THIRD]
    layer = 2
    singles = [run_attention(bert, [text], run_spec(bert, layer=layer))[0] for text in (ENGLISH, SHORT, THIRD)]
    expected = np.mean([head_statistics(s.attention, s.query_tokens) for s in singles], axis=0)
    np.testing.assert_allclose(csv_values(read_csv(out / "stats.csv"), layer), expected, atol=TOLERANCE, rtol=0)
    expected_js = np.mean([js_distance(s.attention) for s in singles], axis=0)
    np.testing.assert_allclose(record["js_distance"][layer], expected_js, atol=TOLERANCE)
    # The average is per text, as stats.json says, which is not the per-token average of Clark et al.
    assert "per text" in record["differences_from_clark_et_al_2019"]["average"]
    lengths = [len(s.query_tokens) for s in singles]
    per_token = np.average([head_statistics(s.attention, s.query_tokens) for s in singles], axis=0, weights=lengths)
    assert np.abs(per_token - expected).max() > 100 * TOLERANCE


@pytest.mark.slow
def test_a_file_measures_the_js_distances_only_with_js(tmp_path, capsys):
    """Over a --file the JS distances (most of the work on long texts) wait for --js; the other numbers do not change."""
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text(f"{ENGLISH}\n{SHORT}\n", encoding="utf-8")
    assert stats("--file", str(texts_file), "--js", "--out", str(tmp_path / "with")) == 0
    capsys.readouterr()
    assert stats("--file", str(texts_file), "--out", str(tmp_path / "without")) == 0
    assert "--js measures them" in " ".join(capsys.readouterr().out.split())
    with_js, without = (json.loads((tmp_path / name / "stats.json").read_text(encoding="utf-8")) for name in ("with", "without"))
    assert without["js_distance"] is None and without["settings"]["js"] is False and with_js["settings"]["js"] is True
    assert np.array(with_js["js_distance"]).shape == (6, 12, 12)
    assert sorted(path.name for path in (tmp_path / "without").glob("[!.]*")) == ["stats.csv", "stats.json"]
    assert (tmp_path / "with" / "js_distance.png").exists()
    assert_records_match(without["heads"], with_js["heads"])  # two runs: the same numbers, within float32
    # One TEXT measures them unless --no-js.
    assert stats(SHORT, "--no-js", "--out", str(tmp_path / "text")) == 0
    assert not (tmp_path / "text" / "js_distance.png").exists()
    assert json.loads((tmp_path / "text" / "stats.json").read_text(encoding="utf-8"))["js_distance"] is None


def test_stats_states_each_definition_that_differs_from_clark_et_al(tmp_path, capsys):
    """js_distance, punctuation and the average over texts: in --help, stats.json and docs/measures.md."""
    assert run(["stats", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for words in (
        "Jensen-Shannon distance (the square root of the divergence, base-2 logarithms",
        "averaged over queries; Clark et al. sum the Jensen-Shannon divergence over tokens",
        'Unicode punctuation; Clark et al. count "." and ","',
        "averaged per text, then over the texts",
    ):
        assert words in help_text, words
    assert stats(SHORT, "--out", str(tmp_path)) == 0
    differences = json.loads((tmp_path / "stats.json").read_text(encoding="utf-8"))["differences_from_clark_et_al_2019"]
    assert differences == CLARK_DIFFERENCES and set(differences) == {"js_distance", "punctuation", "average"}
    measures_doc = " ".join((Path(__file__).parent.parent / "docs" / "measures.md").read_text(encoding="utf-8").split())
    assert "differences_from_clark_et_al_2019" in measures_doc
    for difference in differences.values():
        assert difference in measures_doc, difference
    import attnviz.analysis.statistics

    assert "every statistic of" not in " ".join(attnviz.analysis.statistics.__doc__.split())


@pytest.mark.slow
def test_causal_stats_and_layers_say_the_mask_is_over_a_bidirectional_models_hidden_states(tmp_path, capsys, bert):
    """In the terminal, the JSON files and every figure title: not a causal model's numbers."""
    from matplotlib.text import Text

    from attnviz.render.stats_figures import js_distance_figure, layers_figure, rollout_figure

    assert stats(SHORT, "--causal", "--out", str(tmp_path / "stats")) == 0
    assert CAUSAL_NOTE in json.loads((tmp_path / "stats" / "stats.json").read_text(encoding="utf-8"))["causal_note"]
    assert f"--causal: {CAUSAL_NOTE}" in " ".join(capsys.readouterr().out.split())
    assert layers(SHORT, "--causal", "--out", str(tmp_path / "layers")) == 0
    record = json.loads((tmp_path / "layers" / "rollout.json").read_text(encoding="utf-8"))
    assert CAUSAL_NOTE in record["causal_note"] and "not a causal model" in record["causal_note"]
    assert f"--causal: {CAUSAL_NOTE}" in " ".join(capsys.readouterr().out.split())

    (runs,) = run_layers(bert, [SHORT], run_spec(bert, causal=True))
    rollout = attention_rollout([run.attention for run in runs])
    figures = [
        layers_figure(runs),
        rollout_figure(runs, rollout),
        js_distance_figure(np.zeros((NUM_LAYERS, NUM_HEADS, NUM_HEADS)), runs[0], [SHORT]),
    ]
    for figure in figures:
        assert any(CAUSAL_NOTE in text.get_text() for text in figure.findobj(Text))


@pytest.mark.slow
def test_causal_stats_of_standard_input_see_no_next_token(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{SHORT}\n\n{THIRD}\n"))
    assert stats("--file", "-", "--causal", "--out", str(tmp_path)) == 0
    record = json.loads((tmp_path / "stats.json").read_text(encoding="utf-8"))
    assert record["texts"] == [SHORT, THIRD] and record["causal"] is True
    rows = read_csv(tmp_path / "stats.csv")
    assert all(float(row["next"]) == 0.0 for row in rows)
    assert all(float(row["previous"]) > 0.0 for row in rows)


def test_a_random_layer_split_four_ways_is_broad_everywhere(tmp_path):
    assert stats(ENGLISH, "--weights", "random", "--heads", "4", "--out", str(tmp_path)) == 0
    rows = read_csv(tmp_path / "stats.csv")
    assert len(rows) == NUM_LAYERS * 4
    assert {row["label"] for row in rows} == {"broad"}  # the tutorials' near-uniform maps
    assert json.loads((tmp_path / "stats.json").read_text(encoding="utf-8"))["seed"] == 0


# --- attnviz layers -------------------------------------------------------------------------------


@pytest.mark.slow
def test_layers_writes_the_grid_and_the_rollout_of_every_layer(tmp_path, capsys, bert):
    assert layers(ENGLISH, "--out", str(tmp_path)) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        MANIFEST, "layers.png", "rollout.json", "rollout.png", "summaries.json", "summaries.png"
    ]  # fmt: skip
    grid = read_png(tmp_path / "layers.png")
    assert grid.shape[1] > 1.5 * grid.shape[0]  # 12 heads across, 6 layers down
    read_png(tmp_path / "rollout.png")

    record = json.loads((tmp_path / "rollout.json").read_text(encoding="utf-8"))
    singles = [run_attention(bert, [ENGLISH], run_spec(bert, layer=layer))[0] for layer in range(NUM_LAYERS)]
    expected = attention_rollout([single.attention for single in singles])
    rollout = np.array(record["rollout"])
    np.testing.assert_allclose(rollout, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(rollout.sum(axis=1), 1.0, atol=TOLERANCE)
    assert record["tokens"] == singles[0].query_tokens and record["num_layers"] == NUM_LAYERS
    assert record["causal"] is False and record["causal_note"] is None
    grey = hex_rgb(MASKED_COLOR)
    for name in ("layers.png", "rollout.png"):  # nothing is masked, so nothing is grey
        assert np.all(read_png(tmp_path / name) == grey, axis=-1).mean() < 0.001, name
    shown = capsys.readouterr().out
    assert "rollout" in shown and "animal→" in shown
    assert max(len(line) for line in shown.splitlines()) <= 80


@pytest.mark.slow
def test_causal_layers_mask_the_future_in_the_figures_and_the_rollout(tmp_path):
    assert layers(SHORT, "--causal", "--out", str(tmp_path)) == 0
    rollout = np.array(json.loads((tmp_path / "rollout.json").read_text(encoding="utf-8"))["rollout"])
    assert np.all(np.triu(rollout, k=1) == 0)
    np.testing.assert_allclose(rollout.sum(axis=1), 1.0, atol=TOLERANCE)
    grey = hex_rgb(MASKED_COLOR)
    for name in ("layers.png", "rollout.png"):
        assert np.all(read_png(tmp_path / name) == grey, axis=-1).mean() > 0.1, name  # the masked triangles


@pytest.mark.slow
def test_layers_in_svg(tmp_path):
    assert layers(SHORT, "--format", "svg", "--heads", "3", "--out", str(tmp_path)) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        MANIFEST, "layers.svg", "rollout.json", "rollout.svg", "summaries.json", "summaries.svg"
    ]  # fmt: skip


# --- the layers grid: each panel is that layer's head ---------------------------------------------


def hand_made_runs(num_layers: int, num_heads: int, num_tokens: int, causal: bool = False) -> list[AttentionRun]:
    rng = np.random.default_rng(0)
    tokens = [f"t{i}" for i in range(num_tokens)]
    runs = []
    for layer in range(num_layers):
        scores = rng.normal(scale=3.0, size=(num_heads, num_tokens, num_tokens))
        if causal:
            scores[:, np.triu(np.ones((num_tokens, num_tokens), dtype=bool), k=1)] = -np.inf
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        runs.append(
            AttentionRun(
                text=" ".join(tokens), model="bundled", layer=layer, weights="pretrained", num_heads=num_heads,
                device="cpu", query_tokens=tokens, key_tokens=tokens, query_ids=list(range(num_tokens)),
                key_ids=list(range(num_tokens)), attention=weights / weights.sum(-1, keepdims=True),
                output=np.zeros((num_tokens, 4 * num_heads)), causal=causal,
            )
        )
    return runs


def test_each_panel_of_the_grid_is_that_layers_head(tmp_path):
    import matplotlib

    from attnviz.render.heatmap import COLORMAP
    from attnviz.render.stats_figures import layers_figure

    runs = hand_made_runs(num_layers=3, num_heads=4, num_tokens=7, causal=True)
    mosaic, panels, cells, step = layers_grid_panels(layers_figure(runs), num_layers=3, num_heads=4)
    assert cells == 7  # a cell a token
    colormap = matplotlib.colormaps[COLORMAP]
    for (layer, head), panel in panels.items():
        panel = panel[..., :3]
        weights = runs[layer].attention[head]
        lower = ~np.triu(np.ones((7, 7), dtype=bool), k=1)
        np.testing.assert_array_equal(panel[lower], colormap(weights, bytes=True)[..., :3][lower])
        assert np.all(panel[~lower] == hex_rgb(MASKED_COLOR))
    assert np.all(mosaic[cells:step, :, :3] == 255)  # white between the rows of panels


def near_equal_block_maxima(weights: np.ndarray, cells: int) -> np.ndarray:
    """(cells, cells): the largest weight of each block of an (N, N) map cut into cells near-equal blocks a side,
    block b holding rows (and columns) ceil(b N / cells) up to ceil((b + 1) N / cells), written out block by block."""
    bounds = [-(-block * len(weights) // cells) for block in range(cells + 1)]
    rows = np.stack([weights[start:end].max(axis=0) for start, end in zip(bounds, bounds[1:])])  # (cells, N)
    return np.stack([rows[:, start:end].max(axis=1) for start, end in zip(bounds, bounds[1:])], axis=1)


def test_a_long_text_is_shown_as_the_maximum_of_each_block_in_the_grid(tmp_path):
    """Not the mean: a block holding one weight of 1 shows 1, on the log scale of a long text."""
    import matplotlib
    from matplotlib.colors import LogNorm

    from attnviz.render.scales import COLORMAP, LOG_SCALE_MIN
    from attnviz.render.stats_figures import layers_figure, write_layers_grid

    runs = hand_made_runs(num_layers=2, num_heads=3, num_tokens=400)
    _, panels, cells, _ = layers_grid_panels(layers_figure(runs), num_layers=2, num_heads=3)
    assert cells < 400 / 2  # blocks of 2 x 2 cells or more
    colormap = matplotlib.colormaps[COLORMAP]
    for (layer, head), panel in panels.items():
        blocks = near_equal_block_maxima(runs[layer].attention[head], cells)
        expected = colormap(LogNorm(LOG_SCALE_MIN, 1.0)(np.clip(blocks, LOG_SCALE_MIN, None)), bytes=True)
        np.testing.assert_array_equal(panel, expected)
    read_png(write_layers_grid(runs, tmp_path))


# --- bad input ------------------------------------------------------------------------------------

LONG_TEXT = "word " * 600


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    empty, blank, folder = tmp_path / "empty.txt", tmp_path / "blank.txt", tmp_path / "folder"
    empty.write_text("")
    blank.write_text("\n   \n\t\n")
    folder.mkdir()
    long_file = tmp_path / "long.txt"
    long_file.write_text(f"hi\n{LONG_TEXT}\n")
    return {
        "empty file": (["stats", "--file", str(empty)], "has no text: every line is blank"),
        "all-blank file": (["stats", "--file", str(blank)], "has no text: every line is blank"),
        "missing file": (["stats", "--file", str(tmp_path / "nope.txt")], "no such file"),
        "folder as file": (["stats", "--file", str(folder)], "is a folder"),
        "text and file": (["stats", "hi", "--file", str(blank)], "not both"),
        "no text": (["stats"], "missing argument 'TEXT'"),
        "empty text": (["stats", ""], "the text is empty"),
        "blank text": (["layers", "  \n "], "the text is empty"),
        "too long": (["layers", LONG_TEXT], "the text has 602 tokens, more than the model's 512 positions"),
        "too long in a file": (["stats", "--file", str(long_file)], "line 2 has 602 tokens"),
        "stats heads": (["stats", "hi", "--heads", "5"], "5 heads do not divide the model size 384"),
        "layers heads": (["layers", "hi", "--heads", "5"], "5 heads do not divide the model size 384"),
        "unknown weights": (["layers", "hi", "--weights", "trained"], "'trained' is not one of"),
        "unknown format": (["stats", "hi", "--format", "gif"], "'gif' is not one of"),
    }


CASES = [  # the keys of bad_inputs, which needs a folder to write its files into
    "empty file", "all-blank file", "missing file", "folder as file", "text and file", "no text", "empty text",
    "blank text", "too long", "too long in a file", "stats heads", "layers heads", "unknown weights", "unknown format",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_code_2_and_writes_nothing(case, tmp_path, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    args, message = bad_inputs(inputs)[case]
    out = tmp_path / "run"
    assert run([*args, "--model", "bundled", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error, error
    assert error.count("\n") == 1, error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["inputs"]


@pytest.mark.parametrize("command", ["stats", "layers"])
def test_an_output_path_that_is_a_file_is_an_error(command, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert run([command, "hi", "--model", "bundled", "--out", str(blocker)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert blocker.read_text() == "not a folder"

"""`attnviz compare`: one projection split into 1, 4, 12... heads; BERT's weights beside random ones."""

import json

import numpy as np
import pytest
import torch
from helpers import assert_close_after_rounding

from attnviz.analysis.compare import compare_splits, default_head_counts, parse_head_counts, parse_weights
from attnviz.analysis.statistics import summarize_heads
from attnviz.cli import run
from attnviz.errors import AttnvizError
from attnviz.output.runs import MANIFEST
from attnviz.own_layer import random_layer
from attnviz.pipeline import run_attention
from attnviz.render.compare_figures import MAX_HEADS_SHOWN, panel_grid, shown_heads
from attnviz.spec import run_spec

TOLERANCE = 1e-5
TEXT = "The animal didn't cross the street because it was too tired."  # 16 tokens
LAYER = 2


@pytest.fixture(scope="module")
def splits(bundled_bert):
    shared = run_spec(bundled_bert, layer=LAYER, seed=3)
    return compare_splits(bundled_bert, TEXT, [1, 4, 12, 96], ["pretrained", "random"], shared)


def reference_scores(reference, num_heads: int) -> np.ndarray:
    """(H, N, N): BERT layer LAYER's scores Q_h K_h^T / sqrt(d) split into num_heads heads by columns, from transformers alone."""
    tokenizer, model = reference
    with torch.no_grad():
        x = model(**tokenizer(TEXT, return_tensors="pt"), output_hidden_states=True).hidden_states[LAYER][0]  # (N, D)
        projections = model.encoder.layer[LAYER].attention.self
        q, k = projections.query(x).double().numpy(), projections.key(x).double().numpy()  # (N, D) each
    head_dim = q.shape[1] // num_heads
    scores = []
    for head in range(num_heads):
        columns = slice(head * head_dim, (head + 1) * head_dim)  # head h owns columns h*d .. (h+1)*d - 1
        scores.append(q[:, columns] @ k[:, columns].T / np.sqrt(head_dim))  # (N, N)
    return np.stack(scores)


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def reference_split(reference, num_heads: int) -> np.ndarray:
    """BERT layer LAYER's projections split into num_heads heads by columns, from transformers alone."""
    return softmax_rows(reference_scores(reference, num_heads))  # (H, N, N)


def test_splits_come_weights_first_then_head_counts(splits):
    assert [(split.weights, split.num_heads) for split in splits] == [
        (weights, count) for weights in ("pretrained", "random") for count in (1, 4, 12, 96)
    ]
    assert [split.run.head_dim for split in splits[:4]] == [384, 96, 32, 4]


@pytest.mark.parametrize("index, num_heads", [(0, 1), (1, 4), (2, 12), (3, 96)])
def test_each_head_count_splits_berts_own_projection(splits, index, num_heads, bundled_bert, reference_bert):
    split = splits[index]
    (alone,) = run_attention(bundled_bert, [TEXT], run_spec(bundled_bert, layer=LAYER, num_heads=num_heads))
    np.testing.assert_allclose(split.run.attention, alone.attention, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(split.run.attention, reference_split(reference_bert, num_heads), atol=TOLERANCE, rtol=0)
    # the split's summaries are those of its own map (one computation: exactly); the map alone's is another run
    assert [s.relative_entropy for s in split.summaries] == [s.relative_entropy for s in summarize_heads(split.run.attention)]


def test_one_head_is_the_softmax_of_the_twelve_trained_heads_summed_scores_and_the_figure_says_so(
    splits, reference_bert
):
    """The claim of compare.png's note: one head of all D columns re-cuts the model's 12 heads,
    softmax(sum_h S_h / sqrt(12)); it is not a model trained with one head."""
    from matplotlib.text import Text

    from attnviz.analysis.compare import resplit_note
    from attnviz.render.compare_figures import comparison_figure

    twelve = reference_scores(reference_bert, 12)  # (12, N, N)
    expected = softmax_rows(twelve.sum(axis=0) / np.sqrt(12))
    np.testing.assert_allclose(splits[0].run.attention[0], expected, atol=TOLERANCE, rtol=0)

    note = resplit_note(splits[:3])  # pretrained 1, 4 and 12 heads
    assert "softmax(Σₕ Sₕ / √12)" in note and "re-cuts weights trained for the model's 12 heads" in note
    assert "not what a model trained with that many heads would learn" in note
    figure = comparison_figure(splits[:2])
    shown = " ".join(" ".join(text.get_text() for text in figure.findobj(Text)).split())
    assert " ".join(note.split()) in shown
    assert resplit_note([splits[2], splits[6]]) is None  # the model's own 12 heads and a random layer re-cut nothing


@pytest.mark.parametrize("rows", [(0, 4), (0,), (4,)])
def test_the_title_names_only_the_parameters_every_row_shares_and_each_row_names_its_own(splits, rows):
    """compare.png of pretrained and random rows: the title is true of every row; each row says which it is."""
    from matplotlib.text import Text

    from attnviz.render.compare_figures import comparison_figure

    chosen = [splits[index] for index in rows]  # splits[0]: pretrained, 1 head; splits[4]: random, 1 head (seed 3)
    figure = comparison_figure(chosen, seed=3)
    title = " ".join(figure.get_suptitle().split())
    kinds = {split.weights for split in chosen}
    assert ("random parameters, seed 3" in title) == (kinds == {"random"})
    assert "pretrained" not in title
    shown = [text.get_text() for text in figure.findobj(Text)]
    expected = {"pretrained": "pretrained · 1 head × d=384", "random": "random, seed 3 · 1 head × d=384"}
    for kind in ("pretrained", "random"):
        assert (expected[kind] in shown) == (kind in kinds), (kind, shown)


def test_the_random_layer_is_the_same_weights_for_every_head_count_and_matches_run_attention(splits, bundled_bert):
    one, many = random_layer(384, 1, seed=3), random_layer(384, 12, seed=3)
    for name in ("w_q", "w_k", "w_v", "w_o"):
        assert torch.equal(getattr(one, name).weight, getattr(many, name).weight)
    random = run_spec(bundled_bert, layer=LAYER, num_heads=12, weights="random", seed=3)
    (alone,) = run_attention(bundled_bert, [TEXT], random)
    np.testing.assert_array_equal(splits[6].run.attention, alone.attention)


def test_random_maps_are_near_uniform_and_berts_are_not(splits):
    for split in splits:
        relative = [summary.relative_entropy for summary in split.summaries]
        if split.weights == "random":  # every cell near 1/N: entropy near log N
            assert min(relative) > 0.95 and split.mean_max < 0.15, split.num_heads
        else:
            assert min(relative) < 0.6, split.num_heads
    pretrained = {split.num_heads: split for split in splits if split.weights == "pretrained"}
    # More, thinner heads: on average each spreads wider than the one head that sees all 384 dimensions.
    assert pretrained[1].mean_relative_entropy < pretrained[12].mean_relative_entropy


def test_large_head_counts_show_a_subset_from_most_focused_to_broadest(splits):
    assert shown_heads(splits[2]) == list(range(12))
    subset = shown_heads(splits[3])  # 96 heads
    assert len(subset) == len(set(subset)) == MAX_HEADS_SHOWN
    by_focus = sorted(splits[3].summaries, key=lambda summary: summary.relative_entropy)
    assert subset[0] == by_focus[0].head and subset[-1] == by_focus[-1].head
    relative = [splits[3].summaries[head].relative_entropy for head in subset]
    assert relative == sorted(relative)
    assert [panel_grid(count) for count in (1, 2, 4, 6, 12, 16)] == [(1, 1), (1, 2), (2, 2), (2, 3), (3, 4), (4, 4)]


def test_parsing_the_lists():
    assert parse_head_counts("1, 4,12,4") == [1, 4, 12]
    assert parse_weights("random,pretrained") == ["random", "pretrained"]
    assert default_head_counts(384, 12) == [1, 4, 12]
    assert default_head_counts(768, 12) == [1, 4, 12]
    assert default_head_counts(10, 5) == [1, 5]  # 4 does not divide 10
    for bad in ("1,,4", "one", "0", "-2"):
        with pytest.raises(AttnvizError):
            parse_head_counts(bad)


def compare(*args):
    return run(["compare", *args, "--model", "bundled"])


@pytest.mark.slow
def test_compare_end_to_end(tmp_path, capsys, bundled_bert):
    args = [TEXT, "--heads", "1,4", "--weights", "pretrained,random", "--layer", str(LAYER), "--seed", "3"]
    assert compare(*args, "--out", str(tmp_path)) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [MANIFEST, "compare.json", "compare.png"]
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / "compare.json").read_text(encoding="utf-8"))
    assert [(split["weights"], split["num_heads"]) for split in record["splits"]] == [
        ("pretrained", 1), ("pretrained", 4), ("random", 1), ("random", 4)
    ]
    (four,) = run_attention(bundled_bert, [TEXT], run_spec(bundled_bert, layer=LAYER, num_heads=4))
    expected = [summary.relative_entropy for summary in summarize_heads(four.attention)]  # another run: within float32
    assert_close_after_rounding([head["relative_entropy"] for head in record["splits"][1]["heads"]], expected, 6, rounded=1)
    shown = capsys.readouterr().out
    assert "pretrained" in shown and "random" in shown and "rel." in shown and "compare.png" in shown
    assert max(len(line) for line in shown.splitlines()) <= 80


@pytest.mark.slow
def test_default_head_counts_are_one_four_and_the_models_own(tmp_path):
    assert compare("The cat sat.", "--out", str(tmp_path)) == 0
    record = json.loads((tmp_path / "compare.json").read_text(encoding="utf-8"))
    assert [split["num_heads"] for split in record["splits"]] == [1, 4, 12]


BAD_INPUTS = {
    "a head count that does not divide": (
        [TEXT, "--heads", "1,5"], "5 heads do not divide the model size 384; choose one of: 1, 2, 3, 4, 6, 8"
    ),
    "not a number": ([TEXT, "--heads", "1,four"], "'four' is not a positive whole number"),
    "an empty item": ([TEXT, "--heads", "1,,4"], "--heads takes a comma list without empty items"),
    "unknown weights": ([TEXT, "--weights", "pretrained,trained"], "unknown weights 'trained'; choose from pretrained, random"),
    "layer out of range": ([TEXT, "--layer", "6"], "layer 6 is out of range"),
    "empty text": (["  "], "the text is empty"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
    args, message = BAD_INPUTS[case]
    assert compare(*args, "--out", str(tmp_path / "run")) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert list(tmp_path.iterdir()) == []

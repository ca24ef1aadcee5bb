"""`attnviz stats --words` (attnviz.stats(..., words=True)): every statistic over words.

stats measures padded batches on the device, merging each layer's maps into words with batched
membership matrices. The expectation here is computed another way, one text at a time: the word
maps of attnviz.layers(text, words=True) (merged by models/words.py's merge_attention, held to a
cell-by-cell merge in test_words_runs.py), fed to the per-text statistics of
analysis/statistics.py (head_statistics and js_distance, held to loops in test_analysis.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
from attnviz.analysis.statistics import STATISTICS, head_statistics, js_distance
from attnviz.api.experiment_results import text_statistics
from attnviz.cli import run

TOLERANCE = 1e-5
CHINESE = "我想吃酸菜鱼"  # 8 tokens, 6 words: [CLS] 我 想 吃 酸菜鱼 [SEP]
CHINESE_WORDS = ["[CLS]", "我", "想", "吃", "酸菜鱼", "[SEP]"]
ENGLISH = "The unaffable cat sat, embarrassingly, on the mat."  # una ##ffa ##ble, em ##bar ##rass ##ingly
PLAIN = "a b c d e f g"  # 9 tokens, 9 words: more words than CHINESE, fewer tokens than ENGLISH


def bundled(**options):
    return dict(model="bundled", device="cpu", **options)


def word_statistics(text: str, **options):
    """(L, H, S) statistics and (L, H, H) JS distances of one text's word maps, text by text in NumPy."""
    layer_runs = attnviz.layers(text, **bundled(words=True, **options)).layer_runs
    causal = layer_runs[0].causal
    values = np.stack([head_statistics(run.attention, run.query_tokens, causal) for run in layer_runs])
    distances = np.stack([js_distance(run.attention) for run in layer_runs])
    return values, distances, layer_runs[0].query_tokens


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("text", [CHINESE, ENGLISH])
def test_stats_over_words_of_one_text_are_the_statistics_of_its_word_maps(text, causal):
    result = attnviz.stats(text, **bundled(words=True, causal=causal))
    values, distances, words = word_statistics(text, causal=causal)
    assert result.first_run.query_tokens == words and result.first_run.words is not None
    np.testing.assert_allclose(result.values, values, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(result.js_distance, distances, atol=TOLERANCE, rtol=0)


def test_stats_over_words_are_not_the_statistics_over_tokens():
    """Word maps change the numbers: 酸菜鱼's three pieces are one key and one query."""
    tokens = attnviz.stats(CHINESE, **bundled())
    words = attnviz.stats(CHINESE, **bundled(words=True))
    assert len(tokens.first_run.query_tokens) == 8 and words.first_run.words.query_plain_words == CHINESE_WORDS
    assert np.abs(tokens.values - words.values).max() > 100 * TOLERANCE


def test_previous_and_next_are_the_words_beside():
    """previous is the weight of word i on word i-1, averaged over words 1..W-1 (next: i+1, words 0..W-2),
    written out over the word maps; distance counts words."""
    result = attnviz.stats(ENGLISH, **bundled(words=True))
    layer_runs = attnviz.layers(ENGLISH, **bundled(words=True)).layer_runs
    for layer, layer_run in enumerate(layer_runs):
        maps = layer_run.attention.astype(np.float64)  # (H, W, W)
        num_words = maps.shape[-1]
        previous = np.mean([maps[:, i, i - 1] for i in range(1, num_words)], axis=0)
        following = np.mean([maps[:, i, i + 1] for i in range(num_words - 1)], axis=0)
        distance = np.mean([sum(maps[:, i, j] * abs(i - j) for j in range(num_words)) for i in range(num_words)], axis=0)
        got = result.values[layer]
        np.testing.assert_allclose(got[:, STATISTICS.index("previous")], previous, atol=TOLERANCE)
        np.testing.assert_allclose(got[:, STATISTICS.index("next")], following, atol=TOLERANCE)
        np.testing.assert_allclose(got[:, STATISTICS.index("distance")], distance, atol=TOLERANCE)


@pytest.mark.parametrize("causal", [False, True])
def test_stats_over_words_of_a_padded_batch_average_each_texts_word_statistics(causal):
    """Texts of different token and word counts in one padded batch: padding tokens and padding words count for nothing."""
    texts = [ENGLISH, CHINESE, PLAIN]
    alone = [word_statistics(text, causal=causal) for text in texts]
    assert len({len(words) for _, _, words in alone}) == 3  # 15, 6 and 9 words
    result = attnviz.stats(texts, **bundled(words=True, causal=causal))
    np.testing.assert_allclose(result.values, np.mean([values for values, _, _ in alone], axis=0), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(
        result.js_distance, np.mean([distances for _, distances, _ in alone], axis=0), atol=TOLERANCE, rtol=0
    )


@pytest.mark.slow
def test_stats_words_writes_stats_json_over_words(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["stats", CHINESE, "--words", "--model", "bundled", "--device", "cpu", "--out", str(out)]) == 0
    record = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert record["settings"]["words"] is True and record["statistics_over"] == "words"
    values, distances, _ = word_statistics(CHINESE)
    heads = record["heads"]
    written = np.array([[head[name] for name in STATISTICS] for head in heads]).reshape(values.shape)
    np.testing.assert_allclose(written, values, atol=1e-6)
    np.testing.assert_allclose(record["js_distance"], distances, atol=1e-6)
    assert "over" in capsys.readouterr().out  # the setup says the statistics are over words

    plain = attnviz.stats(CHINESE, **bundled()).to_dict()  # stats.json's object
    assert plain["settings"]["words"] is False and plain["statistics_over"] == "tokens"


@pytest.mark.slow
def test_the_js_distance_figure_and_the_notebook_say_over_words():
    from attnviz.render.titles import WORDS_NOTE

    result, plain = attnviz.stats(CHINESE, **bundled(words=True)), attnviz.stats(CHINESE, **bundled())
    assert WORDS_NOTE in result.figure().get_suptitle().replace("\n", " ")
    assert WORDS_NOTE not in plain.figure().get_suptitle().replace("\n", " ")
    assert "first text&#x27;s words</b> <code>0:[CLS]</code> <code>1:我</code>" in result._repr_html_()
    assert "first text&#x27;s tokens</b>" in plain._repr_html_()


def test_smollm2_stats_over_words_are_causal_over_words(smollm2_cached):
    """A decoder: each word sees the words up to its own; a batch of two texts of 4 and 5 words."""
    model = "smollm2"
    texts = [CHINESE, "The unaffable cat sat."]
    result = attnviz.stats(texts, model=model, device="cpu", words=True)
    expected_values, expected_distances = [], []
    for text in texts:
        layer_runs = attnviz.layers(text, model=model, device="cpu", words=True).layer_runs
        assert all(np.all(np.triu(layer_run.attention, k=1) == 0) for layer_run in layer_runs)
        statistics = text_statistics(layer_runs, causal=True)
        expected_values.append(statistics.values)
        expected_distances.append(statistics.js_distance)
    assert layer_runs[0].causal and result.stats.causal
    np.testing.assert_allclose(result.values, np.mean(expected_values, axis=0), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(result.js_distance, np.mean(expected_distances, axis=0), atol=TOLERANCE, rtol=0)
    assert np.all(result.values[..., STATISTICS.index("next")] == 0)  # no word sees the word after it

"""The accumulator's plain state and merge: shards of texts add up to the single-process statistics."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.analysis.statistics import StatisticsAccumulator, head_statistics, js_distance

TEXTS = [["[CLS]", "a", "[SEP]"], ["[CLS]", "a", "b", ",", "c", "[SEP]"], ["[CLS]", "x", "y", "[SEP]"], ["[CLS]", "[SEP]"]]
NUM_LAYERS, NUM_HEADS = 3, 2


def random_attention(rng, num_tokens):
    scores = rng.normal(size=(NUM_HEADS, num_tokens, num_tokens)) * 3
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)  # (H, N, N), rows sum to 1


@pytest.fixture
def weights():
    rng = np.random.default_rng(11)
    return {(t, layer): random_attention(rng, len(tokens)) for t, tokens in enumerate(TEXTS) for layer in range(NUM_LAYERS)}


def accumulate(weights, texts, causal=False, js=True):
    accumulator = StatisticsAccumulator(NUM_LAYERS, causal, js)
    for t in texts:
        for layer in range(NUM_LAYERS):
            accumulator.add(layer, weights[t, layer], TEXTS[t])
    return accumulator


@pytest.mark.parametrize("shards", [[[0, 1, 2, 3]], [[0], [1, 2, 3]], [[3, 1], [0], [2]]])
def test_shards_merged_through_their_states_equal_one_pass(weights, shards):
    merged = StatisticsAccumulator(NUM_LAYERS)
    for shard in shards:
        state = accumulate(weights, shard).state()
        assert all(isinstance(value, (np.ndarray, bool)) for value in state.values())  # plain: no torch, no lists
        merged.merge(StatisticsAccumulator.from_state(state))
    result = merged.result()
    assert result.num_texts == len(TEXTS)
    for layer in range(NUM_LAYERS):  # the definition, computed text by text with numpy
        expected = sum(head_statistics(weights[t, layer], TEXTS[t]) for t in range(len(TEXTS))) / len(TEXTS)
        np.testing.assert_allclose(result.values[layer], expected, rtol=0, atol=1e-12)
        expected_js = sum(js_distance(weights[t, layer]) for t in range(len(TEXTS))) / len(TEXTS)
        np.testing.assert_allclose(result.js_distance[layer], expected_js, rtol=0, atol=1e-12)


def test_a_state_survives_a_npz_file(weights, tmp_path):
    state = accumulate(weights, [0, 2], causal=True).state()
    np.savez(tmp_path / "state.npz", **state)
    with np.load(tmp_path / "state.npz") as loaded:
        restored = StatisticsAccumulator.from_state(dict(loaded))
    assert restored.causal is True and restored.counts == [2] * NUM_LAYERS
    expected = accumulate(weights, [0, 2], causal=True).result()
    np.testing.assert_array_equal(restored.result().values, expected.values)
    np.testing.assert_array_equal(restored.result().js_distance, expected.js_distance)


def test_an_empty_accumulator_has_a_state_and_merges_as_nothing(weights):
    empty = StatisticsAccumulator.from_state(StatisticsAccumulator(NUM_LAYERS).state())
    assert empty.counts == [0] * NUM_LAYERS
    merged = empty.merge(accumulate(weights, [1]))
    np.testing.assert_array_equal(merged.result().values, accumulate(weights, [1]).result().values)


def test_merge_refuses_other_layers_or_another_mask(weights):
    with pytest.raises(ValueError, match="cannot merge"):
        accumulate(weights, [0]).merge(StatisticsAccumulator(NUM_LAYERS + 1))
    with pytest.raises(ValueError, match="cannot merge"):
        accumulate(weights, [0]).merge(accumulate(weights, [1], causal=True))
    with pytest.raises(ValueError, match="cannot merge"):  # sums without JS distances added to sums with them
        accumulate(weights, [0]).merge(accumulate(weights, [1], js=False))


def test_without_js_the_statistics_are_the_same_and_the_distances_none(weights, tmp_path):
    """Merged and restored through a .npz, an accumulator without JS distances keeps its values and its lack of them."""
    merged = StatisticsAccumulator(NUM_LAYERS, js=False)
    for shard in [[0, 3], [1, 2]]:
        np.savez(tmp_path / "state.npz", **accumulate(weights, shard, js=False).state())
        with np.load(tmp_path / "state.npz") as loaded:
            merged.merge(StatisticsAccumulator.from_state(dict(loaded)))
    result, full = merged.result(), accumulate(weights, range(len(TEXTS))).result()
    assert result.js_distance is None and merged.js is False
    np.testing.assert_allclose(result.values, full.values, rtol=0, atol=1e-12)


def test_a_half_measured_accumulator_has_no_state(weights):
    accumulator = StatisticsAccumulator(NUM_LAYERS)
    accumulator.add(0, weights[0, 0], TEXTS[0])
    with pytest.raises(ValueError, match="same texts"):
        accumulator.state()

"""Head statistics, labels, Jensen-Shannon distances and rollout on hand-built attention.

Every expected value is either known by construction (an identity matrix attends only to the
same token) or recomputed here with plain loops, independently of the vectorised code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.analysis import blockwise
from attnviz.analysis import statistics as analysis
from attnviz.analysis.rollout import attention_rollout
from attnviz.analysis.statistics import (
    BROAD_THRESHOLD,
    SHARE_THRESHOLD,
    STATISTICS,
    ModelStatistics,
    StatisticsAccumulator,
    batch_statistics,
    head_label,
    head_statistics,
    is_punctuation,
    js_distance,
    key_kind_columns,
    summarize_heads,
)

N = 6
TOKENS = ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]


def stats_of(matrix: np.ndarray, tokens=TOKENS, causal=False) -> dict[str, float]:
    """The statistics of one head given as an (N, N) matrix."""
    values = head_statistics(matrix[None], tokens, causal)[0]
    return dict(zip(STATISTICS, values))


def shifted_identity(n: int, offset: int) -> np.ndarray:
    """Row i has its 1 at column i + offset; a row whose column would fall outside keeps it on itself."""
    matrix = np.zeros((n, n))
    for i in range(n):
        j = i + offset
        matrix[i, j if 0 <= j < n else i] = 1.0
    return matrix


def random_attention(rng, shape, causal=False) -> np.ndarray:
    """Row-softmax of random scores; causal rows have exact zeros above the diagonal."""
    scores = rng.normal(scale=2.0, size=shape)
    if causal:
        scores[..., np.triu(np.ones(shape[-2:], dtype=bool), k=1)] = -np.inf
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


# --- each statistic on matrices with a known answer ---------------------------------------------


def test_identity_attends_only_to_the_same_token():
    values = stats_of(np.eye(N))
    assert values["same"] == 1.0 and values["previous"] == 0.0 and values["next"] == 0.0
    assert values["distance"] == 0.0 and values["mean_max"] == 1.0
    assert values["entropy"] == 0.0 and values["relative_entropy"] == 0.0
    assert values["cls"] == pytest.approx(1 / N) and values["sep"] == pytest.approx(1 / N)  # rows 0 and N-1


def test_previous_token_means_key_i_minus_1_for_query_i():
    matrix = shifted_identity(N, -1)  # row i -> column i-1; row 0 has no previous token: itself
    assert matrix[3, 2] == 1.0  # query 3 looks back at key 2
    values = stats_of(matrix)
    assert values["previous"] == 1.0  # over the queries that have a previous token
    assert values["next"] == 0.0
    assert values["same"] == pytest.approx(1 / N)  # only row 0
    assert values["distance"] == pytest.approx((N - 1) / N)  # one token away, except row 0
    assert head_label(values) == "previous-token"


def test_next_token_means_key_i_plus_1_for_query_i():
    matrix = shifted_identity(N, +1)  # row i -> column i+1; the last row has none: itself
    values = stats_of(matrix)
    assert values["next"] == 1.0 and values["previous"] == 0.0
    assert values["distance"] == pytest.approx((N - 1) / N)
    assert head_label(values) == "next-token"


def test_two_back_is_neither_previous_nor_next_and_has_distance_two():
    values = stats_of(shifted_identity(N, -2))
    assert values["previous"] == 0.0 and values["next"] == 0.0
    assert values["distance"] == pytest.approx(2 * (N - 2) / N)  # rows 0 and 1 stay on themselves


def test_uniform_rows_have_relative_entropy_one():
    values = stats_of(np.full((N, N), 1 / N))
    assert values["relative_entropy"] == pytest.approx(1.0)
    assert values["entropy"] == pytest.approx(math.log(N))
    assert values["mean_max"] == pytest.approx(1 / N)
    assert values["cls"] == pytest.approx(1 / N) and values["punctuation"] == pytest.approx(1 / N)
    expected_distance = np.mean([sum(abs(i - j) for j in range(N)) / N for i in range(N)])
    assert values["distance"] == pytest.approx(expected_distance)
    assert head_label(values) == "broad"


def test_all_weight_on_sep_and_on_cls():
    to_sep = np.zeros((N, N))
    to_sep[:, N - 1] = 1.0
    values = stats_of(to_sep)
    assert values["sep"] == 1.0 and values["cls"] == 0.0
    assert head_label(values) == "[SEP]"
    to_cls = np.zeros((N, N))
    to_cls[:, 0] = 1.0
    values = stats_of(to_cls)
    assert values["cls"] == 1.0 and values["sep"] == 0.0
    assert values["distance"] == pytest.approx(np.mean(np.arange(N)))
    assert head_label(values) == "[CLS]"


def test_cls_and_sep_are_found_by_token_not_by_position():
    tokens = ["[CLS]", "a", "[SEP]", "b", "[SEP]"]  # a sentence pair: two [SEP]s
    to_seps = np.zeros((5, 5))
    to_seps[:, 2] = to_seps[:, 4] = 0.5
    assert stats_of(to_seps, tokens)["sep"] == pytest.approx(1.0)


@pytest.mark.parametrize("token", [".", ",", "。", "，", "'", "!?", "##.", "«", "—", "、"])
def test_punctuation_tokens(token):
    assert is_punctuation(token)


@pytest.mark.parametrize("token", ["[CLS]", "[SEP]", "a", "a.", "$", "+", "1", "##", "", "我"])
def test_not_punctuation(token):
    assert not is_punctuation(token)


def test_punctuation_share_is_the_weight_on_punctuation_keys():
    tokens = ["[CLS]", "hi", ",", "you", "!", "[SEP]"]
    matrix = np.full((6, 6), 1 / 6)
    assert stats_of(matrix, tokens)["punctuation"] == pytest.approx(2 / 6)


def test_every_statistic_equals_a_loop_over_queries_and_keys():
    rng = np.random.default_rng(0)
    attention = random_attention(rng, (3, N, N))
    got = head_statistics(attention, TOKENS)
    for head in range(3):
        a = attention[head]
        rows = range(N)
        entropy = [-sum(a[i, j] * math.log(a[i, j]) for j in range(N)) for i in rows]
        expected = {
            "entropy": np.mean(entropy),
            "relative_entropy": np.mean(entropy) / math.log(N),
            "mean_max": np.mean([max(a[i]) for i in rows]),
            "cls": np.mean([a[i, 0] for i in rows]),
            "sep": np.mean([a[i, N - 1] for i in rows]),
            "punctuation": np.mean([a[i, 4] for i in rows]),
            "same": np.mean([a[i, i] for i in rows]),
            "previous": np.mean([a[i, i - 1] for i in range(1, N)]),
            "next": np.mean([a[i, i + 1] for i in range(N - 1)]),
            "distance": np.mean([sum(a[i, j] * abs(i - j) for j in range(N)) for i in rows]),
        }
        for name, value in expected.items():
            assert got[head, STATISTICS.index(name)] == pytest.approx(value, abs=1e-12), name


def test_relative_entropy_agrees_with_the_heads_table_summary():
    attention = random_attention(np.random.default_rng(1), (4, N, N))
    ours = head_statistics(attention, TOKENS)[:, STATISTICS.index("relative_entropy")]
    np.testing.assert_allclose(ours, [s.relative_entropy for s in summarize_heads(attention)], atol=1e-12)


def test_causal_relative_entropy_is_one_definition_for_heads_and_stats():
    """`heads --causal` and `stats --causal` divide each row's entropy by log of the keys its query sees."""
    rng = np.random.default_rng(2)
    lower = np.tril(rng.random((3, N, N)) + 0.05)
    attention = lower / lower.sum(axis=-1, keepdims=True)  # (H, N, N): query i on keys 0..i
    expected = [  # query 0 sees one key: no choice, left out
        np.mean([-sum(p * math.log(p) for p in attention[h, i, : i + 1]) / math.log(i + 1) for i in range(1, N)])
        for h in range(3)
    ]
    from_heads = [summary.relative_entropy for summary in summarize_heads(attention, causal=True)]
    from_stats = head_statistics(attention, TOKENS, causal=True)[:, STATISTICS.index("relative_entropy")]
    np.testing.assert_allclose(from_heads, expected, atol=1e-12)
    np.testing.assert_allclose(from_stats, expected, atol=1e-12)


def test_a_causal_head_uniform_over_what_it_sees_is_relative_entropy_one_in_the_heads_table():
    lower = np.tril(np.ones((N, N)))
    (summary,) = summarize_heads((lower / lower.sum(axis=1, keepdims=True))[None], causal=True)
    assert summary.relative_entropy == pytest.approx(1.0)  # not log-mean / log(N), about 0.64


def test_causal_uniform_rows_are_uniform_over_the_keys_they_may_see():
    lower = np.tril(np.ones((N, N)))
    causal_uniform = lower / lower.sum(axis=1, keepdims=True)  # row i: 1/(i+1) on keys 0..i
    values = stats_of(causal_uniform, causal=True)
    assert values["relative_entropy"] == pytest.approx(1.0)  # query 0 sees one key: left out
    assert values["next"] == 0.0
    assert stats_of(causal_uniform)["relative_entropy"] < 0.8  # measured against all N keys instead


def test_a_one_token_text_has_no_neighbours():
    values = stats_of(np.ones((1, 1)), tokens=["[CLS]"])
    assert values["previous"] == 0.0 and values["next"] == 0.0 and values["same"] == 1.0


def test_non_square_weights_are_refused():
    with pytest.raises(ValueError):
        head_statistics(np.ones((1, 2, 3)) / 3, ["a", "b", "c"])


# --- labels follow the thresholds -----------------------------------------------------------------


def values_with(**given) -> dict[str, float]:
    values = dict.fromkeys(STATISTICS, 0.0)
    values.update(given)
    return values


@pytest.mark.parametrize(
    "given, label",
    [
        (dict(previous=SHARE_THRESHOLD), "previous-token"),
        (dict(previous=SHARE_THRESHOLD - 0.01), None),
        (dict(next=0.8), "next-token"),
        (dict(same=0.5), "same-token"),
        (dict(cls=0.9), "[CLS]"),
        (dict(sep=0.7, previous=0.6), "[SEP]"),  # the largest share wins
        (dict(previous=0.6, relative_entropy=0.95), "previous-token"),  # a share before broad
        (dict(relative_entropy=BROAD_THRESHOLD), "broad"),
        (dict(relative_entropy=BROAD_THRESHOLD - 0.01), None),
        (dict(punctuation=0.9), None),  # measured, but no label
        (dict(previous=0.5, next=0.5), "previous-token"),  # a tie goes to the first in SHARE_LABELS
    ],
)
def test_labels_follow_the_thresholds(given, label):
    assert head_label(values_with(**given)) == label


def test_model_statistics_lists_labelled_heads_strongest_first():
    values = np.zeros((2, 3, len(STATISTICS)))
    index = STATISTICS.index
    values[0, 1, index("sep")] = 0.6
    values[1, 2, index("sep")] = 0.9
    values[1, 0, index("previous")] = 0.7
    values[0, 0, index("relative_entropy")] = 0.95
    stats = ModelStatistics(values=values, js_distance=np.zeros((2, 3, 3)), num_texts=1)
    assert stats.label(1, 2) == "[SEP]" and stats.label(0, 2) is None
    assert stats.labelled_heads() == {
        "previous-token": [(1, 0, pytest.approx(0.7))],
        "[SEP]": [(1, 2, pytest.approx(0.9)), (0, 1, pytest.approx(0.6))],
        "broad": [(0, 0, pytest.approx(0.95))],
    }


# --- Jensen-Shannon distance --------------------------------------------------------------------


def js_distance_by_loops(p_rows: np.ndarray, q_rows: np.ndarray) -> float:
    """sqrt of the Jensen-Shannon divergence in bits, per row, averaged over rows."""
    distances = []
    for p, q in zip(p_rows, q_rows):
        m = [(a + b) / 2 for a, b in zip(p, q)]
        kl_p = sum(a * math.log2(a / c) for a, c in zip(p, m) if a > 0)
        kl_q = sum(b * math.log2(b / c) for b, c in zip(q, m) if b > 0)
        distances.append(math.sqrt(max(0.0, (kl_p + kl_q) / 2)))
    return float(np.mean(distances))


def test_js_distance_is_zero_for_identical_heads_and_one_for_disjoint_heads():
    identity, backwards = np.eye(N), shifted_identity(N, -1)
    backwards[0] = np.eye(N)[N - 1]  # row 0 elsewhere too: every row disjoint from the identity's
    distances = js_distance(np.stack([identity, identity, backwards]))
    assert distances[0, 1] == 0.0 and distances[0, 0] == 0.0
    assert distances[0, 2] == pytest.approx(1.0) and distances[2, 1] == pytest.approx(1.0)


def test_js_distance_is_symmetric_in_range_and_equals_the_formula():
    attention = random_attention(np.random.default_rng(2), (4, 5, 7))  # rectangular rows work too
    distances = js_distance(attention)
    np.testing.assert_array_equal(distances, distances.T)
    assert np.all((distances >= 0) & (distances <= 1))
    np.testing.assert_array_equal(np.diag(distances), 0.0)
    for a in range(4):
        for b in range(4):
            assert distances[a, b] == pytest.approx(js_distance_by_loops(attention[a], attention[b]), abs=1e-12)


# --- attention rollout ----------------------------------------------------------------------------


def test_rollout_equals_the_product_written_out():
    rng = np.random.default_rng(3)
    layers = [random_attention(rng, (3, 5, 5)) for _ in range(4)]
    mixed = []
    for attention in layers:
        averaged = sum(attention[h] for h in range(3)) / 3 + np.eye(5)
        mixed.append(averaged / averaged.sum(axis=1, keepdims=True))
    expected = np.linalg.multi_dot(mixed[::-1])  # A'_3 A'_2 A'_1 A'_0: the last layer on the left
    rollout = attention_rollout(layers)
    np.testing.assert_allclose(rollout, expected, atol=1e-12)
    np.testing.assert_allclose(rollout.sum(axis=1), 1.0, atol=1e-12)


def test_rollout_of_one_layer_is_half_attention_half_identity():
    attention = random_attention(np.random.default_rng(4), (2, 4, 4))
    np.testing.assert_allclose(attention_rollout([attention]), (attention.mean(0) + np.eye(4)) / 2, atol=1e-12)


def test_rollout_order_matters_and_causal_rollout_stays_lower_triangular():
    rng = np.random.default_rng(5)
    first, second = random_attention(rng, (2, 4, 4)), random_attention(rng, (2, 4, 4))
    assert not np.allclose(attention_rollout([first, second]), attention_rollout([second, first]))
    causal = [random_attention(rng, (2, 4, 4), causal=True) for _ in range(3)]
    assert np.all(np.triu(attention_rollout(causal), k=1) == 0)


# --- averaging over texts -------------------------------------------------------------------------


def test_the_accumulator_averages_each_texts_own_statistics():
    rng = np.random.default_rng(6)
    texts = [["[CLS]", "a", "[SEP]"], ["[CLS]", "a", "b", ",", "c", "[SEP]"]]
    weights = {
        (t, layer): random_attention(rng, (2, len(tokens), len(tokens)))
        for t, tokens in enumerate(texts)
        for layer in range(3)
    }
    accumulator = StatisticsAccumulator(num_layers=3)
    for (t, layer), attention in weights.items():
        accumulator.add(layer, attention, texts[t])
    result = accumulator.result()
    assert result.num_texts == 2 and result.values.shape == (3, 2, len(STATISTICS))
    for layer in range(3):
        expected = (head_statistics(weights[0, layer], texts[0]) + head_statistics(weights[1, layer], texts[1])) / 2
        np.testing.assert_allclose(result.values[layer], expected, atol=1e-12)
        expected_js = (js_distance(weights[0, layer]) + js_distance(weights[1, layer])) / 2
        np.testing.assert_allclose(result.js_distance[layer], expected_js, atol=1e-12)


# The default: these 4 short texts one block; 1: one query a block; 300: one text a block
@pytest.mark.parametrize("cells_at_once", [blockwise.CPU_CELLS_AT_ONCE, 1, 300])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("js", [True, False])
def test_batch_statistics_of_a_padded_batch_equal_each_texts_own_statistics(js, causal, threads, cells_at_once, monkeypatch):
    """The fast path (torch, block by block) against the plain one (numpy, one unpadded text at a time)."""
    import torch

    monkeypatch.setattr(blockwise, "CPU_CELLS_AT_ONCE", cells_at_once)

    rng = np.random.default_rng(7)
    texts = [["[CLS]", "a", ",", "b", "c", "[SEP]"], ["[CLS]", "x", "[SEP]"], ["[CLS]", "[SEP]"], ["[CLS]"]]
    padded = np.zeros((len(texts), 3, 6, 6))  # (B, H, N, N): zero on every padding key
    for t, tokens in enumerate(texts):
        n = len(tokens)
        padded[t, :, n:, :n] = rng.dirichlet(np.ones(n), size=(3, 6 - n))  # padding queries see the real keys, as in the layer
        scores = rng.normal(size=(3, n, n)) * 3
        if causal:
            scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
        padded[t, :, :n, :n] = np.exp(scores - scores.max(-1, keepdims=True))
        padded[t, :, :n, :n] /= padded[t, :, :n, :n].sum(-1, keepdims=True)

    kinds = key_kind_columns(texts, 6)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        values, distances = batch_statistics(
            torch.tensor(padded, dtype=torch.float32), torch.tensor([len(tokens) for tokens in texts]), kinds, causal, js
        )
        assert torch.get_num_threads() == threads  # left as it was
    finally:
        torch.set_num_threads(torch_threads)

    blocks = [padded[t, :, : len(tokens), : len(tokens)] for t, tokens in enumerate(texts)]
    expected = sum(head_statistics(block, tokens, causal) for block, tokens in zip(blocks, texts))
    np.testing.assert_allclose(values.numpy(), expected, atol=1e-5, rtol=0)
    if not js:  # the statistics without the pairs of heads' sums
        assert distances is None
        return
    np.testing.assert_allclose(distances.numpy(), sum(js_distance(block) for block in blocks), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_batch_statistics_of_long_texts_equal_numpys_float64(dtype):
    """Texts of 512 and 300 tokens and an empty one, with near-identical, disjoint and identical heads.

    Several blocks of queries per text, padding keys and queries (zeros), rows with exact zeros. In
    float64 (stats --words) within 1e-6 of numpy's js_distance and head_statistics; float32 maps
    within 1e-5, and 1e-6 of the mean distance in tokens (near-identical rows left out: the root of a
    divergence near 0 is float32's limit).
    """
    import torch

    rng = np.random.default_rng(11)
    lengths = [512, 300, 0]
    padded = np.zeros((len(lengths), 5, 512, 512))  # (B, H, N, N)
    for t, n in enumerate(lengths[:2]):
        sharp = random_attention(rng, (n, n)) ** 4
        padded[t, 0, :n, :n] = sharp / sharp.sum(-1, keepdims=True)
        near = padded[t, 0, :n, :n] * (1 + 1e-3 * rng.random((n, n)))  # head 1: head 0 within 0.1 %
        padded[t, 1, :n, :n] = near / near.sum(-1, keepdims=True) if dtype == "float64" else random_attention(rng, (n, n))
        padded[t, 2, np.arange(n), np.arange(n)] = 1.0  # one-hot on itself
        padded[t, 3, np.arange(n), (np.arange(n) + 1) % n] = 1.0  # one-hot on the next: no key in common with head 2
        padded[t, 4, :n, :n] = padded[t, 2, :n, :n]  # the same as head 2
    texts = [["[CLS]", *[("." if i % 7 == 0 else "w") for i in range(n - 2)], "[SEP]"][:n] for n in lengths]
    attention = torch.tensor(padded, dtype=getattr(torch, dtype))

    values, distances = batch_statistics(attention, torch.tensor(lengths), key_kind_columns(texts, 512))

    blocks = [attention[t, :, :n, :n].double().numpy() for t, n in enumerate(lengths[:2])]
    expected_js = sum(js_distance(block) for block in blocks)
    tolerance = 1e-6 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(distances.numpy(), expected_js, atol=tolerance, rtol=0)
    assert distances[2, 3] == pytest.approx(2.0) and distances[2, 4] == pytest.approx(0.0, abs=tolerance)  # two texts
    expected = sum(head_statistics(block, tokens) for block, tokens in zip(blocks, texts))
    np.testing.assert_allclose(values.numpy(), expected, atol=tolerance, rtol=0 if dtype == "float64" else 1e-6)


def test_the_accumulator_refuses_layers_with_different_texts():
    accumulator = StatisticsAccumulator(num_layers=2)
    accumulator.add(0, np.eye(3)[None], ["[CLS]", "a", "[SEP]"])
    with pytest.raises(ValueError):
        accumulator.result()


@pytest.mark.parametrize("causal", [False, True])
def test_the_heads_table_in_blocks_is_numpys_float64_table(causal):
    """summarize_heads read a few queries at a time (a long map's way) gives each head's entropy, relative entropy
    and mean max as numpy computes them from the whole map in float64, and numpy's argmax as each query's top key."""
    rng = np.random.default_rng(3)
    raw = rng.random((3, N, N)) + 0.05
    raw[:, 4, :] = 1.0  # a row of ties: the first key is the top key, as numpy's argmax
    raw = np.tril(raw) if causal else raw
    attention = (raw / raw.sum(axis=-1, keepdims=True)).astype(np.float32)  # (H, N, N)
    whole = attention.astype(np.float64)
    logs = np.log(whole, where=whole > 0, out=np.zeros_like(whole))
    entropy = -(whole * logs).sum(axis=-1)  # (H, N)
    visible = np.arange(1, N + 1) if causal else np.full(N, N)  # keys each query may see
    relative = (entropy[:, visible > 1] / np.log(visible[visible > 1])).mean(axis=-1)  # (H,)
    for head, blocked in enumerate(summarize_heads(attention, causal, rows=3)):
        assert blocked.head == head
        assert blocked.entropy == pytest.approx(entropy[head].mean(), abs=1e-6)
        assert blocked.relative_entropy == pytest.approx(relative[head], abs=1e-6)
        assert blocked.mean_max == pytest.approx(whole[head].max(axis=-1).mean(), abs=1e-6)
        assert blocked.top_keys == whole[head].argmax(axis=-1).tolist() and blocked.top_keys[4] == 0

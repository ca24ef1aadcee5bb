"""Every per-head number of analysis/head_numbers.py, block by block, against its definition written out in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.analysis.head_numbers import HEAD_NUMBERS, Block, block_sums
from attnviz.analysis.statistics import key_kind_columns

TEXTS = [["[CLS]", "a", ",", "b", "c", "d", "[SEP]"], ["[CLS]", "x", ".", "[SEP]"], ["[CLS]"]]
WINDOW = 2


def _shares(kind):
    return lambda A, tokens, causal: (A[:, :, kind(tokens)]).sum(-1).mean(-1)


def _on_offset(offset):
    def mean(A, tokens, causal):
        rows = np.diagonal(A, offset=offset, axis1=1, axis2=2)  # (H, n): A[i, i + offset]
        return rows.mean(-1) if rows.shape[-1] else np.zeros(A.shape[0])
    return mean


def _entropy(A):
    return -(A * np.log(A, where=A > 0, out=np.zeros_like(A))).sum(-1)  # (H, N)


def _relative(A, tokens, causal):
    visible = np.arange(1, A.shape[1] + 1) if causal else np.full(A.shape[1], A.shape[2])
    chosen = visible > 1
    return (_entropy(A)[:, chosen] / np.log(visible[chosen])).mean(-1) if chosen.any() else np.zeros(A.shape[0])


def _offsets(A):
    positions = np.arange(A.shape[1])
    return np.abs(positions[:, None] - positions[None, :])  # (N, N)


EXPECTED = {  # name -> (A (H, N, N) of one text in float64, its tokens, causal) -> (H,): the definition, written out
    "entropy": lambda A, tokens, causal: _entropy(A).mean(-1),
    "relative_entropy": _relative,
    "mean_max": lambda A, tokens, causal: A.max(-1).mean(-1),
    "cls": _shares(lambda tokens: [token == "[CLS]" for token in tokens]),
    "sep": _shares(lambda tokens: [token == "[SEP]" for token in tokens]),
    "punctuation": _shares(lambda tokens: [token in {",", "."} for token in tokens]),
    "same": _on_offset(0),
    "previous": _on_offset(-1),
    "next": _on_offset(1),
    "distance": lambda A, tokens, causal: (A * _offsets(A)).sum(-1).mean(-1),
    "sink": lambda A, tokens, causal: A[:, :, 0].mean(-1),
    "last": lambda A, tokens, causal: A[:, :, -1].mean(-1),
    "local": lambda A, tokens, causal: (A * (_offsets(A) <= WINDOW)).sum(-1).mean(-1),
}


def test_every_number_has_its_expectation_here():
    assert set(EXPECTED) == set(HEAD_NUMBERS)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 7])
def test_a_padded_batchs_blocks_add_up_to_the_sum_of_each_texts_definition(causal, rows):
    rng = np.random.default_rng(5)
    num_tokens, num_heads = max(map(len, TEXTS)), 3
    lens = np.array([len(tokens) for tokens in TEXTS])
    scores = rng.normal(size=(len(TEXTS), num_heads, num_tokens, num_tokens)) * 3
    allowed = np.arange(num_tokens)[None, None, None, :] < lens[:, None, None, None]  # (B, 1, 1, N)
    if causal:
        allowed = allowed & np.tri(num_tokens, dtype=bool)
    weights = np.exp(np.where(allowed, scores, -np.inf))
    weights /= weights.sum(-1, keepdims=True)  # (B, H, N, N) float64, padding keys 0
    names = list(HEAD_NUMBERS)
    columns = key_kind_columns(TEXTS, num_tokens)
    key_columns = torch.cat([columns, torch.ones_like(columns[..., :1])], dim=-1)
    sums = 0
    for start in range(0, num_tokens, rows):
        width = min(start + rows, num_tokens) if causal else num_tokens  # a causal block's keys stop at its last query's
        block = Block(torch.from_numpy(weights[:, :, start : start + rows, :width]), start, torch.from_numpy(lens), causal=causal,
                      num_queries=num_tokens, key_columns=key_columns, window=WINDOW)  # fmt: skip
        sums = sums + block_sums(block, names).numpy()  # (H, E)
    for index, name in enumerate(names):
        expected = sum(EXPECTED[name](weights[b, :, :n, :n], tokens, causal) for b, (tokens, n) in enumerate(zip(TEXTS, lens)))
        np.testing.assert_allclose(sums[:, index], expected, rtol=0, atol=1e-12, err_msg=name)

"""Every per-head number of analysis/head_numbers.py, block by block, against its definition written out in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.analysis.head_numbers import HEAD_NUMBERS, TOP_K, Block, RoleSettings, block_sums
from attnviz.analysis.statistics import key_kind_columns

TEXTS = [["[CLS]", "a", ",", "b", "c", "d", "[SEP]"], ["[CLS]", "x", ".", "[SEP]"], ["[CLS]"], ["a", "b", "a", "b", "b", "a"]]
WINDOW = 2
SINKS, RECENT = 1, 2  # the streaming share's S and W, small enough to leave keys out of a 7-token row


def _ids(tokens):
    """Token ids of the tokens: equal tokens, equal ids."""
    return np.array([sorted({token for text in TEXTS for token in text}).index(token) for token in tokens])


def previous_template(ids):
    """TransformerLens's previous-token detection pattern (N, N): 1 on A[i, i - 1]."""
    pattern = np.zeros((len(ids), len(ids)))
    pattern[1:, :-1] = np.eye(len(ids) - 1)
    return np.tril(pattern)


def duplicate_template(ids):
    """TransformerLens's duplicate-token pattern: 1 where token j equals token i, j != i, lower triangle."""
    equal = (ids[:, None] == ids[None, :]).astype(float)
    np.fill_diagonal(equal, 0)
    return np.tril(equal)


def induction_template(ids):
    """TransformerLens's induction pattern: the duplicate pattern shifted one key right, column 0 zero, lower triangle."""
    duplicate = duplicate_template(ids)
    shifted = np.zeros_like(duplicate)
    shifted[:, 1:] = duplicate[:, :-1]
    return np.tril(shifted)


def _on_template(template):
    return lambda A, tokens, causal: (A * template(_ids(tokens))).sum(-1).mean(-1)


def _prefix_matching(A, tokens, causal):
    ids = _ids(tokens)
    repeated = np.array([ids[i] in ids[:i] for i in range(len(ids))])
    hits = (A * induction_template(ids)).sum(-1)  # (H, N)
    return hits[:, repeated].mean(-1) if repeated.any() else np.zeros(A.shape[0])


def _streaming(A, tokens, causal):
    queries, keys = np.indices(A.shape[1:])
    kept = (keys < SINKS) | ((keys <= queries) & (keys > queries - RECENT))
    return (A * kept).sum(-1).mean(-1)


def _top(k):
    return lambda A, tokens, causal: -np.sort(-A, axis=-1)[..., :k].sum(-1).mean(-1)


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
    "previous_token_template": _on_template(previous_template),
    "duplicate_token_template": _on_template(duplicate_template),
    "induction_template": _on_template(induction_template),
    "template_weight": lambda A, tokens, causal: A.sum(-1).mean(-1),
    "prefix_matching": _prefix_matching,
    "streaming": _streaming,
    "top_16": _top(16),
    "top_64": _top(64),
    "top_256": _top(256),
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
    token_ids = torch.tensor(np.stack([np.pad(_ids(tokens), (0, num_tokens - len(tokens)), constant_values=0) for tokens in TEXTS]))
    roles = RoleSettings(sinks=SINKS, recent=RECENT)
    sums = 0
    for start in range(0, num_tokens, rows):
        width = min(start + rows, num_tokens) if causal else num_tokens  # a causal block's keys stop at its last query's
        block = Block(torch.from_numpy(weights[:, :, start : start + rows, :width]), start, torch.from_numpy(lens), causal=causal,
                      num_queries=num_tokens, key_columns=key_columns, token_ids=token_ids, window=WINDOW, roles=roles)  # fmt: skip
        sums = sums + block_sums(block, names).numpy()  # (H, E)
    for index, name in enumerate(names):
        expected = sum(EXPECTED[name](weights[b, :, :n, :n], tokens, causal) for b, (tokens, n) in enumerate(zip(TEXTS, lens)))
        np.testing.assert_allclose(sums[:, index], expected, rtol=0, atol=1e-12, err_msg=name)


def _causal_map(rng, num_heads, num_tokens, sharpness):
    scores = rng.normal(size=(num_heads, num_tokens, num_tokens)) * sharpness
    weights = np.exp(np.where(np.tri(num_tokens, dtype=bool), scores, -np.inf))
    return weights / weights.sum(-1, keepdims=True)  # (H, N, N) float64


def _sums_in_blocks(weights, ids, names, rows, roles, causal=True):
    num_tokens = weights.shape[-1]
    sums = 0
    for start in range(0, num_tokens, rows):
        width = min(start + rows, num_tokens) if causal else num_tokens
        block = Block(torch.from_numpy(weights[None, :, start : start + rows, :width]), start, torch.tensor([num_tokens]),
                      causal=causal, num_queries=num_tokens, token_ids=torch.tensor(ids)[None], roles=roles)  # fmt: skip
        sums = sums + block_sums(block, names).numpy()
    return {name: sums[:, index] for index, name in enumerate(names)}


def test_streaming_and_top_k_at_their_defaults_over_300_tokens():
    """S = 4 sinks and W = 256 recent keys, the top 16, 64 and 256 weights: over 300 tokens each leaves keys out."""
    rng = np.random.default_rng(7)
    weights = _causal_map(rng, 2, 300, sharpness=2)
    names = ["streaming", *(f"top_{k}" for k in TOP_K)]
    sums = _sums_in_blocks(weights, np.arange(300), names, rows=37, roles=RoleSettings())
    queries, keys = np.indices(weights.shape[1:])
    streaming = (weights * ((keys < 4) | ((keys <= queries) & (keys > queries - 256)))).sum(-1).mean(-1)
    np.testing.assert_allclose(sums["streaming"], streaming, rtol=0, atol=1e-12)
    assert (streaming < 1 - 1e-3).all()  # queries past 259 leave keys 4 .. i - 256 out
    for k in TOP_K:
        expected = -np.sort(-weights, axis=-1)[..., :k].sum(-1).mean(-1)
        np.testing.assert_allclose(sums[f"top_{k}"], expected, rtol=0, atol=1e-12, err_msg=str(k))
        assert (expected < 1 - 1e-5).all()  # each k leaves weight out


@pytest.mark.parametrize("exclude_bos", [False, True])
@pytest.mark.parametrize("exclude_current", [False, True])
def test_template_scores_are_transformer_lens_ratio_over_the_whole_map(exclude_bos, exclude_current):
    """TransformerLens's score sum(A' * P) / sum(A') (A' with column 0 and the diagonal zeroed as asked), written out,
    equals the mean of the template's numbers over the mean of template_weight, blocks of 5 rows; a text whose
    neighbours repeat (b b) puts the induction template on the diagonal, which exclude_current takes out."""
    rng = np.random.default_rng(3)
    ids = np.array([0, 5, 6, 7, 5, 6, 6, 7, 5, 6, 6, 2, 5])
    weights = _causal_map(rng, 3, len(ids), sharpness=2)
    roles = RoleSettings(exclude_bos=exclude_bos, exclude_current=exclude_current)
    names = ["previous_token_template", "duplicate_token_template", "induction_template", "template_weight"]
    sums = _sums_in_blocks(weights, ids, names, rows=5, roles=roles)
    kept = weights.copy()
    if exclude_bos:
        kept[:, :, 0] = 0
    if exclude_current:
        kept[:, np.arange(len(ids)), np.arange(len(ids))] = 0
    for name, template in [("previous_token_template", previous_template), ("duplicate_token_template", duplicate_template),
                           ("induction_template", induction_template)]:  # fmt: skip
        expected = (kept * template(ids)).sum((1, 2)) / kept.sum((1, 2))  # (H,): TransformerLens's 'mul' measure
        np.testing.assert_allclose(sums[name] / sums["template_weight"], expected, rtol=1e-12, err_msg=name)
    assert induction_template(ids)[6, 6] == 1  # the diagonal cell exclude_current changes


@pytest.mark.parametrize("rows_at_once", [None, 1, 4])
def test_top_k_is_the_sum_of_each_rows_largest_weights_exactly(monkeypatch, rows_at_once):
    """Rows whose largest weights sit side by side, are spread evenly, tie exactly (a uniform row), sit at the row's
    end, or are random, over 8,195 keys, in float64 and float32 (chosen on their bits read as integers), against
    NumPy's sort of each row; in one chunk of rows, a row a chunk, or chunks of 4 rows and a last one of 2."""
    from attnviz.analysis import head_numbers

    if rows_at_once is not None:
        monkeypatch.setattr(head_numbers, "CPU_CELLS_AT_ONCE", rows_at_once * 8195)
    rng = np.random.default_rng(11)
    width = 8195
    rows = np.exp(rng.normal(size=(6, width)) * 3)
    rows[1, :] = 1.0  # ties everywhere
    rows[2, 1000:1300] = 50.0 + rng.uniform(size=300)  # the largest side by side
    rows[3, ::4] = 40.0 + rng.uniform(size=len(rows[3, ::4]))  # one large weight in every four
    rows[4, -3:] = 1e3  # the largest at the end
    rows /= rows.sum(-1, keepdims=True)
    weights = rows.reshape(1, 2, 3, width)  # (B, H, b, K) float64
    expected = np.stack([-np.sort(-rows, axis=-1)[:, :k].sum(-1) for k in TOP_K], axis=-1).reshape(1, 2, 3, -1)
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        block = Block(torch.from_numpy(weights).to(dtype), width - 3, torch.tensor([width]), causal=False, num_queries=width)
        np.testing.assert_allclose(block.top_weights.numpy(), expected, rtol=0, atol=tolerance, err_msg=str(dtype))


def test_template_scores_of_a_head_on_the_first_token_and_the_diagonal_keep_their_digits_in_float32():
    """A head with nearly all its weight on key 0 and the diagonal (as SmolLM2's layer 18 head 8), float32 weights as a
    layer gives them, both exclusions: the weight left is about 1e-4 of each row. Its scores equal TransformerLens's
    formula written out in float64 on the same weights within float32's rounding of sums of small positive terms,
    where a kept weight taken as the row's sum less its two large weights loses its digits (off by about 1e-3)."""
    ids = np.array([0, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7])
    num_tokens = len(ids)
    logits = torch.zeros(2, num_tokens, num_tokens)
    logits[:, :, 0] = torch.tensor([11.0, 12.0])[:, None]  # two heads, the weight kept about 1e-4 and 3e-5 of a row
    logits[:, range(num_tokens), range(num_tokens)] = 10.0
    logits[:, 1:, 0] += torch.linspace(0, 1, num_tokens - 1)  # rows differ
    causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    weights = torch.softmax(logits.masked_fill(~causal, -torch.inf), dim=-1)  # (H, N, N) float32, each row's sum ≈ 1
    roles = RoleSettings(exclude_bos=True, exclude_current=True)
    names = ["previous_token_template", "duplicate_token_template", "induction_template", "template_weight"]
    sums = _sums_in_blocks(weights.numpy(), ids, names, rows=5, roles=roles)
    kept = weights.double().numpy().copy()
    kept[:, :, 0] = 0
    kept[:, range(num_tokens), range(num_tokens)] = 0
    assert kept.sum(-1)[:, 2:].max() < 2e-4  # nearly all of each row on key 0 and the diagonal
    for name, template in [("previous_token_template", previous_template), ("induction_template", induction_template)]:
        expected = (kept * template(ids)).sum((1, 2)) / kept.sum((1, 2))  # (H,): TransformerLens's 'mul' measure
        np.testing.assert_allclose(sums[name] / sums["template_weight"], expected, rtol=2e-6, err_msg=name)

"""attnviz's layer a block of queries at a time (MultiHeadAttention.blocks): the rows of the whole map, each
block's rows softmaxed over their whole row, so no (H, Nq, Nk) tensor is made whole.

On short texts the blocks are compared with the layer's whole forward pass (itself checked against torch's own
attention and transformers' eager attentions in test_attention.py and test_family_attention.py); on a text too
long to hold every map at once, sampled rows are compared with a float64 computation written here with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.attention.layer import MultiHeadAttention, rotary_frequencies, rows_per_block


def gqa_rope_layer(model_size=32, num_heads=8, num_kv_heads=2, seed=0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    head_dim = model_size // num_heads
    layer = MultiHeadAttention(
        model_size, num_heads, num_kv_heads=num_kv_heads, rotary_inv_freq=rotary_frequencies(head_dim, 10000.0).float()
    )
    return layer.eval()


@pytest.mark.parametrize("rows", [1, 3, 7, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_blocks_are_the_rows_of_the_whole_pass(rows, causal):
    layer = gqa_rope_layer()
    x = torch.randn(2, 11, 32)
    valid_lens = torch.tensor([11, 6])
    bias = torch.randn(1, 8, 11, 11)
    with torch.inference_mode():
        whole_out, whole = layer(x, valid_lens=valid_lens, causal=causal, position_bias=bias)
        starts, outs, patterns = zip(*layer.blocks(x, valid_lens=valid_lens, causal=causal, position_bias=bias, rows=rows))
    assert list(starts) == list(range(0, 11, rows))
    assert all(pattern.shape[2] <= rows for pattern in patterns)
    torch.testing.assert_close(torch.cat(patterns, dim=2), whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.cat(outs, dim=1), whole_out, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_reused_blocks_are_the_blocks_bit_for_bit_each_read_before_the_next(dtype, causal):
    """blocks(reuse=True) writes every block's weights into one buffer (QueryBlock.softmax: in place in the scores'
    for float32, in a float32 one for bfloat16): each block, read before the next is taken, holds the very floats of
    the blocks made as new tensors, and the blocks share that storage; under autograd there is no buffer."""
    layer = gqa_rope_layer().to(dtype)
    x = torch.randn(2, 11, 32).to(dtype)
    valid_lens = torch.tensor([11, 6])
    arguments = dict(valid_lens=valid_lens, causal=causal, rows=4, narrow=True)
    with torch.inference_mode():
        fresh = [(output, weights) for _, output, weights in layer.blocks(x, **arguments)]
        places = set()
        for n, (_, output, weights) in enumerate(layer.blocks(x, **arguments, reuse=True)):
            assert weights.dtype == torch.float32 and torch.equal(weights, fresh[n][1]) and torch.equal(output, fresh[n][0])
            places.add(weights.data_ptr())
    assert len(fresh) == 3 and len(places) == 1
    with torch.enable_grad():  # each block a tensor of its own: kept together, each still its block
        kept = [weights for _, _, weights in layer.blocks(x.requires_grad_(), **arguments, reuse=True)]
    assert all(torch.equal(weights.detach(), fresh[n][1]) for n, weights in enumerate(kept))


@pytest.mark.parametrize("rows", [1, 4, 64])
def test_narrow_causal_blocks_stop_at_their_last_query_and_hold_the_rows_nonzero_part(rows):
    layer = gqa_rope_layer()
    x = torch.randn(2, 11, 32)
    valid_lens = torch.tensor([11, 6])
    with torch.inference_mode():
        _, whole = layer(x, valid_lens=valid_lens, causal=True)  # (B, H, N, N)
        blocks = list(layer.blocks(x, valid_lens=valid_lens, causal=True, rows=rows, narrow=True))
    for start, _, pattern in blocks:
        stop = start + pattern.shape[2]
        assert pattern.shape[-1] == stop  # the keys up to the block's last query
        torch.testing.assert_close(pattern, whole[:, :, start:stop, :stop], atol=1e-6, rtol=0)
        assert torch.all(whole[:, :, start:stop, stop:] == 0)  # what narrow leaves out is exactly 0


def test_rows_per_block_keeps_a_blocks_scores_and_weights_within_the_budget():
    for budget, batch, heads, keys in [(2**20, 1, 9, 8192), (2**28, 2, 32, 32768), (10, 1, 1, 1000)]:
        rows = rows_per_block(budget, batch, heads, keys)
        assert rows >= 1
        assert rows == 1 or 2 * batch * heads * rows * keys * 4 <= budget
        assert 2 * batch * heads * (rows + 1) * keys * 4 > budget  # the most rows that fit


def reference_rows(layer: MultiHeadAttention, x: np.ndarray, query_rows: list[int]) -> np.ndarray:
    """Rows of the causal weights (H, len(query_rows), N) in float64, from the layer's parameters: project,
    rotate each head's feature pairs (i, i + d/2) by position * theta^(-2i/d), share each key/value head with its
    group of query heads, softmax over keys 0..i."""
    params = {name: p.detach().double().numpy() for name, p in layer.state_dict().items()}
    num_heads, num_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q = (x @ params["w_q.weight"].T + params["w_q.bias"]).reshape(len(x), num_heads, d)
    k = (x @ params["w_k.weight"].T + params["w_k.bias"]).reshape(len(x), num_kv, d)
    inv_freq = 10000.0 ** (-np.arange(0, d, 2) / d)

    def rope(t):
        angle = np.arange(len(x))[:, None] * inv_freq[None, :]  # (N, d/2)
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        first, second = t[..., : d // 2], t[..., d // 2 :]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)

    q, k = rope(q), rope(k)
    out = np.empty((num_heads, len(query_rows), len(x)))
    for h in range(num_heads):
        keys = k[:, h // (num_heads // num_kv)]  # (N, d)
        for r, i in enumerate(query_rows):
            scores = keys[: i + 1] @ q[i, h] / np.sqrt(d)
            weights = np.exp(scores - scores.max())
            out[h, r] = 0.0
            out[h, r, : i + 1] = weights / weights.sum()
    return out


def test_a_long_text_in_blocks_equals_float64_on_sampled_rows():
    """4,096 tokens, 8 heads: the whole map would be 512 MB of scores and weights; 1 MB blocks hold 4 queries."""
    layer = gqa_rope_layer()
    x = torch.randn(1, 4096, 32, generator=torch.Generator().manual_seed(1))
    rows = rows_per_block(2**20, 1, 8, 4096)
    sampled = [0, 1, 2, 3, 4, 1023, 2048, 4095]
    expected = reference_rows(layer, x[0].double().numpy(), sampled)
    found = {}
    with torch.inference_mode():
        for start, _, pattern in layer.blocks(x, causal=True, rows=rows):
            assert pattern.shape == (1, 8, min(rows, 4096 - start), 4096)
            for i in sampled:
                if start <= i < start + pattern.shape[2]:
                    found[i] = pattern[0, :, i - start].double().numpy()
    got = np.stack([found[i] for i in sampled], axis=1)  # (H, rows, N)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)

"""attnviz's layer against torch's own references, with random weights.

References: torch.nn.MultiheadAttention (weights and output) and
torch.nn.functional.scaled_dot_product_attention (output), with and without masks,
for self- and cross-attention.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from attnviz.attention.layer import MultiHeadAttention, allowed_keys, merge_heads, split_heads
from attnviz.errors import AttnvizError

TOLERANCE = 1e-5


def seeded_layer(model_size=48, num_heads=6, **sizes):
    torch.manual_seed(0)
    layer = MultiHeadAttention(model_size, num_heads, **sizes).eval()
    # Larger weights than the default init, so the patterns are far from uniform and a wrong
    # head split or mask would show.
    with torch.no_grad():
        for linear in (layer.w_q, layer.w_k, layer.w_v, layer.w_o):
            linear.weight.normal_(0, 0.25)
            linear.bias.normal_(0, 0.25)
    return layer


def torch_reference(layer: MultiHeadAttention, model_size, num_heads, key_size=None, value_size=None):
    """nn.MultiheadAttention with our weights copied in."""
    reference = torch.nn.MultiheadAttention(
        model_size, num_heads, bias=True, batch_first=True, kdim=key_size, vdim=value_size
    ).eval()
    with torch.no_grad():
        if reference.in_proj_weight is not None:  # one packed projection when the key and value sizes are the model size
            reference.in_proj_weight.copy_(torch.cat([layer.w_q.weight, layer.w_k.weight, layer.w_v.weight]))
        else:
            reference.q_proj_weight.copy_(layer.w_q.weight)
            reference.k_proj_weight.copy_(layer.w_k.weight)
            reference.v_proj_weight.copy_(layer.w_v.weight)
        reference.in_proj_bias.copy_(torch.cat([layer.w_q.bias, layer.w_k.bias, layer.w_v.bias]))
        reference.out_proj.weight.copy_(layer.w_o.weight)
        reference.out_proj.bias.copy_(layer.w_o.bias)
    return reference


CASES = {
    # name: (Nq, Nk, valid key lengths or None, causal)
    "self": (7, 7, None, False),
    "self, padded": (7, 7, [7, 4], False),
    "self, causal": (7, 7, None, True),
    "self, padded and causal": (7, 7, [7, 3], True),
    "cross": (5, 9, None, False),
    "cross, padded": (5, 9, [9, 2], False),
}


@pytest.mark.parametrize("case", CASES)
def test_equals_torch_multihead_attention(case):
    num_queries, num_keys, valid, causal = CASES[case]
    model_size, num_heads = 48, 6
    layer = seeded_layer(model_size, num_heads)
    reference = torch_reference(layer, model_size, num_heads)
    torch.manual_seed(1)
    queries = torch.randn(2, num_queries, model_size)
    keys = queries if num_keys == num_queries else torch.randn(2, num_keys, model_size)
    valid_lens = torch.tensor(valid) if valid else None

    out, weights = layer(queries, keys, keys, valid_lens=valid_lens, causal=causal)

    padding = None if valid is None else torch.arange(num_keys)[None, :] >= valid_lens[:, None]  # True = ignore
    future = torch.ones(num_queries, num_keys, dtype=torch.bool).triu(1) if causal else None  # True = not allowed
    expected_out, expected_weights = reference(
        queries, keys, keys, key_padding_mask=padding, attn_mask=future, average_attn_weights=False
    )
    assert weights.shape == (2, num_heads, num_queries, num_keys)
    torch.testing.assert_close(weights, expected_weights, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(out, expected_out, atol=TOLERANCE, rtol=0)


def test_cross_attention_with_other_key_and_value_sizes_equals_torch():
    layer = seeded_layer(48, 4, key_size=20, value_size=12)
    reference = torch_reference(layer, 48, 4, key_size=20, value_size=12)
    torch.manual_seed(2)
    queries, keys, values = torch.randn(3, 5, 48), torch.randn(3, 9, 20), torch.randn(3, 9, 12)

    out, weights = layer(queries, keys, values)
    expected_out, expected_weights = reference(queries, keys, values, average_attn_weights=False)

    torch.testing.assert_close(weights, expected_weights, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(out, expected_out, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_output_equals_scaled_dot_product_attention(case):
    num_queries, num_keys, valid, causal = CASES[case]
    model_size, num_heads = 48, 6
    head_dim = model_size // num_heads
    layer = seeded_layer(model_size, num_heads)
    torch.manual_seed(3)
    queries = torch.randn(2, num_queries, model_size)
    keys = queries if num_keys == num_queries else torch.randn(2, num_keys, model_size)
    valid_lens = torch.tensor(valid) if valid else None

    out, _ = layer(queries, keys, keys, valid_lens=valid_lens, causal=causal)

    def heads(x, linear):  # (B, N, D) -> (B, H, N, d), written out independently of split_heads
        return F.linear(x, linear.weight, linear.bias).unflatten(-1, (num_heads, head_dim)).transpose(1, 2)

    mask = torch.ones(2, 1, num_queries, num_keys, dtype=torch.bool)
    if valid:
        mask &= (torch.arange(num_keys)[None, :] < valid_lens[:, None])[:, None, None, :]
    if causal:
        mask &= torch.ones(num_queries, num_keys, dtype=torch.bool).tril()
    z = F.scaled_dot_product_attention(heads(queries, layer.w_q), heads(keys, layer.w_k), heads(keys, layer.w_v), attn_mask=mask)
    expected = F.linear(z.transpose(1, 2).flatten(2), layer.w_o.weight, layer.w_o.bias)
    torch.testing.assert_close(out, expected, atol=TOLERANCE, rtol=0)


def test_rows_sum_to_one_and_masked_keys_get_exactly_zero():
    layer = seeded_layer()
    torch.manual_seed(4)
    x = torch.randn(2, 6, 48)
    _, weights = layer(x, valid_lens=torch.tensor([6, 3]), causal=True)

    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 6, 6), atol=TOLERANCE, rtol=0)
    assert torch.all(weights[1, :, :, 3:] == 0)  # padding keys of the shorter sequence
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert torch.all(weights[:, :, future] == 0)  # keys after the query
    assert torch.all(weights[0, :, ~future] > 0)  # everything else is attended to a little


def test_merge_heads_undoes_split_heads_and_head_h_owns_columns_h_d_to_h_plus_1_d():
    x = torch.arange(2 * 3 * 12, dtype=torch.float32).view(2, 3, 12)  # (B, N, D)
    heads = split_heads(x, 4)  # (B, H, N, d)
    assert heads.shape == (2, 4, 3, 3)
    for h in range(4):
        assert torch.equal(heads[:, h], x[:, :, h * 3 : (h + 1) * 3])
    assert torch.equal(merge_heads(heads), x)


def test_head_scores_come_from_that_heads_weight_slices_alone():
    layer = seeded_layer(48, 6)
    torch.manual_seed(5)
    x = torch.randn(1, 5, 48)
    _, weights = layer(x)
    d = 8
    for h in range(6):
        rows = slice(h * d, (h + 1) * d)  # nn.Linear weight is (out, in): head h's output features are rows
        q = x[0] @ layer.w_q.weight[rows].T + layer.w_q.bias[rows]
        k = x[0] @ layer.w_k.weight[rows].T + layer.w_k.bias[rows]
        expected = torch.softmax(q @ k.T / math.sqrt(d), dim=-1)
        torch.testing.assert_close(weights[0, h], expected, atol=TOLERANCE, rtol=0)


def test_heads_that_do_not_divide_the_model_size_are_refused_with_the_choices():
    with pytest.raises(AttnvizError, match=r"5 heads do not divide the model size 48; choose one of: 1, 2, 3, 4, 6, 8, 12, 16, 24, 48"):
        MultiHeadAttention(48, 5)


def test_allowed_keys_is_none_without_masks_and_broadcasts_over_heads():
    assert allowed_keys(3, 4) is None
    assert allowed_keys(3, 4, valid_lens=torch.tensor([4, 2])).shape == (2, 1, 1, 4)
    assert allowed_keys(3, 3, causal=True).shape == (1, 1, 3, 3)


def forward_and_its_callers():
    """The AST of MultiHeadAttention's forward, blocks and step, read from attention/layer.py."""
    import ast
    import inspect

    import attnviz.attention.layer as layer_module

    tree = ast.parse(inspect.getsource(layer_module))
    layer_class = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "MultiHeadAttention")
    return {node.name: node for node in layer_class.body if isinstance(node, ast.FunctionDef)}


def test_forward_is_on_one_screen_and_holds_every_step_of_the_seeds_in_their_order():
    import ast

    methods = forward_and_its_callers()
    forward = methods["forward"]
    assert forward.end_lineno - forward.lineno + 1 <= 40  # signature and docstring included
    code = ast.unparse(forward)
    steps = ["self.project(", "torch.matmul(q, k.transpose(-2, -1)", "masked_fill_(", ".softmax(dim=-1", "@ v", "self.w_o(merge_heads("]
    positions = [code.find(step) for step in steps]
    assert -1 not in positions, dict(zip(steps, positions))
    assert positions == sorted(positions)  # project, scores, mask, softmax, weighted sum, merge and W_o
    # The block path and the cache's path run forward itself: no second copy of the softmax.
    for name in ("blocks", "step"):
        body = ast.unparse(methods[name])
        assert "self.forward(" in body and ".softmax(" not in body, name


def test_the_layers_step_with_a_cache_is_the_causal_forward_pass_row_by_row():
    layer = seeded_layer(num_kv_heads=None)
    x = torch.randn(1, 7, 48)
    with torch.inference_mode():
        whole_out, whole = layer(x, causal=True)
        _, _, cache = layer.step(x[:, :4])
        out, weights, cache = layer.step(x[:, 4:], cache)  # (1, 3, D), (1, H, 3, 7)
    torch.testing.assert_close(weights, whole[:, :, 4:], atol=1e-6, rtol=0)
    torch.testing.assert_close(out, whole_out[:, 4:], atol=1e-6, rtol=0)

"""The norm of each weighted, transformed value vector (Kobayashi et al. 2020, "Attention is Not Only a Weight").

A layer's output for query token i is a sum of one vector per head h and key token j:

    out_i = Σ_h Σ_j α^h_ij f^h(x_j) + b_o,    f^h(x) = (x W_v^h + b_v^h) W_o^h

with W_v^h, b_v^h head h's columns of the value projection (with grouped-query attention, those
of the key/value head that h shares) and W_o^h the d rows of the output projection that take head
h's features. b_o belongs to no head and no key, so it is left out, as in the paper. A weight α
says how much a key is chosen; the norm ‖α^h_ij f^h(x_j)‖ says how much it adds to the output: a
large weight on a vector of small norm (Kobayashi et al. find this for [CLS], [SEP] and
punctuation) adds little.

Two maps per layer: per head ‖α^h_ij f^h(x_j)‖ (H, Nq, Nk), and the heads summed, ‖Σ_h α^h_ij f^h(x_j)‖
(Nq, Nk): what key j adds to token i's output through all heads at once (the paper's
layer-level norm). Both are raw norms, in the units of the hidden state; rows do not sum to 1 and
are not normalised here. To show them as the paper does, raw: a layer's head maps on one linear
scale from 0 to the layer's largest norm, so that heads compare (a weights-like 0..1 scale would not fit).
"""

from __future__ import annotations

import torch

from attnviz.attention.layer import MultiHeadAttention, repeat_kv, split_heads


def head_values(attention: MultiHeadAttention, values: torch.Tensor) -> torch.Tensor:
    """v^h_j = x_j W_v^h + b_v^h for every query head h (the key/value head it shares) and key j: (B, H, Nk, d), float64."""
    v = split_heads(attention.w_v(values).double(), attention.num_kv_heads)  # (B, H_kv, Nk, d)
    return repeat_kv(v, attention.group_size)  # (B, H, Nk, d)


def output_rows(attention: MultiHeadAttention) -> torch.Tensor:
    """W_o^h, the d rows of W_o that take head h's features, for every head: (H, d, D), float64."""
    model_size = attention.w_o.weight.shape[0]  # nn.Linear stores W_o transposed: (D, H*d)
    w_o = attention.w_o.weight.double().view(model_size, attention.num_heads, attention.head_dim)  # (D, H, d)
    return w_o.permute(1, 2, 0)  # (H, d, D)


def transformed_values(attention: MultiHeadAttention, values: torch.Tensor) -> torch.Tensor:
    """f^h(x_j) = v^h_j W_o^h for every head h and key token j: (B, H, Nk, D), float64, from the values' input (B, Nk, D_v).

    Float64 from the value projection on, as value zeroing's output is (value_zeroing.py): the
    measures then subtract vectors that agree to the last bit where they should cancel.
    """
    return head_values(attention, values) @ output_rows(attention)  # (B, H, Nk, d) @ (H, d, D) -> (B, H, Nk, D)


def head_norms(pattern: torch.Tensor, transformed: torch.Tensor) -> torch.Tensor:
    """‖α^h_ij f^h(x_j)‖ = α^h_ij ‖f^h(x_j)‖ (weights are never negative): (B, H, Nq, Nk).

    pattern (B, H, Nq, Nk) is the layer's attention weights; transformed (B, H, Nk, D) is transformed_values.
    """
    return pattern * transformed.norm(dim=-1)[:, :, None, :]  # (B, H, Nq, Nk) * (B, H, 1, Nk)


def head_grams(transformed: torch.Tensor) -> torch.Tensor:
    """G_j[h, g] = <f^h(x_j), f^g(x_j)>, the dot products of the heads' vectors for each key j: (B, Nk, H, H) float64.

    transformed (B, H, Nk, D) is transformed_values. One batched matrix product over the keys
    (each key's (H, D) vectors times their transpose).
    """
    by_key = transformed.double().transpose(1, 2)  # (B, Nk, H, D)
    return by_key @ by_key.transpose(-2, -1)  # (B, Nk, H, D) @ (B, Nk, D, H) -> (B, Nk, H, H)


def summed_squared_norms(pattern: torch.Tensor, transformed: torch.Tensor) -> torch.Tensor:
    """‖Σ_h α^h_ij f^h(x_j)‖², float64: (B, Nq, Nk).

    The heads' sum is never built as a (B, Nq, Nk, D) tensor: with the heads' dot products
    G_j (head_grams), ‖Σ_h α^h_ij f^h(x_j)‖² = Σ_h Σ_g α^h_ij G_j[h, g] α^g_ij, a quadratic form in
    the heads' weights, for all queries of key j in one (Nq, H) @ (H, H) product. Float64, because
    the heads' vectors may nearly cancel: the squared norm is then a small difference of large
    terms, and float32's 1e-7 of them would be a large error in its square root.
    """
    alpha = pattern.double().permute(0, 3, 2, 1).contiguous()  # (B, Nk, Nq, H): for each key, every query's head weights
    grams = head_grams(transformed)  # (B, Nk, H, H)
    squared = ((alpha @ grams) * alpha).sum(dim=-1)  # (B, Nk, Nq, H) @ (B, Nk, H, H) -> (B, Nk, Nq, H), row dots: (B, Nk, Nq)
    return squared.transpose(1, 2).clamp_min(0)  # (B, Nq, Nk); rounding may leave -1e-18


def summed_norms(pattern: torch.Tensor, transformed: torch.Tensor) -> torch.Tensor:
    """‖Σ_h α^h_ij f^h(x_j)‖: what key token j adds to query token i's output through every head, (B, Nq, Nk) float64."""
    return summed_squared_norms(pattern, transformed).sqrt()

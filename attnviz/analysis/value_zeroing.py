"""Value zeroing (Mohebbi et al. 2023): how much each token's output changes when one key's value vector is zeroed.

For key token j: set its value vector v_j = x_j W_v + b_v to zero in every head, run the layer again
(the weights α stay as they were: queries and keys are untouched), and take the cosine distance
between query token i's output and its altered output. Map (Nq, Nk) per layer.

What is measured: the output of attnviz's attention layer, after W_o and b_o, for each query
token, before the residual connection. Mohebbi et al. measure the output of the whole Transformer
block instead (after the residual connection, the layer norms and the feed-forward block), so
these are not their numbers: without the residual, token i's own input does not damp the change,
and no layer norm or feed-forward block reshapes it. The attention layer's output is what every
model family attnviz runs has and what its layer computes; the whole block, for every (i, j) pair,
would cost N feed-forward passes per layer where this costs about one attention layer.

Zeroing v_j takes α^h_ij f^h(x_j) (norms.py) out of every head's sum, so the altered output is

    out_i - g_ij,    g_ij = Σ_h α^h_ij f^h(x_j)

exactly, for every j at once: no rerun of the layer per key. Its cosine distance to out_i needs
only ‖out_i‖², <out_i, g_ij> and ‖g_ij‖², none of them a (Nq, Nk, D) tensor.

Two maps: the raw cosine distances (0 where a key changes nothing, at most 2), and the same rows
divided by their sums, as Mohebbi et al. show them (rows sum to 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnviz.analysis.norms import head_values, summed_squared_norms, transformed_values
from attnviz.attention.layer import MultiHeadAttention, merge_heads, split_heads

# An altered output under this fraction of the output's norm has vanished (key j carried all of it: the
# first token of a decoder without b_o); its direction is rounding, and its distance is taken as 1, as
# torch's cosine_similarity gives for a zero vector. Float64 resolves altered outputs well below it.
VANISHED = 1e-6


def float64_output(attention: MultiHeadAttention, alpha: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The layer's output (B, Nq, D) recomputed in float64 as the layer computes it: the heads' outputs α^h v^h
    side by side, through W_o and b_o; alpha (B, H, Nq, Nk) and v (B, H, Nk, d) (norms.head_values) in float64."""
    b_o = attention.w_o.bias
    return F.linear(merge_heads(alpha @ v), attention.w_o.weight.double(), None if b_o is None else b_o.double())


def value_zeroing_distances(
    attention: MultiHeadAttention,
    values: torch.Tensor,
    pattern: torch.Tensor,
    summed_squared: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cosine distance between out_i and out_i with key j's value vector zeroed: (B, Nq, Nk) float64.

    attention is the layer, values (B, Nk, D_v) its values' input and pattern (B, H, Nq, Nk) its
    weights over them; summed_squared (B, Nq, Nk) is ‖g_ij‖² (norms.summed_squared_norms), computed
    here when not given. The output is recomputed in float64 from the same value vectors as g_ij,
    so that out_i - g_ij keeps what the other keys add even where key j carries almost all of it.
    """
    v = head_values(attention, values)  # (B, H, Nk, d)
    alpha = pattern.double()  # (B, H, Nq, Nk)
    if summed_squared is None:
        summed_squared = summed_squared_norms(pattern, transformed_values(attention, values))
    output = float64_output(attention, alpha, v)  # (B, Nq, D)
    w_o = attention.w_o.weight.double()  # W_o as nn.Linear stores it: (D, H*d)
    # <out_i, f^h(x_j)> = <out_i W_o^hT, v^h_j>, then <out_i, g_ij> = Σ_h α^h_ij <out_i, f^h(x_j)>
    out_per_head = split_heads(output @ w_o, attention.num_heads)  # (B, Nq, D) @ (D, H*d) -> (B, H, Nq, d)
    out_dot_change = (alpha * (out_per_head @ v.transpose(-2, -1))).sum(dim=1)  # (B, Nq, Nk)
    out_squared = output.pow(2).sum(dim=-1)[..., None]  # (B, Nq, 1): ‖out_i‖²
    altered_squared = (out_squared - 2 * out_dot_change + summed_squared).clamp_min(0)  # ‖out_i - g_ij‖²
    vanished = altered_squared <= VANISHED**2 * out_squared
    norms = (out_squared * altered_squared).sqrt()  # ‖out_i‖ ‖out_i - g_ij‖
    cosine = (out_squared - out_dot_change) / norms.clamp_min(torch.finfo(torch.float64).tiny)
    cosine = cosine.masked_fill(vanished, 0.0)
    return (1 - cosine).clamp(0, 2)  # (B, Nq, Nk); rounding may step a hair outside [0, 2]

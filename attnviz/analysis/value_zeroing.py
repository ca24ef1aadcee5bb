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

from attnviz.analysis.norms import summed_squared_norms


def value_zeroing_distances(
    pattern: torch.Tensor,
    transformed: torch.Tensor,
    output: torch.Tensor,
    summed_squared: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cosine distance between out_i and out_i with key j's value vector zeroed: (B, Nq, Nk) float64.

    pattern (B, H, Nq, Nk) the layer's weights, transformed (B, H, Nk, D) norms.transformed_values of
    its values' input, output (B, Nq, D) the layer's output; summed_squared (B, Nq, Nk) is ‖g_ij‖²
    (norms.summed_squared_norms), computed here when not given.
    """
    if summed_squared is None:
        summed_squared = summed_squared_norms(pattern, transformed)
    # <out_i, f^h(x_j)>, then <out_i, g_ij> = Σ_h α^h_ij <out_i, f^h(x_j)>. In the layer's precision: an
    # error in <out_i, g_ij> moves the cosine only at second order while g_ij is small beside out_i.
    out_dot_values = output[:, None] @ transformed.transpose(-2, -1)  # (B, 1, Nq, D) @ (B, H, D, Nk) -> (B, H, Nq, Nk)
    out_dot_change = (pattern * out_dot_values).double().sum(dim=1)  # (B, Nq, Nk)
    out_squared = output.double().pow(2).sum(dim=-1)[..., None]  # (B, Nq, 1): ‖out_i‖²
    altered_squared = (out_squared - 2 * out_dot_change + summed_squared).clamp_min(0)  # ‖out_i - g_ij‖²
    norms = (out_squared * altered_squared).sqrt()  # ‖out_i‖ ‖out_i - g_ij‖
    cosine = (out_squared - out_dot_change) / norms.clamp_min(torch.finfo(torch.float64).tiny)
    return (1 - cosine).clamp(0, 2)  # (B, Nq, Nk); rounding may step a hair outside [0, 2]

"""Attention rollout (Abnar & Zuidema 2020): how much each token of the last layer draws on each input token.

Plain NumPy: no torch, so the renderers can import it. residual_attention is the per-layer matrix
that rollout multiplies and attention flow (flow.py) takes as its graph's capacities.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from attnviz.models.words import merge_attention


def attention_rollout(layer_attention: Iterable[np.ndarray]) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) of self-attention through the layers, in order (any iterable: each
    layer's map may be let go once rolled in).

    Per layer: A' = residual_attention(A); then R = A'_{L-1} ... A'_1 A'_0. Row i of R (N, N)
    says how much the last layer's token i draws on each input token; its rows sum to 1.
    """
    rollout = None
    for attention in layer_attention:
        rollout = rolled_in(rollout, attention)
    if rollout is None:
        raise ValueError("attention rollout needs at least one layer")
    return rollout


def rolled_in(rollout: np.ndarray | None, attention: np.ndarray) -> np.ndarray:
    """The rollout of the layers before (None: none) and the next layer's map (H, N, N): A' R, the later layer on the left."""
    mixed = residual_attention(attention)  # (N, N)
    return mixed if rollout is None else mixed @ rollout


def runs_rollout(layer_runs: Iterable) -> np.ndarray:
    """The rollout of one text's runs, one per layer in order (AttentionRun; any iterable, as attention_rollout's). Over
    words (--words), the rollout of the token maps merged by Clark et al.'s rule: a share of a word is the sum of its
    pieces' shares, so merging after the product is exact (merging each layer first would not be)."""
    rollout = words = None
    for run in layer_runs:
        words = run.words  # every layer's the same
        rollout = rolled_in(rollout, run.attention if words is None else words.token_attention)
    if rollout is None:
        raise ValueError("attention rollout needs at least one layer")
    return rollout if words is None else merge_attention(rollout, words.query_word, words.key_word)


def residual_attention(attention: np.ndarray) -> np.ndarray:
    """One layer's attention with its residual connection: the heads of (H, N, N) averaged, the identity
    added, the rows renormalised, (N, N) in float64. With rows of weights that sum to 1 this is (mean_h A_h + I) / 2."""
    weights = np.asarray(attention, dtype=np.float64)  # (H, N, N)
    return normalise_rows(weights.mean(axis=0) + np.eye(weights.shape[-1]))  # (N, N)


def normalise_rows(maps: np.ndarray) -> np.ndarray:
    """maps (..., Nq, Nk) with each row divided by its sum, so that it sums to 1; a row of zeros stays zeros."""
    sums = maps.sum(axis=-1, keepdims=True)
    return np.divide(maps, sums, out=np.zeros(np.shape(maps), dtype=np.result_type(maps, np.float64)), where=sums != 0)

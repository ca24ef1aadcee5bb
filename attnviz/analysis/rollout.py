"""Attention rollout (Abnar & Zuidema 2020): how much each token of the last layer draws on each input token.

Plain NumPy: no torch, so the renderers can import it.
"""

from __future__ import annotations

import numpy as np


def attention_rollout(layer_attention: list[np.ndarray]) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) of self-attention through the layers, in order.

    Per layer: average the heads of (H, N, N), add the identity (the residual connection) and
    renormalise the rows; then R = A'_{L-1} ... A'_1 A'_0. Row i of R (N, N) says how much the
    last layer's token i draws on each input token; its rows sum to 1.
    """
    rollout = None
    for attention in layer_attention:
        weights = np.asarray(attention, dtype=np.float64)  # (H, N, N)
        mixed = weights.mean(axis=0) + np.eye(weights.shape[-1])  # (N, N)
        mixed /= mixed.sum(axis=-1, keepdims=True)
        rollout = mixed if rollout is None else mixed @ rollout  # the later layer on the left
    if rollout is None:
        raise ValueError("attention rollout needs at least one layer")
    return rollout

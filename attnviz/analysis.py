"""Per-head statistics of attention weights (rows are queries, columns keys, rows sum to 1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class HeadSummary:
    head: int
    entropy: float  # mean row entropy in nats
    relative_entropy: float  # entropy / log(Nk): 1 for uniform rows, 0 for one-hot rows
    mean_max: float  # mean over queries of the largest weight in the row
    top_keys: list[int]  # for each query, the key it attends to most


def row_entropy(attention: np.ndarray) -> np.ndarray:
    """Entropy in nats of every row of (..., Nq, Nk), with 0 log 0 = 0."""
    logs = np.log(attention, where=attention > 0, out=np.zeros_like(attention))
    return -(attention * logs).sum(axis=-1)


def summarize_heads(attention: np.ndarray) -> list[HeadSummary]:
    """One summary per head of attention (H, Nq, Nk)."""
    num_keys = attention.shape[-1]
    uniform = np.log(num_keys) if num_keys > 1 else 1.0
    entropy = row_entropy(attention).mean(axis=-1)  # (H,)
    mean_max = attention.max(axis=-1).mean(axis=-1)  # (H,)
    top_keys = attention.argmax(axis=-1)  # (H, Nq)
    return [
        HeadSummary(
            head=h,
            entropy=float(entropy[h]),
            relative_entropy=float(entropy[h] / uniform),
            mean_max=float(mean_max[h]),
            top_keys=top_keys[h].tolist(),
        )
        for h in range(attention.shape[0])
    ]

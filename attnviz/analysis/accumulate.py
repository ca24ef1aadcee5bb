"""Sums that merge: the plain state of a StatisticsAccumulator, so that shards of a corpus add up.

`attnviz stats --file` checkpoints its accumulator after each chunk of texts and resumes from the
state; `--engine ray` sums each shard of texts on a Ray actor and merges the states on the driver.
Averages are sums over texts divided by counts, so sums that add and counts that add give the
single-process average (up to the order of float64 additions: about 1e-16 relative).
Plain NumPy: the state is what a checkpoint stores and what Ray pickles, no torch tensor in it.
"""

from __future__ import annotations

import numpy as np


class MergeableSums:
    """What StatisticsAccumulator keeps, as a plain state and merged with another's.

    Subclasses hold causal, js (whether the JS distances are measured), value_sums (L entries of
    (H, S)), js_sums (L of (H, H)) and counts (L ints); an entry is 0.0 while its layer has no text
    yet (a js_sums entry stays 0.0 without js), else a numpy array or a torch tensor.
    """

    causal: bool
    js: bool
    value_sums: list
    js_sums: list
    counts: list[int]

    def state(self) -> dict:
        """{"causal": bool, "js": bool, "counts": (L,) int64, "value_sums": (L, H, S), "js_sums": (L, H, H)} float64.

        An accumulator with no text yet has value_sums and js_sums of shape (L, 0, 0); without js,
        js_sums are zeros.
        """
        counts = np.asarray(self.counts, dtype=np.int64)  # (L,)
        flags = {"causal": bool(self.causal), "js": bool(self.js)}
        if not counts.any():
            empty = np.zeros((len(counts), 0, 0))
            return {**flags, "counts": counts, "value_sums": empty, "js_sums": empty.copy()}
        if not counts.all():
            raise ValueError(f"a state needs every layer measured over the same texts, got counts {self.counts}")
        value_sums = np.stack([as_float64(sums) for sums in self.value_sums])  # (L, H, S)
        num_heads = value_sums.shape[1]
        js_sums = [as_float64(sums) if self.js else np.zeros((num_heads, num_heads)) for sums in self.js_sums]
        return {**flags, "counts": counts, "value_sums": value_sums, "js_sums": np.stack(js_sums)}  # js_sums (L, H, H)

    @classmethod
    def from_state(cls, state: dict):
        """The accumulator whose state() is `state` (a dict as state() returns, or a loaded .npz)."""
        counts = [int(count) for count in np.asarray(state["counts"])]
        accumulator = cls(len(counts), bool(np.asarray(state["causal"])), bool(np.asarray(state["js"])))
        value_sums, js_sums = np.asarray(state["value_sums"], np.float64), np.asarray(state["js_sums"], np.float64)
        if any(counts):
            accumulator.value_sums, accumulator.js_sums = list(value_sums), list(js_sums)
        accumulator.counts = counts
        return accumulator

    def merge(self, other: "MergeableSums") -> "MergeableSums":
        """Add other's sums and counts into this accumulator (returned); both over the same layers, mask and js."""
        ours, theirs = (len(self.counts), bool(self.causal), bool(self.js)), (len(other.counts), bool(other.causal), bool(other.js))
        if ours != theirs:
            raise ValueError(
                f"cannot merge statistics of {theirs[0]} layers (causal={theirs[1]}, js={theirs[2]}) into "
                f"{ours[0]} layers (causal={ours[1]}, js={ours[2]})"
            )
        for layer, count in enumerate(other.counts):
            if count:
                self.value_sums[layer] = as_float64(self.value_sums[layer]) + as_float64(other.value_sums[layer])
                if self.js:
                    self.js_sums[layer] = as_float64(self.js_sums[layer]) + as_float64(other.js_sums[layer])
                self.counts[layer] += count
        return self


def as_float64(values) -> np.ndarray:
    """A float64 numpy array of a number, a numpy array or a torch tensor on any device."""
    return np.asarray(values.cpu() if hasattr(values, "cpu") else values, dtype=np.float64)

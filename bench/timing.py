"""What the one-process benchmarks (effect.py, diff.py, generate.py) time and measure with: the best of a few runs
after a warm-up, and the process's peak resident set so far."""

from __future__ import annotations

import resource
import time


def best_of(function, repeat: int) -> float:
    """The fastest of `repeat` calls of function, after one call thrown away (imports, caches, the allocator)."""
    function()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def peak_mb() -> float:
    """The process's peak resident set so far (ru_maxrss), in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

"""The budget of `attnviz compose` (issue 46): SmolLM2's 270 heads' compositions in at most 10 s on the 2-core CPU.

    python bench/compose.py [--repeat 2]

Loads SmolLM2-135M once (not timed), then times analysis.compositions.compositions over it --repeat times (its
factors, the Gaussian baseline and every pair's Q, K and V scores). Prints one JSON line: each run's wall time, the
best, the budget and whether it is met, the process's peak resident memory and the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

BUDGET_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    import attnviz
    from attnviz.analysis.compositions import compositions

    load_average = os.getloadavg()[0]
    loaded = attnviz.load("smollm2", device="cpu").loaded
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = compositions(loaded)
        times.append(time.perf_counter() - start)
    heads = loaded.num_layers * loaded.num_heads
    print(json.dumps({
        "case": "compositions of SmolLM2's heads", "heads": heads, "seconds": [round(t, 2) for t in times],
        "best_s": round(min(times), 2), "budget_s": BUDGET_S, "met": min(times) <= BUDGET_S,
        "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "baseline": {kind: round(value, 4) for kind, value in result.baseline.items()}, "load_average": load_average,
    }))  # fmt: skip


if __name__ == "__main__":
    main()

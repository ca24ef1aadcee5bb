"""Issue 37's retrieval row: every head's retrieval score of SmolLM2 with the defaults (analysis/retrieval.py:
lengths 1,024, 2,048 and 4,096 tokens x depths 0.1, 0.5 and 0.9, 32 answer tokens at most), budget 10 minutes.

    python bench/retrieval.py [--lengths 1024 2048 4096] [--depths 0.1 0.5 0.9]

One run in one process, the model loaded first (not timed): the wall and CPU time (user + system) of
output.retrieval_heads.retrieval_heads, each test's seconds, the tests kept, the heads above 0.1, the peak resident
set (ru_maxrss) and the load average before and after (the machine is shared). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import peak_mb  # noqa: E402


def main() -> None:
    from attnviz.analysis.retrieval import DEPTHS, LENGTHS, RETRIEVAL_THRESHOLD

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--depths", type=float, nargs="+", default=list(DEPTHS))
    args = parser.parse_args()

    import attnviz
    from attnviz.output.retrieval_heads import retrieval_heads
    from attnviz.spec import run_spec

    handle = attnviz.load("smollm2", device="cpu")
    spec = run_spec(handle.loaded, "smollm2")
    load_before, times = os.getloadavg()[0], []
    cpu_before, wall_before = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    times.append(wall_before)
    result = retrieval_heads(handle.loaded, spec, lengths=args.lengths, depths=args.depths, advance=lambda done: times.append(time.perf_counter()))
    wall, cpu = time.perf_counter() - wall_before, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "lengths": args.lengths,
        "depths": args.depths,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu.ru_utime + cpu.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime, 1),
        "test_s": [round(later - earlier, 1) for earlier, later in zip(times, times[1:])],
        "recall": [round(test.recall, 3) for test in result.tests],
        "kept": result.kept,
        "tests": len(result.tests),
        "heads_above_threshold": int((result.scores > RETRIEVAL_THRESHOLD).sum()),
        "top_heads": [[int(layer), int(head), round(float(result.scores[layer, head]), 3)]
                      for layer, head in zip(*divmod(result.scores.argsort(axis=None)[::-1][:5], result.scores.shape[1]))],
        "peak_mb": peak_mb(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }))


if __name__ == "__main__":
    main()

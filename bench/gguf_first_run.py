"""SmolLM2's first run before (the GGUF file converted whole into a float32 folder) and after (read as it is).

    python bench/gguf_first_run.py --old-tree /tmp/bench-old            # 3 rounds
    python bench/gguf_first_run.py --old-tree /tmp/bench-old --repeat 1

`attnviz heads TEXT --model smollm2 --device cpu` as a new process, as a user runs it, in an empty temporary
ATTNVIZ_CACHE (the first run), then again in the same cache (a later run), with this checkout's attnviz and with an
older one's (--old-tree: a checkout from before issue 47's GGUF reader, whose first run converts); every case once a
round (run.py's run_rounds). Beside the time and peak memory (max RSS), what the cache holds after the first run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run.py, beside this file

from run import ATTNVIZ, BENCH, Timing, print_table, run_rounds  # noqa: E402

TEXT = "The cat sat on the mat because it was tired."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-tree", type=Path, required=True, help="a checkout of attnviz from before the GGUF reader")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    trees = {"read as it is": BENCH.parent, "converted": args.old_tree}
    command = [*ATTNVIZ, "heads", TEXT, "--model", "smollm2", "--device", "cpu"]
    rounds, sizes = [], {}
    with tempfile.TemporaryDirectory(prefix="attnviz-bench-") as scratch:
        for round_number in range(args.repeat):
            commands = {}
            for tree_name, tree in trees.items():
                cache = Path(scratch) / f"cache-{round_number}-{tree_name}"  # empty: the first run's
                env = {**os.environ, "PYTHONPATH": str(tree), "ATTNVIZ_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
                for run_name in ("first", "later"):  # in this order: run_rounds runs them as listed
                    commands[(run_name, tree_name)] = ([*command, "--out", str(Path(scratch) / "out")], env)
            rounds.append(run_rounds(commands, 1))
            for tree_name in trees:
                cache = Path(scratch) / f"cache-{round_number}-{tree_name}"
                sizes[tree_name] = sum(path.stat().st_size for path in cache.rglob("*") if path.is_file())

    def median(case) -> Timing:
        timings = [each[case] for each in rounds]
        return Timing(statistics.median(timing.seconds for timing in timings), max(timing.peak_mb for timing in timings),
                      cpu_seconds=statistics.median(timing.cpu_seconds for timing in timings))  # fmt: skip

    rows = [(f"heads, SmolLM2, {run_name} run, GGUF read as it is", median((run_name, "read as it is")),
             f"{run_name} run, converted", median((run_name, "converted")), "-", None) for run_name in ("first", "later")]  # fmt: skip
    print_table(rows, argparse.Namespace(repeat=args.repeat, gpu=False))
    print()
    for name, timing, baseline_name, baseline, _, _ in rows:  # the table shows the case's peak alone
        print(f"peak memory: {name} {timing.peak_mb:.0f} MB; {baseline_name} {baseline.peak_mb:.0f} MB")
    for tree_name, size in sizes.items():
        print(f"attnviz's cache after the runs, {tree_name}: {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

"""`attnviz heads` (12 tokens, or --text) and `attnviz --help`, this checkout against an older one, interleaved round by round.

    python bench/startup_before_after.py /path/to/old/checkout [--rounds 7] [--text 我想吃酸菜鱼]

Each round runs, in new processes through the console script (offline, the bundled model on the CPU):
`python -c "import torch"` (the floor of any command that runs a model), `heads` with the old checkout and with
this one (PYTHONPATH picks the tree), and `--help` with each. Prints the median wall time of each case, its
range, its median CPU time (user + system of the process and its children), its wall time over the torch
import's (issue 35's budgets: heads at most 2.2 x, --help at most 0.5 s) and the median of each round's ratio
(issue 45's budget: `heads 我想吃酸菜鱼` at most 2.0 x). Both trees' bytecode is compiled first, as an installed
package's is: with PYTHONDONTWRITEBYTECODE set, every run would compile attnviz's modules again (0.1 s).
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = "the quick brown fox jumps over the lazy dog again"  # 12 tokens with [CLS] and [SEP]
HERE = Path(__file__).resolve().parents[1]


def timed(command: list[str], tree: Path, folder: str) -> tuple[float, float]:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120", "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=environment, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path, help="a checkout of the code before the change")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--text", default=TEXT, help="the text heads reads (issue 45's budget is on 我想吃酸菜鱼)")
    arguments = parser.parse_args()
    for tree in (arguments.before, HERE):
        compileall.compile_dir(tree / "attnviz", quiet=1)
    heads = ["attnviz", "heads", arguments.text, "--model", "bundled", "--out"]
    cases = {
        "python -c 'import torch'": ([sys.executable, "-c", "import torch"], HERE),
        "heads, before": (heads, arguments.before),
        "heads, after": (heads, HERE),
        "--help, before": (["attnviz", "--help"], arguments.before),
        "--help, after": (["attnviz", "--help"], HERE),
    }
    times: dict[str, list[tuple[float, float]]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as folder:
        for round_number in range(arguments.rounds):
            for case, (command, tree) in cases.items():
                out = [f"{folder}/{round_number}-{len(times[case])}-{case[:5]}"] if command is heads else []
                times[case].append(timed([*command, *out], tree, folder))
    torch_walls = [wall for wall, _ in times["python -c 'import torch'"]]
    torch_wall = statistics.median(torch_walls)
    for case, measured in times.items():
        walls = [wall for wall, _ in measured]
        cpu = statistics.median(cpu for _, cpu in measured)
        paired = statistics.median(wall / torch for wall, torch in zip(walls, torch_walls))  # each round's own ratio
        print(
            f"{case:26s} wall {statistics.median(walls):.3f} s ({min(walls):.3f} to {max(walls):.3f}), "
            f"CPU {cpu:.3f} s, {statistics.median(walls) / torch_wall:.2f} x the torch import "
            f"(paired: median {paired:.2f} x)"
        )


if __name__ == "__main__":
    main()

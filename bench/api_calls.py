"""The Python API's two costs (issue 11, part 5): `import attnviz`, and a warm attnviz.heads call.

    python bench/api_calls.py [--repeat 7] [--device cpu]

1. `python -c "import attnviz"` against `python -c pass`, each a new process, median of --repeat
   runs: the import must stay cheap (torch, matplotlib and transformers load on first use).
2. In one new process: the first attnviz.heads call (it imports torch, loads the bundled model
   and runs layer 0) against the second (the model is loaded: a cached handle, only the run),
   and the median of --repeat further calls. Target: the second under a tenth of the first.
   Twice in the same run: quiet, and loaded (another process spinning on a core the whole time,
   as a busy machine has): torch's parallel regions wait for every thread, so a run on two
   threads waits for the busy core; a small run takes one (attnviz/pipeline.py, threads_for).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]

WARM_CALLS = """
import json, sys, time
start = time.perf_counter()
import attnviz
imported = time.perf_counter() - start
heavy = [name for name in ("torch", "matplotlib", "transformers") if name in sys.modules]
text = "The animal didn't cross the street because it was too tired."
times = []
for _ in range({calls}):
    start = time.perf_counter()
    attnviz.heads(text, model="bundled", device="{device}")
    times.append(time.perf_counter() - start)
print(json.dumps({{"import": imported, "heavy_after_import": heavy, "calls": times}}))
"""


def process_seconds(code: str, repeat: int) -> float:
    """Median wall time of `python -c code` in new processes."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPOSITORY)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def warm_calls(calls: int, device: str, loaded: bool) -> dict:
    """The in-process record of WARM_CALLS; loaded: with a process spinning on a core until it ends."""
    code = WARM_CALLS.format(calls=calls, device=device)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    try:
        shown = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPOSITORY)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return json.loads(shown.stdout.strip().splitlines()[-1])


def print_calls(record: dict, row: str) -> None:
    first, second, *rest = record["calls"]
    further = statistics.median(rest)
    print(f"{row}: first attnviz.heads call  {first:.3f} s (imports torch, loads the model, runs)")
    print(f"{row}: second call               {second:.3f} s: {second / first:.3f} of the first (target < 0.1)")
    print(
        f"{row}: further calls             median {further:.3f} s ({further / first:.3f} of the first), "
        f"fastest {min(rest):.3f} s, slowest {max(rest):.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    options = parser.parse_args()

    bare = process_seconds("pass", options.repeat)
    imported = process_seconds("import attnviz", options.repeat)
    print(f"python -c pass            {bare:.3f} s (median of {options.repeat})")
    print(f"python -c 'import attnviz' {imported:.3f} s: {imported - bare:+.3f} s, ratio {imported / bare:.2f}")

    quiet = warm_calls(options.repeat + 2, options.device, loaded=False)
    print(f"import attnviz, in process {quiet['import'] * 1000:.1f} ms (less noisy than whole processes)")
    print(f"modules loaded by the import: {quiet['heavy_after_import'] or 'none of torch, matplotlib, transformers'}")
    print_calls(quiet, "quiet ")
    print_calls(warm_calls(options.repeat + 2, options.device, loaded=True), "loaded")


if __name__ == "__main__":
    main()

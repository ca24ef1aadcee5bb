"""`attnviz stats`' own per-batch work, timed like bare_forward.py times the bare pass.

Loads the bundled model, then times analysis.measure.measure_heads (what `attnviz stats --file` runs:
the forward pass with attnviz's layers and every statistic; with --js also the JS distances) over the
file's texts. Prints the seconds spent after loading, so start-up costs on neither side hide the loop's.

    python bench/stats_loop.py TEXTS_FILE DEVICE [--js]
"""

import sys
import time

from attnviz.analysis.stats_pass import measure_heads
from attnviz.models.loading import load_model
from attnviz.spec import run_spec


def main(texts_file: str, device: str, js: bool) -> None:
    texts = [line.strip() for line in open(texts_file, encoding="utf-8") if line.strip()]
    loaded = load_model("bundled", device)
    start, start_cpu = time.perf_counter(), time.process_time()
    measure_heads(loaded, texts, run_spec(loaded, device=device, js=js))  # its result is on the CPU: the GPU's work is done
    print(f"loop_cpu_seconds={time.process_time() - start_cpu:.3f}")  # every thread's, for a busy machine
    print(f"loop_seconds={time.perf_counter() - start:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:3], js="--js" in sys.argv[3:])

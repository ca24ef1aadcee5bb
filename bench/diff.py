"""Issue 26's diff row: attnviz.diff of SmolLM2 against each layer's random re-initialisation, every layer × head.

    python bench/diff.py [--tokens 64] [--repeat 3]

The text (sample_inputs/en.txt repeated, cut to --tokens of SmolLM2's tokenizer) goes through, in one process:
- forward: transformers' AutoModelForCausalLM (SDPA, float32), one forward pass: the model's own cost;
- diff: attnviz.analysis.diff.head_differences, the numbers of `attnviz diff --against random` (no figures): the
  model's hidden states captured, every layer's maps on both sides a block of queries at a time, the JS distance
  and Clark's divergence of every head, the most changed heads' maps kept (at most 2,048 tokens).
Each the best of --repeat after a warm-up; the peak resident set after each (ru_maxrss). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import best_of, peak_mb, smollm2_forward  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from attnviz.analysis.diff import RANDOM, head_differences
    from attnviz.budgets import block_budget
    from attnviz.models.loading import load_model
    from attnviz.spec import run_spec

    text, forward_s, forward_peak = smollm2_forward(args.tokens, args.repeat)
    loaded = load_model("smollm2", device="cpu")
    spec = run_spec(loaded, "smollm2", layer=None, device="cpu")
    measured = head_differences(loaded, RANDOM, text, spec, block_budget(spec))
    tokens = len(measured.tokens)
    diff_s = best_of(lambda: head_differences(loaded, RANDOM, text, spec, block_budget(spec)), args.repeat)
    print(json.dumps({
        "model": "SmolLM2-135M", "against": "random", "tokens": tokens, "threads": torch.get_num_threads(),
        "forward_s": round(forward_s, 3), "forward_peak_mb": round(forward_peak),
        "diff_s": round(diff_s, 3), "peak_mb": round(peak_mb()), "diff_over_forward": round(diff_s / forward_s, 2),
        "maps_kept": len(measured.maps),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

"""A command of attnviz on a long SmolLM2 text against transformers' SDPA forward of the same text (issue 45's rows).

    python bench/long_commands.py [--tokens 8192] [--repeat 1] heads --layer 10

The text (sample_inputs/en.txt repeated, cut to --tokens of SmolLM2's tokenizer) goes first through transformers'
AutoModelForCausalLM (SDPA, float32, one forward pass: the best of --repeat after a warm-up), then `attnviz COMMAND
TEXT ARGUMENTS --model smollm2 --out FOLDER` runs as a process of its own under /usr/bin/time -v (timing.timed_command:
its wall time with the model's load and the files, and its peak resident set). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import smollm2_forward, timed_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("command", help="the command: heads, layers, stats, roles, report")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the command's own options (--layer 10)")
    args = parser.parse_args()
    text, forward_s, forward_peak = smollm2_forward(args.tokens, args.repeat)
    row = {"command": " ".join([args.command, *args.arguments]), "tokens": args.tokens, "forward_s": round(forward_s, 3),
           "forward_peak_mb": round(forward_peak)}  # fmt: skip
    row |= timed_command([args.command, text, *args.arguments, "--model", "smollm2"], forward_s)
    print(json.dumps(row))


if __name__ == "__main__":
    main()

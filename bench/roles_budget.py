"""Issue 37's budget rows: `attnviz roles` on SmolLM2, against transformers' SDPA forward of the same text.

    python bench/roles_budget.py [--tokens 2048] [--repeat 1] [--circuits] [--apart] [--command]

The text (sample_inputs/en.txt repeated, cut to --tokens of SmolLM2's tokenizer) goes through, in one process:
- forward: transformers' AutoModelForCausalLM (SDPA, float32), one forward pass: the model's own cost;
- roles: attnviz.analysis.roles.text_roles, the text's scores of `attnviz roles` (the three templates, the
  streaming share, the top-16/64/256 coverage and layers' summaries, every layer × head, a block of queries at a
  time, no figure), with layer 0's run that its report shows (its map written to a file past 64 MB);
- with --circuits: Olsson et al.'s prefix matching (10 sequences of 101 tokens) and the copying score, each timed;
- with --command: `attnviz roles TEXT --model smollm2 --out FOLDER` itself under /usr/bin/time -v (a process of its
  own: the model loaded, both passes, the report and the files written), its wall time against the same forward;
- with --apart: the same pass with the role numbers alone (the budget's list: the templates, the streaming share,
  the top-k coverage), `layers`' summaries left out, as `roles` never runs it: what the summaries cost beside them.
Each the best of --repeat after a warm-up; the process's peak resident set after each (ru_maxrss: the roles' peak
includes the forward's model, still loaded). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import best_of, peak_mb, smollm2_forward, timed_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--circuits", action="store_true", help="also time prefix matching and copying")
    parser.add_argument("--apart", action="store_true", help="also time the role numbers without the summaries")
    parser.add_argument("--command", action="store_true", help="also time `attnviz roles TEXT --model smollm2` itself")
    args = parser.parse_args()

    from attnviz.analysis import circuits
    from attnviz.analysis.head_numbers import RoleSettings
    from attnviz.analysis.roles import text_roles
    from attnviz.budgets import block_budget
    from attnviz.models.loading import load_model
    from attnviz.spec import run_spec

    text, forward_s, forward_peak = smollm2_forward(args.tokens, args.repeat)
    loaded = load_model("smollm2", device="cpu")
    spec = run_spec(loaded, "smollm2", layer=None, device="cpu")
    budget = block_budget(spec)
    last = {}

    def roles_pass() -> None:
        last.clear()  # the previous pass's layer 0 map (a file past 64 MB) goes first
        last["pass"] = text_roles(loaded, text, spec, budget, RoleSettings())

    roles_s = best_of(roles_pass, args.repeat)
    passed = last["pass"]
    row = {
        "model": "SmolLM2-135M", "tokens": len(passed.ids), "threads": torch.get_num_threads(),
        "rows_per_block": passed.summaries.rows_per_block, "forward_s": round(forward_s, 3), "forward_peak_mb": round(forward_peak),
        "roles_s": round(roles_s, 3), "peak_mb": round(peak_mb()), "roles_over_forward": round(roles_s / forward_s, 2),
    }  # fmt: skip
    if args.apart:
        row["role_numbers_alone_s"] = round(best_of(lambda: role_numbers_alone(loaded, text, spec, budget), args.repeat), 3)
        row["alone_over_forward"] = round(row["role_numbers_alone_s"] / forward_s, 2)
    if args.circuits:
        sequences = circuits.random_sequences(loaded)
        start = time.perf_counter()
        circuits.prefix_matching(loaded, spec, budget, sequences)
        row["prefix_matching_s"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        circuits.copying(loaded)
        row["copying_s"] = round(time.perf_counter() - start, 3)
    if args.command:
        row |= timed_command(["roles", text, "--model", "smollm2"], forward_s)
    print(json.dumps(row))


def role_numbers_alone(loaded, text, spec, budget) -> None:
    """text_roles' pass with RoleSums fed every block and no HeadSummaries: the role numbers' cost alone."""
    from attnviz.analysis.head_numbers import RoleSettings
    from attnviz.analysis.roles import RoleSums
    from attnviz.layer_inputs import encode_texts, threads_for
    from attnviz.own_layer import build_layers
    from attnviz.passes import iter_layer_blocks

    encoded = encode_texts(loaded, [text], spec)
    ids = list(encoded.queries.ids[0])
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    sums = RoleSums(len(layers), max(layer.num_heads for layer in layers), ids, causal=spec.causal, settings=RoleSettings())
    for layer, first_query, weights in iter_layer_blocks(loaded, encoded, layers, spec, budget):
        sums.add(layer, first_query, weights[0])
    sums.scores()


if __name__ == "__main__":
    main()

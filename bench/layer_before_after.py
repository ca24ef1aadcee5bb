"""Issue 35, part 4: attnviz's layer before and after a change, in one process, run by run in turn.

    python bench/layer_before_after.py /path/to/old/checkout [--tokens 8192] [--rounds 11] [--memory 64]

On a machine other processes share, two processes timed minutes apart measure the machine; here the old
checkout's attention/layer.py (with its query_blocks.py) and this one's run on the same weights and states, alternately (the order
swapped each round), and each round's ratio after/before is kept: the median of those ratios is the figure.
Cases, SmolLM2's shapes (hidden 576, 9 query heads over 3 key/value heads of 64), causal, random weights:
- blocks, the weights only (what `layers` and `stats` run per layer: narrow, outputs=False), blocks of --memory MB;
- blocks with their outputs (the chosen layer's map of `heads`);
- forward on 2,048 tokens (a short text's whole pass).
Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def old_module(checkout: Path, name: str):
    """attnviz/attention/<name>.py of the old checkout as the module old_<name>."""
    spec = importlib.util.spec_from_file_location(f"old_{name}", checkout / "attnviz" / "attention" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"old_{name}"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def old_layer_module(checkout: Path):
    """The old checkout's layer.py, importing the old checkout's query_blocks.py (this one's other modules)."""
    import attnviz.attention.query_blocks as new_blocks

    sys.modules["attnviz.attention.query_blocks"] = old_module(checkout, "query_blocks")
    try:
        return old_module(checkout, "layer")
    finally:
        sys.modules["attnviz.attention.query_blocks"] = new_blocks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path, help="a checkout of the code before the change")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--memory", type=int, default=64, help="MB a block of attention may take")
    args = parser.parse_args()
    from attnviz.attention import layer as new

    old = old_layer_module(args.before)
    torch.manual_seed(0)
    before = old.MultiHeadAttention(576, 9, num_kv_heads=3, head_dim=64, bias=False).eval()
    after = new.MultiHeadAttention(576, 9, num_kv_heads=3, head_dim=64, bias=False).eval()
    after.load_state_dict(before.state_dict())
    states, short = torch.randn(1, args.tokens, 576), torch.randn(1, 2048, 576)
    rows = new.rows_per_block(args.memory * 2**20, 1, 9, args.tokens)

    def blocks(layer, outputs: bool) -> None:
        for _ in layer.blocks(states, causal=True, rows=rows, narrow=True, outputs=outputs):
            pass

    cases = {
        "blocks, the weights only": lambda layer: blocks(layer, False),
        "blocks with their outputs": lambda layer: blocks(layer, True),
        "forward, 2,048 tokens": lambda layer: layer(short, causal=True),
    }
    times = {(case, side): [] for case in cases for side in ("before", "after")}
    with torch.inference_mode():
        for run in cases.values():
            run(before), run(after)  # warm-up
        for round_ in range(args.rounds):
            for case, run in cases.items():
                order = (("before", before), ("after", after))
                for side, layer in order if round_ % 2 == 0 else order[::-1]:
                    start = time.perf_counter()
                    run(layer)
                    times[case, side].append(time.perf_counter() - start)
    for case in cases:
        ratios = [a / b for b, a in zip(times[case, "before"], times[case, "after"])]
        print(json.dumps({
            "case": case, "tokens": 2048 if case.startswith("forward") else args.tokens, "rows_per_block": rows,
            "before_median_s": round(statistics.median(times[case, "before"]), 3),
            "after_median_s": round(statistics.median(times[case, "after"]), 3),
            "after_over_before_median_of_rounds": round(statistics.median(ratios), 3),
            "threads": torch.get_num_threads(), "rounds": args.rounds,
        }))  # fmt: skip


if __name__ == "__main__":
    main()

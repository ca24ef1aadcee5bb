"""Issue 25's blocks row: one layer's attention alone, attnviz's blocks against SDPA on the same q, k, v.

    python bench/blocks.py [--tokens 8192] [--shape smollm2|llama1b] [--device cpu|cuda] [--memory 512]

A layer of the model's shapes with random projections (the shapes cost, not the weights): SmolLM2-135M's
(hidden 576, 9 query heads over 3 key/value heads of 64) or Llama 3.2 1B's (2048, 32 over 8 of 64), causal.
Times, each the best of three after a warm-up, on one process:
- sdpa: F.scaled_dot_product_attention(q, k, v, is_causal=True) on the layer's projected q, k, v;
- blocks: what `layers`, `stats` and the report's summaries run per layer: MultiHeadAttention.blocks a block
  of queries at a time (--memory MB a block, as attnviz's --memory), narrow, without the values' sum, every
  weight made, and each block fed to HeadSummaries (analysis/head_summaries.py).
Prints one JSON line with the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"smollm2": (576, 9, 3), "llama1b": (2048, 32, 8)}  # hidden, heads, key/value heads (head size 64)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def best_of(function, device: str, repeat: int = 3) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeat):
        synchronize(device)
        start = time.perf_counter()
        function()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def layer_alone(tokens: int, shape: str, device: str, memory_mb: int) -> dict:
    """The sdpa and blocks times of one causal layer over `tokens` random hidden states."""
    from attnviz.analysis.head_summaries import HeadSummaries
    from attnviz.attention.layer import MultiHeadAttention, rows_per_block

    hidden, heads, kv_heads = SHAPES[shape]
    torch.manual_seed(0)
    layer = MultiHeadAttention(hidden, heads, num_kv_heads=kv_heads, head_dim=64, bias=False).to(device).eval()
    states = torch.randn(1, tokens, hidden, device=device)
    rows = rows_per_block(memory_mb * 2**20, 1, heads, tokens)

    def blocks() -> None:
        summaries = HeadSummaries(heads, tokens, tokens, causal=True)
        for first, _, weights in layer.blocks(states, causal=True, rows=rows, narrow=True, outputs=False):
            summaries.add(first, weights[0])
        summaries.summary()

    with torch.inference_mode():
        q, k, v = layer.project(states)
        sdpa = best_of(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), device)
        project = best_of(lambda: layer.project(states), device)
        blocked = best_of(blocks, device)
    return {
        "shape": shape, "tokens": tokens, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "rows_per_block": rows, "sdpa_s": round(sdpa, 4),
        "blocks_and_summaries_s": round(blocked, 4), "of_which_projections_s": round(project, 4),
        "blocks_over_sdpa": round(blocked / sdpa, 2), "blocks_without_projections_over_sdpa": round((blocked - project) / sdpa, 2),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory", type=int, default=512, help="MB a block of attention may take")
    args = parser.parse_args()
    print(json.dumps(layer_alone(args.tokens, args.shape, args.device, args.memory)))


if __name__ == "__main__":
    main()

"""How much memory a block of attention may take: --memory, else a default on the CPU and half the GPU's free memory.

pipeline.layer_pass and the passes over every layer (stats, layers, the report's summaries) cut their work into
blocks of queries within these budgets; past LARGE_MAP_BYTES a text's map goes to a file, not to memory.
"""

from __future__ import annotations

import torch

from attnviz.spec import RunSpec

# A block of attention's memory when --memory is not given, on the CPU (on a GPU: half its free memory).
DEFAULT_MEMORY_MB = 512
# A text's map (H, Nq, Nk) float32 past this many bytes (or past --memory) goes to a temporary .npy, read lazily.
LARGE_MAP_BYTES = 64 * 2**20
BLOCK_BYTES = 64 * 2**20  # on the CPU, the largest block of a pass over every layer (block_budget)


def memory_budget(spec: RunSpec) -> int:
    """Bytes a block of attention may take: --memory, else DEFAULT_MEMORY_MB on the CPU and half the GPU's free memory."""
    if spec.memory is not None:
        return spec.memory * 2**20
    if spec.device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return free // 2
    return DEFAULT_MEMORY_MB * 2**20


def block_budget(spec: RunSpec) -> int:
    """Bytes each block of a pass over every layer takes: the memory budget on a GPU (fewer, larger blocks); on the
    CPU at most BLOCK_BYTES, past which a block's passes run out of the cache, slower (bench/blocks.py: SmolLM2's
    layer at 8,192 tokens, 64 MB blocks twice as fast as 512 MB ones)."""
    budget = memory_budget(spec)
    return budget if spec.device == "cuda" else min(budget, BLOCK_BYTES)


def large_map_bytes(spec: RunSpec) -> int:
    """Bytes past which one text's map is written to a file, not held in memory: LARGE_MAP_BYTES, or the memory
    budget (memory_budget) when smaller."""
    return min(LARGE_MAP_BYTES, memory_budget(spec))


def every_layer_in_blocks(spec: RunSpec, batch: int, num_heads: int, num_tokens: int, num_layers: int = 1) -> bool:
    """Whether a pass over every layer (stats, layers) takes each layer's weights a block of queries at a time.

    So it does when the maps it would hold at once, num_layers layers' (B, H, N, N) float32 (stats holds one
    layer's batch, layers every layer's map of its text), pass the memory budget (memory_budget), or
    when one text's map passes the large-map size (large_map_bytes).
    """
    one_map = 4 * num_heads * num_tokens * num_tokens
    return num_layers * batch * one_map > memory_budget(spec) or one_map > large_map_bytes(spec)

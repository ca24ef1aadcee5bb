"""The zoomable map of a long text (the report's zoom view): each head's map as a pyramid of block maxima and means.

A map of N tokens has N² weights a head (604 million for SmolLM2's 9 heads at 8,192 tokens): far more
than a page can carry. So the page gets, per head:

- levels: the map cut into blocks of 2**level × 2**level cells, each block's maximum and mean (over
  the cells the query may see: a causal map's future keys are left out) as uint8 codes of the report's
  log colour scale (encoding.encode_quantised: 0 below 0.001 or masked, else 255 levels from 0.001 to 1). The
  finest level is the finest whose levels fit LEVELS_BUDGET_BYTES (level 0, a block a cell, for maps
  short enough); each coarser level halves each side, up to one of at most TOP_SIDE blocks a side.
  The page colours a block by its maximum, so a sharp line never vanishes when zoomed out, and reads
  out both with the block's extent.
- exact rows: chosen queries' rows (none yet from the command line), then the first and last queries' rows at
  full precision (encoding.encode_exact: 4 decimals),
  as many as EXACT_ROWS_BUDGET_BYTES hold (at most MAX_EXACT_ROWS): the only cells whose weight the
  page reads out as exact.

Computed block by block: a band of rows of one head at a time (run.attention[head, r0:r1]), so a map
held as a memory map (H, Nq, Nk) is never read whole, and no copy of it is made. This module computes;
record.encode_zoom encodes (the levels as uint8 codes, the exact rows as uint16).
"""

from __future__ import annotations

import math

import numpy as np

ZOOM_MIN_TOKENS = 512  # a map with more queries or keys gets the zoom view; shorter reports are unchanged
LEVELS_BUDGET_BYTES = 16 * 2**20  # the levels' uint8 codes, maxima and means, all heads (before compression)
EXACT_ROWS_BUDGET_BYTES = 4 * 2**20  # the exact rows' uint16 codes, all heads
MAX_EXACT_ROWS = 32  # half from the first queries, half from the last
TOP_SIDE = 128  # the coarsest level has at most this many blocks a side
BAND_VALUES = 2**22  # weights read at once: a band of rows of one head (16 MB of float32)


def needs_zoom(num_queries: int, num_keys: int) -> bool:
    return max(num_queries, num_keys) > ZOOM_MIN_TOKENS


def level_shape(level: int, num_queries: int, num_keys: int) -> tuple[int, int]:
    """(rows, columns) of blocks of 2**level cells a side (the last ones cut short)."""
    block = 2**level
    return math.ceil(num_queries / block), math.ceil(num_keys / block)


def zoom_levels(num_heads: int, num_queries: int, num_keys: int, budget: int = LEVELS_BUDGET_BYTES) -> list[int]:
    """The levels the page gets, finest first: from the finest whose codes (2 bytes a block: max and mean,
    every head, every level above it) fit budget, up to the first with at most TOP_SIDE blocks a side."""
    top = 0
    while max(level_shape(top, num_queries, num_keys)) > TOP_SIDE:
        top += 1
    finest = top
    while finest > 0 and levels_bytes(num_heads, num_queries, num_keys, range(finest - 1, top + 1)) <= budget:
        finest -= 1
    return list(range(finest, top + 1))


def levels_bytes(num_heads: int, num_queries: int, num_keys: int, levels) -> int:
    """The levels' codes before compression: a max and a mean byte per block per head."""
    return sum(2 * num_heads * math.prod(level_shape(level, num_queries, num_keys)) for level in levels)


def exact_rows(num_heads: int, num_queries: int, num_keys: int, chosen=(), budget: int = EXACT_ROWS_BUDGET_BYTES) -> list[int]:
    """The query rows embedded at full precision, as many as budget holds (2 bytes a weight), in order: the chosen
    ones first (a query a reader asked about), then the first and last queries, in turn from both ends."""
    from attnviz.errors import AttnvizError

    for row in chosen:
        if not 0 <= row < num_queries:
            raise AttnvizError(f"query {row} is out of range: the map has queries 0 to {num_queries - 1}")
    count = min(MAX_EXACT_ROWS, num_queries, budget // (2 * num_heads * num_keys))
    rows = list(dict.fromkeys(chosen))[:count]
    ends = (row for pair in zip(range(num_queries), range(num_queries - 1, -1, -1)) for row in pair)  # 0, N-1, 1, N-2, ...
    for row in ends:
        if len(rows) >= count:
            break
        if row not in rows:
            rows.append(row)
    return sorted(rows)


def block_counts(num_queries: int, num_keys: int, block: int, causal: bool) -> np.ndarray:
    """(rows, columns) of blocks: how many cells of each its queries may see (a causal map's: the keys up to each query)."""
    rows, columns = level_shape(int(math.log2(block)), num_queries, num_keys)
    key_starts = np.arange(columns) * block  # (C,)
    widths = np.minimum(block, num_keys - key_starts)  # (C,): the last block may be narrower
    seen = np.zeros((rows * block, columns), dtype=np.int64)  # (rows padded to whole blocks, C): per query
    query_index = np.arange(num_queries)[:, None]
    seen[:num_queries] = np.clip(query_index + 1 - key_starts, 0, widths) if causal else widths
    return seen.reshape(rows, block, columns).sum(axis=1)


def finest_blocks(head_map, causal: bool, block: int, band_values: int = BAND_VALUES) -> tuple[np.ndarray, np.ndarray]:
    """One head's map (Nq, Nk, any array read by slicing) as blocks of block × block cells: (max, sum) of the cells
    each block holds that the query may see (a causal map's future keys count as 0: weights are never below it).

    A band of rows at a time, copied into one buffer of whole blocks (zeros past the map's last rows and keys) and
    reduced there by torch's threads: never more than band_values weights (rounded up to whole blocks) read at once.
    """
    import torch

    num_queries, num_keys = head_map.shape
    rows, columns = level_shape(int(math.log2(block)), num_queries, num_keys)
    maxima = torch.zeros(rows, columns)
    sums = torch.zeros(rows, columns, dtype=torch.float64)
    band = max(1, band_values // max(1, num_keys) // block) * block  # rows a band, a multiple of block
    buffer = torch.zeros(min(band, rows * block), columns * block)  # the keys past Nk stay 0
    for start in range(0, num_queries, band):
        stop = min(num_queries, start + band)
        band_rows = math.ceil((stop - start) / block)
        cells = buffer[: band_rows * block]
        cells.numpy()[: stop - start, :num_keys] = head_map[start:stop]  # this band only: a copy of it
        cells[stop - start :] = 0.0  # the map's last band: whole blocks of zeros past its last query
        if causal:
            cells.tril_(start)  # the keys after each query: row r is query start + r
        by_rows = cells.view(band_rows, block, columns * block)  # (block rows, block, Nk padded)
        first = start // block
        maxima[first : first + band_rows] = by_rows.amax(dim=1).view(band_rows, columns, block).amax(dim=2)
        # A block's rows summed in float32 (block values, each within [0, 1]), its columns' sums in float64.
        sums[first : first + band_rows] = by_rows.sum(dim=1).view(band_rows, columns, block).sum(dim=2, dtype=torch.float64)
    return maxima.numpy(), sums.numpy()


def coarser(maxima: np.ndarray, sums: np.ndarray, counts: np.ndarray):
    """The next level: each 2 × 2 of blocks one block (the last row or column of blocks alone where odd)."""
    rows, columns = maxima.shape
    shape = (math.ceil(rows / 2) * 2, math.ceil(columns / 2) * 2)

    def pooled(values, reduce):
        padded = np.zeros(shape, dtype=values.dtype)  # no block is below 0
        padded[:rows, :columns] = values
        return reduce(padded.reshape(shape[0] // 2, 2, shape[1] // 2, 2), axis=(1, 3))

    return pooled(maxima, np.max), pooled(sums, np.sum), pooled(counts, np.sum)


def zoom_record(
    attention, causal: bool, chosen_rows=(), levels_budget: int = LEVELS_BUDGET_BYTES, band_values: int = BAND_VALUES
) -> dict:
    """The zoom view's numbers of a map (H, Nq, Nk) read by slicing (a NumPy array, a memory map, a torch tensor);
    record.encode_zoom encodes them for the page.

    {"levels": [{"level", "block", "rows", "columns", "max": [(rows, columns) per head], "mean": [...]}, ...] finest
    first, a block whose every cell is masked 0; "exact_rows": [query rows]; "exact": (H, exact rows, Nk)}.
    chosen_rows: queries whose rows are embedded exactly before the first and last (exact_rows);
    levels_budget: zoom_levels' budget; band_values: finest_blocks' (the weights read at once).
    """
    num_heads, num_queries, num_keys = attention.shape
    levels = zoom_levels(num_heads, num_queries, num_keys, levels_budget)
    per_level = [{"level": level, "block": 2**level, "max": [], "mean": []} for level in levels]
    finest_counts = block_counts(num_queries, num_keys, 2 ** levels[0], causal)  # the same for every head
    for head in range(num_heads):
        maxima, sums = finest_blocks(attention[head], causal, 2 ** levels[0], band_values)
        counts = finest_counts
        for entry in per_level:
            if entry is not per_level[0]:
                maxima, sums, counts = coarser(maxima, sums, counts)
            entry["rows"], entry["columns"] = maxima.shape
            entry["max"].append(maxima)  # 0 where every cell is masked
            entry["mean"].append((sums / np.maximum(counts, 1)).astype(np.float32))  # 0 where every cell is masked
    rows = exact_rows(num_heads, num_queries, num_keys, chosen_rows)
    exact = np.stack([_rows_of(attention[head], rows) for head in range(num_heads)])  # (H, rows, Nk)
    return {"levels": per_level, "exact_rows": rows, "exact": exact}


def _rows_of(head_map, rows: list[int]) -> np.ndarray:
    """(len(rows), Nk): the rows asked for, read as the few contiguous slices they make (the first and the last)."""
    spans, start = [], 0
    for at, row in enumerate(rows):
        if at + 1 == len(rows) or rows[at + 1] != row + 1:
            spans.append((rows[start], row + 1))
            start = at + 1
    return np.concatenate([np.asarray(head_map[first:last], dtype=np.float64) for first, last in spans])

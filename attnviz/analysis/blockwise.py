"""The per-query sums under `attnviz stats`' statistics, computed block by block of queries (torch).

statistics.batch_statistics turns them into the statistics and Jensen-Shannon distances of a padded
batch. The distances are most of the work: for every pair of heads a < b and every query, the sum
of s log s over the keys, s = p_a + p_b (P = H(H-1)/2 pairs: at 12 heads and 512 tokens, 17 million
cells per text and layer, each a log). Over the whole batch at once each of
those passes reads and writes hundreds of MB and waits on memory; here a block of one text's queries
(every head's rows, every pair's sums) stays in the cache from one step to the next, and padding is
skipped. On the CPU s log s is a log, a multiply and a sum: torch's xlogy and special.entr run about
ten times slower than its vectorised log (torch 2.13, measured on these maps).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

# How many (query, pair, key) cells a block holds: on the CPU about the size of L2 (2**19 float32 is
# 2 MB); 12 heads at 512 tokens: 15 queries a block. Elsewhere (CUDA) fewer, larger blocks.
CPU_CELLS_AT_ONCE = 2**19
DEVICE_CELLS_AT_ONCE = 2**25


@contextmanager
def one_thread_per_op(device) -> Iterator[int]:
    """On the CPU, torch's ops each on one thread inside the block; yields the threads torch had (query_sums' workers).

    A block's ops are too small to share among threads: each op's threads wait at its end for the
    slowest, and on a busy machine (or after torch's thread count changed) that wait cost more than
    the op (4x slower, measured). query_sums gives a text to each worker instead. Elsewhere (CUDA) yields 1.
    """
    import torch

    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield 1
        return
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


def query_sums(weights, valid_lens: list[int], columns, workers: int = 1):
    """Every query's sums of a padded batch of maps (B, H, N, N), zero on padding.

    valid_lens holds each text's tokens (B ints); columns (B, N, C) holds C values per key (the key
    kinds, ...), the same for every query. Returns torch tensors on weights' device, in its dtype, zero
    on padding queries:
      plogp (B, N, H): sum_k p log p of every head's row (0 log 0 = 0)
      maxima (B, N, H): every head's largest weight
      products (B, N, H, C): sum_k p_k columns[k]
      distance (B, N, H): sum_k p_k |q - k|, in tokens
      pair_slogs (B, N, P): sum_k s log s with s = p_a + p_b, for the pairs a < b in
        torch.triu_indices(H, H, 1)'s order
    Keys past a text's length are left out: the maps are zero there, so no sum changes. workers > 1
    shares the texts among that many threads (inside one_thread_per_op).
    """
    import torch

    batch, num_heads, num_tokens, _ = weights.shape
    options = {"device": weights.device, "dtype": weights.dtype}
    num_pairs = num_heads * (num_heads - 1) // 2
    sums = (  # zero on padding queries
        torch.zeros(batch, num_tokens, num_heads, **options),  # plogp
        torch.zeros(batch, num_tokens, num_heads, **options),  # maxima
        torch.zeros(batch, num_tokens, num_heads, columns.shape[-1], **options),  # products
        torch.zeros(batch, num_tokens, num_heads, 1, **options),  # distance
        torch.zeros(batch, num_tokens, num_pairs, **options),  # pair_slogs
    )
    positions = torch.arange(num_tokens, **options)
    offsets = (positions[:, None] - positions).abs()[..., None]  # (N, N, 1): |q - k|
    texts = [(b, length) for b, length in enumerate(valid_lens) if length > 0]

    def text_sums(text: tuple[int, int]) -> None:
        b, length = text
        _text_sums(weights[b, :, :length, :length], columns[b, :length], offsets, [out[b] for out in sums])

    if workers == 1 or len(texts) == 1:
        for text in texts:
            text_sums(text)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(text_sums, texts))
    return (*sums[:3], sums[3][..., 0], sums[4])


def _text_sums(weights, columns, offsets, sums) -> None:
    """query_sums of one text's maps (H, n, n), its columns (n, C) and offsets (N, N, 1), into its rows of query_sums' sums."""
    import torch

    plogp, maxima, products, distance, pair_slogs = sums  # (N, H), (N, H), (N, H, C), (N, H, 1), (N, P)
    num_heads, length, _ = weights.shape
    num_pairs = pair_slogs.shape[-1]
    # The smallest normal number, added to every weight of a block: log is then finite where a weight
    # is 0 (so 0 log 0 = 0), and no sum moves by more than N times it (1e-35 in float32).
    tiny = torch.finfo(weights.dtype).tiny
    cells = CPU_CELLS_AT_ONCE if weights.device.type == "cpu" else DEVICE_CELLS_AT_ONCE
    rows = max(1, cells // (max(num_pairs, 1) * length))  # queries a block
    pair_sums = weights.new_empty(rows, num_pairs, length)  # (Q, P, n): each pair's s
    pair_logs = torch.empty_like(pair_sums)  # (Q, P, n): log s, then s log s
    for start in range(0, length, rows):
        stop = min(start + rows, length)
        block = weights[:, start:stop].transpose(0, 1) + tiny  # (Q', H, n): every head's rows of these queries
        torch.amax(block, dim=-1, out=maxima[start:stop])
        torch.matmul(block, columns, out=products[start:stop])  # (Q', H, n) @ (n, C)
        torch.matmul(block, offsets[start:stop, :length], out=distance[start:stop])  # (Q', H, n) @ (Q', n, 1)
        torch.sum(block.log().mul_(block), dim=-1, out=plogp[start:stop])
        if num_pairs == 0:
            continue
        first, block_sums, block_logs = 0, pair_sums[: stop - start], pair_logs[: stop - start]  # (Q', P, n)
        for a in range(num_heads - 1):  # head a with every later head: the pairs (a, a+1), ..., (a, H-1)
            later = num_heads - 1 - a
            torch.add(block[:, a : a + 1], block[:, a + 1 :], out=block_sums[:, first : first + later])
            first += later
        torch.log(block_sums, out=block_logs)
        torch.sum(block_logs.mul_(block_sums), dim=-1, out=pair_slogs[start:stop])

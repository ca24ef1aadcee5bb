"""The per-query sums under `attnviz stats`' statistics, computed block by block of queries (torch).

statistics.batch_statistics turns them into the statistics and Jensen-Shannon distances of a padded
batch. The distances are most of the work: for every pair of heads a < b and every query, the sum
of s log s over the keys, s = p_a + p_b (P = H(H-1)/2 pairs: at 12 heads and 512 tokens, 17 million
cells per text and layer, each a log). Over the whole batch at once each of
those passes reads and writes hundreds of MB and waits on memory; here a block of one text's queries
(every head's rows, every pair's sums) stays in the cache from one step to the next, and padding is
skipped; short texts go several to a block, where one text's ops would cost more than their work.
On the CPU s log s is a log, a multiply and a sum: torch's xlogy and special.entr run about ten
times slower than its vectorised log (torch 2.13, measured on these maps).
"""

from __future__ import annotations

# How many (query, pair, key) cells a block holds: on the CPU about the size of L2 (2**19 float32 is
# 2 MB); 12 heads at 512 tokens: 15 queries a block. Elsewhere (CUDA) fewer, larger blocks.
CPU_CELLS_AT_ONCE = 2**19
DEVICE_CELLS_AT_ONCE = 2**25


def query_sums(weights, valid_lens: list[int], columns):
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
    Texts go in groups of consecutive ones (_groups): several short texts a block, or a long text's
    queries in several blocks; keys past a group's longest text are left out (the maps are zero there,
    so no sum changes). Each op runs on torch's threads: sharing the groups among threads instead,
    one thread an op, was slower on an idle 2-core machine (switching torch's thread count costs).
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
    lengths = [max(length, 0) for length in valid_lens]

    def group_sums(group: range) -> None:
        length = max(lengths[b] for b in group)
        if length > 0:
            maps = weights[group.start : group.stop, :, :length, :length]  # (G, H, n, n)
            _group_sums(maps, columns[group.start : group.stop, :length], offsets, [out[group.start : group.stop] for out in sums])

    cells = CPU_CELLS_AT_ONCE if weights.device.type == "cpu" else DEVICE_CELLS_AT_ONCE
    for group in _groups(cells, num_pairs, num_tokens, batch):
        group_sums(group)
    # A group's shorter texts have padding queries inside it: their rows hold what the layer gave them.
    real = (positions < torch.tensor(lengths, **options)[:, None]).to(weights.dtype)  # (B, N)
    for out in sums:
        out.mul_(real.view(batch, num_tokens, *[1] * (out.dim() - 2)))
    return (*sums[:3], sums[3][..., 0], sums[4])


def _groups(cells: int, num_pairs: int, num_tokens: int, batch: int) -> list[range]:
    """The texts of a batch in groups of consecutive ones, each group a block of whole texts where a
    text's (query, pair, key) cells are fewer than a block holds (short texts: per text, the ops'
    own cost would be most of the work), else one text a group, cut into blocks of queries."""
    size = max(1, cells // (max(num_pairs, 1) * num_tokens * num_tokens))
    return [range(first, min(first + size, batch)) for first in range(0, batch, size)]


def _group_sums(weights, columns, offsets, sums) -> None:
    """query_sums of a group of texts' maps (G, H, n, n), n the longest of them, and their columns (G, n, C),
    with offsets (N, N, 1), into their rows of query_sums' sums (G, N, ...)."""
    import torch

    plogp, maxima, products, distance, pair_slogs = sums  # (G, N, H), (G, N, H), (G, N, H, C), (G, N, H, 1), (G, N, P)
    group, num_heads, length, _ = weights.shape
    num_pairs = pair_slogs.shape[-1]
    # The smallest normal number, added to every weight of a block: log is then finite where a weight
    # is 0 (so 0 log 0 = 0), and no sum moves by more than N times it (1e-35 in float32).
    tiny = torch.finfo(weights.dtype).tiny
    cells = CPU_CELLS_AT_ONCE if weights.device.type == "cpu" else DEVICE_CELLS_AT_ONCE
    rows = min(length, max(1, cells // (max(num_pairs, 1) * length * group)))  # queries a block
    pair_sums = weights.new_empty(group, rows, num_pairs, length)  # (G, Q, P, n): each pair's s
    pair_logs = torch.empty_like(pair_sums)  # (G, Q, P, n): log s, then s log s
    columns = columns[:, None]  # (G, 1, n, C): the same for every query
    for start in range(0, length, rows):
        stop = min(start + rows, length)
        block = weights[:, :, start:stop].transpose(1, 2) + tiny  # (G, Q', H, n): every head's rows of these queries
        maxima[:, start:stop] = block.amax(dim=-1)
        products[:, start:stop] = block @ columns  # (G, Q', H, n) @ (G, 1, n, C)
        distance[:, start:stop] = block @ offsets[start:stop, :length]  # (G, Q', H, n) @ (Q', n, 1)
        plogp[:, start:stop] = block.log().mul_(block).sum(dim=-1)
        if num_pairs == 0:
            continue
        first, block_sums, block_logs = 0, pair_sums[:, : stop - start], pair_logs[:, : stop - start]  # (G, Q', P, n)
        for a in range(num_heads - 1):  # head a with every later head: the pairs (a, a+1), ..., (a, H-1)
            later = num_heads - 1 - a
            torch.add(block[:, :, a : a + 1], block[:, :, a + 1 :], out=block_sums[:, :, first : first + later])
            first += later
        torch.log(block_sums, out=block_logs)
        pair_slogs[:, start:stop] = block_logs.mul_(block_sums).sum(dim=-1)

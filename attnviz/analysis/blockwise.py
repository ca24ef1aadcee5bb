"""The per-query sums under `attnviz stats`' statistics, computed block by block of queries (torch).

statistics.batch_statistics turns them into the statistics and Jensen-Shannon distances of a padded
batch. The distances are most of the work: for every pair of heads a < b and every query, the sum
of s log s over the keys, s = p_a + p_b (P = H(H-1)/2 pairs: at 12 heads and 512 tokens, 17 million
cells per text and layer, each a log). Over the whole batch at once each of those passes would read
and write hundreds of MB and wait on memory; here a block of queries (every head's rows and every
pair's sums, heads first, so that no step transposes) stays in the cache from one step to the next,
and padding is skipped; short texts go several to a block, where one text's ops would cost more
than their work. On the CPU s log s is a log, a multiply and a sum: torch's xlogy and special.entr
run about ten times slower than its vectorised log (torch 2.13, measured on these maps).
"""

from __future__ import annotations

# How many (row, query, key) cells a block holds: on the CPU about the size of L2 (2**19 float32 is
# 2 MB); 12 heads and their 66 pairs at 512 tokens: 13 queries a block. Elsewhere (CUDA) fewer, larger blocks.
CPU_CELLS_AT_ONCE = 2**19
DEVICE_CELLS_AT_ONCE = 2**25


def query_sums(weights, valid_lens: list[int], columns, pairs: bool = True):
    """Every query's sums of a padded batch of maps (B, H, N, N), zero on padding queries.

    valid_lens holds each text's tokens (B ints); columns (B, N, C) holds C values per key (the key
    kinds, ...), the same for every query. Returns torch tensors on weights' device, in its dtype:
      plogp (B, H, N): sum_k p log p of every head's row (0 log 0 = 0)
      maxima (B, H, N): every head's largest weight
      products (B, H, N, C): sum_k p_k columns[k]
      distance (B, H, N): sum_k p_k |q - k|, in tokens
      pair_slogs (B, P, N): sum_k s log s with s = p_a + p_b, for the pairs a < b in
        torch.triu_indices(H, H, 1)'s order; None when not pairs (no Jensen-Shannon distances)
    Texts go in groups of consecutive ones (_groups): several short texts a block, or a long text's
    queries in several blocks; keys past a group's longest text are left out (the maps are zero there,
    so no sum changes).
    """
    import torch

    batch, num_heads, num_tokens, _ = weights.shape
    num_rows = num_heads * (num_heads + 1) // 2 if pairs else num_heads  # the heads, then their pairs
    maxima = weights.new_zeros(batch, num_heads, num_tokens)
    products = (weights.reshape(batch, -1, num_tokens) @ columns).view(batch, num_heads, num_tokens, -1)  # (B, H N, N) @ (B, N, C)
    slogs = weights.new_zeros(batch, num_rows, num_tokens)  # (B, R, N): sum s log s of every row
    distance = weights.new_zeros(batch, num_heads, num_tokens)
    positions = torch.arange(num_tokens, device=weights.device, dtype=weights.dtype)
    offsets = (positions[:, None] - positions).abs()  # (N, N): |q - k|
    lengths = [max(length, 0) for length in valid_lens]
    cells = CPU_CELLS_AT_ONCE if weights.device.type == "cpu" else DEVICE_CELLS_AT_ONCE
    for group in _groups(cells, num_rows, num_tokens, batch):
        length = max(lengths[b] for b in group)
        if length > 0:
            texts = slice(group.start, group.stop)
            _group_sums(weights[texts, :, :length, :length], offsets[:length, :length], cells, slogs[texts], maxima[texts], distance[texts])
    # A group's shorter texts have padding queries inside it, and a batch's maps hold on padding
    # queries what the layer gave them: zero them all.
    real = (positions < torch.tensor(lengths, device=weights.device)[:, None]).to(weights.dtype)[:, None]  # (B, 1, N)
    for sums in (maxima, slogs, distance):
        sums.mul_(real)
    products.mul_(real[..., None])
    return slogs[:, :num_heads], maxima, products, distance, slogs[:, num_heads:] if pairs else None


def _groups(cells: int, num_rows: int, num_tokens: int, batch: int) -> list[range]:
    """The texts of a batch in groups of consecutive ones, each group a block of whole texts where a
    text's (row, query, key) cells are fewer than a block holds (short texts: per text, the ops'
    own cost would be most of the work), else one text a group, cut into blocks of queries."""
    size = max(1, cells // (num_rows * num_tokens * num_tokens))
    return [range(first, min(first + size, batch)) for first in range(0, batch, size)]


def _group_sums(maps, offsets, cells: int, slogs, maxima, distance) -> None:
    """query_sums of a group of texts' maps (G, H, n, n), n the longest of them, with offsets (n, n):
    into their rows of query_sums' slogs (G, R, N), maxima (G, H, N) and distance (G, H, N)."""
    import torch

    group, num_heads, length, _ = maps.shape
    num_rows = slogs.shape[1]
    # The smallest normal number, added to every weight of a block: log is then finite where a weight
    # is 0 (so 0 log 0 = 0), and no sum moves by more than N times it (1e-35 in float32).
    tiny = torch.finfo(maps.dtype).tiny
    queries = min(length, max(1, cells // (num_rows * group * length)))  # a block's queries
    buffers = maps.new_empty(2, num_rows * group * queries * length)  # a block's s, then its log s
    for start in range(0, length, queries):
        stop = min(start + queries, length)
        shape = (num_rows, group, stop - start, length)
        rows, logs = (buffer[: shape[0] * shape[1] * shape[2] * shape[3]].view(shape) for buffer in buffers)  # (R, G, Q, n)
        heads = torch.add(maps[:, :, start:stop].transpose(0, 1), tiny, out=rows[:num_heads])  # (H, G, Q, n): every head's p
        first = num_heads
        for a in range(num_heads - 1 if num_rows > num_heads else 0):  # head a with each later head: s = p_a + p_b
            later = num_heads - 1 - a
            torch.add(heads[a : a + 1], heads[a + 1 :], out=rows[first : first + later])
            first += later
        maxima[:, :, start:stop] = heads.amax(dim=-1).transpose(0, 1)  # (G, H, Q): in the cache, where the batch's are not
        weighted = torch.mul(heads, offsets[start:stop], out=logs[:num_heads])  # in a block's buffer: a new one costs more
        distance[:, :, start:stop] = weighted.sum(dim=-1).transpose(0, 1)  # (G, H, Q)
        torch.log(rows, out=logs)
        slogs[:, :, start:stop] = logs.mul_(rows).sum(dim=-1).transpose(0, 1)  # (G, R, Q)

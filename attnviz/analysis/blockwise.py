"""`attnviz stats`' statistics and Jensen-Shannon distances of a padded batch, block by block of queries (torch).

block_statistics (statistics.batch_statistics for the whole map) takes the statistics from head_numbers' block step
and adds the Jensen-Shannon distances between heads, which are not per-head numbers but per pair. The distances are most of the work: for every pair of heads a < b and every query, the sum
of s log s over the keys, s = p_a + p_b (P = H(H-1)/2 pairs: at 12 heads and 512 tokens, 17 million
cells per text and layer, each a log). Over the whole batch at once each of those passes would read
and write hundreds of MB and wait on memory; here a block of queries (every head's rows and every
pair's sums, heads first, so that no step transposes) stays in the cache from one step to the next,
and padding is skipped; short texts go several to a block, where one text's ops would cost more
than their work. On the CPU s log s is a log, a multiply and a sum: torch's xlogy and special.entr
run about ten times slower than its vectorised log (torch 2.13, measured on these maps).
"""

from __future__ import annotations

from attnviz.analysis.head_numbers import CPU_CELLS_AT_ONCE, DEVICE_CELLS_AT_ONCE, LN2


def pair_slogs(weights, valid_lens: list[int], first_query: int = 0, causal: bool = False):
    """(B, P, b): every query's sum_k s log s with s = p_a + p_b, for the pairs of heads a < b in
    torch.triu_indices(H, H, 1)'s order, of a padded batch's block of queries (B, H, b, N) (the rows first_query ..
    first_query + b - 1; the whole map is the block of 0), zero on padding queries; in weights' dtype, on its device.

    valid_lens holds each text's tokens (B ints). Texts go in groups of consecutive ones (_groups): several short
    texts a block, or a long text's queries in several blocks; keys past a group's longest text are left out (the
    maps are zero there, so no sum changes). causal: query q sees keys 0 .. q alone (the weights past it are 0), so
    each block of queries leaves out the keys past its last query, half the work.
    """
    batch, num_heads, num_queries, num_keys = weights.shape
    num_pairs = num_heads * (num_heads - 1) // 2
    slogs = weights.new_zeros(batch, num_pairs, num_queries)  # (B, P, b): sum s log s of every pair's row
    lengths = [max(length, 0) for length in valid_lens]
    cells = CPU_CELLS_AT_ONCE if weights.device.type == "cpu" else DEVICE_CELLS_AT_ONCE
    for group in _groups(cells, num_heads + num_pairs, num_queries * num_keys, batch):
        length = max(lengths[b] for b in group)
        rows = min(max(length - first_query, 0), num_queries)  # the block's real queries in the group's longest text
        if rows > 0:
            texts = slice(group.start, group.stop)
            seen = first_query if causal else None  # keys past first_query + q are 0 for the block's query q
            _pair_sums(weights[texts, :, :rows, :length], cells, slogs[texts], seen)
    # A group's shorter texts have padding queries inside it, and a batch's maps hold on padding
    # queries what the layer gave them: zero them all.
    return slogs.mul_(_real_queries(weights, valid_lens, first_query))


def _real_queries(weights, valid_lens: list[int], first_query: int):
    """(B, 1, b): 1 on the block's real queries, 0 on padding (a batch's maps hold there what the layer gave them)."""
    import torch

    queries = torch.arange(first_query, first_query + weights.shape[2], device=weights.device)
    return (queries < torch.tensor(valid_lens, device=weights.device)[:, None]).to(weights.dtype)[:, None]


def _groups(cells: int, num_rows: int, map_cells: int, batch: int) -> list[range]:
    """The texts of a batch in groups of consecutive ones, each group a block of whole texts where a
    text's (row, query, key) cells are fewer than a block holds (short texts: per text, the ops'
    own cost would be most of the work), else one text a group, cut into blocks of queries.
    map_cells: a text's (query, key) cells."""
    size = max(1, cells // (num_rows * map_cells))
    return [range(first, min(first + size, batch)) for first in range(0, batch, size)]


def _pair_sums(maps, cells: int, slogs, first_query: int | None = None) -> None:
    """pair_slogs of a group of texts' maps (G, H, q, n), n the longest of them: into their rows of slogs
    (G, P, b). first_query, when given (a causal map's block from that query), cuts each block of queries' keys
    at its last query's: the weights past them are 0, their s log s 0 (tiny log tiny sums to under 1e-35 a row)."""
    import torch

    group, num_heads, num_queries, length = maps.shape
    num_pairs = slogs.shape[1]
    # The smallest normal number, added to every weight of a block: log is then finite where a weight
    # is 0 (so 0 log 0 = 0), and no sum moves by more than N times it (1e-35 in float32).
    tiny = torch.finfo(maps.dtype).tiny
    num_rows = num_heads + num_pairs
    buffers = maps.new_empty(2, max(cells, num_rows * group * length))  # a block's p and s, then log s
    start = 0
    while start < num_queries:
        stop, width = _next_block(start, num_queries, length, first_query, cells // (num_rows * group))
        shape = (num_rows, group, stop - start, width)
        rows, logs = (buffer[: shape[0] * shape[1] * shape[2] * shape[3]].view(shape) for buffer in buffers)  # (R, G, Q, n)
        heads = torch.add(maps[:, :, start:stop, :width].transpose(0, 1), tiny, out=rows[:num_heads])  # (H, G, Q, n): every head's p
        first = num_heads
        for a in range(num_heads - 1):  # head a with each later head: s = p_a + p_b
            later = num_heads - 1 - a
            torch.add(heads[a : a + 1], heads[a + 1 :], out=rows[first : first + later])
            first += later
        pairs, pair_logs = rows[num_heads:], torch.log(rows[num_heads:], out=logs[num_heads:])  # (P, G, Q, n) each
        slogs[:, :, start:stop] = pair_logs.mul_(pairs).sum(dim=-1).transpose(0, 1)  # (G, P, Q)
        start = stop


def _next_block(start: int, num_queries: int, length: int, first_query: int | None, cells: int) -> tuple[int, int]:
    """The end of _pair_sums' block of queries from start, and its keys: as many queries as keep (queries,
    keys) within cells, one at least. A causal block's queries see the keys up to its last query's (first_query
    + stop), so its first blocks, over a few keys, take more queries."""
    stop = start + 1
    while stop < num_queries:
        wider = min(num_queries, stop + max(1, (stop - start) // 4))  # a quarter more queries
        if (wider - start) * _keys(wider, length, first_query) > cells:
            break
        stop = wider
    return stop, _keys(stop, length, first_query)


def _keys(stop: int, length: int, first_query: int | None) -> int:
    """The keys that may be nonzero for a block's queries up to stop (excluded): all of them, or a causal block's."""
    return length if first_query is None else min(length, first_query + stop)


def block_statistics(attention, first_query: int, valid_lens, kinds, causal: bool = False, js: bool = True):
    """statistics.batch_statistics of the queries first_query .. first_query + b - 1 of a padded batch.

    attention (B, H, b, N) holds those queries' rows over all N keys (passes.iter_layer_blocks gives
    them; the whole map is the block of first_query 0), or under a causal mask over the first N' >=
    first_query + b (the rest are 0); valid_lens (B,) and kinds (B, N, K) are the batch's, as for batch_statistics.
    The statistics are head_numbers' block step (block_sums): each query's weighted by 1 / the queries its text's
    mean is over, so that the blocks' sums add up to batch_statistics' (H, S); and the JS distances' (H, H).
    """
    import torch

    from attnviz.analysis.head_numbers import STATISTICS, Block, block_sums

    num_tokens = kinds.shape[1]
    kinds = kinds.to(attention.device)
    key_columns = torch.cat([kinds, torch.ones_like(kinds[..., :1])], dim=-1)  # (B, N, K + 1): the kinds, then 1 (row sums)
    block = Block(attention, first_query, valid_lens, causal=causal, num_queries=num_tokens, key_columns=key_columns)
    statistics = block_sums(block, STATISTICS)  # (H, S), summed over the texts
    if not js:
        return statistics, None
    slogs = pair_slogs(block.weights, valid_lens.tolist(), first_query, causal)  # (B, P, b)
    real = block.real.to(block.weights.dtype)  # (B, N)
    query_weights = (real / real.sum(1, keepdim=True).clamp(min=1))[:, block.queries]  # (B, b): a mean over each text's real queries
    row_sums = block.key_products[..., -1]  # (B, H, b): 1 for real queries, 0 for padding
    return statistics, _batch_js_distance(slogs, block.plogp, row_sums, query_weights)


def _batch_js_distance(pair_slogs, plogp, row_sums, query_weights):
    """(H, H): js_distance of every text of a padded batch, summed over the texts.

    pair_slogs (B, P, N) holds sum_k s log s for s = p_a + p_b = 2m, the pairs a < b in triu_indices'
    order; plogp (B, H, N) sum_k p log p and row_sums (B, H, N) sum_k p of every row; query_weights
    (B, N) averages over each text's real queries. JSD = H(m) - (H(p) + H(q)) / 2, and
    sum m log m = (sum s log s - log 2 * sum s) / 2.
    """
    import torch

    num_heads = plogp.shape[1]
    first, second = torch.triu_indices(num_heads, num_heads, 1, device=plogp.device)  # (P,) each
    mlogm = (pair_slogs - LN2 * (row_sums[:, first] + row_sums[:, second])) / 2  # (B, P, N)
    divergence = ((plogp[:, first] + plogp[:, second]) / 2 - mlogm) / LN2  # (B, P, N): JSD in bits
    pairs = (divergence.clamp(0.0, 1.0).sqrt() * query_weights[:, None]).sum((0, 2))  # (P,)
    distances = torch.zeros(num_heads, num_heads, device=plogp.device, dtype=torch.float64)
    distances[first, second] = pairs.double()
    return distances + distances.T

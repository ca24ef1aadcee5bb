"""Every per-head number of attnviz, in one place: its name, one sentence of definition with its paper, and its block step.

A per-head number is a mean over a text's queries of something each query's row of weights gives (its entropy,
its weight on key 0, ...). Its entry says what that is for a block of queries (`value`: a Block in, (B, H, b) out)
and which queries the mean is over (`counted`: (B, N) over every query of the texts; None: the real ones).
`block_sums` is the one block step: a block of rows in, each text's mean's share of it out, summed over the texts:
(H, E) float64. So the blocks of a text add up to its means, texts add up to a sum over texts, and sums that add
merge (stats --file's checkpoints, Ray's shards, a long text's blocks alike: accumulate.py).

stats (`STATISTICS`), the summaries of `layers` (`SUMMARIES`) and `heads`' table (`HEAD_TABLE`) each name
theirs; the terminal, the figures, the JSON and the report read titles and definitions from `HEAD_NUMBERS`.
A new per-head number is its entry here, its test, and its line in docs/measures.md (tests/test_architecture.py
checks all three). Plain Python at import (torch only inside the steps), so the renderers can import the names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

# How many (row, query, key) cells a block holds: on the CPU about the size of L2 (2**19 float32 is
# 2 MB); 12 heads and their 66 pairs at 512 tokens: 13 queries a block. Elsewhere (CUDA) fewer, larger blocks.
CPU_CELLS_AT_ONCE = 2**19
DEVICE_CELLS_AT_ONCE = 2**25
LN2 = math.log(2)  # nats per bit
LOCAL_WINDOW = 8  # the local band's default half-width w: keys with |i - j| <= w
KEY_KINDS = ("cls", "sep", "punctuation")  # the numbers that are shares on a kind of key (key_columns' columns)

CLARK = 'Clark et al. 2019, "What Does BERT Look At? An Analysis of BERT\'s Attention" (arXiv 1906.04341)'
VOITA = 'Voita et al. 2019, "Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting" (arXiv 1905.09418)'
VIG = 'Vig & Belinkov 2019, "Analyzing the Structure of Attention in a Transformer Language Model" (arXiv 1906.04284)'
SINK_PAPER = "Gu et al., ICLR 2025, \"When Attention Sink Emerges in Language Models: An Empirical View\" (arXiv 2410.10781)"
LONGFORMER = 'Beltagy et al. 2020, "Longformer: The Long-Document Transformer" (arXiv 2004.05150), its sliding window'
TRANSFORMER_LENS = "Nanda & Bloom 2022, TransformerLens (transformer_lens/head_detector.py, its default measure 'mul')"
OLSSON = 'Olsson et al. 2022, "In-context Learning and Induction Heads" (arXiv 2209.11895), their prefix-matching score'
STREAMING = (
    'Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks" (arXiv 2309.17453), its S sinks; '
    'Xiao et al. 2024, "DuoAttention" (arXiv 2410.10819), its recent window W'
)
GUPTA = 'Gupta et al. 2021, "Memory-efficient Transformers via Top-k Attention" (arXiv 2106.06899)'
TOP_K = (16, 64, 256)  # the top-k coverages' k


@dataclass(frozen=True)
class RoleSettings:
    """What the role numbers of a Block depend on: TransformerLens's exclusions (its detect_head's exclude_bos and
    exclude_current_token) and the streaming share's S sinks and W recent keys (StreamingLLM's 4, DuoAttention's 256)."""

    exclude_bos: bool = False
    exclude_current: bool = False
    sinks: int = 4
    recent: int = 256


class Block:
    """What a block step receives: a block of queries' weights and what it needs to know about their texts.

    weights (B, H, b, K): the rows of queries first_query .. first_query + b - 1 of a padded batch of texts, over
    their first K keys (K may stop at the block's last query + 1 under a causal mask: the rest weigh 0). valid_lens
    (B,) counts each text's keys; query_lens (B,) its queries (self-attention: the same); num_queries is the batch's
    padded query count. key_columns (B, Nk, C): KEY_KINDS' 0/1 columns of each text's keys, then a column of ones
    (statistics.key_kind_columns); token_ids (B, Nk): each text's token ids; window: the local band's w; roles: the
    template scores' exclusions and the streaming share's S and W.
    The quantities several numbers share (each row's Σ p log p, ...) are computed once, when first asked for.
    """

    def __init__(self, weights, first_query: int, valid_lens, *, causal: bool, num_queries: int, query_lens=None,
                 key_columns=None, token_ids=None, window: int = LOCAL_WINDOW, roles: RoleSettings = RoleSettings()):  # fmt: skip
        import torch

        # float32 keeps the sums within 1e-6 of float64, at half the cost; float64 stays float64 (stats --words).
        self.weights = weights if weights.dtype == torch.float64 else weights.float()  # (B, H, b, K)
        self.first_query, self.causal, self.window = first_query, causal, window
        self.num_queries = num_queries
        device = self.weights.device
        self.valid_lens = valid_lens.to(device)  # (B,)
        self.query_lens = self.valid_lens if query_lens is None else query_lens.to(device)  # (B,)
        self.key_columns = None if key_columns is None else key_columns.to(device, self.weights.dtype)  # (B, Nk, C)
        self.token_ids = None if token_ids is None else token_ids.to(device)  # (B, Nk)
        self.roles = roles
        self.positions = torch.arange(num_queries, device=device)  # (N,): every query of the texts
        self.queries = self.positions[first_query : first_query + self.weights.shape[2]]  # (b,): the block's

    @cached_property
    def real(self):
        """(B, N) bool: the texts' real queries (not padding)."""
        return self.positions < self.query_lens[:, None]

    @cached_property
    def visible_all(self):
        """(B, N): how many keys each of the texts' queries may see."""
        import torch

        lens = self.valid_lens[:, None]
        return torch.minimum(self.positions + 1, lens) if self.causal else lens.expand(-1, len(self.positions))

    @cached_property
    def visible(self):
        """(B, 1, b) or (B, 1, 1): how many keys each of the block's queries may see: under a causal mask 0 .. i, else all its text's."""
        import torch

        return torch.minimum(self.queries + 1, self.valid_lens[:, None, None]) if self.causal else self.valid_lens[:, None, None]

    @cached_property
    def real_in_block(self):
        """(B, 1, b) in the weights' dtype: 1 on the block's real queries, 0 on padding (the layer left weights there)."""
        return self.real[:, None, self.first_query : self.first_query + self.weights.shape[2]].to(self.weights.dtype)

    @cached_property
    def plogp(self):
        """(B, H, b): Σ_k p log p of every row (0 log 0 = 0)."""
        return row_plogp(self.weights).mul_(self.real_in_block)

    @cached_property
    def key_products(self):
        """(B, H, b, C): Σ_k p_k key_columns[k] of every row (the shares on each kind of key, then the row's sum)."""
        batch, num_heads, rows, width = self.weights.shape
        columns = self.key_columns[:, :width]  # (B, K, C)
        products = (self.weights.reshape(batch, -1, width) @ columns).view(batch, num_heads, rows, -1)  # (B, H b, K) @ (B, K, C)
        return products.mul_(self.real_in_block[..., None])

    @cached_property
    def distance(self):
        """(B, H, b): Σ_k p_k |i - k| of every row, in tokens."""
        return key_distance(self.weights, self.first_query).mul_(self.real_in_block)

    def on_key(self, keys):
        """(B, H, b): each query's weight on its key of keys ((b,) or (B, b)), 0 where that key is not among the K."""
        width = self.weights.shape[-1]
        keys = keys.expand(self.weights.shape[0], self.weights.shape[2])  # (B, b)
        inside = ((keys >= 0) & (keys < width)).to(self.weights.dtype)[:, None]  # (B, 1, b)
        index = keys.clamp(0, width - 1)[:, None, :, None].expand(*self.weights.shape[:3], 1)  # (B, H, b, 1)
        return self.weights.gather(-1, index).squeeze(-1) * inside

    # ---- the role numbers (roles' templates, streaming share, top-k coverage): self-attention, token_ids given ----

    @cached_property
    def query_ids(self):
        """(B, b, 1): the token ids of the block's queries (self-attention: the queries are the keys)."""
        return self.token_ids[:, self.queries, None]

    @cached_property
    def earlier_same(self):
        """(B, b, K) bool: the keys j < i that hold the query's token (the duplicate-token template before exclusions)."""
        width = self.weights.shape[-1]
        keys = self.positions[:width]  # (K,): self-attention, so N >= K
        return (self.token_ids[:, None, :width] == self.query_ids) & (keys < self.queries[:, None])

    def template(self, induction: bool, excluding: bool = True):
        """(B, b, K) in the weights' dtype: TransformerLens's duplicate-token template (key j < i holds the query's
        token) or its induction template (key j >= 1 follows an earlier occurrence j - 1 < i of the query's token),
        with the keys roles' exclusions take out (key 0 for exclude_bos, key i for exclude_current) set to 0.
        The induction template's cell (i, j) is the duplicate-token one's (i, j - 1): the same cells moved one key to
        the right, one copy where comparing the ids again took five passes over the block's (b, K) cells."""
        import torch

        keys = self.positions[: self.weights.shape[-1]]  # (K,)
        cells = self.earlier_same
        if induction:
            moved = torch.zeros_like(cells)
            moved[..., 1:] = cells[..., :-1]
            cells = moved
        if excluding and self.roles.exclude_bos:
            cells = cells & (keys >= 1)
        if excluding and self.roles.exclude_current:
            cells = cells & (keys != self.queries[:, None])
        return cells.to(self.weights.dtype)

    def on_template(self, template):
        """(B, H, b): Σ_k A_ik T_ik of every row, for a template T (B, b, K)."""
        import torch

        return torch.einsum("bhqk,bqk->bhq", self.weights, template)

    @cached_property
    def kept_weight(self):
        """(B, H, b): Σ_k A'_ik, the row's weight left by roles' exclusions (TransformerLens's denominator, a row at a
        time): the kept weights summed, never the row's sum less the excluded ones, which cancels in float32 where a
        head puts nearly all its weight on key 0 and key i (a kept 1e-4 of a row would keep 3 digits)."""
        import torch

        if not (self.roles.exclude_bos or self.roles.exclude_current):
            return self.weights.sum(dim=-1)
        keys = self.positions[: self.weights.shape[-1]]  # (K,): self-attention, so N >= K
        kept = torch.ones(len(self.queries), len(keys), dtype=torch.bool, device=keys.device)  # (b, K)
        if self.roles.exclude_bos:
            kept &= keys >= 1
        if self.roles.exclude_current:
            kept &= keys != self.queries[:, None]
        return torch.einsum("bhqk,qk->bhq", self.weights, kept.to(self.weights.dtype))

    @cached_property
    def earlier_occurrence(self):
        """(B, N) bool: the texts' queries whose token occurred before them (the query's own id sorted after its
        first occurrence's, a stable sort of each text's ids)."""
        import torch

        ids = self.token_ids[:, : self.num_queries]  # (B, N)
        ordered, order = ids.sort(dim=-1, stable=True)
        repeated = torch.zeros_like(ordered, dtype=torch.bool)
        repeated[:, 1:] = ordered[:, 1:] == ordered[:, :-1]  # each but the first of a run of equal ids
        return torch.zeros_like(repeated).scatter(1, order, repeated) & self.real

    @cached_property
    def top_weights(self):
        """(B, H, b, len(TOP_K)): each row's sum of its k largest weights for each k of TOP_K (all its weight where the
        row has k keys or fewer). Each k's largest are chosen among the next larger k's, unsorted, and on the weights'
        bits read as integers: a weight is never negative, and its bits order as it does, so the same weights are
        chosen (no NaN to place). On the CPU NumPy's partition chooses them in place, in a cache-sized chunk of rows
        copied into row_chunks' buffer (an exact selection, 5 times quicker than torch's topk on one thread of the
        project's Xeon, whose AVX-512 NumPy's selection uses; a copy of the whole block for np.partition cost a third
        of the time: bench/RESULTS.md); elsewhere torch's topk."""
        import numpy as np
        import torch

        as_integers = torch.int64 if self.weights.dtype == torch.float64 else torch.int32
        on_cpu = self.weights.device.type == "cpu"
        sums = self.weights.new_empty(self.weights.shape[:-1].numel(), len(TOP_K))  # (rows, len(TOP_K))
        for start, chunk, room in row_chunks(self.weights, room=on_cpu):
            largest = chunk.view(as_integers)  # (r, K)
            if on_cpu:  # copied into the chunks' buffer, partitioned there in place
                source, largest = largest.numpy(), room.view(as_integers).numpy()
                np.copyto(largest, source)
            for k in sorted(TOP_K, reverse=True):
                width = largest.shape[-1]
                if k < width and on_cpu:  # (r, k): the k largest, in no order
                    largest.partition(width - k, axis=-1)
                    largest = largest[:, width - k :]
                elif k < width:
                    largest = largest.topk(k, dim=-1, sorted=False).values
                sums[start : start + len(chunk), TOP_K.index(k)] = torch.as_tensor(largest).view(self.weights.dtype).sum(dim=-1)
        return sums.view(*self.weights.shape[:-1], len(TOP_K))


def _previous_template(block):
    """Each row's weight on key i - 1 (TransformerLens's previous-token template), 0 on key 0 under exclude_bos."""
    previous = block.queries - 1
    return block.on_key(previous) * ((previous >= 1) | (not block.roles.exclude_bos))


def _streaming(block):
    """Each row's weight on the first S keys and on the W keys ending at the query (i - W + 1 .. i), each key once."""
    import torch

    weights, recent = block.weights, block.roles.recent
    width = weights.shape[-1]
    sinks = min(block.roles.sinks, width)  # S past the keys: every key a sink (and an S of 10**23 fits no tensor)
    span = min(recent, width)
    band = block.queries[:, None] + torch.arange(1 - span, 1, device=weights.device)  # (b, span): i - span + 1 .. i
    inside = (band >= sinks) & (band < width)  # keys below S are the sinks'
    index = band.clamp(0, width - 1).expand(*weights.shape[:2], -1, -1)  # (B, H, b, span)
    return weights[..., :sinks].sum(dim=-1) + (weights.gather(-1, index) * inside).sum(dim=-1)


def _local(block):
    """Each row's weight within |i - j| <= w, gathered: 2w + 1 keys a row, not K."""
    import torch

    weights = block.weights
    width = weights.shape[-1]
    window = min(block.window, width - 1)  # a band past the keys holds every key (and a w of 10**23 fits no tensor)
    offsets = torch.arange(-window, window + 1, device=weights.device)  # (2w+1,)
    band = block.queries[:, None] + offsets[None, :]  # (b, 2w+1)
    inside = (band >= 0) & (band < width)
    index = band.clamp(0, width - 1).expand(*weights.shape[:2], -1, -1)  # (B, H, b, 2w+1)
    return (weights.gather(-1, index) * inside).sum(dim=-1)


def row_chunks(weights, room: bool = True):
    """weights' rows (..., K) a cache-sized chunk at a time: (first row, rows (r, K), room (r, K)), room a buffer of the
    weights' dtype to work in, one for every chunk: a new tensor of the block's size would cost its page faults again,
    every block. room=False: no buffer (None in its place), for work that makes its own tensors."""
    num_keys = weights.shape[-1]
    rows = weights.reshape(-1, num_keys)  # a view of a block's weights
    cells = CPU_CELLS_AT_ONCE if weights.device.type == "cpu" else DEVICE_CELLS_AT_ONCE
    step = max(1, cells // num_keys)
    buffer = weights.new_empty(min(step, rows.shape[0]) * num_keys) if room else None
    for start in range(0, rows.shape[0], step):
        chunk = rows[start : start + step]
        yield start, chunk, None if buffer is None else buffer[: chunk.numel()].view(chunk.shape)


def row_plogp(weights):
    """(...): sum_k p log p of every row of weights (..., K), a chunk of rows at a time (row_chunks)."""
    import torch

    tiny = torch.finfo(weights.dtype).tiny  # log(p + tiny) is finite where p is 0: 0 log 0 = 0
    sums = weights.new_empty(weights.shape[:-1].numel())
    for start, chunk, room in row_chunks(weights):
        logs = torch.add(chunk, tiny, out=room).log_()
        sums[start : start + len(chunk)] = logs.mul_(chunk).sum(dim=-1)
    return sums.view(weights.shape[:-1])


def key_distance(weights, first_query: int = 0):
    """(B, H, b): each row's sum_k p_k |q - k| of the block of queries first_query .. first_query + b - 1 (B, H, b, K).

    The keys before the block's first query lie left of every row and those after its last query right of it:
    over each the sum is two matrix products, sum_k p_k and sum_k p_k times the key's distance from the block's
    edge, every term positive (no cancellation); only the keys of the block's own queries take |q - k| cell by cell.
    """
    import torch

    num_queries, num_keys = weights.shape[-2:]
    left, right = min(first_query, num_keys), min(first_query + num_queries, num_keys)
    device, dtype = weights.device, weights.dtype
    queries = torch.arange(first_query, first_query + num_queries, device=device, dtype=dtype)  # (b,)
    keys = torch.arange(num_keys, device=device, dtype=dtype)  # (K,)
    # The block's own keys, left to right: |q - k| a cell at a time.
    distance = (weights[..., left:right] * (queries[:, None] - keys[left:right]).abs()).sum(dim=-1)  # (B, H, b)
    if left:  # keys 0 .. left - 1: |q - k| = (q - left) + (left - k)
        edge = torch.stack([torch.ones_like(keys[:left]), left - keys[:left]], dim=-1)  # (left, 2)
        total, farther = (weights[..., :left] @ edge).unbind(-1)  # (B, H, b) each
        distance += (queries - left) * total + farther
    if right < num_keys:  # keys right .. K - 1: |q - k| = (right - 1 - q) + (k - right + 1)
        edge = torch.stack([torch.ones_like(keys[right:]), keys[right:] - (right - 1)], dim=-1)  # (K - right, 2)
        total, farther = (weights[..., right:] @ edge).unbind(-1)
        distance += (right - 1 - queries) * total + farther
    return distance


@dataclass(frozen=True)
class HeadNumber:
    """One per-head number: a mean over a text's queries of value(block) (B, H, b), over counted(block)'s queries."""

    name: str  # as in arrays, stats.csv, stats.json, summaries.json
    title: str  # as figures, tables and the report title it
    definition: str  # one sentence
    paper: str  # where it comes from (attnviz's own changes said in the definition)
    value: Callable  # Block -> (B, H, b): each query's number (anything on padding queries: they are not counted)
    counted: Callable | None = None  # Block -> (B, N) bool: the queries the mean is over; None: every real query

    def record(self) -> dict:
        """{"name": title, "definition": ..., "paper": ...}: as the report's record holds it."""
        return {"name": self.title, "definition": self.definition, "paper": self.paper}


ENTRIES = (
    HeadNumber("entropy", "entropy", "mean over queries of the row's entropy, in nats", CLARK, lambda block: -block.plogp),
    HeadNumber(
        "relative_entropy",
        "relative entropy",
        "mean over queries of the row's entropy / log(keys the query may see): 1 uniform, 0 one-hot; a "
        "query that sees one key (the first, under a causal mask) has no choice and is left out",
        f"attnviz's, Clark et al.'s entropy over its largest value: {CLARK}",
        lambda block: -block.plogp / block.visible.clamp(min=2).to(block.weights.dtype).log(),
        lambda block: block.real & (block.visible_all > 1),  # a query that sees one key has no choice to make
    ),
    HeadNumber("mean_max", "mean max", "mean over queries of the row's largest weight (a head's confidence)", VOITA,
               lambda block: block.weights.amax(dim=-1).mul_(block.real_in_block)),
    HeadNumber("cls", "[CLS]", "share on [CLS]: the mean over queries of the weight on it", CLARK,
               lambda block: block.key_products[..., 0]),
    HeadNumber("sep", "[SEP]", "share on [SEP]: the mean over queries of the weight on it", CLARK,
               lambda block: block.key_products[..., 1]),
    HeadNumber("punctuation", "punctuation", "share on tokens made only of Unicode punctuation (categories P*)", CLARK,
               lambda block: block.key_products[..., 2]),
    HeadNumber("same", "same", "share on the query's own token, A[i, i]", CLARK, lambda block: block.on_key(block.queries)),
    HeadNumber("previous", "previous token", "share on key i - 1, over the queries that have one", CLARK,
               lambda block: block.on_key(block.queries - 1), lambda block: block.real & (block.positions >= 1)),
    HeadNumber("next", "next token", "share on key i + 1, over the queries that have one", CLARK,
               lambda block: block.on_key(block.queries + 1), lambda block: block.positions + 1 < block.valid_lens[:, None]),
    HeadNumber("distance", "mean attention distance", "mean over queries of Σ_j A_ij |i - j|, in tokens", VIG,
               lambda block: block.distance),
    HeadNumber(
        "sink",
        "attention sink",
        "share on the first token (key 0): a decoder's <s>/BOS where its tokenizer adds one, else its first "
        "word; an encoder's [CLS] (BERT) or <s> (RoBERTa)",
        SINK_PAPER,
        lambda block: block.weights[..., 0],
    ),
    HeadNumber(
        "last",
        "last token",
        "share on the text's last token: an encoder's [SEP] (BERT) or </s>; in a causal model only the last "
        "query sees it, so it is near 0 there",
        CLARK,
        lambda block: block.on_key(block.valid_lens[:, None] - 1),
    ),
    HeadNumber("local", "local share", "share on the keys within the local band |i - j| <= w (w: the window, default 8)",
               LONGFORMER, _local),
    HeadNumber("previous_token_template", "previous-token template",
               "weight on key i - 1 (TransformerLens's previous-token template), the numerator of its score over "
               "template_weight, with its exclusions", TRANSFORMER_LENS, _previous_template),
    HeadNumber("duplicate_token_template", "duplicate-token template",
               "weight on the earlier keys j < i that hold the query's token (TransformerLens's duplicate-token "
               "template), the numerator of its score over template_weight, with its exclusions", TRANSFORMER_LENS,
               lambda block: block.on_template(block.template(induction=False))),
    HeadNumber("induction_template", "induction template",
               "weight on the keys j that follow an earlier occurrence j - 1 < i of the query's token "
               "(TransformerLens's induction template), the numerator of its score over template_weight, with its "
               "exclusions", TRANSFORMER_LENS, lambda block: block.on_template(block.template(induction=True))),
    HeadNumber("template_weight", "template weight",
               "the row's weight left by the exclusions (key 0 with exclude_bos, key i with exclude_current), so that "
               "a template's score Σ A·P / Σ A over the whole map is its mean over this mean", TRANSFORMER_LENS,
               lambda block: block.kept_weight),
    HeadNumber("prefix_matching", "prefix matching",
               "weight on the keys that follow the earlier occurrences of the query's token, over the queries whose "
               "token occurred before", OLSSON,
               lambda block: block.on_template(block.template(induction=True, excluding=False)),
               lambda block: block.earlier_occurrence),
    HeadNumber("streaming", "streaming share",
               "weight on the first S keys (sinks) and the W keys ending at the query, i - W + 1 to i (S = 4, "
               "W = 256 unless set)", STREAMING, _streaming),
    *(HeadNumber(f"top_{k}", f"top-{k} coverage", f"weight on the row's {k} largest weights (all of it where it "
                 f"has {k} keys or fewer)", f"attnviz's share, after the top-k attention of {GUPTA}",
                 lambda block, column=column: block.top_weights[..., column]) for column, k in enumerate(TOP_K)),
)  # fmt: skip
HEAD_NUMBERS = {entry.name: entry for entry in ENTRIES}

# The statistics of `attnviz stats`, in this order in arrays, stats.csv and stats.json (Clark et al.'s, and theirs).
STATISTICS = ("entropy", "relative_entropy", "mean_max", "cls", "sep", "punctuation", "same", "previous", "next", "distance")
# Every head of every layer summarised (`attnviz layers`, summaries.json), in this order in its arrays, tables and figure.
SUMMARY_NAMES = ("sink", "last", "relative_entropy", "distance", "local", "previous")
# `attnviz heads`' table of one layer's heads.
HEAD_TABLE = ("entropy", "relative_entropy", "mean_max")
# `attnviz roles`' numbers over the user's text (the templates' scores are their numerators over template_weight).
TEMPLATES = ("previous_token_template", "duplicate_token_template", "induction_template")
ROLE_NUMBERS = (*TEMPLATES, "template_weight", "streaming", *(f"top_{k}" for k in TOP_K))


def block_sums(block: Block, names) -> object:
    """The block step: (H, E) float64, for each of names, each text's mean's share in this block, summed over the texts.

    Each query's number is weighted by 1 / the queries its text's mean is over (over all N, not only the block's),
    so that the blocks of a batch add up to the sum over its texts of each text's mean.
    """
    import torch

    entries = [HEAD_NUMBERS[name] for name in names]
    block_rows = slice(block.first_query, block.first_query + block.weights.shape[2])
    counts = torch.stack([(entry.counted or _real)(block) for entry in entries], dim=-1).to(block.weights.dtype)  # (B, N, E)
    query_weights = (counts / counts.sum(1, keepdim=True).clamp(min=1))[:, block_rows]  # (B, b, E): each text's mean
    columns = torch.stack([entry.value(block) for entry in entries], dim=-1)  # (B, H, b, E)
    # In the weights' dtype within a block (a few hundred queries), float64 across blocks and texts.
    return (columns * query_weights[:, None]).sum((0, 2)).double()  # (H, E)


def _real(block):
    return block.real

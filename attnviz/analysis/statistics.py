"""Per-head statistics of attention weights (rows are queries, columns keys, rows sum to 1).

For `heads`: a summary per head of one layer. For `stats` and `layers`: the per-head statistics
of Clark et al. 2019 (three of them defined differently: CLARK_DIFFERENCES), labels for clear
patterns, and the Jensen-Shannon distances between the heads of a layer (attention rollout is in
rollout.py). Every number's name, definition and block step are analysis/head_numbers.py's; head_statistics and
js_distance here are the whole-map definitions in NumPy that the tests hold the blocks to. Plain NumPy at import
(torch only inside the batch functions), so the renderers can import it.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

from attnviz.analysis.accumulate import MergeableSums, as_float64
from attnviz.analysis.head_numbers import HEAD_TABLE, KEY_KINDS, STATISTICS
from attnviz.run_data import map_rows


@dataclass
class HeadSummary:
    """One head of one layer in `heads`' table: head_numbers' HEAD_TABLE numbers, and each query's top key."""

    head: int
    entropy: float  # mean row entropy in nats
    relative_entropy: float  # mean over queries of entropy / log(keys it may see): 1 uniform, 0 one-hot
    mean_max: float  # mean over queries of the largest weight in the row
    top_keys: list[int]  # for each query, the key it attends to most


def row_entropy(attention: np.ndarray) -> np.ndarray:
    """Entropy in nats of every row of (..., Nq, Nk), with 0 log 0 = 0."""
    logs = np.log(attention, where=attention > 0, out=np.zeros_like(attention))
    return -(attention * logs).sum(axis=-1)


def visible_keys(num_queries: int, num_keys: int, causal: bool = False) -> np.ndarray:
    """(Nq,): how many keys each query may see: all Nk, or with causal query i sees keys 0..i."""
    return np.minimum(np.arange(1, num_queries + 1), num_keys) if causal else np.full(num_queries, num_keys)


def relative_entropy(attention: np.ndarray, causal: bool = False) -> np.ndarray:
    """(H,): for attention (H, Nq, Nk), the mean over queries of entropy / log(keys the query may see).

    1 when every row is uniform over the keys its query may see, 0 when each is one-hot. A query
    that sees one key has no choice to make and is left out (0 when no query has a choice).
    `heads` and `stats` both report this number.
    """
    weights = np.asarray(attention, dtype=np.float64)  # (H, Nq, Nk)
    visible = visible_keys(*weights.shape[1:], causal)  # (Nq,)
    choice = visible > 1
    if not choice.any():
        return np.zeros(weights.shape[0])
    return (row_entropy(weights)[:, choice] / np.log(visible[choice])).mean(axis=-1)


SUMMARY_ROWS = 256  # queries per block when a map's head summaries are read (a long text's from its map on disk)


def summarize_heads(attention, causal: bool = False, rows: int = SUMMARY_ROWS) -> list[HeadSummary]:
    """One summary per head of attention (H, Nq, Nk) (an array, or a long map's memmap); causal: each query saw only
    keys 0..i. HEAD_TABLE's numbers through head_numbers' block step, SUMMARY_ROWS queries at a time, so no map is
    made whole in memory: in the map's dtype within a block (float64 stays float64), float64 across blocks; under a
    causal mask a block's keys stop at its last query's (the rest are 0)."""
    import torch

    from attnviz.analysis.head_numbers import Block, block_sums

    num_heads, num_queries, num_keys = attention.shape
    sums = torch.zeros(num_heads, len(HEAD_TABLE), dtype=torch.float64)
    top_keys = torch.empty((num_heads, num_queries), dtype=torch.int64)
    keys, queries = torch.tensor([num_keys]), torch.tensor([num_queries])
    for start in range(0, num_queries, rows):
        stop = min(start + rows, num_queries)
        width = min(stop, num_keys) if causal else num_keys
        block = torch.from_numpy(np.stack([map_rows(attention, head, start, stop)[:, :width] for head in range(num_heads)]))  # (H, b, K)
        sums += block_sums(Block(block[None], start, keys, causal=causal, num_queries=num_queries, query_lens=queries), HEAD_TABLE)
        top_keys[:, start:stop] = block.argmax(dim=-1)  # (H, b): the first key of a tie
    values = dict(zip(HEAD_TABLE, sums.T.tolist()))  # name -> H floats
    return [
        HeadSummary(head=h, top_keys=top_keys[h].tolist(), **{name: heads[h] for name, heads in values.items()})
        for h in range(num_heads)
    ]


# ---- statistics of every head of a model, across layers and texts (`attnviz stats`) ------------

# Over words (stats --words: maps merged by Clark et al.'s rule, measure.WordBatch), the same definitions
# with words for tokens: previous and next are the words beside, distance counts words.

# A head gets the label of its largest share among these when that share is at least
# SHARE_THRESHOLD: then, on average, most of every query's weight goes to that one kind of key.
SHARE_LABELS = {
    "previous": "previous-token",
    "next": "next-token",
    "same": "same-token",
    "cls": "[CLS]",
    "sep": "[SEP]",
}
SHARE_THRESHOLD = 0.5
# Otherwise "broad" when its rows are within 10 % of uniform entropy. A random layer over BERT's
# hidden states scores above 0.99; the bundled BERT's heads average 0.55 (sample_inputs/en.txt).
BROAD_LABEL = "broad"
BROAD_THRESHOLD = 0.9
LABELS = (*SHARE_LABELS.values(), BROAD_LABEL)

JS_CELLS_AT_ONCE = 2**22  # js_distance works on this many (pair, query, key) cells at a time

# Where attnviz's `stats` defines a statistic otherwise than Clark et al. 2019 ("What Does BERT
# Look At?"), in the words that --help, docs/measures.md and stats.json use.
CLARK_DIFFERENCES = {
    "js_distance": "the Jensen-Shannon distance (the square root of the divergence, base-2 logarithms, "
    "0 to 1) averaged over queries; Clark et al. sum the Jensen-Shannon divergence over tokens",
    "punctuation": "any token made only of Unicode punctuation (categories P*, e.g. ' or the ideographic full stop U+3002); "
    "Clark et al. count \".\" and \",\"",
    "average": "over several texts, each statistic is averaged per text (over its queries), then over "
    "the texts (every text weighs the same); Clark et al. average over all tokens of their data",
}

# --causal over a layer past the first (and `stats` and `layers`, over every layer): the layer's input
# comes from the model's own bidirectional pass, which has already mixed later tokens into every
# token; only attnviz's layer is masked. Layer 0's input, the embeddings, holds no other token.
CAUSAL_OVER_BIDIRECTIONAL = "causal mask over a bidirectional model's hidden states"
CAUSAL_OVER_BIDIRECTIONAL_DETAIL = (
    "each layer's input comes from the model's own bidirectional pass and already holds later tokens; "
    "only the attention weights of attnviz's layer are masked, so this is not a causal model"
)


def causal_note(over_bidirectional: bool) -> str | None:
    """What a causal mask means over a bidirectional model's hidden states; None where it is not."""
    return f"{CAUSAL_OVER_BIDIRECTIONAL}: {CAUSAL_OVER_BIDIRECTIONAL_DETAIL}" if over_bidirectional else None


def model_causal_words(family: str, stack: str | None) -> str:
    """Why a decoder's attention is causal, in words: the mask is the model's own."""
    if stack == "decoder":
        return f"{family}'s decoder attends from each token to itself and the tokens before it"
    return f"{family} is a decoder, each token attends to itself and the tokens before it"


def run_causal_note(run, every_layer: bool = False) -> str | None:
    """The causal_note of a run's JSON: a decoder's own mask, or --causal's over a bidirectional model's hidden states.

    every_layer: the run stands for every layer (stats, layers), not only its own layer, whose
    input holds no later token at layer 0.
    """
    if run.model_causal:
        return f"causal: {model_causal_words(run.family, run.stack)}"
    return causal_note(run.causal and (every_layer or run.layer > 0))


CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"


# The marks of a space before a word: byte-level BPE's (GPT-2, Llama 3, Qwen) and SentencePiece's (T5, Llama 2).
SPACE_MARKS = ("Ġ", "▁")


def is_punctuation(token: str) -> bool:
    """True for a token made only of Unicode punctuation (categories P*), e.g. "." "," "。" "'"; "Ġ," (" ,") too."""
    text = token.removeprefix("##")  # a WordPiece continuation of punctuation is still punctuation
    if text[:1] in SPACE_MARKS:  # a space before punctuation, as byte-level BPE and SentencePiece write it
        text = text[1:]
    return bool(text) and all(unicodedata.category(char).startswith("P") for char in text)


def absent_key_kinds_note(family: str, tokens: list[str]) -> str | None:
    """What the cls and sep shares mean when a text's tokens hold no [CLS] or [SEP] (GPT-2's, Llama's): None when they hold both."""
    absent = [token for token in (CLS_TOKEN, SEP_TOKEN) if token not in tokens]
    if not absent:
        return None
    shares = " and ".join(token.strip("[]").lower() for token in absent)
    return (
        f"the tokens {family} reads here hold no {' or '.join(absent)}: the {shares} "
        f"share{'s are' if len(absent) > 1 else ' is'} 0 and {'their labels' if len(absent) > 1 else 'its label'} n/a"
    )


def key_kinds(tokens: list[str]) -> dict[str, np.ndarray]:
    """Boolean masks (N,) of the keys of each of KEY_KINDS: [CLS], [SEP] and punctuation."""
    return {
        "cls": np.array([token == CLS_TOKEN for token in tokens], dtype=bool),
        "sep": np.array([token == SEP_TOKEN for token in tokens], dtype=bool),
        "punctuation": np.array([is_punctuation(token) for token in tokens], dtype=bool),
    }


def head_statistics(attention: np.ndarray, tokens: list[str], causal: bool = False) -> np.ndarray:
    """(H, len(STATISTICS)): the statistics of every head of self-attention (H, N, N) over one text.

    tokens are the N tokens (queries and keys); with causal, query i may see keys 0..i only,
    which is what "uniform" means for its relative entropy.
    """
    weights = np.asarray(attention, dtype=np.float64)  # (H, N, N)
    num_heads, num_queries, num_keys = weights.shape
    if num_queries != num_keys or len(tokens) != num_keys:
        raise ValueError(f"self-attention over {len(tokens)} tokens needs (H, N, N) weights, got {weights.shape}")
    positions = np.arange(num_keys)
    entropy = row_entropy(weights)  # (H, N)
    kinds = key_kinds(tokens)
    offsets = np.abs(positions[:, None] - positions[None, :])  # (N, N): |i - j|
    values = {
        "entropy": entropy.mean(axis=-1),
        "relative_entropy": relative_entropy(weights, causal),
        "mean_max": weights.max(axis=-1).mean(axis=-1),
        **{kind: weights[:, :, mask].sum(axis=-1).mean(axis=-1) for kind, mask in kinds.items()},
        "same": np.diagonal(weights, axis1=1, axis2=2).mean(axis=-1),
        # offset -1 holds A[i, i-1] for i = 1..N-1: query i on the key before it.
        "previous": _mean_or_zero(np.diagonal(weights, offset=-1, axis1=1, axis2=2)),
        # offset +1 holds A[i, i+1] for i = 0..N-2: query i on the key after it.
        "next": _mean_or_zero(np.diagonal(weights, offset=1, axis1=1, axis2=2)),
        "distance": (weights * offsets).sum(axis=-1).mean(axis=-1),
    }
    return np.stack([values[name] for name in STATISTICS], axis=-1)  # (H, S)


def _mean_or_zero(rows: np.ndarray) -> np.ndarray:
    """Mean over the last axis of (H, n); zeros when n is 0 (a one-token text has no neighbours)."""
    return rows.mean(axis=-1) if rows.shape[-1] else np.zeros(rows.shape[0])


def head_label(values: dict[str, float]) -> str | None:
    """The label of a head from its statistics (names as in STATISTICS), or None when no pattern is clear.

    The largest share among SHARE_LABELS wins when it reaches SHARE_THRESHOLD (ties go to the
    first in SHARE_LABELS); else "broad" when relative entropy reaches BROAD_THRESHOLD.
    """
    strongest = max(SHARE_LABELS, key=lambda name: values[name])
    if values[strongest] >= SHARE_THRESHOLD:
        return SHARE_LABELS[strongest]
    if values["relative_entropy"] >= BROAD_THRESHOLD:
        return BROAD_LABEL
    return None


def label_strength(values: dict[str, float], label: str) -> float:
    """The statistic that earned a head its label: its share, or its relative entropy for broad."""
    if label == BROAD_LABEL:
        return values["relative_entropy"]
    return values[next(name for name, named in SHARE_LABELS.items() if named == label)]


def js_distance(attention: np.ndarray) -> np.ndarray:
    """(H, H): the Jensen-Shannon distance between every two heads of (H, Nq, Nk), averaged over queries.

    For query i and heads a, b with rows p = A_a[i], q = A_b[i] and m = (p + q) / 2:
    JSD = (KL(p || m) + KL(q || m)) / 2 with base-2 logarithms, distance = sqrt(JSD). It lies in
    [0, 1]: 0 for identical rows, 1 for rows with no key in common. Symmetric, 0 on the diagonal.
    """
    weights = np.asarray(attention, dtype=np.float64)  # (H, Nq, Nk)
    num_heads, num_queries, num_keys = weights.shape
    # JSD = H(m) - (H(p) + H(q)) / 2 in bits: the same number as the two KLs, with one log per cell.
    own = row_entropy(weights) / np.log(2)  # (H, Nq)
    first, second = np.triu_indices(num_heads, k=1)  # every pair of heads once: (P,) each
    distances = np.zeros((num_heads, num_heads))
    pairs_at_once = max(1, JS_CELLS_AT_ONCE // (num_queries * num_keys))  # bounds the memory of long texts
    for start in range(0, len(first), pairs_at_once):
        a, b = first[start : start + pairs_at_once], second[start : start + pairs_at_once]
        middle = (weights[a] + weights[b]) / 2  # (P', Nq, Nk)
        divergence = row_entropy(middle) / np.log(2) - (own[a] + own[b]) / 2  # (P', Nq)
        distances[a, b] = np.sqrt(np.clip(divergence, 0.0, 1.0)).mean(axis=-1)
    return distances + distances.T


def batch_statistics(attention, valid_lens, kinds, causal: bool = False, js: bool = True):
    """head_statistics and js_distance of every text of a padded batch, summed over the texts.

    attention is a torch tensor (B, H, N, N), on any device, zero on each text's padding keys;
    valid_lens (B,) counts each text's tokens; kinds (B, N, K) is key_kind_columns of their
    tokens (computed once for all the layers of a batch). Maps over words (B, H, W, W) take
    each text's word count and its words' kinds. The same numbers as calling
    head_statistics and js_distance on each text's unpadded block (the tests hold them to
    that), computed block by block of queries (blockwise.pair_slogs and head_numbers.block_sums: at 512 tokens the JS
    distances' passes over the whole batch waited on memory) and then for the whole batch at once.
    Returns float64 tensors ((H, S), (H, H)) on attention's device; the distances None when not js.
    blockwise.block_statistics does it for a block of queries; the blocks' numbers add up to these.
    """
    from attnviz.analysis.blockwise import block_statistics

    return block_statistics(attention, 0, valid_lens, kinds, causal, js)


def key_kind_columns(tokens: list[list[str]], num_tokens: int):
    """(B, N, K) float tensor: 1 where key j of text b is of kind KEY_KINDS[k], 0 elsewhere and on padding."""
    import torch

    columns = np.zeros((len(tokens), num_tokens, len(KEY_KINDS)), dtype=np.float32)
    for b, text_tokens in enumerate(tokens):
        kinds = key_kinds(text_tokens)
        columns[b, : len(text_tokens)] = np.stack([kinds[kind] for kind in KEY_KINDS], axis=-1)
    return torch.from_numpy(columns)


@dataclass
class ModelStatistics:
    """Statistics of every head of every layer, averaged over texts."""

    values: np.ndarray  # (L, H, S): STATISTICS along the last axis
    js_distance: np.ndarray | None  # (L, H, H); None when not measured (stats --file without --js)
    num_texts: int
    causal: bool = False

    @property
    def num_layers(self) -> int:
        return self.values.shape[0]

    @property
    def num_heads(self) -> int:
        return self.values.shape[1]

    def head(self, layer: int, head: int) -> dict[str, float]:
        return {name: float(value) for name, value in zip(STATISTICS, self.values[layer, head])}

    def label(self, layer: int, head: int) -> str | None:
        return head_label(self.head(layer, head))

    def labelled_heads(self) -> dict[str, list[tuple[int, int, float]]]:
        """For each label, its heads as (layer, head, strength), strongest first; labels without heads left out."""
        found: dict[str, list[tuple[int, int, float]]] = {label: [] for label in LABELS}
        for layer in range(self.num_layers):
            for head in range(self.num_heads):
                values = self.head(layer, head)
                label = head_label(values)
                if label is not None:
                    found[label].append((layer, head, label_strength(values, label)))
        return {label: sorted(heads, key=lambda item: -item[2]) for label, heads in found.items() if heads}


class StatisticsAccumulator(MergeableSums):
    """Sums each text's statistics, computed on its own unpadded weights, and averages them.

        accumulator = StatisticsAccumulator(num_layers, causal=False, js=True)
        accumulator.add(layer, weights, tokens)  # for every text and layer, in any order
        accumulator.add_batch(layer, padded_weights, valid_lens, kinds)  # or a padded batch at once
        accumulator.add_block(layer, block, first_query, valid_lens, kinds)  # or a block of its queries at a time
        accumulator.result()  # ModelStatistics
        accumulator.merge(other)  # another's sums and counts added (a shard's); state() / from_state(): accumulate.py

    Sums may be numpy arrays or torch tensors (add_batch's, on the batch's device): they are
    brought to numpy once, in result(). Without js the Jensen-Shannon distances, most of the work,
    are not measured: js_sums stay 0 and the result's js_distance is None.
    """

    def __init__(self, num_layers: int, causal: bool = False, js: bool = True):
        self.causal, self.js = causal, js
        self.value_sums: list = [0.0] * num_layers  # (H, S) each
        self.js_sums: list = [0.0] * num_layers  # (H, H) each
        self.counts = [0] * num_layers

    def add(self, layer: int, attention: np.ndarray, tokens: list[str]) -> None:
        """One text's self-attention (H, N, N) in one layer, and its N tokens: a batch of one, in float64."""
        import torch

        weights = np.asarray(attention, dtype=np.float64)  # (H, N, N)
        if weights.shape[1] != weights.shape[2] or len(tokens) != weights.shape[2]:
            raise ValueError(f"self-attention over {len(tokens)} tokens needs (H, N, N) weights, got {weights.shape}")
        self.add_batch(layer, torch.from_numpy(weights)[None], torch.tensor([len(tokens)]), key_kind_columns([tokens], len(tokens)))

    def add_batch(self, layer: int, attention, valid_lens, kinds) -> None:
        """A padded batch's self-attention (B, H, N, N), valid lengths (B,) and key_kind_columns (B, N, K): torch tensors."""
        values, distances = batch_statistics(attention, valid_lens, kinds, self.causal, self.js)
        self.add_sums(layer, values, distances, len(valid_lens))

    def add_block(self, layer: int, attention, first_query: int, valid_lens, kinds) -> None:
        """A block of a padded batch's queries (B, H, b, N) from first_query (blockwise.block_statistics); the
        batch's texts are counted with its block of first_query 0, so a batch's blocks add up to add_batch."""
        from attnviz.analysis.blockwise import block_statistics

        values, distances = block_statistics(attention, first_query, valid_lens, kinds, self.causal, self.js)
        self.add_sums(layer, values, distances, len(valid_lens) if first_query == 0 else 0)

    def add_sums(self, layer: int, values, distances, count: int) -> None:
        """Statistics (H, S) and JS distances (H, H, or None without js) summed over `count` texts."""
        self.value_sums[layer] = self.value_sums[layer] + values
        if self.js:
            self.js_sums[layer] = self.js_sums[layer] + distances
        self.counts[layer] += count

    def result(self) -> ModelStatistics:
        if not self.counts or min(self.counts) == 0 or len(set(self.counts)) > 1:
            raise ValueError(f"every layer needs the same texts, got counts {self.counts}")
        num_texts = self.counts[0]
        return ModelStatistics(
            values=np.stack([as_float64(sums) for sums in self.value_sums]) / num_texts,  # (L, H, S)
            js_distance=np.stack([as_float64(sums) for sums in self.js_sums]) / num_texts if self.js else None,  # (L, H, H)
            num_texts=num_texts,
            causal=self.causal,
        )

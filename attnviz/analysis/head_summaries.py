"""Every head of every layer summarised from its attention a block of queries at a time, never a whole map.

HeadSummaries is fed the weights (H, b, Nk) of one text's block of queries (MultiHeadAttention.blocks
gives them); it keeps per head only sums over queries (H,) and the attention each key receives (H, Nk),
so memory grows with the text's length, not its square. `summary` gives each head's numbers.
SUMMARIES names and defines them (for --help, summaries.json and the docs). Plain NumPy at import
(torch only inside the accumulator), so the renderers can import the names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The attention sink's threshold, the metric and its paper.
SINK_THRESHOLD = 0.3
SINK_PAPER = "Gu et al., ICLR 2025, \"When Attention Sink Emerges in Language Models: An Empirical View\" (arXiv 2410.10781)"
LOCAL_WINDOW = 8  # the local band's default half-width w: keys with |i - j| <= w
TOP_KEYS = 5  # each head's most-attended keys

# name -> (what, definition), in the order of the arrays, the tables, the figure's panels and summaries.json.
# A "share" is the mean over queries of the total weight a query puts on keys of a kind.
SUMMARIES = {
    "sink": (
        "attention sink",
        "share on the first token (key 0): a decoder's <s>/BOS where its tokenizer adds one, else its first "
        "word; an encoder's [CLS] (BERT) or <s> (RoBERTa)",
    ),
    "last": (
        "last token",
        "share on the text's last token: an encoder's [SEP] (BERT) or </s>; in a causal model only the last "
        "query sees it, so it is near 0 there",
    ),
    "relative_entropy": (
        "relative entropy",
        "mean over queries of the row's entropy / log(keys the query may see): 1 uniform, 0 one-hot; a "
        "query that sees one key (the first, under a causal mask) has no choice and is left out",
    ),
    "distance": ("mean attention distance", "mean over queries of Σ_j A_ij |i - j|, in tokens"),
    "local": ("local share", "share on the keys within the local band |i - j| <= w (w: the window, default 8)"),
    "previous": ("previous token", "share on key i - 1, over the queries that have one"),
}
SINK_FRACTION = (
    "sink fraction",
    f"per layer, the fraction of its heads whose sink share exceeds ε = {SINK_THRESHOLD}; over the model, of all "
    "its heads (Sink^ε of Gu et al. for the first token)",
)
TOP_KEYS_DEFINITION = (
    "most-attended keys",
    f"each head's {TOP_KEYS} keys with the most attention received, Σ_i A_ij, as a share of all its attention "
    "(/ Nq); a tie goes to the earlier key",
)


def sink_fraction(sink: np.ndarray, threshold: float = SINK_THRESHOLD) -> np.ndarray:
    """(L,): for sink shares (L, H), the fraction of each layer's heads whose share exceeds threshold."""
    return (np.asarray(sink) > threshold).mean(axis=-1)


@dataclass
class LayerSummaries:
    """Every layer's heads summarised over one text: per name of SUMMARIES an (L, H) array; top keys (L, H, TOP_KEYS)."""

    values: dict[str, np.ndarray]  # name -> (L, H)
    top_keys: np.ndarray  # (L, H, TOP_KEYS) key indices, most attended first
    top_shares: np.ndarray  # (L, H, TOP_KEYS): Σ_i A_ij / Nq of those keys
    tokens: list[str]  # the text's tokens, as the tokenizer gives them
    shown_tokens: list[str]  # as figures and tables show them (models/shown.py)
    text: str = ""
    model: str = ""
    window: int = LOCAL_WINDOW
    causal: bool = False
    rows_per_block: int = 0  # queries per block of the pass that computed them

    @property
    def sink_fraction(self) -> np.ndarray:
        """(L,): per layer, the fraction of heads whose sink share exceeds SINK_THRESHOLD."""
        return sink_fraction(self.values["sink"])

    @property
    def model_sink_fraction(self) -> float:
        """Gu et al.'s Sink^ε over the whole model: the fraction of all its heads."""
        return float((self.values["sink"] > SINK_THRESHOLD).mean())


class HeadSummaries:
    """Sums over queries for one layer's heads over one text, fed block by block (all keys of each block's rows).

    num_queries and num_keys are the text's (no padding: the caller cuts it off); causal: query i
    may see keys 0..i. Sums are float64 on the weights' device, made with the first block.
    """

    def __init__(self, num_heads: int, num_queries: int, num_keys: int, *, causal: bool, window: int = LOCAL_WINDOW):
        self.num_heads, self.num_queries, self.num_keys = num_heads, num_queries, num_keys
        self.causal, self.window = causal, window
        self.sums = None  # name -> (H,)
        self.received = None  # (H, Nk): Σ_i A_ij
        self.entropy_rows = 0  # queries with more than one key to choose from
        self.previous_rows = 0  # queries that have a previous token
        self.seen = 0

    def add(self, first_query: int, weights) -> None:
        """Add the rows first_query .. first_query + b - 1: weights (H, b, K), each row summing to 1 over its keys.

        K is Nk, or under a causal mask as few as first_query + b (MultiHeadAttention.blocks' narrow weights):
        the keys past K have weight 0.
        """
        import torch

        from attnviz.analysis.blockwise import key_distance, row_plogp

        num_heads, rows, width = weights.shape
        least = min(self.num_keys, first_query + rows) if self.causal else self.num_keys
        if num_heads != self.num_heads or not least <= width <= self.num_keys:
            raise ValueError(f"weights of {num_heads} heads over {width} keys, not {self.num_heads} over {self.num_keys}")
        if weights.dtype in (torch.float16, torch.bfloat16):
            weights = weights.float()  # sums of a few hundred rows need float32's precision at least
        device = weights.device
        if self.sums is None:
            self.sums = {name: torch.zeros(num_heads, dtype=torch.float64, device=device) for name in SUMMARIES}
            self.received = torch.zeros(num_heads, self.num_keys, dtype=torch.float64, device=device)
        queries = torch.arange(first_query, first_query + rows, device=device)  # (b,)
        sums = self.sums

        # Under a causal mask the keys after the block's last query have weight 0: leave them out.
        weights = weights[:, :, :least]  # (H, b, K')
        num_keys = weights.shape[2]
        # Sums over the block's rows in the weights' float32 (a few hundred rows), across blocks in float64.
        sums["sink"] += weights[:, :, 0].sum(dim=1).double()
        if num_keys == self.num_keys:  # else no query of the block sees the last key
            sums["last"] += weights[:, :, num_keys - 1].sum(dim=1).double()
        self.received[:, :num_keys] += weights.sum(dim=1).double()

        # The band |i - j| <= w and the previous key, gathered: 2w + 1 keys per row, not Nk.
        offsets = torch.arange(-self.window, self.window + 1, device=device)  # (2w+1,)
        band = queries[:, None] + offsets[None, :]  # (b, 2w+1)
        inside = (band >= 0) & (band < num_keys)
        gathered = weights.gather(2, band.clamp(0, num_keys - 1).expand(num_heads, -1, -1))  # (H, b, 2w+1)
        sums["local"] += (gathered * inside).sum(dim=(1, 2)).double()
        has_previous = (queries >= 1) & (queries - 1 < num_keys)  # (b,)
        previous = weights.gather(2, (queries - 1).clamp(0, num_keys - 1)[None, :, None].expand(num_heads, -1, 1))  # (H, b, 1)
        sums["previous"] += (previous[..., 0] * has_previous).sum(dim=1).double()
        self.previous_rows += int(has_previous.sum())

        # Each row's Σ p |i - j| and Σ p log p (blockwise's, as stats computes them), every key real: the block's rows
        # and keys are the text's.
        sums["distance"] += key_distance(weights, first_query).double().sum(dim=1)
        plogp = row_plogp(weights)  # (H, b)
        visible = (queries + 1).clamp(max=self.num_keys) if self.causal else torch.full_like(queries, self.num_keys)  # (b,)
        choice = visible > 1
        log_visible = torch.log(visible[choice].double())  # (b',)
        sums["relative_entropy"] += (-plogp[:, choice].double() / log_visible).sum(dim=1)
        self.entropy_rows += int(choice.sum())
        self.seen += rows

    def summary(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Per name of SUMMARIES the heads' values (H,); top keys (H, TOP_KEYS) and their shares (H, TOP_KEYS)."""
        if self.seen != self.num_queries:
            raise ValueError(f"{self.seen} of {self.num_queries} queries were added")
        counts = {name: self.num_queries for name in SUMMARIES}
        counts["relative_entropy"], counts["previous"] = self.entropy_rows, self.previous_rows
        values = {name: (total / counts[name]).cpu().numpy() if counts[name] else np.zeros(self.num_heads) for name, total in self.sums.items()}
        count = min(TOP_KEYS, self.num_keys)
        # Largest first, a tie to the earlier key (a stable sort), so that a rerun names the same keys.
        shares, keys = (self.received / self.num_queries).sort(dim=-1, descending=True, stable=True)  # (H, Nk) each
        return values, keys[:, :count].cpu().numpy(), shares[:, :count].cpu().numpy()


def summarise_layers(loaded, text: str, spec, budget_bytes: int, window: int = LOCAL_WINDOW) -> LayerSummaries:
    """Every head of every layer of spec.stack over one text, from one forward pass, a block of queries at a time.

    spec as for iter_layer_runs (spec.layer and spec.kv_text are not used; spec.words is not: the
    summaries are over tokens). No (H, N, N) map is held: each layer's blocks feed a HeadSummaries;
    budget_bytes: what a block's scores and weights may take (budgets.block_budget).
    """
    from dataclasses import replace

    from attnviz.layer_inputs import encode_texts, threads_for
    from attnviz.pipeline import build_layers

    spec = replace(spec, kv_text=None)
    encoded = encode_texts(loaded, [text], spec)
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    return summarise_blocks(loaded, text, encoded, layers, spec, budget_bytes, window)


def run_and_summarise(loaded, text: str, spec, budget_bytes: int, window: int = LOCAL_WINDOW):
    """pipeline.run_attention of one text at spec.layer, with every layer summarised (summarise_layers) from the same
    forward pass: its AttentionRun, layer_summaries set. Self-attention only (spec without kv_text)."""
    from dataclasses import replace

    from attnviz.layer_inputs import encode_texts, layer_states, threads_for
    from attnviz.pipeline import build_layers, run_attention

    encoded = encode_texts(loaded, [text], spec)
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
        states = layer_states(loaded, encoded, list(range(len(layers))), spec)  # every layer's input, one forward pass
    num_tokens = len(encoded.queries.ids[0])
    chosen = HeadSummaries(layers[spec.layer].num_heads, num_tokens, num_tokens, causal=spec.causal, window=window)
    (run,) = run_attention(
        loaded, [text], spec, captured=(encoded, states[spec.layer]), each_block=lambda first, weights: chosen.add(first, weights[0])
    )
    # A run in blocks (a long text's) fed the chosen layer's summaries with its own blocks, those the summaries' pass
    # would make again (the same budget): that layer is not computed twice.
    done = {spec.layer: chosen} if chosen.seen else {}
    summaries = summarise_blocks(loaded, text, encoded, layers, spec, budget_bytes, window, states=states, done=done)
    return replace(run, layer_summaries=summaries)


def summarise_blocks(
    loaded, text: str, encoded, layers, spec, budget_bytes: int, window: int = LOCAL_WINDOW, also=None, states=None, done=None
) -> LayerSummaries:
    """summarise_layers over one text's encoded batch and its built layers (spec without kv_text);
    also(layer, first_query, weights (H, b, N)), when given, gets each block too (analysis.long_layers' block maxima);
    states: every layer's input, already captured (pipeline.iter_layer_blocks); done: layer -> its HeadSummaries,
    already fed every block (those layers are not computed again, unless each layer runs in BERT's place)."""
    from attnviz.attention.layer import rows_per_block
    from attnviz.pipeline import in_berts_place, iter_layer_blocks

    num_tokens = len(encoded.queries.ids[0])
    in_place = in_berts_place(loaded, spec)
    done = {} if in_place or done is None else done
    accumulators = [
        done.get(layer) or HeadSummaries(attention.num_heads, num_tokens, num_tokens, causal=spec.causal, window=window)
        for layer, attention in enumerate(layers)
    ]
    blocks = iter_layer_blocks(loaded, encoded, layers, spec, budget_bytes, in_place, states, frozenset(done))
    for layer, first_query, weights in blocks:  # weights (1, H, b, N)
        accumulators[layer].add(first_query, weights[0])
        if also is not None:
            also(layer, first_query, weights[0])
    per_layer = [accumulator.summary() for accumulator in accumulators]
    values = {name: np.stack([layer_values[name] for layer_values, _, _ in per_layer]) for name in SUMMARIES}  # (L, H) each
    return LayerSummaries(
        values=values,
        top_keys=np.stack([keys for _, keys, _ in per_layer]),
        top_shares=np.stack([shares for _, _, shares in per_layer]),
        tokens=list(encoded.queries.tokens[0]),
        shown_tokens=list(encoded.queries.shown[0] or encoded.queries.tokens[0]),
        text=text,
        model=loaded.name,
        window=window,
        causal=spec.causal,
        rows_per_block=rows_per_block(budget_bytes, 1, max(attention.num_heads for attention in layers), num_tokens),
    )

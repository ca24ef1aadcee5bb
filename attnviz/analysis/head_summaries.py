"""Every head of every layer summarised from its attention a block of queries at a time, never a whole map.

HeadSummaries is fed the weights (H, b, Nk) of one text's block of queries (MultiHeadAttention.blocks
gives them); it keeps per head only sums over queries (H,) and the attention each key receives (H, Nk),
so memory grows with the text's length, not its square. `summary` gives each head's numbers.
Their names and definitions are head_numbers' (SUMMARY_NAMES, as SUMMARIES here). Plain NumPy at import
(torch only inside the accumulator), so the renderers can import the names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.analysis.head_numbers import HEAD_NUMBERS, LOCAL_WINDOW, SINK_PAPER, SUMMARY_NAMES
from attnviz.run_data import FORWARD_PASS, LAYERS_OF_THE_TEXT, Progress

SINK_THRESHOLD = 0.3  # the attention sink's threshold ε (Gu et al., SINK_PAPER)
TOP_KEYS = 5  # each head's most-attended keys

# name -> (what, definition) of head_numbers' SUMMARY_NAMES, in the order of the arrays, the tables, the figure's
# panels and summaries.json. A "share" is the mean over queries of the total weight a query puts on keys of a kind.
SUMMARIES = {name: (HEAD_NUMBERS[name].title, HEAD_NUMBERS[name].definition) for name in SUMMARY_NAMES}
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
    may see keys 0..i. Sums are float64 on the weights' device, made with the first block: head_numbers'
    block step (block_sums) of SUMMARY_NAMES, and the attention each key receives (the top keys).
    """

    def __init__(self, num_heads: int, num_queries: int, num_keys: int, *, causal: bool, window: int = LOCAL_WINDOW):
        self.num_heads, self.num_queries, self.num_keys = num_heads, num_queries, num_keys
        self.causal, self.window = causal, window
        self.sums = None  # (H, len(SUMMARY_NAMES))
        self.received = None  # (H, Nk): Σ_i A_ij
        self.seen = 0

    def add(self, first_query: int, weights) -> None:
        """Add the rows first_query .. first_query + b - 1: weights (H, b, K), each row summing to 1 over its keys.

        K is Nk, or under a causal mask as few as first_query + b (MultiHeadAttention.blocks' narrow weights):
        the keys past K have weight 0.
        """
        import torch

        from attnviz.analysis.head_numbers import Block, block_sums

        num_heads, rows, width = weights.shape
        least = min(self.num_keys, first_query + rows) if self.causal else self.num_keys
        if num_heads != self.num_heads or not least <= width <= self.num_keys:
            raise ValueError(f"weights of {num_heads} heads over {width} keys, not {self.num_heads} over {self.num_keys}")
        # Under a causal mask the keys after the block's last query have weight 0: leave them out.
        block = Block(weights[None, :, :, :least], first_query, torch.tensor([self.num_keys]), causal=self.causal,
                      num_queries=self.num_queries, query_lens=torch.tensor([self.num_queries]), window=self.window)  # fmt: skip
        if self.sums is None:
            self.sums = torch.zeros(num_heads, len(SUMMARY_NAMES), dtype=torch.float64, device=weights.device)
            self.received = torch.zeros(num_heads, self.num_keys, dtype=torch.float64, device=weights.device)
        self.sums += block_sums(block, SUMMARY_NAMES)  # (H, E)
        # each key's column summed as a product with ones: 3 times as quick as a sum over the rows (dim=1) on the CPU
        self.received[:, :least] += (weights.new_ones(rows) @ block.weights[0]).double()  # (H, K')
        self.seen += rows

    def summary(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Per name of SUMMARIES the heads' values (H,); top keys (H, TOP_KEYS) and their shares (H, TOP_KEYS)."""
        if self.seen != self.num_queries:
            raise ValueError(f"{self.seen} of {self.num_queries} queries were added")
        sums = self.sums.cpu().numpy()  # (H, E)
        values = {name: sums[:, index] for index, name in enumerate(SUMMARY_NAMES)}
        count = min(TOP_KEYS, self.num_keys)
        # Largest first, a tie to the earlier key (a stable sort), so that a rerun names the same keys.
        shares, keys = (self.received / self.num_queries).sort(dim=-1, descending=True, stable=True)  # (H, Nk) each
        return values, keys[:, :count].cpu().numpy(), shares[:, :count].cpu().numpy()


def summarise_layers(
    loaded, text: str, spec, budget_bytes: int, window: int = LOCAL_WINDOW, progress: Progress = Progress()
) -> LayerSummaries:
    """Every head of every layer of spec.stack over one text, from one forward pass, a block of queries at a time
    (progress: summarise_blocks').

    spec as for iter_layer_runs (spec.layer and spec.kv_text are not used; spec.words is not: the
    summaries are over tokens). No (H, N, N) map is held: each layer's blocks feed a HeadSummaries;
    budget_bytes: what a block's scores and weights may take (budgets.block_budget).
    """
    from dataclasses import replace

    from attnviz.layer_inputs import encode_texts, threads_for
    from attnviz.own_layer import build_layers

    spec = replace(spec, kv_text=None)
    encoded = encode_texts(loaded, [text], spec)
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    return summarise_blocks(loaded, text, encoded, layers, spec, budget_bytes, window, progress=progress)


def run_and_summarise(
    loaded, text: str, spec, budget_bytes: int, window: int = LOCAL_WINDOW, progress: Progress = Progress(), vector_tokens: int = 0
):
    """pipeline.run_attention of one text at spec.layer, with every layer summarised (summarise_layers) from the same
    forward pass: its AttentionRun, layer_summaries set (in the model's place, the run is made from that pass's own
    blocks: pipeline.runs_of_pass). Self-attention only (spec without kv_text). progress: the layers the forward pass
    reaches, then the layers summarised (summarise_blocks'); vector_tokens: run_attention's."""
    from dataclasses import replace

    from attnviz.layer_inputs import encode_texts, threads_for
    from attnviz.own_layer import build_layers, every_layer_sizes
    from attnviz.passes import capture_states, in_models_place
    from attnviz.pipeline import pass_maps, run_attention, runs_of_pass

    encoded = encode_texts(loaded, [text], spec)
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    if in_models_place(loaded, spec):  # one pass in the model's place summarises every layer and makes layer L's run
        maps = pass_maps(encoded, every_layer_sizes(layers)[spec.layer][0], spec)  # no layer built for its sizes
        summaries, kept = summarise_in_place(loaded, text, encoded, layers, spec, budget_bytes, window, keep={spec.layer},
                                             progress=progress, maps_of={spec.layer: maps})  # fmt: skip
        (run,) = runs_of_pass(loaded, [text], spec, encoded, kept[spec.layer], layers[spec.layer], maps, vector_tokens)
        return replace(run, layer_summaries=summaries)
    with threads_for(encoded):
        entered = progress.counting(FORWARD_PASS, len(layers))
        states = capture_states(loaded, encoded, list(range(len(layers))), spec, entered)  # every layer's input, one pass
    num_tokens = len(encoded.queries.ids[0])
    chosen = HeadSummaries(layers[spec.layer].num_heads, num_tokens, num_tokens, causal=spec.causal, window=window)
    (run,) = run_attention(
        loaded, [text], spec, captured=(encoded, states[spec.layer]), each_block=lambda first, weights: chosen.add(first, weights[0]),
        vector_tokens=vector_tokens,
    )
    # A run in blocks (a long text's) fed the chosen layer's summaries with its own blocks, those the summaries' pass
    # would make again (the same budget): that layer is not computed twice.
    done = {spec.layer: chosen} if chosen.seen else {}
    summaries = summarise_blocks(loaded, text, encoded, layers, spec, budget_bytes, window, states=states, done=done, progress=progress)
    return replace(run, layer_summaries=summaries)


def summarise_blocks(
    loaded, text: str, encoded, layers, spec, budget_bytes: int, window: int = LOCAL_WINDOW, also=None, states=None, done=None,
    progress: Progress = Progress(),
) -> LayerSummaries:
    """summarise_layers over one text's encoded batch and its built layers (spec without kv_text);
    also(layer, first_query, weights (H, b, N)), when given, gets each block too (analysis.long_layers' block maxima);
    states: every layer's input, already captured (passes.capture_states: in BERT's place, that pass's), read in place
    of a pass; done: layer -> its HeadSummaries, already fed every block (those layers are not computed again).
    Without states, where attnviz's layers can run in the model's place (passes.in_models_place), they do: one pass,
    each layer's attention computed once (summarise_in_place). progress: the layers the forward pass reaches (where
    states are captured here), then the layers summarised."""
    from attnviz.layer_inputs import threads_for
    from attnviz.passes import capture_states, in_berts_place, in_models_place, iter_layer_blocks

    if states is None and in_models_place(loaded, spec):
        return summarise_in_place(loaded, text, encoded, layers, spec, budget_bytes, window, also, progress=progress)[0]
    in_place = in_berts_place(loaded, spec) and states is None  # else the captured states, in place or not, are read
    done = {} if in_place or done is None else done
    if states is None and not in_place:  # every layer's input, one forward pass (iter_layer_blocks' own), counted
        entered = progress.counting(FORWARD_PASS, len(layers))
        with threads_for(encoded):
            states = capture_states(loaded, encoded, list(range(len(layers))), spec, entered)
    summing = _Summing(encoded, layers, spec, window, also, progress, done)
    for layer, first_query, weights in iter_layer_blocks(loaded, encoded, layers, spec, budget_bytes, in_place, states, frozenset(done)):
        summing.add(layer, first_query, weights)
    return summing.summaries(text, loaded.name, budget_bytes)


def summarise_in_place(
    loaded, text: str, encoded, layers, spec, budget_bytes: int, window: int = LOCAL_WINDOW, also=None, keep=frozenset(),
    progress: Progress = Progress(), maps_of: dict | None = None,
):
    """summarise_blocks with attnviz's layers in the place of the model's attention (passes.blocks_in_place: one pass,
    where passes.in_models_place holds), and the input of each layer of keep as that pass made it (LayerStates):
    (LayerSummaries, {layer: LayerStates}). progress: the layers summarised, as the pass goes; maps_of: the maps
    of a layer's run that the pass fills too (blocks_in_place's)."""
    from attnviz.passes import blocks_in_place

    summing = _Summing(encoded, layers, spec, window, also, progress)
    kept = blocks_in_place(loaded, encoded, layers, spec, budget_bytes, summing.add, frozenset(keep), maps_of=maps_of)
    return summing.summaries(text, loaded.name, budget_bytes), kept


class _Summing:
    """Every layer's HeadSummaries of one text, fed its blocks (add: weights (1, H, b, K)), also(...) given each block
    too; progress counts a layer once its last block is in (a layer of done, fed already, at the start)."""

    def __init__(self, encoded, layers, spec, window: int, also, progress: Progress, done=None):
        from attnviz.own_layer import every_layer_sizes

        done = done or {}
        self.encoded, self.layers, self.spec, self.window, self.also = encoded, layers, spec, window, also
        self.num_tokens = len(encoded.queries.ids[0])
        self.advance = progress.counting(LAYERS_OF_THE_TEXT, len(layers))
        if done:
            self.advance(len(done))  # the run's own layer, summarised from its blocks
        self.accumulators = [
            done.get(layer) or HeadSummaries(heads, self.num_tokens, self.num_tokens, causal=spec.causal, window=window)
            for layer, (heads, _, _) in enumerate(every_layer_sizes(layers))
        ]

    def add(self, layer: int, first_query: int, weights) -> None:
        self.accumulators[layer].add(first_query, weights[0])
        if self.also is not None:
            self.also(layer, first_query, weights[0])
        if first_query + weights.shape[2] == self.num_tokens:  # the layer's last block
            self.advance(1)

    def summaries(self, text: str, model: str, budget_bytes: int) -> LayerSummaries:
        from attnviz.attention.layer import rows_per_block

        queries = self.encoded.queries
        shown = queries.shown[0] or queries.tokens[0]
        rows = rows_per_block(budget_bytes, 1, max(summaries.num_heads for summaries in self.accumulators), self.num_tokens)
        return layer_summaries(self.accumulators, queries.tokens[0], shown, text, model, self.spec.causal, self.window, rows)


def summarise_runs(layer_runs: list, spec, budget_bytes: int, window: int = LOCAL_WINDOW) -> LayerSummaries:
    """summarise_layers from every layer's run of one text, their maps over tokens (H, N, N) already made (run_layers):
    no forward pass; each map fed in the blocks summarise_layers' pass would make for budget_bytes."""
    import torch

    from attnviz.attention.layer import rows_per_block

    first = layer_runs[0]
    num_tokens = len(first.query_tokens)
    rows = rows_per_block(budget_bytes, 1, max(run.num_heads for run in layer_runs), num_tokens)
    accumulators = []
    for run in layer_runs:
        accumulator = HeadSummaries(run.num_heads, num_tokens, num_tokens, causal=spec.causal, window=window)
        for start in range(0, num_tokens, rows):
            stop = min(start + rows, num_tokens)
            width = stop if spec.causal else num_tokens  # a causal block's keys stop at its last query's, as a pass's
            accumulator.add(start, torch.from_numpy(run.attention[:, start:stop, :width]))  # (H, b, K)
        accumulators.append(accumulator)
    shown = first.query_shown or first.query_tokens
    return layer_summaries(accumulators, first.query_tokens, shown, first.text, first.model, spec.causal, window, rows)


def layer_summaries(accumulators, tokens, shown, text, model, causal, window, rows) -> LayerSummaries:
    """The LayerSummaries of every layer's HeadSummaries, fed every query."""
    per_layer = [accumulator.summary() for accumulator in accumulators]
    values = {name: np.stack([layer_values[name] for layer_values, _, _ in per_layer]) for name in SUMMARIES}  # (L, H) each
    return LayerSummaries(
        values=values,
        top_keys=np.stack([keys for _, keys, _ in per_layer]),
        top_shares=np.stack([shares for _, _, shares in per_layer]),
        tokens=list(tokens),
        shown_tokens=list(shown),
        text=text,
        model=model,
        window=window,
        causal=causal,
        rows_per_block=rows,
    )

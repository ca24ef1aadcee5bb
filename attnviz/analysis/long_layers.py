"""`attnviz layers` at long lengths: every layer a block of queries at a time, no map ever whole.

Past budgets.every_layer_in_blocks (every layer's maps of the text past the memory budget, or a
layer's past 64 MB) one forward pass feeds each block of queries to the head summaries
(head_summaries.summarise_blocks) and to BlockMaxima, the block maxima layers.png draws (the same
blocks and values as from the whole maps, render/stats_figures.layers_figure). The layers' runs
hold the text and the setup but no weights (attention and output None); the rollout is left out:
it multiplies N × N matrices through every layer, each layer's whole map.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from attnviz.analysis.head_summaries import LOCAL_WINDOW, LayerSummaries, summarise_blocks
from attnviz.errors import AttnvizError
from attnviz.run_data import Progress


def long_text_note(num_tokens: int, num_layers: int, num_heads: int) -> str:
    """What `layers` leaves out of a long text, and why, in a sentence."""
    size = 4 * num_layers * num_heads * num_tokens * num_tokens
    shown = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MB"
    return (
        f"{num_tokens} tokens: every layer's maps would take {shown}, past the memory budget, so they were computed a block of "
        "queries at a time and never held whole: no .attention, layers.png shows each panel's block maxima, and the "
        "attention rollout (N × N products through every layer's whole map) is left out; summaries as always"
    )


class LongLayers(NamedTuple):
    layer_runs: list  # every layer's AttentionRun of the text, attention and output None
    summaries: LayerSummaries
    maxima: np.ndarray  # (L, H, P, P) float32 block maxima; -inf where a block is all future keys
    note: str


class BlockMaxima:
    """Every layer's maps cut into cells × cells near-equal blocks (scales.block_maximum's), each block's
    largest weight, fed a block of queries at a time: values (L, H, cells, cells) float32, -inf where a
    block holds only a causal run's future keys (drawn as masked, as the whole map's panel)."""

    def __init__(self, num_layers: int, num_heads: int, num_tokens: int, cells: int, causal: bool):
        self.starts = (np.arange(cells) * num_tokens + cells - 1) // cells  # the first cell of each block
        self.block_of = np.searchsorted(self.starts, np.arange(num_tokens), side="right") - 1  # (N,): each row's block
        self.values = np.full((num_layers, num_heads, cells, cells), -np.inf, dtype=np.float32)
        self.causal = causal

    def add(self, layer: int, first_query: int, weights) -> None:
        """The rows first_query .. first_query + b - 1 of a layer's map: weights (H, b, N), a torch tensor (causal: the
        first N' >= first_query + b keys may be all, MultiHeadAttention.blocks' narrow weights).

        Each block of queries' rows are reduced first, in torch (the rows' every weight, on every core), to their
        largest weight on each key; then the blocks of keys, over those few rows. A causal run's weights are 0 past
        each query: the blocks of keys past the block's last query are not read, and one all past the last query
        of a block of queries is -inf for it (masked); any other holds a seen weight >= the zeros."""
        import torch

        num_rows = weights.shape[1]
        queries = np.arange(first_query, first_query + num_rows)
        blocks, firsts = np.unique(self.block_of[queries], return_index=True)  # the blocks of queries these rows are in
        ends = [*firsts[1:], num_rows]
        columns = int((self.starts <= queries[-1]).sum()) if self.causal else len(self.starts)  # the blocks of keys read
        width = self.starts[columns - 1] + self._width(columns - 1)
        rows = torch.stack([weights[:, a:b, :width].amax(dim=1) for a, b in zip(firsts, ends)], dim=1)  # (H, blocks, N')
        maxima = np.maximum.reduceat(rows.float().cpu().numpy(), self.starts[:columns], axis=2)  # (H, blocks, C')
        if self.causal:  # future keys never win a maximum
            last = first_query + np.array(ends) - 1  # (blocks,): each block of queries' last row here
            maxima[:, self.starts[None, :columns] > last[:, None]] = -np.inf
        self.values[layer][:, blocks, :columns] = np.maximum(self.values[layer][:, blocks, :columns], maxima)

    def _width(self, block: int) -> int:
        """The keys of a block of keys."""
        end = self.starts[block + 1] if block + 1 < len(self.starts) else len(self.block_of)
        return int(end - self.starts[block])


def layers_in_blocks(
    loaded, text: str, spec, panel_cells: Callable, budget_bytes: int, window: int = LOCAL_WINDOW, progress: Progress = Progress()
) -> LongLayers:
    """Every layer of one long text in one pass of blocks: the layers' runs without weights, the summaries, the block
    maxima; progress: the layers the forward pass reaches, then those done (summarise_blocks').

    panel_cells(run, num_layers) gives the cells a side of layers.png's panels (render.stats_figures.layers_panel_cells).
    """
    from attnviz.layer_inputs import encode_texts, threads_for
    from attnviz.own_layer import build_layers, every_layer_sizes
    from attnviz.pipeline import split_runs

    if spec.words:
        raise AttnvizError(
            "--words over a text this long: merging every layer's maps over words needs each map whole; "
            "run without --words (the summaries are over tokens), or give a larger --memory"
        )
    spec = replace(spec, kv_text=None)
    encoded = encode_texts(loaded, [text], spec)
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    runs = [
        split_runs(loaded, [text], encoded.queries, encoded.queries, [None], [None], spec, layer, *sizes)[0]
        for layer, sizes in enumerate(every_layer_sizes(layers))
    ]  # fmt: skip
    num_tokens = len(encoded.queries.ids[0])
    num_heads = max(run.num_heads for run in runs)
    maxima = BlockMaxima(len(layers), num_heads, num_tokens, panel_cells(runs[0], len(layers)), spec.causal)
    summaries = summarise_blocks(loaded, text, encoded, layers, spec, budget_bytes, window, also=maxima.add, progress=progress)
    return LongLayers(runs, summaries, maxima.values, long_text_note(num_tokens, len(layers), num_heads))

"""`attnviz stats`: the statistics of every head of every layer, measured batch by batch on the device.

The pipeline runs attnviz's layers in BERT's forward pass; the statistics accumulate each
batch's weights as they come, so no layer's (B, H, N, N) weights outlive their batch.
With --words (spec.words) each batch's maps are merged over words on the device first
(WordBatch: Clark et al.'s rule as two batched products), and every statistic is the same
statistic of the word maps: its key kinds from the words, previous and next the words beside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch

from attnviz.analysis.statistics import ModelStatistics, StatisticsAccumulator, key_kind_columns
from attnviz.budgets import block_budget, every_layer_in_blocks
from attnviz.layer_inputs import encode_texts, text_captures, threads_for
from attnviz.own_layer import build_layers, every_layer_sizes, layer_sizes
from attnviz.passes import capture_states, in_berts_place, iter_layer_blocks, iter_layer_weights, layer_stages
from attnviz.pipeline import BATCH_SIZE, batches, run_attention, split_runs
from attnviz.models.tokens import text_notes, truncation_notes
from attnviz.models.loading import LoadedModel
from attnviz.models.words import tokenizer_words
from attnviz.run_data import AttentionRun, Progress
from attnviz.spec import RunSpec


class Measured(NamedTuple):
    stats: ModelStatistics
    notes: list[str]  # text_notes' notes, in order, once each
    first_run: AttentionRun  # the first text through layer 0: the model and setup, as stats prints and records them


def measure_heads(
    loaded: LoadedModel,
    texts: list[str],
    spec: RunSpec,
    advance: Callable[[int], None] = lambda done: None,
    layers: Progress = Progress(),
) -> Measured:
    """The statistics of every head of every layer averaged over the texts, text_notes' notes, and
    the first text's layer-0 run (cut from its batch: the setup the command prints, stats.json records).

    spec's settings but its layer (every layer is measured) and kv_text (self-attention only).
    advance(n) is called after each batch of n texts; layers counts each batch's layers (passes.layer_stages: one
    text's). `stats --file` streams its corpus through a HeadsMeasurer chunk by chunk instead (output/corpus_stats.py).
    """
    measurer = HeadsMeasurer(loaded, spec)
    accumulator = measurer.accumulator()
    notes, first_run = measurer.measure(texts, accumulator, advance, first_text=texts[0], layers=layers)
    return Measured(accumulator.result(), notes, first_run)


class HeadsMeasurer:
    """measure_heads' work over any number of calls: the model's layers built once, texts added into an accumulator.

    Texts of similar length are batched together, so they pad least (the averages do not
    depend on the order); each batch is one forward pass, measured at once on the device.
    With spec.words the statistics are those of each text's maps over words (WordBatch).
    """

    def __init__(self, loaded: LoadedModel, spec: RunSpec):
        self.loaded, self.spec = loaded, replace(spec, kv_text=None)
        self.layers = build_layers(loaded, self.spec)
        self.in_place = in_berts_place(loaded, self.spec)
        self.tokenizer = loaded.tokenizer_for(self.spec.stack)
        self.num_heads = max(heads for heads, _, _ in every_layer_sizes(self.layers))

    def accumulator(self) -> StatisticsAccumulator:
        """An empty accumulator for this model's layers and mask."""
        js = self.spec.js is not False  # None: a spec not of stats, which measures everything
        return StatisticsAccumulator(self.loaded.num_layers_of(self.spec.stack), self.spec.causal, js)

    def measure(
        self,
        texts: list[str],
        accumulator: StatisticsAccumulator,
        advance: Callable[[int], None] = lambda done: None,
        first_text: str | None = None,
        layers: Progress = Progress(),
    ) -> tuple[list[str], AttentionRun | None]:
        """Add the texts' statistics into accumulator; their notes (in order, once each), and first_text's layer-0 run
        (None when not given). advance(n) after each batch of n texts; layers: each batch's (passes.layer_stages)."""
        loaded, spec, device = self.loaded, self.spec, self.spec.device
        notes: dict[str, None] = {}  # in order, once each
        first_run = None
        for batch in batches(sorted(texts, key=len), BATCH_SIZE):
            encoded = encode_texts(loaded, batch, spec)
            queries = encoded.queries
            words = word_batch(self.tokenizer, batch, queries.tokens, queries.input_ids.shape[1], device) if spec.words else None
            if words is None:
                labels, valid_lens, width = queries.tokens, queries.valid_lens, queries.input_ids.shape[1]  # N tokens
            else:
                labels, valid_lens, width = words.labels, words.word_counts, words.rows.shape[1]  # W words
            kinds = key_kind_columns(labels, width).to(device)  # (B, N, K), or (B, W, K) over words
            entered, done = layer_stages(layers, len(self.layers), self.in_place)
            if words is None and every_layer_in_blocks(spec, len(batch), self.num_heads, width):
                first_run = self._measure_in_blocks(batch, encoded, accumulator, valid_lens, kinds, first_run, first_text, entered, done)
            else:
                passes = iter_layer_weights(loaded, encoded, self.layers, spec, self.in_place, entered)
                for layer, (output, patterns) in enumerate(passes):
                    accumulator.add_batch(layer, words.merge(patterns) if words else patterns, valid_lens, kinds)
                    if layer == 0 and first_run is None and first_text is not None and first_text in batch:
                        first_run = _first_text_run(loaded, batch, first_text, encoded, output, patterns, spec, self.layers[0])
                    done(1)
            notes.update(dict.fromkeys(text_notes(loaded, batch, encoded.queries.ids)))
            notes.update(dict.fromkeys(truncation_notes(batch, encoded.queries.truncations)))
            advance(len(batch))
        return list(notes), first_run

    def _measure_in_blocks(self, batch, encoded, accumulator, valid_lens, kinds, first_run, first_text, entered, done):
        """A batch whose maps pass the budget (budgets.every_layer_in_blocks): every layer a block of queries at a
        time into accumulator, no (B, H, N, N) map whole. first_text's layer-0 run, when in the batch and not made
        yet, from the batch's capture of layer 0, cut to that text (run_attention: past the large-map size its map is
        attention.npy's memmap). entered and done: layer_stages' (the forward pass's layers, then each layer measured)."""
        loaded, spec = self.loaded, self.spec
        # every layer's input, one forward pass, counted; in BERT's place layer 0's (the embeddings) that the pass starts from
        layers = [0] if self.in_place else list(range(len(self.layers)))
        with threads_for(encoded):
            states = capture_states(loaded, encoded, layers, spec, entered)
        first = None  # first_text's capture of layer 0, taken before the blocks let each layer's input go
        if first_run is None and first_text is not None and first_text in batch:
            own_encoded, own_states = text_captures((encoded, {0: states[0]}))[batch.index(first_text)]
            first = own_encoded, own_states[0]
        blocks = iter_layer_blocks(loaded, encoded, self.layers, spec, block_budget(spec), self.in_place, states)
        num_queries = encoded.queries.input_ids.shape[1]
        for layer, first_query, weights in blocks:  # weights (B, H, b, N)
            accumulator.add_block(layer, weights, first_query, valid_lens, kinds)
            if first_query + weights.shape[2] == num_queries:  # the layer's last block
                done(1)
        if first is not None:
            first_run = run_attention(loaded, [first_text], replace(spec, layer=0), captured=first)[0]
        return first_run


def _first_text_run(loaded, batch, text, encoded, output, patterns, spec, layer) -> AttentionRun:
    """The text's layer-0 run, cut from its batch's padded output (B, N, D) and weights (B, H, N, N)."""
    self_attention = replace(spec, kv_text=None)
    runs = split_runs(loaded, batch, encoded.queries, encoded.queries, output, patterns, self_attention, 0, *layer_sizes(layer))
    return runs[batch.index(text)]


class WordBatch(NamedTuple):
    """A padded batch's words, and the membership matrices that merge its maps over tokens into maps over words.

    Clark et al.'s rule (models/words.py, merge_attention) for every text at once: attention to a
    word is the sum over its pieces (cols), from a word the mean over its pieces (rows). Padding
    tokens are in no word and padding words hold no token, so the merged maps are zero on them.
    """

    labels: list[list[str]]  # each text's words
    word_counts: torch.Tensor  # (B,): each text's words, the merged maps' valid lengths
    rows: torch.Tensor  # (B, W, N): 1 / (the word's pieces) on its pieces; zero rows for padding words
    cols: torch.Tensor  # (B, N, W): 1 where token n is in word w; zero rows for padding tokens

    def merge(self, patterns: torch.Tensor) -> torch.Tensor:
        """Maps over tokens (B, H, N, N) -> over words (B, H, W, W) in float64, on the maps' device.

        float64, so that batch_statistics measures them in float64: over words, a causal mask often leaves
        two heads near-identical rows (word 1 sees two words), whose JS distance float32 blurs (statistics.py).
        """
        return self.rows[:, None] @ patterns.double() @ self.cols[:, None]  # (B, 1, W, N) @ (B, H, N, N) @ (B, 1, N, W)


def word_batch(tokenizer, texts: list[str], tokens: list[list[str]], num_tokens: int, device: str) -> WordBatch:
    """The WordBatch of a padded batch: texts, each text's tokens (padding left out), N the padded length."""
    words = [tokenizer_words(tokenizer, text_tokens, text) for text, text_tokens in zip(texts, tokens)]
    num_words = max(len(text_words.labels) for text_words in words)
    cols = np.zeros((len(texts), num_tokens, num_words))  # (B, N, W)
    for b, text_words in enumerate(words):
        cols[b, np.arange(len(text_words.index)), text_words.index] = 1.0
    pieces = cols.sum(axis=1)  # (B, W): each word's tokens; 0 for padding words
    rows = cols.transpose(0, 2, 1) / np.maximum(pieces, 1)[:, :, None]  # (B, W, N)
    return WordBatch(
        labels=[list(text_words.labels) for text_words in words],
        word_counts=torch.tensor([len(text_words.labels) for text_words in words]),
        rows=torch.from_numpy(rows).to(device),
        cols=torch.from_numpy(cols).to(device),
    )

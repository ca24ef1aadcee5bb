"""`attnviz stats`: the statistics of every head of every layer, measured batch by batch on the device.

The pipeline runs attnviz's layers in BERT's forward pass; the statistics accumulate each
batch's weights as they come, so no layer's (B, H, N, N) weights outlive their batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from attnviz.analysis.statistics import ModelStatistics, StatisticsAccumulator, key_kind_columns
from attnviz.pipeline import (
    BATCH_SIZE,
    batches,
    build_layers,
    in_berts_place,
    encode_texts,
    iter_layer_weights,
    layer_sizes,
    split_runs,
    text_notices,
    truncation_notices,
)
from attnviz.models.loading import LoadedModel
from attnviz.result import AttentionRun
from attnviz.spec import RunSpec


class Measured(NamedTuple):
    stats: ModelStatistics
    notices: list[str]  # text_notices' notes, in order, once each
    first_run: AttentionRun  # the first text through layer 0: the model and setup, as stats prints and records them


def measure_heads(
    loaded: LoadedModel,
    texts: list[str],
    spec: RunSpec,
    advance: Callable[[int], None] = lambda done: None,
) -> Measured:
    """The statistics of every head of every layer averaged over the texts, text_notices' notes, and
    the first text's layer-0 run (cut from its batch: the setup the command prints, stats.json records).

    spec's settings but its layer (every layer is measured) and kv_text (self-attention only).

    Texts of similar length are batched together, so they pad least (the averages do not
    depend on the order); each batch is one forward pass, measured at once on the device.
    advance(n) is called after each batch of n texts.
    """
    spec = replace(spec, kv_text=None)
    causal, device = spec.causal, spec.device
    accumulator = StatisticsAccumulator(loaded.num_layers_of(spec.stack), causal)
    layers = build_layers(loaded, spec)
    in_place = in_berts_place(loaded, spec)
    notices: dict[str, None] = {}  # in order, once each
    first_run = None
    for batch in batches(sorted(texts, key=len), BATCH_SIZE):
        encoded = encode_texts(loaded, batch, spec)
        kinds = key_kind_columns(encoded.queries.tokens, encoded.queries.input_ids.shape[1]).to(device)  # (B, N, K)
        for layer, (output, patterns) in enumerate(iter_layer_weights(loaded, encoded, layers, spec, in_place)):
            accumulator.add_batch(layer, patterns, encoded.queries.valid_lens, kinds)
            if layer == 0 and first_run is None and texts[0] in batch:
                first_run = _first_text_run(loaded, batch, texts[0], encoded, output, patterns, spec, layers[0])
        notices.update(dict.fromkeys(text_notices(loaded, batch, encoded.queries.ids)))
        notices.update(dict.fromkeys(truncation_notices(batch, encoded.queries.truncations)))
        advance(len(batch))
    return Measured(accumulator.result(), list(notices), first_run)


def _first_text_run(loaded, batch, text, encoded, output, patterns, spec, layer) -> AttentionRun:
    """The text's layer-0 run, cut from its batch's padded output (B, N, D) and weights (B, H, N, N)."""
    self_attention = replace(spec, kv_text=None)
    runs = split_runs(loaded, batch, encoded.queries, encoded.queries, output, patterns, self_attention, 0, *layer_sizes(layer))
    return runs[batch.index(text)]

"""What attention weights leave out: the measures beside the weights, layer by layer and text by text.

- norm (Kobayashi et al. 2020, norms.py): ‖α^h_ij f^h(x_j)‖ per head, and ‖Σ_h α^h_ij f^h(x_j)‖ per layer;
- value zeroing (Mohebbi et al. 2023, value_zeroing.py): the cosine distance between token i's
  output and its output with key j's value vector zeroed, per layer;
- flow (Abnar & Zuidema 2020, flow.py): maximum flow through the layers' graph, across layers.

measure_layers and measure_layer run attnviz's layers as run_layers and run_attention do, and
compute norm and value zeroing from the very tensors each layer ran on (its values' input, its
weights, its output), so each MeasuredLayer holds the weights' run and its measures side by side.
Flow needs only every layer's weights: attention_flow([m.run.attention for m in measured]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from attnviz.analysis.flow import AttentionFlow, attention_flow, check_flow_length
from attnviz.analysis.norms import head_norms, summed_squared_norms, transformed_values
from attnviz.analysis.rollout import normalise_rows
from attnviz.analysis.value_zeroing import value_zeroing_distances
from attnviz.analysis.word_measures import word_maps
from attnviz.attention.layer import MultiHeadAttention
from attnviz.errors import AttnvizError
from attnviz.models.loading import LoadedModel
from attnviz.models.words import word_means
from attnviz.layer_inputs import EncodedTexts, LayerStates, encode_texts
from attnviz.own_layer import build_layers, layer_sizes
from attnviz.passes import in_berts_place, iter_layer_passes
from attnviz.pipeline import iter_layer_runs, layer_pass, run_attention, run_layers, split_runs
from attnviz.run_data import AttentionRun
from attnviz.spec import RunSpec


@dataclass
class MeasuredLayer:
    """One text's pass through one layer, with the measures (docs/measures.md).

    head_norms (H, Nq, Nk): ‖α^h_ij f^h(x_j)‖; summed_norms (Nq, Nk): ‖Σ_h α^h_ij f^h(x_j)‖, both raw
    norms in the hidden state's units. value_zeroing (Nq, Nk): the cosine distance between query
    token i's layer output and that output with key j's value vector zeroed; value_zeroing_rows:
    the same, each row divided by its sum (Mohebbi et al.'s maps). All float64.
    """

    run: AttentionRun
    head_norms: np.ndarray
    summed_norms: np.ndarray
    value_zeroing: np.ndarray
    value_zeroing_rows: np.ndarray


@torch.inference_mode()
def measure_layers(loaded: LoadedModel, texts: list[str], spec: RunSpec) -> list[list[MeasuredLayer]]:
    """Every layer of every text, measured[text][layer]: the runs are run_layers' (self-attention of
    spec.stack; spec.layer and spec.kv_text are not used), one forward pass for the batch."""
    spec = replace(spec, kv_text=None)
    layers = build_layers(loaded, spec)
    encoded = encode_texts(loaded, texts, spec)
    passes = iter_layer_passes(loaded, encoded, layers, spec, in_berts_place(loaded, spec))
    by_layer = [
        _measured(loaded, texts, encoded, spec, layer, layers[layer], state, output, patterns)
        for layer, (state, output, patterns) in enumerate(passes)
    ]  # by_layer[layer][text]
    return [list(text_layers) for text_layers in zip(*by_layer)]


@torch.inference_mode()
def measure_layer(loaded: LoadedModel, texts: list[str], spec: RunSpec) -> list[MeasuredLayer]:
    """spec.layer of every text, one MeasuredLayer per text: the runs are run_attention's (with
    spec.kv_text, keys and values come from that text; value zeroing then zeroes its tokens)."""
    done = layer_pass(loaded, texts, spec)
    return _measured(loaded, texts, done.encoded, spec, spec.layer, done.attention, done.states, done.output, done.patterns)


def _measured(
    loaded: LoadedModel,
    texts: list[str],
    encoded: EncodedTexts,
    spec: RunSpec,
    layer: int,
    attention: MultiHeadAttention,
    state: LayerStates,
    output: torch.Tensor,
    patterns: torch.Tensor,
) -> list[MeasuredLayer]:
    """One layer's padded batch, its output (B, Nq, D) and weights (B, H, Nq, Nk), measured and cut into one MeasuredLayer per text."""
    keys = encoded.keys if encoded.keys is not None else encoded.queries
    runs = split_runs(loaded, texts, encoded.queries, keys, output, patterns, spec, layer, *layer_sizes(attention))
    if spec.words:
        return [_measured_words(run, index, attention, state, patterns) for index, run in enumerate(runs)]
    transformed = transformed_values(attention, state.keys)  # (B, H, Nk, D): the layer's values are its keys' states
    per_head = head_norms(patterns, transformed)  # (B, H, Nq, Nk)
    summed_squared = summed_squared_norms(patterns, transformed)  # (B, Nq, Nk)
    distances = value_zeroing_distances(attention, state.keys, patterns, summed_squared)  # (B, Nq, Nk)
    per_head, summed, distances = (t.cpu().numpy() for t in (per_head, summed_squared.sqrt(), distances))
    measured = []
    for index, run in enumerate(runs):
        num_queries, num_keys = run.attention.shape[1:]  # the text's own tokens, padding cut
        text_distances = distances[index, :num_queries, :num_keys]
        measured.append(
            MeasuredLayer(
                run=run,
                head_norms=per_head[index, :, :num_queries, :num_keys].copy(),
                summed_norms=summed[index, :num_queries, :num_keys].copy(),
                value_zeroing=text_distances.copy(),
                value_zeroing_rows=normalise_rows(text_distances),
            )
        )
    return measured


@dataclass
class RunMeasures:
    """The measures of one text's run beside its weights (None where not asked for).

    norm_heads (H, Nq, Nk) and norm (Nq, Nk): Kobayashi et al.'s norms, per head and heads summed;
    value_zeroing (Nq, Nk): the raw cosine distances, value_zeroing_rows the rows divided by their sums;
    flow: attention flow through layers 0 to the run's layer (flow_layers of them). Over words with --words.
    """

    names: tuple[str, ...]
    norm_heads: np.ndarray | None = None
    norm: np.ndarray | None = None
    value_zeroing: np.ndarray | None = None
    value_zeroing_rows: np.ndarray | None = None
    flow: AttentionFlow | None = None
    flow_layers: int | None = None


def _measured_words(run: AttentionRun, index: int, attention: MultiHeadAttention, state: LayerStates, patterns) -> MeasuredLayer:
    """Text `index` of a padded batch measured over its words (word_measures.py); run is its run over words."""
    words = run.words
    num_queries, num_keys = len(words.query_tokens), len(words.key_tokens)
    values = state.keys[min(index, state.keys.shape[0] - 1), :num_keys]  # --kv: one keys' text for the batch
    pattern = patterns[index, :, :num_queries, :num_keys].contiguous()  # (H, Nq, Nk): the text's own, padding cut
    maps = word_maps(attention, values.contiguous(), pattern, words.query_word, words.key_word)
    return MeasuredLayer(run, maps.head_norms, maps.summed_norms, maps.value_zeroing, maps.value_zeroing_rows)


def check_measures(loaded: LoadedModel, text: str, spec: RunSpec, names: tuple[str, ...]) -> None:
    """Refuse what a measure cannot do, before any pass: flow of cross-attention, flow of a text too long."""
    if "flow" not in names:
        return
    if spec.cross_attention:
        raise AttnvizError("flow follows self-attention through the layers: it cannot be measured with --kv or --stack cross")
    check_flow_length(len(loaded.tokenizer_for(spec.stack).encode_batch([text])[0]))


@torch.inference_mode()
def measure_text(loaded: LoadedModel, text: str, spec: RunSpec, names: tuple[str, ...]) -> tuple[AttentionRun, RunMeasures]:
    """The run of one text at spec.layer (run_attention's) and the measures named (measure_names)."""
    from itertools import islice

    check_measures(loaded, text, spec, names)
    measures = RunMeasures(names)
    if {"norm", "value-zeroing"} & set(names):
        (measured,) = measure_layer(loaded, [text], spec)
        run = measured.run
        if "norm" in names:
            measures.norm_heads, measures.norm = measured.head_norms, measured.summed_norms
        if "value-zeroing" in names:
            measures.value_zeroing, measures.value_zeroing_rows = measured.value_zeroing, measured.value_zeroing_rows
    else:
        (run,) = run_attention(loaded, [text], spec)
    if "flow" in names:
        layer_runs = [runs[0] for runs in islice(iter_layer_runs(loaded, [text], spec), spec.layer + 1)]
        measures.flow, measures.flow_layers = runs_flow(layer_runs), len(layer_runs)
    return run, measures


def runs_flow(layer_runs: list[AttentionRun]) -> AttentionFlow:
    """Attention flow through one text's runs, one per layer in order; over words when the runs are
    (the flow from each output token to the set of a word's input tokens, word_measures.py)."""
    words = layer_runs[0].words
    if words is None:
        return attention_flow([run.attention for run in layer_runs])
    token_attention = [run.words.token_attention for run in layer_runs]
    flow = word_means(words.query_word) @ attention_flow(token_attention, key_words=words.key_word).flow  # (Wq, Wk)
    return AttentionFlow(flow, normalise_rows(flow))


@dataclass
class LayersMeasures:
    """The measures of one text through every layer (attnviz layers --measure), None where not asked for.

    norm (L, N, N): ‖Σ_h α^h_ij f^h(x_j)‖ of each layer; value_zeroing and value_zeroing_rows (L, N, N)
    each layer's; flow: attention flow through every layer (rollout's graph). Over words with --words.
    """

    names: tuple[str, ...]
    norm: np.ndarray | None = None
    value_zeroing: np.ndarray | None = None
    value_zeroing_rows: np.ndarray | None = None
    flow: AttentionFlow | None = None


@torch.inference_mode()
def measure_every_layer(
    loaded: LoadedModel, text: str, spec: RunSpec, names: tuple[str, ...]
) -> tuple[list[AttentionRun], LayersMeasures]:
    """Every layer's run of the text (run_layers') and the measures named, every layer at once."""
    check_measures(loaded, text, spec, names)
    measures = LayersMeasures(names)
    if {"norm", "value-zeroing"} & set(names):
        (measured,) = measure_layers(loaded, [text], spec)
        layer_runs = [layer.run for layer in measured]
        if "norm" in names:
            measures.norm = np.stack([layer.summed_norms for layer in measured])
        if "value-zeroing" in names:
            measures.value_zeroing = np.stack([layer.value_zeroing for layer in measured])
            measures.value_zeroing_rows = np.stack([layer.value_zeroing_rows for layer in measured])
    else:
        (layer_runs,) = run_layers(loaded, [text], spec)
    if "flow" in names:
        measures.flow = runs_flow(layer_runs)
    return layer_runs, measures

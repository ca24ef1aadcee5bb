"""attnviz.heads, trace, stats, layers, compare, position: the commands' computations as functions.

Each checks what it can before loading a model (with the CLI's own checks and messages), builds
the run's RunSpec once, calls the same stage functions as the command, and returns a result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from attnviz.analysis.measure_names import measure_names
from attnviz.api.models import Model, load
from attnviz.errors import AttnvizError
from attnviz.spec import (
    check_text,
    check_trace_texts,
    refuse_causal_cross_attention,
    refuse_cross_over_every_layer,
    run_spec,
)

ModelArg = str | Path | Model | None


def heads(
    text: str | list[str],
    *,
    model: ModelArg = None,
    layer: int = 0,
    heads: int | None = None,
    weights: str = "pretrained",
    seed: int = 0,
    kv: str | None = None,
    causal: bool = False,
    stack: str | None = None,
    device: str = "auto",
    truncate: bool = False,
    words: bool = False,
    measure: str = "weights",
):
    """One layer's heads over a text (a HeadsResult), or over a list of texts (a list, run in padded batches).

    heads splits the projections into that many heads (None: the model's own); weights are the
    layer's parameters, "pretrained" or "random" (from seed); kv takes keys and values from
    another text; causal masks future keys (a decoder's own attention is causal already).
    stack picks an encoder-decoder's attention: "encoder" (default), "decoder" or "cross"
    (the decoder over the encoder's output for kv, or for each text itself without kv).
    words shows words, not word pieces (Clark et al. 2019: attention to a word is the sum over its
    pieces, from a word the mean); each run's words holds the tokens and the word of each.
    measure adds what the weights leave out (analysis/measure_names.py): "norm" (Kobayashi et al.
    2020), "value-zeroing" (Mohebbi et al. 2023), "flow" (Abnar & Zuidema 2020) or "all", in each
    result's measures (attnviz.analysis.measures.RunMeasures); "weights" (default) adds none.
    """
    from attnviz.api.results import HeadsResult
    from attnviz.output.batch import run_in_batches

    texts = _texts(text)
    check_text(kv, "the --kv text")
    refuse_causal_cross_attention(kv, causal, stack)
    names = measure_names(measure)
    refuse_before_loading(model, stack)
    handle = load(model, device)
    spec = run_spec_for(
        handle, heads, layer=layer, weights=weights, seed=seed, causal=causal, kv_text=kv, stack=stack, truncate=truncate,
        words=words,
    )
    _check_lengths(handle.loaded, texts, truncate)
    num_layers = handle.loaded.num_layers_of(spec.stack)
    if names:
        return _measured_heads(handle, text, texts, spec, names, num_layers)
    runs = [run for batch in run_in_batches(handle.loaded, texts, spec) for run in batch]
    results = [HeadsResult(run, spec, num_layers) for run in runs]
    return results if isinstance(text, (list, tuple)) else results[0]


def _measured_heads(handle: Model, text, texts: list[str], spec, names: tuple[str, ...], num_layers: int):
    """heads with measures: every text checked (flow's length) before any pass, then measured one by one."""
    from attnviz.analysis.measures import check_measures, measure_text
    from attnviz.api.results import HeadsResult

    for each in texts:
        check_measures(handle.loaded, each, spec, names)
    results = [HeadsResult(run, spec, num_layers, measures) for run, measures in (measure_text(handle.loaded, each, spec, names) for each in texts)]
    return results if isinstance(text, (list, tuple)) else results[0]


def trace(
    text: str | list[str],
    *,
    layout: str | None = None,
    mistake: str | None = None,
    model: ModelArg = None,
    layer: int = 0,
    heads: int | None = None,
    weights: str = "pretrained",
    seed: int = 0,
    kv: str | None = None,
    causal: bool = False,
    stack: str | None = None,
    device: str = "auto",
    truncate: bool = False,
    words: bool = False,
):
    """Every split and merge of the heads with the real shapes (a TraceResult); a list of texts is one padded batch.

    layout is one of attnviz's LAYOUTS or "all" (every layout, checked against each other); None
    is the model's own: fused-qkv for GPT-2 (its c_attn stores W_q, W_k, W_v as one), else view-permute.
    mistake makes a reshape mistake in view-permute and shows where it goes wrong; stack as in heads.
    """
    from attnviz.api.results import TraceResult
    from attnviz.pipeline import run_attention
    from attnviz.tracing import LAYOUTS, model_layout, trace_texts

    texts = _texts(text)
    check_text(kv, "the --kv text")
    refuse_causal_cross_attention(kv, causal, stack)
    check_trace_texts(texts)
    refuse_before_loading(model, stack)
    handle = load(model, device)
    spec = run_spec_for(
        handle, heads, layer=layer, weights=weights, seed=seed, causal=causal, kv_text=kv, stack=stack, truncate=truncate,
        words=words,
    )
    _check_lengths(handle.loaded, texts, truncate)
    layout = layout or model_layout(handle.loaded)
    layouts = LAYOUTS if layout == "all" else (layout,)
    traced = trace_texts(handle.loaded, texts, spec, layouts=layouts, mistake=mistake)
    return TraceResult(traced, run_attention(handle.loaded, texts, spec), spec, handle.loaded.num_layers_of(spec.stack))


def stats(
    texts: str | list[str],
    *,
    model: ModelArg = None,
    heads: int | None = None,
    weights: str = "pretrained",
    seed: int = 0,
    causal: bool = False,
    stack: str | None = None,
    device: str = "auto",
    truncate: bool = False,
    words: bool = False,
    js: bool = True,
    progress: Callable[[int], None] | None = None,
):
    """Statistics and labels of every head of every layer, averaged over the texts (a StatsResult).

    stack: an encoder-decoder's "encoder" (default) or "decoder" self-attention. words: every
    statistic over each text's maps merged into words (as in heads), previous and next the words
    beside. js: also the Jensen-Shannon distances between heads (.js_distance and the figure), most
    of the statistics' work: a log for every key of every pair of heads. progress(n), when given,
    is called after each batch with the number of texts it measured.
    """
    from attnviz.api.analysis_results import StatsResult
    from attnviz.analysis.measure import measure_heads
    from attnviz.analysis.statistics import absent_key_kinds_note
    from attnviz.models.tokens import text_truncations

    texts = _texts(texts)
    refuse_cross_over_every_layer(stack)
    refuse_before_loading(model, stack)
    handle = load(model, device)
    loaded = handle.loaded
    spec = run_spec_for(
        handle, heads, layer=None, weights=weights, seed=seed, causal=causal, kv_text=None, stack=stack, truncate=truncate,
        words=words, js=js,
    )
    _check_lengths(loaded, texts, truncate)
    measured = measure_heads(loaded, texts, spec, advance=progress or (lambda done: None))
    truncated = text_truncations(loaded.tokenizer, texts, loaded.max_positions) if truncate else [None] * len(texts)
    first = measured.first_run
    key_kinds_note = absent_key_kinds_note(first.family, first.query_tokens)
    notices = [*measured.notices, *([key_kinds_note] if key_kinds_note else [])]
    return StatsResult(measured.stats, texts, truncated, first, spec, notices)


def layers(
    text: str,
    *,
    model: ModelArg = None,
    heads: int | None = None,
    weights: str = "pretrained",
    seed: int = 0,
    causal: bool = False,
    stack: str | None = None,
    device: str = "auto",
    truncate: bool = False,
    words: bool = False,
    measure: str = "weights",
):
    """Every layer's heads over one text, and attention rollout through the layers (a LayersResult).

    words as in heads; measure adds every layer's measures (analysis.measures.LayersMeasures):
    "norm", "value-zeroing", "flow" through every layer beside the rollout, or "all".

    stack: an encoder-decoder's "encoder" (default) or "decoder" self-attention.
    """
    from attnviz.analysis.rollout import runs_rollout
    from attnviz.api.analysis_results import LayersResult
    from attnviz.pipeline import run_layers

    (text,) = _texts(text, one=True)
    refuse_cross_over_every_layer(stack)
    measure_names(measure)
    refuse_before_loading(model, stack)
    handle = load(model, device)
    spec = run_spec_for(
        handle, heads, layer=None, weights=weights, seed=seed, causal=causal, kv_text=None, stack=stack, truncate=truncate,
        words=words,
    )
    names = measure_names(measure)
    if names:
        from attnviz.analysis.measures import measure_every_layer

        layer_runs, measures = measure_every_layer(handle.loaded, text, spec, names)
        return LayersResult(layer_runs, runs_rollout(layer_runs), spec, measures)
    (layer_runs,) = run_layers(handle.loaded, [text], spec)
    return LayersResult(layer_runs, runs_rollout(layer_runs), spec)


def compare(
    text: str,
    *,
    heads: str | list[int] | None = None,
    weights: str | list[str] = "pretrained",
    model: ModelArg = None,
    layer: int = 0,
    seed: int = 0,
    device: str = "auto",
    truncate: bool = False,
):
    """The same layer's projections split into several head counts (default 1, 4 and the model's own), and
    pretrained beside random parameters when weights is ["pretrained", "random"] (a CompareResult)."""
    from attnviz.api.analysis_results import CompareResult
    from attnviz.analysis.compare import compare_splits, default_head_counts, parse_head_counts, parse_weights

    (text,) = _texts(text, one=True)
    counts = parse_head_counts(_comma_list(heads)) if heads is not None else None
    weights_list = parse_weights(_comma_list(weights))
    refuse_before_loading(model, needs_bert=COMPARE_NEEDS_BERT)
    handle = load(model, device)
    loaded = handle.loaded
    require_bert(handle, COMPARE_NEEDS_BERT)
    counts = counts or default_head_counts(loaded.hidden_size, loaded.num_heads)
    spec = run_spec(  # what the splits share; each split's head count and weights are its own
        loaded, handle.name, device=handle.device, layer=layer, num_heads=None, weights=None, seed=seed, causal=False,
        kv_text=None, truncate=truncate,
    )  # fmt: skip
    splits = compare_splits(loaded, text, counts, weights_list, spec)
    return CompareResult(splits, spec)


def position(
    text: str,
    *,
    permutation: str | list[int] | None = None,
    head: int | None = None,
    model: ModelArg = None,
    device: str = "auto",
):
    """Why attention needs position embeddings: layer 0 over the text and its permutation (a PositionResult).

    permutation is the new order of the token positions, [CLS] and [SEP] included (default:
    the tokens between them reversed); head the head the figure shows (default: the one
    position embeddings change most).
    """
    from attnviz.api.analysis_results import PositionResult
    from attnviz.pipeline import device_label
    from attnviz.analysis.position import LAYER, position_experiment

    (text,) = _texts(text, one=True)
    refuse_before_loading(model, needs_bert=POSITION_NEEDS_BERT)
    handle = load(model, device)
    require_bert(handle, POSITION_NEEDS_BERT)
    spec = run_spec(  # position runs layer 0 with the model's own parameters and heads
        handle.loaded, handle.name, device=handle.device, layer=LAYER, num_heads=handle.loaded.num_heads,
        weights="pretrained", seed=0, causal=False, kv_text=None, truncate=False,
    )  # fmt: skip
    spec_text = _comma_list(permutation) if permutation is not None else None
    result = position_experiment(handle.loaded, text, spec_text, head, handle.device)
    return PositionResult(result, spec, handle.source, device_label(handle.device))


def run_spec_for(handle: Model, heads: int | None, **settings):
    """The call's RunSpec (spec.run_spec) with heads resolved for its stack: the model's own count when None."""
    from attnviz.pipeline import resolve_num_heads

    spec = run_spec(handle.loaded, handle.name, device=handle.device, num_heads=None, **settings)
    return replace(spec, num_heads=resolve_num_heads(handle.loaded, heads, spec.stack))


# What the BERT-only commands say to any other family (require_bert fills in the model and its family).
POSITION_NEEDS_BERT = (
    "attnviz position needs a BERT model: it takes BERT's learned position embeddings out of the layer's input, "
    "and {model} is a {family}"
)
COMPARE_NEEDS_BERT = (
    "attnviz compare needs a BERT model: it re-splits BERT's projections into other head counts, "
    "and {model} is a {family} (attnviz heads --heads N splits its projections another way)"
)


def refuse_before_loading(model: ModelArg, stack: str | None = None, needs_bert: str | None = None) -> None:
    """Refuse --stack, or a BERT-only command, for a model whose family is known before loading it (a folder's config.json)."""
    from attnviz.api.models import family_before_loading
    from attnviz.spec import refuse_stack

    if stack is None and needs_bert is None:
        return
    family = family_before_loading(model)
    if family is None:  # known once loaded: run_spec and require_bert check it then
        return
    name = model.loaded.name if isinstance(model, Model) else str(model)
    refuse_stack(name, family, stack)
    if needs_bert is not None and family.name != "BERT":
        raise AttnvizError(needs_bert.format(model=name, family=f"{family.name} {family.kind}"))


def require_bert(handle: Model, needs_bert: str) -> None:
    """A BERT-only command (needs_bert: POSITION_NEEDS_BERT or COMPARE_NEEDS_BERT) refuses a loaded model of another family."""
    if not handle.loaded.is_bert:
        raise AttnvizError(needs_bert.format(model=handle.loaded.name, family=f"{handle.family} {handle.kind}"))


def _texts(text, one: bool = False) -> list[str]:
    """The texts of a call, each checked as the command line checks its TEXT."""
    texts = list(text) if isinstance(text, (list, tuple)) and not one else [text]
    if not texts:
        raise AttnvizError("no texts: give a text, or a list of texts")
    for each in texts:
        if not isinstance(each, str):
            raise AttnvizError(f"a text must be a str, not {type(each).__name__}")
        check_text(each)
    return texts


def _check_lengths(loaded, texts: list[str], truncate: bool) -> None:
    """Name the first text of a list too long for the model ("texts[2] has 602 tokens, ..."), before any work."""
    from attnviz.models.tokens import check_lengths

    if len(texts) > 1 and not truncate:
        counts = [len(ids) for ids in loaded.tokenizer.encode_batch(texts)]
        check_lengths(counts, loaded.max_positions, [f"texts[{index}]" for index in range(len(texts))])


def _comma_list(value) -> str:
    """A list given to the API as the command line's comma list (1,4,12), so the same parser checks it."""
    return value if isinstance(value, str) else ",".join(str(item) for item in value)

"""attnviz.heads, trace, stats, layers, compare, position: the commands' computations as functions.

Each takes the run's options as keywords (RunOptions' fields, api/options.py: model, layer,
heads, weights, seed, kv, causal, stack, device, dtype, truncate, words; stats and layers all but layer
and kv) and its own arguments, checks them all before loading a model (with the CLI's own checks
and messages), builds the run's RunSpec once (RunOptions.run_spec), calls the same stage
functions as the command, and returns a result.
"""

from __future__ import annotations

from dataclasses import replace

from attnviz.analysis.effect import head_effects
from attnviz.analysis.measure_names import measure_names
from attnviz.api.models import Model
from attnviz.api.arguments import must_be_bool, must_be_int, must_be_one_of, must_be_progress, must_be_str, must_be_str_or_list
from attnviz.api.checks import _check_lengths, _comma_list, _texts, refuse_before_loading, require_bert, summarised_in_its_run, token_counts, warn_run_notes
from attnviz.api.drawn import check_drawing, check_head_of, window_name
from attnviz.api.options import EVERY_LAYER_OPTIONS, TRACE_OPTIONS, RunOptions, run_options, takes_options
from attnviz.errors import AttnvizError, option, options_named
from attnviz.spec import check_seed_head_sizes, check_trace_texts, refuse_cross_over_every_layer

COMPARE_OPTIONS = ("model", "layer", "seed", "device", "dtype", "truncate", "allow_pickle")  # compare's heads and weights are lists: its own
POSITION_OPTIONS = ("model", "device", "dtype", "allow_pickle")  # position runs layer 0 with the model's own parameters and heads


@takes_options()
def heads(
    text: str | list[str], *, measure: str = "weights", layer_summaries: bool | None = False, effect: str | None = None,
    vectors: bool | None = False, report: bool = False, trace: bool = False, head: int | None = None, window=None,
    progress=None, **options,
):  # fmt: skip
    """One layer's heads over a text (a HeadsResult), or over a list of texts (a list, run in padded batches).

    options are RunOptions' (attnviz.RunOptions): heads splits the projections into that many
    heads (None: the model's own); weights are the layer's parameters, "pretrained" or "random"
    (from seed); kv takes keys and values from another text; causal masks future keys (a
    decoder's own attention is causal already). stack picks an encoder-decoder's attention:
    "encoder" (default), "decoder" or "cross" (the decoder over the encoder's output for kv, or for
    each text itself without kv). words shows words, not word pieces (Clark et al. 2019: attention
    to a word is the sum over its pieces, from a word the mean); each run's words holds the tokens
    and the word of each.
    measure adds what the weights leave out (analysis/measure_names.py): "norm" (Kobayashi et al.
    2020), "value-zeroing" (Mohebbi et al. 2023), "flow" (Abnar & Zuidema 2020) or "all", in each
    result's measures (attnviz.analysis.measures.RunMeasures); "weights" (default) adds none.
    layer_summaries: also every head of every layer summarised (attnviz.layers' summaries: the sink, entropy,
    distance, ...) from the same forward pass, as a long text's report shows them: result.layer_summaries.
    One text, self-attention, weights alone (no measure). None: where a report of the text would show them (one text
    long enough to be zoomed, summarised_in_its_run), as `attnviz heads` writes report.html.
    effect: also each head's effect on the model's output, taken out in turn (analysis/effect.py, Michel et al.
    2019): "zero" (its output set to 0) or "mean" (replaced by its mean over the text's positions): a decoder's (and
    an encoder-decoder's, a head of any stack) KL of the next-token distributions and loss change, an encoder's
    cosine distance of the last hidden states (and of the sentence embedding, for a sentence-transformers model),
    in result.effects. One text; the model's own heads and weights.
    vectors: also each head's query and key vectors (after RoPE; a key/value head's once), whose dot product is the
    head's score before the scale: result.vectors (analysis.neurons.QueryKeyVectors), the report's neuron view. One text,
    over tokens. None: where a report of the text holds them (one text of at most 64 tokens, over tokens, no measure).
    report: also each text's interactive report, as attnviz.report makes it (every layer, the rollout and statistics,
    the traces and mistakes, the neuron view), made from the same pass of the model as the run (one per padded batch):
    result.report() returns it, and its numbers are the run's very floats. With a measure, the report takes passes
    of its own (the measures run theirs).
    trace: also the text's shape trace, as attnviz.trace gives it (the model's own layout): result.traced (a
    TraceResult). One text. With report (no measure, no layer_summaries) it is made of the run's capture; else it
    takes attnviz.trace's own pass.
    head and window: what will be drawn of the result (result.figure(head, window), `heads --head N --window ...`),
    checked as the command checks them (api/drawn.py): window's form and head against heads= before the model loads,
    head against the model's own heads before the layer is computed, window's range on each text's map.
    progress(n), when given, is called after each n units of the long work: with effect, the heads taken out (all of
    them at once, the layer's copies being one batch); with layer_summaries, the layers the forward pass reaches, then
    the layers summarised. A progress that also has .stage(what, total) is told as each begins ("heads taken out", 9).
    """
    from attnviz.api.run_results import HeadsResult
    from attnviz.output.batch import run_in_batches

    options = run_options("heads", options)
    texts = _texts(text)
    names = measure_names(must_be_str("measure", measure))
    wanted = layer_summaries is not None and must_be_bool("layer_summaries", layer_summaries)
    if wanted and (not isinstance(text, str) or names or options.kv or options.stack == "cross"):
        raise AttnvizError('layer_summaries=True summarises one text\'s self-attention: give one str, no kv, no stack="cross", no measure')
    check_effect(effect, text, options)
    progress = must_be_progress(progress)
    wants_report = must_be_bool("report", report)
    if must_be_bool("trace", trace) and not isinstance(text, str):
        raise AttnvizError("trace=True traces one text: give one str, not a list")
    if vectors is not None and must_be_bool("vectors", vectors) and (not isinstance(text, str) or options.words or names):
        raise AttnvizError("vectors=True gives one text's query and key vectors over its tokens: give one str, no words, no measure")
    check_drawing(head, window, heads=options.heads)
    refuse_before_loading(options)
    handle = options.load()
    spec = options.run_spec(handle)
    check_head_of(head, handle, spec)
    _check_lengths(handle.loaded, texts, options.truncate)
    num_layers = handle.loaded.num_layers_of(spec.stack)
    effects = head_effects(handle.loaded, texts[0], spec, effect, [spec.layer], progress) if effect is not None else None
    if layer_summaries is None:  # as the report of this text summarises it
        layer_summaries = isinstance(text, str) and not names and summarised_in_its_run(handle.loaded, texts, spec.cross_attention)
    vector_tokens = _vector_tokens(vectors, isinstance(text, str) and not options.words and not names)
    parts = None  # with report: each text's ReportText and its notes, made from the run's capture
    traced = None  # with trace: its TraceResult
    if names:
        results = _measured_heads(handle, texts, spec, names, num_layers)
    elif wants_report and not layer_summaries:  # one capture: the runs, and every layer, the traces, the vectors
        from attnviz.analysis.neurons import MAX_VECTOR_TOKENS
        from attnviz.api.report_parts import captured_report

        report_tokens = max(vector_tokens, 0 if options.words else MAX_VECTOR_TOKENS)  # the report's neuron view's too
        captures = [] if trace else None  # the trace's one text's capture, kept past the report's parts
        made = captured_report(handle.loaded, texts, spec, progress, report_tokens, captures=captures)
        results = [HeadsResult(run if vector_tokens else replace(run, vectors=None), spec, num_layers) for run, _, _ in made]
        parts = [(part, notes) for _, part, notes in made]
        if trace:
            traced = _trace_of_capture(handle, texts, spec, captures[0], [made[0][0]])
    elif layer_summaries:
        from attnviz.analysis.head_summaries import run_and_summarise
        from attnviz.budgets import block_budget

        run = run_and_summarise(handle.loaded, texts[0], spec, block_budget(spec), progress=progress, vector_tokens=vector_tokens)
        results = [HeadsResult(run, spec, num_layers)]
    else:
        runs = [run for batch in run_in_batches(handle.loaded, texts, spec, vector_tokens=vector_tokens) for run in batch]
        results = [HeadsResult(run, spec, num_layers) for run in runs]
    if effects is not None:
        results = [replace(results[0], run=replace(results[0].run, effects=effects))]
    if trace:  # a measured or summarised text's, or one without a report: the trace's own pass
        results = [replace(results[0], traced=traced or _own_trace(text, options))]
    if wants_report:
        made_parts = parts or [None] * len(results)
        results = [replace(result, made_report=_report_of(handle, result, part, progress)) for result, part in zip(results, made_parts)]
    for result in results if window is not None else ():
        result.window(window, window_name())
    warn_run_notes((note for result in results for note in result.notes), handle)
    return results if isinstance(text, (list, tuple)) else results[0]


def _own_trace(text: str, options: RunOptions):
    """attnviz.trace of the text with heads' options: its own pass (heads' trace= names the function)."""
    return trace(text, **options.keywords())


def _trace_of_capture(handle: Model, texts: list[str], spec, captured, runs: list):
    """attnviz.trace's TraceResult of the model's own layout over the texts' capture (layer_inputs.Capture): no pass."""
    from attnviz.api.trace_results import TraceResult
    from attnviz.tracing import model_layout, trace_texts

    encoded, states = captured
    traced = trace_texts(handle.loaded, texts, spec, layouts=(model_layout(handle.loaded),), captured=(encoded, states[spec.layer]))
    return TraceResult(traced, runs, spec, handle.loaded.num_layers_of(spec.stack))


def _report_of(handle: Model, result, made, progress):
    """heads(report=True)'s report of a result: from the parts its capture made (made: (ReportText, notes)), with the
    run's effects; else (a measured text's, a long text's: its summaries made) made from the run."""
    from attnviz.api.report_parts import report_of_parts, report_of_runs

    if made is None:
        return report_of_runs(handle.loaded, [result.run], result.spec, progress=progress)
    part, notes = made
    return report_of_parts(handle.loaded, [(replace(part, run=replace(part.run, effects=result.effects)), notes)], result.spec, progress=progress)


def _vector_tokens(vectors: bool | None, one_text_over_tokens: bool) -> int:
    """heads' vectors= as the run's vector_tokens (pipeline.run_attention): True, every text of the call (one, checked);
    None, a text whose report holds them (holds_vectors: at most MAX_VECTOR_TOKENS, over tokens); False, none."""
    from attnviz.analysis.neurons import MAX_VECTOR_TOKENS

    if vectors is None:
        return MAX_VECTOR_TOKENS if one_text_over_tokens else 0
    return 2**62 if vectors else 0


def check_effect(effect, text, options: RunOptions) -> None:
    """effect= names an ablation, over one text and the model's own heads and weights: else refused before loading."""
    from attnviz.analysis.effect import ABLATIONS

    if must_be_one_of("effect", effect, tuple(ABLATIONS), none=True) is None:
        return
    if not isinstance(text, str):
        raise AttnvizError(f"{option('effect')} measures each head over one text: give one str, not a list")
    if options.kv or options.heads is not None or options.weights != "pretrained":
        raise AttnvizError(
            f"{option('effect')} takes the model's own heads out of the model itself: leave out {options_named('kv', 'heads', 'weights')}"
        )


def _measured_heads(handle: Model, texts: list[str], spec, names: tuple[str, ...], num_layers: int) -> list:
    """heads with measures: every text checked (flow's length) before any pass, then measured one by one."""
    from attnviz.analysis.measures import check_measures, measure_text
    from attnviz.api.run_results import HeadsResult

    for each in texts:
        check_measures(handle.loaded, each, spec, names)
    return [HeadsResult(run, spec, num_layers, measures) for run, measures in (measure_text(handle.loaded, each, spec, names) for each in texts)]


@takes_options(TRACE_OPTIONS)
def trace(text: str | list[str], *, layout: str | None = None, mistake: str | None = None, **options):
    """Every split and merge of the heads with the real shapes (a TraceResult); a list of texts is one padded batch.

    layout is one of attnviz's LAYOUTS or "all" (every layout, checked against each other); None
    is the model's own: fused-qkv for GPT-2 (its c_attn stores W_q, W_k, W_v as one), else view-permute.
    mistake makes a reshape mistake in view-permute and shows where it goes wrong; options as in heads,
    and d_q, d_out: with layout="single-head" and weights="random", the single-head tutorial's own
    layer (seed 001): W_q, W_k map D to d_q, W_v maps D to d_out, scale 1/sqrt(d_q), no W_o (either
    one given, the other is D); its map is the one head's A.
    """
    from attnviz.api.trace_results import TraceResult
    from attnviz.layer_inputs import check_layer
    from attnviz.passes import capture_texts
    from attnviz.pipeline import run_attention
    from attnviz.tracing import LAYOUTS, model_layout, seed_head_run, trace_texts

    options = run_options("trace", options, TRACE_OPTIONS)
    must_be_str("layout", layout, none=True)
    must_be_str("mistake", mistake, none=True)
    texts = _texts(text)
    check_trace_texts(texts)
    check_seed_head_sizes(options.d_q, options.d_out, layout, options.weights)
    refuse_before_loading(options)
    handle = options.load()
    spec = options.run_spec(handle)
    _check_lengths(handle.loaded, texts, options.truncate)
    layout = layout or model_layout(handle.loaded)
    layouts = LAYOUTS if layout == "all" else (layout,)
    seed_sizes = None
    if options.d_q is not None or options.d_out is not None:
        seed_sizes = (options.d_q or handle.loaded.hidden_size, options.d_out or handle.loaded.hidden_size)
    check_layer(handle.loaded, spec.layer, spec.stack)
    encoded, states = capture_texts(handle.loaded, texts, spec, [spec.layer])  # one pass: the trace's input and the run's
    captured = (encoded, states[spec.layer])
    traced = trace_texts(handle.loaded, texts, spec, layouts=layouts, mistake=mistake, seed_sizes=seed_sizes, captured=captured)
    runs = run_attention(handle.loaded, texts, spec, captured=captured)
    if seed_sizes is not None:  # the runs' maps are the seed's one head: A, and C its output
        runs = [seed_head_run(run, traced, index) for index, run in enumerate(runs)]
    warn_run_notes((note for run in runs for note in run.notes), handle)
    return TraceResult(traced, runs, spec, handle.loaded.num_layers_of(spec.stack))


@takes_options(EVERY_LAYER_OPTIONS)
def stats(texts: str | list[str], *, js: bool | None = None, progress=None, **options):
    """Statistics and labels of every head of every layer, averaged over the texts (a StatsResult).

    options as in heads, but layer and kv (every layer's self-attention): stack is an
    encoder-decoder's "encoder" (default) or "decoder"; words: every statistic over each text's
    maps merged into words, previous and next the words beside. js: also the Jensen-Shannon
    distances between heads (.js_distance and the figure), most of the statistics' work: a log
    for every key of every pair of heads; None measures them unless a text's map passes the large-map
    size (64 MB, or memory), where they are H² × N² logs a layer (then js=True). progress(n), when given, is called
    after each batch with the number of texts it measured; over one text, after each layer: those its forward pass
    reaches, then those measured. A progress that also has .stage(what, total) is told as each stage begins
    ("texts measured", 40; "layers of the text", 30). memory (MB, as in heads): a batch whose maps pass it (one layer's
    (B, H, N, N) at once), or a text's map past 64 MB, is measured a block of queries at a time, no map
    whole (analysis.blockwise.block_statistics; the same numbers within 1e-5); over words the maps stay whole.
    """
    from attnviz.api.experiment_results import StatsResult
    from attnviz.analysis.stats_pass import measure_heads
    from attnviz.analysis.statistics import absent_key_kinds_note
    from attnviz.models.tokens import text_truncations

    options = run_options("stats", options, EVERY_LAYER_OPTIONS)
    if js is not None:
        must_be_bool("js", js)
    progress = must_be_progress(progress)
    texts = _texts(texts, name="texts")
    refuse_cross_over_every_layer(options.stack)
    refuse_before_loading(options)
    handle = options.load()
    loaded = handle.loaded
    _check_lengths(loaded, texts, options.truncate)
    spec = options.run_spec(handle, layer=None)
    spec = replace(spec, js=js if js is not None else not any(_in_blocks(loaded, text, spec) for text in texts))
    if len(texts) == 1:  # its layers
        measured = measure_heads(loaded, texts, spec, layers=progress)
    else:
        measured = measure_heads(loaded, texts, spec, advance=progress.counting("texts measured", len(texts)))
    truncated = text_truncations(loaded.tokenizer, texts, loaded.max_positions) if options.truncate else [None] * len(texts)
    first = measured.first_run
    key_kinds_note = absent_key_kinds_note(first.family, first.query_tokens)
    notes = [*measured.notes, *([key_kinds_note] if key_kinds_note else [])]
    warn_run_notes(notes, handle)
    return StatsResult(measured.stats, texts, truncated, first, spec, notes)


@takes_options(EVERY_LAYER_OPTIONS)
def layers(text: str, *, measure: str = "weights", band: int = 8, effect: str | None = None, progress=None, **options):
    """Every layer's heads over one text, attention rollout through the layers, and every head summarised (a LayersResult).

    options as in stats; measure adds every layer's measures (analysis.measures.LayersMeasures):
    "norm", "value-zeroing", "flow" through every layer beside the rollout, or "all". The summaries
    (.summaries, analysis.head_summaries: attention sink, relative entropy, distance, the share within
    the local band |i - j| <= band, the previous token, the most-attended keys) are computed a block of
    queries at a time, over tokens (also with words=True). Past the memory budget (memory, MB: every
    layer's maps at once, or 64 MB a layer's), every layer runs a block of queries at a time and no map
    is whole (analysis.long_layers): .attention and .rollout are None, layers.png shows block maxima
    computed from the blocks, .notes says so; measure and words need the whole maps and are refused there.
    effect: also every head of every layer (of the stack) taken out in turn (as heads' effect=), in .effects.
    progress(n), when given, is called after each n units done: with effect, the heads taken out (a layer's at a
    time); then the layers run (past the budget: the layers the forward pass reaches, then the layers done; with a
    measure, not counted). A progress that also has .stage(what, total) is told as each stage begins
    ("heads taken out", 270; "layers of the text", 30).
    """
    from attnviz.analysis.head_summaries import summarise_layers, summarise_runs
    from attnviz.analysis.rollout import runs_rollout
    from attnviz.api.experiment_results import LayersResult
    from attnviz.budgets import block_budget
    from attnviz.pipeline import over_words, run_layers

    options = run_options("layers", options, EVERY_LAYER_OPTIONS)
    (text,) = _texts(text, one=True)
    names = measure_names(must_be_str("measure", measure))
    if must_be_int("band", band) < 0:
        raise AttnvizError(f"band {band}: the local band's half-width is 0 or more tokens")
    refuse_cross_over_every_layer(options.stack)
    check_effect(effect, text, options)
    progress = must_be_progress(progress)
    refuse_before_loading(options)
    handle = options.load()
    spec = options.run_spec(handle, layer=None)
    effects = head_effects(handle.loaded, text, spec, effect, progress=progress) if effect is not None else None
    budget = block_budget(spec)  # a block of the summaries' pass
    if _in_blocks(handle.loaded, text, spec, handle.loaded.num_layers_of(spec.stack)):
        return replace(_long_layers(handle, text, spec, names, band, budget, progress), effects=effects)
    summaries = None  # from the layers' own maps over tokens, the model run once (head_summaries.summarise_runs)
    if names:
        from attnviz.analysis.measures import measure_every_layer

        layer_runs, measures = measure_every_layer(handle.loaded, text, spec, names)
    else:
        (layer_runs,) = run_layers(handle.loaded, [text], replace(spec, words=False), progress)
        summaries = summarise_runs(layer_runs, spec, budget, window=band)
        layer_runs = over_words(handle.loaded, spec, layer_runs) if spec.words else layer_runs
        measures = None
    warn_run_notes(layer_runs[0].notes, handle)  # every layer's run has the text's notes
    if summaries is None:
        summaries = summarise_runs(layer_runs, spec, budget, band) if not spec.words else summarise_layers(handle.loaded, text, spec, budget, band)
    return LayersResult(layer_runs, runs_rollout(layer_runs), spec, measures, summaries, effects=effects)


def _in_blocks(loaded, text: str, spec, num_layers: int = 1) -> bool:
    """Whether the text's maps, num_layers layers' at once, are computed in blocks (budgets.every_layer_in_blocks):
    with one layer, whether its map passes the large-map size (stats' JS distances); with every layer, layers' long path."""
    from attnviz.layer_inputs import encode_texts
    from attnviz.budgets import every_layer_in_blocks
    from attnviz.own_layer import resolve_num_heads

    num_tokens = len(encode_texts(loaded, [text], replace(spec, kv_text=None)).queries.ids[0])
    num_heads = resolve_num_heads(loaded, spec.num_heads, spec.stack)
    return every_layer_in_blocks(spec, 1, num_heads, num_tokens, num_layers)


def _long_layers(handle: Model, text: str, spec, names: tuple[str, ...], band: int, budget: int, progress):
    """layers past the budget: one pass of blocks (analysis.long_layers), no whole map, no rollout (a LayersResult that says so)."""
    from attnviz.analysis.long_layers import layers_in_blocks
    from attnviz.api.experiment_results import LayersResult
    from attnviz.render.stats_figures import layers_panel_cells

    if names:
        raise AttnvizError(
            f"measure {', '.join(names)} over a text this long: its measures need every layer's whole maps, past the "
            "memory budget here; leave measure out (weights: summaries and layers.png in blocks) or give a larger --memory"
        )
    def panel_cells(run, num_layers: int) -> int:
        return layers_panel_cells(run, num_layers, spec.seed)

    done = layers_in_blocks(handle.loaded, text, spec, panel_cells, budget, band, progress)
    warn_run_notes([*done.layer_runs[0].notes, done.note], handle)
    return LayersResult(done.layer_runs, None, spec, None, done.summaries, maxima=done.maxima, notes=[done.note])


@takes_options(COMPARE_OPTIONS)
def compare(text: str, *, heads: str | list[int] | None = None, weights: str | list[str] = "pretrained", **options):
    """The same layer's projections split into several head counts (default 1, 4 and the model's own), and
    pretrained beside random parameters when weights is ["pretrained", "random"] (a CompareResult).

    heads and weights are comma lists ("1,4,12") or lists; options: model, layer, seed, device, dtype, truncate, allow_pickle.
    """
    from attnviz.api.compare_results import CompareResult
    from attnviz.analysis.compare import compare_splits, default_head_counts, parse_head_counts, parse_weights

    options = run_options("compare", options, COMPARE_OPTIONS)
    must_be_str_or_list("heads", heads, int, none=True)
    must_be_str_or_list("weights", weights, str)
    (text,) = _texts(text, one=True)
    counts = parse_head_counts(_comma_list(heads)) if heads is not None else None
    weights_list = parse_weights(_comma_list(weights))
    refuse_before_loading(options, needs_bert=COMPARE_NEEDS_BERT)
    handle = options.load()
    loaded = handle.loaded
    require_bert(handle, COMPARE_NEEDS_BERT)
    counts = counts or default_head_counts(loaded.hidden_size, loaded.num_heads)
    # What the splits share; each split's head count and weights are its own.
    shared = replace(options.run_spec(handle, weights=None), num_heads=None)
    result = CompareResult(compare_splits(loaded, text, counts, weights_list, shared), shared)
    warn_run_notes(result.splits[0].run.notes, handle)  # every split has the text's notes
    return result


@takes_options(POSITION_OPTIONS)
def position(text: str, *, permutation: str | list[int] | None = None, head: int | None = None, **options):
    """Why attention needs position embeddings: layer 0 over the text and its permutation (a PositionResult).

    permutation is the new order of the token positions, [CLS] and [SEP] included (default:
    the tokens between them reversed); head the head the figure shows (default: the one
    position embeddings change most); options: model, device, dtype, allow_pickle.
    """
    from attnviz.api.compare_results import PositionResult
    from attnviz.layer_inputs import device_label, threads_for_tokens
    from attnviz.analysis.position import LAYER, position_experiment

    options = run_options("position", options, POSITION_OPTIONS)
    must_be_str_or_list("permutation", permutation, int, none=True)
    head = must_be_int("head", head, none=True)
    (text,) = _texts(text, one=True)
    refuse_before_loading(options, needs_bert=POSITION_NEEDS_BERT)
    handle = options.load()
    require_bert(handle, POSITION_NEEDS_BERT)
    spec = options.run_spec(handle, layer=LAYER)  # the model's own parameters and heads
    spec_text = _comma_list(permutation) if permutation is not None else None
    with threads_for_tokens(token_counts(handle.loaded, [text])[0]):  # the one rule for torch's threads
        result = position_experiment(handle.loaded, text, spec_text, head, handle.device)
    warn_run_notes(result.notes, handle)
    return PositionResult(result, spec, handle.source, device_label(handle.device))


# What the BERT-only commands say to any other family (require_bert fills in the model and its family).
POSITION_NEEDS_BERT = (
    "attnviz position needs a BERT model: it takes BERT's learned position embeddings out of the layer's input, "
    "and {model} is a {family}"
)
COMPARE_NEEDS_BERT = (
    "attnviz compare needs a BERT model: it re-splits BERT's projections into other head counts, "
    "and {model} is a {family} (attnviz heads --heads N splits its projections another way)"
)

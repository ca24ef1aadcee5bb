"""attnviz.report: the offline HTML report (report.html) of one or more texts, and what it returns.

The report is a face over the stages' own numbers: per text the run's layer (as attnviz.heads
runs it), for self-attention every layer (attnviz.layers) with the rollout and the text's own
statistics (attnviz.stats on that text alone), and the shape trace of every layout with each
reshape mistake (attnviz.trace). attnviz.html turns them into the record and the page.

A long text (past html/pyramid.py's ZOOM_MIN_TOKENS) gets no whole map of any layer: the run's layer
(a memory map of attention.npy past its size) goes to the zoom view's pyramid, and every layer's heads
are summarised block by block (analysis/head_summaries.py); no rollout, statistics or trace, which need
whole maps (html/record.py's LONG_TEXT_NOTE). Such a text has a report of its own.
"""

from __future__ import annotations

from dataclasses import replace

from attnviz.api.arguments import must_be_progress
from attnviz.api.experiment_results import text_statistics
from attnviz.api.functions import _check_lengths, _texts, holds_vectors, refuse_before_loading, summarised_in_its_run, token_counts, warn_run_notes
from attnviz.api.options import run_options, takes_options
from attnviz.api.run_results import ReportResult, report_result
from attnviz.errors import AttnvizError
from attnviz.run_data import Progress
from attnviz.spec import RunSpec

MAX_REPORT_TEXTS = 64  # one page holds every text's layers and traces: a few MB each for short texts
# The weights of every layer's maps of all its texts (L × H × N² each): about 30 MB of page and 64 MB of
# float32 to encode. 64 texts of 20 tokens fit, 14 of 128 tokens (6 layers × 12 heads); a first text always does.
MAX_REPORT_WEIGHTS = 2**24


@takes_options()
def report(text_or_texts: str | list[str], progress=None, **options) -> ReportResult:
    """The interactive report of a text, or of a list of texts (at most MAX_REPORT_TEXTS), as a ReportResult.

    options are attnviz.heads' (RunOptions' fields). Self-attention adds every layer, the rollout
    and each text's statistics; cross-attention (kv, or stack="cross") shows the run's layer and its
    trace only. words: the maps over words, as attnviz.heads(words=True) shows them (the traces stay
    over tokens). A long text (past 512 tokens, or its map on disk) has a report of its own: its layer's
    map zoomable and every head of every layer summarised, no whole map (the module's docstring).
    progress(n), when given, is called after each n layers done, stage by stage: for each text, its layers run and
    then the layers of its statistics; a long text's, the layers its forward pass reaches, then the layers
    summarised. A progress that also has .stage(what, total) is told as each begins ("layers of the text", 30).
    """
    from attnviz.output.batch import run_in_batches

    options = run_options("report", options)
    texts = _texts(text_or_texts, name="text_or_texts")
    progress = must_be_progress(progress)
    check_report_count(len(texts))
    refuse_before_loading(options)
    handle = options.load()
    spec = options.run_spec(handle)
    _check_lengths(handle.loaded, texts, options.truncate)
    check_report_size(handle.loaded, texts, spec)
    if summarised_in_its_run(handle.loaded, texts, spec.cross_attention):
        from attnviz.analysis.head_summaries import run_and_summarise
        from attnviz.budgets import block_budget

        runs = [run_and_summarise(handle.loaded, texts[0], spec, block_budget(spec), progress=progress)]
    else:
        runs = [run for batch in run_in_batches(handle.loaded, texts, spec) for run in batch]
    result = report_of_runs(handle.loaded, runs, spec, progress=progress)
    warn_run_notes(result.record["notes"], handle)  # the runs' notes and what the page leaves out
    return result


def check_report_count(count: int) -> None:
    """A report holds at most MAX_REPORT_TEXTS texts: refused before any work."""
    if count > MAX_REPORT_TEXTS:
        raise AttnvizError(
            f"a report holds at most {MAX_REPORT_TEXTS} texts, not {count}: split them into several reports"
        )


def texts_that_fit(loaded, texts: list[str], spec: RunSpec) -> tuple[int, int]:
    """How many of the texts, from the first, one report holds, and the weights of all their every-layer maps.

    At most MAX_REPORT_TEXTS texts, whose maps of every layer (self-attention only: cross-attention
    has none) hold at most MAX_REPORT_WEIGHTS weights in all; the first text always fits. A long text
    (past ZOOM_MIN_TOKENS tokens: its zoomable map and summaries, up to 25 MB of page) has a report of its own.
    """
    from attnviz.html.pyramid import ZOOM_MIN_TOKENS

    counts = token_counts(loaded, texts)
    long = [count > ZOOM_MIN_TOKENS for count in counts]
    per_weight = 0 if spec.cross_attention else loaded.num_layers_of(spec.stack) * spec.num_heads
    sizes = [0 if is_long else per_weight * count**2 for count, is_long in zip(counts, long)]
    fit = 1
    while fit < min(len(texts), MAX_REPORT_TEXTS) and not (long[0] or long[fit]) and sum(sizes[: fit + 1]) <= MAX_REPORT_WEIGHTS:
        fit += 1
    return fit, sum(sizes)


def check_report_size(loaded, texts: list[str], spec: RunSpec) -> None:
    """Refuse texts whose every-layer maps are more than one report holds, before any work."""
    from attnviz.html.pyramid import ZOOM_MIN_TOKENS

    fit, weights = texts_that_fit(loaded, texts, spec)
    if fit == len(texts):
        return
    long = sum(count > ZOOM_MIN_TOKENS for count in token_counts(loaded, texts))  # tokenized again on refusal alone
    if long:
        raise AttnvizError(
            f"a text of more than {ZOOM_MIN_TOKENS} tokens has a report of its own (its zoomable map and the summaries "
            f"of every layer), and of these {len(texts)} texts {long} are: give it alone"
        )
    raise AttnvizError(
        f"these {len(texts)} texts are more than one report holds: their maps of every layer have "
        f"{weights:,} attention weights, and a report holds {MAX_REPORT_WEIGHTS:,} (the first {fit} texts fit); "
        "give fewer or shorter texts"
    )


def report_of_runs(loaded, runs: list, spec: RunSpec, notes: list[str] = (), progress: Progress = Progress()) -> ReportResult:
    """The report of runs already made (attnviz.heads' runs of the texts, with spec), adding what it shows besides.

    loaded: the LoadedModel they ran on; notes: what the page adds to the runs' own notes; progress: report_texts'.
    """
    texts, report_notes = report_texts(loaded, runs, spec, progress)
    return report_result(texts, spec, loaded.num_layers_of(spec.stack), [*notes, *report_notes], progress)


def text_report(loaded, text: str, spec: RunSpec, summaries=None, captured=None, runs=None, **shown) -> ReportResult:
    """The report of one text at spec.layer, as attnviz.report gives it, with what a command adds to its ReportText
    (shown: diff's differences, roles' roles); summaries: every layer's, already made (a long text's not made again).
    captured: the text's capture (report_texts'); runs: its run at spec.layer (a list of one AttentionRun), already
    made: with both, nothing runs the model."""
    if runs is None:
        from attnviz.pipeline import run_attention

        runs = run_attention(loaded, [text], spec, captured=None if captured is None else (captured[0], captured[1][spec.layer]))
    if summaries is not None:
        runs = [replace(runs[0], layer_summaries=summaries)]
    texts, notes = report_texts(loaded, runs, spec, captured=None if captured is None else [captured])
    texts[0] = replace(texts[0], **shown)
    return report_result(texts, spec, loaded.num_layers_of(spec.stack), notes)


def report_texts(loaded, runs: list, spec: RunSpec, progress: Progress = Progress(), captured=None) -> tuple[list, list[str]]:
    """Each run's ReportText (attnviz.html.record), and the notes of what was left out, once each; progress: each
    text's layers run and then its statistics' layers (every_layer), or a long text's summaries (long_summaries).
    captured: None, or per run its text's capture (EncodedTexts, {layer: LayerStates} of every layer: the text's
    encoding and every layer's input) or None: every layer, the traces and the vectors are made from it, no pass of
    the model."""
    from attnviz.html import ReportText
    from attnviz.html.record import is_long
    from attnviz.layer_inputs import threads_for_tokens

    notes: dict[str, None] = {}
    texts = []
    for run, capture in zip(runs, captured or [None] * len(runs)):
        if is_long(run):  # no whole map of any layer: the summaries of every layer instead
            summaries = run.layer_summaries if run.layer_summaries is not None else long_summaries(loaded, run.text, spec, notes, progress)
            texts.append(ReportText(run, summaries=summaries))
            continue
        with threads_for_tokens(len(run.query_tokens) + (len(run.key_tokens) if spec.cross_attention else 0)):
            layer_runs, rollout, statistics = every_layer(loaded, run.text, spec, progress, capture)
            trace, mistakes = traces(loaded, run.text, spec, notes, capture)
            if run.vectors is None and holds_vectors(run):  # the neuron view's q and k
                from attnviz.analysis.neurons import query_key_vectors

                run = replace(run, vectors=query_key_vectors(loaded, run.text, spec, captured=capture))
        texts.append(ReportText(run, layer_runs, rollout, statistics, trace, mistakes))
    return texts, list(notes)


def long_summaries(loaded, text: str, spec: RunSpec, notes: dict, progress: Progress = Progress()):
    """A long text's every head of every layer summarised (as attnviz layers' summaries.json), block by block within
    of budgets.block_budget (progress: summarise_layers'); None for cross-attention, with its reason added to notes."""
    from attnviz.analysis.head_summaries import summarise_layers
    from attnviz.budgets import block_budget

    if spec.cross_attention:
        notes["no summaries of every layer for cross-attention: they run every layer as self-attention on the text's own tokens"] = None
        return None
    return summarise_layers(loaded, text, replace(spec, layer=None), block_budget(spec), progress=progress)


def every_layer(loaded, text: str, spec: RunSpec, progress: Progress = Progress(), captured=None) -> tuple:
    """Every layer's run of the text (attnviz.layers'), the rollout and the text's statistics; Nones for cross-attention.
    progress: the layers run, then the layers of the statistics; captured: the text's capture (run_layers')."""
    from attnviz.analysis.rollout import runs_rollout
    from attnviz.pipeline import run_layers

    if spec.cross_attention:  # every layer is self-attention: attnviz.layers refuses cross
        return None, None, None
    (layer_runs,) = run_layers(loaded, [text], replace(spec, layer=None), progress, captured)
    rollout = runs_rollout(layer_runs)
    return layer_runs, rollout, text_statistics(layer_runs, spec.causal, progress)


def traces(loaded, text: str, spec: RunSpec, notes: dict, captured=None) -> tuple:
    """The trace of every layout the layer can do (as trace --layout all), and a trace per reshape mistake.

    What trace refuses (a mistake with 1 head, ...) is left out, with its reason added to notes. captured: the
    text's capture, whose layer input the traces read (trace_texts').
    """
    from attnviz.tracing import DEFAULT_LAYOUT, LAYOUTS, MISTAKES, trace_texts

    def traced(layouts: tuple[str, ...], mistake: str | None = None):
        try:
            return trace_texts(loaded, [text], spec, layouts=layouts, mistake=mistake, captured=captured)
        except AttnvizError as refused:
            notes[f"no trace of {f'the mistake {mistake}' if mistake else 'the layouts'} in this report: {refused}"] = None
            return None

    every_layout = traced(LAYOUTS)
    left_out = None if every_layout is None else why_no_mistakes(every_layout)
    if left_out:  # said in the page's words: the report takes no --mistake, so trace's advice about it would mislead
        notes[f"no reshape mistake traced in this report: {left_out}"] = None
        return every_layout, []
    mistakes = [traced((DEFAULT_LAYOUT,), mistake) for mistake in MISTAKES]
    return every_layout, [mistaken for mistaken in mistakes if mistaken is not None]


def why_no_mistakes(trace) -> str | None:
    """Why a layer (its TraceResult) has no reshape mistake to show, as trace --mistake refuses them; None: it has."""
    if trace.num_heads == 1:
        return "with 1 head the wrong view gives the right tensor"
    if trace.num_kv_heads is not None and trace.num_kv_heads < trace.num_heads:
        return (
            f"the mistakes split heads that queries and keys share, and this layer's {trace.num_heads} query heads "
            f"share {trace.num_kv_heads} key/value heads"
        )
    return None

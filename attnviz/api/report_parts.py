"""Each text's part of the report (attnviz.html's ReportText), from the text's capture: what attnviz.report, heads'
report and every result's .report() show beside the run's layer.

A text's capture (layer_inputs.Capture: its encoding and every layer's input, from one pass of the model) feeds its
every layer's runs, the rollout and the statistics, the trace of every layout and of each reshape mistake, and the
neuron view's vectors: with it nothing here runs the model. Without one (a result's .report() of runs made before),
each part takes its text's own pass, as it did before captures; captured_report makes the runs and the parts from
one capture per padded batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from attnviz.api.experiment_results import TextStatistics
from attnviz.api.run_results import ReportResult, report_result
from attnviz.errors import AttnvizError
from attnviz.run_data import FORWARD_PASS, Progress
from attnviz.spec import RunSpec


def holds_vectors(run) -> bool:
    """Whether a report of this run holds its heads' query and key vectors (the neuron view): a map of at most
    neurons.MAX_VECTOR_TOKENS queries and keys, over tokens."""
    from attnviz.analysis.neurons import MAX_VECTOR_TOKENS

    return run.words is None and max(len(run.query_tokens), len(run.key_tokens)) <= MAX_VECTOR_TOKENS


def captured_report(
    loaded, texts: list[str], spec: RunSpec, progress: Progress = Progress(), vector_tokens: int = 0, captures: list | None = None
) -> list[tuple]:
    """Each text's run at spec.layer, its ReportText and the notes of what its report leaves out, (run, part, notes):
    captured_batches' of every text, all reported. The model runs once a batch. captures: a list each batch's
    capture is added to (heads' trace reads it)."""
    batches = captured_batches(loaded, texts, spec, progress, vector_tokens, captures=captures)
    return [made for batch in batches for made in batch]


def captured_batches(
    loaded, texts: list[str], spec: RunSpec, progress: Progress = Progress(), vector_tokens: int = 0,
    reported: int | None = None, captures: list | None = None,
) -> Iterator[list[tuple]]:  # fmt: skip
    """Per padded batch (pipeline.BATCH_SIZE texts), in turn, each text's (run, part, notes) as captured_report gives
    them: one capture per batch feeds the batch's runs and, cut to each text (text_captures), its parts. Only the
    first `reported` texts (default: every one) have parts (None and no notes past them), and a batch with none of
    them is run at spec.layer alone, without vectors (run_attention's own pass). The model runs once a batch.

    Self-attention captures every layer, cross-attention the run's layer alone (its report has no other layers).
    vector_tokens: run_attention's (the neuron view's q and k, from each run's own projection). progress: each batch's
    forward pass, then report_texts' stages per text. captures: a list each batch's capture is added to, or None.
    """
    from attnviz.analysis.why import report_refusal
    from attnviz.html.record import is_long
    from attnviz.layer_inputs import check_layer, encode_texts, text_captures, threads_for
    from attnviz.passes import capture_states
    from attnviz.pipeline import BATCH_SIZE, batches, run_attention

    check_layer(loaded, spec.layer, spec.stack)  # before any pass
    layers = [spec.layer] if spec.cross_attention else list(range(loaded.num_layers_of(spec.stack)))
    to_report = len(texts) if reported is None else reported
    for batch in batches(texts, BATCH_SIZE):
        if to_report <= 0:
            yield [(run, None, []) for run in run_attention(loaded, batch, spec)]
            continue
        encoded = encode_texts(loaded, batch, spec)
        # the parts of the residual stream entering the layer, where the report holds its scores' splits (analysis/why.py)
        longest = max(len(ids) for ids in encoded.queries.ids[: max(to_report, 0)])
        stream_of = spec.layer if report_refusal(loaded, spec, longest) is None else None
        with threads_for(encoded):
            states = capture_states(loaded, encoded, layers, spec, progress.counting(FORWARD_PASS, len(layers)), stream_of)
        capture = (encoded, states)
        runs = run_attention(loaded, batch, spec, captured=(encoded, states[spec.layer]), vector_tokens=vector_tokens)
        if captures is not None:
            captures.append(capture)
        made = []
        for run, own in zip(runs, text_captures(capture)):
            if to_report <= 0:
                made.append((run, None, []))
                continue
            to_report -= 1
            if is_long(run) and not spec.cross_attention:  # a text with a report of its own: its summaries, from its capture
                run = replace(run, layer_summaries=captured_summaries(loaded, run.text, own, spec, progress))
            (part,), notes = report_texts(loaded, [run], spec, progress, captured=[own])
            made.append((run, part, notes))
        yield made


def captured_summaries(loaded, text: str, captured, spec: RunSpec, progress: Progress = Progress()):
    """Every head of every layer of a long text summarised block by block (long_summaries'), from the text's capture of
    every layer: no pass of the model."""
    from attnviz.analysis.head_summaries import summarise_blocks
    from attnviz.budgets import block_budget
    from attnviz.layer_inputs import threads_for
    from attnviz.own_layer import build_layers

    encoded, states = captured
    every = replace(spec, layer=None, kv_text=None)
    with threads_for(encoded):
        layers = build_layers(loaded, every)
    return summarise_blocks(loaded, text, encoded, layers, every, block_budget(spec), states=dict(states), progress=progress)


def report_of_texts(loaded, texts: list[str], spec: RunSpec, notes: list[str] = (), progress: Progress = Progress()) -> ReportResult:
    """The report of texts, each short enough for whole maps (not a long text's: head_summaries.run_and_summarise's),
    from one capture per padded batch (captured_report); notes: what the page adds to the runs' own notes."""
    from attnviz.analysis.neurons import MAX_VECTOR_TOKENS

    made = captured_report(loaded, texts, spec, progress, vector_tokens=0 if spec.words else MAX_VECTOR_TOKENS)
    return report_of_parts(loaded, [(part, text_notes) for _, part, text_notes in made], spec, notes, progress)


def report_of_parts(
    loaded, parts: list[tuple], spec: RunSpec, notes: list[str] = (), progress: Progress = Progress()
) -> ReportResult:
    """The report of texts' parts already made, (ReportText, its notes) each (captured_batches'); notes: what the page
    adds to the texts' own notes, each said once."""
    left_out = dict.fromkeys(note for _, text_notes in parts for note in text_notes)  # each once, in order
    return report_result([part for part, _ in parts], spec, loaded.num_layers_of(spec.stack), [*notes, *left_out], progress)


def report_of_runs(loaded, runs: list, spec: RunSpec, notes: list[str] = (), progress: Progress = Progress(), captured=None) -> ReportResult:
    """The report of runs already made (attnviz.heads' runs of the texts, with spec), adding what it shows besides.

    loaded: the LoadedModel they ran on; notes: what the page adds to the runs' own notes; progress and captured:
    report_texts'.
    """
    texts, report_notes = report_texts(loaded, runs, spec, progress, captured)
    return report_result(texts, spec, loaded.num_layers_of(spec.stack), [*notes, *report_notes], progress)


def text_report(loaded, text: str, spec: RunSpec, summaries=None, captured=None, runs=None, **shown) -> ReportResult:
    """The report of one text at spec.layer, as attnviz.report gives it, with what a command adds to its ReportText
    (shown: diff's differences, roles' roles); summaries: every layer's, already made (a long text's not made again).
    captured: the text's capture (layer_inputs.Capture), and runs: its run at spec.layer (a list of one AttentionRun),
    made from it or not: with both, nothing here runs the model; with captured alone, the run is made from it."""
    from attnviz.analysis.neurons import MAX_VECTOR_TOKENS
    from attnviz.pipeline import run_attention

    if runs is None:
        layer = None if captured is None else (captured[0], captured[1][spec.layer])
        runs = run_attention(loaded, [text], spec, captured=layer, vector_tokens=0 if spec.words else MAX_VECTOR_TOKENS)
    if summaries is not None:
        runs = [replace(runs[0], layer_summaries=summaries)]
    texts, notes = report_texts(loaded, runs, spec, captured=None if captured is None else [captured])
    texts[0] = replace(texts[0], **shown)
    return report_result(texts, spec, loaded.num_layers_of(spec.stack), notes)


def report_texts(loaded, runs: list, spec: RunSpec, progress: Progress = Progress(), captured=None) -> tuple[list, list[str]]:
    """Each run's ReportText (attnviz.html.record), and the notes of what was left out, once each; progress: each
    text's layers run (every_layer), or a long text's summaries (long_summaries).

    captured: None, or per run its text's capture (layer_inputs.Capture: its own encoding and every layer's input; for
    cross-attention the run's layer's) or None: every layer, the traces and mistakes and the vectors are made from it,
    and the model is not run. A run without one takes its text's own passes.
    """
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
        layer = None if capture is None else (capture[0], capture[1][spec.layer])  # the run's layer's input
        with threads_for_tokens(len(run.query_tokens) + (len(run.key_tokens) if spec.cross_attention else 0)):
            layers, rollout, statistics = every_layer(loaded, run.text, spec, progress, capture)
            trace, mistakes = traces(loaded, run.text, spec, notes, layer)
            if run.vectors is None and holds_vectors(run):  # the neuron view's q and k, where the run kept none
                from attnviz.analysis.neurons import MAX_VECTOR_TOKENS
                from attnviz.pipeline import run_attention

                (own,) = run_attention(loaded, [run.text], spec, captured=layer, vector_tokens=MAX_VECTOR_TOKENS)
                run = replace(run, vectors=own.vectors)
            why = why_splits(loaded, run, spec, capture, progress)
        texts.append(ReportText(run, layers, rollout, statistics, trace, mistakes, why=why))
    return texts, list(notes)


def why_splits(loaded, run, spec: RunSpec, capture, progress: Progress = Progress()):
    """The report's splits of the layer's scores (analysis.why.CellSplits) from the text's capture, where it holds the
    stream's parts (captured_batches asks for them); else why it holds none (a str)."""
    from attnviz.analysis.why import cell_splits, report_refusal

    refused = report_refusal(loaded, spec, max(len(run.query_tokens), len(run.key_tokens)))
    if refused is not None:
        return refused
    state = None if capture is None else capture[1][spec.layer]
    if state is None or state.stream is None:  # no pass is made again here
        return "the pass this report read kept no parts of the residual stream (a text past 64 tokens in its batch, or runs made before): attnviz why splits any cell"
    return cell_splits(loaded, capture[0], spec, state, progress.counting("heads' scores split", run.num_heads))


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
    """Every layer's maps of the text as the page holds them (html.encoding.LayerCodes'), the rollout and the
    text's statistics, from attnviz.layers' runs, each layer's encoded, measured and rolled in as it is made, then let
    go: no more than two layers' maps held at once, not every layer's (a Llama-3.2-1B-shaped model's 16 at 512 tokens
    are 537 MB in float32).
    Nones for cross-attention. progress: the layers run (pipeline.iter_layer_runs'); captured: the text's capture of
    every layer."""
    from attnviz.analysis.rollout import runs_rollout
    from attnviz.html.encoding import LayerCodes
    from attnviz.pipeline import iter_layer_runs

    if spec.cross_attention:  # every layer is self-attention: attnviz.layers refuses cross
        return None, None, None
    num_layers = loaded.num_layers_of(spec.stack)
    codes, statistics = LayerCodes(num_layers), TextStatistics(num_layers, spec.causal)

    def each_layer():  # the text's run of each layer, encoded and measured as the rollout reads it
        for layer, (run,) in enumerate(iter_layer_runs(loaded, [text], replace(spec, layer=None), progress, captured)):
            codes.add(run.attention)
            statistics.add(layer, run)
            yield run

    rollout = runs_rollout(each_layer())
    return codes.encoded(), rollout, statistics.result()


def traces(loaded, text: str, spec: RunSpec, notes: dict, captured=None) -> tuple:
    """The trace of every layout the layer can do (as trace --layout all), and a trace per reshape mistake.

    What trace refuses (a mistake with 1 head, ...) is left out, with its reason added to notes. captured: the text's
    encoding and the layer's input (trace_texts'), read by every trace.
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

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

from attnviz.api.arguments import must_be_progress
from attnviz.api.checks import _check_lengths, _texts, refuse_before_loading, summarised_in_its_run, token_counts, warn_run_notes
from attnviz.api.options import run_options, takes_options
# the report's parts, as other results call them
from attnviz.api.report_parts import report_of_runs, report_of_texts, report_texts, text_report  # noqa: F401
from attnviz.api.run_results import ReportResult
from attnviz.errors import AttnvizError
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
        result = report_of_runs(handle.loaded, runs, spec, progress=progress)
    else:  # one capture per padded batch: its runs, and each text's every layer, traces and vectors
        result = report_of_texts(handle.loaded, texts, spec, progress=progress)
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

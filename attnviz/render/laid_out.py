"""Figures laid out before their run exists, kept by what they show until the run's drawing takes them.

heads' figures (heads_ahead.py, taken by write_heatmaps), position.png (position_figure.py) and compare.png
(compare_figures.py). Its own module, so that heatmap.py (which takes heads' figures) and heads_ahead.py (which makes
them, with heatmap.py's figures) import it without importing each other. In the figure worker only the latest is kept:
a worker kept across the API's runs would otherwise keep every figure whose run was not the one foreseen.
"""

from __future__ import annotations

import dataclasses

from attnviz.result import AttentionRun

# Not shown by any heads figure: what may differ between the foreseen run and the real one.
_NOT_DRAWN = ("attention", "output", "query_ids", "key_ids", "notices", "truncated", "kv_truncated", "device", "inner_size")

_laid_out: dict = {}  # in the figure worker: a key of what a figure shows besides its numbers -> the figure, laid out


def figure_key(run: AttentionRun) -> tuple | None:
    """What heads' figures show of a run besides its numbers: two runs with the same key have the same static parts.

    Every field counts but those listed in _NOT_DRAWN (a new field counts, so a new title part is never missed);
    None for a run over words (whose TokenWords hold arrays), which is never foreseen.
    """
    if run.words is not None:
        return None
    fields = {field.name: getattr(run, field.name) for field in dataclasses.fields(run) if field.name not in _NOT_DRAWN}
    fields["query_tokens"], fields["key_tokens"] = tuple(run.query_tokens), tuple(run.key_tokens)
    return (run.attention.shape, *sorted(fields.items()))


def keep_figure(key, figure) -> None:
    """Keep figure, laid out for what key says it shows, until take_figure(key); only the latest."""
    _laid_out.clear()
    _laid_out[key] = figure


def take_figure(key):
    """The figure kept for key, or None."""
    return _laid_out.pop(key, None)


def keep(run: AttentionRun, seed: int | None, head_figure, grid) -> None:
    """Keep the head figure and grid laid out for run (the foreseen one) until take()."""
    keep_figure((figure_key(run), seed), (head_figure, grid))


def take(run: AttentionRun, fmt: str, prefix: str, note: str, seed: int | None) -> tuple | None:
    """The (head figure, grid) laid out for run's figures, now showing run's numbers; None when none fits."""
    if fmt != "png" or prefix or note:
        return None
    key = figure_key(run)
    laid_out = take_figure((key, seed)) if key is not None else None
    if laid_out is None:
        return None
    head_figure, grid = laid_out
    head_figure.run = grid.run = run
    return head_figure, grid

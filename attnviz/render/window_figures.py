"""A window of a long map at full resolution: `heads --window Q0:Q1,K0:K1` (window_head_NN.png).

The whole-map heatmaps are capped in size (scales.py), so a map of thousands of tokens shows block
maxima. A window draws the cells of queries Q0..Q1-1 and keys K0..K1-1 one value each, on the whole
map's colour scale (a colour means the same weight as in head_NN.png), its axes numbered by the
tokens' real indices and labelled with their tokens where they fit.

The map is read only through a slice of one head (run.attention[head, q0:q1, k0:k1]), so a map
held as a memory map is never read whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.errors import AttnvizError

MAX_WINDOW_TOKENS = 512  # per axis: a cell then still gets 3 pixels of WINDOW_MAX_INCHES
WINDOW_MAX_INCHES = (16.0, 15.0)  # width, height: at most 1,920 × 1,800 px at scales.DPI
MAX_WINDOW_TICK_LABELS = 48  # per axis, as a single head's figure
WINDOW_FORM = "Q0:Q1,K0:K1"
_SPAN = r"\s*(\d*)\s*:\s*(\d*)\s*"
_WINDOW = re.compile(rf"^{_SPAN},{_SPAN}$")


@dataclass(frozen=True)
class Window:
    """Queries query_start..query_stop - 1 and keys key_start..key_stop - 1 of a map (ends excluded, as slices)."""

    query_start: int
    query_stop: int
    key_start: int
    key_stop: int

    @property
    def queries(self) -> slice:
        return slice(self.query_start, self.query_stop)

    @property
    def keys(self) -> slice:
        return slice(self.key_start, self.key_stop)

    def words(self) -> str:
        """ "queries 7,000–7,063 × keys 0–63" (ends included, as a reader counts)."""
        return f"queries {span_words(self.queries)} × keys {span_words(self.keys)}"


def span_words(span: slice) -> str:
    """ "7,000–7,063": a slice's first and last index."""
    return f"{span.start:,}–{span.stop - 1:,}" if span.stop - span.start > 1 else f"{span.start:,}"


def parse_window(given, name: str = "window") -> tuple[slice, slice]:
    """The (queries, keys) slices of a window given as "Q0:Q1,K0:K1" (an end left out: the map's) or as two slices.

    Malformed or empty windows are refused in one line (name: how the user gave it, "--window" or "window");
    the map's range is checked by window_of, once the map is known.
    """
    if isinstance(given, Window):
        given = (given.queries, given.keys)
    if isinstance(given, str):
        match = _WINDOW.match(given)
        if match is None:
            raise AttnvizError(f"{name} {given!r} is not {WINDOW_FORM}: e.g. 0:64,0:64 (ends excluded; an end left out is the map's)")
        q0, q1, k0, k1 = (int(part) if part else None for part in match.groups())
        spans = (slice(q0, q1), slice(k0, k1))
    elif isinstance(given, tuple) and len(given) == 2 and all(isinstance(span, slice) for span in given):
        spans = given
    else:
        raise AttnvizError(f"{name} must be a string {WINDOW_FORM!r} or two slices (queries, keys), not {given!r}")
    for axis, span in zip(("queries", "keys"), spans):
        ends = (span.start, span.stop)
        if span.step not in (None, 1) or any(end is not None and (not isinstance(end, int) or end < 0) for end in ends):
            raise AttnvizError(f"{name}'s {axis} {_shown(span)} must be a span of token indices, 0 or more, without a step")
        if span.start is not None and span.stop is not None and span.stop <= span.start:
            raise AttnvizError(f"{name}'s {axis} {_shown(span)} are empty: give a start below the end (ends excluded)")
    return spans


def window_of(given, num_queries: int, num_keys: int, name: str = "window") -> Window:
    """The Window of given (parse_window's forms) on a map of num_queries × num_keys; out of range or too big: refused."""
    queries, keys = parse_window(given, name)
    resolved = []
    for axis, span, size in (("queries", queries, num_queries), ("keys", keys, num_keys)):
        start, stop = span.start or 0, size if span.stop is None else span.stop
        if stop > size or start >= stop:
            raise AttnvizError(
                f"{name}'s {axis} {_shown(span)} are out of range: the map has {axis} 0 to {size - 1:,} "
                f"(give {WINDOW_FORM} within 0:{num_queries},0:{num_keys}, ends excluded)"
            )
        if stop - start > MAX_WINDOW_TOKENS:
            raise AttnvizError(
                f"{name}'s {axis} {_shown(span)} span {stop - start:,} tokens: a window shows at most "
                f"{MAX_WINDOW_TOKENS} a side at full resolution (the whole map is head_NN.png)"
            )
        resolved += [start, stop]
    return Window(*resolved)


def _shown(span: slice) -> str:
    return f"{'' if span.start is None else span.start}:{'' if span.stop is None else span.stop}"


def window_weights(run, head: int, window: Window) -> np.ma.MaskedArray:
    """(q1 - q0, k1 - k0): the window of a head's map, read as a slice; future keys masked when causal."""
    weights = np.asarray(run.attention[head, window.queries, window.keys], dtype=np.float64)
    query_index = np.arange(window.query_start, window.query_stop)[:, None]  # (q, 1)
    key_index = np.arange(window.key_start, window.key_stop)[None, :]  # (1, k)
    future = (key_index > query_index) if run.causal else np.zeros(weights.shape, dtype=bool)
    return np.ma.masked_array(weights, mask=np.broadcast_to(future, weights.shape))


def window_figure_size(window: Window) -> tuple[float, float]:
    """Like head_figure_size (0.45 inch a token), up to WINDOW_MAX_INCHES: a 512-token side still gets 3 pixels a cell."""
    num_queries = window.query_stop - window.query_start
    num_keys = window.key_stop - window.key_start
    width = float(np.clip(2.5 + 0.45 * num_keys, 5.0, WINDOW_MAX_INCHES[0]))
    height = float(np.clip(1.8 + 0.45 * num_queries, 4.0, WINDOW_MAX_INCHES[1]))
    return width, height


class WindowFigure:
    """The window of one head's map; show_head(h) puts another head's window into the same layout."""

    def __init__(self, run, window: Window, seed: int | None = None):
        from attnviz.render.cell_values import cell_values
        from attnviz.render.heatmap import freeze_layout, new_figure
        from attnviz.render.scales import attention_colorbar, attention_colormap, attention_norm, is_log_scale

        self.run, self.window, self.seed = run, window, seed
        num_keys = run.attention.shape[-1]
        norm = attention_norm(num_keys)  # the whole map's scale, so a colour reads as in head_NN.png
        if is_log_scale(norm):
            norm.clip = True  # a weight below the scale takes its darkest colour, as scales.show_attention's clip does
        self.figure = new_figure(window_figure_size(window))
        self.ax = self.figure.add_subplot()
        extent = (window.key_start - 0.5, window.key_stop - 0.5, window.query_stop - 0.5, window.query_start - 0.5)
        self.image = self.ax.imshow(
            window_weights(run, 0, window), cmap=attention_colormap(), norm=norm, aspect="auto",
            interpolation="nearest", extent=extent,
        )  # fmt: skip
        num_window_queries, num_window_keys = window.query_stop - window.query_start, window.key_stop - window.key_start
        self.cell_values = cell_values(self.ax, num_window_queries, num_window_keys)
        if self.cell_values is not None:  # cell_values centres cells at 0, 1, ...: move them to the real indices
            self.cell_values.set_offsets(self.cell_values.get_offsets() + [window.key_start, window.query_start])
        self.title = self.ax.set_title("", parse_math=False)
        self._label_axes(fontsize=10 if max(num_window_queries, num_window_keys) <= 20 else 7)
        attention_colorbar(self.figure, self.image, ax=self.ax)
        self.show_head(run.num_heads - 1)  # the longest title: the frozen layout must fit it
        freeze_layout(self.figure)

    def _label_axes(self, fontsize: float) -> None:
        """Ticks at the tokens' real indices, each "index token"; axis labels give the window's span."""
        from attnviz.render.fonts import displayable
        from attnviz.render.heatmap import tick_positions

        query_tokens, key_tokens = self.run.shown_tokens
        for span, tokens, set_ticks, set_label, axis in (
            (self.window.keys, key_tokens, self.ax.set_xticks, self.ax.set_xlabel, "key"),
            (self.window.queries, query_tokens, self.ax.set_yticks, self.ax.set_ylabel, "query"),
        ):
            positions = [span.start + step for step in tick_positions(span.stop - span.start, MAX_WINDOW_TICK_LABELS)]
            labels = [f"{index} {displayable(tokens[index])}" for index in positions]
            rotated = dict(rotation=45, ha="right", rotation_mode="anchor") if axis == "key" else {}
            set_ticks(positions, labels, fontsize=fontsize, parse_math=False, **rotated)
            set_label(f"{axis} {span_words(span)}")

    def show_head(self, head: int) -> None:
        from attnviz.render.cell_values import update_cell_values
        from attnviz.render.titles import chars_across, head_scope, run_title

        weights = window_weights(self.run, head, self.window)
        self.image.set_data(weights)
        if self.cell_values is not None:
            update_cell_values(self.cell_values, weights, self.image)
        scope = [f"layer {self.run.layer}", *head_scope(self.run, head), f"window: {self.window.words()}"]
        self.title.set_text(run_title(self.run, scope, seed=self.seed, line_chars=chars_across(self.figure.get_figwidth())))


def window_figure(run, head: int, window: Window, seed: int | None = None):
    """One head's window (window_head_NN.<fmt>): a matplotlib Figure, not saved."""
    figure = WindowFigure(run, window, seed)
    figure.show_head(head)
    return figure.figure


def write_window_figures(
    run, window: Window, folder: Path, fmt: str = "png", heads: list[int] | None = None, seed: int | None = None
) -> list[Path]:
    """window_head_NN.<fmt> of each head (heads: those asked for, default every one) into folder; their paths."""
    from attnviz.render.heatmap import check_format, save_figure

    check_format(fmt)
    drawn = WindowFigure(run, window, seed)
    paths = []
    for head in range(run.num_heads) if heads is None else heads:
        drawn.show_head(head)
        paths.append(save_figure(drawn.figure, folder, f"window_head_{head:02d}.{fmt}"))
    return paths

"""position.png of `attnviz position`, laid out before its numbers exist.

For one head, without and with position embeddings, four maps each: A(x), A(Px), Pᵀ A(Px) P
(permuted back) and |Pᵀ A(Px) P − A(x)|. Same conventions as heatmap.py: rows are queries,
columns keys, the colour scale fixed at 0..1 (log for long texts), each pixel one value or the
maximum of a block of cells, the size cap; a plain matplotlib Figure on an Agg canvas.

Laying it out is most of its drawing time (eight maps of token labels, four colour bars), and the
layout depends on what it shows besides its numbers (PositionLayout: the text, its tokens, the
permutation, the head when chosen), all known before torch is imported. So the figure is always
made in two steps: PositionFigure(layout) lays it out with stand-in numbers (_Numbers), then
show(result) puts the result's maps and numbers in. The figure worker takes the first step
while the command loads torch and runs the model (prepare), the same step a figure drawn from
scratch takes, so both give the same pixels; it also renders everything show() leaves as it
is (render_ahead), so that write_png draws only the maps, the titles with numbers and the
difference colour bars on those pixels.

The numbers do reach the layout where they are text: the titles that print them, the difference
scale's tick labels, the figure title's head when the data chose it. show() checks that each
of those takes the room its stand-in took; where one does not, the figure is laid out again
with the result's numbers in place, as a figure drawn with them from the start would be.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.analysis.position import PositionResult, PositionSide, format_difference
from attnviz.render.blit import RenderedAhead

MAX_POSITION_TICK_LABELS = 24  # a text this short has every token labelled in position.png
MAX_POSITION_LONG_TICK_LABELS = 16  # a longer one every k-th, at most this many per axis (labels are most of its time)
DIFFERENCE_COLORMAP = "magma"
SMALLEST_DIFFERENCE_SCALE = 1e-6  # the difference colour bar's top when both rows are equal within rounding


@dataclass(frozen=True)
class PositionLayout:
    """What position.png shows besides the numbers: everything its layout depends on but _Numbers."""

    model: str
    text: str
    tokens: tuple[str, ...]
    permutation: tuple[int, ...]
    head: int | None  # chosen with --head; None when the data chooses it (the head position changes most)

    @classmethod
    def of(cls, result: PositionResult) -> PositionLayout:
        head = result.head if result.head_chosen else None
        return cls(result.model, result.text, tuple(result.tokens), tuple(result.permutation), head)

    @property
    def permuted_tokens(self) -> list[str]:
        return [self.tokens[i] for i in self.permutation]


@dataclass(frozen=True)
class _Numbers:
    """The numbers position.png prints as text: its layout may depend on them."""

    head: int  # the head shown
    difference_scale: float  # the top of both rows' difference colour bar
    rows: tuple[tuple[float, bool, float], ...]  # per row (without, with positions): max over heads, equivariant, the head's max

    @classmethod
    def of(cls, result: PositionResult) -> _Numbers:
        head = result.head  # its maps only: the difference of all heads is 12 times the work
        shown = [float(np.abs(side.permuted_back[head] - side.original[head]).max()) for side in _sides(result)]
        rows = tuple((side.max_difference, side.equivariant, largest) for side, largest in zip(_sides(result), shown))
        # One difference scale for both rows, so the row without positions looks as flat as it is.
        return cls(head, max(*shown, SMALLEST_DIFFERENCE_SCALE), rows)


# Typical numbers, so that show() rarely needs another layout: float rounding without positions; with them, a
# difference near 1 (the head the positions change most is near one-hot), whose colour bar is labelled 0.0 to 0.8.
_STAND_IN = _Numbers(head=0, difference_scale=0.99, rows=((1.2e-7, True, 1.2e-7), (0.99, False, 0.99)))


class PositionFigure(RenderedAhead):
    """position.png for layout, laid out (with numbers standing in for the result's until show)."""

    def __init__(self, layout: PositionLayout, numbers: _Numbers = _STAND_IN):
        from attnviz.render.heatmap import freeze_layout, new_figure

        self.layout, self.numbers = layout, numbers
        num_tokens = len(layout.tokens)
        panel = float(np.clip(1.2 + 0.16 * num_tokens, 2.6, 4.5))
        self.figure = new_figure((4 * panel + 2.2, 2 * (panel + 0.9) + 0.9))
        self.rows = [_Row(row_figure, layout, positions) for row_figure, positions in zip(self.figure.subfigures(2, 1), (False, True))]
        self.title = self.figure.suptitle("", parse_math=False)
        self._write(numbers)
        freeze_layout(self.figure)
        for row in self.rows:
            row.fit()
        self._room = self._room_taken()

    def show(self, result: PositionResult) -> PositionFigure:
        """This figure showing result (whose PositionLayout is self.layout's); another, laid out for result's numbers,
        where a number's text takes other room than its stand-in's."""
        numbers = _Numbers.of(result)
        self._write(numbers)
        if numbers != self.numbers and self._room_taken() != self._room:
            return PositionFigure(self.layout, numbers).show(result)
        for row, side in zip(self.rows, _sides(result)):
            row.show(side, result.head)
        return self

    def changing(self) -> list:
        """The artists show() changes: the titles, the maps, the frames drawn over the maps, the difference colour bars."""
        return [self.title, *(artist for row in self.rows for artist in row.changing())]

    def _write(self, numbers: _Numbers) -> None:
        """Every text and scale that prints a number."""
        from attnviz.render.titles import chars_across, figure_title

        layout = self.layout
        head = f"head {numbers.head}" if layout.head is not None else f"head {numbers.head} (the head position changes most)"
        scope = ["layer 0", head, f"x permuted by P = {_permutation_text(layout.permutation)}"]
        line_chars = chars_across(self.figure.get_figwidth())
        self.title.set_text(figure_title(layout.model, scope, text=layout.text, line_chars=line_chars))
        for row, row_numbers in zip(self.rows, numbers.rows):
            row.write(*row_numbers, difference_scale=numbers.difference_scale)

    def _room_taken(self) -> list:
        """What the layout made room for, of the texts _write sets: each title's height, and each difference map's and
        difference colour bar's reach beyond its axes (their titles and tick labels), in figure pixels."""
        renderer = self.figure.canvas.get_renderer()
        room = [title.get_window_extent(renderer).height for title in (self.title, *(row.title for row in self.rows))]
        for row in self.rows:
            for ax in (row.difference_axes, row.difference_bar.ax):
                box, position = ax.get_tightbbox(renderer, for_layout_only=True), ax.get_window_extent(renderer)
                room.append((position.x0 - box.x0, position.y0 - box.y0, box.x1 - position.x1, box.y1 - position.y1))
        return room


class _Row:
    """One row of position.png (without or with position embeddings): four maps and two colour bars."""

    def __init__(self, row_figure, layout: PositionLayout, positions: bool):
        from matplotlib.colors import Normalize

        from attnviz.render.heatmap import label_tokens
        from attnviz.render.scales import attention_colorbar, attention_norm, draw_attention, show_attention

        self.positions = positions
        self.num_tokens = num_tokens = len(layout.tokens)
        zeros = np.ma.masked_array(np.zeros((num_tokens, num_tokens), dtype=np.float32))  # (N, N) until show()
        axes = row_figure.subplots(1, 4)
        panels = [
            (list(layout.tokens), "A(x): the text"),
            (layout.permuted_tokens, "A(Px): permuted text"),
            (list(layout.tokens), "Pᵀ A(Px) P: permuted back"),
        ]
        # A long text's labels are thinned to every k-th token, each with its index (a repeated word
        # is otherwise ambiguous); then the permuted-back and difference maps, whose rows are the text's
        # as in the first map of their row, leave their rows unlabelled: labels are most of this
        # figure's drawing time, and repeated they tell nothing new.
        repeat_rows = num_tokens <= MAX_POSITION_TICK_LABELS
        max_labels = MAX_POSITION_TICK_LABELS if repeat_rows else MAX_POSITION_LONG_TICK_LABELS
        if not repeat_rows:
            panels = [([f"{i}:{token}" for i, token in enumerate(tokens)], title) for tokens, title in panels]
        text_labels = panels[0][0]  # the text's tokens, as its maps' axes are labelled
        norm = attention_norm(num_tokens)
        self.images = []  # A(x), A(Px), Pᵀ A(Px) P
        for index, (ax, (tokens, title)) in enumerate(zip(axes, panels)):
            self.images.append(draw_attention(ax, zeros, norm))
            ax.set_title(title, fontsize=9, parse_math=False)
            label_tokens(ax, tokens, tokens if index < 2 or repeat_rows else [], max_labels, fontsize=7)
        self.difference_axes = axes[3]
        self.difference_image = axes[3].imshow(
            np.ma.masked_all((1, 1)), cmap=DIFFERENCE_COLORMAP, norm=Normalize(0.0, 1.0), aspect="auto",
            interpolation="nearest",
        )  # fmt: skip
        show_attention(self.difference_image, zeros)  # its extent: the tokens' (labelled ticks out of it would take room)
        self.difference_title = axes[3].set_title("", fontsize=9, parse_math=False)
        label_tokens(axes[3], text_labels, text_labels if repeat_rows else [], max_labels, fontsize=7)
        self.weights_bar = attention_colorbar(row_figure, self.images[0], ax=axes[:3], shrink=0.8)
        self.difference_bar = row_figure.colorbar(self.difference_image, ax=axes[3], shrink=0.8, label="difference")
        self.difference_bar.locator = _ticks_below_the_top()
        self.title = row_figure.suptitle("", fontsize=10, parse_math=False)

    def write(self, max_difference: float, equivariant: bool, largest: float, difference_scale: float) -> None:
        """The row's numbers: its title's maximum and verdict, the difference map's maximum, the difference scale."""
        which = "with BERT's" if self.positions else "without"
        verdict = "equivariant" if equivariant else "not equivariant"
        value = format_difference(max_difference)
        self.title.set_text(f"{which} position embeddings: max over heads |A(Px) − P A(x) Pᵀ| = {value}, {verdict}")
        self.difference_title.set_text(f"|back − A(x)|, max {format_difference(largest)}")
        self.difference_image.set_clim(0.0, difference_scale)  # its colour bar's ticks follow

    def fit(self) -> None:
        """Once laid out: fit the maps to their axes, and say on the colour bars where a pixel is a block's maximum."""
        from attnviz.render.scales import scale_label, show_attention

        zeros = np.ma.masked_array(np.zeros((self.num_tokens, self.num_tokens), dtype=np.float32))  # (N, N)
        pools = [show_attention(image, zeros) for image in self.images]  # same size of map, same axes: the same block
        self.weights_bar.set_label(scale_label("attention weight", self.images[0].norm, max(pools)))
        pool = show_attention(self.difference_image, zeros)
        self.difference_bar.set_label(scale_label("difference", self.difference_image.norm, pool))

    def show(self, side: PositionSide, head: int) -> None:
        """The maps of side's head, fitted to the laid-out axes (a pixel the maximum of a block of cells where needed)."""
        from attnviz.render.scales import show_attention

        maps = [side.original[head], side.permuted[head], side.permuted_back[head]]
        for image, weights in zip(self.images, maps):
            show_attention(image, np.ma.masked_array(weights))
        difference = np.abs(side.permuted_back[head] - side.original[head])  # (N, N)
        show_attention(self.difference_image, np.ma.masked_array(difference))  # a block's largest difference

    def changing(self) -> list:
        """What show() and write() change, maps before the frames drawn over them."""
        map_axes = [image.axes for image in (*self.images, self.difference_image)]
        frames = [spine for ax in map_axes for spine in ax.spines.values()]
        return [self.title, *self.images, self.difference_image, *frames, self.difference_title, self.difference_bar.ax]


def position_figure(result: PositionResult):
    """position.png's Figure for result, laid out and ready to save."""
    return PositionFigure(PositionLayout.of(result)).show(result).figure


def write_position_figure(result: PositionResult, out_dir: Path, fmt: str = "png") -> Path:
    """position.<fmt>: for one head, without and with position embeddings, four maps each:
    A(x), A(Px), Pᵀ A(Px) P (permuted back) and |Pᵀ A(Px) P − A(x)|.

    On the figure laid out and rendered ahead (prepare) if there is one for result.
    """
    from attnviz.render import laid_out
    from attnviz.render.heatmap import check_format, save_figure

    check_format(fmt)
    layout = PositionLayout.of(result)
    shown = (laid_out.take_figure(("position", layout)) or PositionFigure(layout)).show(result)
    if fmt == "png":
        return shown.write_png(Path(out_dir) / "position.png")
    return save_figure(shown.figure, out_dir, f"position.{fmt}")


def prepare(text: str, model: str | None, permutation: str | None, head: int | None) -> None:
    """In the figure worker, before the run exists: lay out and render `attnviz position TEXT`'s figure (the command's
    options as given), for write_position_figure to take. Only a BERT model in a folder is foreseen; other runs warm the worker up."""
    from attnviz.analysis.position import default_permutation, parse_permutation
    from attnviz.render import heads_ahead, laid_out

    foreseen = heads_ahead.foreseen_tokens(text, model)
    if foreseen is None:
        return heads_ahead.warm_up()
    tokens = foreseen.tokens
    order = parse_permutation(permutation, tokens) if permutation else default_permutation(tokens)
    layout = PositionLayout(foreseen.name, text, tuple(tokens), tuple(order), head)
    figure = PositionFigure(layout)
    figure.render_ahead()
    laid_out.keep_figure(("position", layout), figure)


def _ticks_below_the_top():
    """matplotlib's usual ticks for a linear colour bar, but none in its top 5 %: a tick label there would reach above
    the bar, and the room it takes would then depend on the difference scale (1.0 exactly, or 0.99999976)."""
    from matplotlib.ticker import AutoLocator

    class TicksBelowTheTop(AutoLocator):
        def tick_values(self, vmin, vmax):
            ticks = super().tick_values(vmin, vmax)
            return ticks[ticks <= vmax - 0.05 * (vmax - vmin)]

    return TicksBelowTheTop()


def _sides(result: PositionResult) -> tuple[PositionSide, PositionSide]:
    return result.without_positions, result.with_positions


def _permutation_text(permutation, max_items: int = 16) -> str:
    if len(permutation) <= max_items:
        return "(" + ",".join(map(str, permutation)) + ")"
    return "(" + ",".join(map(str, permutation[:max_items])) + ",…)"

"""position.png of `attnviz position`.

For one head, without and with position embeddings, four maps each: A(x), A(Px), Pᵀ A(Px) P
(permuted back) and |Pᵀ A(Px) P − A(x)|. Same conventions as heatmap.py: rows are queries,
columns keys, the colour scale fixed at 0..1 (log for long texts), each pixel one value or the
maximum of a block of cells, the size cap; a plain matplotlib Figure on an Agg canvas.

The difference colour bars have no tick in their top 5 % (_ticks_below_the_top): a tick label
there would reach above the bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.analysis.position import PositionResult, PositionSide, format_difference

MAX_POSITION_TICK_LABELS = 24  # a text this short has every token labelled in position.png
MAX_POSITION_LONG_TICK_LABELS = 16  # a longer one every k-th, at most this many per axis (labels are most of its time)
DIFFERENCE_COLORMAP = "magma"
SMALLEST_DIFFERENCE_SCALE = 1e-6  # the difference colour bar's top when both rows are equal within rounding


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


class PositionFigure:
    """position.png of result, laid out and showing its maps."""

    def __init__(self, result: PositionResult):
        from attnviz.render.heatmap import freeze_layout, new_figure

        self.result, numbers = result, _Numbers.of(result)
        num_tokens = len(result.tokens)
        panel = float(np.clip(1.2 + 0.16 * num_tokens, 2.6, 4.5))
        self.figure = new_figure((4 * panel + 2.2, 2 * (panel + 0.9) + 0.9))
        self.rows = [_Row(row_figure, result, positions) for row_figure, positions in zip(self.figure.subfigures(2, 1), (False, True))]
        self.title = self.figure.suptitle("", parse_math=False)
        self._write(numbers)
        freeze_layout(self.figure)
        for row, side in zip(self.rows, _sides(result)):
            row.show(side, result.head)

    def _write(self, numbers: _Numbers) -> None:
        """Every text and scale that prints a number."""
        from attnviz.render.titles import chars_across, figure_title

        result = self.result
        head = f"head {numbers.head}" if result.head_chosen else f"head {numbers.head} (the head position changes most)"
        scope = ["layer 0", head, f"x permuted by P = {_permutation_text(result.permutation)}"]
        line_chars = chars_across(self.figure.get_figwidth())
        headline = dict(fallback_for=result.fallback_for, unknown=(result.unknown,))  # a fallback model, a text mostly [UNK]
        self.title.set_text(figure_title(result.model, scope, text=result.text, line_chars=line_chars, **headline))
        for row, row_numbers in zip(self.rows, numbers.rows):
            row.write(*row_numbers, difference_scale=numbers.difference_scale)


class _Row:
    """One row of position.png (without or with position embeddings): four maps and two colour bars."""

    def __init__(self, row_figure, result: PositionResult, positions: bool):
        from matplotlib.colors import Normalize

        from attnviz.render.heatmap import label_tokens
        from attnviz.render.scales import attention_colorbar, attention_norm, draw_attention, show_attention

        self.positions = positions
        num_tokens = len(result.tokens)
        zeros = np.ma.masked_array(np.zeros((num_tokens, num_tokens), dtype=np.float32))  # (N, N) until show()
        axes = row_figure.subplots(1, 4)
        tokens = list(result.shown_tokens or result.tokens)
        panels = [
            (tokens, "A(x): the text"),
            ([tokens[i] for i in result.permutation], "A(Px): permuted text"),
            (tokens, "Pᵀ A(Px) P: permuted back"),
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

    def show(self, side: PositionSide, head: int) -> None:
        """Once laid out: the maps of side's head, fitted to their axes (a pixel the maximum of a block of cells where
        needed), and the colour bars saying so."""
        from attnviz.render.scales import scale_label, show_attention

        maps = [side.original[head], side.permuted[head], side.permuted_back[head]]
        pools = [show_attention(image, np.ma.masked_array(weights)) for image, weights in zip(self.images, maps)]
        self.weights_bar.set_label(scale_label("attention weight", self.images[0].norm, max(pools)))
        difference = np.abs(side.permuted_back[head] - side.original[head])  # (N, N)
        pool = show_attention(self.difference_image, np.ma.masked_array(difference))  # a block's largest difference
        self.difference_bar.set_label(scale_label("difference", self.difference_image.norm, pool))


def position_figure(result: PositionResult):
    """position.png's Figure for result, laid out and ready to save."""
    return PositionFigure(result).figure


def write_position_figure(result: PositionResult, out_dir: Path, fmt: str = "png") -> Path:
    """position.<fmt>: for one head, without and with position embeddings, four maps each:
    A(x), A(Px), Pᵀ A(Px) P (permuted back) and |Pᵀ A(Px) P − A(x)|."""
    from attnviz.render.heatmap import check_format, save_figure

    check_format(fmt)
    return save_figure(position_figure(result), out_dir, f"position.{fmt}")


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

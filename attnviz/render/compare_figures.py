"""Figures that set attention maps side by side: `attnviz compare` and `attnviz position`.

Same conventions as heatmap.py, whose helpers these reuse: rows are queries, columns keys,
the colour scale is fixed at 0..1 (log for long texts), each pixel one value or the maximum of
a block of cells, the size cap; plain matplotlib Figures on an Agg canvas (no pyplot).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnviz.analysis.compare import Split, resplit_note
from attnviz.render.heatmap import (
    check_format,
    freeze_layout,
    label_tokens,
    new_figure,
    save_figure,
)
from attnviz.analysis.position import PositionResult, PositionSide, format_difference
from attnviz.render.scales import (
    attention_colorbar,
    attention_norm,
    draw_attention,
    say_capped,
    scale_label,
    show_attention,
)
from attnviz.render.titles import chars_across, counted, figure_title

MAX_HEADS_SHOWN = 16  # per head count in compare.png: a 4 x 4 grid of panels is still readable
MAX_SPLITS_PER_ROW = 6  # head counts side by side in compare.png before it wraps
MAX_LABELLED_COLUMNS = 2  # token labels on a head count's panels only when they are this few across
MAX_COMPARE_TICK_LABELS = 16
MAX_POSITION_TICK_LABELS = 24  # a text this short has every token labelled in position.png
MAX_POSITION_LONG_TICK_LABELS = 16  # a longer one every k-th, at most this many per axis (labels are most of its time)
DIFFERENCE_COLORMAP = "magma"


def shown_heads(split: Split) -> list[int]:
    """All heads up to MAX_HEADS_SHOWN; beyond, heads at evenly spaced ranks of relative entropy.

    The ranks run from the most focused head to the broadest, so the panels show the range a
    large head count covers (every head is in the table and compare.json).
    """
    if split.num_heads <= MAX_HEADS_SHOWN:
        return list(range(split.num_heads))
    by_focus = sorted(split.summaries, key=lambda summary: summary.relative_entropy)
    ranks = np.linspace(0, split.num_heads - 1, MAX_HEADS_SHOWN).round().astype(int)
    return [by_focus[rank].head for rank in ranks]


def panel_grid(count: int) -> tuple[int, int]:
    """(rows, columns) of a near-square grid: 1 -> 1x1, 4 -> 2x2, 12 -> 3x4, 16 -> 4x4."""
    columns = math.ceil(math.sqrt(count))
    return math.ceil(count / columns), columns


def write_comparison_figure(splits: list[Split], out_dir: Path, fmt: str = "png", seed: int | None = None) -> Path:
    """compare.<fmt>: a row per weights (wrapped after 6 head counts), a column per head count,
    each cell that split's heads."""
    check_format(fmt)
    name = f"compare.{fmt}"
    return save_figure(comparison_figure(splits, name, seed), out_dir, name)


def comparison_figure(splits: list[Split], name: str = "compare.png", seed: int | None = None):
    """The Figure of write_comparison_figure, laid out and ready to save; name is for the size cap's note."""
    weights = list(dict.fromkeys(split.weights for split in splits))
    head_counts = list(dict.fromkeys(split.num_heads for split in splits))
    # Many head counts wrap onto further rows, so the figure stays printable.
    num_columns = min(len(head_counts), MAX_SPLITS_PER_ROW)
    rows_per_weights = math.ceil(len(head_counts) / num_columns)
    num_rows = len(weights) * rows_per_weights
    cell = 3.4  # inches per split: a split's heads share the cell, more heads means smaller maps
    note = resplit_note(splits)
    size = (num_columns * cell + 1.0, num_rows * (cell + 0.3) + 0.8 + (0.5 if note else 0.0))
    figure = new_figure(say_capped(name, size))
    maps_part, colorbar_part = figure.subfigures(1, 2, width_ratios=[num_columns * cell, 1.0])
    cells = maps_part.subfigures(num_rows, num_columns, squeeze=False)
    norm = attention_norm(len(splits[0].run.key_tokens))  # one scale for every panel
    drawn = []  # (image, weights) of every panel
    for split in splits:
        count_index = head_counts.index(split.num_heads)
        row = weights.index(split.weights) * rows_per_weights + count_index // num_columns
        drawn += _draw_split(cells[row, count_index % num_columns], split, norm)
    colorbar_axes = colorbar_part.add_axes((0.15, 0.2, 0.2, 0.6))
    colorbar = attention_colorbar(colorbar_part, drawn[0][0], cax=colorbar_axes)
    run = splits[0].run
    scope = [f"layer {run.layer}", "the same W_q, W_k, W_v split into different numbers of heads"]
    line_chars = chars_across(figure.get_figwidth())
    title = figure_title(run.model, scope, text=run.text, weights=weights, seed=seed, line_chars=line_chars)
    figure.suptitle(title, parse_math=False)
    if note:
        figure.supxlabel(note, fontsize=9)
    freeze_layout(figure)
    pool = max(show_attention(image, weights) for image, weights in drawn)
    colorbar.set_label(scale_label("attention weight", norm, pool))
    return figure


def _draw_split(cell_figure, split: Split, norm) -> list:
    """Draw the split's shown heads into cell_figure; return (image, weights) per panel."""
    heads = shown_heads(split)
    num_rows, num_columns = panel_grid(len(heads))
    axes = cell_figure.subplots(num_rows, num_columns, squeeze=False)
    labelled = num_columns <= MAX_LABELLED_COLUMNS
    max_labels = MAX_COMPARE_TICK_LABELS // num_columns  # panels half as wide carry half the labels
    drawn = []
    for index, ax in enumerate(axes.flat):
        if index >= len(heads):
            ax.set_visible(False)
            continue
        weights = np.ma.masked_array(split.run.attention[heads[index]])
        drawn.append((draw_attention(ax, weights, norm), weights))
        ax.set_title(f"head {heads[index]}", fontsize=7 if num_columns > 2 else 9, pad=2)
        last_row = index + num_columns >= len(heads)
        first_column = index % num_columns == 0
        label_tokens(
            ax,
            split.run.key_tokens if labelled and last_row else [],
            split.run.query_tokens if labelled and first_column else [],
            max_labels,
            fontsize=7,
        )
    title = f"{split.weights} · {counted(split.num_heads, 'head')} × d={split.run.head_dim}"
    if len(heads) < split.num_heads:
        title += f"\n{len(heads)} of {split.num_heads} shown, most focused → broadest"
    cell_figure.suptitle(title, fontsize=10, parse_math=False)
    return drawn


def write_position_figure(result: PositionResult, out_dir: Path, fmt: str = "png") -> Path:
    """position.<fmt>: for one head, without and with position embeddings, four maps each:
    A(x), A(Px), Pᵀ A(Px) P (permuted back) and |Pᵀ A(Px) P − A(x)|."""
    check_format(fmt)
    return save_figure(position_figure(result), out_dir, f"position.{fmt}")


def position_figure(result: PositionResult):
    """The Figure of write_position_figure, laid out and ready to save."""
    num_tokens = len(result.tokens)
    panel = float(np.clip(1.2 + 0.16 * num_tokens, 2.6, 4.5))
    figure = new_figure((4 * panel + 2.2, 2 * (panel + 0.9) + 0.9))
    rows = figure.subfigures(2, 1)
    # One difference scale for both rows, so the row without positions looks as flat as it is.
    h = result.head  # its maps only: the difference of all heads is 12 times the work
    largest = max(float(np.abs(side.permuted_back[h] - side.original[h]).max()) for side in _sides(result))
    drawn = []  # (image, values, colour bar, what it shows) of every panel
    for row, side in zip(rows, _sides(result)):
        drawn += _draw_position_row(row, result, side, difference_scale=max(largest, 1e-6))
    head = f"head {result.head}" + ("" if result.head_chosen else " (the head position changes most)")
    scope = ["layer 0", head, f"x permuted by P = {_permutation_text(result.permutation)}"]
    title = figure_title(result.model, scope, text=result.text, line_chars=chars_across(figure.get_figwidth()))
    figure.suptitle(title, parse_math=False)
    freeze_layout(figure)
    for image, values, colorbar, what in drawn:
        colorbar.set_label(scale_label(what, image.norm, show_attention(image, values)))
    return figure


def _sides(result: PositionResult) -> tuple[PositionSide, PositionSide]:
    return result.without_positions, result.with_positions


def _draw_position_row(row_figure, result: PositionResult, side: PositionSide, difference_scale: float) -> list:
    """Draw one row; return (image, values, its colour bar, what the bar shows) for each panel."""
    from matplotlib.colors import Normalize

    head = result.head
    norm = attention_norm(len(result.tokens))
    difference = np.abs(side.permuted_back[head] - side.original[head])  # (N, N)
    axes = row_figure.subplots(1, 4)
    panels = [
        (side.original[head], result.tokens, "A(x): the text"),
        (side.permuted[head], result.permuted_tokens, "A(Px): permuted text"),
        (side.permuted_back[head], result.tokens, "Pᵀ A(Px) P: permuted back"),
    ]
    # A long text's labels are thinned to every k-th token, each with its index (a repeated word
    # is otherwise ambiguous); then the permuted-back and difference maps, whose rows are the text's
    # as in the first map of their row, leave their rows unlabelled: labels are most of this
    # figure's drawing time, and repeated they tell nothing new.
    repeat_rows = len(result.tokens) <= MAX_POSITION_TICK_LABELS
    max_labels = MAX_POSITION_TICK_LABELS if repeat_rows else MAX_POSITION_LONG_TICK_LABELS
    if not repeat_rows:
        panels = [(weights, [f"{i}:{token}" for i, token in enumerate(tokens)], title) for weights, tokens, title in panels]
    text_labels = panels[0][1]  # the text's tokens, as its maps' axes are labelled
    images = []
    for index, (ax, (weights, tokens, title)) in enumerate(zip(axes, panels)):
        images.append((draw_attention(ax, np.ma.masked_array(weights), norm), np.ma.masked_array(weights)))
        ax.set_title(title, fontsize=9, parse_math=False)
        label_tokens(ax, tokens, tokens if index < 2 or repeat_rows else [], max_labels, fontsize=7)
    difference_image = axes[3].imshow(
        np.ma.masked_all((1, 1)), cmap=DIFFERENCE_COLORMAP, norm=Normalize(0.0, difference_scale), aspect="auto",
        interpolation="nearest",
    )
    show_attention(difference_image, np.ma.masked_array(difference))  # a block's largest difference
    largest = format_difference(float(difference.max()))
    axes[3].set_title(f"|back − A(x)|, max {largest}", fontsize=9, parse_math=False)
    label_tokens(axes[3], text_labels, text_labels if repeat_rows else [], max_labels, fontsize=7)
    weights_bar = attention_colorbar(row_figure, images[0][0], ax=axes[:3], shrink=0.8)
    difference_bar = row_figure.colorbar(difference_image, ax=axes[3], shrink=0.8, label="difference")
    which = "with BERT's" if side.positions else "without"
    verdict = "equivariant" if side.equivariant else "not equivariant"
    value = format_difference(side.max_difference)
    title = f"{which} position embeddings: max over heads |A(Px) − P A(x) Pᵀ| = {value}, {verdict}"
    row_figure.suptitle(title, fontsize=10, parse_math=False)
    drawn = [(image, values, weights_bar, "attention weight") for image, values in images]
    return drawn + [(difference_image, np.ma.masked_array(difference), difference_bar, "difference")]


def _permutation_text(permutation: list[int], max_items: int = 16) -> str:
    if len(permutation) <= max_items:
        return "(" + ",".join(map(str, permutation)) + ")"
    return "(" + ",".join(map(str, permutation[:max_items])) + ",…)"

"""compare.png of `attnviz compare`: the same weights split into different numbers of heads, side by side.

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
    panels = []  # (split's index, head, image) of every panel
    for index, split in enumerate(splits):
        count_index = head_counts.index(split.num_heads)
        row = weights.index(split.weights) * rows_per_weights + count_index // num_columns
        drawn = _draw_split(cells[row, count_index % num_columns], split, norm, seed)
        panels += [(index, head, image) for head, image in drawn]
    colorbar_axes = colorbar_part.add_axes((0.15, 0.2, 0.2, 0.6))
    colorbar = attention_colorbar(colorbar_part, panels[0][2], cax=colorbar_axes)
    run = splits[0].run
    scope = [f"layer {run.layer}", "the same W_q, W_k, W_v split into different numbers of heads"]
    line_chars = chars_across(figure.get_figwidth())
    # The title names the parameters only when every row shares them; else each row's label says.
    shared_weights = weights[0] if len(weights) == 1 else ()
    title = figure_title(
        run.model, scope, text=run.text, weights=shared_weights, seed=seed, line_chars=line_chars,
        fallback_for=run.fallback_for, unknown=(run.unknown, run.kv_unknown),  # the headline's notes: a fallback model, a text mostly [UNK]
    )  # fmt: skip
    figure.suptitle(title, parse_math=False)
    if note:
        figure.supxlabel(note, fontsize=9)
    freeze_layout(figure)
    pools = [show_attention(image, np.ma.masked_array(splits[index].run.attention[head])) for index, head, image in panels]
    colorbar.set_label(scale_label("attention weight", norm, max(pools)))
    return figure


def write_comparison_figure(splits: list[Split], out_dir: Path, fmt: str = "png", seed: int | None = None) -> Path:
    """compare.<fmt>: a row per weights (wrapped after 6 head counts), a column per head count,
    each cell that split's heads."""
    check_format(fmt)
    name = f"compare.{fmt}"
    return save_figure(comparison_figure(splits, name, seed), out_dir, name)


def weights_label(weights: str, seed: int | None) -> str:
    """A row's parameters: "pretrained", or "random, seed 3"."""
    return f"{weights}, seed {seed}" if weights == "random" and seed is not None else weights


def _draw_split(cell_figure, split: Split, norm, seed: int | None) -> list:
    """Draw the split's shown heads into cell_figure (seed: the random parameters'); return (head, image) per panel."""
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
        drawn.append((heads[index], draw_attention(ax, np.ma.masked_array(split.run.attention[heads[index]]), norm)))
        ax.set_title(f"head {heads[index]}", fontsize=7 if num_columns > 2 else 9, pad=2)
        last_row = index + num_columns >= len(heads)
        first_column = index % num_columns == 0
        label_tokens(
            ax,
            split.run.shown_tokens[1] if labelled and last_row else [],
            split.run.shown_tokens[0] if labelled and first_column else [],
            max_labels,
            fontsize=7,
        )
    title = f"{weights_label(split.weights, seed)} · {counted(split.num_heads, 'head')} × d={split.run.head_dim}"
    if len(heads) < split.num_heads:
        title += f"\n{len(heads)} of {split.num_heads} shown, most focused → broadest"
    cell_figure.suptitle(title, fontsize=10, parse_math=False)
    return drawn

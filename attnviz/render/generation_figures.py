"""generate.png (`attnviz generate`): one layer's heads, each a row per generated token over every token before it:
the row that chose it, or its own (analysis.generation.ROWS)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.render.heatmap import MAX_GRID_TICK_LABELS, check_format, grid_shape, label_tokens, new_figure, save_figure
from attnviz.render.scales import attention_colorbar, attention_norm, draw_attention
from attnviz.render.titles import counted, figure_title, chars_across

PANEL_INCHES = (4.6, 2.6)
MIN_WIDTH_INCHES = 8.0  # one head's figure: room for the title's lines


ROW_AXIS = {"chosen": "token chosen (by the row of the one before)", "read": "token reading (its own row)"}


def generation_figure(generation, layer: int, rows_are: str = "chosen", head: int | None = None):
    """Each head of `layer` (or the one head) as a panel: rows the generated tokens (each its row named by rows_are),
    columns the prompt and the continuation; the cells past each row's query (the future then) grey."""
    from attnviz.analysis.generation import ROWS

    rows = generation.rows(rows_are)[layer]  # (H, n, T)
    heads = list(range(rows.shape[0])) if head is None else [head]
    num_generated, num_tokens = rows.shape[1:]
    num_heads = len(heads)
    prompt = generation.num_prompt
    future = np.arange(num_tokens)[None, :] > generation.queries(rows_are)[:, None]  # (n, T)
    grid_rows, grid_columns = grid_shape(num_heads)
    figure = new_figure((max(grid_columns * PANEL_INCHES[0], MIN_WIDTH_INCHES), grid_rows * PANEL_INCHES[1] + 1.2))
    norm = attention_norm(num_tokens)
    image = None
    for index, shown in enumerate(heads):
        ax = figure.add_subplot(grid_rows, grid_columns, index + 1)
        image = draw_attention(ax, np.ma.masked_array(rows[shown], future), norm)
        ax.axvline(prompt - 0.5, color="white", linewidth=0.8)  # the prompt's end
        ax.set_title(f"head {shown}", fontsize=9)
        ax.set_ylabel(ROW_AXIS[rows_are], fontsize=7)
        label_tokens(ax, generation.shown_tokens, generation.shown_tokens[prompt:], MAX_GRID_TICK_LABELS, 6)
    attention_colorbar(figure, image, ax=figure.axes, shrink=0.8)
    how = f"sampled (seed {generation.seed})" if generation.sample else "greedy"
    scope = [f"layer {layer}", counted(num_generated, "token") + f" generated, {how}"]
    notes = [f"rows: {ROWS[rows_are]}; columns: the prompt (left of the white line) and the continuation"]
    figure.suptitle(
        figure_title(generation.model, scope, text=generation.prompt + generation.continuation, causal=True, notes=notes, line_chars=chars_across(figure.get_figwidth())),
        parse_math=False,
    )
    return figure


def write_generation_figure(generation, layer: int, rows_are: str, out_dir: Path, fmt: str = "png") -> Path:
    check_format(fmt)
    return save_figure(generation_figure(generation, layer, rows_are), out_dir, f"generate.{fmt}")

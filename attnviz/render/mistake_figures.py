"""The figures of a deliberate mistake in a shape trace (`attnviz trace --mistake`).

A wrong split changes the weights: its "heads" get heatmaps whose rows and columns are labelled
with what they really hold, a slice of a token's features, not a token. A wrong merge leaves the
weights as they were and mixes up the merged rows: its figure shows where each head's output
lands. Every figure is at most MAX_IMAGE_SIDE pixels a side, the merge figure at most
MERGE_MAX_PX; cells are drawn without interpolation, so every colour is one on the scale.
"""

from __future__ import annotations

import math
from pathlib import Path

from attnviz.render.scales import MAX_IMAGE_SIDE_PX as MAX_IMAGE_SIDE  # pixels, width and height, of every figure
from attnviz.tracing import TraceResult

MAX_GRID_HEADS = 16  # wrong heads in the grid figure; every head has its own file
MIN_LABEL_PIXELS = 12  # a tick label needs about this much room along its axis
# (width, height) of the merge figure: as wide as any figure (many heads), and at most 20 inches
# tall, about 4 pixels a row at 512 tokens; a taller one takes longer to draw and shows no more.
MERGE_MAX_PX = (MAX_IMAGE_SIDE, 2400)
MAX_MERGE_ROW_LABELS = 64  # token labels down the merge figure: every 8th token at 512 tokens


def mistake_prefix(mistake: str) -> str:
    return f"mistake_{mistake}_"


def write_mistake_figures(
    result: TraceResult, run, out_dir: Path, fmt: str = "png", notes: list[str] | None = None, seed: int | None = None
) -> list[Path]:
    """head_XX and heads (right, of the first text), and beside them the mistake's figures.

    notes receives a line for each figure that was capped or thinned; seed (of random
    parameters) goes into the titles.
    """
    from attnviz.render.heatmap import write_heatmaps

    notes = [] if notes is None else notes
    mistake = result.mistake.mistake
    written = write_heatmaps(run, out_dir, fmt, seed=seed)
    if mistake == "view-without-permute":
        written += write_split_heatmaps(result, run, out_dir, fmt, notes, seed)
    else:
        path = out_dir / f"{mistake_prefix(mistake)}merge.{fmt}"
        written.append(write_merge_figure(result, run, path, notes, seed))
    return written


def slice_labels(num_heads: int, num_tokens: int, head_dim: int, tokens: list[str]) -> list[list[str]]:
    """For each wrong head, each row's label "token:text sK": slice K (columns K*d..) of that token."""
    from attnviz.render.fonts import displayable
    from attnviz.tracing import split_provenance

    provenance = split_provenance(num_heads, num_tokens, head_dim, "view-without-permute")  # (H, N, 2)
    name = lambda token: displayable(tokens[token]) if token < len(tokens) else "[PAD]"
    return [[f"{token}:{name(token)} s{piece}" for token, piece in head.tolist()] for head in provenance]


def _split_title(run, width_inches: float, seed: int | None, head: int | None = None) -> str:
    """The wrong computation named first, then the figure's usual title (titles.run_title)."""
    from attnviz.render.titles import chars_across, run_title

    which = f"'head' {head}" if head is not None else f"{run.num_heads} 'heads'"  # a mistake needs 2 heads or more
    title = run_title(run, [f"layer {run.layer}", which], seed=seed, line_chars=chars_across(width_inches, 9), over_words=False)
    return f"WRONG computation: q.view(B, H, N, d) without permute\n{title}"


SPLIT_AXIS_NOTE = "token:text sK = slice K (columns K·d..(K+1)·d−1) of that token"


def write_split_heatmaps(
    result: TraceResult, run, out_dir: Path, fmt: str, notes: list[str], seed: int | None = None
) -> list[Path]:
    """The wrong heads of the first text: per head a heatmap, and a grid of the first 16.

    Row n of wrong head h is not token n: it is slice (h*N + n) % H of token (h*N + n) // H,
    and each label says which. The maps are the whole padded length of the batch.
    """
    import numpy as np

    from attnviz.render.cell_values import cell_values, update_cell_values
    from attnviz.render.heatmap import (
        MAX_GRID_TICK_LABELS, MAX_TICK_LABELS, draw_attention, freeze_layout, grid_shape,
        head_figure_size, label_tokens, new_figure, save_figure, show_attention,
    )  # fmt: skip
    from attnviz.render.scales import attention_colorbar, scale_label

    wrong = next(trace for trace in result.layouts if trace.mistake == "view-without-permute")
    weights = wrong.weights[0].numpy()  # (H, Nq, Nk) of the first text, padding included
    num_heads, num_queries, num_keys = weights.shape
    query_labels = slice_labels(num_heads, num_queries, result.head_dim, run.shown_tokenizer_tokens[0])
    key_labels = slice_labels(num_heads, num_keys, result.head_dim, run.shown_tokenizer_tokens[1])
    prefix = mistake_prefix("view-without-permute")
    # One figure for every head: per head only the data, the tick labels and the title change.
    # Its layout is solved once, for the head with the longest labels, so that every head fits.
    figure = new_figure(head_figure_size(num_queries, num_keys))
    ax = figure.add_subplot()
    image = draw_attention(ax, np.ma.masked_array(weights[0]))
    values = cell_values(ax, num_queries, num_keys)
    title = ax.set_title("", fontsize=9, color="darkred", parse_math=False)
    ax.set_xlabel(f"wrong 'key' row: {SPLIT_AXIS_NOTE}", fontsize=8)
    ax.set_ylabel("wrong 'query' row: a slice of a token, not a token", fontsize=8)
    what = "attention weight of the wrong computation"
    colorbar = attention_colorbar(figure, image, what, ax=ax)  # says when it is log

    def show(head: int) -> int:
        head_weights = np.ma.masked_array(weights[head])  # (Nq, Nk)
        pool = show_attention(image, head_weights)  # fitted to the axes' pixels: each pixel one value
        if values is not None:
            update_cell_values(values, head_weights, image)
        label_tokens(ax, key_labels[head], query_labels[head], MAX_TICK_LABELS, fontsize=7)
        title.set_text(_split_title(run, figure.get_figwidth(), seed, head))
        return pool

    show(max(range(num_heads), key=lambda head: max(map(len, query_labels[head] + key_labels[head]))))
    freeze_layout(figure)
    written = []
    for head in range(num_heads):
        colorbar.set_label(scale_label(what, image.norm, show(head)))  # the same for every head: the same axes
        written.append(save_figure(figure, out_dir, f"{prefix}head_{head:02d}.{fmt}"))

    shown = min(num_heads, MAX_GRID_HEADS)
    if shown < num_heads:
        notes.append(
            f"{prefix}heads.{fmt} shows the first {shown} of the {num_heads} wrong heads "
            f"(at most {MAX_GRID_HEADS}, to stay readable); every head has its own {prefix}head_XX.{fmt}"
        )
    num_rows, num_columns = grid_shape(shown)
    panel = float(np.clip(1.6 + 0.1 * max(num_queries, num_keys), 2.4, 3.2))
    figure = new_figure((num_columns * panel + 2.5, num_rows * panel + 2.0))
    axes = figure.subplots(num_rows, num_columns, squeeze=False)
    for head, ax in enumerate(axes.flat):
        if head >= shown:
            ax.set_visible(False)
            continue
        image = draw_attention(ax, np.ma.masked_array(weights[head]))
        ax.set_title(f"'head' {head}", fontsize=9)
        label_tokens(ax, key_labels[head], query_labels[head], MAX_GRID_TICK_LABELS // 2, fontsize=5)
    what = "attention weight of the wrong computation"
    colorbar = attention_colorbar(figure, image, what, ax=axes, shrink=0.6)
    figure.suptitle(_split_title(run, figure.get_figwidth(), seed), color="darkred", parse_math=False)
    figure.supxlabel(f"rows and columns: {SPLIT_AXIS_NOTE}", fontsize=9)
    freeze_layout(figure)  # laid out once: savefig then draws the grid once, not twice
    # Fitted to the frozen axes: each pixel one value, or a block's maximum, which the bar then says.
    pools = [show_attention(ax.images[0], np.ma.masked_array(weights[head])) for head, ax in enumerate(axes.flat[:shown])]
    colorbar.set_label(scale_label(what, image.norm, max(pools)))
    return written + [save_figure(figure, out_dir, f"{prefix}heads.{fmt}")]


def thinned_ticks(count: int, pixels: float, max_labels: int | None = None) -> list[int]:
    """Every k-th index, so that each label has MIN_LABEL_PIXELS along an axis of this many pixels,
    and no more than max_labels are labelled."""
    from attnviz.render.heatmap import tick_positions

    fitting = max(1, int(pixels // MIN_LABEL_PIXELS))
    return tick_positions(count, fitting if max_labels is None else min(fitting, max_labels))


def write_merge_figure(
    result: TraceResult, run, path: Path, notes: list[str] | None = None, seed: int | None = None
) -> Path:
    """Two grids, right merge and merge without permute: row n, slot h is columns h*d..(h+1)*d-1
    of token n's merged output; the colour is the token its numbers came from, the label the head.

    At most MERGE_MAX_PX (width, height): a long text or many heads get thinner rows and fewer
    labels (at most MAX_MERGE_ROW_LABELS tokens), and a line in notes says so.
    """
    import numpy as np

    from attnviz.render.fonts import displayable
    from attnviz.render.heatmap import DPI, freeze_layout, new_figure, save_figure
    from attnviz.render.titles import chars_across, counted, run_title
    from attnviz.tracing import merge_provenance

    notes = [] if notes is None else notes
    tokens = run.shown_tokenizer_tokens[0]  # the merged rows are tokens' rows, also with --words
    num_heads, num_tokens = result.num_heads, len(tokens)
    panels = {
        "right\nz.permute(0, 2, 1, 3).contiguous().view(B, N, D)": merge_provenance(num_heads, num_tokens, result.head_dim),
        "WRONG computation\nz.view(B, N, D)": merge_provenance(num_heads, num_tokens, result.head_dim, "merge-without-permute"),
    }
    cell = 0.5 if num_heads <= 16 else 0.25
    panel_width = max(num_heads * cell, 3.6)  # inches: wide enough for the code in its title
    natural = (2 * panel_width + 3.5, num_tokens * 0.38 + 2.4)
    size = (min(natural[0], MERGE_MAX_PX[0] / DPI), min(natural[1], MERGE_MAX_PX[1] / DPI))
    figure = new_figure(size)
    axes = figure.subplots(1, 2, sharey=True)
    labels = [displayable(token) for token in tokens]
    rows = thinned_ticks(num_tokens, (size[1] - 2.4) * DPI, MAX_MERGE_ROW_LABELS)
    slots = thinned_ticks(num_heads, (size[0] - 3.5) / 2 * DPI)
    for ax, (title, provenance) in zip(axes, panels.items()):
        source_tokens = provenance[..., 1].numpy()  # (N, H)
        image = ax.imshow(
            source_tokens, cmap="viridis", vmin=0, vmax=max(num_tokens - 1, 1), aspect="auto", interpolation="nearest"
        )
        ax.set_title(title, fontsize=9, parse_math=False, color="darkred" if title.startswith("WRONG") else "black")
        ax.set_xticks(slots, [str(h) for h in slots], fontsize=7)
        ax.set_xlabel(f"slot h: columns h·{result.head_dim} .. (h+1)·{result.head_dim}−1")
        if num_tokens <= 24 and num_heads <= 16:
            for (row, slot), token in np.ndenumerate(source_tokens):
                head = int(provenance[row, slot, 0])
                ax.text(slot, row, f"h{head}\nt{token}", ha="center", va="center", fontsize=5.5,
                        color="black" if token > num_tokens / 2 else "white")  # fmt: skip
    # The panels share their rows: labelled once, on the left (ticks are most of the drawing time).
    axes[0].set_yticks(rows, [f"{index}:{labels[index]}" for index in rows], fontsize=8, parse_math=False)
    axes[0].set_ylabel("token n (row of the merged output)")
    colorbar = figure.colorbar(image, ax=axes, shrink=0.8)
    colorbar.set_label("the token its numbers came from")
    if num_tokens <= 24:
        colorbar.set_ticks(range(num_tokens), labels=[f"{index}:{label}" for index, label in enumerate(labels)])
    scope = [f"layer {run.layer}", counted(num_heads, "head")]
    title = run_title(run, scope, seed=seed, line_chars=chars_across(size[0]), over_words=False)
    figure.suptitle(f"where each head's output lands in the merged rows (h = head, t = token)\n{title}", parse_math=False)
    freeze_layout(figure)  # laid out once: savefig then draws the figure once, not twice
    save_figure(figure, path.parent, path.name)
    if size != natural or len(rows) < num_tokens or len(slots) < num_heads:
        notes.append(
            f"{path.name} is capped at {MERGE_MAX_PX[0]} × {MERGE_MAX_PX[1]} pixels ({math.ceil(size[0] * DPI)} × "
            f"{math.ceil(size[1] * DPI)}): {len(rows)} of {num_tokens} tokens and {len(slots)} of {num_heads} "
            "slots labelled"
        )
    return path

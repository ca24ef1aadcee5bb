"""Figures across layers: every head of every layer at a glance, attention rollout, and the
Jensen-Shannon distances between the heads of each layer.

Same conventions as attnviz.heatmap (rows are queries, columns keys, a fixed 0..1 colour
scale, causal-masked cells in grey) and the same fast path: plain matplotlib Figures on an Agg
canvas, one imshow per map and no Text artist per cell. The layer-by-head grid is a single image:
the panels are coloured in NumPy and pasted side by side, so 72 maps draw as fast as one.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np


# The underscored helpers too: both renderers make, lay out, colour and save figures alike.
from attnviz.heatmap import (
    COLORMAP,
    DPI,
    MASKED_COLOR,
    MAX_ANNOTATED_TOKENS,
    MAX_TICK_LABELS,
    cell_values,
    check_format,
    draw_attention,
    freeze_layout,
    grid_shape,
    head_figure_size,
    label_tokens,
    masked_attention,
    new_figure,
    save_options,
    tick_positions,
    update_cell_values,
)
from attnviz.result import AttentionRun
from attnviz.titles import chars_across, counted, figure_title, run_title

GRID_PANEL_INCHES = 1.1  # one head's map in layers.png
MAX_GRID_WIDTH_INCHES = 18.0  # panels shrink so that many heads (--heads 48, ...) stay on a screen
PANEL_GAP = 0.08  # white space between panels, as a fraction of a panel
MAX_GRID_CELLS_PER_PANEL = 192  # longer texts are averaged down, as the screen would anyway


def write_layers_grid(layer_runs: list[AttentionRun], out_dir: Path, fmt: str = "png", seed: int | None = None) -> Path:
    """Write layers.<fmt>: a row per layer, a column per head, each cell that head's map."""
    check_format(fmt)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    first = layer_runs[0]
    num_layers, num_heads = len(layer_runs), first.num_heads
    num_tokens = len(first.query_tokens)
    mosaic, panel_size, step = _layers_mosaic(layer_runs)  # (rows, columns, 4) uint8

    panel = min(GRID_PANEL_INCHES, (MAX_GRID_WIDTH_INCHES - 2.0) / num_heads)
    figure = new_figure((num_heads * panel + 2.0, num_layers * panel + 1.4))
    ax = figure.add_subplot()
    # "auto": resampled with anti-aliasing when the image has more cells than the panel pixels.
    ax.imshow(mosaic, aspect="auto", interpolation="auto")
    centre = (panel_size - 1) / 2
    ax.xaxis.tick_top()
    head_ticks = tick_positions(num_heads, 24)
    ax.set_xticks([h * step + centre for h in head_ticks], [f"H{h}" for h in head_ticks], fontsize=8)
    layer_ticks = tick_positions(num_layers, 48)
    ax.set_yticks([layer * step + centre for layer in layer_ticks], [f"L{layer}" for layer in layer_ticks], fontsize=8)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    scale = ScalarMappable(Normalize(0.0, 1.0), _colormap())
    figure.colorbar(scale, ax=ax, shrink=0.6, label="attention weight")
    scope = [f"{counted(num_layers, 'layer')} × {counted(num_heads, 'head')}", counted(num_tokens, "token")]
    notes = ["rows: queries, columns: keys"]
    title = run_title(first, scope, seed=seed, notes=notes, line_chars=chars_across(figure.get_figwidth()))
    figure.suptitle(title, parse_math=False)
    freeze_layout(figure)
    path = Path(out_dir) / f"layers.{fmt}"
    figure.savefig(path, dpi=DPI, **save_options(fmt))
    return path


def _layers_mosaic(layer_runs: list[AttentionRun]) -> tuple[np.ndarray, int, int]:
    """Every head's coloured map pasted into one RGBA image, white between panels.

    Returns the image (rows, columns, 4), a panel's size in cells, and the step from one
    panel to the next (size plus gap).
    """
    num_heads = layer_runs[0].num_heads
    num_tokens = layer_runs[0].attention.shape[-1]
    pool = math.ceil(num_tokens / MAX_GRID_CELLS_PER_PANEL)
    panel_size = math.ceil(num_tokens / pool)
    gap = max(1, round(panel_size * PANEL_GAP))
    step = panel_size + gap
    mosaic = np.full((len(layer_runs) * step - gap, num_heads * step - gap, 4), 255, dtype=np.uint8)
    colormap = _colormap()
    for layer, run in enumerate(layer_runs):
        for head in range(num_heads):
            weights = _pooled(masked_attention(run.attention[head], run.causal), pool)  # (n, n)
            top, left = layer * step, head * step
            mosaic[top : top + panel_size, left : left + panel_size] = colormap(weights, bytes=True)
    return mosaic, panel_size, step


def _pooled(weights: np.ma.MaskedArray, pool: int) -> np.ma.MaskedArray:
    """Mean over pool x pool blocks (a block is masked only when all of it is); pool 1 is a no-op."""
    if pool == 1:
        return weights
    size = math.ceil(weights.shape[0] / pool) * pool
    padded = np.ma.masked_all((size, size))
    padded[: weights.shape[0], : weights.shape[1]] = weights
    blocks = padded.reshape(size // pool, pool, size // pool, pool)  # (n, pool, n, pool)
    return blocks.mean(axis=(1, 3))  # (n, n): masked cells left out of each mean


def write_rollout(
    layer_runs: list[AttentionRun], rollout: np.ndarray, out_dir: Path, fmt: str = "png", seed: int | None = None
) -> Path:
    """Write rollout.<fmt>: the rollout (N, N) of these layers' runs, with the tokens on both axes."""
    check_format(fmt)
    run = layer_runs[0]
    num_tokens = rollout.shape[0]
    figure = new_figure(head_figure_size(num_tokens, num_tokens))
    ax = figure.add_subplot()
    shown = masked_attention(rollout, run.causal)  # (N, N); causal rollout is lower-triangular too
    image = draw_attention(ax, shown, interpolation="nearest")
    values_in_cells = cell_values(ax, num_tokens, num_tokens)
    if values_in_cells is not None:
        update_cell_values(values_in_cells, shown, image)
    short = num_tokens <= MAX_ANNOTATED_TOKENS
    label_tokens(ax, run.query_tokens, run.query_tokens, MAX_TICK_LABELS, fontsize=10 if short else 7)
    ax.set_xlabel("input token (key)")
    ax.set_ylabel("token after the last layer (query)")
    scope = [f"attention rollout through {counted(len(layer_runs), 'layer')}", "heads averaged"]
    line_chars = chars_across(figure.get_figwidth())
    ax.set_title(run_title(run, scope, seed=seed, line_chars=line_chars), parse_math=False)
    figure.colorbar(image, ax=ax, label="share of the input token")
    freeze_layout(figure)
    path = Path(out_dir) / f"rollout.{fmt}"
    figure.savefig(path, dpi=DPI, **save_options(fmt))
    return path


def write_js_distance(
    distances: np.ndarray, run: AttentionRun, texts: list[str], out_dir: Path, fmt: str = "png", seed: int | None = None
) -> Path:
    """Write js_distance.<fmt>: for each layer, the (H, H) Jensen-Shannon distances of its heads.

    run is any run of the texts, for the model and the setup in the title. One image like
    layers.png: the layers' panels pasted into a grid with a band above each panel for its
    title, head numbers along the outer edges only.
    """
    check_format(fmt)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    num_layers, num_heads = distances.shape[:2]
    num_rows, num_columns = grid_shape(num_layers)
    band = max(1, math.ceil(0.3 * num_heads))  # above each panel, for "layer L"
    gap = max(1, round(0.12 * num_heads))  # between the columns of panels
    step_x, step_y = num_heads + gap, band + num_heads
    mosaic = np.full((num_rows * step_y, num_columns * step_x - gap, 4), 255, dtype=np.uint8)
    colormap = _colormap()
    for layer in range(num_layers):
        top, left = (layer // num_columns) * step_y + band, (layer % num_columns) * step_x
        mosaic[top : top + num_heads, left : left + num_heads] = colormap(distances[layer], bytes=True)

    panel = 2.2 if num_heads <= 16 else 3.0
    # Inches: the image, plus room for the colorbar and labels beside it and the title above.
    figure = new_figure((num_columns * panel * step_x / num_heads + 2.4, num_rows * panel * step_y / num_heads + 1.0))
    ax = figure.add_subplot()
    ax.imshow(mosaic, aspect="equal", interpolation="nearest")
    for layer in range(num_layers):
        centre = (layer % num_columns) * step_x + (num_heads - 1) / 2
        bottom_of_band = (layer // num_columns) * step_y + band - 0.7
        ax.text(centre, bottom_of_band, f"layer {layer}", ha="center", va="bottom", fontsize=9)
    heads = tick_positions(num_heads, 6)
    head_labels = [str(h) for h in heads]
    x_ticks = [column * step_x + h for column in range(num_columns) for h in heads]
    y_ticks = [row * step_y + band + h for row in range(num_rows) for h in heads]
    ax.set_xticks(x_ticks, head_labels * num_columns, fontsize=7)
    ax.set_yticks(y_ticks, head_labels * num_rows, fontsize=7)
    ax.tick_params(length=2)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("head")
    ax.set_ylabel("head")
    scale = ScalarMappable(Normalize(0.0, 1.0), colormap)
    figure.colorbar(scale, ax=ax, shrink=0.7, label="JS distance (0 same rows, 1 disjoint)")
    scope = [
        f"{counted(num_layers, 'layer')} × {counted(num_heads, 'head')}",
        "Jensen-Shannon distance between the heads of each layer",
    ]
    text, about = (texts[0], None) if len(texts) == 1 else (None, f"averaged over {len(texts)} texts")
    title = figure_title(
        run.model, scope, text=text, about=about, causal=run.causal, weights=run.weights, seed=seed,
        line_chars=chars_across(figure.get_figwidth()),
    )
    figure.suptitle(title, parse_math=False)
    freeze_layout(figure)
    path = Path(out_dir) / f"js_distance.{fmt}"
    figure.savefig(path, dpi=DPI, **save_options(fmt))
    return path


def _colormap():
    import matplotlib

    return matplotlib.colormaps[COLORMAP].with_extremes(bad=MASKED_COLOR)

"""Figures across layers: every head of every layer at a glance, attention rollout, and the
Jensen-Shannon distances between the heads of each layer.

Same conventions as attnviz.render.heatmap (rows are queries, columns keys, a fixed 0..1 colour
scale, log for long texts, causal-masked cells in grey, each pixel one value or the maximum of
a block of cells, the size cap) and the same fast path: plain matplotlib Figures on an Agg
canvas, one imshow per map and no Text artist per cell. The layer-by-head grid is a single image:
the panels are coloured in NumPy and pasted side by side, so 72 maps draw as fast as one.
"""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path

import numpy as np


from attnviz.analysis.statistics import CAUSAL_OVER_BIDIRECTIONAL
from attnviz.render.cell_values import MAX_ANNOTATED_TOKENS, cell_values, update_cell_values
from attnviz.render.fonts import displayable
from attnviz.render.heatmap import (
    MAX_TICK_LABELS,
    check_format,
    freeze_layout,
    grid_shape,
    head_figure_size,
    label_tokens,
    masked_attention,
    new_figure,
    save_figure,
    tick_positions,
)
from attnviz.run_data import AttentionRun
from attnviz.render.scales import (
    attention_colorbar,
    attention_colormap,
    attention_colors,
    attention_norm,
    block_maximum,
    draw_attention,
    say_capped,
    scale_label,
    show_attention,
)
from attnviz.render.titles import CHAR_WIDTH, WORDS_NOTE, chars_across, counted, figure_title, run_setup, run_title

GRID_PANEL_INCHES = 1.1  # one head's map in layers.png
MAX_GRID_WIDTH_INCHES = 18.0  # panels shrink so that many heads (--heads 48, ...) stay on a screen
PANEL_GAP = 0.08  # white space between panels, as a fraction of a panel
TOKEN_LABEL_POINTS = 6.0  # layers.png's token labels: 6-point text ...
TOKEN_LABEL_SPACING = 9.0  # ... at least 9 points apart, so a panel of 1.1 inches labels 8 tokens


def write_layers_grid(
    layer_runs: list[AttentionRun], out_dir: Path, fmt: str = "png", seed: int | None = None, maxima: np.ndarray | None = None
) -> Path:
    """Write layers.<fmt>: a row per layer, a column per head, each cell that head's map.

    Each panel gets as many cells as it has pixels: a longer text is shown as the maximum of
    blocks of cells (so a one-hot head stays at 1), and the colour bar says so. maxima: those
    block maxima computed beforehand (layers_figure), for runs whose maps were never whole.
    """
    check_format(fmt)
    name = f"layers.{fmt}"
    return save_figure(layers_figure(layer_runs, name, seed, maxima), out_dir, name)


def layers_figure(layer_runs: list[AttentionRun], name: str = "layers.png", seed: int | None = None, maxima: np.ndarray | None = None):
    """The Figure of write_layers_grid, laid out and ready to save; name is for the size cap's note.

    maxima: the panels' block maxima (L, H, P, P), computed block by block of queries where the maps are
    never whole (analysis.block_maxima, P from layers_panel_cells), in place of the runs' maps.
    """
    first = layer_runs[0]
    num_layers, num_heads = len(layer_runs), first.num_heads
    num_tokens = len(first.query_tokens)
    figure, ax, image, token_axes, colorbar, max_labels, norm = _layers_layout(first, num_layers, name, seed)
    max_cells = _grid_cells(ax, num_layers, num_heads)
    if maxima is None:
        mosaic, panel_size, step = _layers_mosaic(layer_runs, max_cells, norm)
    else:
        mosaic, panel_size, step = _maxima_mosaic(maxima, max_cells, norm)
    image.set_data(mosaic)
    image.set_extent((-0.5, mosaic.shape[1] - 0.5, mosaic.shape[0] - 0.5, -0.5))
    _label_layers_grid(ax, num_layers, num_heads, panel_size, step)
    if token_axes:
        _label_panel_tokens(token_axes, first, num_layers, num_heads, max_labels, panel_size, step)
    colorbar.set_label(scale_label("attention weight", norm, math.ceil(num_tokens / panel_size)))
    return figure


def layers_panel_cells(run: AttentionRun, num_layers: int, seed: int | None = None) -> int:
    """The cells a side of each panel of layers_figure for num_layers layers of run's text (its tokens, heads and
    setup; no weights needed): the size of block maxima that draw the same picture as the whole maps."""
    _, ax, *_ = _layers_layout(run, num_layers, None, seed)
    return min(len(run.query_tokens), _grid_cells(ax, num_layers, run.num_heads))


def _layers_layout(first: AttentionRun, num_layers: int, name: str | None, seed: int | None):
    """layers_figure's figure laid out with an empty image: (figure, ax, image, token axes or None, colorbar,
    the token labels a panel takes, norm). name None: no size cap's note (layers_panel_cells)."""
    from matplotlib.cm import ScalarMappable

    num_heads = first.num_heads
    num_tokens = len(first.query_tokens)
    norm = attention_norm(num_tokens)

    room = _token_label_inches(first)  # beside the panels for their token labels, where they fit
    panel = min(GRID_PANEL_INCHES, (MAX_GRID_WIDTH_INCHES - 2.0 - room) / num_heads)
    max_labels = int(panel * 72 / TOKEN_LABEL_SPACING)
    room = room if max_labels >= 2 else 0.0
    panel = min(GRID_PANEL_INCHES, (MAX_GRID_WIDTH_INCHES - 2.0 - room) / num_heads)
    size = (num_heads * panel + 2.0 + room, num_layers * panel + 1.4 + room)
    figure = new_figure(say_capped(name, size) if name is not None else size)
    ax = figure.add_subplot()
    image = ax.imshow(np.full((1, 1, 4), 255, dtype=np.uint8), aspect="auto", interpolation="nearest")
    ax.xaxis.tick_top()
    _label_layers_grid(ax, num_layers, num_heads, panel_size=1, step=1)  # the labels' room, for the layout
    token_axes = _token_axes(ax) if room else None
    if token_axes:
        _label_panel_tokens(token_axes, first, 1, 1, max_labels, panel_size=1, step=1)  # one panel's: the room
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    colorbar = attention_colorbar(figure, ScalarMappable(norm, attention_colormap()), ax=ax, shrink=0.6)
    scope = [f"{counted(num_layers, 'layer')} × {counted(num_heads, 'head')}", counted(num_tokens, "token")]
    notes = ["rows: queries, columns: keys", *_causal_notes(first)]
    title = run_title(first, scope, seed=seed, notes=notes, line_chars=chars_across(figure.get_figwidth()))
    figure.suptitle(title, parse_math=False)
    freeze_layout(figure)
    return figure, ax, image, token_axes, colorbar, max_labels, norm


def _grid_cells(ax, num_layers: int, num_heads: int) -> int:
    """The most cells a panel may have in the laid-out axes."""
    box = ax.get_window_extent()  # pixels
    return min(_panel_cells(int(box.width), num_heads), _panel_cells(int(box.height), num_layers))


def _panel_gap(panel_size: int) -> int:
    return max(1, round(panel_size * PANEL_GAP))


def _panel_cells(pixels: int, num_panels: int) -> int:
    """The most cells a panel may have so that num_panels of them, with their gaps, fit in pixels."""
    cells = max(1, int(pixels / (num_panels * (1 + PANEL_GAP))))
    while cells > 1 and num_panels * (cells + _panel_gap(cells)) - _panel_gap(cells) > pixels:
        cells -= 1
    return cells


def _label_layers_grid(ax, num_layers: int, num_heads: int, panel_size: int, step: int) -> None:
    centre = (panel_size - 1) / 2
    head_ticks = tick_positions(num_heads, 24)
    ax.set_xticks([h * step + centre for h in head_ticks], [f"H{h}" for h in head_ticks], fontsize=8)
    layer_ticks = tick_positions(num_layers, 48)
    ax.set_yticks([layer * step + centre for layer in layer_ticks], [f"L{layer}" for layer in layer_ticks], fontsize=8)


def _token_label_inches(run: AttentionRun) -> float:
    """The room the longest token label takes across (keys are written upright, queries along)."""
    ems = max(_ems(displayable(token)) for token in [*run.shown_tokens[1], *run.shown_tokens[0]])
    return min(1.2, 0.15 + ems * TOKEN_LABEL_POINTS / 72)


def _ems(label: str) -> float:
    """A label's width in font sizes: a CJK character one, another about 0.6 (titles.CHAR_WIDTH)."""
    return sum(1.0 if unicodedata.east_asian_width(char) in "WF" else CHAR_WIDTH for char in label)


def _token_axes(ax) -> tuple:
    """The axes for the panels' tokens: keys below the last layer's first panel, queries right of its last panel.

    Heads are named on the top and layers on the left (_label_layers_grid); the tokens take the other two sides.
    """
    return ax.secondary_xaxis("bottom"), ax.secondary_yaxis("right")


def _label_panel_tokens(
    token_axes, run: AttentionRun, num_layers: int, num_heads: int, max_labels: int, panel_size: int, step: int
) -> None:
    """Every k-th token (heatmap.tick_positions: at most max_labels a panel) at its cell of the last layer's corner
    panels: keys below its first head, queries right of its last. Every panel has the same axes, and one labelled
    corner keeps the figure quick to draw (a tick label is an artist of its own: 144 of them, one set per panel,
    doubled the figure's drawing time at 8 tokens).

    A panel of panel_size cells shows blocks of tokens when the text is longer (block maximum):
    a token's label goes at its place in the panel.
    """
    bottom, right = token_axes

    def cells(positions: list[int], num_tokens: int, panel: int) -> list[float]:
        return [panel * step + (token + 0.5) * panel_size / num_tokens - 0.5 for token in positions]  # its cell, or block

    query_tokens, key_tokens = run.shown_tokens
    keys = tick_positions(len(key_tokens), max_labels)
    queries = tick_positions(len(query_tokens), max_labels)
    # parse_math=False: a token such as "$" must print as itself, not start mathtext.
    bottom.set_xticks(
        cells(keys, len(key_tokens), 0), [displayable(key_tokens[k]) for k in keys],
        rotation=90, fontsize=TOKEN_LABEL_POINTS, parse_math=False,
    )  # fmt: skip
    right.set_yticks(
        cells(queries, len(query_tokens), num_layers - 1), [displayable(query_tokens[q]) for q in queries],
        fontsize=TOKEN_LABEL_POINTS, parse_math=False,
    )  # fmt: skip
    for axis in token_axes:
        axis.tick_params(length=0, pad=1)
        for spine in axis.spines.values():
            spine.set_visible(False)


def _layers_mosaic(layer_runs: list[AttentionRun], max_cells: int = 10**6, norm=None) -> tuple[np.ndarray, int, int]:
    """Every head's coloured map pasted into one RGBA image, white between panels.

    A map of more than max_cells tokens is cut into max_cells near-equal blocks a side, each
    coloured by its largest weight (block_maximum). norm defaults to attention_norm. Returns
    the image (rows, columns, 4), a panel's size in cells, and the step from one panel to the
    next (size plus gap).
    """
    num_heads = layer_runs[0].num_heads
    num_tokens = layer_runs[0].attention.shape[-1]
    norm = norm if norm is not None else attention_norm(num_tokens)
    panel_size = min(num_tokens, max_cells)
    gap = _panel_gap(panel_size)
    step = panel_size + gap
    mosaic = np.full((len(layer_runs) * step - gap, num_heads * step - gap, 4), 255, dtype=np.uint8)
    future = np.triu(np.ones((num_tokens, num_tokens), dtype=bool), k=1)  # key index > query index
    for layer, run in enumerate(layer_runs):
        for head in range(num_heads):
            weights = _panel_maximum(run.attention[head], future if run.causal else None, panel_size)
            top, left = layer * step, head * step
            mosaic[top : top + panel_size, left : left + panel_size] = attention_colors(weights, norm)
    return mosaic, panel_size, step


def _panel_maximum(weights: np.ndarray, future: np.ndarray | None, cells: int) -> np.ma.MaskedArray:
    """scales.block_maximum of one (N, N) map, masked where future (a causal run's future keys) is True.

    The same blocks and values, through a plain array (its own dtype, the mask as -inf) rather than a
    masked one: 72 maps of 512 tokens take a third of the time. Returns (cells, cells), masked where
    a block is all future.
    """
    values = weights if future is None else np.where(future, -np.inf, weights)  # (N, N)
    if cells < values.shape[0]:
        for axis in (0, 1):
            size = values.shape[axis]
            starts = (np.arange(cells) * size + cells - 1) // cells  # as block_maximum: the first cell of each block
            values = np.maximum.reduceat(values, starts, axis=axis)
    values = values.astype(np.float64)  # (cells, cells), as block_maximum: coloured exactly alike
    return np.ma.masked_invalid(np.where(np.isneginf(values), np.nan, values))


def _maxima_mosaic(maxima: np.ndarray, max_cells: int, norm) -> tuple[np.ndarray, int, int]:
    """_layers_mosaic from block maxima (L, H, P, P), -inf where a block is all future keys.

    P is layers_panel_cells', the panels' own size: then every pixel is the block maximum the whole map
    gives. Were the panels smaller (another layout), the maxima are pooled again (a block of blocks).
    """
    num_layers, num_heads, cells = maxima.shape[:3]
    panel_size = min(cells, max_cells)
    gap = _panel_gap(panel_size)
    step = panel_size + gap
    mosaic = np.full((num_layers * step - gap, num_heads * step - gap, 4), 255, dtype=np.uint8)
    for layer in range(num_layers):
        for head in range(num_heads):
            weights = _panel_maximum(maxima[layer, head], None, panel_size)
            top, left = layer * step, head * step
            mosaic[top : top + panel_size, left : left + panel_size] = attention_colors(weights, norm)
    return mosaic, panel_size, step


def write_rollout(
    layer_runs: list[AttentionRun], rollout: np.ndarray, out_dir: Path, fmt: str = "png", seed: int | None = None
) -> Path:
    """Write rollout.<fmt>: the rollout (N, N) of these layers' runs, with the tokens on both axes."""
    check_format(fmt)
    return save_figure(rollout_figure(layer_runs, rollout, seed), out_dir, f"rollout.{fmt}")


def rollout_figure(layer_runs: list[AttentionRun], rollout: np.ndarray, seed: int | None = None):
    """The Figure of write_rollout, laid out and ready to save."""
    run = layer_runs[0]
    num_tokens = rollout.shape[0]
    figure = new_figure(head_figure_size(num_tokens, num_tokens))
    ax = figure.add_subplot()
    shown = masked_attention(rollout, run.causal)  # (N, N); causal rollout is lower-triangular too
    image = draw_attention(ax, shown)
    values_in_cells = cell_values(ax, num_tokens, num_tokens)
    if values_in_cells is not None:
        update_cell_values(values_in_cells, shown, image)
    short = num_tokens <= MAX_ANNOTATED_TOKENS
    label_tokens(ax, run.shown_tokens[0], run.shown_tokens[0], MAX_TICK_LABELS, fontsize=10 if short else 7)
    ax.set_xlabel("input token (key)")
    ax.set_ylabel("token after the last layer (query)")
    scope = [f"attention rollout through {counted(len(layer_runs), 'layer')}", "heads averaged"]
    line_chars = chars_across(figure.get_figwidth())
    title = run_title(run, scope, seed=seed, notes=_causal_notes(run), line_chars=line_chars)
    ax.set_title(title, parse_math=False)
    colorbar = attention_colorbar(figure, image, "share of the input token", ax=ax)
    freeze_layout(figure)
    colorbar.set_label(scale_label("share of the input token", image.norm, show_attention(image, shown)))
    return figure


def write_js_distance(
    distances: np.ndarray, run: AttentionRun, texts: list[str], out_dir: Path, fmt: str = "png", seed: int | None = None
) -> Path:
    """Write js_distance.<fmt>: for each layer, the (H, H) Jensen-Shannon distances of its heads.

    run is any run of the texts, for the model and the setup in the title. One image like
    layers.png: the layers' panels pasted into a grid with a band above each panel for its
    title, head numbers along the outer edges only. A panel with more heads than pixels shows
    the largest distance of each block of head pairs.
    """
    check_format(fmt)
    name = f"js_distance.{fmt}"
    return save_figure(js_distance_figure(distances, run, texts, name, seed), out_dir, name)


def js_distance_figure(
    distances: np.ndarray, run: AttentionRun, texts: list[str], name: str = "js_distance.png", seed: int | None = None
):
    """The Figure of write_js_distance, laid out and ready to save; name is for the size cap's note."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    num_layers, num_heads = distances.shape[:2]
    num_rows, num_columns = grid_shape(num_layers)
    mosaic, band, step_x, step_y = _js_mosaic(distances, num_heads)
    panel = 2.2 if num_heads <= 16 else 3.0
    # Inches: the image, plus room for the colorbar and labels beside it and the title above.
    size = (num_columns * panel * step_x / num_heads + 2.4, num_rows * panel * step_y / num_heads + 1.0)
    figure = new_figure(say_capped(name, size))
    ax = figure.add_subplot()
    image = ax.imshow(mosaic, aspect="equal", interpolation="nearest")
    _label_js_panels(ax, num_layers, num_heads, num_heads)  # the labels' room, for the layout
    ax.tick_params(length=2)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("head")
    ax.set_ylabel("head")
    scale = ScalarMappable(Normalize(0.0, 1.0), attention_colormap())
    what = "JS distance (0 same rows, 1 disjoint)"
    colorbar = figure.colorbar(scale, ax=ax, shrink=0.7, label=what)
    scope = [
        f"{counted(num_layers, 'layer')} × {counted(num_heads, 'head')}",
        "Jensen-Shannon distance between the heads of each layer",
    ]
    text, about = (texts[0], None) if len(texts) == 1 else (None, f"averaged over {len(texts)} texts")
    setup = {**run_setup(run), "text": text, "kv_text": None}
    notes = [*_causal_notes(run), *([WORDS_NOTE] if run.words is not None else [])]  # stats --words: rows over words
    title = figure_title(
        run.model, scope, about=about, seed=seed, notes=notes, line_chars=chars_across(figure.get_figwidth()), **setup
    )
    figure.suptitle(title, parse_math=False)
    freeze_layout(figure)

    box = ax.get_window_extent()  # pixels; aspect "equal" scales both axes alike
    pixels_per_cell = min(box.width / mosaic.shape[1], box.height / mosaic.shape[0])
    if pixels_per_cell < 1:  # fewer pixels than heads: the largest distance of each block of pairs
        cells = max(1, int(num_heads * pixels_per_cell))
        mosaic, *_ = _js_mosaic(distances, cells)
        image.set_data(mosaic)
        image.set_extent((-0.5, mosaic.shape[1] - 0.5, mosaic.shape[0] - 0.5, -0.5))
        ax.set_xlim(-0.5, mosaic.shape[1] - 0.5)
        ax.set_ylim(mosaic.shape[0] - 0.5, -0.5)
        _label_js_panels(ax, num_layers, num_heads, cells)
        block = math.ceil(num_heads / cells)
        colorbar.set_label(f"JS distance (max of ≤{block}×{block} head pairs)")
    return figure


def _js_layout(cells: int) -> tuple[int, int]:
    """(band above each panel for its title, gap between columns of panels), in cells of a panel of cells a side."""
    return max(1, math.ceil(0.3 * cells)), max(1, round(0.12 * cells))


def _js_mosaic(distances: np.ndarray, cells: int) -> tuple[np.ndarray, int, int, int]:
    """Every layer's (H, H) distances, cut into cells x cells blocks (block_maximum), coloured and pasted
    into one RGBA image; returns it, the band above each panel and the steps across and down."""
    from matplotlib.colors import Normalize

    num_layers, num_heads = distances.shape[:2]
    num_rows, num_columns = grid_shape(num_layers)
    band, gap = _js_layout(cells)
    step_x, step_y = cells + gap, band + cells
    mosaic = np.full((num_rows * step_y, num_columns * step_x - gap, 4), 255, dtype=np.uint8)
    for layer in range(num_layers):
        top, left = (layer // num_columns) * step_y + band, (layer % num_columns) * step_x
        shown = block_maximum(np.ma.masked_array(distances[layer]), cells, cells)
        mosaic[top : top + cells, left : left + cells] = attention_colors(shown, Normalize(0.0, 1.0))
    return mosaic, band, step_x, step_y


def _label_js_panels(ax, num_layers: int, num_heads: int, cells: int) -> None:
    """ "layer L" above each panel, head numbers along the outer edges; panels of cells a side."""
    num_rows, num_columns = grid_shape(num_layers)
    band, gap = _js_layout(cells)
    step_x, step_y = cells + gap, band + cells
    for text in list(ax.texts):
        text.remove()
    for layer in range(num_layers):
        centre = (layer % num_columns) * step_x + (cells - 1) / 2
        bottom_of_band = (layer // num_columns) * step_y + band - 0.7 * cells / num_heads
        ax.text(centre, bottom_of_band, f"layer {layer}", ha="center", va="bottom", fontsize=9)
    heads = tick_positions(num_heads, 6)
    head_labels = [str(h) for h in heads]
    at = [(h + 0.5) * cells / num_heads - 0.5 for h in heads]  # head h's place in a panel of cells
    ax.set_xticks([column * step_x + x for column in range(num_columns) for x in at], head_labels * num_columns, fontsize=7)
    ax.set_yticks([row * step_y + band + y for row in range(num_rows) for y in at], head_labels * num_rows, fontsize=7)


def _causal_notes(run: AttentionRun) -> list[str]:
    """With --causal, what it means over every layer: the titles explain their "causal" with it (a decoder's is its own)."""
    return [CAUSAL_OVER_BIDIRECTIONAL] if run.causal and not run.model_causal else []

"""How every attention figure colours its cells and how big it may be.

- One scale: linear 0..1 up to MAX_LINEAR_SCALE_KEYS keys; beyond, a log scale from
  LOG_SCALE_MIN to 1, because a long text spreads its rows so that most weights lie near 1/N.
- No blended colours: cells are drawn without interpolation, and a map with more cells than
  its axes have pixels is cut into blocks, each shown as its largest value (block_maximum), so
  every pixel is the colour of one value on the scale. The colour bar says when either applies.
- A size cap: no figure is wider or taller than MAX_IMAGE_SIDE_PX at DPI; say_capped tells
  stderr when one had to shrink.
"""

from __future__ import annotations

import math
import sys

import numpy as np

COLORMAP = "viridis"
MASKED_COLOR = "#d0d0d0"  # causal-masked cells: neutral grey, outside the colormap
DPI = 120
MAX_IMAGE_SIDE_PX = 4096  # every figure's width and height at DPI; a bigger one shrinks to fit
MAX_LINEAR_SCALE_KEYS = 64  # maps with more keys are coloured on a log scale, which shows weights near 1/N
LOG_SCALE_MIN = 1e-3  # the bottom of that log scale: smaller weights take its darkest colour
BLOCK_MAXIMUM_CELLS = 2**22  # cells block_maximum copies at once (16 MB in float32), not a long map's every cell


def attention_norm(num_keys: int):
    """The colour scale of a map with num_keys keys: linear 0..1, or log from LOG_SCALE_MIN to 1 for a long map.

    A long text spreads a row over many keys, so most weights lie near 1/N (0.003 at 340 tokens)
    and a linear scale shows them all as its darkest colour.
    """
    from matplotlib.colors import LogNorm, Normalize

    return LogNorm(LOG_SCALE_MIN, 1.0) if num_keys > MAX_LINEAR_SCALE_KEYS else Normalize(0.0, 1.0)


def is_log_scale(norm) -> bool:
    from matplotlib.colors import LogNorm

    return isinstance(norm, LogNorm)


def attention_colormap():
    """COLORMAP with masked cells in MASKED_COLOR."""
    import matplotlib

    return matplotlib.colormaps[COLORMAP].with_extremes(bad=MASKED_COLOR)


def draw_attention(ax, weights: np.ma.MaskedArray, norm=None):
    """imshow of weights (Nq, Nk) on norm (default attention_norm), cells drawn without interpolation.

    Masked cells take MASKED_COLOR. The map is fitted to the axes as they are now: once the
    layout is frozen, call show_attention again to fit it to the final axes.
    """
    image = attention_image(ax, *weights.shape, norm)
    show_attention(image, weights)
    return image


def attention_image(ax, num_queries: int, num_keys: int, norm=None):
    """draw_attention's image of a (Nq, Nk) map, its extent set but nothing shown yet: a figure laid out with it
    lays out as with the map (the layout knows the axes, not their pixels), and show_attention fills it after."""
    norm = norm if norm is not None else attention_norm(num_keys)
    image = ax.imshow(np.ma.masked_all((1, 1)), cmap=attention_colormap(), norm=norm, aspect="auto", interpolation="nearest")
    image.set_extent((-0.5, num_keys - 0.5, num_queries - 0.5, -0.5))
    return image


def attention_pool(image, num_queries: int, num_keys: int) -> tuple[int, int, int]:
    """(rows, columns, block size) show_attention shows a (Nq, Nk) map as in image's axes as laid out now: a pixel a
    block of cells; block size 1 when every cell has its own pixels, else the most cells a block spans along an axis."""
    box = image.axes.get_window_extent()  # pixels, as laid out now
    pool = max(1, math.ceil(num_queries / max(1, int(box.height))), math.ceil(num_keys / max(1, int(box.width))))
    rows, columns = math.ceil(num_queries / pool), math.ceil(num_keys / pool)
    return rows, columns, max(math.ceil(num_queries / rows), math.ceil(num_keys / columns))


def show_attention(image, weights: np.ma.MaskedArray) -> int:
    """Put weights (Nq, Nk) into image so that every pixel of its axes shows the colour of one value.

    When the axes have fewer pixels than the map has cells, each pixel shows the maximum of the
    block of cells it covers (a one-hot row stays 1, never a blend of 1 and its neighbours).
    Axis coordinates stay token indices. Returns the block size (attention_pool).
    """
    num_queries, num_keys = weights.shape
    rows, columns, pool = attention_pool(image, num_queries, num_keys)
    shown = block_maximum(weights, rows, columns)
    if is_log_scale(image.norm):  # a log scale has no 0: its darkest colour, not the masked grey
        shown = np.ma.clip(shown, LOG_SCALE_MIN, None)  # as attention_colors does
    image.set_data(shown)
    image.set_extent((-0.5, num_keys - 0.5, num_queries - 0.5, -0.5))
    return pool


def block_maximum(weights: np.ma.MaskedArray, num_rows: int, num_columns: int) -> np.ma.MaskedArray:
    """(num_rows, num_columns): the maximum of each block of a (Nq, Nk) map cut into that many near-equal blocks.

    A block is masked only when all its cells are; a map no bigger than the blocks comes back as it is.
    """
    weights = np.ma.asarray(weights)
    if weights.shape == (num_rows, num_columns):
        return weights
    size_rows, size_columns = weights.shape
    row_starts, column_starts = (
        (np.arange(blocks) * size + blocks - 1) // blocks for blocks, size in ((num_rows, size_rows), (num_columns, size_columns))
    )  # ceil(b * size / blocks): the first cell of block b
    row_ends = np.append(row_starts[1:], size_rows)
    shown = np.empty((num_rows, num_columns))
    mask = np.ma.getmask(weights)
    per_chunk = max(1, BLOCK_MAXIMUM_CELLS // max(1, size_columns * math.ceil(size_rows / num_rows)))  # blocks of rows at once
    for first in range(0, num_rows, per_chunk):  # a few rows at a time: a copy of a long map's every cell is not made
        last = min(first + per_chunk, num_rows)
        band = slice(row_starts[first], row_ends[last - 1])
        rows = weights.data[band]  # a view
        shown_cells = np.ones((len(rows), 1), bool) if mask is np.ma.nomask else ~mask[band]  # the cells that may win
        # The blocks of rows first, each a few whole rows compared element by element, then the blocks of columns of
        # what is left: a block's cells in rows of their own, not the reduction along each row that costs most.
        # Masked cells never win (-inf where all of a block's column is masked); a maximum is exact in any float.
        offsets = [*(row_starts[first:last] - row_starts[first]), len(rows)]
        blocks = np.stack([rows[a:b].max(axis=0, where=shown_cells[a:b], initial=-np.inf) for a, b in zip(offsets, offsets[1:])])  # (blocks, Nk)
        shown[first:last] = np.maximum.reduceat(blocks, column_starts, axis=1)
    return np.ma.masked_invalid(np.where(np.isneginf(shown), np.nan, shown))


def attention_colors(weights: np.ma.MaskedArray, norm) -> np.ndarray:
    """(..., 4) uint8 RGBA of weights on norm, as draw_attention colours them (masked cells MASKED_COLOR)."""
    if is_log_scale(norm):
        weights = np.ma.clip(weights, LOG_SCALE_MIN, None)
    return attention_colormap()(norm(weights), bytes=True)


def scale_label(what: str, norm, pool: int = 1) -> str:
    """A colour bar's label: what it shows, its scale when log, and the block maximum when cells were pooled."""
    notes = (["log scale"] if is_log_scale(norm) else []) + (
        [f"max of ≤{pool}×{pool} cells"] if pool > 1 else []
    )
    return f"{what} ({'; '.join(notes)})" if notes else what


def attention_colorbar(figure, mappable, what: str = "attention weight", pool: int = 1, **options):
    """figure.colorbar for attention maps: a log scale marks with a triangle that smaller weights share its bottom colour."""
    extend = "min" if is_log_scale(mappable.norm) else "neither"
    return figure.colorbar(mappable, label=scale_label(what, mappable.norm, pool), extend=extend, **options)


def capped_size(size: tuple[float, float]) -> tuple[float, float]:
    """A figure size in inches, shrunk evenly where needed so that neither side passes MAX_IMAGE_SIDE_PX at DPI."""
    scale = min(1.0, MAX_IMAGE_SIDE_PX / (max(size) * DPI))
    return size[0] * scale, size[1] * scale


def capped_note(name: str, size: tuple[float, float]) -> str | None:
    """The note that name, of natural size (inches), was shrunk to the cap; None when it fits."""
    if capped_size(size) == size:
        return None
    width, height = (round(side * DPI) for side in size)
    shown = "×".join(str(round(side * DPI)) for side in capped_size(size))
    return f"{name} is drawn at {shown} px, within the {MAX_IMAGE_SIDE_PX} px cap (it would be {width}×{height} px)"


def say_capped(name: str, size: tuple[float, float]) -> tuple[float, float]:
    """capped_size, with capped_note on stderr when the figure shrank."""
    note = capped_note(name, size)
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    return capped_size(size)

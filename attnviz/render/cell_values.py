"""The values printed in a short map's or grid's cells: "0.42" (cell_text, every figure's), in black or white,
whichever contrasts with the cell."""

from __future__ import annotations

import functools

import numpy as np

MAX_ANNOTATED_TOKENS = 20  # print the weight in each cell when both axes are this short


def cell_values(ax, num_queries: int, num_keys: int):
    """An empty collection for the weights printed in the cells, or None when the map is too big.

    The values are glyph outlines in one PathCollection: one draw call per head instead of
    Nq * Nk Text artists, which are most of the time of a 20-token figure (bench/RESULTS.md).
    """
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Affine2D

    if max(num_queries, num_keys) > MAX_ANNOTATED_TOKENS:
        return None
    query_index, key_index = np.mgrid[0:num_queries, 0:num_keys]  # (Nq, Nk) each
    centres = np.column_stack([key_index.ravel(), query_index.ravel()])  # (Nq*Nk, 2) as (x, y)
    points_to_pixels = Affine2D().scale(1 / 72) + ax.figure.dpi_scale_trans
    collection = PathCollection(
        [],
        offsets=centres,
        offset_transform=ax.transData,
        transform=points_to_pixels,
        edgecolors="none",
    )
    ax.add_collection(collection, autolim=False)
    return collection


def cell_text(value: float, decimals: int = 2) -> str:
    """A value as a cell shows it: "0.42", "-0.17"; one that rounds to zero is "0.00", never "-0.00"."""
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def update_cell_values(collection, weights: np.ma.MaskedArray, image) -> None:
    """Each cell's weight as cell_text writes it, in black or white, whichever contrasts with the cell."""
    rgba = image.to_rgba(weights.filled(0.0))  # (Nq, Nk, 4)
    luminance = rgba[..., :3] @ np.array([0.2126, 0.7152, 0.0722])  # (Nq, Nk)
    texts = np.vectorize(cell_text, otypes=[object])(weights.data)
    labels = np.where(np.ma.getmaskarray(weights), "", texts)
    collection.set_paths([_centred_text_path(label) for label in labels.ravel()])
    light = (luminance > 0.5).ravel()[:, None]  # (Nq*Nk, 1)
    collection.set_facecolor(np.where(light, (0, 0, 0, 1), (1, 1, 1, 1)))


@functools.cache
def _centred_text_path(label: str):
    """Outline of label in 8 pt DejaVu Sans, in points, centred on (0, 0); "" draws nothing."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.path import Path as GlyphPath
    from matplotlib.textpath import TextPath, text_to_path

    if not label:
        return GlyphPath(np.empty((0, 2)))
    font = FontProperties(family="DejaVu Sans", size=8)
    # From the font's metrics: Path.get_extents on glyph curves is 100x slower.
    width, height, descent = text_to_path.get_text_width_height_descent(label, font, ismath=False)
    return TextPath((-width / 2, descent - height / 2), label, prop=font)

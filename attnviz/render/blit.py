"""A figure rendered ahead but for the artists that change, then written with only those drawn on its pixels.

For figures laid out before their numbers exist (heads_ahead.py, position_figure.py, compare_figures.py): most of a
figure's drawing is its token labels, titles and colour bars, which the numbers do not change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class RenderedAhead:
    """A figure laid out and frozen (self.figure: heatmap.freeze_layout, opaque, at scales.DPI) whose unchanging parts
    may be rendered ahead; changing() names the rest."""

    figure = None
    background = None  # the pixels of all but changing(), once render_ahead has run

    def changing(self) -> list:
        """The artists that change between rendering ahead and writing, in a whole draw's order."""
        raise NotImplementedError

    def render_ahead(self) -> None:
        """Render all but changing() and keep its pixels: write_png then draws only changing() on them."""
        self.background = render_without(self.figure, self.changing())

    def write_png(self, path: Path) -> Path:
        """The figure (its layout frozen) as a PNG: on the pixels rendered ahead, if any, else drawn whole (the same
        pixels)."""
        from attnviz.render.png import write_canvas_png

        if self.background is None:
            return write_canvas_png(self.figure, path)
        return write_drawn_on(self.figure, self.background, self.changing(), path)


def render_without(figure, changing: list):
    """Render figure with the changing artists hidden; return its pixels (for canvas.restore_region)."""
    for artist in changing:
        artist.set_visible(False)
    figure.canvas.draw()
    for artist in changing:
        artist.set_visible(True)
    return figure.canvas.copy_from_bbox(figure.bbox)


def write_drawn_on(figure, background, changing: list, path: Path) -> Path:
    """A PNG of figure: the changing artists drawn, in their order, on the background render_without kept; the same
    pixels as the whole figure drawn where the order is a whole draw's (maps before the frames drawn over them)."""
    from attnviz.render.png import write_png
    from attnviz.render.scales import DPI

    figure.canvas.restore_region(background)
    for artist in changing:
        figure.draw_artist(artist)
    return write_png(path, np.asarray(figure.canvas.buffer_rgba()), DPI)

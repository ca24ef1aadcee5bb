"""An attention map's pixels written straight into its figure's Agg buffer, as matplotlib would draw them.

Drawing a heatmap's AxesImage is most of a head's drawing time (matplotlib resamples the map to the
axes' pixels on every draw), although the map's cells land on the same pixels for every head of
a figure whose layout is frozen. CellPixels asks matplotlib once where each cell lands: it draws
the map with each cell's (row, column) written in its colour, twice (the code, then its
complement), and reads the pixels back. Each later head is then one NumPy gather of its cells'
colours into the buffer (the times: bench/RESULTS.md), and the same bytes as matplotlib's own drawing, because the
colours are the image's own colormap and norm applied to the same values (see colors()).

Used only where that holds exactly: a map with at least MIN_CELL_PIXELS pixels per cell, which
matplotlib colours after resampling the data ("data" interpolation stage, nearest neighbour);
a finer map is resampled as colours (rounded differently), and is drawn by matplotlib.
"""

from __future__ import annotations

import numpy as np

# matplotlib resamples data (then colours it) from 3 pixels per cell on; a margin above that.
MIN_CELL_PIXELS = 4


class CellPixels:
    """Which cell of an image each pixel of its canvas shows; learn() makes one, paint() writes a head's colours."""

    def __init__(self, image, top: int, left: int, cells: np.ndarray):
        self.image = image
        self.top, self.left = top, left  # the painted rectangle's top-left corner in the buffer (row, column)
        self.cells = cells  # (h, w): the cell shown at each pixel of the rectangle, as row * columns + column

    @classmethod
    def learn(cls, image) -> CellPixels | None:
        """Where image's cells land on its canvas, as laid out now; None when painting would not match matplotlib.

        Call with the layout frozen, the canvas drawn once (a renderer to draw with) and the
        image's data of its final shape set; the image's pixels on the canvas are drawn over.
        """
        shown = image.get_array()  # (rows, columns), pooled
        if shown is None or shown.ndim != 2 or image.get_interpolation() != "nearest":
            return None
        if image.get_alpha() is not None or image.get_interpolation_stage() not in ("auto", "antialiased", "data"):
            return None
        num_rows, num_columns = shown.shape
        box = image.axes.get_window_extent()
        if min(box.width / num_columns, box.height / num_rows) < MIN_CELL_PIXELS or max(shown.shape) >= 4096:
            return None
        if not np.little_endian:  # the 32-bit words below
            return None
        row, column = np.mgrid[0:num_rows, 0:num_columns]  # (rows, columns) each
        code = np.empty((num_rows, num_columns, 4), dtype=np.uint8)
        code[..., 0] = column & 255
        code[..., 1] = row & 255
        code[..., 2] = (column >> 8) | ((row >> 8) << 4)  # 4 high bits of each: sides below 4096
        code[..., 3] = 255
        complement = code.copy()
        complement[..., :3] = 255 - code[..., :3]
        # Only the axes' pixels, and a margin, are read back: a grid has a dozen maps on a big canvas.
        height, width = np.asarray(image.figure.canvas.buffer_rgba()).shape[:2]
        region = (
            slice(max(0, int(height - box.y1) - 2), min(height, int(height - box.y0) + 3)),  # rows: y grows upwards
            slice(max(0, int(box.x0) - 2), min(width, int(box.x1) + 3)),
        )
        first, second = (_drawn_alone(image, pixels, region) for pixels in (code, complement))
        image.set_data(shown)
        # A pixel showing one cell holds the code in one drawing and its complement in the other; the
        # background holds the same bytes in both, a blended edge neither. As 32-bit RGBA words
        # (little-endian: red in the low byte), the two differ in exactly the red, green and blue bits.
        first, second = (pixels.view(np.uint32)[..., 0] for pixels in (first, second))  # (h, w) each
        covered = (first ^ second) == 0x00FFFFFF  # (h, w) of the region
        ys, xs = np.nonzero(covered)
        if ys.size == 0:
            return None
        top, bottom, left, right = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        if top == 0 or left == 0 or bottom == covered.shape[0] or right == covered.shape[1]:
            return None  # at the region's edge: it may reach past it
        if ys.size != (bottom - top) * (right - left):  # not one whole rectangle: leave it to matplotlib
            return None
        block = first[top:bottom, left:right]
        columns = (block & 0xFF) | (((block >> 16) & 0xF) << 8)  # red, then the low half of blue
        rows = ((block >> 8) & 0xFF) | (((block >> 20) & 0xF) << 8)  # green, then the high half of blue
        if columns.max() >= num_columns or rows.max() >= num_rows:
            return None
        cells = (rows * num_columns + columns).astype(np.intp)
        return cls(image, int(top + region[0].start), int(left + region[1].start), cells)

    def colors(self) -> np.ndarray:
        """(rows, columns, 4) uint8: the image's data coloured as matplotlib colours it after resampling (norm, then colormap)."""
        return self.image.to_rgba(self.image.get_array(), bytes=True)

    def paint(self, buffer: np.ndarray) -> None:
        """Write the image's current data into buffer ((H, W, 4) uint8, the canvas' RGBA): what drawing it would write."""
        height, width = self.cells.shape
        colors = np.ascontiguousarray(self.colors()).view(np.uint32).reshape(-1)  # a pixel as one word: a quarter of the gathers
        words = buffer.view(np.uint32)[..., 0]  # (H, W)
        words[self.top : self.top + height, self.left : self.left + width] = colors[self.cells]


def _drawn_alone(image, pixels: np.ndarray, region: tuple[slice, slice]) -> np.ndarray:
    """The canvas' pixels in region ((h, w, 4)) after drawing image alone, showing pixels ((rows, columns, 4) uint8)."""
    image.set_data(pixels)
    image.axes.draw_artist(image)
    return np.array(np.asarray(image.figure.canvas.buffer_rgba())[region])

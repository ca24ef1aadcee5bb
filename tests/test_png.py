"""attnviz.render.png writes the pixels it is given: Pillow, an independent decoder, reads back the same RGB."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from attnviz.render.png import png_bytes, write_png


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (37, 61), (300, 200)])
def test_pillow_reads_back_the_same_pixels(tmp_path, shape):
    rng = np.random.default_rng(sum(shape))
    rgba = rng.integers(0, 256, size=(*shape, 4), dtype=np.uint8)  # noise: every byte difference, wrap-around included
    rgba[..., 3] = 255
    path = write_png(tmp_path / "noise.png", rgba, dpi=120)
    with Image.open(path) as image:
        assert image.mode == "RGB" and image.size == (shape[1], shape[0])
        np.testing.assert_array_equal(np.asarray(image), rgba[..., :3])


def test_the_resolution_is_written(tmp_path):
    rgba = np.full((4, 5, 4), 255, dtype=np.uint8)
    with Image.open(write_png(tmp_path / "white.png", rgba, dpi=120)) as image:
        assert image.info["dpi"] == pytest.approx((120, 120), abs=0.02)  # pixels per metre, rounded


def test_a_strided_buffer_is_read_row_by_row():
    """A view such as canvas.buffer_rgba()[..., :3] of a wider array gives the same file as a copy of it."""
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 256, size=(20, 30, 4), dtype=np.uint8)
    view = wide[:, 5:25]
    assert png_bytes(view, 100) == png_bytes(np.ascontiguousarray(view), 100)


def test_a_canvas_png_equals_savefig(tmp_path):
    """write_canvas_png: the pixels of savefig's PNG of the same figure, without the alpha channel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from attnviz.render.png import write_canvas_png

    figure = Figure(figsize=(3, 2), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    ax.imshow(np.arange(12.0).reshape(3, 4), interpolation="nearest")
    ax.set_title("0.42 head 3")
    figure.savefig(tmp_path / "savefig.png", dpi=100)
    write_canvas_png(figure, tmp_path / "canvas.png")
    with Image.open(tmp_path / "savefig.png") as saved, Image.open(tmp_path / "canvas.png") as written:
        np.testing.assert_array_equal(np.asarray(written), np.asarray(saved.convert("RGB")))

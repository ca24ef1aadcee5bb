"""What the figures' colours and sizes promise: every pixel of a map is a colour of its scale
(never a blend of two cells), a map with more cells than pixels shows each block's maximum and
says so, long texts get a log scale that says so, and no image passes the size cap.

Hand-made one-hot maps: their only values are 0 and 1, so the only colours a map may show are
the scale's colours at 0 and 1, the masked grey, and the white between the layers grid's panels.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_run, read_png

from attnviz.analysis.compare import Split
from attnviz.analysis.statistics import summarize_heads
from attnviz.cli import run as run_cli
from attnviz.render import heatmap
from attnviz.render import scales
from attnviz.render.heatmap import heads_grid_figure
from attnviz.render.scales import LOG_SCALE_MIN, MASKED_COLOR, block_maximum, capped_size
from attnviz.render.stats_figures import layers_figure, rollout_figure

WHITE = (255, 255, 255)


def one_hot_run(num_tokens: int, num_heads: int = 2, causal: bool = False, layer: int = 0):
    """A run whose every head attends to the previous token (query 0 to itself): weights 0 and 1 only."""
    run = make_run([f"t{i}" for i in range(num_tokens)], num_heads=num_heads, causal=causal)
    previous = np.zeros((num_tokens, num_tokens))
    previous[0, 0] = 1.0
    previous[np.arange(1, num_tokens), np.arange(num_tokens - 1)] = 1.0
    run.attention = np.repeat(previous[None], num_heads, axis=0)
    run.layer = layer
    return run


GREY = tuple(int(MASKED_COLOR[i : i + 2], 16) for i in (1, 3, 5))


def colour_at(position: float) -> tuple[int, int, int]:
    """The colormap's colour at a position 0..1 of the scale."""
    import matplotlib

    return tuple(int(c) for c in matplotlib.colormaps[scales.COLORMAP](position, bytes=True)[:3])


ONE = colour_at(1.0)  # weight 1 is the top of the linear and of the log scale


# The colours of weights 0 and 1 on either scale (0 lies below the log scale: its darkest colour), and the masked grey.
SCALE_COLOURS = {colour_at(0.0), ONE, GREY}


def map_pixels(figure, ax) -> np.ndarray:
    """(rows, columns, 3): the rendered pixels wholly inside ax, drawn without its frame and tick marks."""
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(length=0)  # a tick mark's anti-aliased end may reach into the map's edge
    figure.canvas.draw()
    rgb = np.asarray(figure.canvas.buffer_rgba())[..., :3]
    box = ax.get_window_extent()
    height = rgb.shape[0]
    top, bottom = height - int(np.floor(box.y1)), height - int(np.ceil(box.y0))
    return rgb[top:bottom, int(np.ceil(box.x0)) : int(np.floor(box.x1))]


def off_scale(pixels: np.ndarray, allowed: set) -> int:
    colours = {tuple(int(c) for c in colour) for colour in np.unique(pixels.reshape(-1, 3), axis=0)}
    return len(colours - allowed)


def attention_images(figure):
    from matplotlib.image import AxesImage

    return [artist for artist in figure.findobj(AxesImage) if artist.axes.get_visible()]


def colorbar_labels(figure) -> list[str]:
    return [ax.get_ylabel() for ax in figure.axes if ax.get_ylabel()]


@pytest.mark.parametrize("num_tokens, causal", [(30, False), (100, True), (300, False)])
def test_the_heads_grid_shows_only_colours_of_the_scale(num_tokens, causal):
    figure = heads_grid_figure(one_hot_run(num_tokens, causal=causal))
    for image in attention_images(figure):
        pixels = map_pixels(figure, image.axes)
        assert off_scale(pixels, SCALE_COLOURS) == 0
        # Every pixel row covers queries that each put 1 on a key: none may be lost between pixels.
        assert np.all(np.any(np.all(pixels == ONE, axis=-1), axis=1))


@pytest.mark.slow
def test_a_single_heads_figure_shows_only_colours_of_the_scale():
    figure = heatmap.head_figure(one_hot_run(30), 0)
    assert off_scale(map_pixels(figure, figure.axes[0]), SCALE_COLOURS) == 0


@pytest.mark.slow
@pytest.mark.parametrize("num_tokens", [40, 400])
def test_the_layers_grid_shows_a_one_hot_head_at_1_at_any_length(num_tokens):
    """A previous-token head is 1 on its diagonal: pooled down, each block is its largest weight, never a mean."""
    runs = [one_hot_run(num_tokens, num_heads=3, layer=layer) for layer in range(2)]
    figure = layers_figure(runs)
    (image,) = attention_images(figure)
    norm = scales.attention_norm(num_tokens)
    pixels = map_pixels(figure, image.axes)
    assert off_scale(pixels, SCALE_COLOURS | {WHITE}) == 0
    assert np.all(pixels == ONE, axis=-1).any(axis=1).mean() > 0.85  # all rows but the gaps between the layers
    (label,) = colorbar_labels(figure)
    if num_tokens > scales.MAX_LINEAR_SCALE_KEYS:
        assert "log scale" in label and "max of ≤" in label, label
    else:
        assert label == "attention weight"


@pytest.mark.slow
def test_the_rollout_shows_only_colours_of_the_scale():
    run = one_hot_run(100)
    figure = rollout_figure([run], run.attention[0])
    (image,) = attention_images(figure)
    assert off_scale(map_pixels(figure, image.axes), SCALE_COLOURS) == 0
    assert any("log scale" in label for label in colorbar_labels(figure))


def test_js_distances_of_more_heads_than_pixels_show_each_blocks_largest_distance():
    from attnviz.render.stats_figures import js_distance_figure

    num_heads = 400  # a 3-inch panel has 360 pixels
    distances = np.eye(num_heads)[None]  # (1, H, H): one layer, 1 only on the diagonal
    figure = js_distance_figure(distances, one_hot_run(4), ["text"])
    (image,) = attention_images(figure)
    for text in image.axes.texts:  # "layer 0" above the panel, inside the axes
        text.set_visible(False)
    pixels = map_pixels(figure, image.axes)
    assert off_scale(pixels, SCALE_COLOURS | {WHITE}) == 0
    panel_rows = pixels[~np.all(pixels == WHITE, axis=(1, 2))]  # the band above the panel is white
    # No row of the diagonal lost (but the corner pixels, which the panel's fractional edges may cut).
    assert np.all(np.any(np.all(panel_rows[1:-1] == ONE, axis=-1), axis=1))
    assert any("max of ≤2×2 head pairs" in label for label in colorbar_labels(figure))


def test_compare_panels_show_only_colours_of_the_scale():
    from attnviz.render.compare_figures import comparison_figure

    run = one_hot_run(80, num_heads=4)
    figure = comparison_figure([Split("pretrained", run, summarize_heads(run.attention), 4)])
    for image in attention_images(figure):
        assert off_scale(map_pixels(figure, image.axes), SCALE_COLOURS) == 0


def test_block_maximum_keeps_the_largest_weight_of_each_block_and_masks_only_all_masked_blocks():
    weights = np.ma.masked_array(np.arange(35.0).reshape(5, 7), mask=np.zeros((5, 7), dtype=bool))
    weights.mask[:3, 4:] = True
    pooled = block_maximum(weights, 2, 3)  # rows 0-2 | 3-4, columns 0-2 | 3-4 | 5-6
    expected = np.array([[16, 17, -1], [30, 32, 34]], dtype=float)  # the top-right block is all masked
    assert pooled.mask.tolist() == [[False, False, True], [False, False, False]]
    np.testing.assert_array_equal(pooled.filled(-1), expected)


@pytest.mark.parametrize("cells", [1, 50, 2**22])
def test_block_maximum_a_few_rows_at_a_time_is_each_blocks_maximum(cells, monkeypatch):
    monkeypatch.setattr(scales, "BLOCK_MAXIMUM_CELLS", cells)  # every row alone, a few blocks of rows, all at once
    rng = np.random.default_rng(0)
    weights = np.ma.masked_array(rng.random((203, 157)), mask=np.triu(np.ones((203, 157), dtype=bool), 1))
    pooled = block_maximum(weights, 41, 30)
    row_starts, column_starts = ((np.arange(n) * size + n - 1) // n for n, size in ((41, 203), (30, 157)))
    row_ends, column_ends = np.append(row_starts[1:], 203), np.append(column_starts[1:], 157)
    for i, (r0, r1) in enumerate(zip(row_starts, row_ends)):
        for j, (c0, c1) in enumerate(zip(column_starts, column_ends)):
            block = weights[r0:r1, c0:c1]
            assert pooled.mask[i, j] == block.mask.all()
            if not block.mask.all():
                assert pooled[i, j] == block.max()


def test_long_maps_are_on_a_log_scale_and_short_ones_on_a_linear_one():
    short, long = scales.attention_norm(scales.MAX_LINEAR_SCALE_KEYS), scales.attention_norm(300)
    assert not scales.is_log_scale(short) and (short.vmin, short.vmax) == (0.0, 1.0)
    assert scales.is_log_scale(long) and (long.vmin, long.vmax) == (LOG_SCALE_MIN, 1.0)


# --- the size cap ---------------------------------------------------------------------------------


def test_capped_size_keeps_the_aspect_and_fits_the_cap():
    assert capped_size((10.0, 5.0)) == (10.0, 5.0)
    width, height = capped_size((400.0, 100.0))
    assert round(width * scales.DPI) == scales.MAX_IMAGE_SIDE_PX and width / height == pytest.approx(4.0)


def test_many_heads_make_a_near_square_grid():
    assert heatmap.grid_shape(384) == (20, 20)
    assert heatmap.grid_shape(12) == (3, 4)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["heads", "layers"])
def test_a_run_past_the_cap_writes_images_within_it_and_says_so(command, tmp_path, monkeypatch, capsys):
    cap = 700  # heads.png and layers.png are about 1,800 px wide at their natural size
    monkeypatch.setattr(scales, "MAX_IMAGE_SIDE_PX", cap)
    text = "The animal didn't cross the street because it was too tired."
    assert run_cli([command, text, "--model", "bundled", "--out", str(tmp_path)]) == 0
    name = {"heads": "heads.png", "layers": "layers.png"}[command]
    for path in tmp_path.glob("*.png"):
        assert max(read_png(path).shape[:2]) <= cap, path.name
    error = capsys.readouterr().err
    assert f"note: {name} is drawn at" in error and f"within the {cap} px cap" in error, error
    if command == "heads":
        assert json.loads((tmp_path / "attention.json").read_text(encoding="utf-8"))["num_heads"] == 12

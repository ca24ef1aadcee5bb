"""`heads --window Q0:Q1,K0:K1`: one region of a long map at full resolution, its tokens and real indices on the axes.

The drawn image is the map's region itself (not block maxima), read back from the AxesImage and from the PNG's
pixels; bad windows are refused in one line, exit code 2, before anything is written.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_run, read_png

import attnviz
from attnviz.cli import run as cli
from attnviz.errors import AttnvizError
from attnviz.render.window_figures import MAX_WINDOW_TOKENS, WindowFigure, window_figure, window_of, write_window_figures

NUM_TOKENS = 300  # past scales.MAX_LINEAR_SCALE_KEYS: the log scale of a long map
TOKENS = ["[CLS]", *(f"w{index}" for index in range(NUM_TOKENS - 2)), "[SEP]"]


@pytest.fixture(scope="module")
def long_run():
    return make_run(TOKENS, num_heads=3, causal=True, seed=4)


def drawn_image(figure):
    (image,) = figure.axes[0].images
    return image


def expected_region(run, head: int, queries: range, keys: range) -> np.ma.MaskedArray:
    """The map's cells one by one, future keys masked (key index above query index): written apart from the code."""
    values = np.array([[run.attention[head][q][k] for k in keys] for q in queries])
    mask = np.array([[k > q for k in keys] for q in queries])
    return np.ma.masked_array(values, mask=mask)


@pytest.mark.parametrize("head, given", [(1, "150:182,10:74"), (2, (slice(0, 5), slice(290, 300))), (0, "280:,:40")])
def test_the_drawn_image_is_the_maps_region_cell_for_cell(long_run, head, given):
    window = window_of(given, NUM_TOKENS, NUM_TOKENS)
    queries, keys = range(window.query_start, window.query_stop), range(window.key_start, window.key_stop)
    image = drawn_image(window_figure(long_run, head, window))
    drawn, expected = image.get_array(), expected_region(long_run, head, queries, keys)
    np.testing.assert_array_equal(np.ma.getmaskarray(drawn), expected.mask)
    np.testing.assert_array_equal(drawn.data[~expected.mask], expected.data[~expected.mask])  # exactly, no block maxima
    # Cell (q, k) sits at x = k, y = q: the axes count the map's own token indices.
    assert image.get_extent() == [keys[0] - 0.5, keys[-1] + 0.5, queries[-1] + 0.5, queries[0] - 0.5]


def test_the_axes_label_the_regions_tokens_with_their_indices_and_the_title_names_the_window(long_run):
    figure = window_figure(long_run, 1, window_of("150:182,10:74", NUM_TOKENS, NUM_TOKENS))
    ax = figure.axes[0]
    query_labels = [label.get_text() for label in ax.get_yticklabels()]
    assert query_labels == [f"{index} {TOKENS[index]}" for index in range(150, 182)]  # 32 rows: every one
    key_labels = [label.get_text() for label in ax.get_xticklabels()]
    assert key_labels == [f"{index} {TOKENS[index]}" for index in range(10, 74, 2)]  # 64 keys: every other one
    assert list(ax.get_yticks()) == list(range(150, 182))
    assert ax.get_ylabel() == "query 150–181" and ax.get_xlabel() == "key 10–73"
    title = ax.get_title()
    assert "head 1" in title and "window: queries 150–181 × keys 10–73" in title and "layer 0" in title


def test_a_small_window_prints_each_cells_weight_at_its_real_index(long_run):
    figure = WindowFigure(long_run, window_of("100:104,98:102", NUM_TOKENS, NUM_TOKENS))
    figure.show_head(0)
    offsets = figure.cell_values.get_offsets()
    assert sorted(map(tuple, offsets.tolist()))[0] == (98.0, 100.0) and len(offsets) == 16


def test_the_png_shows_each_cell_in_its_own_colour_at_full_resolution(long_run, tmp_path):
    """The largest window: every cell gets pixels of its own, the colour of its weight on the whole map's scale."""
    from attnviz.render.heatmap import save_figure
    from attnviz.render.scales import attention_colors, attention_norm

    window = window_of(f"0:{MAX_WINDOW_TOKENS // 2},{NUM_TOKENS - 256}:", NUM_TOKENS, NUM_TOKENS)
    drawn = WindowFigure(long_run, window)
    drawn.show_head(2)
    pixels = read_png(save_figure(drawn.figure, tmp_path, "window.png"))
    box = drawn.ax.get_window_extent()
    assert box.width >= 256 and box.height >= 256  # at least a pixel a cell: no block maxima
    height = pixels.shape[0]
    rng = np.random.default_rng(0)
    weights = long_run.attention[2]
    for query, key in [(0, 44), (255, 299), *zip(rng.integers(0, 256, 20), rng.integers(44, 300, 20))]:
        x, y = drawn.ax.transData.transform((key, query))  # the cell's centre, in pixels from the bottom left
        colour = pixels[int(height - y), int(x)]
        if key > query:
            expected = np.array([0xD0, 0xD0, 0xD0])  # masked: MASKED_COLOR
        else:
            expected = attention_colors(np.ma.masked_array([weights[query, key]]), attention_norm(NUM_TOKENS))[0, :3]
        np.testing.assert_array_equal(colour, expected, err_msg=f"cell ({query}, {key})")


@pytest.mark.slow
def test_maps_held_as_a_memory_map_or_a_torch_tensor_draw_the_same_window(long_run, tmp_path):
    import dataclasses

    import torch

    np.save(tmp_path / "attention.npy", long_run.attention.astype(np.float32))
    mapped = dataclasses.replace(long_run, attention=np.load(tmp_path / "attention.npy", mmap_mode="r"))  # read-only
    tensor = dataclasses.replace(long_run, attention=torch.from_numpy(long_run.attention.astype(np.float32)))
    window = window_of("200:230,180:220", NUM_TOKENS, NUM_TOKENS)
    expected = long_run.attention.astype(np.float32)[1, 200:230, 180:220]
    for run in (mapped, tensor):
        drawn = drawn_image(window_figure(run, 1, window)).get_array()
        np.testing.assert_array_equal(drawn.data[~drawn.mask], expected[~drawn.mask])


@pytest.mark.slow  # every figure of a run drawn
def test_write_window_figures_writes_the_heads_asked_for(long_run, tmp_path):
    window = window_of("0:16,0:16", NUM_TOKENS, NUM_TOKENS)
    assert [path.name for path in write_window_figures(long_run, window, tmp_path)] == [f"window_head_0{h}.png" for h in range(3)]
    assert [path.name for path in write_window_figures(long_run, window, tmp_path / "..", "svg", heads=[2])] == ["window_head_02.svg"]


@pytest.mark.parametrize(
    "given, message",
    [
        ("x", "window 'x' is not Q0:Q1,K0:K1: e.g. 0:64,0:64 (ends excluded; an end left out is the map's)"),
        ("0:10", "window '0:10' is not Q0:Q1,K0:K1"),
        ("5:5,0:3", "window's queries 5:5 are empty: give a start below the end (ends excluded)"),
        ("0:3,9:2", "window's keys 9:2 are empty"),
        ("-1:3,0:2", "window '-1:3,0:2' is not Q0:Q1,K0:K1"),
        ((slice(0, 4, 2), slice(0, 2)), "window's queries 0:4 must be a span of token indices, 0 or more, without a step"),
        ("0:301,0:3", "window's queries 0:301 are out of range: the map has queries 0 to 299 (give Q0:Q1,K0:K1 within 0:300,0:300"),
        ("0:3,300:", "window's keys 300: are out of range: the map has keys 0 to 299"),
        ("0:513,0:3", "window's queries 0:513 are out of range"),
        ([0, 3], "window must be a string 'Q0:Q1,K0:K1' or two slices (queries, keys), not [0, 3]"),
    ],
)
def test_bad_windows_are_refused_in_one_line_naming_the_valid_range(given, message):
    with pytest.raises(AttnvizError) as refused:
        window_of(given, NUM_TOKENS, NUM_TOKENS)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value), str(refused.value)


def test_a_window_wider_than_full_resolution_allows_is_refused():
    with pytest.raises(AttnvizError, match=f"window's keys 0: span 1,000 tokens: a window shows at most {MAX_WINDOW_TOKENS} a side"):
        window_of("0:3,0:", 1000, 1000)


def test_the_api_draws_a_heads_window_and_refuses_a_window_without_a_head(bundled_bert):
    result = attnviz.heads("the cat sat on the mat because it was tired", model="bundled", device="cpu")
    image = drawn_image(result.figure(head=3, window=(slice(2, 8), slice(0, 5))))
    np.testing.assert_array_equal(image.get_array().data, result.attention[3, 2:8, 0:5].numpy().astype(np.float64))
    with pytest.raises(AttnvizError, match="a window is of one head's map: give head= too"):
        result.figure(window="0:2,0:2")
    with pytest.raises(AttnvizError, match="window's keys 0:99 are out of range"):
        result.figure(head=0, window="0:2,0:99")


@pytest.mark.slow
def test_the_command_writes_window_figures_beside_the_heatmaps_and_refuses_bad_windows(tmp_path, capsys, bundled_bert):
    text = "the cat sat on the mat because it was tired"
    assert cli(["heads", text, "--model", "bundled", "--window", "2:8,:5", "--head", "3", "--out", str(tmp_path / "one")]) == 0
    assert {"head_03.png", "window_head_03.png", "attention.json", "report.html"} <= {p.name for p in (tmp_path / "one").iterdir()}
    assert not (tmp_path / "one" / "window_head_00.png").exists()
    assert read_png(tmp_path / "one" / "window_head_03.png").shape[2] == 3
    for args, message in [
        (["--window", "8:2,0:3"], "error: --window's queries 8:2 are empty"),
        (["--window", "0:2,0:99"], "error: --window's keys 0:99 are out of range: the map has keys 0 to 11"),
        (["--window", "0:2;0:3"], "error: --window '0:2;0:3' is not Q0:Q1,K0:K1"),
    ]:
        capsys.readouterr()
        assert cli(["heads", text, "--model", "bundled", *args, "--out", str(tmp_path / "bad")]) == 2
        error = capsys.readouterr().err
        assert error.startswith(message) and error.count("\n") == 1, error
        assert not (tmp_path / "bad").exists()
    lines = tmp_path / "texts.txt"
    lines.write_text("a\nb\n", encoding="utf-8")
    assert cli(["heads", "--file", str(lines), "--model", "bundled", "--window", "0:2,0:2", "--out", str(tmp_path / "b")]) == 2
    assert "--window draws a region of one text's map: give a TEXT, not --file" in capsys.readouterr().err


@pytest.mark.slow
def test_the_largest_window_is_within_1920_by_1800_pixels(tmp_path):
    """A 512 × 512 window (the most a side): 16 × 15 inches at 120 dpi, within the figures' 4,096 px cap."""
    from PIL import Image

    from attnviz.render.scales import DPI

    run = make_run([f"w{index}" for index in range(600)], num_heads=1)
    (path,) = write_window_figures(run, window_of("88:,0:512", 600, 600), tmp_path)
    with Image.open(path) as image:
        assert image.size == (round(16 * DPI), round(15 * DPI)) == (1920, 1800)

"""Heatmap files and CJK fonts, on hand-made attention runs (no model needed)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import make_run, read_png

from attnviz.errors import AttnvizError
from attnviz.render import heatmap
from attnviz.render.fonts import use_cjk_font
from attnviz.render.heatmap import (
    MASKED_COLOR,
    MAX_TICK_LABELS,
    grid_shape,
    masked_attention,
    tick_positions,
    write_head_heatmaps,
    write_heads_grid,
)
from attnviz.render.titles import short_model_name

CHINESE = ["[CLS]", "我", "想", "吃", "酸", "菜", "鱼", "[SEP]"]
CJK = ["[CLS]", "我", "想", "吃", "こんにちは", "カタカナ", "안녕", "하세요", "[SEP]"]


def missing_glyph_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


# --- helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_tokens", [1, 5, 48])
def test_tick_positions_label_every_token_when_few(num_tokens):
    assert tick_positions(num_tokens, max_labels=48) == list(range(num_tokens))


@pytest.mark.parametrize("num_tokens, max_labels", [(49, 48), (300, 48), (512, 48), (512, 16)])
def test_tick_positions_thin_long_texts_evenly(num_tokens, max_labels):
    positions = tick_positions(num_tokens, max_labels)
    assert positions[0] == 0
    assert all(0 <= p < num_tokens for p in positions)
    assert len(positions) <= max_labels
    assert len(positions) > max_labels // 2  # thinned, not emptied
    assert len(set(np.diff(positions))) == 1  # every k-th token


def test_masked_attention_masks_exactly_the_future_keys():
    weights = np.arange(20.0).reshape(4, 5)  # rectangular on purpose
    masked = masked_attention(weights, causal=True)
    expected = np.array([[key > query for key in range(5)] for query in range(4)])
    np.testing.assert_array_equal(np.ma.getmaskarray(masked), expected)
    np.testing.assert_array_equal(masked.data, weights)


def test_masked_attention_masks_nothing_without_causal():
    assert not np.ma.getmaskarray(masked_attention(np.ones((3, 3)), causal=False)).any()


@pytest.mark.parametrize(
    "model, expected",
    [
        ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"),
        ("/home/me/models/bert-base-chinese/", "bert-base-chinese"),
        ("C:\\models\\bert-tiny", "bert-tiny"),
        ("bert-base-uncased", "bert-base-uncased"),
    ],
)
def test_short_model_name_keeps_the_last_path_component(model, expected):
    assert short_model_name(model) == expected


@pytest.mark.parametrize("num_heads, shape", [(1, (1, 1)), (6, (2, 3)), (8, (2, 4)), (12, (3, 4))])
def test_grid_shape_holds_every_head(num_heads, shape):
    assert grid_shape(num_heads) == shape


# --- fonts -----------------------------------------------------------------------------


def test_cjk_font_covers_chinese_kana_and_hangul():
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    family = use_cjk_font()
    font = FT2Font(font_manager.findfont(family, fallback_to_default=False))
    for character in "我想吃酸菜鱼こんにちはカタカナ안녕하세요":
        assert font.get_char_index(ord(character)) != 0, character


def test_use_cjk_font_is_idempotent():
    import matplotlib
    from matplotlib import font_manager

    first = use_cjk_font()
    fonts_known = len(font_manager.fontManager.ttflist)
    assert use_cjk_font() == first
    assert len(font_manager.fontManager.ttflist) == fonts_known  # font not registered twice
    assert list(matplotlib.rcParams["font.family"])[:2] == ["DejaVu Sans", first]


def test_importing_the_renderers_does_not_import_matplotlib():
    code = "import sys, attnviz.render.heatmap, attnviz.render.fonts; print('matplotlib' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_cjk_tokens_render_without_missing_glyphs(tmp_path, fmt):
    run = make_run(CJK)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_head_heatmaps(run, tmp_path, fmt)
        write_heads_grid(run, tmp_path, fmt)
    assert missing_glyph_warnings(caught) == []


def test_without_the_cjk_font_the_same_render_warns(tmp_path, monkeypatch):
    """Negative control: the glyph check above would fail if fonts.py did nothing."""
    import matplotlib

    monkeypatch.setattr("attnviz.render.fonts.use_cjk_font", lambda: "DejaVu Sans")
    with matplotlib.rc_context({"font.family": ["DejaVu Sans"]}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            write_head_heatmaps(make_run(CJK, num_heads=1), tmp_path)
    missing = " ".join(missing_glyph_warnings(caught))  # glyphs named as in \N{HIRAGANA LETTER KO}
    for script in ["CJK UNIFIED IDEOGRAPH", "HIRAGANA", "KATAKANA", "HANGUL SYLLABLE"]:
        assert script in missing


# --- files -----------------------------------------------------------------------------


def test_one_png_per_head_named_in_order(tmp_path):
    run = make_run(CHINESE, num_heads=3)
    paths = write_head_heatmaps(run, tmp_path)
    assert paths == [tmp_path / f"head_{h:02d}.png" for h in range(3)]
    images = [read_png(path) for path in paths]
    for image in images:
        height, width, _ = image.shape
        assert 400 <= width <= 2000 and 400 <= height <= 2000
    # The figure is reused across heads: each file must show its own head.
    assert not np.array_equal(images[0], images[1])


def test_blitted_png_matches_a_full_redraw(tmp_path):
    """The PNG fast path (the parts common to all heads drawn once, each head over them) gives the same
    picture as savefig of that head's figure."""
    run = make_run(CHINESE, num_heads=2)
    written = write_head_heatmaps(run, tmp_path)  # head 1 is drawn over head 0's background
    heatmap.head_figure(run, 1).savefig(tmp_path / "full.png", dpi=heatmap.DPI)
    blitted, full = read_png(written[1]), read_png(tmp_path / "full.png")
    assert blitted.shape == full.shape
    # Identical today; allow a few edge pixels (a missing title alone differs in ~0.5 %).
    differing = np.any(blitted != full, axis=-1).mean()
    assert differing < 0.0005


@pytest.mark.slow
def test_write_heatmaps_draws_the_same_files_as_one_process_does(tmp_path):
    """write_heatmaps' files are those of the heads and the grid drawn one by one, pixel for pixel."""
    run = make_run(["[CLS]", "我", "想", "吃", "[SEP]"], num_heads=3)
    (tmp_path / "together").mkdir()
    (tmp_path / "alone").mkdir()
    paths = heatmap.write_heatmaps(run, tmp_path / "together")
    assert [path.name for path in paths] == ["head_00.png", "head_01.png", "head_02.png", "heads.png"]
    alone = heatmap.write_head_heatmaps(run, tmp_path / "alone") + [heatmap.write_heads_grid(run, tmp_path / "alone")]
    for together, single in zip(paths, alone):
        np.testing.assert_array_equal(read_png(together), read_png(single))


def test_grid_is_one_png(tmp_path):
    path = write_heads_grid(make_run(CHINESE, num_heads=12), tmp_path)
    assert path == tmp_path / "heads.png"
    height, width, _ = read_png(path).shape
    assert width > height >= 600  # 4 columns by 3 rows


@pytest.mark.parametrize("fmt, header", [("svg", b"<svg"), ("pdf", b"%PDF")])
def test_vector_formats_have_their_headers(tmp_path, fmt, header):
    run = make_run(CHINESE)
    for path in [*write_head_heatmaps(run, tmp_path, fmt), write_heads_grid(run, tmp_path, fmt)]:
        assert path.suffix == f".{fmt}"
        start = path.read_bytes()[:400]
        assert start.startswith(b"<?xml" if fmt == "svg" else b"%PDF")
        assert header in start


def test_unknown_format_is_refused(tmp_path):
    with pytest.raises(AttnvizError, match="jpg"):
        write_head_heatmaps(make_run(CHINESE), tmp_path, "jpg")


@pytest.mark.slow
def test_long_text_writes_with_thinned_labels(tmp_path):
    tokens = ["[CLS]", *[f"tok{i}" if i % 4 else "字" for i in range(298)], "[SEP]"]
    run = make_run(tokens, num_heads=2)
    ax = heatmap.head_figure(run, 0).axes[0]
    assert 0 < len(ax.get_xticks()) <= MAX_TICK_LABELS
    assert 0 < len(ax.get_yticks()) <= MAX_TICK_LABELS
    assert not ax.collections  # no numbers in 300 x 300 cells
    paths = write_head_heatmaps(run, tmp_path)
    grid = write_heads_grid(run, tmp_path)
    assert all(read_png(path).size > 0 for path in [*paths, grid])


def test_cross_attention_rectangular_map(tmp_path):
    queries = [f"q{i}" for i in range(12)]
    keys = ["[CLS]", "我", "爱", "中", "国", "[SEP]", "안녕"]
    run = make_run(queries, keys, num_heads=6)
    paths = write_head_heatmaps(run, tmp_path)
    grid = write_heads_grid(run, tmp_path)
    assert len(paths) == 6 and grid.exists()
    height, width, _ = read_png(paths[0]).shape
    assert height > width  # 12 query rows, 7 key columns


def test_causal_cells_show_as_masked_grey(tmp_path):
    grey = np.array([int(MASKED_COLOR[i : i + 2], 16) for i in (1, 3, 5)])

    def grey_pixels(run, out_dir):
        out_dir.mkdir()
        image = read_png(write_head_heatmaps(run, out_dir)[0])
        return int(np.all(image == grey, axis=-1).sum())

    # 28 masked cells of about 50 x 50 pixels; without masking, only a few anti-aliased
    # text edges happen to have that grey.
    assert grey_pixels(make_run(CHINESE, causal=True), tmp_path / "causal") > 28 * 40 * 40
    assert grey_pixels(make_run(CHINESE, causal=False), tmp_path / "full") < 200


def test_cell_values_are_printed_with_contrast():
    """One number per cell: white on dark cells, black on light ones, none on masked cells."""
    run = make_run(CHINESE, num_heads=1, causal=True)
    run.attention[0, 1] = 0.0
    run.attention[0, 1, :2] = [0.02, 0.98]  # query 1: a dark cell, then a bright (yellow) one
    (cell_values,) = heatmap.head_figure(run, 0).axes[0].collections  # the numbers' glyphs, one path a cell
    paths = cell_values.get_paths()
    colours = cell_values.get_facecolor()[:, :3]
    num_tokens = len(CHINESE)
    assert len(paths) == num_tokens * num_tokens

    def cell(query, key):
        return query * num_tokens + key

    np.testing.assert_array_equal(colours[cell(1, 0)], [1, 1, 1])
    np.testing.assert_array_equal(colours[cell(1, 1)], [0, 0, 0])
    assert len(paths[cell(1, 1)].vertices) > 0
    assert len(paths[cell(1, 2)].vertices) == 0  # a future key: masked, no number


@pytest.mark.parametrize(
    ("value", "decimals", "shown"),
    [(-0.004, 2, "0.00"), (-0.0, 2, "0.00"), (0.004, 2, "0.00"), (-0.006, 2, "-0.01"), (-0.0004, 3, "0.000"), (-0.04, 1, "0.0"), (0.42, 2, "0.42")],
)
def test_a_cell_value_that_rounds_to_zero_shows_no_minus_sign(value, decimals, shown):
    from attnviz.render.cell_values import cell_text

    assert cell_text(value, decimals) == shown


def test_a_signed_grids_cells_show_zero_without_a_minus_sign():
    """patch.png's and effects.png's grids (grids_figure, 3 decimals here): a value a hair below 0 is written 0.000,
    as is one a hair above."""
    from types import SimpleNamespace

    from attnviz.render.summary_figures import grids_figure

    values = np.array([[-0.0001, 0.0001], [-0.5, 0.5]])  # (L, H)
    numbers = SimpleNamespace(model="m", text="a text", causal=True)
    figure = grids_figure([("score", values, True)], 2, [], None, None, numbers)
    cells = sorted(text.get_text() for text in figure.axes[0].texts)
    assert cells == ["-0.500", "0.000", "0.000", "0.500"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "num_tokens, causal",
    [(8, False), (8, True), (12, False), (40, True), (80, True)],  # 80 keys: the log scale
)
def test_painted_maps_equal_matplotlibs_full_draw(tmp_path, num_tokens, causal):
    """Every head's PNG, its map's cells painted over the common parts, has exactly the pixels of savefig's
    full draw of that head's figure."""
    run = make_run([f"t{i}" for i in range(num_tokens)], num_heads=3, causal=causal, seed=num_tokens)
    written = write_head_heatmaps(run, tmp_path)
    for head, painted in enumerate(written):
        heatmap.head_figure(run, head).savefig(tmp_path / f"full_{head}.png", dpi=heatmap.DPI)
        np.testing.assert_array_equal(read_png(painted), read_png(tmp_path / f"full_{head}.png"))


def test_maps_finer_than_the_pixels_are_left_to_matplotlib(tmp_path):
    """300 tokens in a 10-inch figure: under 4 pixels a cell, where matplotlib colours after resampling;
    the file equals matplotlib's own draw."""
    run = make_run([f"t{i}" for i in range(300)], num_heads=1)
    (written,) = write_head_heatmaps(run, tmp_path)
    heatmap.head_figure(run, 0).savefig(tmp_path / "full.png", dpi=heatmap.DPI)
    np.testing.assert_array_equal(read_png(written), read_png(tmp_path / "full.png"))

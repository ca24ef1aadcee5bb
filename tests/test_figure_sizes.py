"""Every figure attnviz draws stays within its stated size (attnviz.render.sizes, docs/formats.md's
"Figure sizes"): at 512 tokens, the bundled model's longest text, and at sizes far beyond it.

The PNGs' pixels are read back with PIL, so the bound is the file's, not the figure's own idea of it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import layers_grid_panels, make_run, merge_figure_run
from PIL import Image

import attnviz
from attnviz.render.scales import DPI, MAX_IMAGE_SIDE_PX
from attnviz.render.sizes import FIGURE_MAX_PX, figure_max_px

WORDS = "the animal did not cross the street because it was too tired and the quick brown fox ran over the lazy dog".split()
LONG_TEXT = " ".join(WORDS[index % len(WORDS)] for index in range(560))  # one token a word: cut to 512 by truncate


def png_size(path) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


@pytest.fixture(scope="module")
def figures_of_512_tokens(tmp_path_factory, bundled_bert):
    """Every figure file of every command at 512 tokens, in one folder: {file name: (width, height)}."""
    from attnviz.analysis.flow import AttentionFlow
    from attnviz.analysis.measures import LayersMeasures, RunMeasures
    from attnviz.render.heatmap import write_heatmaps
    from attnviz.render.measure_figures import write_layers_measure_figures, write_measure_figures

    folder = tmp_path_factory.mktemp("figures-512")
    common = {"model": "bundled", "device": "cpu", "truncate": True}
    heads = attnviz.heads(LONG_TEXT, **common)
    assert len(heads.tokens) == 512
    written = write_heatmaps(heads.run, folder)
    written += heads.write_files(folder, figures="none", head=0, window=heads.window(":,:"))  # the largest window: 512 a side
    layers = attnviz.layers(LONG_TEXT, **common)
    written += layers.write_files(folder)
    written += attnviz.stats([LONG_TEXT], **common).write_files(folder)
    written += attnviz.compare(LONG_TEXT, **common).write_files(folder)
    position = attnviz.position(" ".join(LONG_TEXT.split()[:510]), model="bundled", device="cpu")
    assert len(position.tokens) == 512
    written += position.write_files(folder)
    for mistake in ("merge-without-permute", "view-without-permute"):
        written += attnviz.trace(LONG_TEXT, mistake=mistake, **common).write_files(folder)
    # The measures' figures drawn from maps of the right shapes: flow is refused past 88 tokens and
    # value zeroing of every layer takes long, but the figures' sizes depend only on the maps' shapes.
    rng = np.random.default_rng(0)
    maps = lambda *shape: rng.random((*shape, 512, 512))  # noqa: E731
    names = ("norm", "value-zeroing", "flow")
    run_measures = RunMeasures(
        names, norm_heads=maps(heads.run.num_heads), norm=maps(), value_zeroing=maps(), value_zeroing_rows=maps(),
        flow=AttentionFlow(maps(), maps()), flow_layers=1,
    )  # fmt: skip
    written += write_measure_figures(heads.run, run_measures, folder)
    num_layers = len(layers.layer_runs)
    layers_measures = LayersMeasures(
        names, norm=maps(num_layers), value_zeroing=maps(num_layers), value_zeroing_rows=maps(num_layers),
        flow=AttentionFlow(maps(), maps()),
    )  # fmt: skip
    written += write_layers_measure_figures(layers.layer_runs, layers.rollout, layers_measures, folder)
    return {path.name: png_size(path) for path in written if path.suffix == ".png"}


@pytest.mark.slow
def test_every_figure_at_512_tokens_is_within_its_stated_size(figures_of_512_tokens):
    for name, (width, height) in figures_of_512_tokens.items():
        most_width, most_height = figure_max_px(name)
        assert width <= most_width and height <= most_height, (name, (width, height), (most_width, most_height))
        assert max(width, height) <= MAX_IMAGE_SIDE_PX, name


# stated sizes of figures the bundled BERT does not draw, each checked against its size by the test named
CHECKED_ELSEWHERE = {"edges": "tests/test_edges.py (patch --edges: a decoder's circuit)"}


@pytest.mark.slow
def test_every_stated_size_is_of_a_figure_that_was_drawn(figures_of_512_tokens):
    """No figure escapes the check above, and no stated size is of a figure attnviz no longer draws."""
    drawn = {re.sub(r"head_\d+$", "head_XX", name.removesuffix(".png")) for name in figures_of_512_tokens}
    assert drawn == set(FIGURE_MAX_PX) - set(CHECKED_ELSEWHERE)
    assert {f"head_{head:02d}.png" for head in range(12)} <= set(figures_of_512_tokens)


def test_no_figure_is_bigger_than_the_cap_and_the_docs_say_each_size():
    from pathlib import Path

    formats_doc = (Path(__file__).parent.parent / "docs" / "formats.md").read_text(encoding="utf-8")
    section = formats_doc.split("### Figure sizes", 1)[1].split("\n#", 1)[0]
    for name, (width, height) in FIGURE_MAX_PX.items():
        assert max(width, height) <= MAX_IMAGE_SIDE_PX, name
        assert f"`{name}.png` | {width:,} × {height:,}" in section, name


def test_a_long_text_never_grows_a_single_map_past_its_stated_size():
    """head_figure_size, which sizes head_XX, rollout and a wrong head, stops growing: 100,000 tokens."""
    from attnviz.render.heatmap import head_figure_size

    for num_tokens in (512, 4096, 100_000):
        width, height = head_figure_size(num_tokens, num_tokens)
        most_width, most_height = FIGURE_MAX_PX["head_XX"]
        assert round(width * DPI) <= most_width and round(height * DPI) <= most_height
    assert FIGURE_MAX_PX["rollout"] == FIGURE_MAX_PX["mistake_view-without-permute_head_XX"] == FIGURE_MAX_PX["head_XX"]


@pytest.mark.slow
def test_deep_models_with_many_heads_keep_layers_png_within_its_stated_size(tmp_path):
    from attnviz.render.stats_figures import write_layers_grid

    tokens = [f"t{index}" for index in range(8)]
    runs = [make_run(tokens, num_heads=64, seed=layer) for layer in range(96)]
    for layer, run in enumerate(runs):
        run.layer = layer
    width, height = png_size(write_layers_grid(runs, tmp_path))
    assert width <= FIGURE_MAX_PX["layers"][0] and height <= FIGURE_MAX_PX["layers"][1]


@pytest.mark.slow
def test_the_merge_figure_of_thousands_of_tokens_and_many_heads_stays_within_its_stated_size(tmp_path):
    from types import SimpleNamespace

    from attnviz.render.mistake_figures import MAX_MERGE_ROW_LABELS, write_merge_figure

    tokens = ["[CLS]", *(f"w{index}" for index in range(4094)), "[SEP]"]
    run = merge_figure_run(tokens, num_heads=256)
    notes = []
    path = write_merge_figure(SimpleNamespace(num_heads=256, head_dim=4), run, tmp_path / "merge.png", notes)
    width, height = png_size(path)
    assert (width, height) == FIGURE_MAX_PX["mistake_merge-without-permute_merge"] == (4096, 2400)
    assert f"{MAX_MERGE_ROW_LABELS} of 4096 tokens" in notes[0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_tokens, num_heads", [(512, 12), (100, 48), (12, 48)])
def test_layers_png_panels_hold_the_same_block_maxima_as_the_masked_path(causal, num_tokens, num_heads):
    """layers.png's panels are coloured as scales.block_maximum of each masked map, pooled where the map
    has more tokens than the panel cells (48 heads: panels of fewer cells than 100 tokens)."""
    from attnviz.render.heatmap import masked_attention
    from attnviz.render.scales import attention_colors, attention_norm, block_maximum
    from attnviz.render.stats_figures import layers_figure

    tokens = [f"t{index}" for index in range(num_tokens)]
    runs = [make_run(tokens, num_heads=num_heads, causal=causal, seed=layer) for layer in range(2)]
    _, panels, cells, _ = layers_grid_panels(layers_figure(runs), num_layers=2, num_heads=num_heads)
    assert (cells < num_tokens) == (num_tokens > 12)  # pooled at 512 and 100 tokens, a cell a token at 12
    norm = attention_norm(num_tokens)
    for layer, head in [(0, 0), (0, num_heads - 1), (1, num_heads // 2)]:  # corners and the middle
        expected = block_maximum(masked_attention(runs[layer].attention[head], causal), cells, cells)
        np.testing.assert_array_equal(panels[layer, head], attention_colors(expected, norm))


@pytest.mark.slow
def test_the_wrong_heads_grid_at_512_tokens_says_its_panels_show_block_maxima(tmp_path, monkeypatch, bundled_bert):
    """A panel of about 300 pixels shows 512 cells as blocks: the colour bar of the grid (and of a wrong
    head, whose bar says so exactly when its map was pooled) must say so, not show maxima as cells."""
    from attnviz.render import heatmap
    from attnviz.render.mistake_figures import write_split_heatmaps

    figures = []
    new_figure = heatmap.new_figure
    monkeypatch.setattr(heatmap, "new_figure", lambda size: figures.append(new_figure(size)) or figures[-1])
    trace = attnviz.trace(LONG_TEXT, mistake="view-without-permute", model="bundled", device="cpu", truncate=True)
    write_split_heatmaps(trace.trace, trace.runs[0], tmp_path, "png", [], 0)
    head_figure, grid = figures
    for figure in (head_figure, grid):
        images = [image for ax in figure.axes for image in ax.images]
        shown = max(max(512 / image.get_array().shape[0], 512 / image.get_array().shape[1]) for image in images)
        label = figure.axes[-1].get_ylabel()  # the colour bar's axes come last
        assert ("max of ≤" in label) == (shown > 1), label
    assert "max of ≤2×2 cells" in grid.axes[-1].get_ylabel()


@pytest.mark.parametrize("num_panels, shared", [(12, True), (1, False), (4, False)])
def test_a_measure_figure_at_512_tokens_says_when_its_panels_show_block_maxima(num_panels, shared):
    from attnviz.render.measure_figures import Panel, maps_figure

    run = make_run([f"t{index}" for index in range(512)], num_heads=1)
    rng = np.random.default_rng(0)
    panels = [Panel(f"map {index}", rng.random((512, 512)), "value") for index in range(num_panels)]
    figure = maps_figure(run, panels, "what", shared_colour="value" if shared else None)
    images = [image for ax in figure.axes for image in ax.images]
    assert len(images) == num_panels
    cells = max(max(512 / size for size in image.get_array().shape) for image in images)
    bars = [ax for ax in figure.axes if ax.get_ylabel().startswith("value")]  # the colour bars' axes
    assert len(bars) == (1 if shared else num_panels)
    for bar in bars:
        assert ("max of ≤" in bar.get_ylabel()) == (cells > 1), bar.get_ylabel()
    if num_panels == 12:
        assert cells > 1  # 12 panels of at most 3.6 inches: fewer pixels than 512 cells


TOKENS = ["[CLS]", "the", "cat", "sat", "on", "a", "mat", "[SEP]"]


def drawn_token_labels(figure, tokens: list[str]) -> list[tuple[str, float, float, float]]:
    """Every drawn Text that is one of the tokens: (text, centre x, centre y in pixels, rotation)."""
    from matplotlib.text import Text

    figure.canvas.draw()
    labels = []
    for text in figure.findobj(Text):
        if text.get_visible() and text.get_text() in tokens:
            box = text.get_window_extent()
            labels.append((text.get_text(), (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2, text.get_rotation()))
    return labels


def test_layers_png_labels_each_panels_tokens_at_their_cells_where_they_fit():
    """8 tokens, 6 layers × 12 heads: the keys under the last layer's first panel, the queries beside its last
    panel (every panel has the same axes), every label centred on its token's cell (read from the image, in pixels)."""
    from attnviz.render.stats_figures import layers_figure

    num_layers, num_heads = 6, 12
    runs = [make_run(TOKENS, num_heads=num_heads, seed=layer) for layer in range(num_layers)]
    figure = layers_figure(runs)
    labels = drawn_token_labels(figure, TOKENS)
    _, _, cells, step = layers_grid_panels(figure, num_layers=num_layers, num_heads=num_heads)
    assert cells == len(TOKENS)  # a cell a token: token k of panel p is the image's column p * step + k
    to_pixels = figure.axes[0].transData.transform
    grid = figure.axes[0].get_window_extent()
    keys = sorted((x, text) for text, x, y, rotation in labels if rotation == 90 and y < grid.y0)
    expected_keys = sorted((to_pixels((k, 0))[0], TOKENS[k]) for k in range(8))
    assert [text for _, text in keys] == [text for _, text in expected_keys]
    np.testing.assert_allclose([x for x, _ in keys], [x for x, _ in expected_keys], atol=1.5)
    queries = sorted((y, text) for text, x, y, rotation in labels if rotation == 0 and x > grid.x1)
    expected_queries = sorted((to_pixels((0, (num_layers - 1) * step + q))[1], TOKENS[q]) for q in range(8))
    assert [text for _, text in queries] == [text for _, text in expected_queries]
    np.testing.assert_allclose([y for y, _ in queries], [y for y, _ in expected_queries], atol=1.5)
    assert len(labels) == len(keys) + len(queries)  # no token label anywhere else


def test_layers_png_thins_its_token_labels_as_heatmaps_do_and_leaves_them_out_where_they_do_not_fit():
    from attnviz.render.heatmap import tick_positions
    from attnviz.render.stats_figures import layers_figure

    tokens = [f"t{index}" for index in range(100)]  # pooled panels: every k-th token, at most 8 a panel
    figure = layers_figure([make_run(tokens, num_heads=12, seed=layer) for layer in range(2)])
    keys = [text for text, _, _, rotation in sorted(drawn_token_labels(figure, tokens), key=lambda label: label[1]) if rotation == 90]
    shown = [tokens[k] for k in tick_positions(100, 8)]
    assert shown == tokens[::13] and keys == shown
    many_heads = layers_figure([make_run(TOKENS, num_heads=96, seed=layer) for layer in range(2)])  # panels of 0.16 inch
    assert drawn_token_labels(many_heads, TOKENS) == []

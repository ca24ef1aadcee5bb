"""`attnviz heads`' figures laid out while torch loads: everything they show but the attention itself.

The figure worker (figure_worker.py) has nothing to do while this process imports torch and
runs the model (a second or more), and then has 13 figures to draw (most of a second). Yet a
figure's size, tick labels, title, colorbar and layout depend only on the tokens and settings,
and the tokens come from the model folder's tokenizer alone (the `tokenizers` library, no torch).
So the worker tokenizes the text itself (foreseen_run), lays the head figure and the grid out
and renders their static parts (prepare). When the run comes, write_heatmaps takes them (laid_out.take)
if the run is the one foreseen (same figure_key: tokens, settings, everything but the numbers),
and draws only the maps and cell values on top; any other run is drawn from scratch as before,
so a wrong guess costs time, never a wrong figure.

Foreseen: a BERT model in a folder (the bundled one, or a local folder), one text, no --kv,
--words or --stack, PNG files. Others (the hub's models, other families) are drawn after the run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from attnviz.render import laid_out
from attnviz.render.cell_pixels import CellPixels
from attnviz.result import AttentionRun


class Foreseen(NamedTuple):
    name: str  # the model's, as a run names it
    ids: list[int]
    tokens: list[str]
    config: dict  # the model's config.json


def foreseen_tokens(text: str, model: str | None) -> Foreseen | None:
    """The text's tokens (with the model's name and config) for a BERT model folder given as model
    (the command's option); None when not foreseen: the default model (the hub cache, or the bundled one in its place),
    a hub id, another family, a text beyond the model's positions.

    Read without torch: config.json and the tokenizer (models/tokens.py, the loader's own class).
    """
    from attnviz.models import loading
    from attnviz.models.tokens import WordPieceTokenizer

    if model is None:
        return None
    if model.strip().lower() in (loading.BUNDLED_NAME.lower(), "bundled"):
        name, folder = loading.BUNDLED_NAME, loading.bundled_model_path()
    elif Path(model).expanduser().is_dir():
        name, folder = model, Path(model).expanduser()
    else:
        return None
    config = loading._read_config(name, folder)
    if loading._require_family(name, config) is not loading.BERT:
        return None
    tokenizer = WordPieceTokenizer(folder)
    ids = tokenizer.encode_batch([text])[0]
    if len(ids) > config.get("max_position_embeddings", 512):
        return None  # refused, or cut by --truncate
    return Foreseen(name, ids, tokenizer.convert_ids_to_tokens(ids), config)


def foreseen_run(text: str, spec) -> AttentionRun | None:
    """The run `attnviz heads TEXT` will make with spec (a RunSpec before loading) on a BERT model folder, with zeros
    for its numbers; None when not foreseen (foreseen_tokens)."""
    if spec.kv_text is not None or spec.stack is not None or spec.words:
        return None
    foreseen = foreseen_tokens(text, spec.model)
    return zero_run(text, spec, foreseen) if foreseen is not None else None


def zero_run(text: str, spec, foreseen: Foreseen) -> AttentionRun:
    """The run of text with spec's settings over the foreseen tokens, with zeros for its numbers."""
    name, ids, tokens, config = foreseen
    heads = spec.num_heads if spec.num_heads is not None else config["num_attention_heads"]
    return AttentionRun(
        text=text, model=name, layer=spec.layer, weights=spec.weights, num_heads=heads, device="cpu",
        query_tokens=tokens, key_tokens=tokens, query_ids=ids, key_ids=ids,
        attention=np.zeros((heads, len(ids), len(ids)), dtype=np.float32),  # (H, N, N)
        output=np.zeros((len(ids), config["hidden_size"]), dtype=np.float32),  # (N, D): its width gives head_dim
        causal=spec.causal, num_kv_heads=heads,
    )  # fmt: skip


def prepare(text: str, spec) -> None:
    """In the figure worker, before the run exists: lay out and render the static parts of its head figure and grid.

    spec: the RunSpec of the command's options, before loading (its model as given, not yet resolved).
    """
    from attnviz.render.heatmap import _HeadFigure

    run = foreseen_run(text, spec)
    if run is None:
        return
    head_figure = _HeadFigure(run, seed=spec.seed)
    head_figure.prepare_blit()
    render_titles(head_figure)
    laid_out.keep(run, spec.seed, head_figure, GridBlit(run, spec.seed))


def start_warmed_up() -> None:
    """Start the figure worker (figure_worker.start) and have it warm up (warm_up) while torch loads: for layers and
    stats, whose figures are not foreseen."""
    from attnviz.render import figure_worker

    figure_worker.start()  # it imports matplotlib while this process imports torch and runs the model
    figure_worker.ahead(warm_up)  # and loads fonts and caches meanwhile


def warm_up() -> None:
    """In the figure worker, for a command or run whose figures are not foreseen: draw a small figure of the kinds every
    command draws (a map, its colorbar, rotated labels, a title), so that fonts and matplotlib's caches are loaded
    before the run exists, not after (0.05 to 0.08 s of layers.png)."""
    from attnviz.render.heatmap import freeze_layout, label_tokens, new_figure
    from attnviz.render.scales import attention_colorbar, draw_attention

    figure = new_figure((3.0, 3.0))
    ax = figure.add_subplot()
    image = draw_attention(ax, np.ma.masked_array(np.full((2, 2), 0.5)))  # (2, 2)
    label_tokens(ax, ["a", "b"], ["a", "b"], 2, fontsize=7)
    attention_colorbar(figure, image, ax=ax)
    figure.suptitle("a title\non two lines", parse_math=False)
    freeze_layout(figure)
    figure.canvas.draw()


MAX_TITLES_AHEAD = 64  # heads whose titles are rendered ahead: about 0.5 MB each


def render_titles(head_figure) -> None:
    """Each head's title drawn once over the figure's background (7 ms each, before the run) and kept, as the band
    of the figure above the axes, in head_figure.titles: the PNG of a head restores it instead of drawing the title.

    Left undone (the titles then drawn per head) for many heads, or a title that would reach into the axes' frame.
    """
    from matplotlib.transforms import Bbox

    figure, title = head_figure.figure, head_figure.title
    if head_figure.run.num_heads > MAX_TITLES_AHEAD or head_figure.background is None:
        return
    renderer = figure.canvas.get_renderer()
    # Whole pixels above the top frame line (0.8 pt, 1.3 px, centred on the axes' top) and its anti-aliasing.
    bottom = math.ceil(head_figure.ax.get_window_extent(renderer).y1 + 1)
    band = Bbox.from_extents(0, bottom, figure.bbox.width, figure.bbox.height)
    titles = []
    for head in range(head_figure.run.num_heads):
        title.set_text(head_figure.title_of(head))
        if title.get_window_extent(renderer).y0 < bottom:
            return
        figure.canvas.restore_region(head_figure.background)
        head_figure.ax.draw_artist(title)
        titles.append(figure.canvas.copy_from_bbox(band))
    head_figure.titles = titles


class GridBlit:
    """heads.png of a run, laid out and rendered but for its maps and their frames; write() draws a run's maps on it."""

    def __init__(self, run: AttentionRun, seed: int | None):
        from attnviz.render.blit import render_without
        from attnviz.render.heatmap import heads_grid_figure

        self.run = run
        self.figure = heads_grid_figure(run, seed=seed)
        self.images = [image for ax in self.figure.axes for image in ax.images]  # one per head; the colorbar has none
        drawn_per_head = [*self.images, *(spine for image in self.images for spine in image.axes.spines.values())]
        self.background = render_without(self.figure, drawn_per_head)
        self.pixels = [CellPixels.learn(image) for image in self.images]  # None: matplotlib draws that map

    def write(self, path: Path) -> Path:
        """Write the grid of self.run's heads as a PNG: the prepared background, each map, each map's frame on top."""
        from attnviz.render.heatmap import masked_attention
        from attnviz.render.png import write_png
        from attnviz.render.scales import DPI, show_attention

        canvas = self.figure.canvas
        canvas.restore_region(self.background)
        buffer = np.asarray(canvas.buffer_rgba())  # (height, width, 4)
        for head, (image, pixels) in enumerate(zip(self.images, self.pixels)):
            show_attention(image, masked_attention(self.run.attention[head], self.run.causal))
            if pixels is not None:
                pixels.paint(buffer)
            else:
                image.axes.draw_artist(image)
            for spine in image.axes.spines.values():  # drawn over the map's edge, as a full draw does
                image.axes.draw_artist(spine)
        return write_png(path, buffer, DPI)

"""Attention heatmaps as image files: one per head, and all heads in one grid.

Rows are queries (y axis), columns are keys (x axis); each row sums to 1, so the colour scale
is fixed at 0..1 and a colour means the same weight in every head, layer and model (log for
long maps; every pixel one value, never a blend; no image past the size cap: attnviz.render.scales).
Figures are plain matplotlib Figures on an Agg canvas: no pyplot state, nothing left open.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from attnviz.render.cell_pixels import CellPixels
from attnviz.render.cell_values import MAX_ANNOTATED_TOKENS, cell_values, update_cell_values
from attnviz.render.fonts import displayable
from attnviz.render.titles import chars_across, counted, head_scope, run_title
from attnviz.run_data import AttentionRun, map_rows, rows_buffer
from attnviz.render.scales import (  # the colour scale, blocks and size cap of every attention figure
    COLORMAP,  # noqa: F401 (the colours of heatmaps, imported from here by their tests)
    DPI,
    MASKED_COLOR,  # noqa: F401
    attention_colorbar,
    attention_image,
    attention_pool,
    capped_size,
    draw_attention,
    say_capped,
    scale_label,
    show_attention,
)

MAX_TICK_LABELS = 48  # per axis of a single-head figure
MAX_GRID_TICK_LABELS = 16  # per axis of one panel in the grid
FORMATS = ("png", "svg", "pdf")
PNG_COMPRESS_LEVEL = 3  # a third faster to write than zlib's default 6, files 5-15 % larger
# The frame and panel title of each key/value head's group in the grid (grouped-query attention): colours far from
# viridis's purple-green-yellow, in turn; the panel titles name the key/value head too ("head 4 · kv 1").
KV_GROUP_COLORS = ("#d62728", "#1f77b4", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#9467bd")
KV_GROUP_FRAME_WIDTH = 2.5  # points


def kv_group_color(kv_head: int) -> str:
    return KV_GROUP_COLORS[kv_head % len(KV_GROUP_COLORS)]


def tick_positions(num_tokens: int, max_labels: int) -> list[int]:
    """Every k-th token index, starting at 0, so that at most max_labels are labelled."""
    step = max(1, math.ceil(num_tokens / max_labels))
    return list(range(0, num_tokens, step))


def masked_attention(weights: np.ndarray, causal: bool) -> np.ma.MaskedArray:
    """(Nq, Nk) weights with the future keys (above the diagonal) masked when causal."""
    return np.ma.masked_array(weights, mask=_future(*weights.shape, causal))


@functools.lru_cache(maxsize=1)
def _future(num_queries: int, num_keys: int, causal: bool) -> np.ndarray:
    """(Nq, Nk), read-only: True at the keys after each query (key index > query index) when causal, else nowhere;
    one for all the heads of a figure (67 MB at 8,187 tokens)."""
    future = np.arange(num_keys)[None, :] > np.arange(num_queries)[:, None] if causal else np.zeros((num_queries, num_keys), bool)
    future.flags.writeable = False
    return future


def grid_shape(num_heads: int, group: int = 1) -> tuple[int, int]:
    """(rows, columns): 4 columns, or 3 where 3 fill the last row and 4 do not (6 or 9 heads);
    beyond 16 heads a near-square grid, so that many heads (--heads 384) do not make a tower.

    group: the query heads sharing a key/value head (grouped-query attention); the columns are
    then a multiple of it, so that each row holds whole groups (9 heads in groups of 3: a group a row).
    """
    num_columns = 3 if num_heads % 3 == 0 and num_heads % 4 != 0 else 4
    if num_heads > 16:
        num_columns = math.ceil(math.sqrt(num_heads))
    if group > 1:
        num_columns = group * max(1, round(num_columns / group))
    num_columns = min(num_columns, num_heads)
    return math.ceil(num_heads / num_columns), num_columns


def write_heatmaps(
    run: AttentionRun, out_dir: Path, fmt: str = "png", prefix: str = "", note: str = "", seed: int | None = None
) -> list[Path]:
    """Every head's heatmap and the grid of all heads; return their paths, the grid last.

    seed: the seed of random parameters, for the titles (figures of random parameters name it).
    Each head's map is read once for both figures (a long map's 268 MB a head at 8,192 tokens, from its file).
    """
    check_format(fmt)
    say_capped(f"{prefix}heads.{fmt}", _grid_figure_size(run))  # the grid's figure itself says nothing
    heatmap, grid = _HeadFigure(run, note, seed), _HeadsGrid(run, note, seed)
    paths, pools = [], []
    for head in range(run.num_heads):
        weights = heatmap.show_head(head)
        paths.append(heatmap.save(Path(out_dir) / f"{prefix}head_{head:02d}.{fmt}"))
        pools.append(grid.show_head(head, weights))
    return [*paths, save_figure(grid.finish(pools), out_dir, f"{prefix}heads.{fmt}")]


def write_head_heatmaps(
    run: AttentionRun, out_dir: Path, fmt: str = "png", prefix: str = "", note: str = "", seed: int | None = None
) -> list[Path]:
    """Write <prefix>head_00.<fmt>, <prefix>head_01.<fmt>, ... into out_dir; return their paths.

    prefix and note (added to each title) set apart other figures of the same run, such as
    the heads of a deliberate mistake written beside the right ones.

    One figure is laid out once and reused: per head only the image data, the cell values
    and the title change.
    """
    check_format(fmt)
    heatmap = _HeadFigure(run, note, seed)
    paths = []
    for head in range(run.num_heads):
        heatmap.show_head(head)
        paths.append(heatmap.save(Path(out_dir) / f"{prefix}head_{head:02d}.{fmt}"))
    return paths


def write_heads_grid(
    run: AttentionRun, out_dir: Path, fmt: str = "png", prefix: str = "", note: str = "", seed: int | None = None
) -> Path:
    """Write <prefix>heads.<fmt>: every head in a grid with one shared colorbar; return its path."""
    check_format(fmt)
    return save_figure(heads_grid_figure(run, note, seed), out_dir, f"{prefix}heads.{fmt}")


def heads_grid_figure(run: AttentionRun, note: str = "", seed: int | None = None):
    """Every head of the run in one figure (heads.<fmt>): a matplotlib Figure, not saved."""
    grid = _HeadsGrid(run, note, seed)
    rows = rows_buffer(run.attention)
    pools = [grid.show_head(head, masked_attention(map_rows(run.attention, head, out=rows), run.causal)) for head in range(run.num_heads)]
    return grid.finish(pools)


class _HeadsGrid:
    """The grid of every head, laid out once with empty maps; show_head fills a head's panel, finish labels the colour bar."""

    def __init__(self, run: AttentionRun, note: str = "", seed: int | None = None):
        size = capped_size(_grid_figure_size(run))
        self.figure = figure = new_figure(size)
        num_rows, num_columns = grid_shape(run.num_heads, run.group_size)
        axes = figure.subplots(num_rows, num_columns, squeeze=False)
        max_labels = min(MAX_GRID_TICK_LABELS, int(size[0] / num_columns * 72 / 12))  # 7-point labels 12 points apart
        self.images = []
        for head, ax in enumerate(axes.flat):
            if head >= run.num_heads:
                ax.set_visible(False)
                continue
            self.images.append(attention_image(ax, *run.attention.shape[1:]))  # each head's map is read once, laid out
            ax.set_title(" · ".join(head_scope(run, head, short=True)), fontsize=9)
            if run.kv_head_of(head) is not None:
                _mark_kv_group(ax, kv_group_color(run.kv_head_of(head)))
            # Tokens on the outer edge of the filled grid only (ticks are most of the drawing
            # time): the first column gets queries, a panel with no panel below it gets keys.
            keys, queries = head + num_columns >= run.num_heads, head % num_columns == 0
            _label_token_axes(ax, run, max(2, max_labels), fontsize=7, keys=keys, queries=queries)
            ax.xaxis.set_visible(keys)  # an axis with no ticks draws nothing: hidden, the layout skips it
            ax.yaxis.set_visible(queries)
        self.colorbar = attention_colorbar(figure, self.images[0], ax=axes, shrink=0.6)
        scope = [f"layer {run.layer}", *_noted(note), counted(run.num_heads, "head")]
        figure.suptitle(run_title(run, scope, seed=seed, line_chars=chars_across(size[0])), parse_math=False)
        figure.supxlabel("key")
        figure.supylabel("query")
        freeze_layout(figure)

    def show_head(self, head: int, weights: np.ma.MaskedArray) -> int:
        """Fill head's panel with its weights (Nq, Nk), masked; return the block size of show_attention."""
        return show_attention(self.images[head], weights)

    def finish(self, pools: list[int]):
        self.colorbar.set_label(scale_label("attention weight", self.images[0].norm, max(pools)))
        return self.figure


def _mark_kv_group(ax, color: str) -> None:
    """A panel of a key/value head's group: its frame and title in the group's colour."""
    for spine in ax.spines.values():
        spine.set_edgecolor(color)
        spine.set_linewidth(KV_GROUP_FRAME_WIDTH)
    ax.title.set_color(color)


def head_figure(run: AttentionRun, head: int, seed: int | None = None):
    """One head's heatmap, as head_XX.<fmt> draws it: a matplotlib Figure, not saved."""
    heatmap = _HeadFigure(run, seed=seed)
    heatmap.show_head(head)
    return heatmap.figure


class _HeadFigure:
    """One head's heatmap figure whose artists are updated in place for each head.

    PNGs are blitted: everything that is the same for all heads (labels, ticks, colorbar) is
    rendered once, and each head draws only its image, cell values, title and frame on top.
    """

    def __init__(self, run: AttentionRun, note: str = "", seed: int | None = None):
        self.run = run
        self.note = note
        self.seed = seed
        num_queries, num_keys = run.attention.shape[1:]
        self.figure = new_figure(head_figure_size(num_queries, num_keys))
        self.ax = self.figure.add_subplot()
        self.image = attention_image(self.ax, num_queries, num_keys)
        self.rows = rows_buffer(run.attention)  # each head of a map on disk is read into it
        self.cell_values = cell_values(self.ax, num_queries, num_keys)
        # A fixed y: automatic placement would move the title while it is hidden for the background.
        self.title = self.ax.set_title("", y=1.0, parse_math=False)
        short = max(num_queries, num_keys) <= MAX_ANNOTATED_TOKENS
        _label_token_axes(self.ax, run, MAX_TICK_LABELS, fontsize=10 if short else 7)
        self.ax.set_xlabel("key")
        self.ax.set_ylabel("query")
        colorbar = attention_colorbar(self.figure, self.image, ax=self.ax)
        self.title.set_text(self.title_of(run.num_heads - 1))  # the longest title: the frozen layout must fit it
        freeze_layout(self.figure)
        pool = attention_pool(self.image, num_queries, num_keys)[2]  # the same for every head: each is shown as saved
        colorbar.set_label(scale_label("attention weight", self.image.norm, pool))
        self.background = None  # pixels of the parts common to all heads, after the first PNG
        self.pixels: CellPixels | None = None  # where the map's cells land, learnt with the background

    def show_head(self, head: int) -> np.ma.MaskedArray:
        """Show this head's map, title and cell values; return its weights (Nq, Nk) as shown, masked, to show again
        (valid until the next head: a map on disk is read into the figure's one buffer)."""
        weights = masked_attention(map_rows(self.run.attention, head, out=self.rows), self.run.causal)  # (Nq, Nk)
        show_attention(self.image, weights)
        self.title.set_text(self.title_of(head))
        if self.cell_values is not None:
            update_cell_values(self.cell_values, weights, self.image)
        return weights

    def title_of(self, head: int) -> str:
        scope = [f"layer {self.run.layer}", *_noted(self.note), *head_scope(self.run, head)]
        return run_title(self.run, scope, seed=self.seed, line_chars=chars_across(self.figure.get_figwidth()))

    def save(self, path: Path) -> Path:
        if path.suffix == ".png":
            self._blit_png(path)
        else:
            self.figure.savefig(path, dpi=DPI)  # vector formats: a full draw per head
        return path

    def _per_head_artists(self) -> list:
        # The frame (spines) is redrawn too: the image would otherwise cover its inner half.
        artists = [self.image, self.cell_values, self.title, *self.ax.spines.values()]
        return [artist for artist in artists if artist is not None]

    def _blit_png(self, path: Path) -> None:
        from attnviz.render.png import write_png

        canvas = self.figure.canvas
        if self.background is None:
            self.prepare_blit()
        canvas.restore_region(self.background)
        buffer = np.asarray(canvas.buffer_rgba())  # (height, width, 4), written as RGB
        for artist in self._per_head_artists():
            if artist is self.image and self.pixels is not None:
                self.pixels.paint(buffer)  # the same bytes as drawing it, in a sixth of the time
            else:
                self.ax.draw_artist(artist)
        write_png(path, buffer, DPI)

    def prepare_blit(self) -> None:
        """Render the parts common to all heads, and learn where the map's cells land (None: matplotlib draws it)."""
        changing = self._per_head_artists()
        for artist in changing:
            artist.set_visible(False)
        self.figure.canvas.draw()
        for artist in changing:
            artist.set_visible(True)
        self.background = self.figure.canvas.copy_from_bbox(self.figure.bbox)
        self.pixels = CellPixels.learn(self.image)


def _noted(note: str) -> list[str]:
    """A note such as " · mistake: view without permute" as a part of a title's first line."""
    note = note.removeprefix(" · ").strip()
    return [note] if note else []


def new_figure(size: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from attnviz.render.fonts import use_cjk_font

    use_cjk_font()
    figure = Figure(figsize=capped_size(size), dpi=DPI, layout="constrained")  # say_capped names the big ones
    FigureCanvasAgg(figure)
    return figure


def freeze_layout(figure) -> None:
    """Solve the constrained layout once, then keep it: a save then draws the figure only once.

    savefig with a layout engine draws twice (one pass without output, to lay out); one head's
    layout also fits every other head: same tokens, same sizes.
    """
    figure.get_layout_engine().execute(figure)
    figure.set_layout_engine(None)  # None (not "none"): no placeholder engine, no layout pass


def _label_token_axes(
    ax, run: AttentionRun, max_labels: int, fontsize: float, keys: bool = True, queries: bool = True
) -> None:
    """The run's tokens (as shown: run.shown_tokens) on the x (keys) and y (queries) axes; no ticks where turned off."""
    query_tokens, key_tokens = run.shown_tokens
    label_tokens(ax, key_tokens if keys else [], query_tokens if queries else [], max_labels, fontsize)


def label_tokens(ax, key_tokens: list[str], query_tokens: list[str], max_labels: int, fontsize: float) -> None:
    """Key tokens on the x axis, query tokens on the y axis, every k-th one; an empty list hides that axis's ticks."""
    key_positions = tick_positions(len(key_tokens), max_labels) if key_tokens else []
    query_positions = tick_positions(len(query_tokens), max_labels) if query_tokens else []
    # parse_math=False: a token such as "$" must print as itself, not start mathtext.
    ax.set_xticks(
        key_positions,
        [displayable(key_tokens[k]) for k in key_positions],
        rotation=45,
        ha="right",
        rotation_mode="anchor",
        fontsize=fontsize,
        parse_math=False,
    )
    ax.set_yticks(
        query_positions,
        [displayable(query_tokens[q]) for q in query_positions],
        fontsize=fontsize,
        parse_math=False,
    )


def head_figure_size(num_queries: int, num_keys: int) -> tuple[float, float]:
    """About 0.45 inch per token, so a printed "0.42" fits its cell, within 5..11 inches.

    The constant part leaves room for token labels, the colorbar and the title.
    """
    width = float(np.clip(2.5 + 0.45 * num_keys, 5.0, 11.0))
    height = float(np.clip(1.8 + 0.45 * num_queries, 4.0, 10.0))
    return width, height


def _grid_figure_size(run: AttentionRun) -> tuple[float, float]:
    """Panels of 2.4..3.2 inches, growing with the token count, plus room for labels."""
    num_queries, num_keys = run.attention.shape[1:]
    panel = float(np.clip(1.6 + 0.1 * max(num_queries, num_keys), 2.4, 3.2))
    num_rows, num_columns = grid_shape(run.num_heads, run.group_size)
    return num_columns * panel + 2.0, num_rows * panel + 1.6


def save_options(fmt: str) -> dict:
    return {"pil_kwargs": {"compress_level": PNG_COMPRESS_LEVEL}} if fmt == "png" else {}


def save_figure(figure, out_dir: Path, name: str) -> Path:
    """Write figure as out_dir/name (its format from the name's suffix, as every figure file is saved).

    A PNG of a figure whose layout is frozen is its canvas's pixels, written by attnviz.render.png
    (the pixels savefig writes, in a fifth of the encoding time); other figures go through savefig.
    """
    path = Path(out_dir) / name
    opaque = figure.get_facecolor()[3] == 1.0  # the PNG has no alpha channel
    if path.suffix == ".png" and figure.get_layout_engine() is None and figure.dpi == DPI and opaque:
        from attnviz.render.png import write_canvas_png

        return write_canvas_png(figure, path)
    figure.savefig(path, dpi=DPI, **save_options(path.suffix[1:]))
    return path


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        from attnviz.errors import AttnvizError

        raise AttnvizError(f"unknown image format {fmt!r}: use one of {', '.join(FORMATS)}")

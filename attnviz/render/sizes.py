"""The largest image each figure can be, in pixels (width, height) at scales.DPI, whatever the text's
length, the model's layers or its heads: docs/formats.md's "Figure sizes" table states the same.

Each bound follows from how the figure is sized (the comment says where); a figure whose natural
size grows with the layers or heads shrinks evenly to scales.MAX_IMAGE_SIDE_PX (capped_size), so
its bound is the cap. The text's length never grows a figure past these: a longer map gets
smaller cells, then the maximum of blocks of cells (scales.show_attention), and fewer labels.
tests/test_figure_sizes.py checks every figure at 512 tokens and at extreme sizes against them.
"""

from __future__ import annotations

from attnviz.render.scales import MAX_IMAGE_SIDE_PX as CAP

FIGURE_MAX_PX = {
    # heatmap.head_figure_size: at most 11 × 10 inches
    "head_XX": (1320, 1200),
    # panels of at most 3.2 inches in a grid that grows with the heads: the cap
    "heads": (CAP, CAP),
    # stats_figures.MAX_GRID_WIDTH_INCHES (18) wide; a row per layer, so a deep model reaches the cap
    "layers": (2160, CAP),
    # head_figure_size of the tokens
    "rollout": (1320, 1200),
    # a panel per layer, heads inside it: the cap
    "js_distance": (CAP, CAP),
    # a cell of 3.4 inches per head count and weights: the cap
    "compare": (CAP, CAP),
    # 4 panels of at most 4.5 inches across, 2 rows (position_figure.PositionFigure)
    "position": (2424, 1404),
    # mistake_figures.MERGE_MAX_PX: 4 pixels a row at 512 tokens
    "mistake_merge-without-permute_merge": (CAP, 2400),
    # head_figure_size of the padded length
    "mistake_view-without-permute_head_XX": (1320, 1200),
    # at most mistake_figures.MAX_GRID_HEADS (16) wrong heads, 4 × 4 panels of at most 3.2 inches plus room
    "mistake_view-without-permute_heads": (1836, 1776),
    # measure_figures.maps_figure of one map: a panel of at most 5 inches, its colour bar and labels
    "norm": (960, 840),
    "value_zeroing": (960, 840),
    # heads --measure flow: one map; layers --measure flow: rollout beside flow, 2 panels of at most
    # 3.6 inches with their colour bars (2 × 4.6 + 2 inches wide)
    "flow": (1344, 840),
    # the weights and the 3 measures side by side: 4 panels of at most 4.6 inches with bars, one row
    "measures": (2448, 672),
    # a panel per head or per layer, a grid that grows with them: the cap
    "norm_heads": (CAP, CAP),
    "norm_layers": (CAP, CAP),
    "value_zeroing_layers": (CAP, CAP),
    # summary_figures: 3 × 2 panels of 4.4 × 3.6 inches and a title inch, whatever the layers, heads or tokens
    "summaries": (1584, 984),
    # edge_figures.edges_figure: 0.8 inch a head, 0.7 a layer, shrunk evenly to the cap
    "edges": (CAP, CAP),
    # window_figures: at most 512 cells a side, at least 3 px a cell, labels and a colour bar
    "window_head_XX": (1920, 1800),
}


def figure_max_px(file_name: str) -> tuple[int, int]:
    """The bound of a figure file: head_03.png -> FIGURE_MAX_PX["head_XX"], layers.svg -> ["layers"]."""
    import re

    stem = re.sub(r"head_\d+$", "head_XX", file_name.rsplit(".", 1)[0])
    return FIGURE_MAX_PX[stem]

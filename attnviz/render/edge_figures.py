"""`attnviz patch --edges`' circuit figure and table: edges.png (layers as rows of heads, the read-out above, the
top edges drawn by score, red raising the answer, blue lowering it) and the terminal's checked edges, EAP's (or
EAP-IG's) score beside path patching's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.render.heatmap import check_format, new_figure, save_figure
from attnviz.render.patch_figures import _Titled, metric_words
from attnviz.render.summary_figures import _title

INPUT_STYLES = {"q": "-", "k": "--", "v": ":", "logits": "-"}


def method_words(edges) -> str:
    return "EAP" if edges.ig is None else f"EAP-IG ({edges.ig} steps)"


def _place(edges, edge) -> tuple[float, float]:
    """Where a receiver is drawn: a query head at its node, a key/value head between its group's heads a little below
    them, the read-out above the last layer."""
    num_layers = edges.scores["logits"].shape[0]
    if edge.input == "logits":
        return (edges.num_heads - 1) / 2, num_layers
    if edge.input == "q" or not edges.grouped:
        return edge.head, edge.layer
    group = edges.num_heads // edges.num_kv_heads
    return (edge.head + 0.5) * group - 0.5, edge.layer - 0.3


def edges_figure(patching, seed: int | None = None):
    """edges.png: every head a node (layers as rows, from layer 0 at the bottom), the key/value heads below their
    groups, the read-out on top; the DRAWN edges of largest |score| as lines, colour by sign and width by |score|,
    line style by input (q solid, k dashed, v dotted); the checked edges labelled score | path patched."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    from attnviz.analysis.edges import DRAWN

    edges = patching.edges
    num_layers, num_heads = edges.scores["logits"].shape
    figure = new_figure((max(6.0, 0.8 * num_heads + 2.5), 0.7 * (num_layers + 1) + 2.8))
    ax = figure.add_subplot(1, 1, 1)
    drawn = edges.ranked(DRAWN)
    top = max((abs(edges.score(edge)) for edge in drawn), default=0.0) or 1.0
    colours = colormaps["RdBu_r"]
    checked = {edge: patched for edge, _, patched in edges.checked}
    for edge in drawn:
        score = edges.score(edge)
        start, end = (edge.sender[1], edge.sender[0]), _place(edges, edge)
        ax.plot(*zip(start, end), color=colours(0.5 + 0.5 * score / top), linewidth=0.6 + 3.4 * abs(score) / top,
                linestyle=INPUT_STYLES[edge.input], alpha=0.85, zorder=1)  # fmt: skip
        if edge in checked:
            ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2, f"{score:+.2f}|{checked[edge]:+.2f}", fontsize=6, ha="center", va="center",
                    bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8), zorder=3)  # fmt: skip
    layers, heads = np.meshgrid(np.arange(num_layers), np.arange(num_heads), indexing="ij")
    ax.scatter(heads.ravel(), layers.ravel(), s=60, color="#dddddd", edgecolor="#555555", zorder=2)
    if edges.grouped:
        group = num_heads // edges.num_kv_heads
        kv_x = (np.arange(edges.num_kv_heads) + 0.5) * group - 0.5
        for layer in range(1, num_layers):
            ax.scatter(kv_x, np.full(edges.num_kv_heads, layer - 0.3), s=30, marker="s", color="#eeeeee", edgecolor="#555555", zorder=2)
    ax.scatter([(num_heads - 1) / 2], [num_layers], s=160, marker="D", color="#ffe9a8", edgecolor="#555555", zorder=2)
    ax.set_xticks(range(num_heads), [f"H{head}" for head in range(num_heads)], fontsize=7)
    ax.set_yticks([*range(num_layers), num_layers], [*(f"L{layer}" for layer in range(num_layers)), "logits"], fontsize=7)
    ax.set_xlim(-0.8, num_heads - 0.2)
    ax.set_ylim(-0.8, num_layers + 0.6)
    legend = [Line2D([], [], color="#555555", linestyle=style, label=name) for name, style in INPUT_STYLES.items() if name != "logits"]
    ax.legend(handles=legend, title="receiver input", fontsize=7, title_fontsize=7, loc="upper right")
    notes = [
        f"{method_words(edges)}: a sender head's clean − corrupted output into a receiver's input, first order, normalised "
        f"by m_clean − m_corrupt; labels: score | path patched; {metric_words(patching)}"
    ]
    scope = [f"the {len(drawn)} largest of every edge", "key/value heads (squares) below their groups" if edges.grouped else "edges"]
    _title(figure, scope, notes, None, seed, _Titled(patching))
    return figure


def write_edges_figure(patching, out_dir: Path, fmt: str = "png") -> Path:
    check_format(fmt)
    return save_figure(edges_figure(patching), out_dir, f"edges.{fmt}")


def print_edges(console: Console, patching) -> None:
    """The checked edges: sender, receiver, the score and path patching's number side by side, and a legend."""
    from attnviz.analysis.edges import node_name, receiver_name

    edges = patching.edges
    table = Table(title=f"the top edges by {method_words(edges)}, checked by path patching", title_justify="left")
    for header in ("sender", "receiver", "score", "path patched"):
        table.add_column(header, justify="right", no_wrap=True)
    for edge, score, patched in edges.checked:
        table.add_row(node_name(*edge.sender), receiver_name(edge, edges.grouped), f"{score:+.3f}", f"{patched:+.3f}")
    console.print(table)
    console.print(
        Text(
            "score: the sender's clean − corrupted output times dm/d(receiver input) on the corrupted run"
            + ("" if edges.ig is None else f", the gradient averaged over {edges.ig} inputs between corrupted and clean")
            + "; path patched: the corrupted run with that output added to the receiver's input alone"
            + (", carried there through the norms on the way (post-norm)" if edges.post_norm else "")
            + "; both over m_clean − m_corrupt (edges.json, edges.png)",
            style="dim",
        )
    )

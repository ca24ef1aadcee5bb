"""Terminal tables of every layer's heads (`attnviz stats`, `attnviz layers`): the layer × head grid of labels,
the heads by label, and the rollout's strongest input token per token."""

from __future__ import annotations

import numpy as np
from rich.columns import Columns
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.analysis.statistics import (
    BROAD_THRESHOLD,
    CAUSAL_OVER_BIDIRECTIONAL,
    CLS_TOKEN,
    SEP_TOKEN,
    SHARE_THRESHOLD,
    ModelStatistics,
)
from attnviz.render.terminal import MAX_TOKENS_SHOWN

LABEL_CELLS = {  # label: (its short form in the layer × head grid, style, word in the legend)
    "previous-token": ("prv", "bold cyan", "previous"),
    "next-token": ("nxt", "bold magenta", "next"),
    "same-token": ("slf", "bold green", "same"),
    "[CLS]": ("CLS", "bold yellow", "[CLS]"),
    "[SEP]": ("SEP", "bold red", "[SEP]"),
    "broad": ("brd", "blue", "broad"),
}
UNLABELLED_CELL = ("·", "dim", "none")
MAX_HEADS_PER_LABEL = 10  # in the list of striking heads; stats.csv has them all


def stats_grid(stats: ModelStatistics, width: int = 80, model_causal: bool = False) -> list[Table]:
    """Layers × heads, each cell the head's label in short and colour; heads in blocks that fit width.

    model_causal: the causal mask is a decoder's own, not --causal's over a bidirectional model.
    """
    layer_width = len(f"L{stats.num_layers - 1}")
    head_width = max(3, len(f"H{stats.num_heads - 1}"))
    # A column costs its text, one space either side and a border; the layer column also the left border.
    per_block = max(1, (width - (layer_width + 4)) // (head_width + 3))
    tables = []
    for first in range(0, stats.num_heads, per_block):
        heads = range(first, min(first + per_block, stats.num_heads))
        table = Table(title="head labels by layer" if first == 0 else None, title_justify="left")
        table.add_column("", justify="right", no_wrap=True)
        for head in heads:
            table.add_column(f"H{head}", justify="center", no_wrap=True, min_width=head_width)
        for layer in range(stats.num_layers):
            cells = []
            for head in heads:
                label = stats.label(layer, head)
                short, style, _ = LABEL_CELLS[label] if label else UNLABELLED_CELL
                cells.append(Text(short, style=style))
            table.add_row(f"L{layer}", *cells)
        tables.append(table)
    legend = Text(f"share ≥ {SHARE_THRESHOLD:g}:")
    for label, (short, style, word) in [*LABEL_CELLS.items(), (None, UNLABELLED_CELL)]:
        if label == "broad":
            legend.append(f"\nelse relative entropy ≥ {BROAD_THRESHOLD:g}:")
        legend.append("  ").append(short, style=style).append(f" {word}")
    if stats.causal and not model_causal:
        legend.append(f"\n--causal: {CAUSAL_OVER_BIDIRECTIONAL}")
    tables[-1].caption = legend
    tables[-1].caption_justify = "left"
    return tables


def labelled_heads_table(stats: ModelStatistics) -> Table:
    """For each label, its heads strongest first: which heads look at the previous token, at [SEP]…"""
    table = Table(title="heads by label, strongest first", title_justify="left")
    table.add_column("label", no_wrap=True)
    table.add_column("heads", justify="right", no_wrap=True)
    table.add_column("layer·head = share (broad: relative entropy)")
    for label, heads in stats.labelled_heads().items():
        style = LABEL_CELLS[label][1]
        listed = "  ".join(f"L{layer}·H{head}={value:.2f}" for layer, head, value in heads[:MAX_HEADS_PER_LABEL])
        more = len(heads) - MAX_HEADS_PER_LABEL
        table.add_row(Text(label, style=style), str(len(heads)), listed + (f"  +{more} more" if more > 0 else ""))
    if not table.rows:
        table.add_row("none", "0", "no head passes a threshold")
    return table


def print_rollout(console: Console, tokens: list[str], rollout, causal: bool = False, name: str = "rollout") -> None:
    """For each token after the last layer, the input token it draws on most, and the text's own
    token it draws on most when that is [CLS] or [SEP]: "2 animal→[CLS] 0.64 · animal 0.04".
    name: "rollout", or "flow" for attention flow's map with rows normalised, read the same way."""
    console.print(Text(f"{name}: the input token each token draws on most", style="bold underline"))
    special = np.array([token in (CLS_TOKEN, SEP_TOKEN) for token in tokens])
    cells = []
    for query, token in enumerate(tokens[:MAX_TOKENS_SHOWN]):
        key = int(rollout[query].argmax())
        cell = Text.assemble((f"{query} ", "dim"), (token, "bold"), "→", tokens[key], f" {rollout[query, key]:.2f}")
        word = int(np.where(special, -1.0, rollout[query]).argmax())
        if special[key] and not special[word] and rollout[query, word] > 0:  # causal [CLS] sees no word
            cell.append(f" · {tokens[word]} {rollout[query, word]:.2f}", style="dim")
        cells.append(cell)
    if len(tokens) > MAX_TOKENS_SHOWN:
        cells.append(Text(f"… {len(tokens) - MAX_TOKENS_SHOWN} more", style="dim"))
    console.print(Columns(cells, padding=(0, 2)))
    legend = "index token→input token share; after ·, the text's own token it draws on most, when the first is [CLS] or [SEP]"
    if causal:
        legend += f"\n--causal: {CAUSAL_OVER_BIDIRECTIONAL}"
    console.print(Text(legend, style="dim"))

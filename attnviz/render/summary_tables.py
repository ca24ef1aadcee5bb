"""Terminal tables of every head summarised (`attnviz layers`): the sink share and the relative entropy as
layers × heads grids, with each layer's sink fraction; the other summaries are in summaries.json."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.analysis.head_summaries import SINK_PAPER, SINK_THRESHOLD, SUMMARIES, LayerSummaries

TABLE_SUMMARIES = ("sink", "relative_entropy")
MAX_LAYERS_SHOWN = 40  # rows of a grid; every layer is in summaries.json


def summary_grid(summaries: LayerSummaries, name: str, width: int = 80) -> list[Table]:
    """Layers × heads of one summary, two decimals a cell; heads in blocks that fit width. The sink's grid
    ends each row with the layer's fraction of heads over the threshold, and shows those heads bold."""
    values = summaries.values[name]
    sink = name == "sink"
    return layer_head_grid(
        values, f"{SUMMARIES[name][0]} by layer and head", width, 2, "summaries.json",
        marked=values > SINK_THRESHOLD if sink else None,
        last_column=(f">{SINK_THRESHOLD:g}", [f"{fraction:.0%}" for fraction in summaries.sink_fraction]) if sink else None,
    )  # fmt: skip


def print_effects(console: Console, effects) -> None:
    """Each head's first effect (a decoder's KL, an encoder's cosine distance) when taken out (`layers --effect`), a
    layers × heads grid; the others are in effects.json and effects.png."""
    from attnviz.render.terminal import effect_columns, effects_legend

    shorts = effect_columns(effects)
    title = f"{shorts[0]} when the head is taken out, by layer and head"
    for table in layer_head_grid(effects.values[effects.names[0]], title, console.width, 4, "effects.json"):
        console.print(table)
    console.print(Text(effects_legend(effects) + f"; every layer's {' and '.join(shorts)}: effects.json, effects.png"))


def print_differences(console: Console, differences) -> None:
    """`attnviz diff`: the JS distance of every layer × head's two maps as a grid, the most changed heads, a legend."""
    from attnviz.analysis.diff import against_words

    title = f"JS distance by layer and head, {against_words(differences)}"
    for table in layer_head_grid(differences.values["js"], title, console.width, 3, "diff.json"):
        console.print(table)
    js, clark = differences.values["js"], differences.values["clark"]
    most = [f"layer {layer} head {head} (JS {js[layer, head]:.3f}, Clark {clark[layer, head]:.2f})" for layer, head in differences.top]
    console.print(Text("most changed: " + ", ".join(most)))
    console.print(
        Text(
            "JS: the Jensen-Shannon distance of the two maps' rows (0 the same, 1 no key in common), mean over the "
            "queries; Clark: Clark et al.'s divergence, the JSD in bits summed over the queries (diff.json, diff.png)",
            style="dim",
        )
    )


def layer_head_grid(values, title: str, width: int, decimals: int, file: str, marked=None, last_column=None) -> list[Table]:
    """Layers × heads of values (L, H), `decimals` a cell, the heads in blocks of columns that fit width; at most
    MAX_LAYERS_SHOWN rows, the rest said to be in `file`. marked (L, H) bools shows those cells bold; last_column,
    (its header, a text per layer), ends the last block's rows."""
    num_layers, num_heads = values.shape
    label = len(f"L{num_layers - 1}")
    cell = decimals + 2  # "0.00"
    # A column takes its cell, its padding (2) and its rule (1); the layers' column its label and both edges' rules.
    per_block = max(1, (width - (label + 4) - (7 if last_column else 0)) // (cell + 3))
    tables = []
    for first in range(0, num_heads, per_block):
        heads = range(first, min(first + per_block, num_heads))
        table = Table(title=title if first == 0 else None, title_justify="left")
        table.add_column("", justify="right", no_wrap=True, min_width=label)
        for head in heads:
            table.add_column(f"H{head}", justify="right", no_wrap=True, min_width=cell)
        last_block = first + per_block >= num_heads
        if last_column and last_block:
            table.add_column(last_column[0], justify="right", no_wrap=True)
        for layer in range(min(num_layers, MAX_LAYERS_SHOWN)):
            cells = [
                Text(f"{values[layer, head]:.{decimals}f}", style="bold yellow" if marked is not None and marked[layer, head] else "")
                for head in heads
            ]
            if last_column and last_block:
                cells.append(Text(last_column[1][layer], style="bold"))
            table.add_row(f"L{layer}", *cells)
        tables.append(table)
    if num_layers > MAX_LAYERS_SHOWN:
        tables[-1].caption = f"… {num_layers - MAX_LAYERS_SHOWN} more layers in {file}"
        tables[-1].caption_justify = "left"
    return tables


def print_summaries(console: Console, summaries: LayerSummaries) -> None:
    """The sink and relative-entropy grids, and the model's sink fraction with its source."""
    for name in TABLE_SUMMARIES:
        for table in summary_grid(summaries, name, console.width):
            console.print(table)
    first = summaries.shown_tokens[0]
    console.print(
        Text(
            f"sink: share on the first token ({first}); {summaries.model_sink_fraction:.0%} of all heads exceed "
            f"ε = {SINK_THRESHOLD:g} ({SINK_PAPER}); distance, local band, previous token and "
            "each head's most-attended keys: summaries.json",
            style="dim",
        )
    )

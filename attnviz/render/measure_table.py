"""The terminal's table of --measure: each key's share of each measure's map, beside the weights'."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.render.measure_figures import measure_panels
from attnviz.render.terminal import indexed
from attnviz.run_data import AttentionRun

MAX_MEASURE_KEYS = 16  # rows of the measures table; attention.json has every key


def print_measures(console: Console, run: AttentionRun, measures) -> None:
    """--measure: each key's share of each measure's map (its column's sum over the map's total), side by side,
    so that where the measures disagree with the weights shows at a glance ([CLS], [SEP], punctuation)."""
    panels = measure_panels(run, measures)
    shares = {name: panel.values.sum(axis=0) / max(float(panel.values.sum()), 1e-300) for name, panel in panels.items()}
    keys = range(len(run.key_tokens))
    if len(run.key_tokens) > MAX_MEASURE_KEYS:  # the keys some measure gives most
        keys = sorted(sorted(keys, key=lambda key: -max(share[key] for share in shares.values()))[:MAX_MEASURE_KEYS])
    table = Table(title="each key's share of each measure's map, %", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("key")
    for panel in panels.values():
        table.add_column(panel.title, justify="right")
    for key in keys:
        table.add_row(indexed(key, run.shown_tokens[1][key]), *(f"{100 * share[key]:.1f}" for share in shares.values()))
    console.print(table)
    more = len(run.key_tokens) - len(keys)
    legend = "weights averaged over heads; norm summed over heads; value zeroing and flow with rows normalised"
    console.print(Text(legend + (f"; {more} more keys in attention.json" if more > 0 else ""), style="dim"))

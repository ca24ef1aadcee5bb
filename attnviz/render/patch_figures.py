"""`attnviz patch`'s figures and table: patch.png (every layer × head's patching score on a scale centred on 0, the
direct logit attribution beside it), patch_positions.png (the most affecting heads patched one position at a
time) and the terminal's most affecting heads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.render.cell_values import cell_text
from attnviz.render.heatmap import check_format, new_figure, save_figure
from attnviz.render.summary_figures import _title, grids_figure
from attnviz.render.titles import quoted

MOST_SHOWN = 10  # the terminal's most affecting heads
DIRECTION = "each head's part from the clean run patched into the corrupted run"  # never the other way round
MAX_LABELLED_TOKENS = 48  # patch_positions.png names the tokens and writes each score up to this many tokens
PANEL_TITLES = {
    "out": "output patched: normalised score (0 none, 1 restored)",
    "q": "query patched: normalised score",
    "k": "key patched (its key/value head): normalised score",
    "v": "value patched (its key/value head): normalised score",
    "pattern": "map patched (clean map, corrupted values): score",
}


def metric_words(patching) -> str:
    """'m = logit(' Mary') − logit(' John') at position 13 (' to'): 3.21 clean, −1.05 corrupted'."""
    read = patching.shown[0][patching.position] if patching.shown[0] else patching.tokens[patching.position]
    return (
        f"m = logit({patching.answer!r}) − logit({patching.wrong!r}) at position {patching.position} ({quoted(read, 16)}): "
        f"{patching.clean:.3f} clean, {patching.corrupt:.3f} corrupted"
    )


def changed_words(patching, most: int = 3) -> str:
    """Where the corrupted text differs: "token 9 ' John' → ' Mary'" (the first few)."""
    changed = [(i, a, b) for i, (a, b) in enumerate(zip(*patching.shown)) if a != b]
    words = ", ".join(f"token {i} {quoted(a, 16)} → {quoted(b, 16)}" for i, a, b in changed[:most])
    return words + (f" and {len(changed) - most} more" if len(changed) > most else "")


def patching_figure(patching, seed: int | None = None):
    """patch.png: a grid per component patched and the direct attribution (logit units) beside, all centred on 0."""
    panels = [(PANEL_TITLES[name], values, True) for name, values in patching.scores.items()]
    if patching.direct is not None:
        panels.append(("direct logit attribution, clean run (logit units)", patching.direct, True))
    notes = [f"{DIRECTION} (the corrupted text: {changed_words(patching)}); {metric_words(patching)}: rows layers, columns heads"]
    return grids_figure(panels, len(patching.tokens), notes, None, seed, _Titled(patching))


def positions_figure(patching, seed: int | None = None):
    """patch_positions.png: a row per most affecting head, its output patched at one position at a time (the score),
    the tokens below (clean→corrupted where they differ), on a scale centred on 0."""
    heads = list(patching.per_position)
    values = np.stack([patching.per_position[head] for head in heads])  # (K, N)
    figure = new_figure((max(6.0, 0.45 * values.shape[1] + 2.0), 0.6 * len(heads) + 2.6))
    ax = figure.add_subplot(1, 1, 1)
    top = max(float(np.abs(values).max()), 1e-9)
    image = ax.imshow(values, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto", interpolation="nearest")
    figure.colorbar(image, ax=ax, shrink=0.85)
    labels = [a if a == b else f"{a}→{b}" for a, b in zip(*patching.shown)]
    if len(labels) <= MAX_LABELLED_TOKENS:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        for (row, column), value in np.ndenumerate(values):
            ax.text(column, row, cell_text(value), ha="center", va="center", fontsize=5)
    ax.set_yticks(range(len(heads)), [f"L{layer} H{head}" for layer, head in heads], fontsize=7)
    notes = [f"each head's output from the clean run patched into the corrupted run at one position alone; {metric_words(patching)}"]
    _title(figure, [f"the {len(heads)} most affecting heads", f"{len(labels)} tokens"], notes, None, seed, _Titled(patching))
    return figure


def write_patching_figures(patching, out_dir: Path, fmt: str = "png") -> list[Path]:
    """Write patch.<fmt> and, with per-position scores, patch_positions.<fmt>."""
    check_format(fmt)
    written = [save_figure(patching_figure(patching), out_dir, f"patch.{fmt}")]
    if patching.per_position:
        written.append(save_figure(positions_figure(patching), out_dir, f"patch_positions.{fmt}"))
    return written


class _Titled:
    """What a title reads of the numbers: the model, the clean text, causal."""

    def __init__(self, patching):
        self.model, self.text, self.causal = patching.model, patching.text, patching.causal


def print_patching(console: Console, patching) -> None:
    """The metric of both texts, the most affecting heads with their scores and direct attribution, a legend."""
    from attnviz.analysis.attribution import NO_DIRECT
    from attnviz.analysis.patching import SCORE_NAMES

    console.print(Text(f"{DIRECTION}; {metric_words(patching)}"))
    table = Table(title="most affecting heads", title_justify="left")
    for header in ("layer", "head", *(SCORE_NAMES[name] for name in patching.scores), "direct"):
        table.add_column(header, justify="right", no_wrap=True)
    for layer, head in patching.top[:MOST_SHOWN]:
        direct = "–" if patching.direct is None else f"{patching.direct[layer, head]:+.3f}"
        table.add_row(str(layer), str(head), *(f"{values[layer, head]:+.3f}" for values in patching.scores.values()), direct)
    console.print(table)
    console.print(
        Text(
            "score: (m_patched − m_corrupt) / (m_clean − m_corrupt), the corrupted run with the head's part from the "
            "clean run (0 no effect, 1 the clean answer restored); "
            + (NO_DIRECT if patching.direct is None else "direct: the head's output at the position read through W_o, "
               "the final norm (its clean scale) and W_U[answer] − W_U[wrong], logit units")
            + " (patch.json, patch.png)",
            style="dim",
        )
    )

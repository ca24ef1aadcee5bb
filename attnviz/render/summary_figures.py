"""summaries.png: every head of every layer summarised (analysis/head_summaries.py), one panel per summary.

Each panel is a layers × heads grid, a row per layer and a column per head, coloured by that head's
value: the shares and the relative entropy on a fixed 0..1 scale, the mean distance from 0 to its
largest value (in tokens). The figure's size does not grow with the text, the layers or the heads.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attnviz.analysis.head_summaries import SINK_THRESHOLD, SUMMARIES, LayerSummaries
from attnviz.render.cell_values import cell_text
from attnviz.render.heatmap import check_format, new_figure, save_figure
from attnviz.render.scales import COLORMAP
from attnviz.render.titles import chars_across, counted, effect_decimals, figure_title, run_title

COLUMNS = 3  # panels per row
PANEL_INCHES = (4.4, 3.6)  # each panel with its colour bar
MAX_NUMBERED_CELLS = (12, 16)  # a grid of at most 12 layers × 16 heads shows each value in its cell
MAX_AXIS_LABELS = 16  # head labels per axis; more are thinned to every k-th
MIN_LABEL_POINTS = 4.5  # the smallest layer label; rows thinner than that are labelled every k-th


def summary_panel_title(name: str, summaries: LayerSummaries) -> str:
    what = SUMMARIES[name][0]
    if name == "sink":
        return f"{what}: share on {summaries.shown_tokens[0]}, > {SINK_THRESHOLD:g} in {summaries.model_sink_fraction:.0%} of heads"
    if name == "last":
        return f"{what}: share on {summaries.shown_tokens[-1]}"
    if name == "local":
        return f"{what}: |i − j| ≤ {summaries.window}"
    if name == "distance":
        return f"{what} (tokens)"
    return what


def summaries_figure(summaries: LayerSummaries, run=None, seed: int | None = None, name: str = "summaries.png"):
    """The Figure of write_summaries_figure; run (an AttentionRun of the text, when there is one) gives the title's setup."""
    names = list(SUMMARIES)
    rows = -(-len(names) // COLUMNS)
    figure = new_figure((COLUMNS * PANEL_INCHES[0], rows * PANEL_INCHES[1] + 1.0))
    num_layers, num_heads = summaries.values["sink"].shape
    numbered = num_layers <= MAX_NUMBERED_CELLS[0] and num_heads <= MAX_NUMBERED_CELLS[1]
    for index, summary in enumerate(names):
        ax = figure.add_subplot(rows, COLUMNS, index + 1)
        values = summaries.values[summary]
        top = 1.0 if summary != "distance" else max(float(values.max()), 1e-9)
        image = ax.imshow(values, cmap=COLORMAP, vmin=0.0, vmax=top, aspect="auto", interpolation="nearest")
        figure.colorbar(image, ax=ax, shrink=0.85)
        ax.set_title(summary_panel_title(summary, summaries), fontsize=9, parse_math=False)
        _label_axes(ax, num_layers, num_heads)
        if numbered:
            for (layer, head), value in np.ndenumerate(values):
                colour = "black" if value > 0.6 * top else "white"
                ax.text(head, layer, cell_text(value, 2 if summary != "distance" else 1), ha="center", va="center", fontsize=6, color=colour)
        if summary == "sink" and not numbered:  # the heads past the threshold, marked
            layers, heads = np.nonzero(values > SINK_THRESHOLD)
            ax.scatter(heads, layers, s=4, c="white", marker=".", linewidths=0)
    scope = [f"{counted(num_layers, 'layer')} × {counted(num_heads, 'head')}", counted(len(summaries.tokens), "token")]
    notes = ["every head summarised: rows layers, columns heads"]
    _title(figure, scope, notes, run, seed, summaries)
    return figure


def _title(figure, scope: list[str], notes: list[str], run, seed: int | None, numbers) -> None:
    """A layers × heads figure's title: its run's (model, text, mask, parameters) when there is a run, else that of
    its numbers (LayerSummaries, HeadEffects: their model, text and causal)."""
    line_chars = chars_across(figure.get_figwidth())
    if run is not None:
        title = run_title(run, scope, seed=seed, notes=notes, line_chars=line_chars, over_words=False)
    else:
        title = figure_title(numbers.model, scope, text=numbers.text, causal=numbers.causal, seed=seed, notes=notes, line_chars=line_chars)
    figure.suptitle(title, parse_math=False)


def effects_figure(effects, run=None, seed: int | None = None):
    """effects.png (`layers --effect`): each head's effects when taken out (a decoder's KL and loss change, an
    encoder's cosine distances), a layers × heads grid each; the loss change on a scale centred on 0 (red: the text
    predicted worse without the head, blue: better), the others from 0."""
    from attnviz.analysis.effect import TAKEN_OUT

    panel_titles = {
        "kl": "KL(p ‖ q) of the next-token distributions (nats)",
        "loss": f"loss change (nats per token; {effects.loss:.3f} with every head)" if effects.loss is not None else "",
        "cosine": "cosine distance of each token's last hidden state, mean",
        "pooled": f"cosine distance of the sentence embedding ({effects.pooling} pooling)",
    }
    panels = [(panel_titles[name], effects.values[name], name == "loss") for name in effects.names]
    notes = [f"each head taken out (its output {TAKEN_OUT[effects.ablation]}), the model run again: rows layers, columns heads"]
    return grids_figure(panels, len(effects.tokens), notes, run, seed, effects)


def grids_figure(panels: list[tuple[str, np.ndarray, bool]], num_tokens: int, notes: list[str], run, seed: int | None, numbers):
    """One layers × heads grid per panel (its title, its (L, H) values, whether on a scale centred on 0: red above,
    blue below; else from 0 to its largest value), each value in its cell when the grid is small enough; titled
    as _title says (numbers: what has a model, a text and causal)."""
    figure = new_figure((len(panels) * PANEL_INCHES[0], PANEL_INCHES[1] + 1.0))
    num_layers, num_heads = panels[0][1].shape
    numbered = num_layers <= MAX_NUMBERED_CELLS[0] and num_heads <= MAX_NUMBERED_CELLS[1]
    for index, (title, values, centred) in enumerate(panels):
        ax = figure.add_subplot(1, len(panels), index + 1)
        top = max(float(np.nanmax(np.abs(values))), 1e-9)
        if centred:
            image = ax.imshow(values, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto", interpolation="nearest")
        else:
            image = ax.imshow(values, cmap=COLORMAP, vmin=0.0, vmax=top, aspect="auto", interpolation="nearest")
        ax.set_title(title, fontsize=9, parse_math=False)
        figure.colorbar(image, ax=ax, shrink=0.85)
        _label_axes(ax, num_layers, num_heads)
        if numbered:
            decimals = effect_decimals(values)
            for (layer, head), value in np.ndenumerate(values):
                colour = "black" if centred or value > 0.6 * top else "white"
                ax.text(head, layer, cell_text(value, decimals), ha="center", va="center", fontsize=5, color=colour)
    scope = [f"{counted(num_layers, 'layer')} × {counted(num_heads, 'head')}", counted(num_tokens, "token")]
    _title(figure, scope, notes, run, seed, numbers)
    return figure


def write_effects_figure(effects, out_dir: Path, fmt: str = "png", run=None, seed: int | None = None) -> Path:
    """Write effects.<fmt>: each head's effects when taken out, layers × heads."""
    check_format(fmt)
    return save_figure(effects_figure(effects, run, seed), out_dir, f"effects.{fmt}")


def _label_axes(ax, num_layers: int, num_heads: int) -> None:
    """Every layer's row labelled (L0, L1, ...), the labels' size fitted to the rows' height (at most 7 points), so that no head sits on an unlabelled row; rows too thin for MIN_LABEL_POINTS labelled every k-th.
    The heads' columns: at most MAX_AXIS_LABELS labels."""
    figure = ax.get_figure()
    row_points = ax.get_position().height * figure.get_figheight() * 72 / num_layers  # before the layout's titles: ×0.75
    size = min(7.0, 0.75 * row_points)
    layer_step = 1 if size >= MIN_LABEL_POINTS else math.ceil(MIN_LABEL_POINTS / (0.75 * row_points))
    head_step = -(-num_heads // MAX_AXIS_LABELS)
    layers = range(0, num_layers, layer_step)
    ax.set_yticks(layers, [f"L{layer}" for layer in layers], fontsize=max(size, MIN_LABEL_POINTS))
    ax.set_xticks(range(0, num_heads, head_step), [f"H{head}" for head in range(0, num_heads, head_step)], fontsize=7)
    ax.tick_params(length=0)


def write_summaries_figure(summaries: LayerSummaries, out_dir: Path, fmt: str = "png", run=None, seed: int | None = None) -> Path:
    """Write summaries.<fmt>: a layers × heads grid per summary."""
    check_format(fmt)
    name = f"summaries.{fmt}"
    return save_figure(summaries_figure(summaries, run, seed, name), out_dir, name)

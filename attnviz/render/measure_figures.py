"""The figures of --measure: what attention weights leave out, beside the weights (analysis/measures.py).

    norm_heads.png   Kobayashi et al.'s ‖α^h_ij f^h(x_j)‖, one panel per head on one linear scale
                     from 0 to the layer's largest norm, so that heads compare
    norm.png         ‖Σ_h α^h_ij f^h(x_j)‖: what key j adds to token i's output through every head
    value_zeroing.png  Mohebbi et al.'s cosine distances, rows divided by their sums
    flow.png         Abnar & Zuidema's attention flow through layers 0 to the run's, rows divided by their sums
    measures.png     --measure all: the four side by side (weights averaged over heads, norm, value
                     zeroing, flow), each on its own linear scale from 0 to its largest value

and for attnviz layers --measure, every layer's: norm_layers.png, value_zeroing_layers.png, and
flow.png, the flow through every layer beside the rollout through them.

Norms are in the hidden state's units and rows do not sum to 1, so no map here uses the weights'
fixed 0..1 (or log) scale: each colour bar says what it shows and runs from 0 to its own maximum.
Each title names the measure, its paper and what a cell is.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np

from attnviz.render.heatmap import (
    MAX_GRID_TICK_LABELS,
    MAX_TICK_LABELS,
    check_format,
    freeze_layout,
    grid_shape,
    label_tokens,
    masked_attention,
    new_figure,
    save_figure,
)
from attnviz.render.scales import attention_colorbar, capped_size, draw_attention, scale_label, show_attention
from attnviz.render.titles import chars_across, counted, run_title
from attnviz.run_data import AttentionRun


class Panel(NamedTuple):
    """One map of a measure figure: its title above it, its values (Nq, Nk), its colour bar's label, and
    the long title of the figure it has alone (what a cell is)."""

    title: str
    values: np.ndarray
    colour: str
    about: str = ""


def write_measure_figures(run: AttentionRun, measures, out_dir: Path, fmt: str = "png", seed: int | None = None) -> list[Path]:
    """The figures of the measures asked for (measures: analysis.measures.RunMeasures); their paths."""
    check_format(fmt)
    out_dir = Path(out_dir)
    written = []
    if measures.norm_heads is not None:
        heads = [Panel(f"head {head}", values, "") for head, values in enumerate(measures.norm_heads)]
        figure = maps_figure(run, heads, NORM_HEADS_TITLE, seed, shared_colour="‖α f(x)‖ (hidden-state units)")
        written.append(save_figure(figure, out_dir, f"norm_heads.{fmt}"))
    panels = measure_panels(run, measures)
    for name, panel in panels.items():
        if name != "weights":
            figure = maps_figure(run, [panel._replace(title="")], f"{panel.title}: {panel.about}", seed)
            written.append(save_figure(figure, out_dir, f"{name}.{fmt}"))
    if len(measures.names) == 3:  # --measure all
        written.append(save_figure(side_by_side_figure(run, measures, seed), out_dir, f"measures.{fmt}"))
    return written


def side_by_side_figure(run: AttentionRun, measures, seed: int | None = None):
    """The weights averaged over heads beside each measure asked for (measures.png with all four)."""
    panels = list(measure_panels(run, measures).values())
    return maps_figure(run, panels, f"what the weights leave out: {len(panels)} maps side by side", seed)


NORM_HEADS_TITLE = "norm ‖α^h_ij f^h(x_j)‖ per head (Kobayashi et al. 2020)"


def measure_panels(run: AttentionRun, measures) -> dict[str, Panel]:
    """Each measure's one map, named by its file: weights averaged over heads, then the measures asked for."""
    mean_weights = run.attention.astype(np.float64).mean(axis=0)
    panels = {"weights": Panel("weights α, heads averaged", mean_weights, "attention weight", "rows sum to 1")}
    if measures.norm is not None:
        panels["norm"] = Panel(
            "norm (Kobayashi et al. 2020)", measures.norm, "‖Σ_h α f(x)‖ (hidden-state units)",
            "‖Σ_h α^h_ij f^h(x_j)‖, what key j adds to i's output through every head",
        )  # fmt: skip
    if measures.value_zeroing_rows is not None:
        panels["value_zeroing"] = Panel(
            "value zeroing (Mohebbi et al. 2023)", measures.value_zeroing_rows, "share of the row's distance",
            "cosine distance of i's layer output with j's value vectors zeroed, rows normalised",
        )  # fmt: skip
    if measures.flow is not None:
        layers = "layer 0" if measures.flow_layers == 1 else f"layers 0-{measures.flow_layers - 1}"
        panels["flow"] = Panel(
            f"flow, {layers} (Abnar & Zuidema 2020)", measures.flow.normalised, "share of the row's flow",
            f"maximum flow from i after layer {measures.flow_layers - 1} down to input j, rows normalised",
        )  # fmt: skip
    return panels


def maps_figure(
    run: AttentionRun,
    panels: list[Panel],
    what: str,
    seed: int | None = None,
    shared_colour: str | None = None,
    scope: list[str] | None = None,
):
    """Panels of (Nq, Nk) maps over the run's tokens (or words) in a grid, each on a linear scale from 0
    to its own maximum, or, with shared_colour, all on one scale with one colour bar so that they compare.
    scope: what the title's first line names after the model (default: the run's layer and heads)."""
    from matplotlib.colors import Normalize

    num_queries, num_keys = panels[0].values.shape
    num_rows, num_columns = grid_shape(len(panels))
    panel_inches = float(np.clip(1.6 + 0.12 * max(num_queries, num_keys), 2.8, 5.0 if len(panels) == 1 else 3.6))
    size = capped_size((num_columns * (panel_inches + (0 if shared_colour else 1.0)) + 2.0, num_rows * panel_inches + 2.0))
    figure = new_figure(size)
    axes = figure.subplots(num_rows, num_columns, squeeze=False)
    top = max(float(np.max(panel.values)) for panel in panels)
    max_labels = MAX_TICK_LABELS if len(panels) == 1 else MAX_GRID_TICK_LABELS
    drawn = []
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.set_visible(False)
            continue
        panel = panels[index]
        values = masked_attention(panel.values, run.causal)
        norm = Normalize(0.0, (top if shared_colour else float(np.max(panel.values))) or 1.0)
        image = draw_attention(ax, values, norm)
        colorbar = None if shared_colour else attention_colorbar(figure, image, panel.colour, ax=ax, shrink=0.8)
        drawn.append((image, values, colorbar, panel.colour))
        ax.set_title(panel.title, fontsize=9 if len(panels) == 1 else 8, wrap=True, parse_math=False)
        outer_keys, outer_queries = index + num_columns >= len(panels), index % num_columns == 0
        label_tokens(
            ax, run.shown_tokens[1] if outer_keys else [], run.shown_tokens[0] if outer_queries else [], max_labels, 7 if len(panels) > 1 else 9
        )
    if shared_colour:
        shared_bar = attention_colorbar(figure, drawn[0][0], shared_colour, ax=axes, shrink=0.6)
    scope = scope or [f"layer {run.layer}", counted(run.num_heads, "head")]
    what = "\n".join(textwrap.wrap(what, chars_across(size[0])))  # a measure's definition may be wider than the figure
    figure.suptitle(f"{what}\n{run_title(run, scope, seed=seed, line_chars=chars_across(size[0]))}", parse_math=False)
    figure.supxlabel("key")
    figure.supylabel("query")
    freeze_layout(figure)
    # Fitted to the frozen axes: one value per pixel, or the block maximum when pooled, which each bar says.
    pools = [show_attention(image, values) for image, values, _, _ in drawn]
    for (image, _, colorbar, colour), pool in zip(drawn, pools):
        if colorbar is not None:
            colorbar.set_label(scale_label(colour, image.norm, pool))
    if shared_colour:
        shared_bar.set_label(scale_label(shared_colour, drawn[0][0].norm, max(pools)))
    return figure


def write_layers_measure_figures(
    layer_runs: list[AttentionRun], rollout: np.ndarray, measures, out_dir: Path, fmt: str = "png", seed: int | None = None
) -> list[Path]:
    """attnviz layers' figures of the measures asked for (measures: analysis.measures.LayersMeasures); their paths."""
    check_format(fmt)
    run = layer_runs[0]
    every_layer = [f"every layer ({len(layer_runs)})", counted(run.num_heads, "head")]
    figures = {}
    if measures.norm is not None:
        panels = [Panel(f"layer {layer}", values, "‖Σ_h α f(x)‖") for layer, values in enumerate(measures.norm)]
        what = "norm ‖Σ_h α^h_ij f^h(x_j)‖ of each layer, heads summed (Kobayashi et al. 2020)"
        figures["norm_layers"] = maps_figure(run, panels, what, seed, scope=every_layer)
    if measures.value_zeroing_rows is not None:
        panels = [Panel(f"layer {layer}", values, "share of the row") for layer, values in enumerate(measures.value_zeroing_rows)]
        what = "value zeroing of each layer, rows normalised (Mohebbi et al. 2023)"
        figures["value_zeroing_layers"] = maps_figure(run, panels, what, seed, scope=every_layer)
    if measures.flow is not None:
        panels = [
            Panel("rollout: the paths' weights multiplied", rollout, "share of the input token"),
            Panel("flow: the paths as pipes, rows normalised", measures.flow.normalised, "share of the row's flow"),
        ]
        what = f"attention flow (Abnar & Zuidema 2020) beside rollout, through {counted(len(layer_runs), 'layer')}"
        figures["flow"] = maps_figure(run, panels, what, seed, scope=every_layer)
    return [save_figure(figure, out_dir, f"{name}.{fmt}") for name, figure in figures.items()]

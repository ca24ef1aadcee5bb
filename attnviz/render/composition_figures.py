"""`attnviz compose`'s figure: compose.png, three panels (Q, K, V), sender layer × receiver layer, each cell the
strongest head pair's composition score above its kind's baseline."""

from __future__ import annotations

import numpy as np

from attnviz.render.heatmap import new_figure
from attnviz.render.scales import COLORMAP, MASKED_COLOR
from attnviz.render.titles import short_model_name

PANEL_INCHES = 4.2  # each panel's side, whatever the layers: a deep model gets smaller cells
MAX_NUMBERED_LAYERS = 12  # up to this many layers, each cell shows its number
NAMES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}


def compositions_figure(compositions, model: str):
    """The figure of analysis.compositions.Compositions; model names it in the title."""
    from matplotlib.colors import Normalize

    from attnviz.analysis.compositions import KINDS

    panels = {kind: compositions.strongest(kind) for kind in KINDS}  # each (L, L), NaN where no pair
    values = np.concatenate([panel[~np.isnan(panel)] for panel in panels.values()])
    norm = Normalize(min(0.0, values.min()), max(values.max(), 1e-9)) if values.size else Normalize(0, 1)
    figure = new_figure((3 * PANEL_INCHES + 1.2, PANEL_INCHES + 1.3))
    axes = figure.subplots(1, 3)
    colormap = _colormap()
    for ax, kind in zip(axes, KINDS):
        panel = panels[kind]
        image = ax.imshow(np.ma.masked_invalid(panel), cmap=colormap, norm=norm, interpolation="nearest")
        layers = panel.shape[0]
        ax.set_title(f"{NAMES[kind]} (baseline {compositions.baseline[kind]:.3f})", fontsize=10)
        ax.set_xlabel("receiver layer")
        ax.set_ylabel("sender layer")
        ticks = np.arange(0, layers, max(1, layers // 10))
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        if layers <= MAX_NUMBERED_LAYERS:
            for sender, receiver in zip(*np.nonzero(~np.isnan(panel))):
                value = panel[sender, receiver]
                ink = "black" if norm(value) > 0.6 else "white"  # viridis is light at its top
                ax.text(receiver, sender, f"{value:.2f}", ha="center", va="center", fontsize=7, color=ink)
    figure.colorbar(image, ax=list(axes), label="strongest head pair's score − baseline", shrink=0.9)
    folded = "norms folded" if compositions.norms_folded else "raw weights (no norm before attention)"
    figure.suptitle(f"{short_model_name(model)} · compositions from the weights (Elhage et al. 2021) · {folded}\n"
                    f"baseline: mean of {compositions.baseline_draws} Gaussian draws per kind", fontsize=10)  # fmt: skip
    return figure


def _colormap():
    from matplotlib import colormaps

    return colormaps[COLORMAP].with_extremes(bad=MASKED_COLOR)  # no pair: the sender's layer is not before the receiver's

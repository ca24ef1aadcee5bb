"""`attnviz diff`'s figures: diff.png, every layer × head's distance between two checkpoints' maps, and
diff_heads.png, the most changed heads' two maps side by side with their difference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.render.heatmap import check_format, new_figure, save_figure
from attnviz.render.scales import MASKED_COLOR, attention_colormap
from attnviz.render.summary_figures import _title, grids_figure
from attnviz.render.titles import short_model_name

MAX_LABELLED_TOKENS = 32  # a map with at most this many tokens names them on its axes


def differences_figure(differences, seed: int | None = None):
    """diff.png: the Jensen-Shannon distance and Clark et al.'s divergence of every layer × head's two maps."""
    from attnviz.analysis.diff import against_words

    panels = [
        ("Jensen-Shannon distance, mean over the queries (0 to 1)", differences.values["js"], False),
        ("Clark et al.'s divergence: JSD summed over the queries (bits)", differences.values["clark"], False),
    ]
    notes = [f"{against_words(differences)}: rows layers, columns heads"]
    return grids_figure(panels, len(differences.tokens), notes, None, seed, differences)


def most_changed_figure(differences, seed: int | None = None):
    """diff_heads.png: a row per most changed head (HeadDifferences.top, with maps): the model's map, the other's,
    and the other's minus the model's on a scale centred on 0 (red: more weight on the other side); a causal
    map's future grey, as in every map."""
    import matplotlib

    from attnviz.analysis.diff import RANDOM, against_words

    heads = [head for head in differences.top if head in differences.maps]
    figure = new_figure((12.0, 3.6 * len(heads) + 1.0))
    names = [short_model_name(differences.model), "random" if differences.against == RANDOM else short_model_name(differences.against)]
    tokens = differences.shown_tokens
    labelled = len(tokens) <= MAX_LABELLED_TOKENS
    future = np.triu(np.ones((len(tokens), len(tokens)), dtype=bool), k=1) if differences.causal else False  # grey
    for row, (layer, head) in enumerate(heads):
        ours, theirs = differences.maps[layer, head]
        distance = differences.values["js"][layer, head]
        change = theirs - ours
        reach = max(float(np.abs(change).max()), 1e-9)
        diverging = matplotlib.colormaps["RdBu_r"].with_extremes(bad=MASKED_COLOR)
        for column, (values, title, options) in enumerate((
            (ours, names[0], dict(cmap=attention_colormap(), vmin=0.0, vmax=1.0)),
            (theirs, names[1], dict(cmap=attention_colormap(), vmin=0.0, vmax=1.0)),
            (change, f"{names[1]} − {names[0]}", dict(cmap=diverging, vmin=-reach, vmax=reach)),
        )):  # fmt: skip
            ax = figure.add_subplot(len(heads), 3, 3 * row + column + 1)
            image = ax.imshow(np.ma.masked_array(values, future), aspect="auto", interpolation="nearest", **options)
            figure.colorbar(image, ax=ax, shrink=0.85)
            ax.set_title(f"layer {layer} · head {head} · {title}" + (f" · JS {distance:.3f}" if column == 2 else ""), fontsize=9, parse_math=False)
            if labelled:
                ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
                ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
            else:
                ax.tick_params(labelsize=6)
    scope = [f"the {len(heads)} most changed heads", f"{len(tokens)} tokens"]
    _title(figure, scope, [f"{against_words(differences)}: rows queries, columns keys"], None, seed, differences)
    return figure


def write_differences_figures(differences, out_dir: Path, fmt: str = "png", seed: int | None = None) -> list[Path]:
    """Write diff.<fmt> and, when the most changed heads' maps were kept (a text short enough), diff_heads.<fmt>."""
    check_format(fmt)
    written = [save_figure(differences_figure(differences, seed), out_dir, f"diff.{fmt}")]
    if differences.maps:
        written.append(save_figure(most_changed_figure(differences, seed), out_dir, f"diff_heads.{fmt}"))
    return written

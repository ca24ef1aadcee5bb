"""What `attnviz heads` draws of a layer, checked before the work: head (one head's heatmap, the model's numbering),
window (a region of a head's map at full resolution) and figures (which heatmaps: output/batch.py's FIGURES).

attnviz.heads and attnviz.heads_file check them here, and the command line through them: a bad --head, --window or
--figures is one line before the model loads, or, for a head past the model's own count, once it has loaded and
before any layer is computed. Messages spell the options as the face in use does (errors.option).
"""

from __future__ import annotations

from attnviz.api.arguments import must_be_int, must_be_one_of, refuse
from attnviz.errors import AttnvizError, option, options_named


def check_drawing(head=None, window=None, figures=None, heads: int | None = None) -> None:
    """Before the model loads: head an int, not with figures, within heads= when that splits the layer; window of the
    form "Q0:Q1,K0:K1" (or two slices) and not empty (its range once the map is known: HeadsResult.window);
    figures one of FIGURES."""
    from attnviz.output.batch import FIGURES

    must_be_int("head", head, none=True)
    must_be_one_of("figures", figures, FIGURES, none=True)
    if head is not None and figures is not None:
        raise AttnvizError(f"{option('head', head)} draws that head's heatmap alone: leave out {option('figures')}")
    if window is not None:
        from attnviz.render.window_figures import Window, parse_window

        if not isinstance(window, (str, tuple, Window)):
            refuse("window", 'a str "Q0:Q1,K0:K1" or two slices (queries, keys)', window)
        parse_window(window, window_name())
    if heads is not None:  # the range is known before the model loads
        check_head(head, heads, f"{option('heads', heads)} splits the layer into")


def check_head_of(head: int | None, handle, spec) -> None:
    """Once the model is loaded (handle, an attnviz.Model) and the run's spec resolved: head within the layer's heads,
    the model's own (spec.num_heads) where heads= does not split it otherwise; before any layer is computed."""
    check_head(head, spec.num_heads, f"{handle.loaded.name}'s layers have")


def check_head(head: int | None, num_heads: int, has: str) -> None:
    """head names one of the heads, numbered 0 to num_heads - 1 (has: who has them, for the message); None passes."""
    if head is not None and not 0 <= head < num_heads:
        raise AttnvizError(f"{option('head', head)} is out of range: {has} {num_heads} heads, 0 to {num_heads - 1}")


def window_name() -> str:
    """The window as messages name it: "--window" on the command line, "window" in the API."""
    return options_named("window")

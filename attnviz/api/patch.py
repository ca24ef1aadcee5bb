"""attnviz.patch and what it returns: which heads carry the answer, activation patching and direct logit attribution."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attnviz.analysis.patching import COMPONENTS
from attnviz.api import display
from attnviz.api.arguments import must_be_bool, must_be_int, must_be_one_of, must_be_progress, must_be_str
from attnviz.api.checks import _texts, naming_the_bundled_decoder
from attnviz.api.options import PATCH_OPTIONS, run_options, takes_options
from attnviz.api.run_results import Rendered, save_run_files
from attnviz.errors import AttnvizError, option
from attnviz.spec import RunSpec


@takes_options(PATCH_OPTIONS)
def patch(
    text: str, *, corrupt: str, answer: str, wrong: str, position: int | None = None, per_position: bool = False,
    component: str = "out", edges: bool = False, ig: int | None = None, checked_edges: int = 10, progress=None, **options,
):  # fmt: skip
    """Which heads carry the answer (a PatchResult): each head of a decoder (an encoder-decoder's decoder; an encoder
    saved with its masked-LM head) patched from the clean text into corrupt, a text of the same length, scored by
    m = logit(answer) - logit(wrong) at position (default the last; an encoder's: the mask token both texts hold
    there): (m_patched - m_corrupt) / (m_clean - m_corrupt), 0 no effect, 1 the clean answer
    restored (Wang et al. 2022); and each head's direct logit attribution on the clean run (analysis/patching.py,
    analysis/attribution.py). component: what of the head is patched, "out" (its output), "q", "k", "v" (through
    its key/value head with grouped-query attention) or "pattern"; the output's scores are always there.
    per_position: also the most affecting heads patched one position at a time. edges: also every edge between
    heads (a sender head's output into a later head's q, k or v input, and into the read-out) by edge attribution
    patching, with ig its EAP-IG steps, and the checked_edges of largest |score| checked by path patching
    (analysis/edges.py; a pre-norm decoder's). answer and wrong are single tokens
    of the model's, as text (" Mary"). options: model, device, dtype, truncate, allow_pickle.
    progress(n), when given, is called after each n heads patched (a layer's at a time), then, with per_position,
    after each of the most affecting heads patched position by position; a progress that also has .stage(what,
    total) is told as each begins ("heads patched", layers × heads × the components patched).
    """
    from attnviz.analysis.patching import check_texts, patch_heads

    options = run_options("patch", options, PATCH_OPTIONS)
    (text,) = _texts(text, one=True)
    (corrupt,) = _texts(corrupt, one=True, name="corrupt")
    must_be_str("answer", answer)
    must_be_str("wrong", wrong)
    if must_be_int("position", position, none=True) is not None and position < 0:
        raise AttnvizError(f"{option('position', position)}: give a position from 0, the text's first token")
    must_be_bool("per_position", per_position)
    must_be_one_of("component", component, tuple(COMPONENTS))
    settings = edge_settings(must_be_bool("edges", edges), must_be_int("ig", ig, none=True), must_be_int("checked_edges", checked_edges))
    progress = must_be_progress(progress)
    check_texts(text, corrupt, answer, wrong)
    handle = options.load()
    spec = options.run_spec(handle, layer=None, **({"stack": "decoder"} if handle.kind == "encoder-decoder" else {}))
    components = ("out",) if component == "out" else ("out", component)
    captures: dict = {}  # each text's one pass: the report is made of them
    with naming_the_bundled_decoder(handle):  # the default's offline stand-in has no masked-LM head: refused first
        patching = patch_heads(
            handle.loaded, text, corrupt, answer, wrong, spec, position, components, per_position, progress, captures, settings
        )  # fmt: skip
    return PatchResult(patching, spec, handle.loaded, patch_report(handle.loaded, patching, spec, captures))


def edge_settings(edges: bool, ig: int | None, checked: int):
    """The EdgeSettings of patch's edges, ig and checked_edges (None without edges), checked before the model loads."""
    from attnviz.analysis.edges import CHECKED, EdgeSettings

    if not edges:
        if ig is not None or checked != CHECKED:
            raise AttnvizError(f"{option('ig' if ig is not None else 'checked_edges', ig if ig is not None else checked)} goes with {option('edges', True)}: the edges between heads")
        return None
    if ig is not None and ig < 1:
        raise AttnvizError(f"{option('ig', ig)}: EAP-IG averages the gradient over at least 1 point (1 is EAP itself)")
    if checked < 0:
        raise AttnvizError(f"{option('checked_edges', checked)}: give how many top edges to check by path patching, 0 or more")
    return EdgeSettings(ig, checked)


def patch_report(loaded, patching, spec: RunSpec, captures: dict):
    """The interactive report of the clean text (as attnviz.report gives it, at the most affecting head's layer),
    opening on the Patching view: the grids of scores and direct attributions; a click shows the head's maps on both
    texts side by side. Made of the two texts' captures (patch_heads'): no pass of the model."""
    from attnviz.analysis.patching import layer_runs_of
    from attnviz.api.report import text_report

    at_layer = replace(spec, layer=patching.top[0][0])
    corrupt_runs = layer_runs_of(loaded, patching.corrupt_text, captures["corrupt"], spec)
    return text_report(loaded, patching.text, at_layer, captured=captures["clean"], patching=(patching, corrupt_runs))


@dataclass(frozen=True, repr=False)
class PatchResult:
    """patching (analysis.patching.Patching): .scores["out"] (and the component's) (L, H) normalised, .direct (L, H)
    in logit units, .parts, .clean and .corrupt (m of each text), .top (the heads by |output score|), .per_position."""

    patching: Any
    spec: RunSpec
    loaded: Any = field(default=None, compare=False)
    report_result: Any = field(default=None, compare=False)  # the ReportResult, made while the captures were at hand

    @property
    def scores(self):
        return self.patching.scores

    @property
    def direct(self):
        return self.patching.direct

    @property
    def top(self) -> list[tuple[int, int]]:
        return self.patching.top

    @property
    def edges(self):
        """analysis.edges.Edges (with edges=True): .scores["q"], ["k"], ["v"] (L, H, L, H or H_kv), ["logits"] (L, H),
        normalised; .checked, the top edges with their path patching; .ranked(); else None."""
        return self.patching.edges

    def figure(self, which: str = "grid"):
        """"grid": patch.png, every layer × head; "positions": patch_positions.png (with per_position); "edges":
        edges.png (with edges)."""
        from attnviz.render.patch_figures import patching_figure, positions_figure

        if which == "grid":
            return patching_figure(self.patching)
        if which == "edges":
            if self.patching.edges is None:
                raise AttnvizError(f"no edges: call attnviz.patch with {option('edges', True)}")
            from attnviz.render.edge_figures import edges_figure

            return edges_figure(self.patching)
        if which != "positions":
            raise AttnvizError(f"unknown figure {which!r}: choose grid, positions or edges")
        if not self.patching.per_position:
            raise AttnvizError(f"no per-position scores: call attnviz.patch with {option('per_position', True)}")
        return positions_figure(self.patching)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz patch --out folder` writes: patch.<format> (patch_positions.<format>), patch.json,
        (with edges: edges.<format>, edges.json), report.html."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        from attnviz.output.patch_json import write_patch_json
        from attnviz.render.patch_figures import write_patching_figures

        written = [*write_patching_figures(self.patching, folder, format), write_patch_json(self.patching, self.spec, folder / "patch.json")]
        if self.patching.edges is not None:
            from attnviz.output.edges_json import write_edges_json
            from attnviz.render.edge_figures import write_edges_figure

            written += [write_edges_figure(self.patching, folder, format), write_edges_json(self.patching, self.spec, folder / "edges.json")]
        return [*written, *self.report().write_files(folder)]

    def report(self):
        """The interactive report of the clean text (patch_report's, made by attnviz.patch)."""
        return self.report_result

    def to_dict(self) -> dict:
        """patch.json's content."""
        from attnviz.output.patch_json import patch_record

        return patch_record(self.patching, self.spec)

    def __rich_console__(self, console, options):
        from attnviz.render.patch_figures import print_patching

        printed = display.Printed(options.max_width)
        print_patching(printed, self.patching)
        if self.patching.edges is not None:
            from attnviz.render.edge_figures import print_edges

            print_edges(printed, self.patching)
        yield printed.group()

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        from attnviz.render.patch_figures import MOST_SHOWN, metric_words

        p = self.patching
        rows = [
            [layer, head, *(display.number(values[layer, head], 3) for values in p.scores.values()),
             "–" if p.direct is None else display.number(p.direct[layer, head], 3)]
            for layer, head in p.top[:MOST_SHOWN]
        ]  # fmt: skip
        parts = [
            display.figure_html(self.figure(), "every layer × head"),
            display.table_html(["layer", "head", *p.scores, "direct"], rows, metric_words(p)),
            *([display.figure_html(self.figure("positions"), "the most affecting heads by position")] if p.per_position else []),
            *([display.figure_html(self.figure("edges"), "the top edges")] if p.edges is not None else []),
        ]
        return display.result_html(f"{p.model} · {p.text} ← {p.corrupt_text}", *parts)

    def __repr__(self) -> str:
        p = self.patching
        layer, head = p.top[0]
        return (
            f"<attnviz.PatchResult {p.text!r} ← {p.corrupt_text!r}: {p.model}, m {p.clean:.3f} clean, {p.corrupt:.3f} "
            f"corrupted; most affecting layer {layer} head {head} ({p.scores['out'][layer, head]:+.3f})>"
        )

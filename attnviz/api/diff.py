"""attnviz.diff and what it returns: two checkpoints' maps of one text compared, every layer × head."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.api import display
from attnviz.api.arguments import must_be_progress, refuse
from attnviz.api.checks import _check_lengths, _texts, refuse_before_loading
from attnviz.api.models import MODEL_TYPES, Model
from attnviz.api.options import DIFF_OPTIONS, run_options, takes_options
from attnviz.api.run_results import Rendered, save_run_files
from attnviz.errors import AttnvizError
from attnviz.spec import RunSpec, refuse_cross_over_every_layer


@takes_options(DIFF_OPTIONS)
def diff(text: str, *, against, progress=None, **options):
    """Two checkpoints of one architecture and one tokenizer over one text, every layer × head (a DiffResult).

    against: the other checkpoint (a hub id, a local folder, an attnviz.load() handle), or "random": each layer
    with random projections drawn from seed, over the model's own hidden states (how far training moved each
    head). Per layer × head, the two maps' Jensen-Shannon distance (mean over queries) and Clark et al.'s
    divergence (the JSD summed over queries), a block of queries at a time (analysis/diff.py); the most changed
    heads' maps are kept for a text of at most 2,048 tokens. options: model, seed, stack, device, dtype,
    truncate, memory, allow_pickle (for both checkpoints), as in layers. progress(1), when given, is called after each
    layer compared; a progress that also has .stage(what, total) is told first ("layers compared", the layers).
    """
    from attnviz.analysis.diff import RANDOM, check_pair, head_differences
    from attnviz.budgets import block_budget
    from attnviz.passes import capture_texts

    options = run_options("diff", options, DIFF_OPTIONS)
    (text,) = _texts(text, one=True)
    progress = must_be_progress(progress)
    if against != RANDOM and not isinstance(against, (str, Path, Model)):
        refuse("against", MODEL_TYPES, against)
    refuse_cross_over_every_layer(options.stack)
    refuse_before_loading(options)
    handle = options.load()
    spec = options.run_spec(handle, layer=None)
    _check_lengths(handle.loaded, [text], options.truncate)
    other = RANDOM
    if against != RANDOM:
        other = replace(options, model=against).load().loaded
        check_pair(handle.loaded, other, text, spec)
    capture = capture_texts(handle.loaded, [text], spec)  # the text's one pass on the model: its side, and the report
    differences = head_differences(handle.loaded, other, text, spec, block_budget(spec), progress, capture)
    return DiffResult(differences, spec, handle.loaded, diff_report(handle.loaded, differences, spec, capture))


def diff_report(loaded, differences, spec: RunSpec, captured):
    """The interactive report of the model's text (as attnviz.report gives it, at the most changed head's layer),
    opening on the Diff view: the grid of every layer × head's distance, the most changed heads' two maps. Made of
    the text's capture (captured): no pass of the model."""
    from attnviz.api.report import text_report

    at_layer = replace(spec, layer=differences.top[0][0])
    return text_report(loaded, differences.text, at_layer, captured=captured, differences=differences)


@dataclass(frozen=True, repr=False)
class DiffResult:
    """differences (analysis.diff.HeadDifferences): .values["js"] and ["clark"] (L, H), .top (the most changed heads,
    (layer, head)), .maps[(layer, head)] their two maps (N, N) (for a text of at most MAX_DRAWN_TOKENS)."""

    differences: Any  # analysis.diff.HeadDifferences
    spec: RunSpec
    loaded: Any = field(default=None, compare=False)  # the model's LoadedModel
    report_result: Any = field(default=None, compare=False)  # the ReportResult, made while the capture was at hand
    @property
    def values(self) -> dict[str, np.ndarray]:
        return self.differences.values

    @property
    def top(self) -> list[tuple[int, int]]:
        return self.differences.top

    def figure(self, which: str = "distances"):
        """"distances": diff.png, every layer × head; "heads": diff_heads.png, the most changed heads' maps."""
        from attnviz.render.diff_figures import differences_figure, most_changed_figure

        if which == "distances":
            return differences_figure(self.differences, self.spec.seed)
        if which != "heads":
            raise AttnvizError(f"unknown figure {which!r}: choose distances or heads")
        if not self.differences.maps:
            raise AttnvizError("no maps of the most changed heads: the text has more tokens than they are kept for")
        return most_changed_figure(self.differences, self.spec.seed)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz diff --out folder` writes: diff.<format>, diff_heads.<format>, diff.json, report.html."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        from attnviz.output.summaries_json import write_differences_json
        from attnviz.render.diff_figures import write_differences_figures

        figures = write_differences_figures(self.differences, folder, format, self.spec.seed)
        return [*figures, write_differences_json(self.differences, self.spec, folder / "diff.json"), *self.report().write_files(folder)]

    def report(self):
        """The interactive report of the model's text (diff_report's, made by attnviz.diff), opening on the Diff view."""
        return self.report_result

    def to_dict(self) -> dict:
        """diff.json's content."""
        from attnviz.output.summaries_json import differences_record

        return differences_record(self.differences, self.spec)

    def __rich_console__(self, console, options):
        from attnviz.render.summary_tables import print_differences

        printed = display.Printed(options.max_width)
        print_differences(printed, self.differences)
        yield printed.group()

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        from attnviz.analysis.diff import against_words

        d = self.differences
        rows = [[layer, head, display.number(d.values["js"][layer, head], 3), display.number(d.values["clark"][layer, head], 3)] for layer, head in d.top]
        parts = [
            display.figure_html(self.figure(), "every layer × head"),
            display.table_html(["layer", "head", "JS", "Clark"], rows, "the most changed heads; JS: Jensen-Shannon distance, mean over queries; Clark: JSD summed over queries (bits)"),
            *([display.figure_html(self.figure("heads"), "the most changed heads")] if d.maps else []),
        ]
        return display.result_html(f"{d.model} {against_words(d)} · {d.text}", *parts)

    def __repr__(self) -> str:
        d = self.differences
        return f"<attnviz.DiffResult {d.text!r}: {d.model} against {d.against}, most changed layer {d.top[0][0]} head {d.top[0][1]}>"

"""attnviz.compose and what it returns: every head pair's composition scores, read from the weights alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.api import display
from attnviz.api.arguments import must_be_int, must_be_progress
from attnviz.api.options import COMPOSE_OPTIONS, run_options, takes_options
from attnviz.api.run_results import Rendered, save_run_files
from attnviz.errors import AttnvizError

DEFAULT_TOP = 20  # the strongest compositions a result lists, its table and compose.json's "top"


@takes_options(COMPOSE_OPTIONS)
def compose(*, top: int = DEFAULT_TOP, progress=None, **options):
    """Every pair of heads in different layers (sender layer before receiver layer): Elhage et al. 2021's Q-, K- and
    V-composition scores from the weights alone (a ComposeResult), the norm before each attention folded in where the
    model has one (else the raw weights, said in the notes), grouped-query heads through their shared W_K and W_V;
    each kind's baseline is the mean score of Gaussian matrices of the same shapes. top: how many of the strongest
    compositions (score above baseline) the result lists. options: model, device, allow_pickle, as in layers.

    progress(n), when given, is called after each n sender layers done; a progress that also has .stage(what, total)
    is told as the stage begins.
    """
    from attnviz.analysis.compositions import compositions

    options = run_options("compose", options, COMPOSE_OPTIONS)
    top = must_be_int("top", top)
    if top < 1:
        raise AttnvizError(f"top {top}: give at least 1 composition to list")
    progress = must_be_progress(progress)
    handle = options.load()
    if handle.loaded.num_layers < 2:
        raise AttnvizError(f"{handle.loaded.name} has one layer: compositions need a sender and a later receiver layer")
    return ComposeResult(compositions(handle.loaded, progress), handle.loaded.name, top)


@dataclass(frozen=True, repr=False)
class ComposeResult:
    """compositions (analysis.compositions.Compositions): .scores[kind] (L, H, L, H) float64 (NaN where the sender's
    layer is not before the receiver's), .baseline[kind], .baseline_draws, .norms_folded, .notes; model: its name;
    top: how many of the strongest compositions .top() lists by default."""

    compositions: Any
    model: str
    shown: int = DEFAULT_TOP

    @property
    def scores(self):
        return self.compositions.scores

    @property
    def baseline(self) -> dict[str, float]:
        return self.compositions.baseline

    def top(self, n: int | None = None) -> list[dict]:
        """The n (default: compose's top) compositions most above their kind's baseline, strongest first: dicts of
        kind, sender (layer, head), receiver (layer, head), score, baseline, above."""
        return self.compositions.top(self.shown if n is None else must_be_int("n", n))

    def figure(self):
        """compose.png: Q, K and V panels, sender layer × receiver layer, the strongest head pair's score above baseline."""
        from attnviz.render.composition_figures import compositions_figure

        return compositions_figure(self.compositions, self.model)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz compose --out folder` writes: compose.<format>, compose.json."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        from attnviz.output.compose_json import write_compose_json
        from attnviz.render.heatmap import check_format, save_figure

        check_format(format)
        figure = save_figure(self.figure(), folder, f"compose.{format}")
        return [figure, write_compose_json(self.compositions, self.model, self.shown, folder / "compose.json")]

    def to_dict(self) -> dict:
        """compose.json's content."""
        from attnviz.output.compose_json import compose_record

        return compose_record(self.compositions, self.model, self.shown)

    def rows(self) -> list[list[str]]:
        """The table's rows: kind, sender, receiver, score, baseline, above."""
        return [[row["kind"].upper(), head_name(row["sender"]), head_name(row["receiver"]), f"{row['score']:.3f}",
                 f"{row['baseline']:.3f}", f"{row['above']:+.3f}"] for row in self.top()]  # fmt: skip

    def __rich_console__(self, console, options):
        from rich.table import Table

        yield f"{self.model}: the {len(self.top())} compositions most above their kind's baseline"
        table = Table()
        for name in COLUMNS:
            table.add_column(name, justify="left" if name in ("kind", "sender", "receiver") else "right")
        for row in self.rows():
            table.add_row(*row)
        yield table
        for note in self.compositions.notes:
            yield f"note: {note}"

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        parts = [display.figure_html(self.figure(), "compositions by layer pair"),
                 display.table_html(list(COLUMNS), self.rows(), "the strongest compositions above their baselines"),
                 display.notes_html(list(self.compositions.notes))]  # fmt: skip
        return display.result_html(f"{self.model} · compositions", *parts)

    def __repr__(self) -> str:
        heads = self.scores["q"].shape[0] * self.scores["q"].shape[1]
        return f"<attnviz.ComposeResult {self.model}: Q, K, V compositions of {heads} heads>"


COLUMNS = ("kind", "sender", "receiver", "score", "baseline", "above")


def head_name(head) -> str:
    """(3, 5) -> "L3H5"."""
    return f"L{head[0]}H{head[1]}"

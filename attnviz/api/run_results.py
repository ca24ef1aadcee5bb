"""What attnviz.heads and attnviz.report return: the numbers, a figure, the command's files, a display; what every result
shares (its files written all or none, its Rich display). attnviz.trace's result: trace_results.py.

Results hold the stages' plain data (AttentionRun, the trace) and the run's RunSpec. Figures and
files come from the same renderers and writers as the command line, imported when asked for.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from attnviz.api import display
from attnviz.errors import AttnvizError
from attnviz.spec import RunSpec


def save_run_files(folder: str | Path, write, format: str | None = None) -> list[Path]:
    """Write through the command line's staged folder: every file lands, or none (write(staging) -> paths).

    format, when the files include figures: checked before anything is written.
    """
    from attnviz.output.runs import StagedRunFolder
    from attnviz.render.heatmap import check_format

    if format is not None:
        check_format(format)
    run_folder = StagedRunFolder(Path(folder), unique=False)  # as `--out folder`: files of the same name replaced
    with run_folder as staging:
        written = write(staging)
    return [run_folder.final / path.name for path in written]


REPORT_FILE = "report.html"
TEXTS_ENCODED = "texts encoded for the page"  # report_result's stage, as progress= counts it
IFRAME_HEIGHT = 720  # px: the notebook's view of the report


def tensor(array):
    """A torch.Tensor of a NumPy array (its own copy)."""
    import torch

    return torch.from_numpy(array.copy())


@dataclass(frozen=True, repr=False)
class HeadsResult:
    """One text through one layer's heads, as `attnviz heads` computes it.

    attention is (H, Nq, Nk), each row summing to 1 (attention.json's "attention", transformers'
    attentions[layer][0]); output is the layer's output (Nq, D); spec the settings it ran with.
    """

    run: Any  # attnviz.run_data.AttentionRun
    spec: RunSpec
    num_layers: int | None = None  # the model's layers (of spec.stack), for the report's header
    measures: Any = None  # attnviz.analysis.measures.RunMeasures, with measure= other than "weights"
    made_report: Any = None  # the ReportResult of heads(report=True): made from the run's own capture
    traced: Any = None  # the TraceResult of heads(trace=True)

    @property
    def text(self) -> str:
        return self.run.text

    @property
    def effects(self):
        """Each head of the layer taken out (analysis.effect.HeadEffects), with heads(effect=); else None."""
        return self.run.effects

    @property
    def vectors(self):
        """Each head's query and key vectors (analysis.neurons.QueryKeyVectors), with heads(vectors=True); else None."""
        return self.run.vectors

    @property
    def layer_summaries(self):
        """Every head of every layer summarised (head_summaries.LayerSummaries), with heads(layer_summaries=True); else None."""
        return self.run.layer_summaries

    @property
    def tokens(self) -> list[str]:
        """The query tokens, [CLS] and [SEP] included."""
        return self.run.query_tokens

    @property
    def key_tokens(self) -> list[str]:
        return self.run.key_tokens

    @property
    def num_heads(self) -> int:
        return self.run.num_heads

    @property
    def notes(self) -> list[str]:
        """What the command prints as "note: ...": a fallback model, [UNK] tokens, a cut text."""
        return self.run.notes

    @cached_property
    def attention(self):
        """(H, Nq, Nk): a torch.Tensor; for a long text (run.map_on_disk) a read-only numpy memmap, read as sliced,
        of a temporary attention.npy that lives as long as the memmap does (this result, or a slice of it)."""
        if self.run.map_on_disk:
            return self.run.attention
        return tensor(self.run.attention)  # (H, Nq, Nk)

    @cached_property
    def output(self):
        return tensor(self.run.output)  # (Nq, D)

    @cached_property
    def summaries(self) -> list:
        """Per head: entropy, relative entropy, mean max and each query's top key (attnviz.analysis.statistics.HeadSummary)."""
        from attnviz.analysis.statistics import summarize_heads

        return summarize_heads(self.run.attention, self.run.causal)  # a block of queries at a time: a map on disk too

    def with_roles(self, roles) -> "HeadsResult":
        """This result with each head's roles (an attnviz.roles() result of the same model): its figures' titles and
        its table name them."""
        return replace(self, run=replace(self.run, head_roles=roles.labels[self.run.layer]))

    def figure(self, head: int | None = None, window=None):
        """One head's heatmap (head_XX.png), or the grid of all heads (heads.png): a matplotlib Figure, not saved.

        window: one region of head's map at full resolution (window_head_XX.png), as "Q0:Q1,K0:K1" or
        (slice(q0, q1), slice(k0, k1)), token indices, ends excluded.
        """
        from attnviz.render.heatmap import head_figure, heads_grid_figure

        if head is None and window is not None:
            raise AttnvizError("a window is of one head's map: give head= too")
        if head is None:
            return heads_grid_figure(self.run, seed=self.spec.seed)
        if not 0 <= head < self.num_heads:
            raise AttnvizError(f"head {head} is out of range: this run has heads 0 to {self.num_heads - 1}")
        if window is not None:
            from attnviz.render.window_figures import window_figure

            return window_figure(self.run, head, self.window(window), seed=self.spec.seed)
        return head_figure(self.run, head, seed=self.spec.seed)

    def window(self, given, name: str = "window"):
        """The checked Window of given ("Q0:Q1,K0:K1" or two slices) on this run's map; out of range: refused."""
        from attnviz.render.window_figures import window_of

        num_queries, num_keys = self.run.attention.shape[1:]
        return window_of(given, num_queries, num_keys, name)

    def measures_figure(self):
        """The weights averaged over heads beside each measure asked for (measures.png of measure="all"): a Figure."""
        from attnviz.render.measure_figures import side_by_side_figure

        if self.measures is None:
            raise AttnvizError('no measures in this result: run attnviz.heads(..., measure="all") or another measure')
        return side_by_side_figure(self.run, self.measures, seed=self.spec.seed)

    def save(self, folder: str | Path, format: str = "png", window=None) -> list[Path]:
        """Write what `attnviz heads TEXT --save-map --out folder` writes: head_XX.<format>, heads.<format>,
        attention.json, a long text's attention.npy (a hard link to .attention's file where the folder's file
        system allows, else a copy; .attention still reads it), and with measures, their figures (norm_heads,
        norm, value_zeroing, flow, measures.<format>); with window (as figure's, `--window`), every head's
        window_head_XX.<format> too."""
        checked = self.window(window) if window is not None else None  # before anything is written
        return save_run_files(folder, lambda staging: self.write_files(staging, format, window=checked), format)

    def write_files(
        self, folder: Path, format: str = "png", figures: str = "all", head: int | None = None, window=None,
        save_map: bool = True,
    ) -> list[Path]:
        """save's files, written straight into an existing folder (the command line stages its own).

        figures and head: the heatmaps that `heads --figures` and `--head` choose (output/batch.py's write_head_figures);
        window (`--window`, as figure's): window_head_XX of each head, or of head alone; save_map False (`heads`
        without --save-map): a long text's map is not written, attention.json says so.
        """
        from attnviz.output.batch import write_head_figures
        from attnviz.output.export import write_attention_files

        written = write_head_figures(self.run, folder, format, self.spec.seed, figures=figures, head=head)
        if window is not None:
            from attnviz.render.window_figures import write_window_figures

            heads = None if head is None else [head]
            written += write_window_figures(self.run, self.window(window), folder, format, heads, seed=self.spec.seed)
        if self.measures is not None:
            from attnviz.render.measure_figures import write_measure_figures

            written += write_measure_figures(self.run, self.measures, folder, format, seed=self.spec.seed)
        return written + write_attention_files(self.run, self.spec, folder, self.measures, save_map, self.effects)

    def to_dict(self) -> dict:
        """attention.json's content: the attention as nested lists, rounded as the file rounds it."""
        import numpy as np

        from attnviz.output.export import DECIMALS, attention_record

        from attnviz.output.export import map_file_record

        record = attention_record(self.run, self.spec, self.measures, self.effects)
        if self.run.map_on_disk:  # as attention.json names it; the weights are .attention, read lazily
            return {**record, **map_file_record(self.run)}
        attention = np.round(self.run.attention.astype(np.float64), DECIMALS).tolist()  # as weights_json writes it
        return {**record, "attention": attention}

    def report(self):
        """The interactive report: with heads(report=True) the one made from the run's capture (every layer, the traces,
        as attnviz.report's), else of this layer alone (a ReportResult)."""
        from attnviz.html import ReportText

        if self.made_report is not None:
            return self.made_report
        return report_result([ReportText(self.run)], self.spec, self.num_layers)

    def __rich__(self):
        from attnviz.render.terminal import heads_table

        return heads_table(self.run, self.summaries, effects=self.effects)

    def _repr_html_(self) -> str:
        from attnviz.render.terminal import effect_cells, effect_columns, effects_legend

        effects = self.effects
        rows = [
            [s.head, display.number(s.entropy), display.number(s.relative_entropy), display.number(s.mean_max)]
            + (effect_cells(effects, self.run.layer, s.head) if effects is not None else [])
            for s in self.summaries
        ]
        parts = [display.notes_html(self.notes), display.tokens_html(self.run.shown_tokens[0], "query tokens" if self.run.kv_text else "tokens")]
        if self.run.kv_text:
            parts.append(display.tokens_html(self.run.shown_tokens[1], "key/value tokens"))
        parts += [
            display.figure_html(self.figure(), "every head's attention"),
            *([display.figure_html(self.measures_figure(), "what the weights leave out")] if self.measures is not None else []),
            display.table_html(
                ["head", "entropy", "rel.", "mean max", *effect_columns(effects)], rows,
                "entropy of each row in nats, mean over queries; rel.: entropy / log(keys the query may see)"
                + (f"; {effects_legend(effects)}" if effects is not None else ""),
            ),
        ]  # fmt: skip
        return display.result_html(f"{self.run.model} · layer {self.run.layer} · {self.text}", *parts)

    def __repr__(self) -> str:
        return f"<attnviz.HeadsResult {self.text!r}: {self.num_heads} heads, layer {self.run.layer}, {len(self.tokens)} tokens>"


def report_result(texts: list, spec: RunSpec, num_layers: int | None, notes: list[str] = (), progress=None) -> ReportResult:
    """A ReportResult of ReportTexts (attnviz.html.record): what attnviz.report and every result's .report() return.

    num_layers: the model's layers (of spec.stack), as the page's header says them; progress (a run_data.Progress):
    the texts encoded for the page.
    """
    from attnviz.html import report_record
    from attnviz.models.families import FAMILIES

    kind = next(family.kind for family in FAMILIES if family.name == texts[0].run.family)
    advance = progress.counting(TEXTS_ENCODED, len(texts)) if progress is not None else lambda done: None
    return ReportResult(report_record(texts, spec, kind=kind, num_layers=num_layers, notes=list(notes), advance=advance))


@dataclass(frozen=True, repr=False)
class ReportResult:
    """The interactive report: .record is its data (docs/formats.md, "report.html"), .html the page itself."""

    record: dict

    @property
    def texts(self) -> list[str]:
        return [text["text"] for text in self.record["texts"]]

    @cached_property
    def html(self) -> str:
        """The whole page: one HTML file that needs nothing but a browser."""
        from attnviz.html import report_page

        return report_page(self.record)

    def save(self, folder: str | Path) -> list[Path]:
        """Write report.html into folder (made if new), through a staged folder: it lands whole or not at all."""
        return save_run_files(folder, self.write_files)

    def write_files(self, folder: Path) -> list[Path]:
        """save's file, written straight into an existing folder (the command line stages its own)."""
        path = Path(folder) / REPORT_FILE
        path.write_text(self.html, encoding="utf-8")
        return [path]

    def _repr_html_(self) -> str:
        # srcdoc, not a data: URL or a file: the page's scripts run in Jupyter and VS Code alike, sandboxed. In single
        # quotes: the record's many double quotes stay as they are (2 bytes in a notebook's JSON, &quot;'s 6)
        page = html.escape(self.html, quote=False).replace("'", "&#x27;")
        return (
            f"<iframe srcdoc='{page}' sandbox=\"allow-scripts\" "
            f'style="width:100%;height:{IFRAME_HEIGHT}px;border:0"></iframe>'
        )

    def __repr__(self) -> str:
        first = self.record["texts"][0]
        others = len(self.texts) - 1
        more = f" and {others} more text{'s' if others > 1 else ''}" if others else ""
        layers = "every layer" if first["layers"] is not None else "no other layers"
        return (
            f"<attnviz.ReportResult {first['text']!r}{more}: {first['model']}, layer {first['layer']}, "
            f"{len(first.get('query_pieces', first['query_tokens']))} tokens, {layers}>"
        )


class Rendered:
    """A Rich renderable for a result whose CLI view is printed by a print_* function."""

    def __init__(self, result):
        self.result = result

    def __rich_console__(self, console, options):
        yield from self.result.__rich_console__(console, options)

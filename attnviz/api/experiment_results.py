"""What attnviz.stats and layers return: numbers as arrays, a figure, files, a display (compare's and position's:
compare_results.py).

Each holds the stage's own result and the run's RunSpec; figures and files come from the command
line's renderers and writers, imported when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.api import display
from attnviz.api.run_results import Rendered, report_result, save_run_files, tensor
from attnviz.errors import AttnvizError
from attnviz.spec import RunSpec


@dataclass(frozen=True, repr=False)
class StatsResult:
    """Every head of every layer, averaged over the texts, as `attnviz stats` measures it.

    values is (L, H, S) with the statistics named in .statistics along the last axis;
    js_distance (L, H, H), None when not measured (stats(..., js=False), stats --file without --js);
    labels[layer][head] a head's label or None.
    """

    stats: Any  # attnviz.analysis.statistics.ModelStatistics
    texts: list[str] | None  # None: a corpus too large to list (stats --file beyond LISTED_TEXTS), see corpus
    truncated: list | None
    first_run: Any  # the first text's layer-0 run: the model and setup, as stats.json records them
    spec: RunSpec
    notes: list[str] = field(default_factory=list)  # what the command prints as "note: ...", once each: [UNK] tokens, cut texts
    corpus: dict | None = None  # stats --file: the file, its bytes, SHA-256, texts and texts cut (stats.json's "corpus")

    @property
    def statistics(self) -> list[str]:
        from attnviz.analysis.head_numbers import STATISTICS

        return list(STATISTICS)

    @property
    def values(self) -> np.ndarray:
        return self.stats.values

    @property
    def js_distance(self) -> np.ndarray | None:
        return self.stats.js_distance

    @property
    def labels(self) -> list[list[str | None]]:
        return [[self.stats.label(layer, head) for head in range(self.stats.num_heads)] for layer in range(self.stats.num_layers)]

    def figure(self):
        """js_distance.png: the Jensen-Shannon distances between the heads of each layer."""
        from attnviz.render.stats_figures import js_distance_figure

        if self.stats.js_distance is None:
            raise AttnvizError("the Jensen-Shannon distances were not measured: give js=True (attnviz stats --js)")
        return js_distance_figure(self.stats.js_distance, self.first_run, self._titled_texts, seed=self.spec.seed)

    @property
    def _titled_texts(self):
        """What the figure's title counts (and quotes when one): the texts, or as many placeholders when they are not listed."""
        return self.texts if self.texts is not None else _Unlisted(self.stats.num_texts)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz stats --out folder` writes: stats.csv, stats.json, js_distance.<format> (when measured)."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        """save's files, written straight into an existing folder (the command line stages its own)."""
        from attnviz.output.stats_export import write_stats_csv, write_stats_json
        from attnviz.render.stats_figures import write_js_distance

        files = [
            write_stats_csv(self.stats, folder / "stats.csv"),
            write_stats_json(self.stats, self.texts, self.truncated, self.first_run, self.spec, folder / "stats.json", self.corpus),
        ]
        if self.stats.js_distance is not None:
            files.append(write_js_distance(self.stats.js_distance, self.first_run, self._titled_texts, folder, format, seed=self.spec.seed))
        return files

    def to_dict(self) -> dict:
        """stats.json's content."""
        from attnviz.output.stats_export import stats_record

        return stats_record(self.stats, self.texts, self.truncated, self.first_run, self.spec, self.corpus)

    def report(self):
        """The interactive report of the first text's layer 0, with the statistics when they are of that one text.

        Statistics averaged over several texts are not one text's: the report leaves them out (stats.json has them).
        """
        from attnviz.html import ReportText

        one_text = self.stats.num_texts == 1
        averaged = (
            f"the statistics of the {self.stats.num_texts} texts are averaged over them (stats.json): "
            "this report shows the first text's layer 0 without them"
        )
        notes = [] if one_text else [averaged]
        text = ReportText(self.first_run, statistics=self.stats if one_text else None)
        return report_result([text], replace(self.spec, layer=0), self.stats.num_layers, notes)

    def __rich__(self):
        from rich.console import Group

        from attnviz.render.stats_tables import labelled_heads_table, stats_grid

        return Group(*stats_grid(self.stats, model_causal=self.first_run.model_causal), labelled_heads_table(self.stats))

    def _repr_html_(self) -> str:
        rows = [[f"L{layer}", *[label or "·" for label in labels]] for layer, labels in enumerate(self.labels)]
        headers = ["", *[f"H{head}" for head in range(self.stats.num_heads)]]
        return display.result_html(
            f"stats · {self.first_run.model} · {self.stats.num_texts} text{'s' if self.stats.num_texts != 1 else ''}",
            display.tokens_html(self.first_run.shown_tokens[0], f"first text's {'words' if self.first_run.words else 'tokens'}"),
            display.figure_html(self.figure(), "Jensen-Shannon distances between heads") if self.js_distance is not None else "",
            display.table_html(headers, rows, "head labels by layer (stats.csv has every statistic)"),
        )

    def __repr__(self) -> str:
        return f"<attnviz.StatsResult {self.stats.num_layers} layers × {self.stats.num_heads} heads over {self.stats.num_texts} texts>"



class _Unlisted:
    """The texts of a corpus too large to list, for the figure's title: only their count."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

@dataclass(frozen=True, repr=False)
class LayersResult:
    """Every layer's heads for one text, and attention rollout, as `attnviz layers` computes them.

    A text too long for every layer's maps at once (analysis.long_layers): the runs hold no weights,
    .attention and .rollout are None, maxima holds layers.png's block maxima, notes says why.
    """

    layer_runs: list  # one AttentionRun per layer
    rollout: np.ndarray | None  # (N, N); None for a long text
    spec: RunSpec
    measures: Any = None  # attnviz.analysis.measures.LayersMeasures, with measure= other than "weights"
    summaries: Any = None  # attnviz.analysis.head_summaries.LayerSummaries: every head of every layer summarised
    maxima: np.ndarray | None = None  # (L, H, P, P): layers.png's block maxima, for a long text
    notes: list[str] = field(default_factory=list)  # what the command prints as "note: ...": a long text's
    effects: Any = None  # attnviz.analysis.effect.HeadEffects of every layer, with effect=

    @property
    def tokens(self) -> list[str]:
        return self.layer_runs[0].query_tokens

    @property
    def in_blocks(self) -> bool:
        """True for a long text, computed a block of queries at a time: no whole map."""
        return self.layer_runs[0].attention is None

    @cached_property
    def attention(self):
        """(L, H, N, N): each layer's heads, rows summing to 1; None for a long text (in_blocks, notes)."""
        if self.in_blocks:
            return None
        return tensor(np.stack([run.attention for run in self.layer_runs]))

    def figure(self, which: str = "layers"):
        """layers.png (every layer's heads at a glance), with which="rollout" rollout.png, with which="summaries"
        summaries.png (every head of every layer summarised, a layers × heads grid per summary)."""
        from attnviz.render.stats_figures import layers_figure, rollout_figure

        if which == "rollout":
            self._refuse_long("rollout.png")
            return rollout_figure(self.layer_runs, self.rollout, seed=self.spec.seed)
        if which == "summaries" and self.summaries is not None:
            from attnviz.render.summary_figures import summaries_figure

            return summaries_figure(self.summaries, self.layer_runs[0], seed=self.spec.seed)
        if which != "layers":
            raise AttnvizError(f"unknown figure {which!r}: choose layers, rollout or summaries")
        return layers_figure(self.layer_runs, seed=self.spec.seed, maxima=self.maxima)

    def _refuse_long(self, what: str) -> None:
        if self.in_blocks:
            raise AttnvizError(f"no {what} for this text: {self.notes[0] if self.notes else 'its maps were never whole'}")

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz layers --out folder` writes: layers.<format>, rollout.<format>, rollout.json,
        summaries.<format> and summaries.json (every head summarised), and with measures their figures
        (norm_layers, value_zeroing_layers, flow.<format>) and measures.json; for a long text no rollout."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        """save's files, written straight into an existing folder (the command line stages its own)."""
        from attnviz.output.stats_export import write_rollout_json
        from attnviz.render.stats_figures import write_layers_grid, write_rollout

        written = [write_layers_grid(self.layer_runs, folder, format, seed=self.spec.seed, maxima=self.maxima)]
        if self.rollout is not None:
            written += [
                write_rollout(self.layer_runs, self.rollout, folder, format, seed=self.spec.seed),
                write_rollout_json(self.layer_runs, self.rollout, self.spec, folder / "rollout.json"),
            ]
        if self.measures is not None:
            from attnviz.output.stats_export import write_layers_measures_json
            from attnviz.render.measure_figures import write_layers_measure_figures

            written += write_layers_measure_figures(self.layer_runs, self.rollout, self.measures, folder, format, self.spec.seed)
            written.append(write_layers_measures_json(self.layer_runs, self.measures, self.spec, folder / "measures.json"))
        if self.summaries is not None:
            from attnviz.output.summaries_json import write_summaries_json
            from attnviz.render.summary_figures import write_summaries_figure

            written.append(write_summaries_figure(self.summaries, folder, format, self.layer_runs[0], self.spec.seed))
            written.append(write_summaries_json(self.summaries, self.spec, folder / "summaries.json"))
        if self.effects is not None:
            from attnviz.output.summaries_json import write_effects_json
            from attnviz.render.summary_figures import write_effects_figure

            written.append(write_effects_figure(self.effects, folder, format, self.layer_runs[0], self.spec.seed))
            written.append(write_effects_json(self.effects, self.spec, folder / "effects.json"))
        return written

    def to_dict(self) -> dict:
        """rollout.json's content."""
        from attnviz.output.stats_export import rollout_record

        self._refuse_long("rollout.json")
        return rollout_record(self.layer_runs, self.rollout, self.spec)

    def report(self):
        """The interactive report of these layers (layer 0 first), the rollout and the text's statistics (a ReportResult)."""
        from attnviz.html import ReportText
        from attnviz.html.encoding import encode_layers

        self._refuse_long("report of every layer (attnviz report --layer L shows one layer of a long text)")
        first = replace(self.layer_runs[0], effects=self.effects)  # effect=: every head's, in the head and model views
        layers = encode_layers([run.attention for run in self.layer_runs])
        text = ReportText(first, layers, self.rollout, text_statistics(self.layer_runs, self.spec.causal))
        return report_result([text], replace(self.spec, layer=0), len(self.layer_runs))

    def __rich_console__(self, console, options):
        from attnviz.render.stats_tables import print_rollout

        printed = display.Printed(options.max_width)
        if self.rollout is not None:
            print_rollout(printed, self.layer_runs[0].shown_tokens[0], self.rollout)
        else:
            from attnviz.render.summary_tables import print_summaries

            print_summaries(printed, self.summaries)
        yield printed.group()

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        tokens = self.layer_runs[0].shown_tokens[0]
        if self.rollout is None:
            return display.result_html(
                f"layers · {self.layer_runs[0].model} · {len(self.layer_runs)} layers · {len(tokens)} tokens",
                display.figure_html(self.figure(), "every layer's heads (block maxima)"),
                display.figure_html(self.figure("summaries"), "every head summarised"),
            )
        rows = [
            [f"{query}:{token}", f"{int(self.rollout[query].argmax())}:{tokens[int(self.rollout[query].argmax())]}",
             display.number(float(self.rollout[query].max()))]
            for query, token in enumerate(tokens)
        ]  # fmt: skip
        return display.result_html(
            f"layers · {self.layer_runs[0].model} · {len(self.layer_runs)} layers · {self.layer_runs[0].text}",
            display.tokens_html(tokens),
            display.figure_html(self.figure(), "every layer's heads"),
            display.table_html(["token", "input token it draws on most", "share"], rows, "attention rollout through every layer"),
        )

    def __repr__(self) -> str:
        return f"<attnviz.LayersResult {self.layer_runs[0].text!r}: {len(self.layer_runs)} layers>"


def text_statistics(layer_runs: list, causal: bool):
    """One text's statistics of every head (a ModelStatistics over that text alone), from its layers' runs (TextStatistics)."""
    statistics = TextStatistics(len(layer_runs), causal)
    for layer, run in enumerate(layer_runs):
        statistics.add(layer, run)
    return statistics.result()


class TextStatistics:
    """One text's statistics of every head (a ModelStatistics over that text alone), a layer's run at a time: add(layer,
    run) for each layer, then result(). Measured as `attnviz stats` measures a batch (batch_statistics, a batch of one),
    in float64: the same numbers as the per-text definition (head_statistics, js_distance) in a tenth of its time at
    512 tokens."""

    def __init__(self, num_layers: int, causal: bool):
        from attnviz.analysis.statistics import StatisticsAccumulator

        self.accumulator, self.kinds = StatisticsAccumulator(num_layers, causal), None

    def add(self, layer: int, run) -> None:
        import torch

        from attnviz.analysis.statistics import key_kind_columns

        if self.kinds is None:
            self.kinds = key_kind_columns([run.query_tokens], len(run.query_tokens))  # (1, N, K)
        attention = torch.from_numpy(np.asarray(run.attention, dtype=np.float64))[None]  # (1, H, N, N)
        self.accumulator.add_batch(layer, attention, torch.tensor([attention.shape[-1]]), self.kinds)

    def result(self):
        return self.accumulator.result()

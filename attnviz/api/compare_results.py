"""What attnviz.compare and attnviz.position return: one layer's heads split several ways, and its attention over a
permuted text; numbers, a figure, files, a display."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.api import display
from attnviz.api.run_results import Rendered, save_run_files, tensor
from attnviz.spec import RunSpec


@dataclass(frozen=True, repr=False)
class CompareResult:
    """One layer's projections split into different numbers of heads, as `attnviz compare` runs them."""

    splits: list  # attnviz.analysis.compare.Split, one per (weights, head count)
    spec: RunSpec  # the shared settings; each split has its own head count and weights

    @property
    def tokens(self) -> list[str]:
        return self.splits[0].run.query_tokens

    @property
    def attention(self) -> dict:
        """{(weights, head count): torch.Tensor (H, N, N)}."""
        return {(split.weights, split.num_heads): tensor(split.run.attention) for split in self.splits}

    def figure(self):
        """compare.png: a row per weights, a column per head count."""
        from attnviz.render.compare_figures import comparison_figure

        return comparison_figure(self.splits, seed=self.spec.seed)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz compare --out folder` writes: compare.<format> and compare.json."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        """save's files, written straight into an existing folder (the command line stages its own)."""
        from attnviz.output.compare_json import write_comparison_json
        from attnviz.render.compare_figures import write_comparison_figure

        return [
            write_comparison_figure(self.splits, folder, format, seed=self.spec.seed),
            write_comparison_json(self.splits, self.spec, folder / "compare.json"),
        ]

    def to_dict(self) -> dict:
        """compare.json's content."""
        from attnviz.output.compare_json import comparison_record

        return comparison_record(self.splits, self.spec)

    def __rich__(self):
        from attnviz.render.terminal import compare_table

        return compare_table(self.splits)

    def _repr_html_(self) -> str:
        rows = [
            [split.weights, split.num_heads, split.run.head_dim, display.number(split.mean_relative_entropy),
             display.number(split.mean_max)]
            for split in self.splits
        ]  # fmt: skip
        return display.result_html(
            f"compare · {self.splits[0].run.model} · layer {self.splits[0].run.layer} · {self.splits[0].run.text}",
            display.tokens_html(self.splits[0].run.shown_tokens[0]),
            display.figure_html(self.figure(), "the same projections split into different numbers of heads"),
            display.table_html(["parameters", "heads", "d", "rel.", "mean max"], rows, "rel.: row entropy / log(keys), mean over heads"),
        )

    def __repr__(self) -> str:
        return f"<attnviz.CompareResult {len(self.splits)} splits of {self.splits[0].run.text!r}>"


@dataclass(frozen=True, repr=False)
class PositionResult:
    """Layer 0 over a text and its permutation, without and with position embeddings (`attnviz position`)."""

    result: Any  # attnviz.analysis.position.PositionResult
    spec: RunSpec
    source: str
    device_label: str

    @property
    def tokens(self) -> list[str]:
        return self.result.tokens

    @property
    def permutation(self) -> list[int]:
        return self.result.permutation

    @property
    def with_positions(self):
        """attnviz.analysis.position.PositionSide: original, permuted, permuted_back (H, N, N) arrays, and their differences."""
        return self.result.with_positions

    @property
    def without_positions(self):
        return self.result.without_positions

    def figure(self):
        """position.png: one head, without and with position embeddings."""
        from attnviz.render.position_figure import position_figure

        return position_figure(self.result)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz position --out folder` writes: position.<format> and position.json."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        """save's files, written straight into an existing folder (the command line stages its own)."""
        from attnviz.output.position_json import write_position_json
        from attnviz.render.position_figure import write_position_figure

        return [
            write_position_figure(self.result, folder, format),
            write_position_json(self.result, self.spec, folder / "position.json"),
        ]

    def to_dict(self) -> dict:
        """position.json's content."""
        from attnviz.output.position_json import position_record

        return position_record(self.result, self.spec)

    def __rich_console__(self, console, options):
        from attnviz.render.terminal import print_position

        printed = display.Printed(options.max_width)
        print_position(printed, self.result, self.source, self.device_label)
        yield printed.group()

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        from attnviz.analysis.position import format_difference

        rows = [
            [label, format_difference(side.max_difference), format_difference(side.output_difference),
             "yes" if side.equivariant else "no"]
            for label, side in (("without", self.without_positions), ("with BERT's", self.with_positions))
        ]  # fmt: skip
        return display.result_html(
            f"position · {self.result.model} · {self.result.text}",
            display.tokens_html(self.tokens),
            display.tokens_html(self.result.permuted_tokens, "permuted"),
            display.figure_html(self.figure(), "attention without and with position embeddings"),
            display.table_html(["position embeddings", "max |A(Px) − P A(x) Pᵀ|", "output", "equivariant"], rows),
        )

    def __repr__(self) -> str:
        return f"<attnviz.PositionResult {self.result.text!r}: permutation {self.permutation}>"

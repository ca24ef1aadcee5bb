"""What attnviz.trace returns: every split and merge of the heads, step by step, its files and a display."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.api import display
from attnviz.api.run_results import HeadsResult, Rendered, report_result, save_run_files
from attnviz.spec import RunSpec


@dataclass(frozen=True)
class TraceStep:
    """One tensor a layout made, read from the tensor itself (attnviz.tracing.Step, named for readers)."""

    layout: str
    role: str  # stable across layouts: x, q, q_view, q_heads, scores, pattern, z, z_merged, out, ...
    code: str  # the PyTorch code, as the tutorial writes it
    pattern: str | None  # einops-style rearrange or einsum pattern
    input_shapes: list[list[int]]
    output_shape: list[int]
    stride: list[int]
    contiguous: bool
    memory: str | None  # "view" (shares memory with an input), "new" (a copy) or None (an input)
    in_tutorial: bool  # False: a step attnviz adds to the tutorial's code
    note: str | None


@dataclass(frozen=True, repr=False)
class TraceResult:
    """Every split and merge of the heads, step by step, as `attnviz trace` records it.

    trace is attnviz.tracing.TraceResult; runs the texts' AttentionRuns (their tokens label it).
    """

    trace: Any
    runs: list
    spec: RunSpec
    num_layers: int | None = None  # the model's layers (of spec.stack), for the report's header

    @property
    def texts(self) -> list[str]:
        return self.trace.texts

    @property
    def tokens(self) -> list[str]:
        """The first text's tokens."""
        return self.runs[0].query_tokens

    @property
    def steps(self) -> list[TraceStep]:
        """Every layout's steps, in order (one layout unless layout="all")."""
        return [
            TraceStep(
                layout=trace.name, role=step.role, code=step.operation, pattern=step.pattern,
                input_shapes=step.input_shapes, output_shape=step.output_shape, stride=step.stride,
                contiguous=step.contiguous, memory=step.memory, in_tutorial=step.in_tutorial, note=step.note,
            )  # fmt: skip
            for trace in self.trace.layouts
            for step in trace.steps
        ]

    @property
    def agree(self) -> bool:
        """True when every layout matches its reference within 1e-5."""
        return self.trace.agree

    def check(self) -> list[dict]:
        """The agreement table: each layout against its reference, the largest differences of attention and output."""
        return [
            {
                "layout": check.layout,
                "reference": check.reference,
                "num_heads": check.num_heads,
                "attention_diff": check.weights_diff,
                "output_diff": check.output_diff,
                "agree": check.agree,
            }
            for check in self.trace.checks
        ]

    def heads_results(self) -> list[HeadsResult]:
        """Each text's heads, as attnviz.heads returns them (the trace has run them already)."""
        return [HeadsResult(run, self.spec, self.num_layers) for run in self.runs]

    def figure(self, head: int | None = None):
        """The first text's heads (a grid, or one head), as attnviz.heads draws them."""
        return HeadsResult(self.runs[0], self.spec).figure(head)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz trace ... --out folder` writes: trace.json, trace.md, and a mistake's figures."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png", notes: list[str] | None = None) -> list[Path]:
        """save's files, written straight into an existing folder; notes gets a line per figure capped in size or thinned."""
        from attnviz.output.trace_files import write_trace_files

        return write_trace_files(self.trace, self.runs, self.spec, folder, format, notes)

    def to_dict(self) -> dict:
        """trace.json's content."""
        from attnviz.output.trace_files import trace_record

        return trace_record(self.trace, self.spec)

    def report(self):
        """The interactive report of the traced layer with this trace (a ReportResult).

        A trace of several texts (one padded batch) is shown with the first text.
        """
        from attnviz.html import ReportText

        mistaken = self.trace.mistake is not None
        first = ReportText(self.runs[0], trace=None if mistaken else self.trace, mistakes=[self.trace] if mistaken else [])
        others = [ReportText(run) for run in self.runs[1:]]
        return report_result([first, *others], self.spec, self.num_layers)

    def __rich_console__(self, console, options):
        from attnviz.render.trace_tables import print_trace

        printed = display.Printed(options.max_width)
        print_trace(printed, self.trace, text_tokens=[run.shown_tokenizer_tokens[0] for run in self.runs])
        yield printed.group()

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        step_rows = [
            [
                step.layout, step.role, step.code, " ".join(map(str, step.input_shapes)) or "", str(step.output_shape),
                str(step.stride), "yes" if step.contiguous else "no", step.memory or "input",
            ]
            for step in self.steps
        ]
        check_rows = [
            [c["layout"], c["reference"], f"{c['attention_diff']:.1e}", f"{c['output_diff']:.1e}", "yes" if c["agree"] else "NO"]
            for c in self.check()
        ]
        return display.result_html(
            f"trace · {self.trace.model} · layer {self.trace.layer} · {self.trace.num_heads} heads",
            display.tokens_html(self.runs[0].shown_tokenizer_tokens[0]),
            display.table_html(["layout", "role", "code", "shapes in", "shape out", "stride", "contiguous", "memory"], step_rows),
            display.table_html(["layout", "reference", "attention", "output", "agree"], check_rows, "max |difference|; agree within 1e-5"),
        )  # fmt: skip

    def __repr__(self) -> str:
        layouts = ", ".join(trace.name for trace in self.trace.layouts)
        return f"<attnviz.TraceResult {layouts}: {len(self.steps)} steps, {'agree' if self.agree else 'DISAGREE'}>"

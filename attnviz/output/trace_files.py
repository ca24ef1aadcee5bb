"""Shape traces for programs and documents: trace.json and trace.md, and the files of a trace.

The formats are documented in docs/formats.md ("trace.json"); the terminal's words are trace_tables's,
and trace.md uses the same ones.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from rich.table import Table

from attnviz.run_data import truncation_json
from attnviz.spec import RunSpec
from attnviz.tracing import ADDED_MARK, LAYOUT_DESCRIPTIONS, TOLERANCE, Step, TraceResult
from attnviz.render.trace_tables import (
    axis_legend, batch_table, check_name, checks_explanation, difference_text, grouped, head_slices_extras,
    head_slices_title, memory_word, scores_formula, shape_text,
)  # fmt: skip

FORMAT_VERSION = 1
DECIMALS = 10  # differences are ~1e-7; keep them readable and exact enough to compare with 1e-5

# The documented keys of trace.json (docs/formats.md, "trace.json"); the tests hold the file to them.
TRACE_KEYS = (
    "format", "version", "settings", "texts", "kv_text", "truncated", "kv_truncated", "model", "layer", "weights",
    "causal", "device",
    "num_heads", "num_kv_heads", "head_dim", "model_size", "scale", "valid_lens", "tolerance", "layouts", "checks",
    "head_slices", "mistake", "notes",
)  # fmt: skip
LAYOUT_KEYS = ("layout", "mistake", "description", "num_heads", "head_dim", "notes", "steps")
STEP_KEYS = (
    "index", "role", "operation", "inputs", "input_shapes", "input_axes", "output_shape",
    "output_axes", "pattern", "stride", "contiguous", "memory", "dtype", "mistake", "in_tutorial", "note",
)  # fmt: skip
CHECK_KEYS = ("layout", "reference", "weights_max_abs_diff", "output_max_abs_diff", "agree")
HEAD_SLICE_KEYS = (
    "head", "columns", "kv_head", "kv_columns", "scores_max_abs_diff", "z_max_abs_diff", "scores_max_abs", "agree",
)  # fmt: skip
MISTAKE_KEYS = ("mistake", "wrong_steps", "weights_max_abs_diff", "output_max_abs_diff")


# ---- trace.json ----


def step_record(index: int, step: Step) -> dict:
    return {
        "index": index,
        "role": step.role,
        "operation": step.operation,
        "inputs": step.inputs,
        "input_shapes": step.input_shapes,
        "input_axes": step.input_axes,
        "output_shape": step.output_shape,
        "output_axes": step.output_axes,
        "pattern": step.pattern,
        "stride": step.stride,
        "contiguous": step.contiguous,
        "memory": step.memory,
        "dtype": step.dtype,
        "mistake": step.mistake,
        "in_tutorial": step.in_tutorial,
        "note": step.note,
    }


def _rounded(value: float) -> float:
    return round(float(value), DECIMALS)


def trace_record(result: TraceResult, spec: RunSpec) -> dict:
    mistake = result.mistake
    return {
        "format": "attnviz-trace",
        "version": FORMAT_VERSION,
        "settings": spec.to_dict(),
        "texts": result.texts,
        "kv_text": result.kv_text,
        "truncated": [truncation_json(truncation) for truncation in result.truncated],
        "kv_truncated": truncation_json(result.kv_truncated),
        "model": result.model,
        "layer": result.layer,
        "weights": result.weights,
        "causal": result.causal,
        "device": result.device,
        "num_heads": result.num_heads,
        "num_kv_heads": result.num_kv_heads or result.num_heads,
        "head_dim": result.head_dim,
        **({"d_q": result.seed_sizes[0], "d_out": result.seed_sizes[1]} if result.seed_sizes is not None else {}),
        "model_size": result.model_size,
        "scale": result.scale if result.scale is not None else 1 / math.sqrt(result.head_dim),
        "valid_lens": result.valid_lens,
        "tolerance": TOLERANCE,
        "layouts": [
            {
                "layout": trace.layout,
                "mistake": trace.mistake,
                "description": LAYOUT_DESCRIPTIONS[trace.layout],
                "num_heads": trace.num_heads,
                "head_dim": trace.head_dim,
                "notes": trace.notes,
                "steps": [step_record(index, step) for index, step in enumerate(trace.steps)],
            }
            for trace in result.layouts
        ],
        "checks": [
            {
                "layout": check.layout,
                "reference": check.reference,
                "weights_max_abs_diff": _rounded(check.weights_diff),
                "output_max_abs_diff": _rounded(check.output_diff),
                "agree": check.agree,
            }
            for check in result.checks
        ],
        "head_slices": [
            {
                "head": head.head,
                "columns": [head.start, head.stop - 1],
                "kv_head": head.kv_head,
                "kv_columns": [head.kv_start, head.kv_stop - 1],
                "scores_max_abs_diff": _rounded(head.scores_diff),
                "z_max_abs_diff": _rounded(head.z_diff),
                "scores_max_abs": _rounded(head.scores_scale),
                "agree": head.agree,
            }
            for head in result.head_slices
        ],
        "mistake": None
        if mistake is None
        else {
            "mistake": mistake.mistake,
            "wrong_steps": mistake.wrong_steps,
            "weights_max_abs_diff": _rounded(mistake.weights_diff),
            "output_max_abs_diff": _rounded(mistake.output_diff),
        },
        "notes": result.notes,
    }


# A list of numbers or of axis names, as json.dumps(indent=1) spreads it over lines.
_SHORT_LIST = re.compile(r'\[\s+((?:-?[\w.+*]+|"[\w*/]+")(?:,\s+(?:-?[\w.+*]+|"[\w*/]+"))*)\s+\]')


def trace_json(result: TraceResult, spec: RunSpec) -> str:
    """Indented, with each shape, stride and list of axis names on one line."""
    text = json.dumps(trace_record(result, spec), ensure_ascii=False, indent=1)
    return _SHORT_LIST.sub(lambda match: "[" + re.sub(r",\s+", ", ", match.group(1)) + "]", text)


def write_trace_json(result: TraceResult, spec: RunSpec, path: Path) -> Path:
    path.write_text(trace_json(result, spec), encoding="utf-8")
    return path


# ---- trace.md ----


def _cell(text: str | None) -> str:
    """Plain text for Markdown: pipes and asterisks (h*d, B*H) escaped, line breaks flattened."""
    return re.sub(r"([|*_`\\])", r"\\\1", text or "").replace("\n", " ")


def _code(text: str | None) -> str:
    """A code span inside a table: only the pipe needs escaping there."""
    return "`" + (text or "").replace("|", "\\|").replace("\n", " ") + "`" if text else ""


def _shape_with_axes(shape: list[int], axes: list[str]) -> str:
    return f"{shape_text(shape)} {' '.join(axes)}"


def _markdown_table(table: Table) -> str:
    """A Rich table of plain cells as a Markdown table, its title above."""
    header = [column.header for column in table.columns]
    rows = zip(*(column.cells for column in table.columns))
    lines = [_cell(str(table.title)), "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(str(cell)) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def trace_markdown(result: TraceResult, text_tokens: list[list[str]] | None = None) -> str:
    quoted = " · ".join(f"“{text}”" for text in result.texts)
    if result.kv_text:
        quoted += f" → keys and values from “{result.kv_text}”"
    lines = [
        f"# Shape trace: {_cell(quoted)}",
        "",
        f"{_cell(result.model)} · layer {result.layer} · {result.weights} weights · {result.num_heads} heads "
        + (f"sharing {result.num_kv_heads} key/value heads " if (result.num_kv_heads or result.num_heads) != result.num_heads else "")
        + f"× d = {result.head_dim} · D = {result.model_size}" + (" · causal" if result.causal else ""),
    ]
    if result.features:
        lines += ["", f"Beyond the tutorials' layers: {_cell('; '.join(result.features))}."]
    if result.valid_lens is not None:
        lines += ["", f"Valid lengths of the keys (the rest is padding, masked): {result.valid_lens}"]
    if len(result.texts) > 1 and text_tokens:
        lines += ["", _markdown_table(batch_table(result, text_tokens).renderables[0])]
    for trace in result.layouts:
        lines += ["", f"## {_cell(trace.name)}", "", _cell(LAYOUT_DESCRIPTIONS[trace.layout]), ""]
        if trace.mistake:
            lines += ["**The wrong computation, made on purpose.**", ""]
        lines += [f"- {_cell(note)}" for note in trace.notes] + ([""] if trace.notes else [])
        lines += [
            "| # | role | operation | pattern | input shapes | output shape | stride | contiguous | memory | note |",
            "| ---: | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for index, step in enumerate(trace.steps):
            inputs = "<br>".join(
                _shape_with_axes(shape, axes) for shape, axes in zip(step.input_shapes, step.input_axes)
            )
            role = ("" if step.in_tutorial else f"{ADDED_MARK} ") + step.role
            role = f"**✗ {role}**" if step.mistake else role
            lines.append(
                f"| {index} | {role} | {_code(step.operation)} | {_code(step.pattern)} | {_cell(inputs)} | "
                f"{_cell(_shape_with_axes(step.output_shape, step.output_axes))} | {shape_text(step.stride)} | "
                f"{'yes' if step.contiguous else 'no'} | {memory_word(step)} | {_cell(step.note)} |"
            )
        legend = axis_legend(trace) + ". Memory: view shares its input's, new is a copy."
        if not all(step.in_tutorial for step in trace.steps):
            legend += f" {ADDED_MARK}: a step the tutorial does not have."
        lines += ["", _cell(legend)]
    if result.head_slices:  # none for the seed's single head of its own sizes: no model's columns to slice
        lines += [
            "",
            "## Head slices",
            "",
            _cell(head_slices_title(result)) + " (x @ W + b). "
            "Its scores and z recomputed from those slices alone, against the layer's; they agree when the "
            f"differences are float32 rounding: at most {TOLERANCE:.0e} × max(1, max abs scores) and {TOLERANCE:.0e}."
            + "".join(f" {_cell(extra[0].upper() + extra[1:])}." for extra in head_slices_extras(result))
            + (f" Scores: {_cell(scores_formula(result))}." if result.scale is not None else ""),
            "",
        ]
        shared = grouped(result)
        kv_header, kv_rule = (" kv head | W_k, W_v columns |", " ---: | ---: |") if shared else ("", "")
        lines += [
            f"| head | {'W_q columns' if shared else 'columns'} |{kv_header} max abs diff, scores | max abs scores | "
            "max abs diff, z | agree |",
            f"| ---: | ---: |{kv_rule} ---: | ---: | ---: | --- |",
        ]
        for head in result.head_slices:
            kv_cells = f" {head.kv_head} | {head.kv_start}–{head.kv_stop - 1} |" if shared else ""
            lines.append(
                f"| {head.head} | {head.start}–{head.stop - 1} |{kv_cells} {difference_text(head.scores_diff)} | "
                f"{head.scores_scale:.3g} | {difference_text(head.z_diff)} | {'yes' if head.agree else '**no**'} |"
            )
    lines += [
        "",
        "## Checks",
        "",
        _cell(checks_explanation(result)[0].upper() + checks_explanation(result)[1:]) + ".",
        "",
        "| layout | compared with | weights | output | agree |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for check in result.checks:
        lines.append(
            f"| {_cell(check_name(check.layout))} | {_cell(check.reference)} | {difference_text(check.weights_diff)} | "
            f"{difference_text(check.output_diff)} | {'yes' if check.agree else '**no**'} |"
        )
    lines += [f"\n- {_cell(note)}" for note in result.notes]
    if result.mistake is not None:
        mistake = result.mistake
        lines += [
            "",
            f"## Mistake: {mistake.mistake}",
            "",
            f"Wrong steps: {', '.join(mistake.wrong_steps)}. Largest difference from the right run: "
            f"weights {difference_text(mistake.weights_diff)}, output {difference_text(mistake.output_diff)}.",
        ]
    return "\n".join(lines) + "\n"


def write_trace_markdown(result: TraceResult, path: Path, text_tokens: list[list[str]] | None = None) -> Path:
    path.write_text(trace_markdown(result, text_tokens), encoding="utf-8")
    return path


# ---- the files of a trace ----


def write_trace_files(
    result: TraceResult, runs: list, spec: RunSpec, out_dir: Path, fmt: str = "png", notes: list[str] | None = None
) -> list[Path]:
    """trace.json and trace.md; with a mistake, the right heads' heatmaps and the mistake's figures beside them;
    with the single-head tutorial's own sizes (seed_sizes), its one map, head_00.

    runs are the AttentionRuns of the texts (their tokens label the batch; the first text's, the
    figures); spec the run's settings; notes receives a line for each figure that was capped or thinned.
    """
    from attnviz.render.mistake_figures import write_mistake_figures

    text_tokens = [run.shown_tokenizer_tokens[0] for run in runs]
    written = [write_trace_json(result, spec, out_dir / "trace.json")]
    written.append(write_trace_markdown(result, out_dir / "trace.md", text_tokens))
    if result.mistake is not None:
        written += write_mistake_figures(result, runs[0], out_dir, fmt, notes, spec.seed)
    if result.seed_sizes is not None:  # the seed's one head: its map A, head_00 (the runs hold it: tracing.seed_head_run)
        from attnviz.render.heatmap import write_head_heatmaps

        d_q, d_out = result.seed_sizes
        written += write_head_heatmaps(runs[0], out_dir, fmt, note=f"the single-head tutorial's layer: d_q {d_q}, d_out {d_out}", seed=spec.seed)
    return written

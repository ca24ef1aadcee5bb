"""Shape traces for people and programs: Rich tables for an 80-column terminal, trace.json,
trace.md, and the figure of a wrong merge. The formats are documented in README.md.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from attnviz.result import truncation_json
from attnviz.spec import RunSpec
from attnviz.trace import LAYOUT_DESCRIPTIONS, TOLERANCE, LayoutTrace, Step, TraceResult

FORMAT_VERSION = 1
DECIMALS = 10  # differences are ~1e-7; keep them readable and exact enough to compare with 1e-5

# The documented keys of trace.json (README.md, "trace.json"); the tests hold the file to them.
TRACE_KEYS = (
    "format", "version", "settings", "texts", "kv_text", "truncated", "kv_truncated", "model", "layer", "weights",
    "causal", "device",
    "num_heads", "head_dim", "model_size", "valid_lens", "tolerance", "layouts", "checks",
    "head_slices", "mistake", "notes",
)  # fmt: skip
LAYOUT_KEYS = ("layout", "mistake", "description", "num_heads", "head_dim", "notes", "steps")
STEP_KEYS = (
    "index", "role", "operation", "inputs", "input_shapes", "input_axes", "output_shape",
    "output_axes", "pattern", "stride", "contiguous", "memory", "dtype", "mistake", "note",
)  # fmt: skip
CHECK_KEYS = ("layout", "reference", "weights_max_abs_diff", "output_max_abs_diff", "agree")
HEAD_SLICE_KEYS = ("head", "columns", "scores_max_abs_diff", "z_max_abs_diff", "scores_max_abs", "agree")
MISTAKE_KEYS = ("mistake", "wrong_steps", "weights_max_abs_diff", "output_max_abs_diff")

# The roles a layout's one-line summary follows, from the input to the output.
FLOW_ROLES = ("x", "q_heads", "pattern", "z", "z_merged", "out")


# ---- numbers and shapes as text ----


def shape_text(shape: list[int]) -> str:
    """(1, 8, 384); a one-axis shape keeps Python's trailing comma: (2,)."""
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def aligned_shape(shape: list[int], axes: list[str]) -> tuple[str, str]:
    """The shape and, on a second line, each axis name right under its number.

    (1, 12, 8, 32)
     B   H  N   d
    """
    widths = [max(len(str(size)), len(name)) for size, name in zip(shape, axes)]
    numbers = ", ".join(str(size).rjust(width) for size, width in zip(shape, widths))
    names = "  ".join(name.rjust(width) for name, width in zip(axes, widths))
    margin = len(numbers) - len(numbers.lstrip())  # "  (192,)", not "(  192,)"
    return " " * margin + f"({numbers.lstrip()}{',' if len(shape) == 1 else ''})", f" {names}"


def difference_text(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


# ---- the terminal ----


def layout_heading(trace: LayoutTrace) -> Text:
    heading = Text(trace.name, style="bold red" if trace.mistake else "bold")
    heading.append(f"  {trace.num_heads} head{'s' if trace.num_heads > 1 else ''} × d = {trace.head_dim}", style="dim")
    heading.append("\n" + LAYOUT_DESCRIPTIONS[trace.layout])
    for note in trace.notes:
        heading.append(f"\nnote: {note}", style="dim")
    return heading


def flow_text(trace: LayoutTrace, width: int = 80) -> Text:
    """x (1, 8, 384) → q_heads (1, 12, 8, 32) → pattern (1, 12, 8, 8) → ... → out (1, 8, 384),
    broken only at an arrow, and what the pattern is: one (Nq, Nk) map per head and text."""
    text, line_length = Text(), 0
    for step in trace.steps:
        if step.role not in FLOW_ROLES:
            continue
        segment = f"{step.role} {shape_text(step.output_shape)}"
        if text:
            arrow = " → " if line_length + 3 + len(segment) <= width else " →\n"
            text.append(arrow, style="dim")
            line_length = 0 if arrow.endswith("\n") else line_length + 3
        text.append(step.role, style="bold")
        text.append(" " + shape_text(step.output_shape))
        line_length += len(segment)
    *leading, num_queries, num_keys = trace.weights.shape  # (B, H, Nq, Nk)
    maps = math.prod(leading)
    text.append(
        f"\n{trace.num_heads} head{'s' if trace.num_heads > 1 else ''} × {leading[0]} text{'s' if leading[0] > 1 else ''}"
        f" = {maps} attention map{'s' if maps > 1 else ''} of ({num_queries}, {num_keys})",
        style="dim",
    )
    return text


def _operation_cell(step: Step) -> Text:
    cell = Text(("✗ " if step.mistake else "") + step.role, style="bold red" if step.mistake else "bold")
    cell.append("\n" + step.operation, style="red" if step.mistake else "")
    if step.pattern:
        cell.append("\n" + step.pattern, style="cyan")
    if step.note:
        cell.append("\n" + step.note, style="red" if step.mistake else "dim italic")
    return cell


def _shape_cell(step: Step) -> Text:
    cell = Text()
    for shape in step.input_shapes:
        cell.append(shape_text(shape) + "\n", style="dim")
    numbers, names = aligned_shape(step.output_shape, step.output_axes)
    arrow = "→ " if step.input_shapes else ""
    cell.append(arrow + numbers, style="bold")
    cell.append("\n" + " " * len(arrow) + names, style="green")
    return cell


def _stride_cell(step: Step) -> Text:
    cell = Text(shape_text(step.stride))
    cell.append("\ncontiguous" if step.contiguous else "\nnot contiguous", style="dim" if step.contiguous else "yellow")
    if step.memory == "view":
        cell.append("\nview: no copy", style="dim")
    return cell


def steps_table(trace: LayoutTrace) -> Table:
    """One row per step: role, code, einops pattern and note | shapes in → out, axis names | stride."""
    table = Table(box=box.SIMPLE_HEAD, show_lines=True, pad_edge=False, padding=(0, 1), expand=False)
    table.add_column("step · operation · pattern", ratio=1, overflow="fold")
    table.add_column("shape in → out", no_wrap=True)
    table.add_column("stride", overflow="fold")
    for step in trace.steps:
        table.add_row(_operation_cell(step), _shape_cell(step), _stride_cell(step))
    return table


def head_slices_table(result: TraceResult) -> Group:
    d = result.head_dim
    table = Table(
        title=f"head slices: head h uses columns h*{d} .. (h+1)*{d}-1 of W_q, W_k, W_v", title_justify="left",
        box=box.SIMPLE_HEAD, pad_edge=False,
    )
    table.add_column("head", justify="right")
    table.add_column("columns", justify="right")
    table.add_column("Δ scores", justify="right")
    table.add_column("max |scores|", justify="right")
    table.add_column("Δ z", justify="right")
    table.add_column("")
    for head in result.head_slices:
        table.add_row(
            str(head.head),
            f"{head.start}–{head.stop - 1}",
            difference_text(head.scores_diff),
            f"{head.scores_scale:.3g}",
            difference_text(head.z_diff),
            Text("✓", style="green") if head.agree else Text("✗", style="bold red"),
        )
    explanation = Text(
        "Q_h = x @ W_q[:, cols] + b_q[cols], K_h and V_h alike, from these slices alone "
        "(W = self.w_q.weight.T: nn.Linear keeps (out, in), so cols are its rows). "
        "Δ scores = max |Q_h K_hᵀ/√d − scores[:, h]|, Δ z = max |A_h V_h − z[:, h]|; "
        f"✓: float32 rounding, Δ scores at most {TOLERANCE:.0e} × max(1, max |scores|).",
        style="dim",
    )
    return Group(table, explanation)


def checks_table(result: TraceResult) -> Group:
    table = Table(title="do the layouts agree?", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("layout", "compared with", "weights", "output", ""):
        table.add_column(name, justify="right" if name in ("weights", "output") else "left")
    for check in result.checks:
        mark = Text("✓", style="green") if check.agree else Text("✗ differs", style="bold red")
        table.add_row(
            check.layout, check.reference, difference_text(check.weights_diff), difference_text(check.output_diff), mark
        )
    explanation = Text(
        "largest absolute difference of the attention weights and of the output from the reference; "
        f"they agree when both are at most {TOLERANCE:.0e}",
        style="dim",
    )
    return Group(table, explanation)


def mistake_text(result: TraceResult, tokens: list[str] | None = None) -> Text:
    """What the mistake changed, with numbers; for a wrong merge, where one slot's numbers came from."""
    from attnviz.trace import merge_provenance

    mistake = result.mistake
    text = Text(f"mistake: {mistake.mistake}", style="bold red")
    text.append(f"\nwrong steps: {', '.join(mistake.wrong_steps)} (marked ✗ above)")
    if mistake.weights_diff == 0:
        text.append("\nthe weights are the same: this mistake comes after the softmax")
    else:
        text.append(f"\nthe weights differ from the right ones by up to {mistake.weights_diff:.3g}")
    text.append(f"\nthe output differs from the right one by up to {mistake.output_diff:.3g}")
    if mistake.mistake == "merge-without-permute":
        num_tokens = result.layouts[0].weights.shape[2]
        wrong = merge_provenance(result.num_heads, num_tokens, result.head_dim, mistake.mistake)
        row = 1 if num_tokens > 1 else 0
        head, token = wrong[row, 0].tolist()
        name = lambda index: f"token {index}" + (f" “{tokens[index]}”" if tokens and index < len(tokens) else "")
        text.append(
            f"\ne.g. in the merged row of {name(row)}, columns 0..{result.head_dim - 1} hold head {head}'s output "
            f"for {name(token)}, not head 0's for token {row}"
        )
    return text


def print_trace(console: Console, result: TraceResult, slices: bool = True, tokens: list[str] | None = None) -> None:
    """Every layout's steps, then the head slices, the checks and the mistake."""
    if result.valid_lens is not None:
        console.print(
            Text(f"batch of {len(result.texts)} texts padded to one length; valid lengths (keys): {result.valid_lens}")
        )
    for trace in result.layouts:
        console.print()
        console.print(layout_heading(trace))
        console.print(flow_text(trace, console.width))
        console.print(steps_table(trace))
    if slices:
        console.print()
        console.print(head_slices_table(result))
    console.print()
    console.print(checks_table(result))
    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if result.mistake is not None:
        console.print(mistake_text(result, tokens))


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
        "head_dim": result.head_dim,
        "model_size": result.model_size,
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
_SHORT_LIST = re.compile(r'\[\s+((?:-?[\w.+*]+|"[\w*]+")(?:,\s+(?:-?[\w.+*]+|"[\w*]+"))*)\s+\]')


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


def trace_markdown(result: TraceResult) -> str:
    quoted = " · ".join(f"“{text}”" for text in result.texts)
    if result.kv_text:
        quoted += f" → keys and values from “{result.kv_text}”"
    lines = [
        f"# Shape trace: {_cell(quoted)}",
        "",
        f"{_cell(result.model)} · layer {result.layer} · {result.weights} weights · {result.num_heads} heads "
        f"× d = {result.head_dim} · D = {result.model_size}" + (" · causal" if result.causal else ""),
    ]
    if result.valid_lens is not None:
        lines += ["", f"Valid lengths of the keys (the rest is padding): {result.valid_lens}"]
    lines += ["", "Axes: B batch, N tokens (Nq queries, Nk keys), H heads, d head size, D model size, 1 broadcast."]
    for trace in result.layouts:
        lines += ["", f"## {_cell(trace.name)}", "", _cell(LAYOUT_DESCRIPTIONS[trace.layout]), ""]
        lines += [f"- {_cell(note)}" for note in trace.notes] + ([""] if trace.notes else [])
        lines += [
            "| # | role | operation | pattern | input shapes | output shape | stride | contiguous | memory | note |",
            "| ---: | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for index, step in enumerate(trace.steps):
            inputs = "<br>".join(
                _shape_with_axes(shape, axes) for shape, axes in zip(step.input_shapes, step.input_axes)
            )
            role = f"**✗ {step.role}**" if step.mistake else step.role
            lines.append(
                f"| {index} | {role} | {_code(step.operation)} | {_code(step.pattern)} | {_cell(inputs)} | "
                f"{_cell(_shape_with_axes(step.output_shape, step.output_axes))} | {shape_text(step.stride)} | "
                f"{'yes' if step.contiguous else 'no'} | {step.memory or ''} | {_cell(step.note)} |"
            )
    lines += [
        "",
        "## Head slices",
        "",
        f"Head h uses columns h·{result.head_dim} .. (h+1)·{result.head_dim} − 1 of W_q, W_k and W_v (x @ W + b). "
        "Its scores and z recomputed from those slices alone, against the layer's; they agree when the "
        f"differences are float32 rounding: at most {TOLERANCE:.0e} × max(1, max abs scores) and {TOLERANCE:.0e}.",
        "",
        "| head | columns | max abs diff, scores | max abs scores | max abs diff, z | agree |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for head in result.head_slices:
        lines.append(
            f"| {head.head} | {head.start}–{head.stop - 1} | {difference_text(head.scores_diff)} | "
            f"{head.scores_scale:.3g} | {difference_text(head.z_diff)} | {'yes' if head.agree else '**no**'} |"
        )
    lines += [
        "",
        "## Checks",
        "",
        f"Largest absolute difference from the reference; the layouts agree when both are at most {TOLERANCE:.0e}.",
        "",
        "| layout | compared with | weights | output | agree |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for check in result.checks:
        lines.append(
            f"| {check.layout} | {_cell(check.reference)} | {difference_text(check.weights_diff)} | "
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


def write_trace_markdown(result: TraceResult, path: Path) -> Path:
    path.write_text(trace_markdown(result), encoding="utf-8")
    return path


# ---- the files of a trace ----


def mistake_prefix(mistake: str) -> str:
    return f"mistake_{mistake}_"


def write_trace_files(result: TraceResult, run, spec: RunSpec, out_dir: Path, fmt: str = "png") -> list[Path]:
    """trace.json and trace.md; with a mistake, the right heads' heatmaps and the mistaken ones beside them.

    run is the AttentionRun of the first text (its tokens label the figures); spec the run's settings.
    """
    written = [write_trace_json(result, spec, out_dir / "trace.json")]
    written.append(write_trace_markdown(result, out_dir / "trace.md"))
    if result.mistake is not None:
        written += write_mistake_figures(result, run, out_dir, fmt)
    return written


def write_mistake_figures(result: TraceResult, run, out_dir: Path, fmt: str = "png") -> list[Path]:
    """head_XX and heads (right), and beside them the mistaken heads of the first text.

    A wrong split changes the weights: its heads get heatmaps of their own. A wrong merge
    leaves the weights as they were and mixes up the merged rows: its figure shows where
    each head's output lands.
    """
    from dataclasses import replace

    from attnviz.heatmap import write_heatmaps

    mistake = result.mistake.mistake
    prefix = mistake_prefix(mistake)
    written = write_heatmaps(run, out_dir, fmt)
    if mistake == "view-without-permute":
        wrong = next(trace for trace in result.layouts if trace.mistake == mistake)
        num_queries, num_keys = run.attention.shape[1:]
        wrong_run = replace(
            run,
            attention=wrong.weights[0, :, :num_queries, :num_keys].numpy(),  # (H, Nq, Nk) of the first text
            output=wrong.output[0, :num_queries].numpy(),
        )
        note = " · mistake: view without permute"
        written += write_heatmaps(wrong_run, out_dir, fmt, prefix=prefix, note=note)
    else:
        written.append(write_merge_figure(result, run.query_tokens, out_dir / f"{prefix}merge.{fmt}"))
    return written


# ---- the figure of a wrong merge ----


def write_merge_figure(result: TraceResult, tokens: list[str], path: Path) -> Path:
    """Two grids, right merge and merge without permute: row n, slot h is columns h*d..(h+1)*d-1
    of token n's merged output; the colour is the token its numbers came from, the label the head."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from attnviz.fonts import displayable, use_cjk_font
    from attnviz.trace import merge_provenance

    use_cjk_font()
    num_heads, num_tokens = result.num_heads, len(tokens)
    panels = {
        "right\nz.permute(0, 2, 1, 3).contiguous().view(B, N, D)": merge_provenance(num_heads, num_tokens, result.head_dim),
        "mistake\nz.view(B, N, D)": merge_provenance(num_heads, num_tokens, result.head_dim, "merge-without-permute"),
    }
    cell = 0.5 if num_heads <= 16 else 0.25
    panel_width = max(num_heads * cell, 3.6)  # inches: wide enough for the code in its title
    figure = Figure(figsize=(2 * panel_width + 3.5, num_tokens * 0.38 + 2.4), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2, sharey=True)
    labels = [displayable(token) for token in tokens]
    for ax, (title, provenance) in zip(axes, panels.items()):
        source_tokens = provenance[..., 1].numpy()  # (N, H)
        image = ax.imshow(source_tokens, cmap="viridis", vmin=0, vmax=max(num_tokens - 1, 1), aspect="auto")
        ax.set_title(title, fontsize=9, parse_math=False)
        ax.set_xticks(range(num_heads), [str(h) for h in range(num_heads)], fontsize=7)
        ax.set_xlabel(f"slot h: columns h·{result.head_dim} .. (h+1)·{result.head_dim}−1")
        ax.set_yticks(range(num_tokens), labels, fontsize=8, parse_math=False)
        if num_tokens <= 24 and num_heads <= 16:
            for (row, slot), token in np.ndenumerate(source_tokens):
                head = int(provenance[row, slot, 0])
                ax.text(slot, row, f"h{head}\nt{token}", ha="center", va="center", fontsize=5.5,
                        color="black" if token > num_tokens / 2 else "white")  # fmt: skip
    axes[0].set_ylabel("token n (row of the merged output)")
    colorbar = figure.colorbar(image, ax=axes, shrink=0.8)
    colorbar.set_label("the token its numbers came from")
    if num_tokens <= 24:
        colorbar.set_ticks(range(num_tokens), labels=[f"{index} {label}" for index, label in enumerate(labels)])
    figure.suptitle(f"where each head's output lands in the merged rows ({num_heads} heads, h = head, t = token)")
    figure.savefig(path, dpi=120)
    return path

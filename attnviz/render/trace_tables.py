"""Shape traces for people: Rich tables for an 80-column terminal (trace.json and trace.md are
in attnviz/output/trace_files.py, the mistake's figures in mistake_figures.py).
"""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from attnviz.tracing import ADDED_MARK, LAYER_NAME, LAYOUT_DESCRIPTIONS, TOLERANCE, LayoutTrace, Step, TraceResult

# The roles a layout's one-line summary follows, from the input to the output.
FLOW_ROLES = ("x", "q_heads", "pattern", "z", "z_merged", "out")


# ---- numbers and shapes as text ----


def shape_text(shape: list[int]) -> str:
    """(1, 8, 384); a one-axis shape keeps Python's trailing comma: (2,)."""
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def aligned_shape(shape: list[int], axes: list[str]) -> tuple[str, str]:
    """The shape as Python prints it and, on a second line, each axis name ending under its number.

    (1, 12, 8, 32)
     B   H  N   d
    A name longer than its number moves right, never into the shape.
    """
    names, position = "", 1  # position: the column of this number in "(1, 12, ..."
    for size, name in zip(shape, axes):
        end = position + len(str(size))
        start = max(end - len(name), len(names) + 1 if names else 0)
        names = names.ljust(start) + name
        position = end + 2  # ", "
    return shape_text(shape), names


# The axis names of the traces (docs/commands.md, "Shape traces"); products such as B*H are explained once.
AXIS_WORDS = {
    "B": "batch", "N": "tokens", "Nq": "query tokens", "Nk": "key tokens", "H": "heads",
    "H_kv": "key/value heads", "G": "query heads per key/value head",
    "d": "head size (D / H)", "d/2": "RoPE's pairs of features", "d_q": "the queries' and keys' size (the tutorial's d_q)",
    "d_out": "the values' and output's size (the tutorial's d_out)", "D": "model size", "1": "broadcast axis",
}  # fmt: skip


def axis_legend(trace: LayoutTrace) -> str:
    """The axes a layout's steps use, with their sizes: "B = 1 batch, N = 8 tokens, ..."."""
    sizes: dict[str, int] = {}
    products = False
    for step in trace.steps:
        for name, size in zip(step.output_axes, step.output_shape):
            if name in AXIS_WORDS:
                sizes.setdefault(name, size)
            else:
                products = True
    words = dict(AXIS_WORDS)
    if trace.layout == "single-head" and any(":valid_lens" in step.operation for step in trace.steps):
        words["Nk"] = f"real keys of text {trace.shown_text} (its padding cut off)"
    if trace.layout == "single-head":
        words["d"] = "head size (D / H: all of D with one head)"
    if "D" in sizes and "H" in sizes and sizes.get("d", 0) * sizes["H"] != sizes["D"]:
        words["d"] = "head size (the model's, not D / H)"
    parts = [f"{name} = {size} {words[name]}" if name != "1" else f"1 {words[name]}" for name, size in sizes.items()]
    legend = "axes: " + ", ".join(sorted(parts, key=lambda part: list(AXIS_WORDS).index(part.split()[0])))
    return legend + ("; B*H, 3D ...: axes multiplied into one" if products else "")


def difference_text(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


# ---- the terminal ----


def layout_heading(trace: LayoutTrace) -> Text:
    heading = Text(trace.name, style="bold red" if trace.mistake else "bold")
    heading.append(f"  {trace.num_heads} head{'s' if trace.num_heads > 1 else ''} × d = {trace.head_dim}", style="dim")
    if trace.mistake:
        heading.append("\nthe wrong computation, made on purpose", style="bold red")
    heading.append("\n" + LAYOUT_DESCRIPTIONS[trace.layout])
    for note in trace.notes:
        heading.append(f"\nnote: {note}", style="dim")
    return heading


def flow_text(trace: LayoutTrace, width: int = 80, valid_lens: list[int] | None = None) -> Text:
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
    text.append("\n" + maps_text(trace, valid_lens), style="dim")
    return text


def maps_text(trace: LayoutTrace, valid_lens: list[int] | None = None) -> str:
    """How many attention maps of which shape: single-head cuts each text's padding keys off."""
    batch, num_heads, num_queries, num_keys = trace.weights.shape  # (B, H, Nq, Nk)
    heads = f"{num_heads} head{'s' if num_heads > 1 else ''}"
    if trace.layout == "single-head" and valid_lens is not None:
        shapes = ", ".join(f"text {index} ({num_queries}, {length})" for index, length in enumerate(valid_lens))
        return f"{heads}, text by text without its padding keys: attention maps of {shapes}"
    maps = batch * num_heads
    return (
        f"{heads} × {batch} text{'s' if batch > 1 else ''} = {maps} attention map{'s' if maps > 1 else ''}"
        f" of ({num_queries}, {num_keys})"
    )


def _operation_cell(step: Step) -> Text:
    mark = ("✗ " if step.mistake else "") + ("" if step.in_tutorial else ADDED_MARK + " ")
    style = "bold red" if step.mistake else "bold" if step.in_tutorial else "bold yellow"
    cell = Text(mark + step.role, style=style)
    cell.append("\n" + step.operation, style="red" if step.mistake else "")
    if step.pattern:
        cell.append("\n" + step.pattern, style="cyan")
    if step.note:
        cell.append("\n" + step.note, style="red" if step.mistake else "dim italic" if step.in_tutorial else "yellow")
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


def memory_word(step: Step) -> str:
    """The words of trace.md's memory column: view, new, or input (a tensor the layout was given)."""
    return step.memory or "input"


def _stride_cell(step: Step) -> Text:
    """On the line of the output shape: the stride, contiguity and memory of the tensor this step made."""
    cell = Text("\n" * len(step.input_shapes) + shape_text(step.stride))
    cell.append(f"\ncontiguous: {'yes' if step.contiguous else 'no'}", style="dim" if step.contiguous else "yellow")
    cell.append(f"\nmemory: {memory_word(step)}", style="dim")
    return cell


def steps_table(trace: LayoutTrace) -> Group:
    """One row per step: role, code, einops pattern and note | shapes in → out, axis names |
    the output's stride, contiguity and memory; the axes and marks explained below."""
    table = Table(box=box.SIMPLE_HEAD, show_lines=True, pad_edge=False, padding=(0, 1), expand=False)
    table.add_column("step · operation · pattern", ratio=1, overflow="fold")
    table.add_column("shape in → out", no_wrap=True)
    table.add_column("stride", overflow="fold")
    for step in trace.steps:
        table.add_row(_operation_cell(step), _shape_cell(step), _stride_cell(step))
    legend = axis_legend(trace) + ". Memory: view shares its input's, new is a copy."
    if not all(step.in_tutorial for step in trace.steps):
        legend += f" {ADDED_MARK}: a step the tutorial does not have."
    return Group(table, Text(legend, style="dim"))


def grouped(result: TraceResult) -> bool:
    """Do query heads share key/value heads in this trace's head slices (grouped-query attention)?"""
    return any(head.kv_head != head.head for head in result.head_slices)


def head_slices_title(result: TraceResult) -> str:
    d = result.head_slices[0].stop - result.head_slices[0].start
    count = len(result.head_slices)
    if count == 1:
        return f"the one head's slice: it uses all {d} columns of W_q, W_k, W_v"
    if grouped(result):
        groups = count // (result.head_slices[-1].kv_head + 1)
        return (
            f"head slices: query head h of the {count} uses columns h*{d} .. (h+1)*{d}-1 of W_q and shares "
            f"key/value head h // {groups}: its columns of W_k, W_v"
        )
    return f"head slices: head h of the {count} uses columns h*{d} .. (h+1)*{d}-1 of W_q, W_k, W_v"


def head_slices_table(result: TraceResult) -> Group:
    shared = grouped(result)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("head", justify="right")
    table.add_column("W_q columns" if shared else "columns", justify="right")
    if shared:
        table.add_column("kv head", justify="right")
        table.add_column("W_k, W_v columns", justify="right")
    table.add_column("Δ scores", justify="right")
    table.add_column("max |scores|", justify="right")
    table.add_column("Δ z", justify="right")
    table.add_column("")
    for head in result.head_slices:
        kv_cells = [str(head.kv_head), f"{head.kv_start}–{head.kv_stop - 1}"] if shared else []
        table.add_row(
            str(head.head),
            f"{head.start}–{head.stop - 1}",
            *kv_cells,
            difference_text(head.scores_diff),
            f"{head.scores_scale:.3g}",
            difference_text(head.z_diff),
            Text("✓", style="green") if head.agree else Text("✗", style="bold red"),
        )
    return Group(Text(head_slices_title(result), style="italic"), table, Text(head_slices_explanation(result), style="dim"))


def scores_formula(result: TraceResult) -> str:
    """Q_h K_hᵀ/√d, or with the model's own scale: Q_h K_hᵀ (T5: 1), Q_h K_hᵀ·0.1."""
    if result.scale is None:
        return "Q_h K_hᵀ/√d"
    return "Q_h K_hᵀ" if result.scale == 1 else f"Q_h K_hᵀ·{result.scale:.6g}"


def head_slices_extras(result: TraceResult) -> list[str]:
    """What a current model's head slices add to the tutorials' recomputation, in words."""
    extras = []
    if grouped(result):
        extras.append("K_h and V_h come from the columns of W_k and W_v of the key/value head h shares")
    if result.before_scores:
        extras.append(f"Q_h and K_h pass the layer's {' and '.join(result.before_scores)}")
    return extras


def head_slices_explanation(result: TraceResult) -> str:
    extras = "".join(f"; {extra}" for extra in head_slices_extras(result))
    return (
        "Q_h = x @ W_q[:, cols] + b_q[cols], K_h and V_h alike, from these slices alone "
        f"(W = self.w_q.weight.T: nn.Linear keeps (out, in), so cols are its rows){extras}. "
        f"Δ scores = max |{scores_formula(result)} − scores[:, h]|, Δ z = max |A_h V_h − z[:, h]|; "
        f"✓: float32 rounding, Δ scores at most {TOLERANCE:.0e} × max(1, max |scores|)."
    )


def check_name(name: str) -> str:
    return "attnviz's layer (attention/layer.py)" if name == LAYER_NAME else name


CHECKS_EXPLANATION = (
    "largest absolute difference of the attention weights and of the output from torch.nn.MultiheadAttention "
    "loaded with the same W_q, W_k, W_v, W_o and split into as many heads (torch's own code, not attnviz's, "
    "in float64); "
    f"they agree when both are at most {TOLERANCE:.0e}"
)


SDPA_CHECKS_EXPLANATION = (
    "largest absolute difference of the attention weights and of the output from torch's "
    "F.scaled_dot_product_attention (enable_gqa) with the same W_q, W_k, W_v, W_o{rope}, the weights a softmax "
    "of scores computed beside it: nn.MultiheadAttention cannot run this layer"
)
SDPA_ROPE = ", on q and k turned by RoPE written as complex rotation (torch.polar)"


def checks_table(result: TraceResult) -> Group:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("layout", "heads", "weights", "output", ""):
        table.add_column(name, justify="left" if name == "layout" else "right")
    for check in result.checks:
        mark = Text("✓", style="green") if check.agree else Text("✗ differs", style="bold red")
        table.add_row(
            check_name(check.layout), str(check.num_heads), difference_text(check.weights_diff),
            difference_text(check.output_diff), mark,
        )
    return Group(Text(checks_title(result), style="italic"), table, Text(checks_explanation(result), style="dim"))


def sdpa_checked(result: TraceResult) -> bool:
    """Is the reference scaled_dot_product_attention (a layer nn.MultiheadAttention cannot run)?"""
    return any(check.reference.startswith("F.scaled_dot_product_attention") for check in result.checks)


def checks_title(result: TraceResult) -> str:
    reference = "F.scaled_dot_product_attention" if sdpa_checked(result) else "torch.nn.MultiheadAttention"
    return f"do the layouts agree with {reference}?"


SEED_CHECKS_EXPLANATION = (
    "largest absolute difference of the attention weights and of the output C from torch's "
    "F.scaled_dot_product_attention in float64 with the same W_q, W_k, W_v and scale 1/sqrt(d_q), the weights "
    "its output over the identity as values: nn.MultiheadAttention cannot give W_v its own d_out; "
    f"they agree when both are at most {TOLERANCE:.0e}"
)


def checks_explanation(result: TraceResult) -> str:
    """CHECKS_EXPLANATION, or SDPA_CHECKS_EXPLANATION for a layer beyond nn.MultiheadAttention (SEED_CHECKS_EXPLANATION
    for the single-head tutorial's own sizes)."""
    if result.seed_sizes is not None:
        return SEED_CHECKS_EXPLANATION
    if not sdpa_checked(result):
        return CHECKS_EXPLANATION
    explanation = SDPA_CHECKS_EXPLANATION.format(rope=SDPA_ROPE if "RoPE" in result.before_scores else "")
    return explanation + f" ({'; '.join(result.features)}); they agree when both are at most {TOLERANCE:.0e}"


def token_name(index: int, tokens: list[str] | None) -> str:
    return f"token {index}" + (f" “{tokens[index]}”" if tokens and index < len(tokens) else "")


def mistake_text(result: TraceResult, tokens: list[str] | None = None) -> Text:
    """What the mistake changed, with numbers, and one row's provenance as an example."""
    from attnviz.tracing import merge_provenance, split_provenance

    mistake = result.mistake
    text = Text(f"mistake: {mistake.mistake}", style="bold red")
    text.append(f"\nwrong steps: {', '.join(mistake.wrong_steps)} (marked ✗ above)")
    if mistake.weights_diff == 0:
        text.append("\nthe weights are the same: this mistake comes after the softmax")
    else:
        text.append(f"\nthe weights differ from the right ones by up to {mistake.weights_diff:.3g}")
    text.append(f"\nthe output differs from the right one by up to {mistake.output_diff:.3g}")
    num_tokens = result.layouts[0].weights.shape[2]
    row = 1 if num_tokens > 1 else 0
    d = result.head_dim
    if mistake.mistake == "merge-without-permute":
        head, token = merge_provenance(result.num_heads, num_tokens, d, mistake.mistake)[row, 0].tolist()
        text.append(
            f"\ne.g. in the merged row of {token_name(row, tokens)}, columns 0..{d - 1} hold head {head}'s output "
            f"for {token_name(token, tokens)}, not head 0's for token {row}"
        )
    else:
        token, piece = split_provenance(result.num_heads, num_tokens, d, mistake.mistake)[0, row].tolist()
        text.append(
            f"\ne.g. row {row} of 'head' 0 holds slice {piece} (columns {piece * d}..{(piece + 1) * d - 1}) of "
            f"{token_name(token, tokens)}, not slice 0 of {token_name(row, tokens)}: the rows of a wrong head are "
            "not tokens"
        )
    return text


def batch_table(result: TraceResult, text_tokens: list[list[str]]) -> Group:
    """Every text of a padded batch: its real tokens, its padding keys (masked), its tokens."""
    padded = result.layouts[0].weights.shape[2]  # (B, H, Nq, Nk)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left", title=(
        f"batch of {len(result.texts)} texts padded to {padded} tokens (texts and tokens numbered from 0; "
        f"token 0 is {text_tokens[0][0]})"
    ))  # fmt: skip
    table.add_column("text", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("padding keys" if result.kv_text is None else "padding queries", no_wrap=True)
    table.add_column("tokens (index:token)", ratio=1, overflow="fold")
    for index, tokens in enumerate(text_tokens):
        padding = padded - len(tokens)
        table.add_row(
            str(index),
            str(len(tokens)),
            f"{padding}: {len(tokens)}–{padded - 1}" if padding > 1 else f"1: {len(tokens)}" if padding else "none",
            " ".join(f"{position}:{token}" for position, token in enumerate(tokens)) + (" · padding" if padding else ""),
        )
    if result.kv_text is None:
        legend = "padding keys are masked: no query attends to them (weight exactly 0)"
    else:
        legend = "keys and values come from the --kv text, unpadded; the padding queries' rows are computed and unused"
    return Group(table, Text(legend, style="dim"))


def print_trace(console: Console, result: TraceResult, slices: bool = True, text_tokens: list[list[str]] | None = None) -> None:
    """The batch, every layout's steps, then the head slices, the checks and the mistake.

    text_tokens: each text's tokens, unpadded (they label the batch and the mistake's example).
    """
    if len(result.texts) > 1 and text_tokens:
        console.print(batch_table(result, text_tokens))
    for trace in result.layouts:
        console.print()
        console.print(layout_heading(trace))
        console.print(flow_text(trace, console.width, result.valid_lens))
        console.print(steps_table(trace))
    if slices and result.head_slices:  # none for the seed's single head of its own sizes
        console.print()
        console.print(head_slices_table(result))
    console.print()
    console.print(checks_table(result))
    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if result.mistake is not None:
        console.print(mistake_text(result, text_tokens[0] if text_tokens else None))

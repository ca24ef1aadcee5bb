"""`attnviz generate` in the terminal: the prompt and its continuation as text, then a row per generated token."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.models.shown import MARKS, marks_legend
from attnviz.render.titles import counted

MAX_STEPS_SHOWN = 40  # generated tokens in the terminal's table; generate.json has every one
BOUNDARY = "▸"  # where the continuation begins, in the text as printed
# Control characters as marks, so that a continuation's bytes cannot move the cursor; spaces and newlines stay.
READABLE = str.maketrans({char: mark for char, mark in MARKS.items() if char not in " \n"})


def readable(text: str) -> str:
    """text as the terminal prints it: spaces and line breaks as they are (so that it wraps at spaces), every
    other control character (a tab, a carriage return, an escape) as its mark."""
    return text.replace("\r\n", "\n").translate(READABLE)


def continuation_text(generation) -> Text:
    """The prompt, BOUNDARY, and the continuation in bold green: text a terminal wraps between words."""
    text = Text(readable(generation.prompt))
    text.append(BOUNDARY, style="dim")
    text.append(readable(generation.continuation), style="bold green")
    return text


def print_generation(console: Console, generation, layer: int, rows_are: str = "chosen") -> None:
    """`attnviz generate`: the prompt and its continuation, then a row per generated token of the layer's heads,
    mean over the heads, of its row named by rows_are (analysis.generation.ROWS): the query whose row it is, its
    share on the first token (the sink) and the token it attends to most."""
    from attnviz.analysis.generation import ROWS

    console.print(continuation_text(generation))
    console.print(Text(f"{BOUNDARY} the continuation begins (green)", style="dim"))
    prompt = generation.num_prompt
    shown = generation.shown_tokens  # whitespace and control characters as marks: where a token begins and ends
    legend = marks_legend(shown)
    if legend:
        console.print(Text(f"tokens: {legend}", style="dim"))
    rows, queries = generation.rows(rows_are)[layer], generation.queries(rows_are)  # (H, n, T), (n,)
    table = Table(title=f"layer {layer}, the heads' mean: {ROWS[rows_are]}", title_justify="left")
    for name in ("step", "token", "row of", "sink", "most attended"):
        table.add_column(name, justify="right" if name in ("step", "sink") else "left", no_wrap=name != "most attended")
    for step in range(min(len(generation.ids), MAX_STEPS_SHOWN)):
        query = int(queries[step])
        mean = rows[:, step, : query + 1].mean(axis=0)  # (query + 1,)
        key = int(mean.argmax())
        table.add_row(str(step), shown[prompt + step], f"{query}:{shown[query]}", f"{mean[0]:.2f}", f"{key}:{shown[key]} {mean[key]:.2f}")
    if len(generation.ids) > MAX_STEPS_SHOWN:
        table.caption = f"… {len(generation.ids) - MAX_STEPS_SHOWN} more steps in generate.json"
        table.caption_justify = "left"
    console.print(table)
    how = f"sampled with seed {generation.seed}" if generation.sample else "greedy: the most likely next token each time"
    console.print(Text(f"{counted(len(generation.ids), 'token')} generated, {how}; sink: the weight on the first token", style="dim"))

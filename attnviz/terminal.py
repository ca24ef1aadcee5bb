"""Terminal renderers: Rich tables for a run, its tokens, its heads and the files written."""

from __future__ import annotations

from pathlib import Path

from rich.columns import Columns
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.analysis import HeadSummary
from attnviz.result import AttentionRun

MAX_TOKENS_SHOWN = 64
MAX_TOP_KEYS_SHOWN = 24


def print_notices(console: Console, notices: list[str]) -> None:
    for notice in dict.fromkeys(notices):  # once each, in order
        console.print(Text(f"note: {notice}", style="yellow"))


def print_setup(console: Console, run: AttentionRun, source: str, device_label: str) -> None:
    setup = Table.grid(padding=(0, 2))
    setup.add_row("model", Text(run.model).append(f" ({source})", style="dim"))
    setup.add_row("layer", str(run.layer))
    setup.add_row("heads", f"{run.num_heads} × d={run.head_dim}")
    setup.add_row("weights", run.weights + (", causal" if run.causal else ""))
    setup.add_row("device", device_label)
    console.print(setup)


def token_cells(tokens: list[str], ids: list[int]) -> Columns:
    """'0 [CLS] 101' per token, laid out in columns that never split a token; long texts cut."""
    cells = [
        Text.assemble((f"{position} ", "dim"), (token, "bold"), (f" {token_id}", "dim"))
        for position, (token, token_id) in enumerate(zip(tokens[:MAX_TOKENS_SHOWN], ids))
    ]
    if len(tokens) > MAX_TOKENS_SHOWN:
        cells.append(Text(f"… {len(tokens) - MAX_TOKENS_SHOWN} more", style="dim"))
    return Columns(cells, padding=(0, 2))


def print_tokens(console: Console, run: AttentionRun) -> None:
    console.print(Text("query tokens" if run.kv_text else "tokens", style="bold underline"))
    console.print(token_cells(run.query_tokens, run.query_ids))
    if run.kv_text:
        console.print(Text("key/value tokens", style="bold underline"))
        console.print(token_cells(run.key_tokens, run.key_ids))


def top_keys_text(summary: HeadSummary, run: AttentionRun, width: int) -> Text:
    pairs = [
        f"{run.query_tokens[query]}→{run.key_tokens[key]}"
        for query, key in enumerate(summary.top_keys[:MAX_TOP_KEYS_SHOWN])
    ]
    more = len(summary.top_keys) - MAX_TOP_KEYS_SHOWN
    text = Text(" ".join(pairs) + (f" … +{more}" if more > 0 else ""))
    text.truncate(width, overflow="ellipsis")
    return text


def heads_table(run: AttentionRun, summaries: list[HeadSummary], width: int = 80) -> Table:
    table = Table(title="heads", title_justify="left")
    for name in ("head", "entropy", "rel.", "mean max"):
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    top_keys_width = max(24, width - 42)  # what the four number columns and the borders leave
    table.add_column("query → key it attends to most", no_wrap=True, max_width=top_keys_width)
    for summary in summaries:
        table.add_row(
            str(summary.head),
            f"{summary.entropy:.2f}",
            f"{summary.relative_entropy:.2f}",
            f"{summary.mean_max:.2f}",
            top_keys_text(summary, run, top_keys_width),
        )
    table.caption = "entropy in nats, rel. = entropy / log(keys): 1 is uniform; mean max = mean of row maxima"
    table.caption_justify = "left"
    return table


def print_files(console: Console, folder: Path, files: list[Path]) -> None:
    console.print(Text("files written", style="bold underline"))
    console.print(Text(f"{folder}/"))
    console.print(Text("  " + "  ".join(path.name for path in files)))


def models_table(models) -> Table:
    table = Table(title="models you can use now", title_justify="left")
    for column in ("name", "source", "layers", "heads", "hidden", "vocab"):
        table.add_column(column, justify="right" if column in ("layers", "heads", "hidden", "vocab") else "left")
    for info in models:
        table.add_row(
            Text(info.name), info.source, str(info.num_layers), str(info.num_heads), str(info.hidden_size), str(info.vocab_size)
        )
    table.caption = "use one with --model NAME; any hub id downloads when online, any local BERT folder works"
    table.caption_justify = "left"
    return table

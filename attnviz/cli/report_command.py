"""`attnviz report`: the interactive report (report.html) of a text, or of every line of --file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    app,
    console,
    errors,
    Weights,
    Device,
    Stack,
    DeviceOption,
    TruncateOption,
    WordsOption,
    WeightsOption,
    SeedOption,
    CausalOption,
    AllowPickleOption,
    ModelOption,
    LayerOption,
    HeadsOption,
    StackOption,
    FileOutOption,
)
from attnviz.cli.shared import MAX_NOTICES_SHOWN, run_target, write_run
from attnviz.errors import AttnvizError
from attnviz.spec import check_text, refuse_causal_cross_attention


@app.command(short_help="One HTML file to explore the heads, layers, trace and statistics, offline.")
def report(
    text: Optional[str] = typer.Argument(
        None, metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼. Or give --file.", show_default=False
    ),
    file: Optional[str] = typer.Option(
        None,
        "--file",
        "-f",
        metavar="PATH",
        help="Many texts in one report: one per line (blank lines skipped; - reads standard input; "
        "at most 64, fewer when long: see the README).",
    ),
    model: Optional[str] = ModelOption,
    layer: int = LayerOption,
    num_heads: Optional[int] = HeadsOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    kv: Optional[str] = typer.Option(
        None, "--kv", help="Cross-attention: keys and values from this text, queries from TEXT."
    ),
    causal: bool = CausalOption,
    stack: Optional[Stack] = StackOption,
    device: Device = DeviceOption,
    out: Optional[Path] = FileOutOption,
    truncate: bool = TruncateOption,
    words: bool = WordsOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """report.html: one file a browser opens offline, to explore the heads, every layer, the shape trace and the statistics.

    Self-attention shows every layer, the rollout and each text's statistics; cross-attention
    (--kv, --stack cross) the run's layer and its trace.
    """
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.api.report import check_report_count, report as report_of
    from attnviz.output.batch import batch_folder_name, check_lengths
    from attnviz.output.corpus import read_texts
    from attnviz.output.runs import run_folder_name
    from attnviz.render import terminal

    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")
    check_text(text)
    lines = read_texts(file) if file is not None else None
    texts = [entry.text for entry in lines] if lines is not None else [text]
    check_report_count(len(texts))
    check_text(kv, "the --kv text")
    refuse_causal_cross_attention(kv, causal, stack.value if stack else None)
    functions.refuse_before_loading(model, stack.value if stack else None)
    target = run_target(out, batch_folder_name(file) if file else run_folder_name(text))
    handle = load(model, device.value, allow_pickle=allow_pickle, cache=False)
    if lines is not None:  # named by line number, before any work
        check_lengths(handle.tokenizer, lines, handle.loaded.max_positions, truncate)

    with console.status("computing the report…"):
        result = report_of(
            texts, model=handle, layer=layer, heads=num_heads, weights=weights.value, seed=seed, kv=kv, causal=causal,
            stack=stack.value if stack else None, device=device.value, truncate=truncate,
            words=words,
        )  # fmt: skip

    notes = result.record["notes"]
    shown = notes[:MAX_NOTICES_SHOWN]
    if len(notes) > len(shown):
        shown.append(f"… and {len(notes) - len(shown)} more notes (the report lists them)")
    terminal.print_notices(errors, shown)
    (written,) = write_run(out, target, "writing the report…", result.write_files)
    console.print(report_summary(result.record, written.stat().st_size), soft_wrap=True)


def report_summary(record: dict, size: int) -> str:
    """One line: what the report holds and its size.

    "report.html: 1 text, 8 tokens; all-MiniLM-L6-v2 layer 0 and every layer (6 × 12 heads); 152 kB; open it ..."
    """
    texts = record["texts"]
    first = texts[0]
    tokens = sum(len(text.get("query_pieces", text["query_tokens"])) for text in texts)
    what = f"1 text, {tokens} tokens" if len(texts) == 1 else f"{len(texts)} texts, {tokens} tokens in all"
    if "query_pieces" in first:  # --words: the page's labels are words (html/record.py)
        what += f" in {sum(len(text['query_tokens']) for text in texts)} words"
    if first["layers"] is not None:
        layers = f"layer {first['layer']} and every layer ({record['num_layers']} × {record['num_heads']} heads)"
    else:
        layers = f"layer {first['layer']}, {record['num_heads']} heads (cross-attention: this layer only)"
    return f"report.html: {what}; {first['model']} {layers}; {file_size(size)}; open it in a browser, no network needed"


def file_size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"

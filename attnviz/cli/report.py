"""`attnviz report`: the interactive report (report.html) of a text, or of every line of --file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    MemoryOption,
    QuietOption,
    app,
    console,
    errors,
    Weights,
    Device,
    Stack,
    DeviceOption,
    Dtype,
    DtypeOption,
    TruncateOption,
    WordsOption,
    WeightsOption,
    SeedOption,
    CausalOption,
    AllowPickleOption,
    LayerAtATimeOption,
    ModelOption,
    LayerOption,
    HeadsOption,
    KvOption,
    StackOption,
    FileOutOption,
)
from attnviz.cli.shared import MAX_NOTES_SHOWN, run_command, text_or_file


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
        "at most 64, fewer when long: see docs/commands.md).",
    ),
    model: Optional[str] = ModelOption,
    layer: int = LayerOption,
    heads: Optional[int] = HeadsOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    kv: Optional[str] = KvOption,
    causal: bool = CausalOption,
    stack: Optional[Stack] = StackOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    out: Optional[Path] = FileOutOption,
    truncate: bool = TruncateOption,
    memory: Optional[int] = MemoryOption,
    words: bool = WordsOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> None:
    """report.html: one file a browser opens offline, to explore the heads, every layer, the shape trace and the statistics.

    Self-attention shows every layer, the rollout and each text's statistics; cross-attention
    (--kv, --stack cross) the run's layer and its trace.
    """
    from attnviz.api.report import report as report_of
    from attnviz.output.corpus import read_texts

    text_or_file(text, file)
    lines = read_texts(file) if file is not None else None

    def compute(options):
        if lines is not None:  # the lines' count, then their lengths named by line number, before any work
            from attnviz.api.report import check_report_count
            from attnviz.output.batch import check_lengths

            check_report_count(len(lines))
            handle = options.load()
            check_lengths(handle.tokenizer, lines, handle.loaded.max_positions, options.truncate)
        from attnviz.render.progress import progress_bar

        with progress_bar(console) as bar:  # each text's layers, then its statistics' (a long text's: its summaries')
            return report_of([entry.text for entry in lines] if lines is not None else text, progress=bar, **options.keywords())

    options = run_options(
        model=model, layer=layer, heads=heads, weights=weights, seed=seed, kv=kv, causal=causal, stack=stack,
        device=device, dtype=dtype, truncate=truncate, memory=memory, words=words, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time,
    )  # fmt: skip
    result, (written,) = run_command(options, compute, print_report_notes, "writing the report…", out=out, text=text, file=file)
    console.print(report_summary(result.record, written.stat().st_size), soft_wrap=True)


def print_report_notes(result) -> None:
    from attnviz.render import terminal

    terminal.print_notes(errors, result.record["notes"], MAX_NOTES_SHOWN, " (report.html lists them)")


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
    elif first.get("summaries") is not None:  # a long text (html/record.py): no whole map, every head summarised
        layers = f"layer {first['layer']} zoomable, every layer's heads summarised ({record['num_layers']} × {record['num_heads']} heads)"
    elif first.get("zoom") is not None:
        layers = f"layer {first['layer']} zoomable, {record['num_heads']} heads"
    else:
        layers = f"layer {first['layer']}, {record['num_heads']} heads (cross-attention: this layer only)"
    return f"report.html: {what}; {first['model']} {layers}; {file_size(size)}; open it in a browser, no network needed"


def file_size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"

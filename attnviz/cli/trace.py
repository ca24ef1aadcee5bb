"""`attnviz trace`: every split and merge of the heads, step by step."""

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
    ImageFormat,
    Layout,
    Mistake,
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
    DQOption,
    DOutOption,
    StackOption,
    FileOutOption,
)
from attnviz.cli.shared import layouts_disagree, model_setup, run_command, text_or_file
from attnviz.errors import AttnvizError


@app.command(short_help='Every split and merge of the heads, step by step, with real shapes.')
def trace(
    text: Optional[str] = typer.Argument(
        None, metavar="TEXT", help="The text to trace, e.g. 我想吃酸菜鱼. Or give --file.", show_default=False
    ),
    batch: list[str] = typer.Option(
        [], "--batch", "-b", metavar="TEXT", help="Another text in the same padded batch (repeatable): shows the padding path.",
        show_default=False,
    ),
    file: Optional[str] = typer.Option(
        None, "--file", "-f", metavar="PATH", help="A padded batch: one text per line (blank lines skipped; - reads standard input)."
    ),
    layout: Optional[Layout] = typer.Option(
        None, "--layout", help="How the heads are split and merged, as a tutorial writes it; "
        "all runs every layout on the same weights and checks that they agree. "
        "[default: view-permute; fused-qkv for GPT-2, whose c_attn stores W_q, W_k, W_v as one]",
        show_default=False,
    ),
    mistake: Optional[Mistake] = typer.Option(
        None, "--mistake", help="Make a common reshape mistake in view-permute and show where it goes wrong.",
        show_default=False,
    ),
    model: Optional[str] = ModelOption,
    layer: int = LayerOption,
    heads: Optional[int] = HeadsOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    d_q: Optional[int] = DQOption,
    d_out: Optional[int] = DOutOption,
    kv: Optional[str] = typer.Option(
        None, "--kv", help="Cross-attention: keys and values from this text, queries from TEXT (not with fused-qkv)."
    ),
    causal: bool = CausalOption,
    stack: Optional[Stack] = StackOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = typer.Option(ImageFormat.png, "--format", help="Image format of --mistake's heatmaps."),
    out: Optional[Path] = FileOutOption,
    truncate: bool = TruncateOption,
    memory: Optional[int] = MemoryOption,
    words: bool = WordsOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> int:
    """Every split and merge of the heads, step by step with the real shapes; trace.json and trace.md.

    Exits 1 when the layouts disagree by more than 1e-5 (the files are still written).
    """
    from attnviz.api import functions
    from attnviz.output.corpus import read_texts

    text_or_file(text, file)
    if file is not None and batch:
        raise AttnvizError("--batch adds texts to TEXT: put them in the --file instead")
    texts = [entry.text for entry in read_texts(file)] if file is not None else [text, *batch]
    figure_notes: list[str] = []  # figures capped in size or thinned

    def compute(options):
        if len(texts) > 1 and not options.truncate:  # a long text named as the command names it ("the text has ..."), not texts[i]
            from attnviz.models.tokens import check_lengths

            handle = options.load()
            check_lengths([len(ids) for ids in handle.tokenizer.encode_batch(texts)], handle.loaded.max_positions)
        layout_name, mistake_name = layout.value if layout else None, mistake.value if mistake else None
        return functions.trace(texts, layout=layout_name, mistake=mistake_name, **options.keywords())

    def write(result, staging: Path) -> list[Path]:
        return result.write_files(staging, image_format.value, figure_notes)

    options = run_options(
        model=model, layer=layer, heads=heads, weights=weights, seed=seed, d_q=d_q, d_out=d_out, kv=kv, causal=causal,
        stack=stack, device=device, dtype=dtype, truncate=truncate, memory=memory, words=words, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time,
    )  # fmt: skip
    result, _ = run_command(options, compute, print_traced, "writing the trace…", out=out, text=text, file=file, write=write)
    for note in figure_notes:
        errors.print(f"note: {note}", soft_wrap=True)
    return 0 if result.agree else layouts_disagree(result.trace)


def print_traced(result) -> None:
    from attnviz.render import terminal
    from attnviz.render.trace_tables import print_trace

    runs = result.runs  # tokens, notes and heatmaps
    terminal.print_notes(errors, [note for run in runs for note in run.notes])
    terminal.print_setup(console, runs[0], *model_setup(result.spec), seed=result.spec.seed)
    terminal.print_tokens(console, runs[0])
    print_trace(console, result.trace, text_tokens=[run.shown_tokenizer_tokens[0] for run in runs])

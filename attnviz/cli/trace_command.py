"""`attnviz trace`: every split and merge of the heads, step by step."""

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
    ImageFormat,
    Layout,
    Mistake,
    DeviceOption,
    TruncateOption,
    WeightsOption,
    SeedOption,
    CausalOption,
    AllowPickleOption,
    ModelOption,
)
from attnviz.cli.shared import build_spec, layouts_disagree, run_target
from attnviz.errors import AttnvizError
from attnviz.spec import check_text, check_trace_texts, refuse_causal_cross_attention


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
    layout: Layout = typer.Option(
        Layout.view_permute, "--layout", help="How the heads are split and merged, as a tutorial writes it; "
        "all runs every layout on the same weights and checks that they agree.",
    ),
    mistake: Optional[Mistake] = typer.Option(
        None, "--mistake", help="Make a common reshape mistake in view-permute and show where it goes wrong.",
        show_default=False,
    ),
    model: Optional[str] = ModelOption,
    layer: int = typer.Option(0, "--layer", "-l", help="BERT layer whose parameters (W_q, W_k, W_v, W_o) and input to use."),
    num_heads: Optional[int] = typer.Option(
        None, "--heads", help="Split the projections into this many heads (default: the model's own)."
    ),
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    kv: Optional[str] = typer.Option(
        None, "--kv", help="Cross-attention: keys and values from this text, queries from TEXT (not with fused-qkv)."
    ),
    causal: bool = CausalOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = typer.Option(ImageFormat.png, "--format", help="Image format of --mistake's heatmaps."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
    ),
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> int:
    """Every split and merge of the heads, step by step with the real shapes; trace.json and trace.md.

    Exits 1 when the layouts disagree by more than 1e-5 (the files are still written).
    """
    from attnviz.models.loading import load_model
    from attnviz.output.batch import batch_folder_name, read_texts
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.output.trace_files import write_trace_files
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads, run_attention
    from attnviz.render import terminal
    from attnviz.render.trace_render import print_trace
    from attnviz.tracing import LAYOUTS, trace_texts

    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")
    if file is not None and batch:
        raise AttnvizError("--batch adds texts to TEXT: put them in the --file instead")
    texts = [entry.text for entry in read_texts(file)] if file is not None else [text, *batch]
    for given in texts:
        check_text(given)
    check_text(kv, "the --kv text")
    refuse_causal_cross_attention(kv, causal)
    check_trace_texts(texts)
    target = run_target(out, batch_folder_name(file) if file else run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    spec = build_spec(
        model, loaded, device_name, layer=layer, num_heads=resolve_num_heads(loaded, num_heads), weights=weights.value,
        seed=seed, causal=causal, kv_text=kv, truncate=truncate,
    )
    traced = trace_texts(
        loaded, texts, spec, layouts=LAYOUTS if layout == Layout.all else (layout.value,),
        mistake=mistake.value if mistake else None,
    )
    runs = run_attention(loaded, texts, spec)  # tokens, notices and heatmaps

    terminal.print_notices(errors, [notice for run in runs for notice in run.notices])
    terminal.print_setup(console, runs[0], loaded.source, device_label(device_name), seed=seed)
    terminal.print_tokens(console, runs[0])
    print_trace(console, traced, text_tokens=[run.query_tokens for run in runs])

    folder = StagedRunFolder(target, unique=out is None)
    figure_notes: list[str] = []  # figures capped in size or thinned
    with console.status("writing the trace…"), folder as staging:
        written = write_trace_files(traced, runs, spec, staging, image_format.value, figure_notes)
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])
    for note in figure_notes:
        errors.print(f"note: {note}", soft_wrap=True)
    return 0 if traced.agree else layouts_disagree(traced)

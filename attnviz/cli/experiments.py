"""`attnviz compare` and `attnviz position`: head counts and parameters side by side; why position embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    app,
    console,
    errors,
    Device,
    ImageFormat,
    DeviceOption,
    TruncateOption,
    FormatOption,
    MAX_SEED,
    AllowPickleOption,
    ModelOption,
)
from attnviz.cli.shared import build_spec, run_target
from attnviz.spec import check_text


@app.command(short_help="One layer's projections split into different numbers of heads.")
def compare(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼."),
    head_counts: Optional[str] = typer.Option(
        None,
        "--heads",
        metavar="COUNTS",
        help="Comma list of head counts, each dividing the model size, e.g. 1,4,12 "
        "(default: 1, 4 and the model's own).",
        show_default=False,
    ),
    weights: str = typer.Option(
        "pretrained",
        "--weights",
        metavar="PARAMETERS",
        help="The layer's parameters, as a comma list: pretrained (BERT's), random (from --seed), "
        "or pretrained,random to set them side by side.",
    ),
    model: Optional[str] = ModelOption,
    layer: int = typer.Option(0, "--layer", "-l", help="BERT layer whose projections and input to use."),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the random parameters."),
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
    ),
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """The same W_q, W_k, W_v split into 1, 4, 12... heads, and BERT's parameters beside random ones."""
    from attnviz.analysis.compare import compare_splits, default_head_counts, parse_head_counts, parse_weights
    from attnviz.models.loading import load_model
    from attnviz.output.compare_json import write_comparison_json
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.pipeline import device_label, resolve_device
    from attnviz.render import terminal
    from attnviz.render.compare_figures import write_comparison_figure

    check_text(text)
    counts = parse_head_counts(head_counts) if head_counts is not None else None
    weights_list = parse_weights(weights)
    target = run_target(out, run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    counts = counts or default_head_counts(loaded.hidden_size, loaded.num_heads)
    spec = build_spec(  # what the splits share; each split's head count and weights are its own
        model, loaded, device_name, layer=layer, num_heads=None, weights=None, seed=seed, causal=False, kv_text=None,
        truncate=truncate,
    )
    splits = compare_splits(loaded, text, counts, weights_list, spec)

    first = splits[0].run
    terminal.print_notices(errors, first.notices)
    terminal.print_compare_setup(console, first, loaded.source, device_label(device_name), weights_list, seed)
    terminal.print_tokens(console, first)
    console.print(terminal.compare_table(splits))

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("drawing the comparison…"), folder as staging:
        written = [
            write_comparison_figure(splits, staging, image_format.value, seed=seed),
            write_comparison_json(splits, spec, staging / "compare.json"),
        ]
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])


@app.command(short_help='Why attention needs position embeddings.')
def position(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to permute, e.g. 我想吃酸菜鱼."),
    permutation: Optional[str] = typer.Option(
        None,
        "--permutation",
        "-p",
        help="New order of the token positions, [CLS] and [SEP] included, e.g. 0,2,1,3 "
        "(default: [CLS] and [SEP] stay, the tokens between them reversed).",
        show_default=False,
    ),
    head: Optional[int] = typer.Option(
        None, "--head", help="Head to draw (default: the one the position embeddings change most).", show_default=False
    ),
    model: Optional[str] = ModelOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
    ),
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """Why attention needs position embeddings: permute the tokens, with and without them."""
    from attnviz.analysis.position import LAYER, position_experiment
    from attnviz.models.loading import load_model
    from attnviz.output.position_json import write_position_json
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.pipeline import device_label, resolve_device
    from attnviz.render import terminal
    from attnviz.render.compare_figures import write_position_figure

    check_text(text)
    target = run_target(out, run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    spec = build_spec(  # position runs layer 0 with the model's own parameters and heads
        model, loaded, device_name, layer=LAYER, num_heads=loaded.num_heads, weights="pretrained", seed=0,
        causal=False, kv_text=None, truncate=False,
    )
    result = position_experiment(loaded, text, permutation, head, device_name)

    terminal.print_notices(errors, result.notices)
    terminal.print_position(console, result, loaded.source, device_label(device_name))

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("drawing the maps…"), folder as staging:
        written = [
            write_position_figure(result, staging, image_format.value),
            write_position_json(result, spec, staging / "position.json"),
        ]
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])

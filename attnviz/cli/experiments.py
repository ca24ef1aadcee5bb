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
    LayerOption,
    OutOption,
)
from attnviz.cli.shared import run_target, write_run
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
        help="The layer's parameters, as a comma list: pretrained (the model's), random (from --seed), "
        "or pretrained,random to set them side by side.",
    ),
    model: Optional[str] = ModelOption,
    layer: int = LayerOption,
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the random parameters."),
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """The same W_q, W_k, W_v split into 1, 4, 12... heads, and BERT's parameters beside random ones."""
    from attnviz.analysis.compare import parse_head_counts, parse_weights
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.output.runs import run_folder_name
    from attnviz import startup
    from attnviz.render import terminal

    check_text(text)
    if head_counts is not None:
        parse_head_counts(head_counts)  # bad lists are refused before any work
    weights_list = parse_weights(weights)
    functions.refuse_before_loading(model, needs_bert=functions.COMPARE_NEEDS_BERT)
    target = run_target(out, run_folder_name(text))
    handle = load(model, device.value, allow_pickle=allow_pickle, cache=False)
    result = functions.compare(
        text, heads=head_counts, weights=weights, model=handle, layer=layer, seed=seed, truncate=truncate
    )

    first = result.splits[0].run
    terminal.print_notices(errors, first.notices)
    terminal.print_compare_setup(console, first, handle.source, handle.device_label, weights_list, seed)
    terminal.print_tokens(console, first)
    console.print(result)  # its __rich__: the table of the splits
    write_run(out, target, "drawing the comparison…", lambda staging: startup.draw(result.write_files, staging, image_format.value))


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
    out: Optional[Path] = OutOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """Why attention needs position embeddings: permute the tokens, with and without them."""
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.output.runs import run_folder_name
    from attnviz import startup
    from attnviz.render import terminal

    check_text(text)
    functions.refuse_before_loading(model, needs_bert=functions.POSITION_NEEDS_BERT)
    target = run_target(out, run_folder_name(text))
    handle = load(model, device.value, allow_pickle=allow_pickle, cache=False)
    result = functions.position(text, permutation=permutation, head=head, model=handle)

    terminal.print_notices(errors, result.result.notices)
    terminal.print_position(console, result.result, handle.source, handle.device_label)
    write_run(out, target, "drawing the maps…", lambda staging: startup.draw(result.write_files, staging, image_format.value))

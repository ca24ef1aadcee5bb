"""`attnviz compare`: one layer's projections split into different numbers of heads, and its parameters beside random ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    QuietOption,
    run_options,
    app,
    console,
    errors,
    Device,
    ImageFormat,
    DeviceOption,
    Dtype,
    DtypeOption,
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
    compared_weights: str = typer.Option(
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
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
    quiet: bool = QuietOption,
) -> None:
    """The same W_q, W_k, W_v split into 1, 4, 12... heads, and BERT's parameters beside random ones."""
    options = run_options(locals())
    from attnviz.analysis.compare import parse_head_counts, parse_weights
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.output.runs import run_folder_name
    from attnviz import startup
    from attnviz.render import terminal

    check_text(text)
    if head_counts is not None:
        parse_head_counts(head_counts)  # bad lists are refused before any work
    weights_list = parse_weights(compared_weights)
    functions.refuse_before_loading(options, needs_bert=functions.COMPARE_NEEDS_BERT)
    target = run_target(out, run_folder_name(text))
    handle = load(options.model, options.device, dtype=options.dtype, allow_pickle=allow_pickle, cache=False)
    given = replace(options, model=handle).keywords()
    result = functions.compare(text, heads=head_counts, weights=compared_weights, **given)

    first = result.splits[0].run
    terminal.print_notices(errors, first.notices)
    terminal.print_compare_setup(console, first, handle.source, handle.device_label, weights_list, options.seed)
    terminal.print_tokens(console, first)
    console.print(result)  # its __rich__: the table of the splits
    write_run(out, target, "drawing the comparison…", lambda staging: startup.draw(result.write_files, staging, image_format.value))

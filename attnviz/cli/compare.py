"""`attnviz compare`: one layer's projections split into different numbers of heads, and its parameters beside random ones."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    QuietOption,
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
from attnviz.cli.shared import model_setup, run_command


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
    from attnviz.api import functions

    def compute(options):
        return functions.compare(text, heads=head_counts, weights=compared_weights, **options.keywords())

    options = run_options(
        model=model, layer=layer, seed=seed, device=device, dtype=dtype, truncate=truncate, allow_pickle=allow_pickle
    )
    run_command(options, compute, print_comparison, "drawing the comparison…", out=out, text=text, image_format=image_format)


def print_comparison(result) -> None:
    from attnviz.render import terminal

    first = result.splits[0].run
    terminal.print_notes(errors, first.notes)
    weights_list = list(dict.fromkeys(split.weights for split in result.splits))  # --weights, in its order
    terminal.print_compare_setup(console, first, *model_setup(result.spec), weights_list, result.spec.seed)
    terminal.print_tokens(console, first)
    console.print(result)  # its __rich__: the table of the splits

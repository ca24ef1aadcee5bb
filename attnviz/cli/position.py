"""`attnviz position`: why attention needs position embeddings (the tokens permuted, with and without them)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    MAX_HEADS,
    QuietOption,
    app,
    console,
    errors,
    Device,
    ImageFormat,
    DeviceOption,
    Dtype,
    DtypeOption,
    FormatOption,
    AllowPickleOption,
    ModelOption,
    OutOption,
)
from attnviz.cli.shared import run_command


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
        None, "--head", max=MAX_HEADS - 1, help="Head to draw (default: the one the position embeddings change most).", show_default=False
    ),
    model: Optional[str] = ModelOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    allow_pickle: bool = AllowPickleOption,
    quiet: bool = QuietOption,
) -> None:
    """Why attention needs position embeddings: permute the tokens, with and without them."""
    from attnviz.api import functions

    def compute(options):
        return functions.position(text, permutation=permutation, head=head, **options.keywords())

    options = run_options(model=model, device=device, dtype=dtype, allow_pickle=allow_pickle)
    run_command(options, compute, print_position, "drawing the maps…", out=out, text=text, image_format=image_format)


def print_position(result) -> None:
    from attnviz.render import terminal

    terminal.print_notes(errors, result.result.notes)
    terminal.print_position(console, result.result, result.source, result.device_label)

"""`attnviz position`: why attention needs position embeddings (the tokens permuted, with and without them)."""

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
    FormatOption,
    AllowPickleOption,
    ModelOption,
    OutOption,
)
from attnviz.cli.shared import run_target, write_run
from attnviz.spec import check_text


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
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    allow_pickle: bool = AllowPickleOption,
    quiet: bool = QuietOption,
) -> None:
    """Why attention needs position embeddings: permute the tokens, with and without them."""
    options = run_options(locals())
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.output.runs import run_folder_name
    from attnviz import startup
    from attnviz.render import terminal

    check_text(text)
    functions.refuse_before_loading(options, needs_bert=functions.POSITION_NEEDS_BERT)
    target = run_target(out, run_folder_name(text))
    handle = load(options.model, options.device, dtype=options.dtype, allow_pickle=allow_pickle, cache=False)
    given = replace(options, model=handle).keywords()
    result = functions.position(text, permutation=permutation, head=head, **given)

    terminal.print_notices(errors, result.result.notices)
    terminal.print_position(console, result.result, handle.source, handle.device_label)
    write_run(out, target, "drawing the maps…", lambda staging: startup.draw(result.write_files, staging, image_format.value))

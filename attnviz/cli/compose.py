"""`attnviz compose`: how much each head reads what an earlier head wrote, Elhage et al.'s compositions from the weights."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    AllowPickleOption,
    LayerAtATimeOption,
    Device,
    DeviceOption,
    FormatOption,
    ImageFormat,
    ModelOption,
    QuietOption,
    app,
    console,
)
from attnviz.cli.shared import run_command
from attnviz.render.progress import progress_bar


@app.command(short_help="Q-, K- and V-composition of every head pair, from the weights alone (Elhage et al. 2021).")
def compose(
    model: Optional[str] = ModelOption,
    top: int = typer.Option(20, "--top", min=1, max=10_000, metavar="N", help="How many of the strongest compositions (score above baseline) to list."),
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the model)."),
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> None:
    """Every pair of heads in different layers, sender before receiver: Elhage et al. 2021's Q-, K- and V-composition
    scores (|W_OV^s W_QK^r|, |W_OV^s W_QK^rT|, |W_OV^s W_OV^r| over the product of the norms), the norm before each
    attention folded in (raw weights where the model has none, said), grouped-query heads through their shared W_K and
    W_V; each kind's baseline is the mean score of Gaussian matrices of the same shapes. Prints the strongest above
    baseline; writes compose.png (sender × receiver layer, the strongest head pair of each) and compose.json."""
    from attnviz.api.compose import compose as compose_heads

    def compute(options):
        with progress_bar(console) as bar:
            return compose_heads(top=top, progress=bar, **options.keywords())

    options = run_options(model=model, device=device, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time)
    name = f"compose {Path(model).name if model else ''}"  # the default folder's name
    run_command(options, compute, print_compose, "drawing the compositions…", out=out, text=name, image_format=image_format)


def print_compose(result) -> None:
    console.print(result)  # its table of the strongest compositions and its notes

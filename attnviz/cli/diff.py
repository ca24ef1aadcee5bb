"""`attnviz diff`: two checkpoints of one architecture over one text, every layer × head's maps compared."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    QuietOption,
    app,
    console,
    Device,
    ImageFormat,
    Stack,
    DeviceOption,
    Dtype,
    DtypeOption,
    TruncateOption,
    FormatOption,
    MAX_SEED,
    AllowPickleOption,
    LayerAtATimeOption,
    ModelOption,
    EveryLayerStackOption,
    EveryLayerMemoryOption,
    OutOption,
)
from attnviz.cli.shared import print_model_note, run_command
from attnviz.render.progress import progress_bar


@app.command(short_help="Two checkpoints' heads side by side: how far apart each layer × head's maps are.")
def diff(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼."),
    model: Optional[str] = ModelOption,
    against: str = typer.Option(
        ...,
        "--against",
        metavar="MODEL",
        help="The other checkpoint (hub id or local folder) of the same architecture and tokenizer, e.g. a "
        "fine-tuned model beside its base; or random: each layer with random projections from --seed, over the "
        "model's own hidden states (how far training moved each head). A folder named random: ./random.",
    ),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the random projections of --against random."),
    stack: Optional[Stack] = EveryLayerStackOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    memory: Optional[int] = EveryLayerMemoryOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> None:
    """Every layer × head of two checkpoints over one text: the Jensen-Shannon distance of their maps (mean over
    queries) and Clark et al.'s divergence (the JSD summed over queries), as a grid (diff.png), the most changed
    heads' maps side by side with their difference (diff_heads.png), and diff.json."""
    from attnviz.api.diff import diff as compare_checkpoints

    def compute(options):
        with progress_bar(console) as bar:  # the layers compared
            return compare_checkpoints(text, against=against, progress=bar, **options.keywords())

    options = run_options(
        model=model, seed=seed, stack=stack, device=device, dtype=dtype, truncate=truncate, memory=memory,
        allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time,
    )  # fmt: skip
    run_command(options, compute, print_diff, "drawing the differences…", out=out, text=text, image_format=image_format)


def print_diff(result) -> None:
    print_model_note(result.loaded)
    console.print(result)  # its __rich__: the grid and the most changed heads

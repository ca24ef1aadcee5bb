"""`attnviz generate`: a decoder continues a prompt, and every generated token's attention is shown, step by step."""

from __future__ import annotations

from enum import Enum
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
    DeviceOption,
    Dtype,
    DtypeOption,
    LayerAtATimeOption,
    FormatOption,
    MAX_SEED,
    GenerateModelOption,
    LayerOption,
    OutOption,
)
from attnviz.cli.shared import print_model_note, run_command
from attnviz.render.progress import progress_bar


class Rows(str, Enum):  # attnviz.analysis.generation.ROWS (not imported: the command line's help stays light)
    chosen = "chosen"
    read = "read"


@app.command(short_help="A decoder continues a prompt: each generated token's attention, step by step.")
def generate(
    prompt: str = typer.Argument(..., metavar="TEXT", help="The prompt to continue, e.g. 我想吃酸菜鱼."),
    model: Optional[str] = GenerateModelOption,
    tokens: int = typer.Option(32, "--tokens", "-n", min=1, max=1024, help="How many tokens to generate (fewer if the model ends the text)."),
    sample: bool = typer.Option(False, "--sample", help="Sample each token from the next-token distribution (from --seed), not the most likely one."),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="Seed of --sample."),
    rows: Rows = typer.Option(
        Rows.chosen, "--rows",
        help="Which row of each generated token to show: chosen, the attention that chose it (the row of the token "
        "before it, as transformers' generate gives it); read, the token's own row as the query. The report has both.",
    ),  # fmt: skip
    layer: int = LayerOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    quiet: bool = QuietOption,
) -> None:
    """A decoder (GPT-2, Llama's layout, SmolLM2) continues TEXT, greedy or --sample; beside each generated token
    the attention that chose it (--rows read: its own), per layer and head, computed with the key/value cache as the
    model generates: generate.png (the --layer's heads), generate.json (the ids, the layer's rows, every layer's
    summaries per step: sink, previous token, entropy, distance) and report.html (a stepper over the continuation,
    every layer and head)."""
    from attnviz.api.generate import generate as continue_prompt

    def compute(options):
        with progress_bar(console) as bar:  # the tokens generated
            return continue_prompt(prompt, tokens=tokens, sample=sample, rows=rows.value, progress=bar, **options.keywords())

    options = run_options(model=model, layer=layer, seed=seed, device=device, dtype=dtype, layer_at_a_time=layer_at_a_time)
    run_command(options, compute, print_generation, "drawing the generation…", out=out, text=prompt, image_format=image_format)


def print_generation(result) -> None:
    print_model_note(result.loaded)
    console.print(result)  # its __rich__: the continuation and a row per generated token

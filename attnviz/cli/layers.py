"""`attnviz layers`: every layer's heads over one text at a glance, and attention rollout through the layers."""

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
    Weights,
    Device,
    ImageFormat,
    Stack,
    DeviceOption,
    Dtype,
    DtypeOption,
    TruncateOption,
    WordsOption,
    Measure,
    LayersMeasureOption,
    Effect,
    EffectOption,
    BandOption,
    FormatOption,
    WeightsOption,
    SeedOption,
    EveryLayerCausalOption,
    AllowPickleOption,
    LayerAtATimeOption,
    ModelOption,
    EveryLayerHeadsOption,
    EveryLayerStackOption,
    EveryLayerMemoryOption,
    OutOption,
)
from attnviz.cli.shared import model_setup, run_command
from attnviz.render.progress import progress_bar


@app.command(short_help="Every layer's heads at a glance, and attention rollout.")
def layers(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼."),
    model: Optional[str] = ModelOption,
    heads: Optional[int] = EveryLayerHeadsOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    causal: bool = EveryLayerCausalOption,
    stack: Optional[Stack] = EveryLayerStackOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    words: bool = WordsOption,
    measure: Measure = LayersMeasureOption,
    band: int = BandOption,
    effect: Optional[Effect] = EffectOption,
    memory: Optional[int] = EveryLayerMemoryOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> None:
    """Every layer and head at a glance (layers.png), attention rollout through the layers (rollout.png), and every
    head summarised (summaries.png, summaries.json: attention sink, relative entropy, distance, local band, previous token)."""
    from attnviz.api import functions

    def compute(options):
        with progress_bar(console) as bar:  # --effect's heads taken out, then the layers run
            return functions.layers(
                text, measure=measure.value, band=band, effect=effect.value if effect else None, progress=bar, **options.keywords()
            )

    options = run_options(
        model=model, heads=heads, weights=weights, seed=seed, causal=causal, stack=stack, device=device, dtype=dtype,
        truncate=truncate, words=words, memory=memory, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time,
    )  # fmt: skip
    run_command(options, compute, print_layers, "writing figures…", out=out, text=text, image_format=image_format)


def print_layers(result) -> None:
    from attnviz.render import stats_tables, summary_tables, terminal

    first = result.layer_runs[0]
    terminal.print_notes(errors, [*first.notes, *result.notes])
    terminal.print_setup(console, first, *model_setup(result.spec), len(result.layer_runs), seed=result.spec.seed)
    terminal.print_tokens(console, first)
    if result.rollout is not None:  # None for a long text (result.notes)
        stats_tables.print_rollout(console, first.shown_tokens[0], result.rollout, first.causal and not first.model_causal)
    if result.measures is not None and result.measures.flow is not None:
        stats_tables.print_rollout(console, first.shown_tokens[0], result.measures.flow.normalised, name="flow")
    summary_tables.print_summaries(console, result.summaries)
    if result.effects is not None:
        summary_tables.print_effects(console, result.effects)

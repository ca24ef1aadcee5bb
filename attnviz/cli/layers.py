"""`attnviz layers`: every layer's heads over one text at a glance, and attention rollout through the layers."""

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
    ModelOption,
    EveryLayerHeadsOption,
    EveryLayerStackOption,
    EveryLayerMemoryOption,
    OutOption,
)
from attnviz.cli.shared import run_target, write_run
from attnviz.spec import check_text, refuse_cross_over_every_layer


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
    quiet: bool = QuietOption,
) -> None:
    """Every layer and head at a glance (layers.png), attention rollout through the layers (rollout.png), and every
    head summarised (summaries.png, summaries.json: attention sink, relative entropy, distance, local band, previous token)."""
    options = run_options(locals())
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.output.runs import run_folder_name
    from attnviz import startup
    from attnviz.render import stats_tables, summary_tables, terminal

    check_text(text)
    refuse_cross_over_every_layer(options.stack)
    functions.check_effect(effect.value if effect else None, text, options)  # before the model loads
    functions.refuse_before_loading(options)
    target = run_target(out, run_folder_name(text))
    handle = load(options.model, options.device, dtype=options.dtype, allow_pickle=allow_pickle, cache=False)
    given = replace(options, model=handle).keywords()
    result = functions.layers(text, measure=measure.value, band=band, effect=effect.value if effect else None, **given)

    first = result.layer_runs[0]
    terminal.print_notices(errors, [*first.notices, *result.notes])
    terminal.print_setup(console, first, handle.source, handle.device_label, len(result.layer_runs), seed=options.seed)
    terminal.print_tokens(console, first)
    if result.rollout is not None:  # None for a long text (result.notes)
        stats_tables.print_rollout(console, first.shown_tokens[0], result.rollout, first.causal and not first.model_causal)
    if result.measures is not None and result.measures.flow is not None:
        stats_tables.print_rollout(console, first.shown_tokens[0], result.measures.flow.normalised, name="flow")
    summary_tables.print_summaries(console, result.summaries)
    if result.effects is not None:
        summary_tables.print_effects(console, result.effects)
    write_run(out, target, "writing figures…", lambda staging: startup.draw(result.write_files, staging, image_format.value))

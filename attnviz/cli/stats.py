"""`attnviz stats`: statistics and labels of every head of every layer, for a text or a corpus read line by line."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    MAX_COUNT,
    Engine,
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
    FileOutOption,
)
from attnviz.cli.shared import MAX_NOTES_SHOWN, model_setup, run_command, text_or_file
from attnviz.errors import AttnvizError


@app.command(short_help='What every head of every layer does: statistics and labels.')
def stats(
    text: Optional[str] = typer.Argument(
        None, metavar="TEXT", help="The text whose heads to measure. Or give --file.", show_default=False
    ),
    file: Optional[str] = typer.Option(
        None,
        "--file",
        "-f",
        metavar="PATH",
        help="Average over texts: one per line (blank lines skipped; - reads standard input).",
    ),
    model: Optional[str] = ModelOption,
    heads: Optional[int] = EveryLayerHeadsOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    causal: bool = EveryLayerCausalOption,
    stack: Optional[Stack] = EveryLayerStackOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = FileOutOption,
    truncate: bool = TruncateOption,
    words: bool = WordsOption,
    memory: Optional[int] = EveryLayerMemoryOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    checkpoint: Optional[Path] = typer.Option(
        None,
        metavar="PATH",
        help="With --file: after each chunk of --chunk-lines texts, save the sums so far to PATH (.npz), for --resume.",
    ),
    resume: bool = typer.Option(
        False, help="Continue from --checkpoint PATH: refused when it was made with other settings or another file."
    ),
    chunk_lines: int = typer.Option(
        1024, "--chunk-lines", min=1, max=MAX_COUNT, metavar="N",
        help="With --file: texts read, measured and checkpointed at a time (a shard on Ray).",
    ),
    engine: Engine = typer.Option(
        Engine.local,
        help='With --file: run here, or on Ray (RAY_ADDRESS, else a local Ray): pip install "attnviz[ray]".',
    ),
    js: Optional[bool] = typer.Option(
        None,
        "--js/--no-js",
        help="Measure the Jensen-Shannon distances between heads (js_distance.png): on for one TEXT, but a text past "
        "64 MB of maps (or --memory); off for --file. They are most of the statistics' work.",
        show_default=False,
    ),
    quiet: bool = QuietOption,
) -> None:
    """What every head of every layer does: entropy, [CLS], [SEP], previous/next token, labels; stats.csv and .json.

    The statistics of Clark et al. 2019, three of them defined otherwise. js_distance is the
    Jensen-Shannon distance (the square root of the divergence, base-2 logarithms, 0 to 1)
    averaged over queries; Clark et al. sum the Jensen-Shannon divergence over tokens.
    punctuation is any token made only of Unicode punctuation; Clark et al. count "." and ",".
    With --file, each statistic is averaged per text, then over the texts (every text weighs
    the same); Clark et al. average over all tokens of their data. With --words, every statistic
    is over words: previous and next are the words beside, distance counts words. --file is read
    line by line, --chunk-lines texts at a time, so a corpus of any length fits in memory; its
    JS distances, and a text's past 64 MB of maps, are measured with --js only (stats.json's
    js_distance is null without).
    """
    from attnviz.api import functions

    text_or_file(text, file)
    if file is None:
        for given, name in ((checkpoint, "--checkpoint"), (resume, "--resume"), (engine != Engine.local, "--engine ray")):
            if given:
                raise AttnvizError(f"{name} goes with --file: one TEXT is measured at once")

    def compute(options):
        from attnviz.render.progress import progress_bar

        if file is None:
            with progress_bar(console) as bar:  # the text's forward pass, then its layers
                return functions.stats(text, js=js, progress=bar, **options.keywords())
        from attnviz.api.file_runs import stats_file
        from attnviz.output.batch import PROGRESS_MIN_TEXTS

        with progress_bar(console, min_total=PROGRESS_MIN_TEXTS) as bar:  # the texts measured: the corpus streamed
            return stats_file(
                file, js=bool(js), chunk_lines=chunk_lines, checkpoint=checkpoint, resume=resume, engine=engine.value,
                progress=bar, **options.keywords(),
            )  # fmt: skip

    def show(result) -> None:
        print_stats(result, engine == Engine.ray, "over a --file" if file is not None else "for a text past 64 MB of maps (H² × N² logs a layer)")

    options = run_options(
        model=model, heads=heads, weights=weights, seed=seed, causal=causal, stack=stack, device=device, dtype=dtype,
        truncate=truncate, words=words, memory=memory, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time,
    )  # fmt: skip
    run_command(options, compute, show, "writing statistics…", out=out, text=text, file=file, image_format=image_format)
    if checkpoint is not None:  # the run's files are written: nothing is left to resume
        checkpoint.unlink(missing_ok=True)


def print_stats(result, on_ray: bool, unmeasured_js: str) -> None:
    """The setup and the tables of stats; unmeasured_js: where the JS distances were not measured (when they were not)."""
    from attnviz.render import stats_tables, terminal

    terminal.print_notes(errors, list(result.notes), MAX_NOTES_SHOWN)
    source, device_label = model_setup(result.spec)
    if on_ray and result.spec.device != "cpu":  # the actors measured on their GPUs, this process loaded the model on its CPU
        device_label = f"{result.spec.device} (Ray actors)"
    num_layers, num_texts = result.stats.num_layers, result.stats.num_texts
    terminal.print_setup(console, result.first_run, source, device_label, num_layers, num_texts, seed=result.spec.seed)
    for table in stats_tables.stats_grid(result.stats, console.width, result.first_run.model_causal):
        console.print(table)
    console.print(stats_tables.labelled_heads_table(result.stats))
    if result.stats.js_distance is None:
        console.print(f"[dim]Jensen-Shannon distances between heads: not measured {unmeasured_js}; --js measures them (js_distance.png)[/dim]")

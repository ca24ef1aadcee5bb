"""`attnviz stats`: statistics and labels of every head of every layer, for a text or a corpus read line by line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
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
        if file is None:
            from attnviz.render.progress import progress_bar

            with progress_bar(console) as bar:  # the text's forward pass, then its layers
                return functions.stats(text, js=js, progress=bar, **options.keywords())
        corpus_js = bool(js)  # a corpus: the JS distances when asked
        return _stats_of_corpus(file, options, js=corpus_js, checkpoint=checkpoint, resume=resume, engine=engine, chunk_lines=chunk_lines)

    def show(result) -> None:
        print_stats(result, engine == Engine.ray, "over a --file" if file is not None else "for a text past 64 MB of maps (H² × N² logs a layer)")

    run_command(locals(), compute, show, "writing statistics…")
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


def _stats_of_corpus(file: str, options, *, js: bool, checkpoint: Optional[Path], resume: bool, engine: Engine, chunk_lines: int):
    """stats --file: the corpus checked (UTF-8, lengths, checkpoint, engine) before the heavy work, then streamed (a StatsResult)."""
    from attnviz.api.experiment_results import StatsResult
    from attnviz.api.functions import refuse_before_loading
    from attnviz.spec import refuse_cross_over_every_layer
    from attnviz.analysis.statistics import absent_key_kinds_note
    from attnviz.output.batch import PROGRESS_MIN_TEXTS, STDIN, check_lengths
    from attnviz.output.stats_checkpoint import check_checkpoint_path
    from attnviz.output.corpus import chunks, iter_texts, scan_corpus
    from attnviz.output.corpus_stats import corpus_statistics
    from attnviz.render.progress import progress_bar

    if resume and checkpoint is None:
        raise AttnvizError("--resume needs --checkpoint PATH: the checkpoint to continue from")
    if checkpoint is not None and file == STDIN:
        raise AttnvizError("--checkpoint needs a --file on disk: standard input cannot be read again to resume")
    if checkpoint is not None:
        check_checkpoint_path(checkpoint, resume)
    if engine == Engine.ray:
        from attnviz.output.ray_engine import require_ray

        require_ray()
    refuse_cross_over_every_layer(options.stack)
    refuse_before_loading(options)
    corpus = scan_corpus(file)  # None for standard input, read once, as it comes
    # With Ray, the actors run on --device; this process only reads the tokens and the first text's setup.
    handle = replace(options, device="cpu").load() if engine == Engine.ray else options.load()
    if corpus is not None:  # named by line number, before any work
        for lines in chunks(iter_texts(file), chunk_lines):
            check_lengths(handle.tokenizer, lines, handle.loaded.max_positions, options.truncate)
    spec = options.run_spec(handle, layer=None, js=js)
    engine_device = spec.device
    if engine == Engine.ray:
        from attnviz.output.ray_engine import actor_device

        engine_device = actor_device(options.device)
    total = corpus.num_texts if corpus is not None else None
    with progress_bar(console, total, "measuring heads", PROGRESS_MIN_TEXTS) as advance:
        measured = corpus_statistics(
            handle.loaded, file, spec, corpus, advance=advance, checkpoint=checkpoint, resume=resume,
            engine=engine.value, chunk_lines=chunk_lines, model_name=handle.name if handle.source != "local folder" else spec.resolved_model,
            allow_pickle=options.allow_pickle, engine_device=engine_device,
        )  # fmt: skip
    spec = replace(spec, device=engine_device)  # what stats.json records: where the statistics were measured
    progress, first = measured.progress, replace(measured.first_run, device=engine_device)
    key_kinds_note = absent_key_kinds_note(first.family, first.query_tokens)
    notes = [*progress.notes, *([key_kinds_note] if key_kinds_note else [])]
    if progress.notes_left_out:
        notes.append(f"… and up to {progress.notes_left_out} more distinct notes, not kept")
    about = {**(corpus.to_dict() if corpus is not None else {"file": STDIN, "bytes": None, "sha256": None}),
             "texts": progress.num_texts, "truncated": progress.num_truncated}  # fmt: skip
    return StatsResult(measured.stats, progress.texts, measured.truncated, first, spec, notes, about)

"""`attnviz heads`: one layer's heads for a text, or for every line of --file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from attnviz.cli.options import (
    MemoryOption,
    run_options,
    app,
    console,
    errors,
    Weights,
    Device,
    Figures,
    FiguresOption,
    HeadOption,
    WindowOption,
    ImageFormat,
    QuietOption,
    Stack,
    DeviceOption,
    Dtype,
    DtypeOption,
    TruncateOption,
    WordsOption,
    Measure,
    MeasureOption,
    Effect,
    EffectOption,
    FormatOption,
    WeightsOption,
    SeedOption,
    CausalOption,
    AllowPickleOption,
    LayerAtATimeOption,
    ModelOption,
    LayerOption,
    HeadsOption,
    KvOption,
    StackOption,
    FileOutOption,
    DEFAULT_OUTPUTS,
)
from attnviz.cli.shared import MAX_NOTES_SHOWN, layouts_disagree, model_setup, run_command, text_or_file
from attnviz.errors import AttnvizError


@app.command(short_help="Heatmaps and a table of one layer's heads, for a text or a file of texts.")
def heads(
    text: Optional[str] = typer.Argument(
        None, metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼. Or give --file.", show_default=False
    ),
    file: Optional[str] = typer.Option(
        None,
        "--file",
        "-f",
        metavar="PATH",
        help="A batch: one text per line (blank lines skipped; - reads standard input), "
        "one run folder per text and a summary.",
    ),
    model: Optional[str] = ModelOption,
    layer: int = LayerOption,
    heads: Optional[int] = HeadsOption,
    head: Optional[int] = HeadOption,
    window: Optional[str] = WindowOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    kv: Optional[str] = KvOption,
    causal: bool = CausalOption,
    stack: Optional[Stack] = StackOption,
    show_trace: bool = typer.Option(
        False, "--trace", help="Also print the shape trace of the heads (as attnviz trace) and write trace.json, trace.md."
    ),
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    figures: Optional[Figures] = FiguresOption,
    out: Optional[Path] = FileOutOption,
    truncate: bool = TruncateOption,
    memory: Optional[int] = MemoryOption,
    words: bool = WordsOption,
    measure: Measure = MeasureOption,
    effect: Optional[Effect] = EffectOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    save_map: bool = typer.Option(
        False, "--save-map", help="Also write a long text's whole map (past 64 MB, or past --memory) as attention.npy; "
        "without it the map is a temporary file, read for the figures and the report, and attention.json says so.",
    ),
    no_html: bool = typer.Option(
        False, "--no-html", help="Do not write report.html (the interactive report, as attnviz report writes it)."
    ),
    quiet: bool = QuietOption,
) -> None:
    """Per-head attention heatmaps, a summary table, attention.json and report.html for one text, or each line of --file."""
    from attnviz.api.drawn import check_drawing

    text_or_file(text, file)
    if file is not None and show_trace:
        raise AttnvizError("--trace traces one text: for a batch use attnviz trace --file PATH")
    if file is not None and measure != Measure.weights:
        raise AttnvizError("--measure measures one text: give a TEXT, not --file")
    if file is not None and effect is not None:
        raise AttnvizError("--effect measures each head over one text: give a TEXT, not --file")
    if file is not None and window is not None:
        raise AttnvizError("--window draws a region of one text's map: give a TEXT, not --file")
    figures_drawn = figures.value if figures is not None else None
    check_drawing(head, window, figures_drawn, heads)  # the API's checks, before the output folder's
    options = run_options(
        model=model, layer=layer, heads=heads, weights=weights, seed=seed, kv=kv, causal=causal, stack=stack,
        device=device, dtype=dtype, truncate=truncate, memory=memory, words=words, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time,
    )  # fmt: skip
    if file is not None:
        return _heads_for_file(file, options, image_format.value, out, figures_drawn, head, save_map, html=not no_html)
    images = dict(figures=figures_drawn or "all", head=head)

    def compute(options) -> HeadsRun:
        from attnviz.api import functions
        from attnviz.render.progress import progress_bar

        given = options.keywords()
        if show_trace and head is not None:  # the trace runs the layer first: the head checked on the model before it
            from attnviz.api.drawn import check_head_of
            from attnviz.spec import check_text

            check_text(text)  # as the API would, before loading
            handle = options.load()  # attnviz.load's: the API's calls reuse it
            check_head_of(head, handle, options.run_spec(handle))
        if show_trace and measure == Measure.weights and effect is None and no_html:
            traced = functions.trace(text, **given)
            result = traced.heads_results()[0]  # its run is the heads' run: computed once
        else:  # the report (and the trace) from the run's own capture; a long text's summarises every layer in its pass
            summarise = None if not no_html and measure == Measure.weights else False
            with progress_bar(console) as bar:  # --effect's heads taken out; the forward pass, the report's layers
                result = functions.heads(
                    text, measure=measure.value, layer_summaries=summarise, effect=effect.value if effect else None,
                    head=head, window=window, report=not no_html, trace=show_trace, progress=bar, **given,
                )  # fmt: skip
            traced = result.traced
        handle = options.load()  # the one the API loaded
        checked_window = result.window(window, "--window") if window is not None else None  # before anything is written
        report = None if no_html else result.report()  # every layer, the statistics and the traces: made with the run
        return HeadsRun(result, traced, handle.loaded, checked_window, report)

    def show(computed: HeadsRun) -> None:
        print_heads(computed, head)

    def write(computed: HeadsRun, staging: Path) -> list[Path]:
        result, traced = computed.result, computed.traced
        written = result.write_files(staging, image_format.value, images["figures"], head, computed.window, save_map)
        written += traced.write_files(staging, image_format.value) if traced is not None else []
        return written + (computed.report.write_files(staging) if computed.report is not None else [])

    computed, _ = run_command(options, compute, show, "writing heatmaps…", out=out, text=text, write=write)
    run = computed.result.run
    if run.map_on_disk and not save_map:
        from attnviz.output.export import map_not_saved
        from attnviz.render import terminal
        from attnviz.run_data import map_bytes

        terminal.print_notes(errors, [map_not_saved(map_bytes(run.attention))])
    print_recap(run)
    if computed.traced is not None and not computed.traced.agree:
        return layouts_disagree(computed.traced.trace)


@dataclass(frozen=True)
class HeadsRun:
    """What `attnviz heads` computed for a text: its HeadsResult, its trace (--trace), the model, the --window checked,
    its report (a ReportResult; None with --no-html)."""

    result: Any
    traced: Any
    loaded: Any
    window: Any
    report: Any = None


def print_heads(computed: HeadsRun, head: Optional[int]) -> None:
    """The notes, the setup, the tokens and the table of the heads (of --head N alone); the measures and the trace."""
    from attnviz.render import terminal

    result, traced = computed.result, computed.traced
    run = result.run
    terminal.print_notes(errors, run.notes)
    terminal.print_setup(console, run, *model_setup(result.spec), seed=result.spec.seed)
    terminal.print_tokens(console, run)
    if head is None:
        console.print(result)  # its __rich__: the table of the heads
    else:
        console.print(terminal.heads_table(run, [result.summaries[head]], terminal.MAX_TOP_KEYS_SHOWN, result.effects))
    if result.measures is not None:
        from attnviz.render.measure_table import print_measures

        print_measures(console, run, result.measures)
    if traced is not None:
        from attnviz.render.trace_tables import print_trace

        print_trace(console, traced.trace, text_tokens=[run.shown_tokens[0]])


def print_recap(run) -> None:
    """The run's headline notes again, short, as the last line: a fallback model, a text mostly [UNK] (titles.headline_recap)."""
    from attnviz.render.terminal import print_notes
    from attnviz.render.titles import headline_recap

    recap = headline_recap(run)
    print_notes(errors, [recap] if recap else [])


def _heads_for_file(
    file: str, options, image_format: str, out: Optional[Path], figures: Optional[str], head: Optional[int],
    save_map: bool, *, html: bool,
) -> None:
    """`heads --file`: attnviz.heads_file into --out (or a new folder under outputs/ named after the file), under a
    progress bar of the texts; then the setup, a row per text, the files and the notes."""
    from attnviz.api.file_runs import heads_file
    from attnviz.output.batch import PROGRESS_MIN_TEXTS, batch_folder_name
    from attnviz.render import terminal
    from attnviz.render.progress import progress_bar

    folder = out if out is not None else DEFAULT_OUTPUTS / batch_folder_name(file)
    with progress_bar(console, min_total=PROGRESS_MIN_TEXTS) as bar:
        result = heads_file(
            file, folder, format=image_format, figures=figures, head=head, save_map=save_map, html=html,
            unique=out is None, progress=bar, **options.keywords(),
        )  # fmt: skip

    terminal.print_setup(console, result.first_run, *model_setup(result.spec), seed=options.seed)
    console.print(terminal.batch_table(result.rows, result.first_run.causal))
    numbers = [row["folder"].split("-", 1)[0] for row in result.rows]
    folders = result.rows[0]["folder"] if len(numbers) == 1 else f"{numbers[0]}-… to {numbers[-1]}-… (a folder per text)"
    terminal.print_files(console, result.folder, [result.folder / folders, *result.files])
    # The notes last, where a long table does not scroll them away.
    terminal.print_notes(errors, result.notes, MAX_NOTES_SHOWN)
    terminal.print_notes(errors, result.report_notes)

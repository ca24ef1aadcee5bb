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
    ModelOption,
    LayerOption,
    HeadsOption,
    KvOption,
    StackOption,
    FileOutOption,
)
from attnviz.cli.shared import MAX_NOTES_SHOWN, layouts_disagree, model_setup, run_command, run_target, text_or_file
from attnviz.errors import AttnvizError
from attnviz.spec import check_text


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
    parameters = locals()
    text_or_file(text, file)
    if file is not None and show_trace:
        raise AttnvizError("--trace traces one text: for a batch use attnviz trace --file PATH")
    if file is not None and measure != Measure.weights:
        raise AttnvizError("--measure measures one text: give a TEXT, not --file")
    if file is not None and effect is not None:
        raise AttnvizError("--effect measures each head over one text: give a TEXT, not --file")
    if head is not None and figures is not None:
        raise AttnvizError(f"--head {head} draws that head's heatmap alone: leave out --figures")
    if window is not None:  # malformed or empty: refused before the model loads; the map's range once it is known
        from attnviz.render.window_figures import parse_window

        if file is not None:
            raise AttnvizError("--window draws a region of one text's map: give a TEXT, not --file")
        parse_window(window, "--window")
    if head is not None and heads is not None:  # the range is known before the model loads
        check_head(head, heads, f"--heads {heads} splits the layer into")
    images = dict(figures=(figures.value if figures else "grid" if file is not None else "all"), head=head)
    if file is not None:
        options = run_options(parameters)
        return _heads_for_file(file, options, image_format.value, out, {**images, "save_map": save_map}, html=not no_html)

    def compute(options) -> HeadsRun:
        from attnviz.api import functions
        from attnviz.render.progress import progress_bar

        if head is not None and heads is None:  # the model's own heads: refused once it loads, before the computation
            check_text(text)  # as the API would, before loading
            loaded = options.load().loaded  # attnviz.load's: the API's call reuses it
            check_head(head, loaded.num_heads_of(options.stack), f"{loaded.name}'s layers have")
        given = options.keywords()
        traced = functions.trace(text, **given) if show_trace else None
        if traced is not None and measure == Measure.weights and effect is None and no_html:
            result = traced.heads_results()[0]  # its run is the heads' run: computed once
        else:  # the report from the run's own capture; a long text's summarises every layer in the run's forward pass
            summarise = None if not no_html and measure == Measure.weights else False
            with progress_bar(console) as bar:  # --effect's heads taken out; the forward pass, the report's layers
                result = functions.heads(
                    text, measure=measure.value, layer_summaries=summarise, effect=effect.value if effect else None,
                    report=not no_html, progress=bar, **given,
                )  # fmt: skip
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

    computed, _ = run_command(parameters, compute, show, "writing heatmaps…", write)
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


def check_head(head: int, num_heads: int, has: str) -> None:
    """--head N names one of the heads, numbered 0 to num_heads - 1 (has: who has them, for the message)."""
    if not 0 <= head < num_heads:
        raise AttnvizError(f"--head {head} is out of range: {has} {num_heads} heads, 0 to {num_heads - 1}")


def _heads_for_file(file: str, options, image_format: str, out: Optional[Path], images: dict, *, html: bool) -> None:
    """`heads --file`: every line through the same layer, batch by batch; a folder per text; report.html of the first texts.

    images: the heatmaps each folder gets (--figures, --head), and save_map (--save-map). The output layer's
    write_batch, not attnviz.heads: it writes each batch's folders as it goes, so no more than a batch of runs is ever held, however long the file.
    """
    from attnviz.api.functions import refuse_before_loading
    from attnviz.output import batch
    from attnviz.output.corpus import read_texts
    from attnviz.output.runs import StagedRunFolder
    from attnviz.render import terminal
    from attnviz.render.progress import progress_bar

    texts = read_texts(file)
    target = run_target(out, batch.batch_folder_name(file))
    if out is not None:
        batch.check_batch_target(target, [*batch.text_folder_names(texts), *(["report.html"] if html else [])])
    refuse_before_loading(options)
    handle = options.load()
    loaded = handle.loaded
    batch.check_lengths(loaded.tokenizer, texts, loaded.max_positions, options.truncate)
    spec = options.run_spec(handle)
    if images["head"] is not None and options.heads is None:
        check_head(images["head"], spec.num_heads, f"{handle.loaded.name}'s layers have")

    folder = StagedRunFolder(target, unique=out is None)
    progress = progress_bar(console, len(texts), "attention and heatmaps", batch.PROGRESS_MIN_TEXTS)
    with progress as advance, folder as staging:
        result = batch.write_batch(loaded, texts, staging, image_format, spec, on_text=lambda: advance(1), **images)
        report_files, report_notes = _batch_report(loaded, [entry.text for entry in texts], spec, staging) if html else ([], [])

    terminal.print_setup(console, result.first_run, handle.source, handle.device_label, seed=options.seed)
    console.print(terminal.batch_table(result.rows, result.first_run.causal))
    numbers = [row["folder"].split("-", 1)[0] for row in result.rows]
    folders = result.rows[0]["folder"] if len(numbers) == 1 else f"{numbers[0]}-… to {numbers[-1]}-… (a folder per text)"
    terminal.print_files(console, folder.final, [folder.final / folders, *result.files, *report_files])
    # The notes last, where a long table does not scroll them away.
    terminal.print_notes(errors, result.notes, MAX_NOTES_SHOWN)
    terminal.print_notes(errors, report_notes)


def _batch_report(loaded, texts: list[str], spec, staging: Path) -> tuple[list[Path], list[str]]:
    """report.html of the batch: its first texts that one report holds (one capture per batch again: write_batch keeps no
    runs); the note past them."""
    from attnviz.api.report import MAX_REPORT_TEXTS, MAX_REPORT_WEIGHTS, report_of_texts, texts_that_fit

    fit, weights = texts_that_fit(loaded, texts, spec)
    shown = texts[:fit]
    notes = [] if len(shown) == len(texts) else [
        f"report.html shows the first {len(shown)} of the {len(texts)} texts (a report holds at most {MAX_REPORT_TEXTS} "
        f"texts, whose maps of every layer have at most {MAX_REPORT_WEIGHTS:,} attention weights; these have {weights:,}); "
        "every text has its own folder of heatmaps and attention.json"
    ]  # fmt: skip
    return report_of_texts(loaded, shown, spec, notes).write_files(staging), notes

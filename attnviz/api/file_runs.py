"""attnviz.heads_file and attnviz.stats_file: `heads --file` and `stats --file` as functions, the command line's own.

Each takes a file of texts (a path, str or Path: one text per line, blank lines skipped, "-" standard input; read as
output/corpus.py reads --file) or any iterable of texts (a list, a generator: each item one text), checks everything
before the model loads, as the commands do, and streams: heads_file writes each batch's folders as it goes (no more
than a batch of runs held), stats_file measures a chunk of texts at a time (read as they are needed: memory bounded by
a chunk, not by the file). progress= counts the texts done, as attnviz.stats' does (api/arguments.must_be_progress):
the command line passes its bar.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import Any

from attnviz.api.arguments import must_be_bool, must_be_int, must_be_one_of, must_be_progress, must_be_str, refuse
from attnviz.api.drawn import check_drawing, check_head_of
from attnviz.api.checks import refuse_before_loading, warn_run_notes
from attnviz.api.options import EVERY_LAYER_OPTIONS, run_options, takes_options
from attnviz.errors import AttnvizError, option, options_named
from attnviz.spec import LOCAL_SOURCES, RunSpec, check_text

TEXTS_WRITTEN = "texts written"  # heads_file's stage, as progress= counts it
TEXTS_MEASURED = "texts measured"  # stats_file's: attnviz.stats' own
ENGINES = ("local", "ray")  # output/corpus_stats.py's, not imported: it imports torch
CHUNK_LINES = 1024  # output/corpus.py's


@dataclass(frozen=True)
class HeadsFileResult:
    """What attnviz.heads_file wrote: folder holds a folder per text (rows' "folder"), summary.csv, summary.json and
    report.html (files: those of folder itself). rows: summary.csv's, one per text in input order; first_run: the first
    text's run (an AttentionRun), for the setup; notes: the runs' distinct notes; report_notes: what report.html leaves
    out (its first texts only)."""

    folder: Path
    rows: list[dict]
    files: list[Path]
    first_run: Any
    spec: RunSpec
    notes: list[str]
    report_notes: list[str]

    @property
    def text_folders(self) -> list[Path]:
        return [self.folder / row["folder"] for row in self.rows]

    def __repr__(self) -> str:
        return f"HeadsFileResult({len(self.rows)} texts in {self.folder})"


@takes_options()
def heads_file(
    texts, folder: str | Path, *, format: str = "png", figures: str | None = None, head: int | None = None,
    save_map: bool = False, html: bool = True, unique: bool = False, progress=None, **options,
) -> HeadsFileResult:  # fmt: skip
    """`attnviz heads --file texts --out folder`: one layer's heads of every text, batch by batch, a folder per text
    (its heatmaps and attention.json), summary.csv and summary.json, and report.html of the first texts (html=False:
    none). Written all or nothing into folder (files of an earlier run there replaced, others' refused); unique=True:
    a new folder beside it where folder is taken (folder-2, ...: the command line's default folder).

    texts: a path or an iterable of texts (module docstring); held as texts (their runs are not: a batch at a time).
    figures: each folder's heatmaps, "all", "grid" (default) or "none"; head: head_NN alone (not with figures);
    save_map: a long text's map as attention.npy. options as in attnviz.heads. progress(n) after each text written
    (stage "texts written", the texts' count).
    """
    from attnviz.analysis.neurons import MAX_VECTOR_TOKENS
    from attnviz.api.report_parts import captured_batches, report_of_parts
    from attnviz.output import batch
    from attnviz.output.runs import StagedRunFolder, check_target
    from attnviz.render.heatmap import check_format

    options = run_options("heads_file", options)
    folder = Path(_must_be_path("folder", folder))
    check_format(must_be_str("format", format))
    check_drawing(head, figures=figures, heads=options.heads)
    for name, value in (("save_map", save_map), ("html", html), ("unique", unique)):
        must_be_bool(name, value)
    progress = must_be_progress(progress)
    lines = list(_line_texts(texts))
    if not lines:
        raise AttnvizError(_no_text(texts))
    target = check_target(folder)
    if not unique:
        batch.check_batch_target(target, [*batch.text_folder_names(lines), *(["report.html"] if html else [])])
    refuse_before_loading(options)
    handle = options.load()
    loaded = handle.loaded
    batch.check_lengths(loaded.tokenizer, lines, loaded.max_positions, options.truncate)
    spec = options.run_spec(handle)
    check_head_of(head, handle, spec)

    texts = [entry.text for entry in lines]
    reported, report_notes = _reported(loaded, texts, spec) if html else (0, [])
    parts = []  # the report's texts' (ReportText, notes), made from their batch's capture as write_batch takes its runs

    def batched_runs():
        vector_tokens = 0 if spec.words else MAX_VECTOR_TOKENS  # the report's neuron view's
        for made in captured_batches(loaded, texts, spec, vector_tokens=vector_tokens, reported=reported):
            parts.extend((part, notes) for _, part, notes in made if part is not None)
            yield [run for run, _, _ in made]

    run_folder = StagedRunFolder(target, unique=unique)
    advance = progress.counting(TEXTS_WRITTEN, len(lines))
    with run_folder as staging:
        written = batch.write_batch(
            loaded, lines, staging, format, spec, on_text=lambda: advance(1), figures=figures or "grid", head=head,
            save_map=save_map, batched_runs=batched_runs(),
        )  # fmt: skip
        report_files = report_of_parts(loaded, parts, spec, report_notes).write_files(staging) if html else []
    warn_run_notes([*written.notes, *report_notes], handle)
    files = [run_folder.final / path.name for path in [*written.files, *report_files]]
    return HeadsFileResult(run_folder.final, written.rows, files, written.first_run, spec, written.notes, report_notes)


def _reported(loaded, texts: list[str], spec: RunSpec) -> tuple[int, list[str]]:
    """How many of the texts, from the first, report.html holds (texts_that_fit), and the note past them."""
    from attnviz.api.report import MAX_REPORT_TEXTS, MAX_REPORT_WEIGHTS, texts_that_fit

    fit, weights = texts_that_fit(loaded, texts, spec)
    notes = [] if fit == len(texts) else [
        f"report.html shows the first {fit} of the {len(texts)} texts (a report holds at most {MAX_REPORT_TEXTS} "
        f"texts, whose maps of every layer have at most {MAX_REPORT_WEIGHTS:,} attention weights; these have {weights:,}); "
        "every text has its own folder of heatmaps and attention.json"
    ]  # fmt: skip
    return fit, notes


@takes_options(EVERY_LAYER_OPTIONS)
def stats_file(
    texts, *, js: bool = False, chunk_lines: int = CHUNK_LINES, checkpoint: str | Path | None = None, resume: bool = False,
    engine: str = "local", progress=None, **options,
):  # fmt: skip
    """`attnviz stats --file texts`: statistics and labels of every head of every layer, each averaged per text, then
    over the texts (a StatsResult, its .corpus stats.json's "corpus"), read and measured chunk_lines texts at a time.

    texts: a path or an iterable of texts (module docstring). A file is read once before the work (UTF-8, some text,
    its size and SHA-256) and its texts' lengths checked chunk by chunk; standard input and an iterable are read once,
    each chunk checked as it comes. js: also the Jensen-Shannon distances between heads (most of the work). checkpoint
    (a file on disk only): after each chunk the sums so far are saved there (.npz); resume=True continues from it,
    refused when made with other settings or another file. engine "ray": the chunks measured on Ray actors
    (pip install "attnviz[ray]"). options as in attnviz.stats. progress(n) after each n texts measured (stage
    "texts measured", the file's count; None for standard input or an iterable without len()).
    """
    from attnviz.api.experiment_results import StatsResult
    from attnviz.analysis.statistics import absent_key_kinds_note
    from attnviz.output.batch import check_lengths
    from attnviz.output.corpus import STDIN, chunks, iter_texts, scan_corpus
    from attnviz.output.corpus_stats import corpus_statistics
    from attnviz.output.stats_checkpoint import check_checkpoint_path
    from attnviz.spec import refuse_cross_over_every_layer

    options = run_options("stats_file", options, EVERY_LAYER_OPTIONS)
    path = _path(texts)
    must_be_bool("js", js)
    if must_be_int("chunk_lines", chunk_lines) < 1:
        raise AttnvizError(f"chunk_lines {chunk_lines}: give 1 or more texts a chunk")
    checkpoint = Path(_must_be_path("checkpoint", checkpoint, none=True)) if checkpoint is not None else None
    must_be_bool("resume", resume)
    must_be_one_of("engine", engine, ENGINES)
    progress = must_be_progress(progress)
    if resume and checkpoint is None:
        raise AttnvizError(f"{option('resume', True)} needs {_path_option('checkpoint')}: the checkpoint to continue from")
    if checkpoint is not None and path in (None, STDIN):
        again = "standard input" if path == STDIN else "an iterable of texts"
        raise AttnvizError(f"{option('checkpoint')} needs a {options_named('file')} on disk: {again} cannot be read again to resume")
    if checkpoint is not None:
        check_checkpoint_path(checkpoint, resume)
    if engine == "ray":
        from attnviz.output.ray_engine import require_ray

        require_ray()
    refuse_cross_over_every_layer(options.stack)
    refuse_before_loading(options)
    corpus = scan_corpus(path) if path is not None else None  # None for standard input, read once, as it comes
    lines = None if path is not None else _first_checked(texts)  # an iterable's: a list's all checked, else the first
    # With Ray, the actors run on device; this process only reads the tokens and the first text's setup.
    handle = replace(options, device="cpu").load() if engine == "ray" else options.load()
    if corpus is not None:  # named by line number, before any work
        for lines in chunks(iter_texts(path), chunk_lines):
            check_lengths(handle.tokenizer, lines, handle.loaded.max_positions, options.truncate)
    spec = options.run_spec(handle, layer=None, js=js)
    engine_device, loading = spec.device, None
    if engine == "ray":
        from attnviz.output.ray_engine import actor_device, actor_loading

        engine_device, loading = actor_device(options.device), actor_loading(handle.loaded, options.allow_pickle)
    total = corpus.num_texts if corpus is not None else len(texts) if path is None and hasattr(texts, "__len__") else None
    measured = corpus_statistics(
        handle.loaded, path if path is not None else lines, spec, corpus,
        advance=progress.counting(TEXTS_MEASURED, total), checkpoint=checkpoint, resume=resume, engine=engine,
        chunk_lines=chunk_lines, model_name=handle.name if handle.source not in LOCAL_SOURCES else spec.resolved_model,
        loading=loading, engine_device=engine_device,
    )  # fmt: skip
    spec = replace(spec, device=engine_device)  # what stats.json records: where the statistics were measured
    done, first = measured.progress, replace(measured.first_run, device=engine_device)
    key_kinds_note = absent_key_kinds_note(first.family, first.query_tokens)
    notes = [*done.notes, *([key_kinds_note] if key_kinds_note else [])]
    if done.notes_left_out:
        notes.append(f"… and up to {done.notes_left_out} more distinct notes, not kept")
    about = {**(corpus.to_dict() if corpus is not None else {"file": path, "bytes": None, "sha256": None}),
             "texts": done.num_texts, "truncated": done.num_truncated}  # fmt: skip
    warn_run_notes(notes, handle)
    return StatsResult(measured.stats, done.texts, measured.truncated, first, spec, notes, about)


def _path(texts) -> str | None:
    """The path of a file of texts as --file takes it ("-": standard input), or None for an iterable of texts."""
    if isinstance(texts, (str, Path)):
        return str(texts)
    if isinstance(texts, bytes) or not isinstance(texts, Iterable):
        refuse("texts", "a path (str or Path) or an iterable of str", texts)
    return None


def _line_texts(texts) -> Iterator:
    """The texts as output/corpus.py's LineText, read as they are needed: a file's non-blank lines with their line
    numbers, an iterable's items numbered from 1, each checked as attnviz.heads checks a list's texts."""
    from attnviz.output.corpus import LineText, iter_texts

    path = _path(texts)
    if path is not None:
        yield from iter_texts(path)
        return
    for number, text in enumerate(texts, 1):
        check_text(must_be_str(f"texts[{number - 1}]", text), f"texts[{number - 1}]")
        yield LineText(number, text)


def _first_checked(texts) -> Iterator:
    """An iterable's texts (_line_texts), checked before the work as far as they can be: every one of a list or tuple
    (held already), else the first (a generator is read once, as it comes); none is refused."""
    if isinstance(texts, (list, tuple)):
        lines = list(_line_texts(texts))
        if not lines:
            raise AttnvizError(_no_text(texts))
        return iter(lines)
    lines = _line_texts(texts)
    first = next(lines, None)
    if first is None:
        raise AttnvizError(_no_text(texts))
    return chain([first], lines)


def _no_text(texts) -> str:
    from attnviz.output.corpus import where

    path = _path(texts)
    return f"{where(path)} has no text: every line is blank" if path is not None else "no texts: give an iterable of one text or more"


def _must_be_path(name: str, value, none: bool = False) -> str | Path | None:
    if (value is None and none) or isinstance(value, (str, Path)):
        return value
    refuse(name, "a path (str or Path)" + (" or None" if none else ""), value)


def _path_option(name: str) -> str:
    """An option that takes a path, as the face in use spells it: "--checkpoint PATH" on the command line, "checkpoint=" in the API."""
    return option(name, "PATH") if option(name).startswith("--") else option(name)

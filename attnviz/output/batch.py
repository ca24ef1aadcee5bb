"""`attnviz heads --file`: many texts, padded into batches, one run folder per text.

Each batch of texts goes through attnviz's layer in one forward pass; padding keys are masked
by each text's valid length, so every text gets exactly the weights it gets alone. Results are
written batch by batch, so memory stays bounded however long the file is.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from attnviz.analysis.statistics import summarize_heads
from attnviz.errors import AttnvizError
from attnviz.output.corpus import STDIN, LineText
from attnviz.output.runs import earlier_run_files, run_folder_name
from attnviz.run_data import AttentionRun, Truncation, truncation_json
from attnviz.spec import RunSpec

FIGURES = ("all", "grid", "none")  # --figures: every head's heatmap and the grid, the grid alone, no heatmap
PROGRESS_MIN_TEXTS = 6  # show a progress bar from this many texts on
SUMMARY_FILES = ("summary.csv", "summary.json")
SUMMARY_FORMAT_VERSION = 1
SUMMARY_FIELDS = (
    "index",
    "line",
    "folder",
    "tokens",
    "words",
    "most_focused_head",
    "most_focused_relative_entropy",
    "mean_relative_entropy",
    "text",
)


def batch_folder_name(path: str) -> str:
    """The default parent folder: named after the file, "stdin" for standard input."""
    return "stdin" if path == STDIN else run_folder_name(Path(path).stem)


def text_folder_names(texts: list[LineText]) -> list[str]:
    """ "001-The-animal-didn-t-cross…", …: numbered in input order, so unique and sorted."""
    width = max(3, len(str(len(texts))))
    return [f"{index:0{width}d}-{run_folder_name(entry.text)}" for index, entry in enumerate(texts, 1)]


def check_batch_target(target: Path, names: list[str]) -> None:
    """Refuse an --out folder that holds files of the same names that attnviz did not write there.

    An earlier attnviz run's files (its manifest lists them) are replaced as a whole instead.
    """
    earlier = set(earlier_run_files(target))
    taken = [name for name in [*names, *SUMMARY_FILES] if (target / name).exists() and name not in earlier]
    if taken:
        raise AttnvizError(
            f"the output folder {target} already has {taken[0]}"
            + (f" and {len(taken) - 1} more" if len(taken) > 1 else "")
            + " that attnviz did not write: give a new --out folder"
        )


def check_lengths(tokenizer, texts: list[LineText], max_positions: int, truncate: bool) -> None:
    """Name the line of the first text too long for the model, before any work is done."""
    from attnviz.models.tokens import check_lengths as check_token_counts

    if not truncate:
        counts = [len(ids) for ids in tokenizer.encode_batch([entry.text for entry in texts])]
        check_token_counts(counts, max_positions, [f"line {entry.line}" for entry in texts])


def run_in_batches(
    loaded, texts: list[str], spec: RunSpec, batch_size: int | None = None, vector_tokens: int = 0
) -> Iterator[list[AttentionRun]]:
    """run_attention over each batch of texts in turn: one padded forward pass per batch (BATCH_SIZE texts);
    vector_tokens: run_attention's."""
    from attnviz.pipeline import BATCH_SIZE, batches, run_attention

    for batch in batches(texts, batch_size or BATCH_SIZE):
        yield run_attention(loaded, batch, spec, vector_tokens=vector_tokens)


def write_run_files(
    run: AttentionRun, spec: RunSpec, folder: Path, fmt: str, *, figures: str = "all", head: int | None = None,
    save_map: bool = False,
) -> list[Path]:
    """What `attnviz heads` writes for one text: the heatmaps that figures and head choose, attention.json,
    and with save_map (--save-map) a long text's attention.npy."""
    from attnviz.output.export import write_attention_files

    folder.mkdir()
    written = write_head_figures(run, folder, fmt, spec.seed, figures=figures, head=head)
    return written + write_attention_files(run, spec, folder, save_map=save_map)


def write_head_figures(
    run: AttentionRun, folder: Path, fmt: str, seed: int | None = None, *, figures: str = "all", head: int | None = None
) -> list[Path]:
    """The heads' heatmaps that --figures chooses (FIGURES: all, grid or none), or with --head N head_NN alone; their paths.

    seed: the seed of random parameters, for the titles.
    """
    from attnviz.render.heatmap import head_figure, save_figure, write_heads_grid, write_heatmaps

    if head is not None:
        return [save_figure(head_figure(run, head, seed=seed), folder, f"head_{head:02d}.{fmt}")]
    if figures == "all":
        return write_heatmaps(run, folder, fmt, seed=seed)
    if figures == "grid":
        return [write_heads_grid(run, folder, fmt, seed=seed)]
    if figures == "none":
        return []
    raise AttnvizError(f"figures {figures!r} is not one of {', '.join(FIGURES)}")


def summary_row(index: int, entry: LineText, folder: str, run: AttentionRun) -> dict:
    summaries = summarize_heads(run.attention, run.causal)
    focused = min(summaries, key=lambda summary: summary.relative_entropy)
    return {
        "index": index,
        "line": entry.line,
        "folder": folder,
        "tokens": len(run.tokenizer_tokens[0]),
        "words": len(run.query_tokens) if run.words is not None else None,  # --words: the maps' rows
        "most_focused_head": focused.head,
        "most_focused_relative_entropy": round(focused.relative_entropy, 4),
        "mean_relative_entropy": round(sum(s.relative_entropy for s in summaries) / len(summaries), 4),
        "text": entry.text,
    }


@dataclass
class BatchResult:
    rows: list[dict]  # one summary row per text, in input order (summary.json adds its "truncated")
    first_run: AttentionRun  # for the setup lines: model, layer, heads, weights are shared
    notes: list[str]  # distinct notes over all texts, in order
    files: list[Path]  # the summary files


def write_batch(
    loaded,
    texts: list[LineText],
    out_dir: Path,
    fmt: str,
    spec: RunSpec,
    *,
    batch_size: int | None = None,
    on_text: Callable[[], None] | None = None,
    figures: str = "all",
    head: int | None = None,
    save_map: bool = False,
    batched_runs: Iterable[list[AttentionRun]] | None = None,
) -> BatchResult:
    """Run every text with spec's settings, write its folder into out_dir, then summary.csv and summary.json.

    figures and head choose each folder's heatmaps (write_head_figures); save_map (--save-map) writes a long
    text's whole map, attention.npy, into its folder; without it a note says how many were not saved. batched_runs:
    the texts' runs a batch at a time, made by the caller (heads_file's: the report's parts made from the same
    capture), else run_in_batches'.
    """
    from attnviz.output.export import map_not_saved
    from attnviz.run_data import map_bytes

    names = text_folder_names(texts)
    rows, truncated, notes, first_run = [], [], {}, None
    unsaved = []  # the bytes of each long text's map not saved
    if batched_runs is None:
        batched_runs = run_in_batches(loaded, [entry.text for entry in texts], spec, batch_size)
    runs = (run for batch_runs in batched_runs for run in batch_runs)  # one batch in memory at a time
    for index, (entry, name, run) in enumerate(zip(texts, names, runs), 1):
        write_run_files(run, spec, out_dir / name, fmt, figures=figures, head=head, save_map=save_map)
        unsaved += [map_bytes(run.attention)] if run.map_on_disk and not save_map else []
        rows.append(summary_row(index, entry, name, run))
        truncated.append(run.truncated)
        notes.update(dict.fromkeys(run.notes))
        if first_run is None:  # a copy of its own slice: a view would keep the whole batch's arrays alive (a map on disk: none)
            first_run = replace(run, attention=run.attention if run.map_on_disk else run.attention.copy(), output=run.output.copy())
        if on_text is not None:
            on_text()
    files = write_summary(rows, truncated, out_dir, first_run, spec)
    notes.update(dict.fromkeys([map_not_saved(sum(unsaved), len(unsaved))] if unsaved else []))
    return BatchResult(rows, first_run, list(notes), files)


def write_summary(
    rows: list[dict], truncated: list[Truncation | None], out_dir: Path, run: AttentionRun, spec: RunSpec
) -> list[Path]:
    """summary.csv, and summary.json with each row's cut by --truncate; run is any text's, for the setup."""
    csv_path = out_dir / SUMMARY_FILES[0]
    with csv_path.open("w", encoding="utf-8", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=SUMMARY_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    record = {
        "format": "attnviz-batch",
        "version": SUMMARY_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "model": run.model,
        "layer": run.layer,
        "weights": run.weights,
        "num_heads": run.num_heads,
        "device": run.device,
        "causal": run.causal,
        "kv_text": spec.kv_text,
        "kv_truncated": truncation_json(run.kv_truncated),
        "texts": [{**row, "truncated": truncation_json(cut)} for row, cut in zip(rows, truncated)],
    }
    json_path = out_dir / SUMMARY_FILES[1]
    json_path.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    return [csv_path, json_path]

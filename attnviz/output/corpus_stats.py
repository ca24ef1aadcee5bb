"""`attnviz stats --file`: the corpus streamed chunk by chunk, checkpointed, on this process or on Ray.

Memory is bounded by a chunk of CHUNK_LINES lines (sorted by length within the chunk, so batches
pad little; the averages do not depend on the order) and by what stats.json lists: every text
while the corpus has at most LISTED_TEXTS, beyond that only their count and the file's SHA-256.
Each chunk is a shard: measured into a fresh accumulator (here, or on a Ray actor), whose state
is merged into the run's sums exactly once, in shard order, then checkpointed (--checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from attnviz.analysis.stats_pass import HeadsMeasurer
from attnviz.analysis.statistics import ModelStatistics, StatisticsAccumulator
from attnviz.errors import AttnvizError
from attnviz.models.loading import LoadedModel
from attnviz.models.tokens import text_truncations
from attnviz.output.batch import check_lengths
from attnviz.output.stats_checkpoint import LISTED_TEXTS, CorpusProgress, StateLayout, read_checkpoint, write_checkpoint
from attnviz.output import corpus as corpus_file
from attnviz.output.corpus import CorpusIdentity, LineText, chunks, iter_texts, where
from attnviz.run_data import AttentionRun, Truncation
from attnviz.spec import RunSpec

KEPT_NOTES = 100  # distinct notes kept (unknown-token notes are one per text): the rest are counted
ENGINES = ("local", "ray")


@dataclass
class CorpusStats:
    stats: ModelStatistics
    progress: CorpusProgress  # texts listed (None beyond LISTED_TEXTS), cuts, notes
    truncated: list[Truncation | None] | None  # each listed text's cut, None when the texts are not listed
    first_run: AttentionRun  # the first text's layer-0 run, measured on its own: the setup stats prints and records


@dataclass
class Shard:
    index: int  # 0, 1, ... in input order
    lines: list[LineText]


def corpus_statistics(
    loaded: LoadedModel,
    path: str | Iterable[LineText],
    spec: RunSpec,
    corpus: CorpusIdentity | None,
    *,
    advance: Callable[[int], None] = lambda done: None,
    checkpoint: Path | None = None,
    resume: bool = False,
    engine: str = "local",
    chunk_lines: int | None = None,
    model_name: str | None = None,
    loading: dict | None = None,
    engine_device: str | None = None,
) -> CorpusStats:
    """The statistics of every head over the corpus at path, read chunk by chunk (scan_corpus' identity; None for stdin).

    path may also be the texts themselves, any iterable of LineText (attnviz.stats_file's), read as they come, as stdin is.

    advance(n) after every n texts measured (and once with the texts a resumed checkpoint had).
    With the file's lengths checked beforehand (corpus given), a stdin chunk is checked before it runs.
    engine "ray": the shards go to Ray actors (output/ray_engine.py) that load model_name themselves (loading: load_model's
    options, ray_engine.actor_loading's), on
    engine_device (spec.device, where loaded is, by default: this process needs no GPU for them).
    chunk_lines: texts per shard (and per checkpoint), corpus.CHUNK_LINES by default.
    """
    measurer = HeadsMeasurer(loaded, spec)
    accumulator, progress = measurer.accumulator(), CorpusProgress()
    if resume:
        layout = StateLayout(len(accumulator.counts), measurer.layers[0].num_heads, accumulator.causal, accumulator.js)
        state, progress = read_checkpoint(checkpoint, spec, corpus, layout)
        accumulator = StatisticsAccumulator.from_state(state)
        advance(progress.num_texts)
    shards = _shards(path, loaded, spec, progress.lines_consumed, corpus is None, chunk_lines or corpus_file.CHUNK_LINES)
    if engine == "ray":
        from attnviz.output.ray_engine import ray_shard_states

        actor_spec = replace(spec, device=engine_device or spec.device)
        measured = ray_shard_states(shards, model_name, actor_spec, loading or {}, advance)
    else:
        measured = _local_shard_states(measurer, shards, advance)
    try:
        for shard, state, notes in measured:
            accumulator.merge(StatisticsAccumulator.from_state(state))
            _record(progress, shard, notes, loaded, spec)
            if checkpoint is not None:
                write_checkpoint(checkpoint, accumulator.state(), spec, corpus, progress)
    finally:
        measured.close()  # a failed run stops Ray's actors too
    if not progress.num_texts:
        raise AttnvizError(f"{where(path) if isinstance(path, str) else 'the texts'} has no text: every line is blank")
    _, first_run = measurer.measure([progress.first_text], measurer.accumulator(), first_text=progress.first_text)
    truncated = None
    if progress.truncated is not None:
        truncated = [Truncation(*cut) if cut is not None else None for cut in progress.truncated]
    return CorpusStats(accumulator.result(), progress, truncated, first_run)


def _shards(path, loaded, spec, skip_lines: int, check_each: bool, chunk_lines: int) -> Iterator[Shard]:
    """The corpus' chunks after line skip_lines, numbered; from stdin each checked for length before it is handed on."""
    texts = (entry for entry in (iter_texts(path) if isinstance(path, str) else path) if entry.line > skip_lines)
    for index, lines in enumerate(chunks(texts, chunk_lines)):
        if check_each:
            check_lengths(loaded.tokenizer, lines, loaded.max_positions, spec.truncate)
        yield Shard(index, lines)


def _local_shard_states(measurer: HeadsMeasurer, shards: Iterator[Shard], advance) -> Iterator[tuple[Shard, dict, list[str]]]:
    """Each shard measured in this process into its own accumulator: (shard, its state, its notes)."""
    for shard in shards:
        accumulator = measurer.accumulator()
        notes, _ = measurer.measure([entry.text for entry in shard.lines], accumulator, advance)
        yield shard, accumulator.state(), notes


def _record(progress: CorpusProgress, shard: Shard, notes: list[str], loaded, spec) -> None:
    """Add a measured shard to progress: its lines consumed, its texts listed (or only counted), its cuts and notes."""
    texts = [entry.text for entry in shard.lines]
    cuts = text_truncations(loaded.tokenizer, texts, loaded.max_positions) if spec.truncate else [None] * len(texts)
    if progress.first_text is None:
        progress.first_text = texts[0]
    progress.lines_consumed = shard.lines[-1].line
    progress.num_texts += len(texts)
    progress.num_truncated += sum(cut is not None for cut in cuts)
    if progress.texts is not None and progress.num_texts <= LISTED_TEXTS:
        progress.texts.extend(texts)
        progress.truncated.extend([cut.before, cut.after, cut.kept_final] if cut else None for cut in cuts)
    else:  # too many to list: stats.json gives their count and the file's SHA-256
        progress.texts = progress.truncated = None
    for note in notes:
        if note in progress.notes:
            continue
        if len(progress.notes) < KEPT_NOTES:
            progress.notes.append(note)
        else:
            progress.notes_left_out += 1  # distinct within the shard: "up to" this many

"""`stats --file --checkpoint PATH`: the accumulated sums and how far the corpus was read, written after each chunk.

One .npz file: the accumulator's state (analysis/accumulate.py) and a JSON "meta" entry with the
settings, the corpus file's identity (size and SHA-256 of the whole file), the lines consumed and
what stats.json lists of them. Written to a temporary name and moved into place (os.replace), so
a run killed at any moment leaves the previous checkpoint or the new one, never half of one.
`--resume` continues after the lines consumed, and refuses a checkpoint of other settings or of
another file with one line (exit code 2).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from itertools import takewhile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from attnviz.analysis.head_numbers import STATISTICS
from attnviz.errors import AttnvizError
from attnviz.output.corpus import CorpusIdentity, iter_texts
from attnviz.output.runs import REASONS, place_reason
from attnviz.spec import RunSpec

CHECKPOINT_FORMAT = "attnviz-stats-checkpoint"
CHECKPOINT_VERSION = 3  # 2: the state records js (whether the JS distances are measured); 3: the progress's "notes" (once "notices")
STATE_ARRAYS = ("causal", "js", "counts", "value_sums", "js_sums")  # the accumulator's state (analysis/accumulate.py)
LISTED_TEXTS = 1000  # stats.json lists the texts (and their cuts) of a corpus up to this many
AT_MOST_ONE = ("relative_entropy", "mean_max", "cls", "sep", "punctuation", "same", "previous", "next")  # shares, ratios
TOLERANCE = 1e-6  # float64 sums of values in [0, 1] stay within this of it


@dataclass
class CorpusProgress:
    """How far a corpus was read, and what stats.json lists of the texts read so far."""

    lines_consumed: int = 0  # every line up to this 1-based number is in the sums
    num_texts: int = 0
    texts: list[str] | None = field(default_factory=list)  # in input order, while at most LISTED_TEXTS; else None
    truncated: list | None = field(default_factory=list)  # each listed text's cut (truncation_json), or None
    num_truncated: int = 0
    notes: list[str] = field(default_factory=list)  # distinct, in order, at most KEPT_NOTES
    notes_left_out: int = 0  # notes beyond KEPT_NOTES, distinct within each shard (one in two shards counts twice)
    first_text: str | None = None


def checkpoint_settings(spec: RunSpec) -> dict:
    """The settings a checkpoint must share with the run that resumes it: all but the device (and attnviz's version)."""
    settings = spec.to_dict()
    for free in ("device", "version"):
        settings.pop(free, None)
    return settings


def check_checkpoint_path(path: Path, resume: bool) -> None:
    """Before any work: a folder to write into; without --resume, no checkpoint already there; with it, one there."""
    if not path.parent.is_dir():
        raise AttnvizError(f"--checkpoint {path}: no folder {path.parent} to write it in")
    if path.is_dir():
        raise AttnvizError(f"--checkpoint {path} is a folder: give a file name, e.g. {path / 'stats.ckpt.npz'}")
    if resume and not path.exists():
        raise AttnvizError(f"--resume: no checkpoint at {path}")
    if not resume and path.exists():
        raise AttnvizError(f"--checkpoint {path} already exists: add --resume to continue from it, or remove it")


def write_checkpoint(path: Path, state: dict, spec: RunSpec, corpus: CorpusIdentity, progress: CorpusProgress) -> None:
    meta = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "settings": checkpoint_settings(spec),
        "corpus": corpus.to_dict(),
        "progress": asdict(progress),
    }
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("wb") as stream:
            np.savez(stream, meta=np.array(json.dumps(meta, ensure_ascii=False)), **state)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except OSError as error:  # a full disk: one line, and the checkpoint before this one stays whole
        if error.errno not in REASONS:
            raise
        kept = ", and --resume continues from the one before" if path.exists() else ""
        raise AttnvizError(f"cannot write --checkpoint {path}: {place_reason(error)}{kept}") from None
    finally:
        temporary.unlink(missing_ok=True)


class StateLayout(NamedTuple):
    """What the run that resumes expects of a checkpoint's sums: value_sums (L, H, S), js_sums (L, H, H)."""

    num_layers: int
    num_heads: int
    causal: bool
    js: bool


def read_checkpoint(path: Path, spec: RunSpec, corpus: CorpusIdentity, layout: StateLayout) -> tuple[dict, CorpusProgress]:
    """The accumulator's state and the progress of a checkpoint made with spec's settings over this corpus.

    Anything else is refused in one line that names what is wrong: a file that is not a checkpoint,
    other settings, another file, and a damaged or edited one (a missing or extra entry, a shape,
    type or count that is not the run's, NaN, a sum out of its statistic's range, progress that is
    not what the corpus' lines say), so that a resumed run's numbers are the uninterrupted run's.
    """
    try:
        with np.load(path, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error):  # EOFError: an empty file
        raise AttnvizError(f"--resume: {path} is not an attnviz stats checkpoint") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
        raise AttnvizError(f"--resume: {path} is not an attnviz stats checkpoint (version {CHECKPOINT_VERSION})")
    try:
        _check_origin(path, meta, spec, corpus)
        progress = _progress(meta.get("progress"))
        _check_state(arrays, layout, progress.num_texts)
        _check_progress(progress, corpus)
    except Damaged as damage:
        raise AttnvizError(f"--resume: {path} is damaged: {damage}; remove it and start afresh without --resume") from None
    return arrays, progress


class Damaged(Exception):
    """What is wrong with a checkpoint, in words."""


def _check_origin(path: Path, meta: dict, spec: RunSpec, corpus: CorpusIdentity) -> None:
    """The settings and the file the checkpoint was made with are this run's (refused as such, not as damage)."""
    stored_settings, stored_corpus = meta.get("settings"), meta.get("corpus")
    if not isinstance(stored_settings, dict):
        raise Damaged("its settings are not a JSON object")
    if not isinstance(stored_corpus, dict) or not {"file", "bytes", "sha256"} <= set(stored_corpus):
        raise Damaged("its corpus entry lacks the file, bytes or sha256")
    settings = checkpoint_settings(spec)
    differ = [name for name in sorted(set(settings) | set(stored_settings)) if settings.get(name) != stored_settings.get(name)]
    if differ:
        name = differ[0]
        raise AttnvizError(
            f"--resume: {path} was made with other settings ({name}: {stored_settings.get(name)!r}, "
            f"not {settings.get(name)!r}): run with the same settings, or start afresh without --resume"
        )
    if (stored_corpus["bytes"], stored_corpus["sha256"]) != (corpus.size, corpus.sha256):
        raise AttnvizError(
            f"--resume: {path} was made from another file ({stored_corpus['file']}, {stored_corpus['bytes']} bytes, "
            f"SHA-256 {str(stored_corpus['sha256'])[:12]}…), not {corpus.path} as it is now"
        )


PROGRESS_TYPES = {
    "lines_consumed": int, "num_texts": int, "texts": (list, type(None)), "truncated": (list, type(None)),
    "num_truncated": int, "notes": list, "notes_left_out": int, "first_text": str,
}  # fmt: skip


def _progress(stored) -> CorpusProgress:
    """The progress entry as CorpusProgress: every field there, of its type, none negative."""
    if not isinstance(stored, dict):
        raise Damaged("it has no progress entry")
    missing, extra = sorted(set(PROGRESS_TYPES) - set(stored)), sorted(set(stored) - set(PROGRESS_TYPES))
    if missing or extra:
        raise Damaged(f"its progress {'lacks' if missing else 'has an unknown entry'} {(missing or extra)[0]}")
    for name, kind in PROGRESS_TYPES.items():
        value = stored[name]
        if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
            raise Damaged(f"its progress {name} is {value!r:.40}, not a {'count' if kind is int else 'value of its kind'}")
    if not all(isinstance(note, str) for note in stored["notes"]):
        raise Damaged("its progress notes are not all text")
    return CorpusProgress(**stored)


def _check_state(arrays: dict, layout: StateLayout, num_texts: int) -> None:
    """The accumulator's state: the arrays of state(), of this run's shapes, finite sums in range, counts = the texts read."""
    missing, extra = sorted(set(STATE_ARRAYS) - set(arrays)), sorted(set(arrays) - set(STATE_ARRAYS))
    if missing or extra:
        raise Damaged(f"it {'lacks the array' if missing else 'has an unknown array'} {(missing or extra)[0]}")
    for name in ("causal", "js"):
        flag, expected = arrays[name], getattr(layout, name)
        if flag.shape != () or flag.dtype != np.bool_ or bool(flag) != expected:
            raise Damaged(f"{name} is {flag!r:.40}, not this run's {expected}")
    counts = arrays["counts"]
    if counts.dtype.kind not in "iu" or counts.shape != (layout.num_layers,):
        raise Damaged(f"counts are {counts.dtype} of shape {counts.shape}, not int64 of shape ({layout.num_layers},): one per layer")
    if not num_texts:
        raise Damaged("its progress counts no text read, and a checkpoint is written once texts are measured")
    if (counts != num_texts).any():
        raise Damaged(f"counts are {counts.tolist()}, not the {num_texts} texts its progress says each layer has measured")
    num_heads, num_statistics = layout.num_heads, len(STATISTICS)
    shapes = {"value_sums": (layout.num_layers, num_heads, num_statistics), "js_sums": (layout.num_layers, num_heads, num_heads)}
    for name, shape in shapes.items():
        sums = arrays[name]
        if sums.dtype != np.float64 or sums.shape != shape:
            raise Damaged(f"{name} are {sums.dtype} of shape {sums.shape}, not float64 of shape {shape}")
        if not np.isfinite(sums).all():
            raise Damaged(f"{name} hold NaN or infinity")
    means = arrays["value_sums"] / num_texts
    top = np.array([1.0 if name in AT_MOST_ONE else np.inf for name in STATISTICS])
    out = np.argwhere((means < -TOLERANCE) | (means > top + TOLERANCE))
    if len(out):
        layer, head, column = out[0]
        mean = means[layer, head, column]
        raise Damaged(f"value_sums give layer {layer} head {head} a mean {STATISTICS[column]} of {mean:.4g}, out of its range")
    distances = arrays["js_sums"] / num_texts
    if (distances < -TOLERANCE).any() or (distances > 1 + TOLERANCE).any() or (not layout.js and distances.any()):
        raise Damaged("js_sums give Jensen-Shannon distances outside 0 to 1" if layout.js else "js_sums are not zeros without --js")


def _check_progress(progress: CorpusProgress, corpus: CorpusIdentity) -> None:
    """The lines consumed end at a text of the file, and the texts before are the texts counted and listed."""
    entries = list(takewhile(lambda entry: entry.line <= progress.lines_consumed, iter_texts(corpus.path)))
    if not entries or entries[-1].line != progress.lines_consumed:  # a shard ends at a text
        raise Damaged(f"its progress has read up to line {progress.lines_consumed}, which is not a line of text of the file")
    read = [entry.text for entry in entries]
    if progress.num_texts != len(read):
        lines = f"lines 1 to {progress.lines_consumed}"
        raise Damaged(f"its progress counts {progress.num_texts} texts, but {lines} of the file hold {len(read)}")
    if progress.first_text != read[0]:
        raise Damaged(f"its first text is not the file's first text, {read[0]!r:.40}")
    if progress.num_truncated > progress.num_texts:
        raise Damaged(f"its progress counts {progress.num_truncated} texts cut, more than the {progress.num_texts} read")
    if progress.texts is None:  # too many to list, and so their cuts too
        if progress.num_texts <= LISTED_TEXTS:
            raise Damaged(f"its progress lists no texts, but {progress.num_texts} are at most the {LISTED_TEXTS} stats.json lists")
        if progress.truncated is not None:
            raise Damaged("its progress lists the texts' cuts (truncated) but not the texts")
        return
    if progress.texts != read:
        raise Damaged("its progress lists texts that are not the file's")
    cuts = progress.truncated
    if cuts is None or len(cuts) != len(read) or any(not (cut is None or _is_cut(cut)) for cut in cuts):
        raise Damaged("its progress does not give each listed text's cut (truncated)")
    if sum(cut is not None for cut in cuts) != progress.num_truncated:
        raise Damaged(f"its progress counts {progress.num_truncated} texts cut, but lists {sum(cut is not None for cut in cuts)}")


def _is_cut(cut) -> bool:
    """A listed text's cut as stats.json gives it: [tokens before, tokens after, the special token kept at the end or null]."""
    return (
        isinstance(cut, list) and len(cut) == 3 and all(isinstance(count, int) and not isinstance(count, bool) for count in cut[:2])
        and cut[0] > cut[1] > 0 and (cut[2] is None or isinstance(cut[2], str))
    )  # fmt: skip

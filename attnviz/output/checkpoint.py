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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from attnviz.errors import AttnvizError
from attnviz.output.corpus import CorpusIdentity
from attnviz.output.runs import REASONS, place_reason
from attnviz.spec import RunSpec

CHECKPOINT_FORMAT = "attnviz-stats-checkpoint"
CHECKPOINT_VERSION = 2  # 2: the state records js (whether the JS distances are measured)


@dataclass
class CorpusProgress:
    """How far a corpus was read, and what stats.json lists of the texts read so far."""

    lines_consumed: int = 0  # every line up to this 1-based number is in the sums
    num_texts: int = 0
    texts: list[str] | None = field(default_factory=list)  # in input order, while at most LISTED_TEXTS; else None
    truncated: list | None = field(default_factory=list)  # each listed text's cut (truncation_json), or None
    num_truncated: int = 0
    notices: list[str] = field(default_factory=list)  # distinct, in order, at most KEPT_NOTICES
    notices_left_out: int = 0  # notices beyond KEPT_NOTICES, distinct within each shard (one in two shards counts twice)
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


def read_checkpoint(path: Path, spec: RunSpec, corpus: CorpusIdentity) -> tuple[dict, CorpusProgress]:
    """The accumulator's state and the progress of a checkpoint made with spec's settings over this corpus."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        raise AttnvizError(f"--resume: {path} is not an attnviz stats checkpoint") from None
    if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
        raise AttnvizError(f"--resume: {path} is not an attnviz stats checkpoint (version {CHECKPOINT_VERSION})")
    settings = checkpoint_settings(spec)
    differ = [name for name in sorted(set(settings) | set(meta["settings"])) if settings.get(name) != meta["settings"].get(name)]
    if differ:
        name = differ[0]
        raise AttnvizError(
            f"--resume: {path} was made with other settings ({name}: {meta['settings'].get(name)!r}, "
            f"not {settings.get(name)!r}): run with the same settings, or start afresh without --resume"
        )
    stored_corpus = meta["corpus"]
    if (stored_corpus["bytes"], stored_corpus["sha256"]) != (corpus.size, corpus.sha256):
        raise AttnvizError(
            f"--resume: {path} was made from another file ({stored_corpus['file']}, {stored_corpus['bytes']} bytes, "
            f"SHA-256 {stored_corpus['sha256'][:12]}…), not {corpus.path} as it is now"
        )
    return arrays, CorpusProgress(**meta["progress"])

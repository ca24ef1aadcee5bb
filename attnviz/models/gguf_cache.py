"""A GGUF file's tokenizer, read once into attnviz's cache: its files (tokenizer.json, ...) in a small folder.

A GGUF file holds its tokenizer as metadata (the vocabulary, the merges, the special tokens); transformers
builds a tokenizer from it in a few seconds (GGUFWeights.tokenizer), and reads the saved files in a fraction of
one. So the first run of a GGUF file saves the tokenizer's files (3.5 MB for SmolLM2), and the weights are read
from the GGUF file itself every time (gguf_weights.py): no float32 copy is written.

    $ATTNVIZ_CACHE, else $XDG_CACHE_HOME/attnviz, else ~/.cache/attnviz
        models/<file's stem>-<key>/     key: a short hash of the GGUF file's path, size and mtime,
                                         so a new version of the file is read again

The folder appears whole or not at all: the tokenizer is written into a hidden `.partial` sibling, which is
renamed into place. Two processes writing at once both finish; the first rename wins and the other uses the
winner's folder. A `.partial` folder that a killed process left behind is removed by the next one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from attnviz.errors import AttnvizError, first_line

CACHE_VERSION = 2  # part of the cache key: raise it when the folder's layout changes (1: a whole float32 conversion)
TOKENIZER_SECONDS = 3  # about, for SmolLM2's 49,152 tokens; said before the first read


def cache_root() -> Path:
    """attnviz's cache: $ATTNVIZ_CACHE, else $XDG_CACHE_HOME/attnviz, else ~/.cache/attnviz."""
    if os.environ.get("ATTNVIZ_CACHE"):
        return Path(os.environ["ATTNVIZ_CACHE"]).expanduser().absolute()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser().absolute() / "attnviz"
    return Path.home() / ".cache" / "attnviz"


def cached_folder(gguf: Path) -> Path:
    """Where the tokenizer of this GGUF file lives (whether or not it exists yet)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{CACHE_VERSION}:{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return cache_root() / "models" / f"{gguf.stem}-{key[:12]}"


def tokenizer_folder(gguf: Path, read_tokenizer: Callable[[], object], notify: Callable[[str], None] | None = None) -> Path:
    """The cached folder of the GGUF file's tokenizer, saving read_tokenizer()'s (a transformers tokenizer) first if
    this is the first time.

    notify, if given, receives one line before the tokenizer is read (it takes a few seconds); a call that finds
    the folder calls nothing and returns at once.
    """
    folder = cached_folder(gguf)
    if folder.is_dir():
        return folder
    partial = _partial_folder(folder)  # first: an unwritable cache is an error before the note
    try:
        if notify is not None:
            notify(f"reading the tokenizer of {gguf.name} once (about {TOKENIZER_SECONDS} s); cached in {folder}")
        read_tokenizer().save_pretrained(partial)
        _rename_into_place(partial, folder)
    except AttnvizError:
        raise
    except Exception as error:
        raise AttnvizError(f"cannot cache the tokenizer of {gguf}: {first_line(error)}") from error
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already if the rename succeeded
    return folder


def note_on_stderr(note: str) -> None:
    """tokenizer_folder's notify for load_model: the line must come before the wait, so it cannot
    wait for LoadedModel.note, which the command line prints once the model is loaded."""
    print(f"note: {note}", file=sys.stderr, flush=True)


# ---- whole or absent -----------------------------------------------------------------------------


def _partial_folder(folder: Path) -> Path:
    """A new hidden sibling of `folder` to write into, named after this process (see _remove_abandoned_partials)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_partials(folder.parent)
        return Path(tempfile.mkdtemp(prefix=f".{folder.name}.{os.getpid()}-", suffix=".partial", dir=folder.parent))
    except OSError as error:
        raise AttnvizError(
            f"cannot write attnviz's cache {cache_root()} ({first_line(error)}): set ATTNVIZ_CACHE to a writable folder"
        ) from error


def _rename_into_place(partial: Path, folder: Path) -> None:
    """Rename a whole folder into place, atomically; if another process's got there first, keep that one."""
    try:
        os.rename(partial, folder)
    except OSError:
        if not folder.is_dir():
            raise


def _remove_abandoned_partials(models: Path) -> None:
    """Remove the `.partial` folders of writers whose process is gone (killed, or ended by a signal)."""
    if os.name != "posix":  # os.kill(pid, 0) would end a process on Windows; leave them there
        return
    for partial in models.glob(".*.partial"):
        pid = partial.name.rsplit(".", 2)[-2].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True

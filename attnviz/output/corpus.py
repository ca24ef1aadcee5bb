"""A --file of texts, read line by line: `stats --file`'s corpus (memory bounded by a chunk of lines,
not by the file), and read_texts, every text of a file at once (heads, trace and report --file).

A file is read twice before the heavy work: scan_corpus checks it is UTF-8 with a text in it and
takes its identity (size, SHA-256: what a checkpoint is matched against), then the caller checks
every text's token count chunk by chunk (batch.check_lengths), so that bad input still stops
with exit code 2 before any forward pass. Standard input can be read once only: its chunks are
checked as they come, and a bad line stops the run mid-way, before any file is written.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from attnviz.errors import AttnvizError

STDIN = "-"
CHUNK_LINES = 1024  # texts measured (and checkpointed) at a time: sorted by length within a chunk for batching
BOM = b"\xef\xbb\xbf"


@dataclass
class LineText:
    """One non-blank line of the input: its 1-based line number and its text."""

    line: int
    text: str


@dataclass(frozen=True)
class CorpusIdentity:
    """What a checkpoint knows its file by: the path as given, its size and SHA-256, and its texts (non-blank lines)."""

    path: str
    size: int
    sha256: str
    num_texts: int

    def to_dict(self) -> dict:
        return {"file": self.path, "bytes": self.size, "sha256": self.sha256, "texts": self.num_texts}


def where(path: str) -> str:
    return "standard input" if path == STDIN else path


@contextmanager
def open_binary(path: str) -> Iterator[BinaryIO | Iterator[bytes]]:
    """The file (or standard input for "-") as bytes, or a one-line error."""
    if path == STDIN:
        if sys.stdin is None:  # started with stdin closed (<&-)
            raise AttnvizError("--file -: standard input is closed: pipe the texts in (cat texts.txt | attnviz ...), or give --file PATH")
        # Bytes, so that the UTF-8 check is attnviz's (and names the line); a text stream without them (a test's StringIO) as bytes
        yield sys.stdin.buffer if hasattr(sys.stdin, "buffer") else (line.encode("utf-8", "surrogateescape") for line in sys.stdin)
        return
    try:
        stream = open(path, "rb")
    except FileNotFoundError:
        raise AttnvizError(f"--file {path}: no such file") from None
    except IsADirectoryError:
        raise AttnvizError(f"--file {path} is a folder: give a text file with one text per line") from None
    except OSError as error:
        raise AttnvizError(f"cannot read --file {path}: {error.strerror or error}") from None
    with stream:
        yield stream


def iter_texts(path: str, hasher=None) -> Iterator[LineText]:
    """The non-blank lines of a UTF-8 file (or standard input), stripped, one at a time, with their line numbers.

    hasher, when given, is fed every byte read. A line that is not UTF-8 stops it with its number.
    """
    number = 0
    with open_binary(path) as stream:
        for index, raw in enumerate(stream):
            if hasher is not None:
                hasher.update(raw)
            try:
                line = (raw.removeprefix(BOM) if index == 0 else raw).decode("utf-8")
            except UnicodeDecodeError as error:
                raise AttnvizError(
                    f"cannot read {where(path)}: line {number + 1} is not UTF-8 text (byte {error.start + 1} of the line)"
                ) from None
            # str.splitlines, as over the whole text: \r, \x0c, U+2028 ... end a line too
            for text in line.splitlines() or [""]:
                number += 1
                if text.strip():
                    yield LineText(number, text.strip())


def read_texts(path: str) -> list[LineText]:
    """Every non-blank line of a UTF-8 file, or of standard input for "-", stripped (iter_texts' texts)."""
    texts = list(iter_texts(path))
    if not texts:
        raise AttnvizError(f"{where(path)} has no text: every line is blank")
    return texts


def scan_corpus(path: str) -> CorpusIdentity | None:
    """One pass over a file before any work: every line UTF-8, some text, and its identity. None for standard input."""
    if path == STDIN:
        return None
    hasher = hashlib.sha256()
    count = sum(1 for _ in iter_texts(path, hasher))
    if not count:
        raise AttnvizError(f"{path} has no text: every line is blank")
    return CorpusIdentity(path, Path(path).stat().st_size, hasher.hexdigest(), count)


def chunks(items: Iterable, size: int = CHUNK_LINES) -> Iterator[list]:
    """Lists of `size` items (the last one shorter) from any iterable, read as they are needed."""
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk

"""Standard output and error for a command line: results go on when the reader stops reading
(`attnviz heads ... | head -1`) or the disk under `> file` fills up, and a character the
terminal's encoding lacks prints escaped."""

from __future__ import annotations

import os
import sys

from attnviz.output.runs import REASONS, place_reason, written_folder


class PipeSafeStream:
    """A text stream whose writes end quietly once its reader has closed the pipe or its disk is full.

    The run goes on and writes its files; `broken` tells that output was lost, `lost` the
    error of a full disk (or another failure of the place it goes: runs.REASONS), which
    lost_output_code turns into exit code 2. Everything but write and flush is the wrapped
    stream's (encoding, isatty, fileno: what Rich asks).
    """

    def __init__(self, stream):
        self._stream = stream
        self.broken = False
        self.lost: OSError | None = None
        if hasattr(stream, "reconfigure"):  # PYTHONIOENCODING=ascii, a C locale: "我" prints as \u6211
            stream.reconfigure(errors="backslashreplace")

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except OSError as error:
                self._stop(error)
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except OSError as error:
                self._stop(error)

    def _stop(self, error: OSError) -> None:
        if not isinstance(error, BrokenPipeError) and error.errno not in REASONS:
            raise error
        if not isinstance(error, BrokenPipeError):
            self.lost = error
        # Python flushes the stream once more at exit: point its descriptor at /dev/null so that
        # the bytes still buffered go there instead of failing again.
        self.broken = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def lost_output_code(code: int, stream) -> int:
    """The command's exit code, once standard output (stream) has had all it gets: a success whose
    output a full disk cut short is exit 2, with one line on standard error. The run's files are
    written all the same (the run went on), and the line names their folder.
    """
    if stream is None:  # started with standard output closed (>&-)
        return code
    stream.flush()
    lost = getattr(stream, "lost", None)
    if lost is None or code != 0:
        return code
    folder = written_folder()
    written = f" (the files were written in full: {folder})" if folder is not None else ""
    sys.stderr.write(f"error: cannot write the standard output: {place_reason(lost)}{written}\n")
    sys.stderr.flush()
    return 2

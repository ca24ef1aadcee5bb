"""Standard output and error for a command line: results go on when the reader stops reading
(`attnviz heads ... | head -1`), and a character the terminal's encoding lacks prints escaped."""

from __future__ import annotations

import os


class PipeSafeStream:
    """A text stream whose writes end quietly once its reader has closed the pipe.

    The run goes on and writes its files; `broken` tells that output was lost. Everything but
    write and flush is the wrapped stream's (encoding, isatty, fileno: what Rich asks).
    """

    def __init__(self, stream):
        self._stream = stream
        self.broken = False
        if hasattr(stream, "reconfigure"):  # PYTHONIOENCODING=ascii, a C locale: "我" prints as \u6211
            stream.reconfigure(errors="backslashreplace")

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._close_quietly()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._close_quietly()

    def _close_quietly(self) -> None:
        # Python flushes the stream once more at exit: point its descriptor at /dev/null so that
        # the bytes still buffered go there instead of failing again.
        self.broken = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

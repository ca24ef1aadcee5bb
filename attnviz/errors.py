"""The error types a user sees: AttnvizError's message is printed as a single line and the command
exits 2; Interrupted ends a run on a signal, exit code 128 + the signal's number; AttnvizWarning is
a note of a result (a fallback model, [UNK] tokens, a cut text) raised by the Python API. option()
spells an option in a message as the face in use does: --effect on the command line, effect= in the API."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

_COMMAND_LINE = ContextVar("attnviz_command_line", default=False)  # True while the command line runs a command


class AttnvizError(ValueError):
    """Bad input or an unusable environment, explained in one line."""


class AttnvizWarning(UserWarning):
    """A note of a result from the Python API, once per call: what the command line prints as "note: ..."
    (a fallback model, a text mostly [UNK], a cut text). The command line prints the notes and ignores these."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP that came while attnviz held it back (checking the output
    place, moving the files into place), raised once that is done. On the command line a signal at
    any other moment ends the process at once (attnviz.output.runs.handle_signals); from Python,
    Ctrl-C is Python's own KeyboardInterrupt then. A KeyboardInterrupt, so that `except
    KeyboardInterrupt` around a `.save()` catches a Ctrl-C whenever it comes.

    written: the run folder, when the signal came while its files were being moved into place
    (it waited for them to be whole); else None, and nothing was written.
    """

    def __init__(self, signal_number: int, written: Path | None = None):
        super().__init__(signal_number)
        self.signal_number = signal_number
        self.written = written

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number  # as a shell reports a process ended by the signal


def first_line(error: BaseException) -> str:
    """The first line of an error's message (or its type's name), for a one-line message of our own."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


@contextmanager
def command_line_spelling() -> Iterator[None]:
    """Within it, option() spells options as flags (the command line's runner, cli/main.py, sets it)."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def option(name: str, value: Any = None) -> str:
    """An option (RunOptions' field or a function's keyword) as the face in use spells it, in a message.

    The command line: "--effect", "--stack cross", "--causal" (value True). The API: "effect=", "stack='cross'",
    "causal=True".
    """
    if _COMMAND_LINE.get():
        flag = "--" + name.replace("_", "-")
        return flag if value is None or value is True else f"{flag} {value}"
    return f"{name}=" if value is None else f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"


def options_named(*names: str) -> str:
    """Options named as things (a list of them, "the --kv text"), as the face in use spells them: "--kv, --heads and
    --weights" on the command line, "kv, heads and weights" in the API."""
    spelled = [option(name) if _COMMAND_LINE.get() else name for name in names]
    return ", ".join(spelled[:-1]) + " and " + spelled[-1] if len(spelled) > 1 else spelled[0]

"""The Python API's notes as Python warnings: each note a call produces (a fallback model, a text mostly [UNK],
a cut text, what a report leaves out) is an AttnvizWarning that points at the caller's line, so that a notebook
shows it where it was asked for. The command line prints the notes itself and ignores these warnings.

The rule, so that no note is said twice: the model's own note (why the bundled model loaded in place of the
one asked for) is warned by attnviz.load, once, when it loads the model; a call given a handle loaded before,
or reusing load's cached one, does not warn it again (its titles and result.notes still say it). The notes
of the texts (their [UNK] share, a cut) are warned by every call that runs them, each distinct note once per call.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Iterable

from attnviz.errors import AttnvizWarning

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # attnviz/, whose frames a warning skips


def warn_notes(notes: Iterable[str | None], model_note: str | None = None) -> None:
    """Each distinct note as an AttnvizWarning at the first line outside attnviz; model_note (the handle's own, which
    attnviz.load warned as it loaded the model) and empty notes left out."""
    level = caller_stacklevel()
    for note in dict.fromkeys(notes):
        if note and note != model_note:
            warnings.warn(note, AttnvizWarning, stacklevel=level)


def caller_stacklevel() -> int:
    """warnings.warn's stacklevel, from warn_notes, of the first frame outside the attnviz package (the user's line)."""
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # warn_notes: stacklevel 1
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE):
        frame, level = frame.f_back, level + 1
    return level

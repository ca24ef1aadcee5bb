"""Plain text for messages and titles: one way to shorten a text, for the notes and the figure titles alike."""

from __future__ import annotations


def shorten(text: str, max_chars: int) -> str:
    """text on one line (runs of white space as one space), cut to max_chars with "…" at the end."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= max_chars else one_line[: max_chars - 1].rstrip() + "…"

"""Checks of one argument of the API's functions: each returns it (an int as a plain int) or raises a one-line AttnvizError.

The message names the argument, the type expected and what was given ("heads must be an int or
None, not float 12.0"): a wrong type is refused before any work, not deep inside torch. A bool is
not an int here, nor a float; only True and False are bools.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral
from typing import Any

from attnviz.errors import AttnvizError
from attnviz.text import shorten

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")  # --dtype: auto is the checkpoint's own on a GPU, float32 on the CPU


def refuse(name: str, expected: str, value: Any) -> None:
    """'heads must be an int or None, not float 12.0'."""
    raise AttnvizError(f"{name} must be {expected}, not {type(value).__name__} {shorten(repr(value), 60)}")


def must_be_int(name: str, value: Any, none: bool = False) -> int | None:
    """A whole number (int, or NumPy's, returned as an int); not a bool, not a float."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        refuse(name, "an int or None" if none else "an int", value)
    return int(value)


def must_be_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        refuse(name, "True or False", value)
    return value


def must_be_str(name: str, value: Any, none: bool = False) -> str | None:
    if value is None and none:
        return None
    if not isinstance(value, str):
        refuse(name, "a str or None" if none else "a str", value)
    return value


def must_be_one_of(name: str, value: Any, choices: tuple[str, ...], none: bool = False) -> str | None:
    """One of choices, as a str ("unknown stack 'x': choose encoder, decoder or cross")."""
    if must_be_str(name, value, none) is not None and value not in choices:
        raise AttnvizError(f"unknown {name} {value!r}: choose {', '.join(choices[:-1])} or {choices[-1]}")
    return value


def must_be_device(value: Any) -> str:
    return must_be_one_of("device", value, DEVICES)


def must_be_dtype(value: Any) -> str:
    return must_be_one_of("dtype", value, DTYPES)


def must_be_callable(name: str, value: Any, none: bool = False) -> Callable | None:
    if value is None and none:
        return None
    if not callable(value):
        refuse(name, "a function or None" if none else "a function", value)
    return value


def must_be_progress(progress: Any):
    """The API's progress= argument as a run_data.Progress: None (nothing told), or a function called progress(n) after
    each n units done (layers, heads, steps, tests); one that also has .stage(what, total) is told as each stage
    begins, with its count of units (the command line's progress bar is such a one)."""
    from attnviz.run_data import Progress

    if must_be_callable("progress", progress, none=True) is None:
        return Progress()
    stage = getattr(progress, "stage", None)
    return Progress(progress, stage) if callable(stage) else Progress(progress)


def must_be_str_or_list(name: str, value: Any, of: type, none: bool = False) -> Any:
    """A comma list as the command line takes it ("1,4,12"), or a list or tuple of values of type of ([1, 4, 12])."""
    if value is None and none:
        return None
    if isinstance(value, str):
        return value
    items_ok = isinstance(value, (list, tuple)) and all(
        isinstance(item, of) and not (of is int and isinstance(item, bool)) for item in value
    )
    if not items_ok:
        refuse(name, f"a comma list (str) or a list of {of.__name__}{' or None' if none else ''}", value)
    return value

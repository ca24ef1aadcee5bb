"""Option values converted without pydantic, where typer would build a pydantic validator per option for the same result.

typer 0.29 converts each option's value through a pydantic TypeAdapter built on first use:
importing pydantic and building the adapters adds 0.1 to 0.15 s to every command's start, more
than attnviz's own imports. attnviz's options take strings, plain integers, an Enum's values and
paths, which need no validator. install() has typer convert those directly, to what its adapters
give (a str as it is; the int of a plain decimal; the Enum member whose value it is; a path
through typer's own checks), and hands every other value to typer's own conversion: a bad value
too, so that its error message stays typer's. Typers without this conversion are left alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

_DECIMAL = re.compile(r"-?[0-9]{1,18}")  # what int() and pydantic read alike, with no whitespace, sign or underscores
_TYPERS = object()  # _direct's answer for a value left to typer


def install() -> None:
    """From now on, typer converts option values of the simple kinds directly (see the module's docstring)."""
    try:
        from typer import core
        from typer._coercion import RuntimeParam
        from typer._param_types import coerce_cli_path
    except ImportError:  # an older typer: click's types convert, no pydantic
        return
    typers = getattr(core, "build_runtime_param", None)
    if typers is None or getattr(typers, "direct", False):
        return

    @dataclass(frozen=True)
    class DirectRuntimeParam(RuntimeParam):
        descriptor: Any = None  # typer's TypeDescriptor, for its own conversion of what is not converted here

        def _coerce_value(self, value: Any, param, ctx) -> Any:
            converted = _direct(self.annotation, self.parameter_info, value, ctx)
            if converted is _PATH:
                return coerce_cli_path(Path(value), self.parameter_info, path_type=Path, param=param, ctx=ctx)
            if converted is not _TYPERS:
                return converted
            return typers(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

    def build_runtime_param(descriptor):
        if descriptor.file_annotation is not None:  # opens files: typer's own
            return typers(descriptor)
        return DirectRuntimeParam(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation, descriptor=descriptor)

    build_runtime_param.direct = True
    core.build_runtime_param = build_runtime_param


_PATH = object()  # _direct's answer for a path: typer's checks of it, without pydantic's Path(value)


def _direct(annotation: Any, info, value: Any, ctx) -> Any:
    """value converted as typer's adapter for annotation would convert it; _TYPERS when it is not that simple."""
    if info.parser is not None:
        return _TYPERS
    if annotation is str:
        return value if isinstance(value, str) else _TYPERS
    if annotation is int:
        if isinstance(value, str) and _DECIMAL.fullmatch(value):
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or info.clamp:
            return _TYPERS
        outside = (info.min is not None and value < info.min) or (info.max is not None and value > info.max)
        return _TYPERS if outside else value  # outside its range: typer's message
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        if isinstance(value, annotation):
            return value
        if isinstance(value, str) and getattr(ctx, "token_normalize_func", None) is None:
            return next((member for member in annotation if str(member.value) == value), _TYPERS)
        return _TYPERS
    if annotation is Path and info.path_type is None and not info.allow_dash and isinstance(value, (str, Path)):
        return _PATH
    return _TYPERS

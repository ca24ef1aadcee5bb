"""Option values converted without pydantic (cli/coercion.py) are what typer's own conversion gives, and bad ones
get typer's own errors; a command's options are parsed without importing pydantic."""

from __future__ import annotations

import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
import typer

from attnviz.cli.main import app

typer_core = pytest.importorskip("typer.core")
if not hasattr(typer_core, "build_runtime_param"):
    pytest.skip("this typer converts through click's types, without pydantic", allow_module_level=True)

from typer._coercion import build_runtime_param as typers_own  # noqa: E402  (after the skip)


def samples(annotation) -> list:
    """Values a user may give an option of this type, valid and not."""
    if annotation is str:
        return ["x", "我想吃酸菜鱼", "", " spaced ", "-"]
    if annotation is int:
        return ["0", "7", "-3", "007", "+5", " 4", "1_000", "x", "99999999999999999999", 3]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [*(str(member.value) for member in annotation), *annotation, "no-such-choice", "CPU"]
    if annotation is Path:
        return ["out", "a/b", Path("c"), "~/x", "-"]
    return []


def parameters():
    command = typer.main.get_command(app)
    for name, sub in command.commands.items():
        for param in sub.params:
            descriptor = getattr(param, "type_descriptor", None)
            if descriptor is not None:
                yield name, param, descriptor


def converted(runtime, value, param, ctx):
    try:
        return ("value", runtime.coerce(value, param=param, ctx=ctx))
    except Exception as error:  # noqa: BLE001  the error is part of what must be the same
        return ("error", type(error).__name__, str(error))


def test_every_option_converts_as_typer_does():
    from typer import core

    checked = 0
    for name, param, descriptor in parameters():
        ctx = typer.main.get_command(app).commands[name].make_context(name, [], resilient_parsing=True)
        for value in samples(descriptor.annotation):
            ours = converted(core.build_runtime_param(descriptor), value, param, ctx)
            theirs = converted(typers_own(descriptor), value, param, ctx)
            assert ours == theirs, (name, param.name, value)
            assert ours[0] == "error" or type(ours[1]) is type(theirs[1])
            checked += 1
    assert checked > 200


def test_a_command_is_parsed_without_pydantic(tmp_path):
    script = f"""
import sys
import typer
from attnviz.cli.main import app
args = ["a text", "--layer", "1", "--seed", "3", "--weights", "random", "--device", "cpu", "--format", "svg", "--out", {str(tmp_path)!r}]
context = typer.main.get_command(app).commands["heads"].make_context("heads", args)  # parses and converts every option
print(context.params["layer"], context.params["out"], context.params["weights"].value)
print("pydantic" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    converted, imported = result.stdout.splitlines()
    assert converted == f"1 {tmp_path} random", result.stderr
    assert imported == "False"

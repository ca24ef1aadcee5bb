"""The `attnviz` program: the commands in --help's order, `models`, and running them with one-line errors and exit codes."""

from __future__ import annotations

import gc
import os
import re
import signal
import sys
import warnings

import typer

from attnviz.cli.options import app, console, errors
from attnviz.errors import AttnvizError, AttnvizWarning, Interrupted, command_line_spelling

# Each module registers its commands on app when imported: this order is --help's.
from attnviz.cli import heads  # noqa: E402, F401  isort: skip
from attnviz.cli import report  # noqa: E402, F401  isort: skip
from attnviz.cli import stats  # noqa: E402, F401  isort: skip
from attnviz.cli import layers  # noqa: E402, F401  isort: skip
from attnviz.cli import compare  # noqa: E402, F401  isort: skip
from attnviz.cli import position  # noqa: E402, F401  isort: skip
from attnviz.cli import diff  # noqa: E402, F401  isort: skip
from attnviz.cli import roles  # noqa: E402, F401  isort: skip
from attnviz.cli import compose  # noqa: E402, F401  isort: skip
from attnviz.cli import generate  # noqa: E402, F401  isort: skip
from attnviz.cli import patch  # noqa: E402, F401  isort: skip
from attnviz.cli import trace  # noqa: E402, F401  isort: skip
from attnviz.cli import why  # noqa: E402, F401  isort: skip
from attnviz.cli import serve  # noqa: E402, F401  isort: skip
from attnviz.cli import models  # noqa: E402, F401  isort: skip

INTERRUPTED = 130  # the shell's exit code for Ctrl-C (128 + SIGINT)


def run(args: list[str] | None = None) -> int:
    """Run the command line and return its exit code; errors become one line on stderr."""
    from attnviz.api.models import handles_of_its_own
    from attnviz.output.runs import forget_written_folders, last_interruption
    from attnviz.run_data import temporary_maps

    forget_written_folders()
    console.quiet = False  # --quiet is one command's (cli/options.py): a run in the same process starts loud
    args = sys.argv[1:] if args is None else list(args)
    try:
        _refuse_empty_out(args)
        # A bare `attnviz` prints --help, as a usage error would not: nothing was asked that failed.
        # the commands print the API's notes themselves, as "note: ..."; a long text's map is a working file
        # Messages name options as flags; the run loads its models as a process of its own would (a notebook's kept).
        with warnings.catch_warnings(), temporary_maps(), command_line_spelling(), handles_of_its_own():
            warnings.simplefilter("ignore", AttnvizWarning)
            result = app(args=args or ["--help"], prog_name="attnviz", standalone_mode=False)
    except typer.TyperException as error:  # click's exceptions, which typer vendors (a bad option: exit code 2)
        context = getattr(error, "ctx", None)  # a usage error's
        command = context.command_path if context else "attnviz"
        errors.print(f"error: {usage_message(error)} (see {command} --help)", soft_wrap=True)
        return error.exit_code
    except AttnvizError as error:
        errors.print(f"error: {error}", soft_wrap=True)
        return 2
    except Interrupted as interrupted:
        return _interrupted(interrupted)
    except (KeyboardInterrupt, typer.Abort):  # Python's own Ctrl-C, where attnviz's handlers are not set
        return _interrupted(Interrupted(signal.SIGINT))
    except Exception as error:  # a bug: still one line, the traceback on request
        if os.environ.get("ATTNVIZ_DEBUG"):
            raise
        errors.print(
            f"error: unexpected {type(error).__name__}: {error} (set ATTNVIZ_DEBUG=1 for the traceback)", soft_wrap=True
        )
        return 1
    if result == INTERRUPTED:  # typer turns a KeyboardInterrupt (an Interrupted too) into this exit code; run folders clean up on it
        return _interrupted(last_interruption() or Interrupted(signal.SIGINT))
    return result if isinstance(result, int) else 0


CHOICE_MESSAGE = re.compile(r"(?P<given>.+?) is not one of (?P<choices>.+?)\.?$")


def usage_message(error: typer.TyperException) -> str:
    """click's message in one line; a bad choice as "--layout: 'view_permute' is not one of view-permute, merged-batch, ...".

    typer 0.2x checks choices with pydantic, whose message starts "Value error, " and quotes every choice.
    """
    message = error.format_message()
    if not isinstance(error, typer.BadParameter) or error.param is None:
        return message
    choice = CHOICE_MESSAGE.match(error.message.removeprefix("Value error, "))
    if choice is None:
        return message.replace("Value error, ", "")
    flag = max(getattr(error.param, "opts", None) or [error.param.name], key=len)
    choices = ", ".join(each.strip().strip("'\"") for each in choice["choices"].split(","))
    return f"{flag}: {choice['given']} is not one of {choices}"


def _refuse_empty_out(args: list[str]) -> None:
    """--out "" would mean the current folder (Path("") is "."): refuse it, before typer turns it into "."."""
    options = args[: args.index("--")] if "--" in args else args
    for option, value in zip(options, [*options[1:], None]):
        if option == "--out=" or option in ("--out", "-o") and value == "":
            raise AttnvizError("--out is empty: give a folder (--out . for the current one)")


def _interrupted(interrupted: Interrupted) -> int:
    from attnviz.output.runs import interrupted_message

    errors.print(interrupted_message(interrupted.written), soft_wrap=True)
    return interrupted.exit_code


def main() -> None:
    """The `attnviz` command: signals end a run cleanly, a closed pipe loses no files."""
    from attnviz.output.runs import DEFERRED_SIGNALS, handle_signals
    from attnviz.output.streams import PipeSafeStream, lost_output_code

    handle_signals()
    # What is imported now (typer, rich, pydantic) lives until the process ends: frozen, the garbage collector's full
    # passes skip it, as they skip what the command computes once run_command freezes that too (their passes walked
    # every object there was, torch's million included: 0.17 s of `heads`' 2.4 s of CPU, bench/RESULTS.md).
    gc.freeze()
    # Its full passes 100 times rarer (every 1,000 passes of the middle generation, not 10): the objects a command
    # makes that live past two passes (torch's modules, the model, its figures) live until it ends, and each full pass
    # walked them all (0.2 s of `heads`' CPU, three passes during torch's import); young cycles go as they did.
    gc.set_threshold(*gc.get_threshold()[:2], 1000)
    if sys.stdout is not None:  # None: started with stdout closed (>&-); Rich then prints nowhere
        sys.stdout = PipeSafeStream(sys.stdout)
    if sys.stderr is not None:
        sys.stderr = PipeSafeStream(sys.stderr)
    code = lost_output_code(run(), sys.stdout)
    # The run is over and what it says is said. Python's shutdown puts the default action back for
    # signals with Python handlers, so a late SIGTERM would kill the process and hide the exit code
    # of a whole run. Ignored signals stay ignored (a mask would not do: it is per thread).
    for number in DEFERRED_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    # Python's exit still runs (the atexit functions, threads waited for, streams flushed), but its last garbage
    # collections skip the objects there are now, most of the teardown's time once torch is imported.
    gc.freeze()
    sys.exit(code)


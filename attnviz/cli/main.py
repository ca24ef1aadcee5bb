"""The `attnviz` program: the commands in --help's order, `models`, and running them with one-line errors and exit codes."""

from __future__ import annotations

import os
import signal
import sys

import typer

try:  # typer 0.2x vendors click; older typers use click itself
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError

from attnviz.cli.options import app, console, errors
from attnviz.errors import AttnvizError, Interrupted

# Each module registers its commands on app when imported: this order is --help's.
from attnviz.cli import heads  # noqa: E402, F401  isort: skip
from attnviz.cli import report  # noqa: E402, F401  isort: skip
from attnviz.cli import stats  # noqa: E402, F401  isort: skip
from attnviz.cli import layers  # noqa: E402, F401  isort: skip
from attnviz.cli import compare  # noqa: E402, F401  isort: skip
from attnviz.cli import position  # noqa: E402, F401  isort: skip
from attnviz.cli import trace  # noqa: E402, F401  isort: skip
from attnviz.cli import models  # noqa: E402, F401  isort: skip

INTERRUPTED = 130  # the shell's exit code for Ctrl-C (128 + SIGINT)
FIGURE_WORKER_COMMANDS = ("heads", "layers", "stats", "compare", "position")  # those that draw in the figure worker on one text
SHORT_TEXT_CHARS = 256  # a command on texts no longer than this runs torch on one thread (few_threads_for_short_texts)


def run(args: list[str] | None = None) -> int:
    """Run the command line and return its exit code; errors become one line on stderr."""
    from attnviz.output.runs import forget_written_folders, last_interruption

    forget_written_folders()
    try:
        _refuse_empty_out(sys.argv[1:] if args is None else args)
        result = app(args=args, prog_name="attnviz", standalone_mode=False)
    except UsageError as error:
        command = error.ctx.command_path if error.ctx else "attnviz"
        errors.print(f"error: {error.format_message()} (see {command} --help)", soft_wrap=True)
        return 2
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


def _refuse_empty_out(args: list[str]) -> None:
    """--out "" would mean the current folder (Path("") is "."): refuse it, before typer turns it into "."."""
    options = args[: args.index("--")] if "--" in args else args
    for option, value in zip(options, [*options[1:], None]):
        if option == "--out=" or option in ("--out", "-o") and value == "":
            raise AttnvizError("--out is empty: give a folder (--out . for the current one)")


def few_threads_for_short_texts(args: list[str]) -> None:
    """One torch thread (OMP_NUM_THREADS=1, set before torch is imported) for a command on short texts.

    A dozen tokens make tensors so small that a second thread only adds waiting: the forward pass
    and the report's passes of a 12-token text take 10 to 20 times longer with torch's two threads
    on a 2-core machine where another process holds a core (each parallel region waits for both).
    A batch (--file) or a long text keeps torch's threads, and so does a thread count the user set.
    """
    if "torch" in sys.modules or {"OMP_NUM_THREADS", "MKL_NUM_THREADS"} & set(os.environ):
        return
    options = args[: args.index("--")] if "--" in args else args
    if any(arg == "--file" or arg.startswith(("--file=", "-f")) for arg in options):
        return
    if all(len(arg) <= SHORT_TEXT_CHARS for arg in args):
        os.environ["OMP_NUM_THREADS"] = "1"


def start_figure_worker_early(args: list[str]) -> None:
    """Fork the figure worker (render/figure_worker.py) now, before typer parses the options, for a command that uses it.

    Parsing and the command's imports take a tenth of a second; the worker imports matplotlib
    meanwhile instead of after, and has that much longer for the work it does before the run
    exists (heads lays out its figures then). Not with --file (drawn in this process) nor --help.
    """
    from attnviz.render import figure_worker

    options = args[: args.index("--")] if "--" in args else args
    words = [arg for arg in options if not arg.startswith("-")]
    if not words or words[0] not in FIGURE_WORKER_COMMANDS or any(arg in ("--help", "-h") for arg in options):
        return
    if any(arg == "--file" or arg.startswith(("--file=", "-f")) for arg in options):
        return
    figure_worker.start()


def _interrupted(interrupted: Interrupted) -> int:
    from attnviz.output.runs import interrupted_message

    errors.print(interrupted_message(interrupted.written), soft_wrap=True)
    return interrupted.exit_code


def main() -> None:
    """The `attnviz` command: signals end a run cleanly, a closed pipe loses no files."""
    from attnviz.output.runs import DEFERRED_SIGNALS, handle_signals
    from attnviz.output.streams import PipeSafeStream, lost_output_code

    handle_signals()
    few_threads_for_short_texts(sys.argv[1:])
    start_figure_worker_early(sys.argv[1:])
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
    exit_without_teardown(code)


def exit_without_teardown(code: int) -> None:
    """End the process with code, without the interpreter's teardown where nothing needs it.

    Once torch is imported, Python's teardown (freeing every module's objects) takes about 0.3 s:
    `python -c "import torch"` ends 0.28 s after its import is done, a quarter of a short `heads`. What
    an exit must do is done here: the atexit functions run (the figure worker stopped, a local Ray
    shut down) and the streams flushed. Files are all closed by then (the run folder is renamed into
    place before this). Where another thread is alive the teardown is kept: it is what waits for them.
    """
    import atexit
    import threading

    run_exit_functions = getattr(atexit, "_run_exitfuncs", None)  # CPython's, as its own exit calls it
    if run_exit_functions is None or threading.active_count() > 1:
        sys.exit(code)
    run_exit_functions()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: what it missed is lost either way
            pass
    os._exit(code)

"""What the `attnviz` command does to start fast, in one place: attnviz/__main__.py and the command line use it, and
nothing else imports it (an import-linter contract in pyproject.toml says so).

- quit_on_signals(): SIGINT, SIGTERM and SIGHUP during the imports end the run at once and quietly.
- print_saved_help(): `attnviz --help` from attnviz/cli/help.txt, without building the command line.
- few_threads_for_short_texts(): one torch thread for a command on short texts.
- The figure worker: a copy of this process forked before torch is imported (start_worker), for the commands that
  draw. It imports matplotlib on the second core while this process imports torch and runs the model, then runs
  the drawing it is handed (drawn(): a module-level function or a result's method and its arguments, pickled
  through a pipe, the answer back the same way). Linux with two cores or more; elsewhere, and wherever no worker
  was started (the API, the tests), drawn() draws in this process.

Only public APIs: os.fork, os.pipe, pickle, atexit, signal (the fork's helpers: attnviz/render/forked.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import struct
import sys

SAVED_HELP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli", "help.txt")
SAVED_HELP_MIN_COLUMNS = 80  # click wraps help at min(columns, 80) - 2: from 80 columns on, always at 78
SHORT_TEXT_CHARS = 256  # a command on texts no longer than this runs torch on one thread
WORKER_COMMANDS = ("heads", "layers", "stats", "compare", "position")  # those that draw in the figure worker
QUIT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HEADER = struct.Struct(">Q")  # a message's length in bytes, before its pickle
_worker: _Worker | None = None  # this process's figure worker, once started


def quit_on_signals() -> None:
    """A signal ends the process at once and says that nothing was written, until the command line sets its own
    handlers (output/runs.py): during the imports (a second or more with torch) nothing is written yet."""

    def quit_quietly(number, frame):
        os.write(2, b"interrupted: nothing was written\n")
        os._exit(128 + number)

    for number in QUIT_SIGNALS:
        signal.signal(number, quit_quietly)


def print_saved_help() -> bool:
    """Print `attnviz --help` as typer writes it at 80 columns or more, from attnviz/cli/help.txt; False where it
    would differ (a narrower terminal) or cannot be read. Building the command line to print it imports typer, rich
    and every command's options (bench/RESULTS.md, "Timings behind the code"); tests/test_startup.py checks that
    the saved text is what typer writes now."""
    import shutil

    if shutil.get_terminal_size().columns < SAVED_HELP_MIN_COLUMNS or sys.stdout is None:
        return False
    try:
        with open(SAVED_HELP, encoding="utf-8") as saved:
            text = saved.read()
    except OSError:
        return False
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # attnviz --help | head: what was read is enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return True


def few_threads_for_short_texts(args: list[str]) -> None:
    """One torch thread (OMP_NUM_THREADS=1, set before torch is imported) for a command on short texts.

    A dozen tokens make tensors so small that a second thread only adds waiting: on a 2-core machine
    where another process holds a core, each of torch's parallel regions waits for both threads. A
    batch (--file) or a long text keeps torch's threads, and so does a thread count the user set.
    """
    if "torch" in sys.modules or {"OMP_NUM_THREADS", "MKL_NUM_THREADS"} & set(os.environ):
        return
    if _reads_a_file(args):
        return
    if all(len(arg) <= SHORT_TEXT_CHARS for arg in args):
        os.environ["OMP_NUM_THREADS"] = "1"


def start_worker(args: list[str], warm_up=None) -> None:
    """Fork the figure worker for a command that draws in it (WORKER_COMMANDS, one text: not --file nor --help),
    on Linux with two cores, before torch is imported; in it, warm_up() runs first (the drawing's imports).

    With torch already imported (the API, the tests) there is no import to overlap, and a copy of a
    process that has started torch's threads is best not made.
    """
    from attnviz.render.forked import become_a_helper, can_fork

    global _worker
    options = args[: args.index("--")] if "--" in args else args
    words = [arg for arg in options if not arg.startswith("-")]
    if not words or words[0] not in WORKER_COMMANDS or any(arg in ("--help", "-h") for arg in options):
        return
    if _reads_a_file(args) or _worker is not None or not can_fork() or "torch" in sys.modules:
        return
    jobs_read, jobs_write = os.pipe()
    replies_read, replies_write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(jobs_write)
            os.close(replies_read)
            become_a_helper(parent)
            _serve(jobs_read, replies_write, warm_up)
        finally:
            os._exit(0)
    os.close(jobs_read)
    os.close(replies_write)
    _worker = _Worker(pid, jobs_write, replies_read)
    atexit.register(stop_worker)  # reaped, so that its CPU time counts in this process's children's


@contextlib.contextmanager
def drawn(function, *args):
    """function(*args) (a module-level function or a picklable object's method), drawn by the figure worker if there
    is one free, while the block runs; the block's `.wait()` gives its answer (drawn here if there was no worker, or
    it died or failed: the same error raised here). Leaving the block otherwise (an error, a signal's exception)
    kills the worker, so that nothing is written after it. While the worker draws, torch here (where it is imported)
    runs a thread fewer: the worker has a core, and torch's threads sharing the rest with it wait on each other (the
    report of an 8,187-token text: 4.6 s with SmolLM2's two threads on two cores, 1.8 s with one)."""
    drawing = _Drawing(function, args)
    torch = sys.modules.get("torch") if drawing.worker is not None else None
    threads = torch.get_num_threads() if torch is not None else 1
    try:
        if threads > 1:
            torch.set_num_threads(threads - 1)
        yield drawing
    finally:
        if threads > 1:
            torch.set_num_threads(threads)
        if drawing.worker is not None and drawing.worker is _worker:  # not answered
            stop_worker()


def draw(function, *args):
    """function(*args), by the figure worker if there is one free (matplotlib is loaded there), else here."""
    with drawn(function, *args) as drawing:
        return drawing.wait()


def stop_worker() -> None:
    """End the figure worker, if there is one, at once (SIGKILL); later drawing is done here."""
    global _worker
    worker, _worker = _worker, None
    if worker is None:
        return
    for descriptor in (worker.jobs, worker.replies):
        with contextlib.suppress(OSError):
            os.close(descriptor)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(worker.pid, signal.SIGKILL)
        os.waitpid(worker.pid, 0)


def _reads_a_file(args: list[str]) -> bool:
    options = args[: args.index("--")] if "--" in args else args
    return any(arg == "--file" or arg.startswith(("--file=", "-f")) for arg in options)


class _Worker:
    def __init__(self, pid: int, jobs: int, replies: int):
        self.pid, self.jobs, self.replies = pid, jobs, replies
        self.busy = False


class _Drawing:
    """function(*args), sent to the figure worker if one is free (self.worker), else kept to be drawn here."""

    def __init__(self, function, args: tuple):
        self.function, self.args, self.worker = function, args, None
        if _worker is None or _worker.busy:
            return
        try:
            _send(_worker.jobs, (function, args, os.getcwd()))
        except OSError:  # it died: drawn here
            return stop_worker()
        self.worker = _worker
        self.worker.busy = True

    def wait(self):
        """The function's answer; its OSError raised again here; drawn here if the worker died or failed otherwise."""
        worker, self.worker = self.worker, None
        if worker is None or worker is not _worker:
            return self.function(*self.args)
        reply = _receive(worker.replies)
        worker.busy = False
        if reply is None:  # killed, or out of memory: draw here
            stop_worker()
            return self.function(*self.args)
        kind, value = reply
        if kind == "oserror":
            raise OSError(*value)
        if kind == "error":
            return self.function(*self.args)  # the same error, raised where it can be reported
        return value


def _serve(jobs: int, replies: int, warm_up) -> None:
    """The worker: warm up (the drawing's imports), then run jobs until the parent closes the pipe."""
    global _worker
    _worker = None  # the parent's, copied: this process draws itself
    if warm_up is not None:
        with contextlib.suppress(Exception):  # a job then does that work itself
            warm_up()
    while (job := _receive(jobs)) is not None:
        function, args, cwd = job
        try:
            os.chdir(cwd)  # the parent's, now: a relative path means what it means there
            reply = ("done", function(*args))
        except OSError as error:
            reply = ("oserror", (error.errno, error.strerror, error.filename))
        except Exception as error:  # noqa: BLE001  the parent draws again and reports it
            reply = ("error", f"{type(error).__name__}: {error}")
        _send(replies, reply)


def _send(descriptor: int, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(descriptor, view) :]


def _receive(descriptor: int):
    """The next message, or None at the end of the pipe (the other side closed it or died)."""
    header = _read(descriptor, _HEADER.size)
    if header is None:
        return None
    data = _read(descriptor, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def _read(descriptor: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        try:
            part = os.read(descriptor, min(left, 1 << 20))
        except OSError:
            return None
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)

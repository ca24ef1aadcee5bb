"""Forked copies of this process that draw figures while it does other work.

- fork(draw): a copy that runs draw() and exits; beside(): one drawing here, another in such a copy (the heads'
  grid beside the head figures).
- start() and submit(): the figure worker, a copy forked when a figure command starts, before
  torch is imported. It imports matplotlib (0.2 s) on the second core while this process imports
  torch (a second or more) and runs the model, lays out the figures to come meanwhile (ahead():
  heads_ahead.prepare, position_figure.prepare, compare_figures.prepare), then runs the jobs it
  is sent (the heatmaps, while this process computes the report). Jobs are a module-level
  function and its arguments, pickled through a pipe; the answer comes back the same way.

Both die with this process (prctl PR_SET_PDEATHSIG), and of SIGINT, SIGTERM and SIGHUP: this
process removes what they were writing. Linux only, and only with two cores or more: elsewhere
start() starts nothing and the figures are drawn in this process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import struct
import sys

_HEADER = struct.Struct(">Q")  # a message's length in bytes, before its pickle
_worker: _Worker | None = None  # this process's figure worker, once started


def can_fork() -> bool:
    return sys.platform == "linux" and (os.cpu_count() or 1) >= 2


def fork(draw) -> int:
    """Run draw() in a forked copy of this process that dies with it; return the copy's pid.

    The copy leaves with os._exit, never running the parent's code after this (its cleanup of the
    run folder above all): exit code 0 done, the errno of an OSError, 1 anything else.
    """
    parent = os.getpid()
    child = os.fork()
    if child != 0:
        return child
    exit_code = 1
    try:
        _become_a_helper(parent)
        draw()
        exit_code = 0
    except OSError as error:
        exit_code = error.errno if error.errno and 1 < error.errno < 126 else 1
    finally:
        os._exit(exit_code)


def beside(draw_here, draw_there, folder) -> list:
    """draw_here() in this process while a forked copy runs draw_there() (fork), on Linux with two cores; return draw_here's answer.

    Without a second core both run here, one after the other. The copy is killed if this process
    stops drawing (Ctrl-C, SIGTERM: its files are not wanted any more); its OSError (e.g. ENOSPC)
    is raised here again, naming folder, where it was writing; its other failures as a RuntimeError.
    """
    if not can_fork():
        answer = draw_here()
        draw_there()
        return answer
    child = fork(draw_there)
    try:
        answer = draw_here()
        status = os.waitpid(child, 0)[1]
        child = None
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
    exit_code = os.waitstatus_to_exitcode(status)
    if exit_code > 1:  # the errno of the copy's OSError
        raise OSError(exit_code, os.strerror(exit_code), str(folder))
    if exit_code != 0:
        raise RuntimeError(f"drawing in a forked process failed (writing into {folder})")
    return answer


def start() -> None:
    """Fork the figure worker, if it helps: on Linux with two cores, once, before torch is imported.

    With torch already imported (the API, the tests) there is no import to overlap, and a copy of
    a process that has started torch's threads is best not made.
    """
    global _worker
    if _worker is not None or not can_fork() or "torch" in sys.modules:
        return
    jobs_read, jobs_write = os.pipe()
    replies_read, replies_write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(jobs_write)
            os.close(replies_read)
            _become_a_helper(parent)
            _serve(jobs_read, replies_write)
        finally:
            os._exit(0)
    os.close(jobs_read)
    os.close(replies_write)
    _worker = _Worker(pid, jobs_write, replies_read)
    # At exit its jobs are answered, or abandoned (an error): work ahead is not waited for. Reaped,
    # so that its CPU time counts in this process's children's.
    atexit.register(stop)


def ahead(function, *args) -> None:
    """Have the figure worker run function(*args) (a module-level function) before its next job, answering nothing.

    Work done ahead for the jobs to come (heads_ahead.prepare and the like): its failure is ignored there (the
    jobs then do that work themselves), and nothing here waits for it.
    """
    if _worker is None or _worker.busy:
        return
    try:
        _send(_worker.jobs, (function, args, False, os.getcwd()))
    except OSError:  # it died: the jobs are done here
        stop()


def submit(function, *args) -> Job | None:
    """Have the figure worker run function(*args) (a module-level function); None when there is no worker free."""
    if _worker is None or _worker.busy:
        return None
    try:
        _send(_worker.jobs, (function, args, True, os.getcwd()))
    except OSError:  # it died: draw here
        stop()
        return None
    _worker.busy = True
    return Job(_worker)


def stop(kill: bool = True) -> None:
    """End the figure worker, if there is one: at once (SIGKILL), or kill=False after its job; later jobs are done here."""
    global _worker
    worker, _worker = _worker, None
    if worker is None:
        return
    for descriptor in (worker.jobs, worker.replies):  # the end of its pipe: it exits when it reads that
        with contextlib.suppress(OSError):
            os.close(descriptor)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        if kill:
            os.kill(worker.pid, signal.SIGKILL)
        os.waitpid(worker.pid, 0)


def write_files(result, folder, fmt: str) -> list:
    """result.write_files(folder, fmt): a job for the worker (a result of attnviz.api, pickled with its arrays)."""
    return result.write_files(folder, fmt)


def write_files_here_or_there(result, folder, fmt: str) -> list:
    """result.write_files(folder, fmt), by the figure worker if one is free (matplotlib is loaded there), else here."""
    job = submit(write_files, result, folder, fmt)
    if job is None:
        return result.write_files(folder, fmt)
    try:
        return job.wait(lambda: result.write_files(folder, fmt))
    finally:
        job.cancel()  # a no-op once it answered; else nothing more is written into folder


class _Worker:
    def __init__(self, pid: int, jobs: int, replies: int):
        self.pid, self.jobs, self.replies = pid, jobs, replies
        self.busy = False


class Job:
    """A job the figure worker is running: wait() for its answer, or cancel() it."""

    def __init__(self, worker: _Worker):
        self._worker = worker

    def wait(self, fallback):
        """The function's return value; its OSError raised again here; fallback() if the worker died or failed otherwise."""
        worker = self._worker
        reply = _receive(worker.replies) if worker is _worker else None
        worker.busy = False
        if reply is None:  # killed, or out of memory: draw here
            stop()
            return fallback()
        kind, value = reply
        if kind == "oserror":
            raise OSError(*value)
        if kind == "error":
            return fallback()  # the same error, raised where it can be reported
        return value

    def cancel(self) -> None:
        """Stop the job (and the worker) at once if it has not answered: it may be writing into a folder about to be removed."""
        if self._worker is _worker and self._worker.busy:
            stop()


def _become_a_helper(parent: int) -> None:
    """In a forked copy: die of the signals (the parent cleans up), and with the parent, even by SIGKILL."""
    import ctypes

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)


def _serve(jobs: int, replies: int) -> None:
    """The worker: import what drawing needs, then run jobs until the parent closes the pipe."""
    global _worker
    _worker = None  # the parent's, copied: this process runs its jobs itself
    import matplotlib.backends.backend_agg  # noqa: F401  the imports this worker is for
    import matplotlib.figure  # noqa: F401

    from attnviz.render.fonts import use_cjk_font

    use_cjk_font()
    while (job := _receive(jobs)) is not None:
        function, args, answered, cwd = job
        if not answered:  # work ahead (ahead()): nobody waits for it, a job does it again if it failed
            with contextlib.suppress(Exception):
                function(*args)
            continue
        try:
            os.chdir(cwd)  # the parent's, now: a relative path means what it means there (the API may chdir between runs)
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

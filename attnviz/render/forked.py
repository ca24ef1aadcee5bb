"""Drawing in a forked copy of this process: beside() draws the heads' grid there while this process draws the heads.

The copy dies with this process (prctl PR_SET_PDEATHSIG), and of SIGINT, SIGTERM and SIGHUP: this process removes
what it was writing. Linux only, and only with two cores or more: elsewhere both are drawn here, one after the other.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


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
        become_a_helper(parent)
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


def become_a_helper(parent: int) -> None:
    """In a forked copy: die of the signals (the parent cleans up), and with the parent, even by SIGKILL."""
    import ctypes

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)

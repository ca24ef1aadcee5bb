"""Run folders: safe default names, and writing so that a run folder always holds one whole run.

A run writes into a hidden staging folder on the same filesystem as its target (inside an
--out folder, so that a mount point works; beside a new default folder), and moves its files
into place only when the whole run succeeded, in one step that is undone if any move fails:
the files an earlier run wrote there (listed in the folder's manifest, MANIFEST) go, the new
ones come, the manifest is replaced. A user's own files in the folder stay, except one with
the name of a new file, which is replaced. Signals wait for the step to finish, and runs into
one folder take turns, so the folder holds the files of one run: the last.

An error or a signal (SIGINT, SIGTERM, SIGHUP) before that step removes the staging folder:
nothing is written. A signal during it waits until it is done.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
from pathlib import Path

from attnviz.errors import AttnvizError, Interrupted

MAX_NAME_CHARS = 40
MANIFEST = ".attnviz-files.json"  # in every run folder: the names of the files attnviz wrote there
MANIFEST_FORMAT = "attnviz-run-files"
HIDDEN_PREFIX = ".attnviz-"  # staging, probe and trash folders, removed when the run ends
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Failures of the place the files go, which the user can act on (exit 2), not bugs (exit 1).
REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "a file is larger than the file system allows",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "the file system does not permit it",
    errno.ENAMETOOLONG: "the path is too long",
    errno.ELOOP: "too many symbolic links",
    errno.ENOTDIR: "a part of the path is a file",
    errno.EIO: "input/output error",
}
_open_folders: list[StagedRunFolder] = []  # this process's runs being written: a signal removes their staging
_written_folders: list[Path] = []  # this process's runs whose files are in place: a signal cannot undo them
_interruptions: list[Interrupted] = []  # what this process's runs raised (typer hands it on as exit code 130 only)


def run_folder_name(text: str) -> str:
    """A folder name from the text: word characters only (CJK kept), no separators, no dots."""
    name = re.sub(r"[\W_]+", "-", text).strip("-")[:MAX_NAME_CHARS].strip("-")
    return name or "run"


def place_reason(error: OSError) -> str:
    """What is wrong with the place a file goes, in words: "the disk is full"."""
    return REASONS.get(error.errno, error.strerror or str(error))


def output_error(folder: Path, error: OSError) -> AttnvizError:
    """One line naming the folder and, in words, what is wrong with it."""
    reason = place_reason(error)
    if error.errno == errno.ENOENT:  # mkdir in an existing folder that takes no new ones, such as /proc
        reason = "its folder does not take new folders"
    elif error.errno == errno.ENOTDIR:
        reason = next((f"{path} is a file" for path in folder.parents if path.is_file()), reason)
    return AttnvizError(f"cannot write the output folder {folder}: {reason}")


def check_target(target: Path) -> Path:
    """Refuse a run folder that cannot be written, early: before any model is loaded.

    The folder (and its missing parents) is made, a staging folder tried in it, and what
    was made is removed again, so the check leaves nothing behind.
    """
    target = Path(target)
    try:
        if target.is_symlink() and not target.exists():
            raise AttnvizError(f"the output folder {target} is a symbolic link to {os.readlink(target)}, which does not exist")
        if _is_a_file(target):
            raise AttnvizError(f"the output path {target} is a file, not a folder")
    except OSError as error:  # e.g. a name too long to look up
        raise output_error(target, error) from None
    with signals_deferred() as caught:  # what the check makes, it removes, even on Ctrl-C
        probe, created = _make_hidden_folder(target, ".probe")
        probe.rmdir()
        _remove_empty(created)
    if caught:
        raise interrupted(caught[0])
    return target


# Concurrent runs' checks make and remove the same missing folder: each removal may undo our making
# of it once, and under load several in a row can (13 in a row at most in 20,000 checks of 8 threads against a 9th
# that makes and removes it; 50 ran out once in the whole test suite's run beside it). An attempt is two system calls.
MAKE_ATTEMPTS = 1000


def _is_a_file(path: Path) -> bool:
    """Whether something that is no folder is at path, from one look (os.stat): concurrent runs make and remove the
    same missing folder, and one that appears or vanishes between two looks (exists(), then is_dir()) would pass for a
    file. Missing, or removed by another run since, is no file."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def _make_hidden_folder(folder: Path, suffix: str) -> tuple[Path, list[Path]]:
    """A new hidden folder in folder, made with its missing parents; returns it and the parents made."""
    for attempt in range(MAKE_ATTEMPTS):
        try:
            created = _make_folders(folder)
            return Path(tempfile.mkdtemp(prefix=HIDDEN_PREFIX, suffix=suffix, dir=folder)), created
        except FileNotFoundError:
            # A concurrent run's check removed the folder it had made, or a parent of it (it may have made it
            # again since, so that the folder exists by now): make it again, and try once more.
            if attempt == MAKE_ATTEMPTS - 1:
                raise output_error(folder, FileNotFoundError(errno.ENOENT, "")) from None
        except OSError as error:
            _remove_empty(created)
            raise output_error(folder, error) from None


def _make_folders(folder: Path) -> list[Path]:
    """Make folder and its missing parents; return the ones made, outermost first."""
    missing = [path for path in [folder, *folder.parents] if not path.exists()][::-1]
    created = []
    try:
        for path in missing:
            if path.is_symlink():
                raise AttnvizError(f"the output folder {folder} goes through {path}, a symbolic link to nothing")
            path.mkdir()
            created.append(path)
    except FileExistsError:  # a file in the way, or a concurrent run made it (and may have removed it since): only a file is wrong
        if _is_a_file(path):
            _remove_empty(created)
            raise AttnvizError(f"cannot write the output folder {folder}: {path} is a file") from None
        return created + _make_folders(folder)
    except FileNotFoundError:  # a concurrent run removed a parent it had made: _make_hidden_folder makes them again
        _remove_empty(created)
        raise
    except OSError as error:
        _remove_empty(created)
        raise output_error(folder, error) from None
    return created


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a run made, innermost first, where they are still empty."""
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()


def handle_signals() -> None:
    """Make SIGINT (Ctrl-C), SIGTERM (kill, timeout) and SIGHUP (a closed terminal) end a run cleanly."""
    for number in DEFERRED_SIGNALS:
        signal.signal(number, _on_signal)


def _on_signal(number: int, frame) -> None:
    """End the run at once, whatever it was doing: remove what it staged and its temporary maps, say so, exit 128 + number.

    An exception raised here would have to pass through the C and C++ code the run is in (torch,
    matplotlib), which may turn it into another error or abort the process. Where the files are
    moved into place, signals_deferred holds the signal back instead, so no move is cut short.
    """
    for folder in _open_folders:
        folder.discard()
    # The run's temporary maps (os._exit runs no finalizer). Never imported here: the signal may come while
    # run_data itself is being imported, half done; a module not imported in full has made no map yet.
    run_data = sys.modules.get("attnviz.run_data")
    if hasattr(run_data, "remove_map_folders"):
        run_data.remove_map_folders()
    os.write(2, interrupted_message().encode() + b"\n")
    os._exit(128 + number)  # as attnviz/__main__.py does during the imports


def forget_written_folders() -> None:
    """A new command in this process (the tests run many): no run of its own is in place yet, nor interrupted."""
    _written_folders.clear()
    _interruptions.clear()


def interrupted(signal_number: int, written: Path | None = None) -> Interrupted:
    """The Interrupted to raise for a signal held back, remembered for last_interruption."""
    _interruptions.append(Interrupted(signal_number, written))
    return _interruptions[-1]


def last_interruption() -> Interrupted | None:
    """The Interrupted this process's command raised, if any: typer turns a KeyboardInterrupt (and so an
    Interrupted) into exit code 130 and keeps neither its signal nor the folder it wrote."""
    return _interruptions[-1] if _interruptions else None


def written_folder() -> Path | None:
    """The folder whose files this process's command put in place last, if any."""
    return _written_folders[-1] if _written_folders else None


def interrupted_message(written: Path | None = None) -> str:
    """What a signal left: nothing, or a whole run (it came after the files were in place).

    written: the folder the files went to; by default the last this process put in place, if any.
    """
    written = written or written_folder()
    if written is None:
        return "interrupted: nothing was written"
    return f"interrupted once the files were written in full: {written}"


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT, SIGTERM and SIGHUP until the block is done; yields the list of those that came."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread has handlers
        yield []
        return
    caught: list[int] = []
    previous = {number: signal.signal(number, lambda number, frame: caught.append(number)) for number in DEFERRED_SIGNALS}
    try:
        yield caught
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def earlier_run_files(folder: Path) -> list[str]:
    """The names an earlier run wrote into folder and that are still what it wrote there.

    The manifest marks folders with a trailing "/": an entry of the other kind now (a user's
    folder where attnviz wrote a file) is the user's. Only plain names count: nothing outside.
    """
    try:
        record = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        recorded = record["files"] if record.get("format") == MANIFEST_FORMAT else []
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
    names = []
    for entry in recorded if isinstance(recorded, list) else []:
        name = entry.removesuffix("/") if isinstance(entry, str) else ""
        if _plain_name(name) and os.path.lexists(folder / name) and entry.endswith("/") == _is_folder(folder / name):
            names.append(name)
    return names


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name and name != MANIFEST


def _is_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def write_manifest(folder: Path, names: list[str]) -> None:
    entries = [name + "/" if _is_folder(folder / name) else name for name in sorted(names)]
    record = {"format": MANIFEST_FORMAT, "version": 1, "files": entries}
    (folder / MANIFEST).write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")


@contextlib.contextmanager
def _locked(folder: Path):
    """Runs into one folder take turns at replacing its files (an flock on the folder itself)."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _refuse_folders_in_the_way(target: Path, names: list[str], previous: list[str]) -> None:
    """A folder of the user's where a new file goes would be deleted with all it holds: refuse."""
    for name in names:
        path = target / name
        if name not in previous and _is_folder(path):
            raise AttnvizError(
                f"the output folder {target} has a folder {name} where this run writes its {name}: "
                "move it away or give another --out"
            )


def _swap_files(target: Path, staging: Path, trash: Path, names: list[str], previous: list[str]) -> None:
    """Move the earlier run's files (and same-named ones) into trash and the new ones in; all or none."""
    done: list[tuple[Path, Path]] = []  # (from, to), undone in reverse if a move fails
    try:
        for name in sorted({*previous, *names, MANIFEST}):
            if os.path.lexists(target / name):
                os.replace(target / name, trash / name)
                done.append((target / name, trash / name))
        for name in [*names, MANIFEST]:
            os.replace(staging / name, target / name)
            done.append((staging / name, target / name))
    except BaseException:
        for source, destination in reversed(done):
            with contextlib.suppress(OSError):
                os.replace(destination, source)
        raise


class StagedRunFolder:
    """Write a run into a staging folder; on success its files land in `target`.

        folder = StagedRunFolder(Path("outputs/run"), unique=True)
        with folder as staging:
            ...write files into staging...
        folder.final  # where they landed

    unique=True (the default names) never overwrites: a taken name gets a -2, -3, ... suffix.
    unique=False (an explicit --out) replaces the files an earlier run wrote into the folder.
    A write that fails for a reason of the place (a full disk, a read-only file system) is an
    AttnvizError naming the folder.
    """

    def __init__(self, target: Path, unique: bool):
        self.target = Path(target)
        self.unique = unique
        self.final: Path | None = None

    def __enter__(self) -> Path:
        check_target(self.target)
        home = self.target.parent if self.unique else self.target
        with signals_deferred() as caught:  # what is made here is known before a signal can strike
            self.staging, self.created = _make_hidden_folder(home, ".partial")
            _open_folders.append(self)
        if caught:
            self.__exit__(Interrupted, None, None)
            raise interrupted(caught[0])
        return self.staging

    def discard(self) -> None:
        """Remove the staging folder, and the folders made for the run if nothing landed in them."""
        shutil.rmtree(self.staging, ignore_errors=True)
        if self.final is None:
            _remove_empty(self.created)

    def __exit__(self, error_type, error, traceback) -> None:
        try:
            if error_type is None:
                self._publish()
            elif issubclass(error_type, OSError) and error.errno in REASONS:
                raise output_error(self.target, error) from None
        finally:
            with signals_deferred() as caught:  # a second Ctrl-C must not stop the cleanup halfway
                self.discard()
                _open_folders.remove(self)
            if caught and self.final is not None:
                raise interrupted(caught[0], written=self.final)

    def _publish(self) -> None:
        names = sorted(os.listdir(self.staging))
        try:
            write_manifest(self.staging, names)  # the last file written: the disk may fill up here too
            with signals_deferred() as caught:
                self._publish_new() if self.unique else self._replace_files(names)
        except OSError as error:
            raise output_error(self.target, error) from None
        _written_folders.append(self.final)
        if caught:  # a signal during the move: it takes effect now that the files are whole
            raise interrupted(caught[0], written=self.final)

    def _publish_new(self) -> None:
        """Claim a free name (mkdir is atomic, even against a concurrent run), then rename the staging onto it."""
        candidate, number = self.target, 1
        while True:
            try:
                candidate.mkdir()
                break
            except FileExistsError:
                number += 1
                candidate = self.target.with_name(f"{self.target.name}-{number}")
        try:
            os.chmod(self.staging, stat.S_IMODE(candidate.stat().st_mode))  # mkdtemp's 0700 -> the usual mode
            os.rename(self.staging, candidate)  # onto the empty folder just made: its files appear at once
        except OSError:
            candidate.rmdir()
            raise
        self.final = candidate

    def _replace_files(self, names: list[str]) -> None:
        with _locked(self.target):
            previous = earlier_run_files(self.target)
            _refuse_folders_in_the_way(self.target, names, previous)
            trash = Path(tempfile.mkdtemp(prefix=HIDDEN_PREFIX, suffix=".old", dir=self.target))
            try:
                _swap_files(self.target, self.staging, trash, names, previous)
            finally:
                shutil.rmtree(trash, ignore_errors=True)
        self.final = self.target

"""Run folders: safe default names, and writing so that a failed run leaves nothing behind.

Files are written into a hidden staging folder next to the target and moved into place
only when the whole run succeeded; an error or Ctrl-C removes the staging folder.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from attnviz.errors import AttnvizError

MAX_NAME_CHARS = 40


def run_folder_name(text: str) -> str:
    """A folder name from the text: word characters only (CJK kept), no separators, no dots."""
    name = re.sub(r"[\W_]+", "-", text).strip("-")[:MAX_NAME_CHARS].strip("-")
    return name or "run"


def check_target(target: Path) -> Path:
    """Refuse a run folder path that is a file, early: before any model is loaded."""
    if target.exists() and not target.is_dir():
        raise AttnvizError(f"the output path {target} is a file, not a folder")
    return target


def _ensure_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise AttnvizError(f"cannot create the output folder {folder}: {error.strerror or error}") from None
    if not os.access(folder, os.W_OK):
        raise AttnvizError(f"cannot write to the output folder {folder}")


def _publish(staging: Path, target: Path, unique: bool) -> Path:
    """Move the staged files into place; a unique target gets a -2, -3, ... suffix if taken."""
    if unique:
        candidate, number = target, 1
        while True:
            try:
                candidate.mkdir()  # claims the name atomically, even against a concurrent run
                break
            except FileExistsError:
                number += 1
                candidate = target.with_name(f"{target.name}-{number}")
        target = candidate
    else:
        target.mkdir(exist_ok=True)
    for staged in staging.iterdir():
        os.replace(staged, target / staged.name)
    return target


class StagedRunFolder:
    """Write a run into a staging folder; on success its files land in `target`.

        folder = StagedRunFolder(Path("outputs/run"), unique=True)
        with folder as staging:
            ...write files into staging...
        folder.final  # where they landed

    unique=True (the default names) never overwrites: a taken name gets a number.
    unique=False (an explicit --out) writes into the folder, replacing files of the same name.
    """

    def __init__(self, target: Path, unique: bool):
        self.target = Path(target)
        self.unique = unique
        self.final: Path | None = None

    def __enter__(self) -> Path:
        check_target(self.target)
        _ensure_folder(self.target.parent)
        prefix = f".{self.target.name[:16]}-"
        self.staging = Path(tempfile.mkdtemp(prefix=prefix, suffix=".partial", dir=self.target.parent))
        return self.staging

    def __exit__(self, error_type, error, traceback) -> None:
        try:
            if error_type is None:
                self.final = _publish(self.staging, self.target, self.unique)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)

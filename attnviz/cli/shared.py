"""What the commands share: a TEXT or a --file, the output folder checked before any work; the notices' cap; the trace's verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from attnviz.cli.options import DEFAULT_OUTPUTS, console, errors
from attnviz.errors import AttnvizError


MAX_NOTICES_SHOWN = 3  # over many texts: the first few notices, then a count


def text_or_file(text: Optional[str], file: Optional[str]) -> None:
    """A command that takes a TEXT or --file PATH needs exactly one of them."""
    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")


def write_run(out: Optional[Path], target: Path, doing: str, write) -> list[Path]:
    """Write a run's files (write(staging) -> paths, a result's write_files) into target, all or none; list them and return them.

    Without --out, target is a new folder (a number added if the name is taken).
    """
    from attnviz.output.runs import StagedRunFolder
    from attnviz.render import terminal

    folder = StagedRunFolder(target, unique=out is None)
    with console.status(doing), folder as staging:
        written = write(staging)
    final = [folder.final / path.name for path in written]
    terminal.print_files(console, folder.final, final)
    return final


def run_target(out: Optional[Path], default_name: str) -> Path:
    """--out, or a folder under outputs/ named for the run; checked before any work is done."""
    from attnviz.output.runs import check_target

    return check_target(out if out is not None else DEFAULT_OUTPUTS / default_name)


def layouts_disagree(traced) -> int:
    """A check that failed is a bug, not bad input: one line on stderr and exit code 1."""
    worst = max(traced.checks, key=lambda check: max(check.weights_diff, check.output_diff))
    errors.print(
        f"error: the layouts disagree: {worst.layout} differs from {worst.reference} by "
        f"{max(worst.weights_diff, worst.output_diff):.1e}, more than 1e-05 (see trace.json)",
        soft_wrap=True,
    )
    return 1

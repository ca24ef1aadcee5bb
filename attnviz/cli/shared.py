"""What the commands share: run_command (what every command does around its computation), a TEXT or a --file, the
output folder checked before any work; the notes' cap; the trace's verdict."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Optional

from attnviz.api.options import RunOptions
from attnviz.cli.options import DEFAULT_OUTPUTS, ImageFormat, console, errors
from attnviz.errors import AttnvizError


MAX_NOTES_SHOWN = 3  # over many texts: the first few notes, then a count


def text_or_file(text: Optional[str], file: Optional[str]) -> None:
    """A command that takes a TEXT or --file PATH needs exactly one of them."""
    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")


def run_command(
    options: RunOptions, compute, show, doing: str, *, out: Optional[Path], text: Optional[str], file: Optional[str] = None,
    image_format: Optional[ImageFormat] = None, write=None,
) -> tuple:
    """What every command does around its computation, in one place; returns what compute returned and the paths written.

    options: the run's RunOptions, built by the command from its parameters (cli/options.run_options). The output
    folder (out, or a new one named after the text, the prompt or the file) is checked before the model loads.
    compute(options) calls the API, which checks the text and the options (once, there), loads the model through
    attnviz.load and computes. show(computed) prints, and may still refuse (nothing is written yet). Then the run's
    files are written all or nothing: write(computed, staging) -> paths, by default the result's
    write_files(staging, image_format). An error is one line and its exit code (cli/main.py's run).
    """
    from attnviz.output.batch import batch_folder_name
    from attnviz.output.runs import run_folder_name

    target = run_target(out, batch_folder_name(file) if file is not None else run_folder_name(text))
    computed = compute(options)
    if gc.get_freeze_count():  # the process's own command line (main froze its start); a test's process is left alone
        gc.freeze()  # what compute imported and built (torch, the model) lives until the command ends: full passes skip it
    show(computed)
    if write is None:
        formats = (image_format.value,) if image_format is not None else ()

        def write(computed, staging: Path) -> list[Path]:
            return computed.write_files(staging, *formats)

    return computed, write_run(out, target, doing, lambda staging: write(computed, staging))


def print_model_note(loaded) -> None:
    """The model's own note (how it loaded: a fallback, a layer's weights at a time), for a command whose result prints
    no notes of its own (heads' and the others' runs carry it among theirs)."""
    from attnviz.render import terminal

    terminal.print_notes(errors, [loaded.note] if loaded.note else [])


def model_setup(spec) -> tuple[str, str]:
    """Where a run's model came from and its device, as the setup names them: ("bundled", "cuda (NVIDIA H100 ...)")."""
    from attnviz.layer_inputs import device_label

    return spec.model_source, device_label(spec.device)


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

"""Run examples/quickstart.ipynb in a real IPython kernel and save it with its outputs.

    python examples/build_notebook.py

The notebook is committed with what it shows, so that a reader on GitHub sees the figures without
running it. So that running this again gives a stable diff:

- the kernel runs on the CPU (CUDA_VISIBLE_DEVICES=""): the device and the numbers read the same
  on a machine with a GPU;
- tqdm's TqdmWarning ("IProgress not found", where ipywidgets is not installed) is ignored: it is about
  the kernel's environment, not attnviz, and a reader's Jupyter does not show it;
- SmolLM2's tokenizer is cached in attnviz's cache before the kernel starts, so that its one-time note
  ("reading the tokenizer of SmolLM2-135M-Instruct.Q4_1.gguf once") is no output;
- volatile metadata is left out: each cell's execution timestamps, the kernel's language_info (its
  Python version), widget state;
- a warning's line names the cell by the kernel's temporary file, /tmp/ipykernel_<process id>/<hash>.py:
  written "<cell>" (KERNEL_FILE).

It needs the test extra's nbclient, nbformat and ipykernel, and the bundled models.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
NOTEBOOK = REPOSITORY / "examples" / "quickstart.ipynb"
KERNEL_METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}, "language_info": {"name": "python"}}
KERNEL_FILE = re.compile(r"\S*ipykernel_\d+[/\\]\d+\.py")  # a cell's code as a warning names it: its process id changes
MAX_BYTES = 1_000_000  # the notebook with its outputs: small enough to read on GitHub and to keep in git


def executed(path: Path = NOTEBOOK, timeout: int = 600):
    """The notebook at path run top to bottom in a python3 kernel of this Python and this checkout's attnviz, outputs stripped of volatile metadata."""
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    python_path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))  # this checkout first
    client = nbclient.NotebookClient(notebook, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(REPOSITORY)}})
    quiet = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:IProgress not found"]))
    client.execute(env={**os.environ, "PYTHONPATH": python_path, "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": quiet})
    return stable(notebook)


def stable(notebook):
    """The notebook without what changes from run to run: execution timestamps, the kernel's versions, widgets."""
    notebook.metadata = dict(KERNEL_METADATA)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("widgets", None)
        for output in cell.get("outputs", []):
            output.get("metadata", {}).pop("execution", None)
            if output.output_type == "stream":
                output.text = KERNEL_FILE.sub("<cell>", output.text)
    return notebook


def main() -> int:
    import nbformat

    import attnviz

    attnviz.load("smollm2", device="cpu", cache=False)  # its tokenizer cached now, not in a cell's output
    notebook = executed()
    errors = [output for cell in notebook.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    if errors:
        print(f"not saved: a cell failed: {errors[0].ename}: {errors[0].evalue}", file=sys.stderr)
        return 1
    text = nbformat.writes(notebook) + "\n"
    if len(text.encode()) > MAX_BYTES:
        print(f"not saved: {len(text.encode()):,} bytes, more than {MAX_BYTES:,}", file=sys.stderr)
        return 1
    NOTEBOOK.write_text(text, encoding="utf-8")
    print(f"{NOTEBOOK.relative_to(REPOSITORY)}: {len(text.encode()):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""examples/quickstart.ipynb runs top to bottom in a real IPython kernel, and every result shows itself."""

import os
import sys
from pathlib import Path

import ipykernel  # noqa: F401  (the kernel: an import error here says the test extra is missing)
import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.slow  # a real IPython kernel

REPOSITORY = Path(__file__).resolve().parents[1]
NOTEBOOK = REPOSITORY / "examples" / "quickstart.ipynb"


WHICH = "import sys, attnviz; print(sys.executable, attnviz.__file__)"


def executed_notebook():
    """The notebook run in a kernel of this test's Python (ipykernel's own "python3") and this checkout's attnviz.

    A last cell, added here, prints which Python and which attnviz the kernel ran.
    """
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(WHICH))
    path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))  # this checkout first
    client = nbclient.NotebookClient(
        notebook, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(REPOSITORY)}}
    )
    client.execute(env={**os.environ, "PYTHONPATH": path})
    return notebook


def test_the_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def test_the_quickstart_notebook_runs_and_every_result_displays_itself():
    notebook = executed_notebook()
    which = notebook.cells.pop()
    assert which.outputs[0].text.split() == [sys.executable, str(REPOSITORY / "attnviz" / "__init__.py")]
    outputs = {
        cell.source.splitlines()[-1]: cell.outputs for cell in notebook.cells if cell.cell_type == "code"
    }  # each cell's last line: the value it shows
    everything = [output for cell_outputs in outputs.values() for output in cell_outputs]
    assert not [output for output in everything if output.output_type == "error"]
    # No warning but the one the notebook announces: the bundled (English) model reads 我想吃酸菜鱼 as [UNK]s,
    # which attnviz.heads says as an AttnvizWarning (docs/python.md).
    warned = {last_line: [output.text for output in cell_outputs if output.get("name") == "stderr"]
              for last_line, cell_outputs in outputs.items()}  # fmt: skip
    (unknown_warning,) = warned.pop("result")
    assert "AttnvizWarning: 5 of 6 tokens" in unknown_warning and "[UNK]" in unknown_warning
    assert not [text for texts in warned.values() for text in texts]

    def shown(last_line: str, kind: str) -> str:
        (result,) = [output for output in outputs[last_line] if output.output_type == "execute_result"]
        assert kind in result.data, f"{last_line}: no {kind} output"
        return result.data[kind]

    heads = shown("result", "text/html")
    assert "我想吃酸菜鱼" in heads and "0:[CLS]" in heads and "1:我" in heads and "7:[SEP]" in heads
    assert '<img src="data:image/png;base64,' in heads and "<script" not in heads
    assert shown('english.figure(head=0)', "image/png")
    trace = shown("trace", "text/html")
    assert "2:animal" in trace and "q_view" in trace and "[1, 10, 12, 32]" in trace
    stats = shown("stats", "text/html")
    assert "3 texts" in stats and "2:animal" in stats and '<img src="data:image/png;base64,' in stats
    report = shown("report", "text/html")
    assert report.startswith('<iframe srcdoc="') and 'sandbox="allow-scripts"' in report
    assert "attnviz-data" in report and "<script" not in report  # the page is the attribute's text, escaped

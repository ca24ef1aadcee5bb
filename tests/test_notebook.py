"""examples/quickstart.ipynb starts with the headline right offline (SmolLM2 over words: 我 / 想 / 吃 / 酸菜鱼) and is
committed with its outputs; run again in a real IPython kernel (examples/build_notebook.py's way), every result
displays itself and the outputs are the committed ones.

What must be the same when run again: the kinds of output of every cell (streams, results, their MIME types); the
text of streams and text/plain exactly (the kernel's temporary file of a warning's cell written "<cell>"); HTML with
each PNG read as its pixel size, other base64 blobs (the report's encoded weights) as a mark, and numbers of three
or more decimals to two significant digits (another CPU's sums may differ in their last digits), and a difference
below 1e-05 written as 3.1e-07 (the trace's agreement table: its size is the CPU's rounding), or as a report's record
holds it (a "..._diff" number, 0.0 on some CPUs), as that bound; PNG outputs of the same pixel size. The pixels themselves are not compared: fonts and matplotlib versions move them.
"""

import base64
import html
import importlib.util
import re
import struct
import sys
from pathlib import Path

import nbformat
import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
NOTEBOOK = REPOSITORY / "examples" / "quickstart.ipynb"
HEADLINE_CALL = 'attnviz.heads("我想吃酸菜鱼", model="smollm2", words=True)'
WHICH = "import sys, attnviz; print(sys.executable, attnviz.__file__)"


def build_script():
    """examples/build_notebook.py, the script that regenerates the committed outputs (not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("build_notebook", REPOSITORY / "examples" / "build_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed():
    return nbformat.read(NOTEBOOK, as_version=4)


def code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def png_size(data: str) -> tuple[int, int]:
    """A base64 PNG's (width, height), from its IHDR chunk."""
    raw = base64.b64decode(data)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", raw[16:24])


def normalised_html(text: str) -> str:
    text = html.unescape(text)  # the report's page is an iframe's srcdoc, escaped
    text = re.sub(r"data:image/png;base64,([A-Za-z0-9+/=]+)", lambda m: "png %dx%d" % png_size(m.group(1)), text)
    text = re.sub(r"[A-Za-z0-9+/]{64,}={0,2}", "<base64>", text)
    text = re.sub(r"\b\d\.\de-(?:0[6-9]|[1-9]\d)\b", "(below 1e-05)", text)  # a float difference: its size is the CPU's
    text = re.sub(r'("\w+_diff":)(-?\d+\.\d+(?:e-?\d+)?)', lambda m: m.group(1) + ("(below 1e-05)" if abs(float(m.group(2))) < 1e-5 else m.group(2)), text)
    return re.sub(r"-?\d+\.\d{3,}(?:e[-+]?\d+)?", lambda m: f"{float(m.group()):.2g}", text)


def normalised_text(text: str) -> str:
    return re.sub(r"\S*ipykernel_\d+[/\\]\d+\.py", "<cell>", text)


def shown(output) -> dict:
    """What must not change in an output when the notebook runs again (the module's docstring)."""
    if output.output_type == "stream":
        return {"stream": output.name, "text": normalised_text(output.text)}
    if output.output_type == "error":
        return {"error": output.ename, "value": output.evalue}
    data = output.data
    kept = {"type": output.output_type, "mime": sorted(data)}
    if "text/plain" in data:
        kept["text/plain"] = normalised_text(data["text/plain"])
    if "text/html" in data:
        kept["text/html"] = normalised_html(data["text/html"])
    if "image/png" in data:
        kept["image/png"] = png_size(data["image/png"])
    return kept


# ---- the committed file (no kernel) --------------------------------------------------------------


def test_the_notebook_starts_with_the_headline_right_offline():
    first_run = code_cells(committed())[1]  # after the imports
    assert HEADLINE_CALL in first_run.source
    assert "smollm2" in committed().cells[0].source or "SmolLM2" in committed().cells[0].source
    assert "examples/build_notebook.py" in committed().cells[0].source  # how to regenerate the outputs


def test_the_committed_notebook_holds_its_outputs_in_order_and_no_volatile_metadata():
    notebook = committed()
    cells = code_cells(notebook)
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    assert all(cell.outputs for cell in cells[1:])  # every cell but the imports shows something
    assert notebook.metadata == build_script().KERNEL_METADATA  # no kernel version
    assert not [cell.id for cell in notebook.cells if "execution" in cell.metadata]  # no timestamps
    assert not [output for cell in cells for output in cell.outputs if output.output_type == "error"]
    assert NOTEBOOK.stat().st_size < build_script().MAX_BYTES


def test_the_committed_headline_shows_the_four_words_and_no_unknown_token():
    headline = code_cells(committed())[1]
    (result,) = [output for output in headline.outputs if output.output_type == "execute_result"]
    page = result.data["text/html"]
    assert all(f"<code>{index}:{word}</code>" in page for index, word in enumerate(["我", "想", "吃", "酸菜鱼"]))
    assert "[UNK]" not in page and '<img src="data:image/png;base64,' in page
    assert not [output for output in headline.outputs if output.output_type == "stream"]  # no warning: SmolLM2 reads it all


# ---- run again in a kernel -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rerun(tmp_path_factory, smollm2_cached):
    """The notebook run again as build_notebook.py runs it, with a last cell that prints which Python and attnviz ran.

    SmolLM2's tokenizer cached in the session's cache first (ATTNVIZ_CACHE, which the kernel inherits), as
    build_notebook.py caches it before the kernel starts: its one-time note is no output of the notebook."""
    notebook = committed()
    notebook.cells.append(nbformat.v4.new_code_cell(WHICH))
    path = tmp_path_factory.mktemp("notebook") / "quickstart.ipynb"
    nbformat.write(notebook, path)
    executed = build_script().executed(path, timeout=300)
    which = executed.cells.pop()
    return executed, which


@pytest.mark.slow  # a real IPython kernel
def test_the_notebook_runs_again_in_this_checkout(rerun):
    executed, which = rerun
    assert which.outputs[0].text.split() == [sys.executable, str(REPOSITORY / "attnviz" / "__init__.py")]
    assert not [output for cell in code_cells(executed) for output in cell.outputs if output.output_type == "error"]


@pytest.mark.slow
def test_the_outputs_run_again_are_the_committed_ones(rerun):
    executed, _ = rerun
    for before, after in zip(code_cells(committed()), code_cells(executed), strict=True):
        assert [shown(output) for output in after.outputs] == [shown(output) for output in before.outputs], before.id


@pytest.mark.slow
def test_every_result_displays_itself_and_only_the_announced_warning_shows(rerun):
    executed, _ = rerun
    outputs = {cell.id: cell.outputs for cell in code_cells(executed)}
    streams = {cell_id: [output.text for output in cell_outputs if output.output_type == "stream" and output.name == "stderr"]
               for cell_id, cell_outputs in outputs.items()}  # fmt: skip
    # No warning but the one the notebook announces: the bundled (English) BERT reads 我想吃酸菜鱼 as [UNK]s.
    (unknown_warning,) = streams.pop("unknown")
    assert "AttnvizWarning: 5 of 6 tokens" in unknown_warning and "[UNK]" in unknown_warning
    assert not [text for texts in streams.values() for text in texts]

    def result(cell_id: str, kind: str):
        (value,) = [output for output in outputs[cell_id] if output.output_type == "execute_result"]
        assert kind in value.data, f"{cell_id}: no {kind} output"
        return value.data[kind]

    heads = result("headline", "text/html")
    assert "我想吃酸菜鱼" in heads and "0:我" in heads and "3:酸菜鱼" in heads
    assert '<img src="data:image/png;base64,' in heads and "<script" not in heads
    assert png_size(result("headline-numbers", "image/png"))[0] > 0
    assert "想 [UNK]" in result("unknown", "text/plain")  # the words the model did not read say so
    trace = result("trace", "text/html")
    assert "2:␣animal" in trace and "q_view" in trace and "[1, 10, 12, 32]" in trace
    stats = result("stats", "text/html")
    assert "3 texts" in stats and "2:␣animal" in stats and '<img src="data:image/png;base64,' in stats
    report = result("report", "text/html")
    assert report.startswith("<iframe srcdoc='") and 'sandbox="allow-scripts"' in report
    assert "attnviz-data" in report and "<script" not in report  # the page is the attribute's text, escaped

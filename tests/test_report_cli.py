"""`attnviz report` and the report.html that `attnviz heads` writes: the files, the texts, the errors."""

import json
import re

import pytest

import attnviz
from attnviz.cli import run
from attnviz.output.runs import MANIFEST

TEXT = "The cat sat on the mat."


def record_of(path) -> dict:
    page = path.read_text(encoding="utf-8")
    (data,) = re.findall(r'<script type="application/json" id="attnviz-data">(.*?)</script>', page, re.S)
    return json.loads(data)


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


@pytest.mark.slow
def test_report_writes_report_html_says_where_and_what_and_is_attnviz_report_s_page(model, tmp_path, capsys):
    assert run(["report", TEXT, "--model", "bundled", "--layer", "1", "--device", "cpu", "--out", str(tmp_path / "run")]) == 0
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == [MANIFEST, "report.html"]
    out = capsys.readouterr().out
    assert f"{tmp_path / 'run'}/" in out and "report.html" in out
    summary = [line for line in out.splitlines() if line.startswith("report.html: ")]
    assert summary == [
        "report.html: 1 text, 9 tokens; all-MiniLM-L6-v2 layer 1 and every layer (6 × 12 heads); "
        f"{round((tmp_path / 'run' / 'report.html').stat().st_size / 1e3)} kB; open it in a browser, no network needed"
    ]
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert page == attnviz.report(TEXT, model="bundled", layer=1, device="cpu").html


@pytest.mark.slow
def test_heads_writes_report_html_unless_no_html(tmp_path):
    assert run(["heads", TEXT, "--model", "bundled", "--layer", "2", "--out", str(tmp_path / "with")]) == 0
    record = record_of(tmp_path / "with" / "report.html")
    attention_json = json.loads((tmp_path / "with" / "attention.json").read_text(encoding="utf-8"))
    (text,) = record["texts"]
    assert {key: text[key] for key in attention_json if key != "attention"} == {
        key: value for key, value in attention_json.items() if key != "attention"
    }
    assert text["layers"] is not None and text["trace"] is not None

    assert run(["heads", TEXT, "--model", "bundled", "--no-html", "--out", str(tmp_path / "without")]) == 0
    assert not (tmp_path / "without" / "report.html").exists() and (tmp_path / "without" / "attention.json").exists()


@pytest.mark.slow
def test_report_file_is_one_report_of_every_line_in_order(tmp_path):
    source = write_lines(tmp_path / "texts.txt", ["the cat", "", "我想吃酸菜鱼", "a dog barked"])
    assert run(["report", "--file", str(source), "--model", "bundled", "--out", str(tmp_path / "run")]) == 0
    record = record_of(tmp_path / "run" / "report.html")
    assert [text["text"] for text in record["texts"]] == ["the cat", "我想吃酸菜鱼", "a dog barked"]


@pytest.mark.slow
def test_heads_file_writes_one_report_of_the_first_64_texts_and_says_so(tmp_path, monkeypatch, capsys):
    from attnviz.output import batch
    from attnviz.output.export import write_attention_json

    def json_only(run, spec, folder, fmt, **drawn):  # the folders are not what this test is about
        folder.mkdir()
        return [write_attention_json(run, spec, folder / "attention.json")]

    monkeypatch.setattr(batch, "write_run_files", json_only)
    source = write_lines(tmp_path / "texts.txt", [f"text {number}" for number in range(66)])
    assert run(["heads", "--file", str(source), "--model", "bundled", "--out", str(tmp_path / "run")]) == 0
    record = record_of(tmp_path / "run" / "report.html")
    assert [text["text"] for text in record["texts"]] == [f"text {number}" for number in range(64)]
    assert "report.html shows the first 64 of the 66 texts" in " ".join(record["notes"])
    assert "note: report.html shows the first 64 of the 66 texts" in capsys.readouterr().err
    assert (tmp_path / "run" / "066-text-65" / "attention.json").exists()

    assert run(["heads", "--file", str(source), "--model", "bundled", "--no-html", "--out", str(tmp_path / "no")]) == 0
    assert not (tmp_path / "no" / "report.html").exists()


@pytest.mark.slow
def test_heads_file_s_report_holds_the_first_texts_whose_maps_fit_and_says_so(tmp_path, monkeypatch, capsys):
    import attnviz.api.report

    monkeypatch.setattr(attnviz.api.report, "MAX_REPORT_WEIGHTS", 3000)  # "the cat" 1152, "a dog barked" 1800, "hi" 648
    source = write_lines(tmp_path / "texts.txt", ["the cat", "a dog barked", "hi"])
    assert run(["heads", "--file", str(source), "--model", "bundled", "--format", "svg", "--out", str(tmp_path / "run")]) == 0
    record = record_of(tmp_path / "run" / "report.html")
    assert [text["text"] for text in record["texts"]] == ["the cat", "a dog barked"]
    note = (
        "report.html shows the first 2 of the 3 texts (a report holds at most 64 texts, whose maps of every layer have "
        "at most 3,000 attention weights; these have 3,600)"
    )
    assert note in " ".join(record["notes"]) and note in " ".join(capsys.readouterr().err.split())
    assert (tmp_path / "run" / "003-hi" / "attention.json").exists()


def test_heads_file_refuses_an_out_folder_with_a_report_html_attnviz_did_not_write(tmp_path, capsys):
    source = write_lines(tmp_path / "texts.txt", ["the cat"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.html").write_text("mine", encoding="utf-8")
    assert run(["heads", "--file", str(source), "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
    assert "already has report.html that attnviz did not write" in capsys.readouterr().err
    assert (tmp_path / "run" / "report.html").read_text(encoding="utf-8") == "mine"


BAD_INPUTS = {
    "text and file": (["hi", "--file", "texts.txt"], "give either a TEXT or --file PATH, not both"),
    "neither": ([], "missing argument 'TEXT'"),
    "blank text": (["  "], "the text is empty"),
    "65 texts": (["--file", "many.txt"], "a report holds at most 64 texts, not 65: split them into several reports"),
    "causal cross-attention": (["hi", "--kv", "there", "--causal"], "--causal and --kv do not go together"),
    "a missing file": (["--file", "nope.txt"], "--file nope.txt: no such file"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_before_loading_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    import attnviz.api.models

    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "texts.txt", ["hello"])
    write_lines(tmp_path / "many.txt", ["hello"] * 65)
    monkeypatch.setattr(attnviz.api.models, "load", lambda *args, **kwargs: pytest.fail("loaded the model"))
    args, message = BAD_INPUTS[case]
    assert run(["report", *args, "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert not (tmp_path / "run").exists()


def test_a_layer_out_of_range_is_an_error_that_writes_nothing(tmp_path, capsys):
    assert run(["report", "hi", "--model", "bundled", "--layer", "6", "--out", str(tmp_path / "run")]) == 2
    assert "layer 6 is out of range" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_failed_report_leaves_no_half_written_run(tmp_path, capsys, monkeypatch):
    import attnviz.html

    def broken(record):
        raise RuntimeError("the page broke")

    monkeypatch.setattr(attnviz.html, "report_page", broken)
    assert run(["heads", TEXT, "--model", "bundled", "--out", str(tmp_path / "run")]) == 1
    assert "the page broke" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # no heatmaps or attention.json without their report

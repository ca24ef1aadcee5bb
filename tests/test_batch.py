"""`attnviz heads --file`: a padded batch gives each text what it gets alone; one folder per text."""

import csv
import io
import json

import numpy as np
import pytest

from attnviz import own_layer, pipeline
from attnviz.cli import run
from attnviz.errors import AttnvizError
from attnviz.output import batch
from attnviz.output.corpus import read_texts
from attnviz.output.runs import MANIFEST
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec

TOLERANCE = 1e-5
# Different lengths, so the batch is padded: 9, 16 and 6 tokens.
TEXTS = [
    "The cat sat on the mat.",
    "The animal didn't cross the street because it was too tired.",
    "Attention is all.",
]


@pytest.fixture(scope="module")
def bert(bundled_bert):
    return bundled_bert


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_read_texts_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_bytes("\ufeffone\r\n\r\n   \n\ttwo  \nthree".encode("utf-8"))  # BOM, CRLF, blank and spaces
    texts = read_texts(str(path))
    assert [(entry.line, entry.text) for entry in texts] == [(1, "one"), (4, "two"), (5, "three")]


def test_dash_reads_standard_input(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("我想吃酸菜鱼\n\n我爱中国\n"))
    assert [entry.text for entry in read_texts("-")] == ["我想吃酸菜鱼", "我爱中国"]


def test_folder_names_keep_the_order_and_are_unique_and_safe():
    texts = [batch.LineText(i, text) for i, text in enumerate(["a b", "a b", "../../etc/passwd", "。。。"], 1)]
    names = batch.text_folder_names(texts)
    assert names == ["001-a-b", "002-a-b", "003-etc-passwd", "004-run"]
    many = batch.text_folder_names([batch.LineText(i, "x") for i in range(1, 1001)])
    assert many[0] == "0001-x" and many[-1] == "1000-x" and many == sorted(many)


def test_each_text_in_a_padded_batch_equals_its_single_run_and_padding_gets_exactly_zero(bert, monkeypatch):
    padded = []  # the raw (B, H, N, N) weights of each forward pass of layer 1, padding included

    def build_and_watch(loaded, spec):
        layer = build_layer(loaded, spec)
        if spec.layer == 1:  # not the layer 0 that runs in BERT's place to make layer 1's input (passes.capture_states)
            layer.register_forward_hook(lambda module, inputs, outputs: padded.append(outputs[1].clone()))
        return layer

    build_layer = own_layer.build_layer
    monkeypatch.setattr(pipeline, "build_layer", build_and_watch)
    chunks = batch.run_in_batches(bert, TEXTS * 2, run_spec(bert, layer=1), batch_size=4)
    runs = [run for chunk in chunks for run in chunk]
    monkeypatch.undo()

    lengths = [9, 16, 6] * 2
    assert [len(run.query_tokens) for run in runs] == lengths
    assert [tuple(weights.shape) for weights in padded] == [(4, 12, 16, 16), (2, 12, 16, 16)]  # two passes
    for i, length in enumerate(lengths):
        weights = padded[i // 4][i % 4]  # (H, N, N) of text i, padded
        assert bool((weights[:, :, length:] == 0).all())  # padded keys: exactly 0, not small
        np.testing.assert_allclose(weights[:, :length, :length].numpy(), runs[i].attention, atol=0, rtol=0)
        (alone,) = run_attention(bert, [TEXTS[i % 3]], run_spec(bert, layer=1))
        np.testing.assert_allclose(runs[i].attention, alone.attention, atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(runs[i].output, alone.output, atol=TOLERANCE, rtol=0)


def heads(*args):
    return run(["heads", *args, "--model", "bundled"])


@pytest.fixture
def json_only(monkeypatch):
    """Write only attention.json per text: for tests about folders and texts, not images (fast)."""
    from attnviz.output.export import write_attention_json

    def write_json(run, spec, folder, fmt, **drawn):
        folder.mkdir()
        return [write_attention_json(run, spec, folder / "attention.json")]

    monkeypatch.setattr(batch, "write_run_files", write_json)


def test_write_batch_reports_each_text_once(bert, tmp_path, json_only, plain_spec):
    texts = [batch.LineText(line, text) for line, text in zip((1, 3), TEXTS[:2])]
    reported = []
    result = batch.write_batch(
        bert, texts, tmp_path, "png", plain_spec, on_text=lambda: reported.append(1), batch_size=1
    )
    assert len(reported) == 2
    assert [row["folder"] for row in result.rows] == sorted(path.name for path in tmp_path.iterdir() if path.is_dir())


@pytest.mark.slow
def test_heads_file_writes_one_folder_per_non_blank_line_with_each_texts_own_weights(bert, tmp_path, capsys):
    source = write_lines(tmp_path / "texts.txt", [TEXTS[0], "", "   ", TEXTS[1], TEXTS[2], ""])
    out = tmp_path / "run"
    assert heads("--file", str(source), "--layer", "2", "--out", str(out)) == 0

    folders = sorted(path for path in out.iterdir() if path.is_dir())
    assert [folder.name for folder in folders] == [
        "001-The-cat-sat-on-the-mat",
        "002-The-animal-didn-t-cross-the-street-becau",  # names are cut at 40 characters
        "003-Attention-is-all",
    ]
    assert sorted(path.name for path in out.iterdir() if path.is_file()) == [MANIFEST, "report.html", "summary.csv", "summary.json"]
    for folder, text in zip(folders, TEXTS):
        assert (folder / "heads.png").exists() and not list(folder.glob("head_*.png"))  # --file draws the grid alone
        record = json.loads((folder / "attention.json").read_text(encoding="utf-8"))
        (alone,) = run_attention(bert, [text], run_spec(bert, layer=2))
        assert record["text"] == text and record["query_tokens"] == alone.query_tokens
        np.testing.assert_allclose(np.array(record["attention"]), alone.attention, atol=TOLERANCE, rtol=0)

    with (out / "summary.csv").open(encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert [row["text"] for row in rows] == TEXTS
    assert [row["line"] for row in rows] == ["1", "4", "5"]
    assert [int(row["tokens"]) for row in rows] == [9, 16, 6]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["layer"] == 2 and [entry["folder"] for entry in summary["texts"]] == [f.name for f in folders]

    shown = capsys.readouterr().out
    assert "3 texts" in shown and "summary.csv" in shown and "The cat sat" in shown
    assert max(len(line) for line in shown.splitlines()) <= 80


@pytest.mark.slow
def test_heads_file_dash_reads_standard_input_into_outputs_stdin(tmp_path, monkeypatch, json_only):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("我想吃酸菜鱼\n\n我爱中国\n"))
    assert heads("--file", "-") == 0
    assert sorted(path.name for path in (tmp_path / "outputs" / "stdin").iterdir()) == [
        MANIFEST,
        "001-我想吃酸菜鱼",
        "002-我爱中国",
        "report.html",
        "summary.csv",
        "summary.json",
    ]


@pytest.mark.slow
def test_heads_file_defaults_to_a_folder_named_after_the_file(tmp_path, monkeypatch, json_only):
    source = write_lines(tmp_path / "zh.txt", ["我爱中国"])
    monkeypatch.chdir(tmp_path)
    assert heads("--file", str(source)) == 0
    assert heads("--file", str(source)) == 0  # a second run never overwrites the first
    assert sorted(path.name for path in (tmp_path / "outputs").iterdir()) == ["zh", "zh-2"]
    assert (tmp_path / "outputs" / "zh" / "001-我爱中国" / "attention.json").exists()


@pytest.mark.slow
def test_heads_file_with_kv_gives_every_text_the_same_keys(tmp_path, json_only):
    source = write_lines(tmp_path / "texts.txt", TEXTS[:2])
    assert heads("--file", str(source), "--kv", "I want to eat fish.", "--out", str(tmp_path / "run")) == 0
    records = [json.loads(path.read_text()) for path in sorted((tmp_path / "run").glob("*/attention.json"))]
    assert [len(record["query_tokens"]) for record in records] == [9, 16]
    assert all(record["key_tokens"] == ["[CLS]", "i", "want", "to", "eat", "fish", ".", "[SEP]"] for record in records)


BAD_FILES = {
    "missing file": (lambda tmp: str(tmp / "nope.txt"), "--file {tmp}/nope.txt: no such file"),
    "a folder": (lambda tmp: str(tmp), "is a folder: give a text file with one text per line"),
    "not UTF-8": (lambda tmp: _write_bytes(tmp / "latin1.txt", "café\n".encode("latin-1")), "is not UTF-8 text"),
    "only blank lines": (lambda tmp: _write_bytes(tmp / "blank.txt", b"\n  \n\t\n"), "has no text: every line is blank"),
    "a line too long": (
        lambda tmp: _write_bytes(tmp / "long.txt", b"hello\n\n" + b"word " * 600 + b"\n"),
        "line 3 has 602 tokens, more than the model's 512 positions; shorten it or pass --truncate",
    ),
}


def _write_bytes(path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
    make_path, message = BAD_FILES[case]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    out = tmp_path / "run"
    assert heads("--file", make_path(inputs), "--out", str(out)) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message.format(tmp=inputs) in error and error.count("\n") == 1, error
    assert not out.exists() and [path.name for path in tmp_path.iterdir()] == ["inputs"]


def test_text_and_file_together_or_neither_are_errors(tmp_path, capsys):
    source = write_lines(tmp_path / "texts.txt", ["hello"])
    assert heads("hello", "--file", str(source), "--out", str(tmp_path / "run")) == 2
    assert capsys.readouterr().err == "error: give either a TEXT or --file PATH, not both\n"
    assert heads("--out", str(tmp_path / "run")) == 2
    assert capsys.readouterr().err.startswith("error: missing argument 'TEXT'")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_rerun_into_the_same_out_replaces_the_earlier_batch_as_a_whole(tmp_path, json_only):
    source = write_lines(tmp_path / "texts.txt", ["hello", "world"])
    assert heads("--file", str(source), "--out", str(tmp_path / "run")) == 0
    write_lines(source, ["again"])
    assert heads("--file", str(source), "--out", str(tmp_path / "run")) == 0
    names = sorted(path.name for path in (tmp_path / "run").iterdir())
    assert names == [MANIFEST, "001-again", "report.html", "summary.csv", "summary.json"]  # 001-hello and 002-world are gone


def test_an_out_folder_with_the_users_own_folders_of_those_names_is_refused(tmp_path, capsys, json_only):
    source = write_lines(tmp_path / "texts.txt", ["hello", "world"])
    (tmp_path / "run" / "001-hello").mkdir(parents=True)
    (tmp_path / "run" / "summary.csv").write_text("mine")
    assert heads("--file", str(source), "--out", str(tmp_path / "run")) == 2
    error = capsys.readouterr().err
    assert "already has 001-hello and 1 more that attnviz did not write" in error and error.count("\n") == 1
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["001-hello", "summary.csv"]


@pytest.mark.slow
def test_a_failure_midway_leaves_nothing(bert, tmp_path, monkeypatch):
    calls = []

    def fail_on_second(run, spec, folder, fmt, **drawn):
        calls.append(folder)
        if len(calls) == 2:
            raise AttnvizError("disk full")
        return write_run_files(run, spec, folder, fmt, **drawn)

    write_run_files = batch.write_run_files
    monkeypatch.setattr(batch, "write_run_files", fail_on_second)
    source = write_lines(tmp_path / "texts.txt", TEXTS)
    assert heads("--file", str(source), "--out", str(tmp_path / "run")) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["texts.txt"]


def test_a_causal_batch_summary_uses_the_relative_entropy_of_stats(bert, tmp_path):
    """rel. in summary.csv divides by log of the keys each query may see, as `stats --causal` does."""
    from attnviz.analysis.statistics import STATISTICS, head_statistics

    (causal,) = run_attention(bert, [TEXTS[0]], run_spec(bert, layer=1, causal=True))
    row = batch.summary_row(1, batch.LineText(1, TEXTS[0]), "001-x", causal)
    per_head = head_statistics(causal.attention, causal.query_tokens, causal=True)[:, STATISTICS.index("relative_entropy")]
    assert row["mean_relative_entropy"] == pytest.approx(per_head.mean(), abs=1e-4)
    assert row["most_focused_relative_entropy"] == pytest.approx(per_head.min(), abs=1e-4)

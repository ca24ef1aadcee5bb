"""`attnviz stats --file` streams its corpus: chunks equal one pass, memory stays flat, a killed run resumes.

Expected numbers come from attnviz.stats over the same texts in memory (one sort over all of them,
the path test_stats_cli.py holds to the per-text definition); stats.json rounds to 7 decimals.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import attnviz
from attnviz.cli import run
from stream_corpus import build_tiny_bert, corpus_lines, stats_numbers, write_corpus

ROUNDED = 1e-6  # stats.json keeps 7 decimals
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model on a shared machine: one thread is fastest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The in-process runs on one thread too: on a loaded 2-core machine, torch's threads mostly wait for each other."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def in_memory(tiny, texts, **settings):
    result = attnviz.stats(texts, model=str(tiny), device="cpu", **settings)
    return result.values.reshape(-1, result.values.shape[-1]), result.js_distance


@pytest.mark.parametrize("settings", [[], ["--causal"], ["--words"]])
def test_streamed_chunks_equal_one_pass_over_all_texts(tiny, tmp_path, settings):
    lines = corpus_lines(50, seed=1, max_words=20)
    lines[3] = lines[17] = "   "  # blank lines are skipped
    corpus = write_corpus(tmp_path / "corpus.txt", lines)
    out = tmp_path / "run"
    assert run(["stats", "--file", str(corpus), "--model", str(tiny), "--chunk-lines", "7", "--js", "--out", str(out), *settings]) == 0
    values, distances, record = stats_numbers(out)
    texts = [line for line in lines if line.strip()]
    keywords = {"causal": "--causal" in settings, "words": "--words" in settings}
    expected_values, expected_distances = in_memory(tiny, texts, **keywords)
    np.testing.assert_allclose(values, expected_values, rtol=0, atol=ROUNDED)
    np.testing.assert_allclose(distances, expected_distances, rtol=0, atol=ROUNDED)
    assert record["texts"] == texts and record["num_texts"] == 48 and record["truncated"] == [None] * 48
    assert record["corpus"] == {
        "file": str(corpus), "bytes": corpus.stat().st_size, "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest(),
        "texts": 48, "truncated": 0,
    }  # fmt: skip


def test_standard_input_streams_too(tiny, tmp_path, monkeypatch):
    texts = corpus_lines(20, seed=2)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(texts) + "\n"))
    assert run(["stats", "--file", "-", "--model", str(tiny), "--chunk-lines", "6", "--out", str(tmp_path / "run")]) == 0
    values, distances, record = stats_numbers(tmp_path / "run")
    expected_values, expected_distances = in_memory(tiny, texts)
    np.testing.assert_allclose(values, expected_values, rtol=0, atol=ROUNDED)
    assert record["texts"] == texts and record["corpus"]["file"] == "-" and record["corpus"]["sha256"] is None


def peak_rss_kib(args: list[str]) -> int:
    """Peak resident memory of `attnviz ...args` in its own process (os.wait4's ru_maxrss, KiB on Linux)."""
    process = subprocess.Popen([sys.executable, "-m", "attnviz", *args], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, process.stderr.read().decode()
    return usage.ru_maxrss


@pytest.mark.slow
def test_memory_stays_flat_from_10k_to_100k_lines(tiny, tmp_path):
    """Reading the corpus whole (as stats did) put 163 MiB more on 100,000 lines than on 10,000; streamed, under 1 MiB."""
    lines = corpus_lines(100_000, seed=3)
    small, large = write_corpus(tmp_path / "small.txt", lines[:10_000]), write_corpus(tmp_path / "large.txt", lines)
    peaks = {
        name: peak_rss_kib(["stats", "--file", str(path), "--model", str(tiny), "--out", str(tmp_path / name)])
        for name, path in (("small", small), ("large", large))
    }
    assert peaks["large"] - peaks["small"] < 16 * 1024, peaks  # KiB: a list of 100,000 texts alone is ~10 MiB
    _, _, record = stats_numbers(tmp_path / "large")
    assert record["num_texts"] == 100_000 and record["texts"] is None and record["truncated"] is None  # too many to list
    assert record["corpus"]["sha256"] == hashlib.sha256(large.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint_to_the_same_numbers(tiny, tmp_path):
    lines = corpus_lines(4000, seed=4, max_words=12)
    corpus = write_corpus(tmp_path / "corpus.txt", lines)
    checkpoint = tmp_path / "stats.ckpt.npz"
    common = ["stats", "--file", str(corpus), "--model", str(tiny), "--chunk-lines", "100", "--js"]  # the JS sums resume too
    killed = subprocess.Popen(
        [sys.executable, "-m", "attnviz", *common, "--checkpoint", str(checkpoint), "--out", str(tmp_path / "killed")],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not checkpoint.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    with np.load(checkpoint) as stored:
        progress = json.loads(str(stored["meta"]))["progress"]
    assert 0 < progress["lines_consumed"] < len(lines)  # killed mid-run, after a chunk or more
    assert not (tmp_path / "killed").exists()  # nothing written but the checkpoint
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no temporary left behind

    assert run([*common, "--checkpoint", str(checkpoint), "--resume", "--out", str(tmp_path / "resumed")]) == 0
    assert run([*common, "--out", str(tmp_path / "whole")]) == 0
    resumed, whole = stats_numbers(tmp_path / "resumed"), stats_numbers(tmp_path / "whole")
    np.testing.assert_allclose(resumed[0], whole[0], rtol=0, atol=ROUNDED)
    np.testing.assert_allclose(resumed[1], whole[1], rtol=0, atol=ROUNDED)
    assert resumed[2]["num_texts"] == whole[2]["num_texts"] == 4000 and resumed[2]["corpus"] == whole[2]["corpus"]
    assert not checkpoint.exists()  # the run is done: nothing left to resume


@pytest.fixture
def checkpointed(tiny, tmp_path):
    """A corpus and a checkpoint of it, made by a run killed before it finished: (corpus, checkpoint)."""
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(2000, seed=5))
    return corpus, killed_after_its_first_checkpoint(tiny, corpus, tmp_path)


def killed_after_its_first_checkpoint(tiny, corpus: Path, folder: Path) -> Path:
    """The checkpoint of `stats --file corpus`, run in a fresh process and killed once it has written one."""
    checkpoint = folder / "ckpt.npz"
    process = subprocess.Popen(
        [sys.executable, "-m", "attnviz", "stats", "--file", str(corpus), "--model", str(tiny), "--chunk-lines", "100",
         "--checkpoint", str(checkpoint), "--out", str(folder / "never")],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while not checkpoint.exists() and process.poll() is None:
        time.sleep(0.005)
    process.kill()
    process.wait()
    assert checkpoint.exists()
    return checkpoint


def refused(args, capsys) -> str:
    assert run(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    return error


@pytest.mark.slow
def test_resume_refuses_other_settings_or_another_file(tiny, tmp_path, checkpointed, capsys):
    corpus, checkpoint = checkpointed
    args = ["stats", "--file", str(corpus), "--model", str(tiny), "--checkpoint", str(checkpoint), "--resume", "--out", str(tmp_path / "o")]
    assert "was made with other settings (causal: False, not True)" in refused([*args, "--causal"], capsys)
    assert "was made with other settings (words" in refused([*args, "--words"], capsys)
    assert "was made with other settings (js: False, not True)" in refused([*args, "--js"], capsys)
    with corpus.open("a", encoding="utf-8") as stream:
        stream.write("one more line\n")
    assert "was made from another file" in refused(args, capsys)
    assert not (tmp_path / "o").exists()


def test_checkpoint_misuse_is_one_line_before_any_work(tiny, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(5))
    base = ["stats", "--file", str(corpus), "--model", str(tiny)]
    taken = tmp_path / "taken.npz"
    taken.write_bytes(b"not a checkpoint")
    assert "--resume needs --checkpoint PATH" in refused([*base, "--resume"], capsys)
    assert "already exists: add --resume" in refused([*base, "--checkpoint", str(taken)], capsys)
    assert "is not an attnviz stats checkpoint" in refused([*base, "--checkpoint", str(taken), "--resume"], capsys)
    assert "no checkpoint at" in refused([*base, "--checkpoint", str(tmp_path / "none.npz"), "--resume"], capsys)
    assert "standard input cannot be read again" in refused(["stats", "--file", "-", "--checkpoint", str(tmp_path / "c.npz")], capsys)
    assert "goes with --file" in refused(["stats", "hi", "--checkpoint", str(tmp_path / "c.npz")], capsys)


def test_bad_lines_are_named_by_number_and_nothing_is_written(tiny, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\nstill fine\ncaf\xe9\n")
    assert "line 4 is not UTF-8 text (byte 4 of the line)" in refused(["stats", "--file", str(bad), "--out", str(out)], capsys)
    long_line = " ".join(["cat"] * 80)  # 82 tokens, more than the tiny model's 64 positions
    lines = [*corpus_lines(30), long_line]
    too_long = write_corpus(tmp_path / "long.txt", lines)
    args = ["stats", "--model", str(tiny), "--chunk-lines", "8", "--out", str(out)]
    assert "line 31 has 82 tokens" in refused([*args, "--file", str(too_long)], capsys)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))  # found in its chunk, after 3 chunks ran
    assert "line 31 has 82 tokens" in refused([*args, "--file", "-"], capsys)
    assert not out.exists()


def test_engine_ray_without_ray_installed_is_one_line(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where the extra is not installed
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(5))
    error = refused(["stats", "--file", str(corpus), "--model", str(tiny), "--engine", "ray", "--out", str(tmp_path / "o")], capsys)
    assert 'pip install "attnviz[ray]"' in error and not (tmp_path / "o").exists()


def test_importing_attnviz_and_stats_help_import_neither_ray_nor_torch():
    script = (
        "import sys, attnviz\nfrom attnviz.cli import run\nrun(['stats', '--help'])\n"
        "print(sorted({'ray', 'torch'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "--engine" in result.stdout and result.stdout.splitlines()[-1] == "[]"


def test_the_progress_bar_estimates_the_time_left_or_shows_count_and_rate():
    from rich.console import Console

    from attnviz.render.progress import progress_bar

    shown = {}
    for name, total in (("known", 40), ("streamed", None)):
        console = Console(record=True, force_terminal=True, width=100)
        with progress_bar(console, total, "measuring heads", 6) as advance:
            for _ in range(4):
                advance(5)
                time.sleep(0.02)
            console.print("")  # the live display's last frame stays in the recording
        shown[name] = console.export_text()
    assert re.search(r"20/40 \d+:\d\d:\d\d", shown["known"]), shown  # done/total, then the time left
    assert re.search(r"20 texts [\d.,]+ texts/s", shown["streamed"]), shown  # no total: the count and the rate


@pytest.fixture(scope="module")
def one_checkpoint(tiny, tmp_path_factory):
    """A corpus of 3000 lines and the checkpoint of a run killed after its first chunks (made once: each test damages a copy)."""
    folder = tmp_path_factory.mktemp("checkpointed")
    corpus = write_corpus(folder / "corpus.txt", corpus_lines(3000, seed=6))
    return corpus, killed_after_its_first_checkpoint(tiny, corpus, folder).read_bytes()


def without(name):
    return lambda arrays, meta: arrays.pop(name)


def set_array(name, make):
    return lambda arrays, meta: arrays.__setitem__(name, make(arrays[name]))


def set_progress(name, make):
    return lambda arrays, meta: meta["progress"].__setitem__(name, make(meta["progress"][name]))


def fewer_texts(arrays, meta):
    """Counts and num_texts edited alike: the sums would be averaged over texts they do not hold."""
    arrays["counts"] = arrays["counts"] - 7
    meta["progress"]["num_texts"] -= 7


def nan_at(name):
    def damage(arrays, meta):
        arrays[name] = arrays[name].copy()
        arrays[name][0, 1, 1] = np.nan

    return damage


DAMAGES = {
    # what is left out, or of another shape or type
    "no counts": (without("counts"), "it lacks the array counts"),
    "no value_sums": (without("value_sums"), "it lacks the array value_sums"),
    "no js_sums": (without("js_sums"), "it lacks the array js_sums"),
    "no progress": (lambda arrays, meta: meta.pop("progress"), "it has no progress entry"),
    "a progress entry missing": (lambda arrays, meta: meta["progress"].pop("notes"), "its progress lacks notes"),
    "an array too many": (lambda arrays, meta: arrays.__setitem__("extra", np.zeros(3)), "it has an unknown array extra"),
    "a layer too few": (set_array("value_sums", lambda sums: sums[:1]), r"value_sums are float64 of shape \(1, 4, 10\), not float64 of shape \(2, 4, 10\)"),
    "float32 sums": (set_array("value_sums", lambda sums: sums.astype(np.float32)), r"value_sums are float32 of shape \(2, 4, 10\)"),
    "js_sums of 3 heads": (set_array("js_sums", lambda sums: sums[:, :3, :3]), r"js_sums are float64 of shape \(2, 3, 3\)"),
    "counts as floats": (set_array("counts", lambda counts: counts.astype(np.float64)), r"counts are float64 of shape \(2,\)"),
    "counts as text": (set_array("counts", lambda counts: counts.astype(str)), r"counts are <U\d+ of shape \(2,\)"),
    "counts of 3 layers": (set_array("counts", lambda counts: np.append(counts, counts[0])), r"counts are int64 of shape \(3,\)"),
    "causal flipped": (set_array("causal", lambda flag: np.array(True)), "causal is array\\(True\\), not this run's False"),
    "causal as a number": (set_array("causal", lambda flag: np.array(0)), "causal is array\\(0\\), not this run's False"),
    "num_texts as text": (set_progress("num_texts", lambda count: "many"), "its progress num_texts is 'many', not a count"),
    "a negative line": (set_progress("lines_consumed", lambda line: -1), "its progress lines_consumed is -1, not a count"),
    "settings not an object": (lambda arrays, meta: meta.__setitem__("settings", []), "its settings are not a JSON object"),
    # edited by hand: resumed, the numbers would be wrong
    "counts edited": (set_array("counts", lambda counts: counts - 7), r"counts are \[(\d+), \1\], not the \d+ texts"),
    "counts and num_texts edited alike": (fewer_texts, r"its progress counts \d+ texts, but lines 1 to \d+ of the file hold \d+"),
    "no text read": (lambda arrays, meta: meta["progress"].__setitem__("num_texts", 0), "its progress counts no text read"),
    "NaN in value_sums": (nan_at("value_sums"), "value_sums hold NaN or infinity"),
    "infinity in js_sums": (set_array("js_sums", lambda sums: sums + np.inf), "js_sums hold NaN or infinity"),
    "sums ten times": (set_array("value_sums", lambda sums: sums * 10), "a mean relative_entropy of [\\d.]+, out of its range"),
    "negative sums": (set_array("value_sums", lambda sums: -sums), "a mean entropy of -[\\d.]+, out of its range"),
    "JS sums without --js": (set_array("js_sums", lambda sums: sums + 0.5), "js_sums are not zeros without --js"),
    "past the file's end": (set_progress("lines_consumed", lambda line: 3001), "read up to line 3001, which is not a line of text"),
    "a text edited": (set_progress("texts", lambda texts: [*texts[:-1], "edited"]), "its progress lists texts that are not the file's"),
    "the first text edited": (set_progress("first_text", lambda text: "edited"), "its first text is not the file's first text"),
    "texts cut, none listed": (set_progress("num_truncated", lambda count: 5), "its progress counts 5 texts cut, but lists 0"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_resume_refuses_a_damaged_or_edited_checkpoint_in_one_line_naming_what_is_wrong(damage, tiny, one_checkpoint, tmp_path, capsys):
    corpus, stored = one_checkpoint
    checkpoint = tmp_path / "ckpt.npz"
    checkpoint.write_bytes(stored)
    with np.load(checkpoint) as loaded:
        arrays = {name: loaded[name] for name in loaded.files}
    meta = json.loads(str(arrays.pop("meta")))
    change, expected = DAMAGES[damage]
    change(arrays, meta)
    with checkpoint.open("wb") as stream:
        np.savez(stream, meta=np.array(json.dumps(meta)), **arrays)
    damaged = checkpoint.read_bytes()
    out = tmp_path / "run"
    error = refused(["stats", "--file", str(corpus), "--model", str(tiny), "--checkpoint", str(checkpoint), "--resume", "--out", str(out)], capsys)
    assert error.startswith(f"error: --resume: {checkpoint} is damaged: "), error
    assert re.search(expected, error), error
    assert error.endswith("; remove it and start afresh without --resume\n")
    assert checkpoint.read_bytes() == damaged and not out.exists()


@pytest.mark.parametrize("content", ["empty", "half", "meta a list", "meta not JSON"])
def test_resume_refuses_what_is_no_checkpoint_at_all_in_one_line(content, tiny, one_checkpoint, tmp_path, capsys):
    """An empty file was taken for Ctrl-C ("interrupted", exit 130): numpy's EOFError is what click reads as one."""
    corpus, stored = one_checkpoint
    checkpoint = tmp_path / "ckpt.npz"
    with np.load(io.BytesIO(stored)) as loaded:
        arrays = {name: loaded[name] for name in loaded.files if name != "meta"}
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array("[1, 2]" if content == "meta a list" else "{not json"), **arrays)
    checkpoint.write_bytes({"empty": b"", "half": stored[: len(stored) // 2]}.get(content, buffer.getvalue()))
    args = ["stats", "--file", str(corpus), "--model", str(tiny), "--checkpoint", str(checkpoint), "--resume", "--out", str(tmp_path / "o")]
    assert re.fullmatch(f"error: --resume: {checkpoint} is not an attnviz stats checkpoint( \\(version 3\\))?\n", refused(args, capsys))


@pytest.mark.slow
def test_an_untouched_copy_of_that_checkpoint_resumes(tiny, one_checkpoint, tmp_path):
    """The checks refuse damage, not a checkpoint as attnviz writes it."""
    corpus, stored = one_checkpoint
    checkpoint = tmp_path / "ckpt.npz"
    checkpoint.write_bytes(stored)
    args = ["stats", "--file", str(corpus), "--model", str(tiny), "--chunk-lines", "500"]
    assert run([*args, "--checkpoint", str(checkpoint), "--resume", "--out", str(tmp_path / "resumed")]) == 0
    assert run([*args, "--out", str(tmp_path / "whole")]) == 0
    resumed, whole = stats_numbers(tmp_path / "resumed"), stats_numbers(tmp_path / "whole")
    np.testing.assert_allclose(resumed[0], whole[0], rtol=0, atol=ROUNDED)
    assert resumed[2]["num_texts"] == whole[2]["num_texts"] == 3000

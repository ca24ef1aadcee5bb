"""A long text's whole map is a working file: a temporary .npy, in the run's folder only when asked.

Past the large-map size (here --memory 1 makes the bundled BERT's 442 tokens "long": a (12, 442, 442) float32
map of 9.4 MB) the map is written block by block into a .npy in a folder of its own in the temporary directory
(tempfile.tempdir, pointed here at a test folder). `heads` writes it into the output folder as attention.npy only
with --save-map, and a Python result's save always; without, attention.json says it was not saved, and how to
get it, and the command says so in one line. The temporary folder goes when the command ends (also on an error or
a signal), and for the Python API when the last view of the map goes.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch

import attnviz

LONG_TEXT = "The cat sat on the mat because it was tired. " * 40  # 442 BERT tokens
MAP_SHAPE = (12, 442, 442)
MAP_BYTES = 4 * 12 * 442 * 442  # float32: 9.4 MB
FILES_BUDGET = 30 * 10**6  # bytes: the budget for the files of a long run


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


@pytest.fixture
def temporary(tmp_path, monkeypatch):
    """The temporary directory of this process's runs (tempfile.tempdir: the default of every tempfile function)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def reference_attention(reference_bert, text: str, layer: int) -> np.ndarray:
    tokenizer, bert = reference_bert
    with torch.no_grad():
        return bert(**tokenizer([text], return_tensors="pt"), output_attentions=True).attentions[layer][0].numpy()


def folder_files(folder) -> dict[str, int]:
    """Every file under folder, hidden ones too, and its size in bytes."""
    return {os.path.relpath(os.path.join(root, name), folder): os.path.getsize(os.path.join(root, name))
            for root, _, names in os.walk(folder) for name in names}  # fmt: skip


@pytest.mark.slow
def test_a_long_results_attention_reads_its_rows_as_long_as_the_result_or_a_slice_of_it_lives(model, reference_bert, temporary, tmp_path):
    result = attnviz.heads(LONG_TEXT, model=model, layer=2, memory=1)
    expected = reference_attention(reference_bert, LONG_TEXT, 2)[1, 7]  # head 1, row 7
    assert result.attention.shape == MAP_SHAPE and len(os.listdir(temporary)) == 1  # the map's folder
    first = np.array(result.attention[1, 7])
    gc.collect()
    assert np.array_equal(result.attention[1, 7], first) and np.allclose(first, expected, atol=1e-5, rtol=0)

    # save() puts attention.npy in the folder; removing that folder leaves the result's own file in place.
    written = result.save(tmp_path / "saved")
    assert tmp_path / "saved" / "attention.npy" in written
    assert np.array_equal(np.load(tmp_path / "saved" / "attention.npy")[1, 7], first)
    assert os.stat(tmp_path / "saved" / "attention.npy").st_nlink == 2  # one file system: a hard link, no byte copied
    for path in (tmp_path / "saved").iterdir():
        path.unlink()
    gc.collect()
    assert np.array_equal(result.attention[1, 7], first)

    head = result.attention[1]  # (Nq, Nk): a view of the memmap keeps its file
    del result
    gc.collect()
    assert np.array_equal(head[7], first) and len(os.listdir(temporary)) == 1
    del head
    gc.collect()
    assert os.listdir(temporary) == []


@pytest.mark.slow
def test_a_long_heads_run_writes_its_map_only_with_save_map_and_says_so(reference_bert, temporary, tmp_path, capsys):
    from attnviz.cli import run

    argv = ["heads", LONG_TEXT, "--model", "bundled", "--layer", "2", "--memory", "1", "--figures", "grid"]
    assert run([*argv, "--out", str(tmp_path / "plain")]) == 0
    printed = capsys.readouterr()
    assert os.listdir(temporary) == []  # the command's map is gone with the command: no garbage collection needed
    assert run([*argv, "--save-map", "--out", str(tmp_path / "saved")]) == 0
    assert os.listdir(temporary) == []

    plain, saved = folder_files(tmp_path / "plain"), folder_files(tmp_path / "saved")
    assert "attention.npy" not in plain and set(saved) - set(plain) == {"attention.npy"}
    assert sum(plain.values()) <= FILES_BUDGET and max(plain.values()) < MAP_BYTES  # no file holds the map
    assert saved["attention.npy"] >= MAP_BYTES
    stored = np.load(tmp_path / "saved" / "attention.npy", mmap_mode="r")
    assert stored.shape == MAP_SHAPE and np.allclose(stored, reference_attention(reference_bert, LONG_TEXT, 2), atol=1e-5, rtol=0)

    line = "the whole map (9 MB) was not saved; --save-map writes attention.npy"
    assert line in " ".join((printed.out + printed.err).split())
    record = json.loads((tmp_path / "plain" / "attention.json").read_text(encoding="utf-8"))
    assert record["attention"] is None and record["attention_file"] is None
    assert record["attention_shape"] == list(MAP_SHAPE) and record["attention_dtype"] == "float32"
    assert record["attention_note"].startswith(line) and "result.save(folder)" in record["attention_note"]
    named = json.loads((tmp_path / "saved" / "attention.json").read_text(encoding="utf-8"))
    assert named["attention_file"] == "attention.npy" and "attention_note" not in named
    assert {key: value for key, value in record.items() if not key.startswith("attention")} == {
        key: value for key, value in named.items() if not key.startswith("attention")
    }  # every other field the same


@pytest.mark.slow
def test_a_long_heads_file_run_saves_each_long_texts_map_only_with_save_map(temporary, tmp_path, capsys):
    from attnviz.cli import run

    (tmp_path / "texts.txt").write_text(f"The cat sat.\n{LONG_TEXT}\n{LONG_TEXT}\n", encoding="utf-8")
    argv = ["heads", "--file", str(tmp_path / "texts.txt"), "--model", "bundled", "--memory", "1", "--no-html", "--figures", "none"]
    assert run([*argv, "--out", str(tmp_path / "batch")]) == 0
    printed = capsys.readouterr()
    assert not any(name.endswith("attention.npy") for name in folder_files(tmp_path / "batch"))
    assert "the whole maps of 2 long texts (19 MB) were not saved" in " ".join((printed.out + printed.err).split())
    assert run([*argv, "--save-map", "--out", str(tmp_path / "saved")]) == 0
    maps = sorted(name for name in folder_files(tmp_path / "saved") if name.endswith("attention.npy"))
    assert [name.split("-", 1)[0] for name in maps] == ["002", "003"]  # the long texts' folders, not the short one's
    assert os.listdir(temporary) == []


@pytest.mark.slow
def test_a_long_run_that_fails_leaves_no_file_in_its_folder_and_no_temporary_map(temporary, tmp_path):
    from attnviz.cli import run

    out = tmp_path / "run"
    (out / "attention.json").mkdir(parents=True)  # a folder of the user's where the run's file goes: refused when publishing
    argv = ["heads", LONG_TEXT, "--model", "bundled", "--memory", "1", "--figures", "none", "--no-html", "--save-map"]
    assert run([*argv, "--out", str(out)]) == 2
    assert folder_files(out) == {} and os.listdir(out) == ["attention.json"]
    assert os.listdir(temporary) == []


@pytest.mark.slow
def test_a_long_run_interrupted_by_ctrl_c_leaves_no_file_and_no_temporary_map(tmp_path):
    """SIGINT once the map's temporary folder exists (the figures and the report still to draw): nothing is left."""
    temporary, out = tmp_path / "tmp", tmp_path / "run"
    temporary.mkdir()
    command = [sys.executable, "-m", "attnviz", "heads", LONG_TEXT, "--model", "bundled", "--memory", "1", "--out", str(out)]
    process = subprocess.Popen(command, env={**os.environ, "TMPDIR": str(temporary)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not any(name.startswith("attnviz-map-") for name in os.listdir(temporary)):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its map was made"
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert b"interrupted: nothing was written" in stderr
    assert os.listdir(temporary) == [] and not out.exists()


@pytest.mark.parametrize("causal", [False, True])
def test_a_long_results_head_summaries_read_in_blocks_equal_the_whole_maps(model, temporary, causal):
    from attnviz.analysis.statistics import summarize_heads

    result = attnviz.heads(LONG_TEXT, model=model, layer=2, memory=1, causal=causal)
    assert isinstance(result.attention, np.memmap)
    expected = summarize_heads(np.array(result.attention, dtype=np.float64), causal)
    for found, whole in zip(result.summaries, expected, strict=True):
        assert found.entropy == pytest.approx(whole.entropy, abs=1e-6)
        assert found.relative_entropy == pytest.approx(whole.relative_entropy, abs=1e-6)
        assert found.mean_max == pytest.approx(whole.mean_max, abs=1e-6)
        assert found.top_keys == whole.top_keys



def test_a_causal_map_on_disk_is_the_whole_maps_weights_and_exact_zeros_past_each_query(model, temporary):
    """Its blocks write each row's keys up to its query alone: the rest of the file, never written, reads as 0."""
    on_disk = attnviz.heads(LONG_TEXT, model=model, layer=2, memory=1, causal=True)
    whole = attnviz.heads(LONG_TEXT, model=model, layer=2, causal=True)
    assert isinstance(on_disk.attention, np.memmap) and not isinstance(whole.attention, np.memmap)
    stored = np.array(on_disk.attention)
    np.testing.assert_allclose(stored, whole.attention.numpy(), rtol=0, atol=1e-6)
    future = np.triu(np.ones(stored.shape[1:], dtype=bool), k=1)
    assert (stored[:, future] == 0).all() and (stored[:, ~future] > 0).all()


def test_map_rows_read_into_one_buffer_are_the_maps_rows_and_a_short_file_is_an_error(tmp_path):
    """run_data.map_rows with out (rows_buffer, as the figures read each head): the very rows of the .npy, head after
    head into the same array; a file cut short is an OSError, never rows of garbage; a map in memory is a view."""
    from attnviz.run_data import map_rows, rows_buffer

    weights = np.random.default_rng(3).random((3, 40, 50), dtype=np.float32)
    np.save(tmp_path / "map.npy", weights)
    mapped = np.load(tmp_path / "map.npy", mmap_mode="r")
    out = rows_buffer(mapped)
    assert out.shape == (40, 50) and rows_buffer(weights) is None
    for head in (2, 0, 1):
        np.testing.assert_array_equal(map_rows(mapped, head, out=out), weights[head])
        np.testing.assert_array_equal(map_rows(mapped, head, 7, 19, out=out), weights[head, 7:19])
    assert np.shares_memory(map_rows(mapped, 1, out=out), out)
    assert np.shares_memory(map_rows(weights, 1, out=out), weights)
    with open(tmp_path / "map.npy", "r+b") as file:
        file.truncate(os.path.getsize(tmp_path / "map.npy") - 4)
    with pytest.raises(OSError, match="ends before row 40 of head 2"):
        map_rows(mapped, 2, out=out)

"""Sturdiness: arbitrary text, hostile names, Ctrl-C, and model folders that try to run code."""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnviz.cli import run
from attnviz.errors import AttnvizError
from attnviz.loading import bundled_model_path, load_model

# Texts a user might paste: emoji, combining marks, right-to-left scripts, zero-width
# characters, control characters, very long words, CJK mixed with Latin.
TRICKY = st.sampled_from(
    ["👍🏽", "e\u0301", "مرحبا", "שלום", "\u200b", "\u200d", "\x00", "\x1b[31m", "\n", "\t", "我想吃", "abc",
     "x" * 300, "../", "/", "..", "\\", "~", "%", "$HOME", "[CLS]", "[SEP]", "\ufeff", "\U0010ffff"]
)
TEXTS = st.one_of(st.text(max_size=40), st.lists(TRICKY, max_size=6).map("".join))


def files_under(folder):
    return sorted(path.relative_to(folder) for path in folder.rglob("*") if path.is_file())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_any_text_either_succeeds_with_valid_outputs_or_fails_in_one_line(text, tmp_path_factory, capsys, monkeypatch):
    workdir = tmp_path_factory.mktemp("run")
    monkeypatch.chdir(workdir)
    code = run(["heads", text, "--model", "bundled", "--heads", "2"])
    error = capsys.readouterr().err

    assert code in (0, 2), error  # 1 would be an unexpected exception
    written = files_under(workdir)
    if code == 2:
        assert error.startswith("error: ") and error.count("\n") == 1 and written == []
        return
    folders = {path.parts[:2] for path in written}
    assert len(folders) == 1 and next(iter(folders))[0] == "outputs"  # one run folder, inside outputs/
    folder = workdir.joinpath(*next(iter(folders)))
    assert sorted(path.name for path in folder.iterdir()) == ["attention.json", "head_00.png", "head_01.png", "heads.png"]
    record = json.loads((folder / "attention.json").read_text(encoding="utf-8"))
    assert record["text"] == text
    np.testing.assert_allclose(np.array(record["attention"]).sum(-1), 1, atol=1e-5)


@pytest.mark.parametrize("text", ["../../x", "/etc/passwd", "x" * 10_000])
def test_a_hostile_text_keeps_its_run_folder_inside_outputs(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(["heads", text, "--model", "bundled", "--heads", "1", "--truncate"]) == 0
    (folder,) = (tmp_path / "outputs").iterdir()
    assert folder.parent == tmp_path / "outputs" and len(folder.name) <= 40
    assert [path for path in tmp_path.iterdir()] == [tmp_path / "outputs"]


def test_ctrl_c_while_writing_leaves_no_half_written_file(tmp_path):
    """SIGINT once the run has started writing: no run folder, no staging folder, exit 130."""
    target = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "attnviz", "heads", "the cat sat on the mat", "--model", "bundled", "--out", str(target)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(path.suffix == ".png" for path in tmp_path.rglob("*.png")):  # writing has begun
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it was interrupted"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, error = process.communicate(timeout=60)

    assert process.returncode == 130, error
    assert error.strip() == "interrupted: nothing was written"
    assert list(tmp_path.iterdir()) == []


def test_a_pickle_that_runs_code_is_never_unpickled_without_allow_pickle(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(bundled_model_path(), folder)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"

    class RunsCode:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(RunsCode()))
    with pytest.raises(AttnvizError, match="pickle file that can run code"):
        load_model(str(folder))
    assert not marker.exists()


def test_remote_code_in_a_model_folder_is_never_run(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(bundled_model_path(), folder)
    marker = tmp_path / "code-ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    for name in ("config.json", "tokenizer_config.json"):
        config = json.loads((folder / name).read_text())
        config["auto_map"] = {"AutoModel": "evil.EvilModel", "AutoTokenizer": ["evil.EvilTokenizer", None]}
        (folder / name).write_text(json.dumps(config))
    try:
        load_model(str(folder))
    except AttnvizError:
        pass  # refusing the folder is fine too; running its code is not
    assert not marker.exists()
    assert "trust_remote_code" not in (tmp_path / "model" / "config.json").read_text()


def test_no_attnviz_module_ever_passes_trust_remote_code():
    import attnviz

    package = os.path.dirname(attnviz.__file__)
    for name in os.listdir(package):
        if name.endswith(".py"):
            source = open(os.path.join(package, name), encoding="utf-8").read()
            assert "trust_remote_code=True" not in source.replace(" ", ""), name

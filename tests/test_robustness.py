"""Sturdiness: arbitrary text, hostile names, signals, pipes, and model folders that try to run code."""

import json
import os
import pickle
import random
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
from attnviz.models.loading import bundled_model_path, load_model

# Texts a user might paste: emoji, combining marks, right-to-left scripts, zero-width
# characters, control characters, very long words, CJK mixed with Latin.
pytestmark = pytest.mark.slow  # real runs in subprocesses, signals at random moments, hypothesis

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
    names = [".attnviz-files.json", "attention.json", "head_00.png", "head_01.png", "heads.png", "report.html"]
    assert sorted(path.name for path in folder.iterdir()) == names
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


def start(*args, **options):
    """attnviz as a new process, as a user starts it."""
    return subprocess.Popen(
        [sys.executable, "-m", "attnviz", *args, "--model", "bundled"],
        stdout=options.pop("stdout", subprocess.DEVNULL), stderr=subprocess.PIPE, text=True, **options
    )


def staged(folder, pattern="*"):
    """Whether a staging folder under folder holds pattern yet (folders come and go as the run checks its --out)."""
    try:
        return any(folder.glob(f"**/*.partial/{pattern}"))
    except FileNotFoundError:
        return False


def wait_for(condition, process, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it was interrupted"
        time.sleep(0.005)


def processes_naming(marker):
    """pids of live processes whose command line holds marker."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as stream:
                if marker.encode() in stream.read():
                    with open(f"/proc/{entry}/stat") as stat:
                        if stat.read().split(") ")[-1][0] != "Z":  # a zombie is dead already
                            found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def assert_no_process_left(marker):
    deadline = time.monotonic() + 5  # a killed child takes a moment to go
    while processes_naming(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_naming(marker) == []


def assert_whole_or_nothing(folder, code, error, names):
    """Exit 0 with exactly the run's files, or the signal's exit code and no trace of the run."""
    if code == 0 or "written in full" in error:  # the signal came as the files were moved into place
        assert sorted(path.name for path in folder.iterdir()) == sorted(names), error
    else:
        assert error.strip() == "interrupted: nothing was written", error
        assert not folder.exists() or list(folder.iterdir()) == [], list(folder.iterdir())


HEADS_FILES = [
    ".attnviz-files.json", "attention.json", *(f"head_{head:02d}.png" for head in range(12)), "heads.png", "report.html"
]  # fmt: skip


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("moment", ["early", "writing"])
def test_a_signal_at_a_random_moment_leaves_a_whole_run_or_nothing(signal_number, moment, tmp_path):
    """early: during the imports or the model's load; writing: once the staging folder has files.

    No staging folder, no half-written file, no process left; exit 128 + the signal's number.
    """
    rng = random.Random(f"{signal_number.name} {moment}")  # seeded: a failing moment comes back on a rerun
    delay = rng.uniform(0.15, 1.5) if moment == "early" else rng.uniform(0, 0.3)
    target = tmp_path / "run"
    process = start("heads", "the cat sat on the mat", "--out", str(target))
    if moment == "writing":
        wait_for(lambda: staged(tmp_path), process)
    time.sleep(delay)
    process.send_signal(signal_number)
    _, error = process.communicate(timeout=60)

    assert process.returncode in (0, 128 + signal_number), (delay, process.returncode, error)
    assert_whole_or_nothing(target, process.returncode, error, HEADS_FILES)
    assert [path.name for path in tmp_path.iterdir()] in ([], ["run"])
    assert_no_process_left(str(target))


HALF_IMPORTED = """
import os, signal, sys
from attnviz.output.runs import handle_signals

def signal_inside_run_data(frame, event, argument):
    if event == "call" and frame.f_code.co_filename.endswith("run_data.py") and frame.f_code.co_name == "<module>":
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs at the next instruction: run_data's first lines
    return None

handle_signals()
sys.settrace(signal_inside_run_data)
import attnviz.run_data
"""


def test_a_signal_while_a_module_is_half_imported_ends_the_run_quietly():
    """The handler reads what the run made; it must not import a module the signal cut off half way (CI saw it)."""
    process = subprocess.run([sys.executable, "-c", HALF_IMPORTED], capture_output=True, text=True, timeout=120)
    assert (process.returncode, process.stderr) == (128 + signal.SIGINT, "interrupted: nothing was written\n")


def test_a_batch_under_sigterm_leaves_no_text_folder(tmp_path):
    """timeout's SIGTERM in the middle of heads --file: not some finished text folders, none."""
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(f"text number {number}" for number in range(6)), encoding="utf-8")
    target = tmp_path / "run"
    process = start("heads", "--file", str(source), "--out", str(target), "--heads", "2")
    wait_for(lambda: staged(tmp_path, "002-*/heads.png"), process)
    process.terminate()
    _, error = process.communicate(timeout=60)
    assert process.returncode == 143 and error.strip() == "interrupted: nothing was written"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["texts.txt"]


def test_a_reader_that_stops_early_loses_no_file_and_sees_no_error(tmp_path):
    """`attnviz heads ... | head -1`: the pipe closes after one line; the files are all written."""
    target = tmp_path / "run"
    process = start("heads", "the cat sat", "--out", str(target), "--heads", "2", stdout=subprocess.PIPE)
    first_line = process.stdout.readline()
    process.stdout.close()  # what head -1 does
    error = process.stderr.read()
    process.wait(timeout=120)
    assert first_line.startswith("model") and process.returncode == 0 and error == ""
    names = [".attnviz-files.json", "attention.json", "head_00.png", "head_01.png", "heads.png", "report.html"]
    assert sorted(path.name for path in target.iterdir()) == names
    json.loads((target / "attention.json").read_text(encoding="utf-8"))


def test_an_ascii_terminal_gets_escapes_instead_of_an_error(tmp_path):
    target = tmp_path / "run"
    process = start("heads", "我想", "--out", str(target), "--heads", "1", stdout=subprocess.PIPE,
                    env={**os.environ, "PYTHONIOENCODING": "ascii"})
    output, error = process.communicate(timeout=120)
    assert process.returncode == 0, error
    assert "\\u6211" in output  # 我, escaped
    assert json.loads((target / "attention.json").read_text(encoding="utf-8"))["text"] == "我想"


def test_notes_go_to_stderr_and_results_to_stdout(tmp_path, capsys):
    assert run(["heads", "我想", "--model", "bundled", "--out", str(tmp_path / "run"), "--heads", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("note: ") and "[UNK]" in captured.err
    assert "note:" not in captured.out and captured.out.startswith("model")


@pytest.mark.parametrize("command", ["heads", "stats", "trace"])
def test_file_dash_with_standard_input_closed_is_one_line_and_exit_2(command, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", None)  # what Python makes of a closed descriptor 0 (<&-)
    assert run([command, "--file", "-", "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --file -: standard input is closed") and error.count("\n") == 1
    assert "or give --file PATH" in error  # the hint names no other command than the one run
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


def test_a_signal_once_the_run_is_over_cannot_turn_a_whole_run_into_a_kill(tmp_path):
    """Python's shutdown puts the default handlers back: a SIGTERM then would kill the finished run (-15).

    The signal is sent from an atexit hook, that is after attnviz's work is done and said.
    """
    script = (
        "import atexit, os, signal, sys\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
        "sys.argv = ['attnviz', 'models']\n"
        "from attnviz.cli import main\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert "interrupted" not in result.stderr


@pytest.mark.parametrize(("args", "code"), [(["models"], 0), (["heads", ""], 2)])
def test_the_command_line_ends_with_its_code_after_the_atexit_functions_and_any_thread(args, code, tmp_path):
    """The command line's exit (gc.freeze, then sys.exit) does what an exit owes: the exit code, the atexit
    functions, a flushed stdout, and waiting for a thread that is still working."""
    script = (
        "import atexit, sys, threading, time\n"
        f"atexit.register(lambda: open({str(tmp_path / 'atexit')!r}, 'w').write('ran'))\n"
        f"def late():\n    time.sleep(0.5)\n    open({str(tmp_path / 'thread')!r}, 'w').write('done')\n"
        "threading.Thread(target=late).start()\n"
        f"sys.argv = ['attnviz', *{args!r}]\n"
        "from attnviz.cli import main\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == code, result.stderr
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"
    assert ("models" in result.stdout) if code == 0 else result.stderr.startswith("error: the text is empty")
    # Without the thread too: its atexit functions run and its output is flushed.
    alone = script.replace("threading.Thread(target=late).start()\n", "")
    (tmp_path / "atexit").unlink()
    result = subprocess.run([sys.executable, "-c", alone], capture_output=True, text=True, timeout=120)
    assert result.returncode == code and (tmp_path / "atexit").read_text() == "ran"
    assert ("bundled" in result.stdout) if code == 0 else result.stderr.count("\n") == 1

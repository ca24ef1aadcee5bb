"""Run folders: safe default names, unique per run, one whole run in each, nothing half-written on failure."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from attnviz.cli import run
from attnviz.errors import AttnvizError, Interrupted
from attnviz.output import runs
from attnviz.output.runs import MANIFEST, MAX_NAME_CHARS, StagedRunFolder, run_folder_name


@pytest.mark.parametrize(
    "text",
    ["../../x", "/etc/passwd", "..", "a/b\\c", "x" * 10_000, "..\u2044..", "\x00\n\t", "名字/../../逃出去"],
)
def test_default_names_cannot_escape_the_outputs_folder(text, tmp_path):
    name = run_folder_name(text)
    assert name and "/" not in name and "\\" not in name and ".." not in name and not name.startswith(".")
    assert len(name) <= MAX_NAME_CHARS
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()


def test_default_names_keep_chinese_characters():
    assert run_folder_name("我想吃酸菜鱼") == "我想吃酸菜鱼"
    assert run_folder_name("The cat, sat!") == "The-cat-sat"
    assert run_folder_name("???") == "run"


def test_a_taken_default_name_gets_a_number_and_is_never_overwritten(tmp_path):
    finals = []
    for content in ("first", "second", "third"):
        folder = StagedRunFolder(tmp_path / "run", unique=True)
        with folder as staging:
            (staging / "attention.json").write_text(content)
        finals.append(folder.final)
    assert [path.name for path in finals] == ["run", "run-2", "run-3"]
    assert [(path / "attention.json").read_text() for path in finals] == ["first", "second", "third"]


def test_an_explicit_folder_is_written_into_and_created_with_its_parents(tmp_path):
    target = tmp_path / "a" / "b" / "run"
    for content in ("old", "new"):
        folder = StagedRunFolder(target, unique=False)
        with folder as staging:
            (staging / "attention.json").write_text(content)
    assert folder.final == target and (target / "attention.json").read_text() == "new"
    assert sorted(path.name for path in target.parent.iterdir()) == ["run"]  # no staging left


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failed_run_leaves_nothing_behind(tmp_path, failure):
    folder = StagedRunFolder(tmp_path / "run", unique=True)
    with pytest.raises(type(failure)):
        with folder as staging:
            (staging / "head_00.png").write_bytes(b"half")
            raise failure
    assert list(tmp_path.iterdir()) == []
    assert folder.final is None


def test_an_output_path_that_is_a_file_or_under_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(AttnvizError, match="is a file, not a folder"):
        with StagedRunFolder(blocker, unique=False):
            pass
    with pytest.raises(AttnvizError, match=f"cannot write the output folder .*: {blocker} is a file"):
        with StagedRunFolder(blocker / "sub" / "run", unique=False):
            pass


def write_run(target, files, unique=False):
    """A run of StagedRunFolder writing {name: content}; a name ending in / is a folder with one file."""
    folder = StagedRunFolder(target, unique=unique)
    with folder as staging:
        for name, content in files.items():
            if name.endswith("/"):
                (staging / name).mkdir()
                (staging / name / "attention.json").write_text(content)
            else:
                (staging / name).write_text(content)
    return folder.final


def contents(folder):
    """{relative path: bytes} of every file under folder, hidden ones included."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_rerun_replaces_the_earlier_runs_files_and_keeps_the_users_own(tmp_path):
    target = tmp_path / "run"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    write_run(target, {f"head_{head:02d}.png": "first" for head in range(12)} | {"001-a/": "first"})
    write_run(target, {f"head_{head:02d}.png": "second" for head in range(4)} | {"heads.png": "second"})

    expected = {f"head_{head:02d}.png": b"second" for head in range(4)} | {"heads.png": b"second", "notes.txt": b"mine"}
    found = contents(target)
    assert json.loads(found.pop(MANIFEST))["files"] == sorted(expected.keys() - {"notes.txt"})
    write_run(target, {"002-b/": "third"})
    assert json.loads((target / MANIFEST).read_text())["files"] == ["002-b/"]  # a folder is marked as one
    assert found == expected


@pytest.mark.slow
def test_heads_with_fewer_heads_into_the_same_out_leaves_no_stale_head_files(tmp_path):
    target = tmp_path / "run"
    assert run(["heads", "the cat sat", "--model", "bundled", "--out", str(target)]) == 0
    assert run(["heads", "the cat sat", "--model", "bundled", "--out", str(target), "--heads", "4"]) == 0
    names = sorted(path.name for path in target.iterdir())
    assert names == [
        MANIFEST, "attention.json", "head_00.png", "head_01.png", "head_02.png", "head_03.png", "heads.png", "report.html"
    ]  # fmt: skip
    assert json.loads((target / "attention.json").read_text())["num_heads"] == 4


@pytest.mark.slow
def test_a_folder_where_a_file_goes_is_refused_and_nothing_changes(tmp_path, capsys):
    target = tmp_path / "run"
    assert run(["heads", "the cat sat", "--model", "bundled", "--out", str(target), "--heads", "2"]) == 0
    (target / "heads.png").unlink()
    (target / "heads.png").mkdir()  # the user's folder, not in the manifest
    (target / "heads.png" / "keep.txt").write_text("mine")
    before = contents(target)
    capsys.readouterr()

    assert run(["heads", "a dog ran", "--model", "bundled", "--out", str(target), "--heads", "2"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and "heads.png" in error and str(target) in error
    assert contents(target) == before
    assert not [path for path in target.iterdir() if path.name.startswith(".attnviz-") and path.is_dir()]


def test_manifest_names_that_leave_the_folder_are_ignored(tmp_path):
    target = tmp_path / "run"
    target.mkdir()
    (tmp_path / "outside.txt").write_text("keep")
    (target / MANIFEST).write_text(json.dumps({"format": runs.MANIFEST_FORMAT, "files": ["../outside.txt", "/etc/passwd", ".."]}))
    write_run(target, {"attention.json": "new"})
    assert (tmp_path / "outside.txt").read_text() == "keep" and os.path.exists("/etc/passwd")


def test_a_move_that_fails_midway_is_undone(tmp_path, monkeypatch):
    target = tmp_path / "run"
    write_run(target, {"head_00.png": "old", "head_01.png": "old", "attention.json": "old"})
    before = contents(target)
    real_replace, calls = os.replace, []

    def failing_replace(source, destination):
        calls.append(source)
        if len(calls) == 5:  # the old files are out, some new ones in
            raise OSError(28, "No space left on device")
        real_replace(source, destination)

    monkeypatch.setattr(runs.os, "replace", failing_replace)
    with pytest.raises(AttnvizError, match=f"cannot write the output folder {target}: the disk is full"):
        write_run(target, {"head_00.png": "new", "attention.json": "new"})
    assert contents(target) == before and len(calls) > 5


def test_a_signal_while_the_files_move_in_waits_for_them_then_interrupts(tmp_path, monkeypatch):
    target = tmp_path / "run"
    write_run(target, {"head_00.png": "old", "head_01.png": "old"})
    real_replace, calls = os.replace, []

    def replace_then_signal(source, destination):
        real_replace(source, destination)
        calls.append(source)
        if len(calls) == 1:  # the first earlier file is out, nothing new is in
            os.kill(os.getpid(), signal.SIGTERM)

    handlers = {number: signal.getsignal(number) for number in runs.DEFERRED_SIGNALS}
    monkeypatch.setattr(runs.os, "replace", replace_then_signal)
    try:
        runs.handle_signals()
        with pytest.raises(Interrupted) as raised:
            write_run(target, {"head_00.png": "new"})
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert raised.value.written == target and raised.value.exit_code == 143
    assert sorted(contents(target)) == [MANIFEST, "head_00.png"] and contents(target)["head_00.png"] == b"new"


@pytest.mark.parametrize("command", [["heads", "the cat sat", "--heads", "2"], ["trace", "the cat sat"]])
def test_a_sigterm_while_the_command_moves_its_files_in_exits_143_and_names_the_whole_run(command, tmp_path, monkeypatch, capsys):
    """An Interrupted is a KeyboardInterrupt, which typer turns into exit code 130: the command still says 143 and the folder."""
    target = tmp_path / "run"
    real_replace = os.replace

    def replace_then_signal(source, destination):
        real_replace(source, destination)
        if os.path.dirname(destination) == str(target):  # the first file moved into place: the signal is held back
            monkeypatch.setattr(runs.os, "replace", real_replace)
            os.kill(os.getpid(), signal.SIGTERM)

    handlers = {number: signal.getsignal(number) for number in runs.DEFERRED_SIGNALS}
    monkeypatch.setattr(runs.os, "replace", replace_then_signal)
    try:
        runs.handle_signals()
        code = run([*command, "--model", "bundled", "--out", str(target)])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert code == 143
    assert capsys.readouterr().err.endswith(f"interrupted once the files were written in full: {target}\n")
    assert MANIFEST in contents(target) and len(contents(target)) > 1


def _write_runs_in_turn(target, worker, rounds):
    for round_number in range(rounds):
        names = [f"head_{head:02d}.png" for head in range(worker + 1)] + [f"00{worker}-text/"]
        write_run(target, {name: f"{worker}.{round_number}" for name in names})


def test_concurrent_runs_into_one_folder_leave_one_whole_run(tmp_path):
    """Processes writing different sets of files into one --out: each succeeds, one run's files remain."""
    target = tmp_path / "run"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_write_runs_in_turn, args=(target, worker, 15)) for worker in range(4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    assert [process.exitcode for process in workers] == [0, 0, 0, 0]

    found = contents(target)
    listed = json.loads(found.pop(MANIFEST))["files"]
    (content,) = set(found.values())  # every file from one run
    worker = int(content.split(b".")[0])
    names = sorted(name.removesuffix("/") for name in listed)
    assert sorted(path.split("/")[0] for path in found) == names and len(names) == worker + 2
    assert sorted(path.name for path in target.iterdir()) == sorted([*names, MANIFEST])  # nothing hidden left


@pytest.mark.slow  # 10,000 checks: 14 s on 2 cores
def test_checks_of_a_folder_that_other_runs_make_and_remove_never_call_it_a_file(tmp_path):
    """Four runs' checks of one missing --out while another thread makes and removes that folder as their checks do:
    a folder that appears or vanishes between two looks is missing or a folder, never "a file" (exists() then
    is_dir() said so 1,283 times in 20,000)."""
    import threading

    target = tmp_path / "D" / "same"
    done = threading.Event()
    refusals: list[str] = []

    def make_and_remove():
        while not done.is_set():
            for change in (lambda: target.mkdir(parents=True), target.rmdir):
                try:
                    change()
                except OSError:  # made or removed by a check meanwhile, or holding a check's probe
                    pass

    def check(times: int):
        for _ in range(times):
            try:
                runs.check_target(target)
            except AttnvizError as error:
                refusals.append(str(error))

    toggler = threading.Thread(target=make_and_remove)
    checkers = [threading.Thread(target=check, args=(2500,)) for _ in range(4)]
    toggler.start()
    for each in checkers:
        each.start()
    for each in checkers:
        each.join()
    done.set()
    toggler.join()
    assert refusals == []
    assert not [path for path in tmp_path.rglob("*") if path.name.startswith(".attnviz-")]  # no probe left


@pytest.mark.parametrize(
    "out, words",
    [
        ("/proc/attnviz-run", "/proc/attnviz-run: its folder does not take new folders"),
        ("/sys/attnviz-run", "/sys/attnviz-run"),
        ("x" * 300, "the path is too long"),
        ("", "--out is empty"),
    ],
)
def test_an_unusable_out_is_one_line_and_exit_2_before_the_model_loads(out, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("attnviz.models.loading.load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    assert run(["heads", "the cat sat", "--model", "bundled", "--out", out]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1 and words in error, error
    assert list(tmp_path.iterdir()) == []


def test_a_dangling_symlink_as_out_is_refused_naming_it(tmp_path, capsys):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    assert run(["heads", "the cat sat", "--model", "bundled", "--out", str(link)]) == 2
    assert capsys.readouterr().err == f"error: the output folder {link} is a symbolic link to {tmp_path / 'gone'}, which does not exist\n"
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("seed", ["18446744073709551616", "-1"])
def test_a_seed_outside_64_bits_is_a_usage_error(seed, capsys):
    assert run(["heads", "the cat sat", "--model", "bundled", "--weights", "random", "--seed", seed]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: Invalid value for '--seed'") and error.count("\n") == 1


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount(size, read_only) -> a fresh tmpfs mounted in tmp_path; skipped where mounting is not allowed."""
    mounted = []

    def mount(size="16m", read_only=False):
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.mark.slow
def test_out_on_another_filesystem_is_written_in_full(mount_tmpfs, tmp_path):
    point = mount_tmpfs()
    assert os.stat(point).st_dev != os.stat(tmp_path).st_dev
    (point / "notes.txt").write_text("mine")
    for num_heads in ("4", "2"):
        assert run(["heads", "the cat sat", "--model", "bundled", "--out", str(point), "--heads", num_heads]) == 0
    names = sorted(path.name for path in point.iterdir())
    assert names == [MANIFEST, "attention.json", "head_00.png", "head_01.png", "heads.png", "notes.txt", "report.html"]


@pytest.mark.slow
def test_a_full_disk_is_exit_2_naming_the_folder_and_leaves_nothing(mount_tmpfs, capsys):
    point = mount_tmpfs(size="64k")
    target = point / "run"
    assert run(["heads", "the cat sat", "--model", "bundled", "--out", str(target)]) == 2
    assert capsys.readouterr().err == f"error: cannot write the output folder {target}: the disk is full\n"
    assert list(point.iterdir()) == []


PAGE = 4096  # a tmpfs gives out its space in pages

EVERY_COMMAND = [
    ["heads", "the cat sat", "--heads", "2"],
    ["report", "the cat sat"],
    ["layers", "the cat sat"],
    ["stats", "the cat sat"],
    ["compare", "the cat sat", "--heads", "1,2"],
    ["position", "the cat sat"],
    ["trace", "the cat sat"],
]


@pytest.mark.slow  # fresh processes
@pytest.mark.parametrize("command", EVERY_COMMAND, ids=[command[0] for command in EVERY_COMMAND])
def test_every_command_on_a_disk_that_fills_up_at_its_last_file_is_exit_2_and_leaves_nothing(command, mount_tmpfs, tmp_path, capsys):
    """The disk holds the run's files but not the list of them (MANIFEST, written last): the same one line, nothing left."""
    assert run([*command, "--model", "bundled", "--out", str(tmp_path / "free")]) == 0
    pages = sum(-(-path.stat().st_size // PAGE) for path in (tmp_path / "free").rglob("*") if path.is_file() and path.name != MANIFEST)
    point = mount_tmpfs(size=f"{pages * PAGE // 1024}k")
    capsys.readouterr()
    assert run([*command, "--model", "bundled", "--out", str(point / "run")]) == 2
    assert capsys.readouterr().err == f"error: cannot write the output folder {point / 'run'}: the disk is full\n"
    assert list(point.iterdir()) == []


def test_a_stats_checkpoint_on_a_full_disk_is_exit_2_naming_it_and_leaves_no_temporary(mount_tmpfs, tmp_path, capsys):
    point = mount_tmpfs(size="64k")
    (point / "filler").write_bytes(b"x" * 64 * 1024)  # every page taken
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\nthe dog ran\n", encoding="utf-8")
    checkpoint = point / "stats.ckpt.npz"
    out = tmp_path / "run"
    args = ["stats", "--file", str(corpus), "--model", "bundled", "--checkpoint", str(checkpoint), "--out", str(out)]
    assert run(args) == 2
    assert capsys.readouterr().err == f"error: cannot write --checkpoint {checkpoint}: the disk is full\n"
    assert [path.name for path in point.iterdir()] == ["filler"] and not out.exists()


def test_a_read_only_filesystem_is_refused_before_the_model_loads(mount_tmpfs, monkeypatch, capsys):
    point = mount_tmpfs(read_only=True)
    monkeypatch.setattr("attnviz.models.loading.load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    assert run(["heads", "the cat sat", "--model", "bundled", "--out", str(point / "run")]) == 2
    assert capsys.readouterr().err == f"error: cannot write the output folder {point / 'run'}: the file system is read-only\n"


def test_a_signal_after_the_files_are_in_place_says_they_are_whole_not_that_nothing_was_written(tmp_path):
    """The window between the files landing and the process ending (the list of files is printed)."""
    from attnviz.output.runs import forget_written_folders, interrupted_message

    forget_written_folders()
    assert interrupted_message() == "interrupted: nothing was written"
    with StagedRunFolder(tmp_path / "run", unique=False) as staging:
        (staging / "attention.json").write_text("{}", encoding="utf-8")
        assert interrupted_message() == "interrupted: nothing was written"  # still only staged
    assert interrupted_message() == f"interrupted once the files were written in full: {tmp_path / 'run'}"

"""Run folders: safe default names, unique per run, nothing half-written on failure."""

import pytest

from attnviz.errors import AttnvizError
from attnviz.runs import MAX_NAME_CHARS, StagedRunFolder, run_folder_name


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
    with pytest.raises(AttnvizError, match="cannot create the output folder"):
        with StagedRunFolder(blocker / "sub" / "run", unique=False):
            pass

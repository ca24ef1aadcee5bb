"""What a new user meets on the command line (issue 24, part 7): --head, --figures, --quiet, a bounded table,
"did you mean" for model names, a bare `attnviz`, bad choices and notes left out, each in clean lines."""

from __future__ import annotations

import json
import re

import huggingface_hub.constants
import numpy as np
import pytest
from helpers import assert_close_after_rounding

import attnviz.models.hub
import attnviz.models.loading
from attnviz.cli import run
from attnviz.errors import AttnvizError
from attnviz.output.runs import MANIFEST
from attnviz.render import terminal
from attnviz.render.terminal import print_notes
from rich.console import Console

TEXT = "the cat sat on the mat"
HEAD_FILES = {f"head_{head:02d}.png" for head in range(12)}


def heads(*args):
    return run(["heads", *args, "--model", "bundled"])


def written(folder) -> set[str]:
    return {path.name for path in folder.iterdir()} - {MANIFEST}


def one_error_line(capsys) -> str:
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    return error.strip()


# ---- --head N: one head, the model's own numbering ------------------------------------------------


def test_head_draws_that_head_alone_and_its_table_row_while_attention_json_keeps_every_head(tmp_path, capsys):
    out = tmp_path / "run"
    assert heads(TEXT, "--head", "3", "--no-html", "--out", str(out)) == 0
    assert written(out) == {"head_03.png", "attention.json"}
    assert (out / "head_03.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    record = json.loads((out / "attention.json").read_text(encoding="utf-8"))
    attention = np.array(record["attention"])  # (H, Nq, Nk)
    assert attention.shape[0] == record["num_heads"] == 12
    rows = attention[3]
    entropy = float(np.mean(-np.sum(np.where(rows > 0, rows * np.log(np.where(rows > 0, rows, 1.0)), 0.0), axis=-1)))

    shown = capsys.readouterr().out
    table_rows = re.findall(r"^│\s+(\d+) │\s+([\d.]+) │", shown, flags=re.M)
    assert [head for head, _ in table_rows] == ["3"]  # head 3's row alone, its entropy from the file's weights (7 decimals)
    assert_close_after_rounding([float(shown) for _, shown in table_rows], [entropy], 2, rounded=1)
    assert "1 head of 12" in shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--head", "12"], "--head 12 is out of range: all-MiniLM-L6-v2's layers have 12 heads, 0 to 11"),
        (["--head", "-1"], "--head -1 is out of range: all-MiniLM-L6-v2's layers have 12 heads, 0 to 11"),
        (["--head", "3", "--heads", "3"], "--head 3 is out of range: --heads 3 splits the layer into 3 heads, 0 to 2"),
        (["--head", "3", "--figures", "grid"], "--head 3 draws that head's heatmap alone: leave out --figures"),
    ],
)
def test_a_head_out_of_range_is_one_line_naming_the_range_and_writes_nothing(args, message, tmp_path, capsys):
    assert heads(TEXT, *args, "--out", str(tmp_path / "run")) == 2
    assert one_error_line(capsys) == f"error: {message}"
    assert list(tmp_path.iterdir()) == []


def test_a_head_out_of_range_is_refused_before_the_heads_are_computed(tmp_path, capsys, monkeypatch):
    """Once the model loads its head count is known: --head 12 is refused then (by the API's heads, which the command
    calls), not after the layer (and here every head's effect) is computed. The effects and the layer's pass are
    replaced by functions that record being called."""
    import attnviz.api.functions
    import attnviz.pipeline

    computed = []
    monkeypatch.setattr(attnviz.api.functions, "head_effects", lambda *args, **kwargs: computed.append("effects"))
    monkeypatch.setattr(attnviz.pipeline, "run_attention", lambda *args, **kwargs: computed.append("layer"))
    assert heads(TEXT, "--head", "12", "--effect", "zero", "--out", str(tmp_path / "run")) == 2
    assert one_error_line(capsys).startswith("error: --head 12 is out of range")
    assert computed == [] and list(tmp_path.iterdir()) == []
    with pytest.raises(AttnvizError, match=r"^head=12 is out of range: all-MiniLM-L6-v2's layers have 12 heads, 0 to 11$"):
        attnviz.api.functions.heads(TEXT, head=12, effect="zero", model="bundled", device="cpu")
    assert computed == []


def test_head_is_its_own_option_not_a_prefix_of_heads(capsys):
    assert run(["heads", "--help"]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^\s+--head N\s", shown, flags=re.M) and re.search(r"^\s+--heads <int range>\s", shown, flags=re.M)


# ---- --figures and --quiet ---------------------------------------------------------------------------


def test_figures_grid_writes_heads_png_alone(tmp_path):
    assert heads(TEXT, "--figures", "grid", "--no-html", "--out", str(tmp_path / "run")) == 0
    assert written(tmp_path / "run") == {"heads.png", "attention.json"}


def test_figures_none_writes_no_image_and_quiet_prints_the_run_folder_alone(tmp_path, capsys):
    out = tmp_path / "run"
    assert heads(TEXT, "--figures", "none", "--quiet", "--out", str(out)) == 0
    assert written(out) == {"attention.json", "report.html"}
    assert capsys.readouterr().out == f"{out}\n"
    assert heads(TEXT, "--figures", "none", "--no-html", "--out", str(tmp_path / "loud")) == 0  # the next run is loud
    assert "entropy" in capsys.readouterr().out


def two_lines(tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("the cat\nthe dog sat\n", encoding="utf-8")
    return source


@pytest.mark.slow
def test_heads_file_writes_the_grid_alone_by_default(tmp_path):
    assert heads("--file", str(two_lines(tmp_path)), "--no-html", "--quiet", "--out", str(tmp_path / "run")) == 0
    folders = sorted(path for path in (tmp_path / "run").iterdir() if path.is_dir())
    assert [written(folder) for folder in folders] == [{"heads.png", "attention.json"}] * 2


@pytest.mark.slow
def test_heads_file_writes_every_head_when_asked(tmp_path):
    source = two_lines(tmp_path)
    assert heads("--file", str(source), "--no-html", "--quiet", "--figures", "all", "--out", str(tmp_path / "all")) == 0
    folders = sorted(path for path in (tmp_path / "all").iterdir() if path.is_dir())
    assert [written(folder) for folder in folders] == [HEAD_FILES | {"heads.png", "attention.json"}] * 2


def test_the_heads_table_of_a_long_text_is_bounded_and_says_where_the_rest_is(tmp_path, capsys):
    words = "the cat sat on a mat while dogs ran across green fields".split()
    text = " ".join(words[index % len(words)] for index in range(290))  # 292 tokens with [CLS] and [SEP]
    assert heads(text, "--figures", "none", "--no-html", "--out", str(tmp_path / "run")) == 0
    shown = capsys.readouterr().out
    assert len(shown.splitlines()) < 160  # 429 lines before the bound
    flat = re.sub(r"[│\s]+", " ", shown)  # the table's cells as one line: a row's text wraps between its pairs
    assert "queries 0 to 15 of 292 shown; attention.json has every query of every head" in flat
    assert flat.count("… 276 more") == 12  # each head's row: its first 16 queries, then the count left out


# ---- model names: "did you mean", before any network wait ----------------------------------------------


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """An empty hub cache, offline; asking the hub fails the test (a typo must cost no network wait)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(attnviz.models.hub, "hub_answers", lambda endpoint: pytest.fail("the hub was asked"))


@pytest.mark.parametrize(("given", "meant"), [("smolm2", "smollm2"), ("bert-base-chinse", "bert-base-chinese"), ("bundle", "bundled")])
def test_a_model_name_one_letter_off_a_listed_one_is_refused_with_did_you_mean(given, meant, empty_hub_cache, tmp_path, capsys):
    assert run(["heads", "hi", "--model", given, "--out", str(tmp_path / "run")]) == 2
    error = one_error_line(capsys)
    assert error.startswith(f"error: cannot load model {given!r}") and f"did you mean {meant}?" in error


@pytest.mark.parametrize("given", ["bert-base-cased", "gpt2", "HuggingFaceTB/SmolLM2-135M-Instuct"])
def test_a_name_close_to_nothing_listed_or_with_its_org_goes_on_to_the_hub_as_before(given, empty_hub_cache, tmp_path, capsys):
    assert run(["heads", "hi", "--model", given, "--out", str(tmp_path / "run")]) == 2
    error = one_error_line(capsys)
    assert "did you mean" not in error and "not in the local hub cache and offline mode is on" in error


# ---- a bare attnviz, bad choices, notes left out -------------------------------------------------------


def test_a_bare_attnviz_prints_the_help_and_nothing_on_stderr(capsys):
    assert run(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert run([]) == 0
    shown = capsys.readouterr()
    assert shown.out == help_text and shown.err == ""
    assert help_text.startswith("Usage: attnviz") and "error" not in help_text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["trace", "hi", "--layout", "view_permute"],
         "--layout: 'view_permute' is not one of view-permute, merged-batch, fused-qkv, single-head, all (see attnviz trace --help)"),
        (["heads", "hi", "--weights", "trained"], "--weights: 'trained' is not one of pretrained, random (see attnviz heads --help)"),
        (["heads", "hi", "--figures", "some"], "--figures: 'some' is not one of all, grid, none (see attnviz heads --help)"),
        (["heads", "hi", "--format", "jpg"], "--format: 'jpg' is not one of png, svg, pdf (see attnviz heads --help)"),
    ],
)  # fmt: skip
def test_a_bad_choice_is_one_line_naming_the_option_and_its_choices(args, expected, capsys):
    assert run(args) == 2
    error = one_error_line(capsys)
    assert error == f"error: {expected}"
    assert "Value error" not in error


@pytest.mark.parametrize(("notes", "last"), [(4, "… and 1 more note"), (6, "… and 3 more notes")])
def test_notes_past_the_first_three_are_counted_in_one_wording(notes, last):
    console = Console(record=True, width=200)
    print_notes(console, [f"note {number}" for number in range(notes)], 3)
    lines = console.export_text().splitlines()
    assert lines == ["note: note 0", "note: note 1", "note: note 2", f"note: {last}"]


def test_no_command_words_notes_left_out_its_own_way():
    from pathlib import Path

    cli = Path(terminal.__file__).parents[1] / "cli"
    sources = " ".join(path.read_text(encoding="utf-8") for path in cli.glob("*.py"))
    assert not re.search(r"more (notes|such notes|notes)", sources)

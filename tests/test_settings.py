"""Every JSON a command writes records the run's settings, and what --truncate cut.

The expected settings are written out from the options each test gives; the expected token
counts come from transformers' own tokenizer, not from attnviz's.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import attnviz
from attnviz.cli import run
from attnviz.models.loading import BUNDLED_NAME, bundled_model_path
from attnviz.spec import RunSpec

pytestmark = pytest.mark.slow  # every command end to end, on texts of 600 tokens

SHORT = "The cat sat on the mat."
LONG = "word " * 600  # 602 tokens with [CLS] and [SEP]
LONG_KV = "cat sat " * 400
MAX_POSITIONS = 512


@pytest.fixture(scope="module")
def count_tokens():
    """Tokens of a text, [CLS] and [SEP] included, by transformers' tokenizer of the bundled model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    return lambda text: len(tokenizer(text, truncation=False, verbose=False)["input_ids"])


def cut(count: int) -> dict | None:
    return {"from": count, "to": MAX_POSITIONS} if count > MAX_POSITIONS else None


def settings(**given) -> dict:
    """The settings object of a run of the bundled model on the CPU, with the options given."""
    return {
        "model": "bundled",
        "resolved_model": BUNDLED_NAME,
        "model_source": "bundled",
        "layer": 0,
        "num_heads": 12,
        "weights": "pretrained",
        "seed": None,
        "causal": False,
        "kv_text": None,
        "stack": None,
        "device": "cpu",
        "truncate": False,
        "words": False,
        "js": None,  # stats' alone
        "attnviz_version": attnviz.__version__,
        **given,
    }


def attnviz_run(*args: str) -> int:
    """A command on the bundled model on the CPU."""
    return run([*args, "--model", "bundled", "--device", "cpu"])


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def shown(capsys) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())  # notes may wrap at the terminal width


def test_the_settings_module_imports_no_torch():
    code = "import sys, attnviz.spec; print(sorted({'torch', 'numpy', 'typer'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_a_run_spec_is_frozen_and_writes_the_seed_only_for_random_weights(plain_spec):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain_spec.seed = 3
    assert plain_spec.to_dict() == settings()
    random = dataclasses.replace(plain_spec, weights="random", seed=3)
    assert random.to_dict() == settings(weights="random", seed=3)
    with pytest.raises(ValueError, match="unknown weights 'trained'"):
        dataclasses.replace(plain_spec, weights="trained")
    assert isinstance(plain_spec, RunSpec)


def test_heads_records_every_setting_and_both_cuts_in_attention_json_and_trace_json(
    tmp_path, monkeypatch, capsys, count_tokens
):
    """The model given as a relative folder: settings keep it as given and resolve it to the folder's path."""
    folder = bundled_model_path()
    monkeypatch.chdir(folder.parent)
    options = ["--layer", "1", "--heads", "4", "--weights", "random", "--seed", "7", "--kv", LONG_KV, "--truncate"]
    args = ["heads", LONG, "--model", folder.name, "--device", "cpu", *options, "--trace", "--out", str(tmp_path)]
    assert run(args) == 0

    expected = settings(
        model=folder.name, resolved_model=str(folder.resolve()), model_source="local folder", layer=1, num_heads=4,
        weights="random", seed=7, kv_text=LONG_KV, truncate=True,
    )  # fmt: skip
    attention, trace = read(tmp_path / "attention.json"), read(tmp_path / "trace.json")
    assert attention["settings"] == trace["settings"] == expected
    assert attention["truncated"] == cut(count_tokens(LONG)) == {"from": 602, "to": 512}
    assert attention["kv_truncated"] == trace["kv_truncated"] == cut(count_tokens(LONG_KV))
    assert trace["truncated"] == [cut(count_tokens(LONG))]
    assert len(attention["query_tokens"]) == len(attention["key_tokens"]) == MAX_POSITIONS

    notes = shown(capsys)
    assert '--truncate cut the text "word word word word word…" from 602 to 512 tokens' in notes
    assert f"dropped the {count_tokens(LONG_KV) - MAX_POSITIONS} tokens" in notes and "the --kv text" in notes


def test_an_uncut_text_records_null(tmp_path):
    assert attnviz_run("heads", SHORT, "--out", str(tmp_path)) == 0
    record = read(tmp_path / "attention.json")
    assert record["settings"] == settings()
    assert record["truncated"] is None and record["kv_truncated"] is None


def test_heads_file_gives_each_text_its_own_cut(tmp_path, count_tokens):
    source = tmp_path / "texts.txt"
    source.write_text(f"{SHORT}\n{LONG}\n", encoding="utf-8")
    options = ["--causal", "--weights", "random", "--seed", "3", "--truncate"]
    assert attnviz_run("heads", "--file", str(source), *options, "--out", str(tmp_path / "run")) == 0

    expected = settings(causal=True, weights="random", seed=3, truncate=True)
    summary = read(tmp_path / "run" / "summary.json")
    assert summary["settings"] == expected and summary["kv_truncated"] is None
    assert [row["truncated"] for row in summary["texts"]] == [None, cut(count_tokens(LONG))]
    for row in summary["texts"]:
        record = read(tmp_path / "run" / row["folder"] / "attention.json")
        assert record["settings"] == expected and record["truncated"] == row["truncated"]


def test_trace_records_each_text_of_the_batch(tmp_path, count_tokens):
    options = ["--batch", LONG, "--heads", "6", "--weights", "random", "--seed", "2", "--truncate"]
    assert attnviz_run("trace", SHORT, *options, "--out", str(tmp_path)) == 0
    record = read(tmp_path / "trace.json")
    assert record["settings"] == settings(num_heads=6, weights="random", seed=2, truncate=True)
    assert record["truncated"] == [None, cut(count_tokens(LONG))] and record["kv_truncated"] is None


def test_stats_records_every_texts_cut(tmp_path, capsys, count_tokens):
    source = tmp_path / "texts.txt"
    source.write_text(f"{LONG}\n{SHORT}\n", encoding="utf-8")
    options = ["--heads", "2", "--weights", "random", "--seed", "4", "--truncate"]
    assert attnviz_run("stats", "--file", str(source), *options, "--out", str(tmp_path / "run")) == 0
    record = read(tmp_path / "run" / "stats.json")
    assert record["settings"] == settings(layer=None, num_heads=2, weights="random", seed=4, truncate=True, js=False)
    assert record["texts"] == [LONG.strip(), SHORT]
    assert record["truncated"] == [cut(count_tokens(LONG)), None]
    assert "from 602 to 512 tokens: dropped the 90 tokens" in shown(capsys)


def test_layers_records_the_settings_and_the_cut_in_rollout_json(tmp_path, count_tokens):
    assert attnviz_run("layers", LONG, "--causal", "--truncate", "--out", str(tmp_path)) == 0
    record = read(tmp_path / "rollout.json")
    assert record["settings"] == settings(layer=None, causal=True, truncate=True)
    assert record["truncated"] == cut(count_tokens(LONG))


def test_compare_records_the_shared_settings_and_each_splits_own(tmp_path):
    options = ["--heads", "1,4", "--weights", "pretrained,random", "--layer", "2", "--seed", "9"]
    assert attnviz_run("compare", SHORT, *options, "--out", str(tmp_path)) == 0
    record = read(tmp_path / "compare.json")
    assert record["settings"] == settings(layer=2, num_heads=None, weights=None, seed=9)
    assert [split["settings"] for split in record["splits"]] == [
        settings(layer=2, num_heads=1),
        settings(layer=2, num_heads=4),
        settings(layer=2, num_heads=1, weights="random", seed=9),
        settings(layer=2, num_heads=4, weights="random", seed=9),
    ]
    assert record["truncated"] is None


def test_position_records_its_fixed_settings(tmp_path):
    assert attnviz_run("position", SHORT, "--out", str(tmp_path)) == 0
    record = read(tmp_path / "position.json")
    assert record["settings"] == settings() and record["truncated"] is None


def test_a_command_line_run_in_a_process_with_handles_records_the_model_as_it_was_given(tmp_path, monkeypatch):
    """A notebook (or a test) loaded the folder by its absolute path; a command line run in that process, given the
    folder by its relative name, records that name, as a process of its own would, and leaves the notebook's handle."""
    folder = bundled_model_path()
    handle = attnviz.load(str(folder), device="cpu")
    monkeypatch.chdir(folder.parent)
    args = ["heads", "the cat sat", "--model", folder.name, "--device", "cpu", "--no-html", "--figures", "none"]
    assert run([*args, "--out", str(tmp_path / "run")]) == 0
    settings = json.loads((tmp_path / "run" / "attention.json").read_text(encoding="utf-8"))["settings"]
    assert (settings["model"], settings["resolved_model"]) == (folder.name, str(folder.resolve()))
    assert attnviz.load(str(folder), device="cpu") is handle

"""What a careless or hostile user does to the command line and the API: bytes that are not UTF-8
in a text, a standard output on a full disk, Ctrl-C while a result is saved."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from attnviz.cli import run

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TEXT_COMMANDS = ["heads", "report", "layers", "stats", "compare", "position", "diff", "generate", "trace"]
NEEDED = {"diff": ["--against", "random"]}  # a command's required options besides the text


def attnviz(*args, **streams) -> subprocess.CompletedProcess:
    """The attnviz command in a process of its own: its arguments may be bytes, as a shell passes them."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **streams}
    return subprocess.run([sys.executable, "-m", "attnviz", *args], env=ENV, timeout=300, **streams)


@pytest.mark.parametrize("command", TEXT_COMMANDS)
def test_a_byte_that_is_not_utf8_in_a_text_is_one_line_naming_it(command, tmp_path, capsys):
    """Python hands an argument's undecodable byte 0xE9 on as the lone surrogate U+DCE9 (surrogateescape)."""
    out = tmp_path / "run"
    assert run([command, "caf\udce9 au lait", *NEEDED.get(command, []), "--model", "bundled", "--out", str(out)]) == 2
    assert capsys.readouterr().err == "error: the text has a byte that is not UTF-8: 0xE9 at character 4 (give it in UTF-8)\n"
    assert not out.exists()


@pytest.mark.parametrize("command", ["heads", "report", "trace"])
def test_a_byte_that_is_not_utf8_in_the_kv_text_is_one_line_naming_it(command, tmp_path, capsys):
    assert run([command, "the cat", "--kv", "ma\udcf1ana", "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == "error: the --kv text has a byte that is not UTF-8: 0xF1 at character 3 (give it in UTF-8)\n"


def test_the_raw_bytes_from_a_shell_are_refused_the_same_way(tmp_path):
    done = attnviz(b"heads", b"caf\xe9 au lait", b"--model", b"bundled", b"--out", str(tmp_path / "run").encode())
    assert done.returncode == 2
    assert done.stderr.decode() == "error: the text has a byte that is not UTF-8: 0xE9 at character 4 (give it in UTF-8)\n"
    assert not (tmp_path / "run").exists()


def test_the_api_refuses_a_lone_surrogate_too():
    import attnviz as api

    with pytest.raises(api.AttnvizError, match=r"^the text has a lone surrogate U\+D800 at character 2, which is no character$"):
        api.heads("a\ud800b", model="bundled")


def test_a_file_line_that_is_not_utf8_is_one_line_naming_it(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_bytes("fine\ncafé\n".encode() + b"caf\xe9 au lait\n")
    for command in ("heads", "report", "trace", "stats"):
        assert run([command, "--file", str(texts), "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
        assert capsys.readouterr().err == f"error: cannot read {texts}: line 3 is not UTF-8 text (byte 4 of the line)\n"
    assert not (tmp_path / "run").exists()


SAVE_UNDER_SIGINT = r"""
import json, os, signal, sys
from pathlib import Path

import attnviz

# Ctrl-C as a terminal's Python gets it: a shell that starts pytest in the background (`pytest &`) starts it with
# SIGINT ignored, which this process would inherit, and an ignored Ctrl-C tests nothing
signal.signal(signal.SIGINT, signal.default_int_handler)
moment, reference, folder = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
result = attnviz.heads("the cat sat on the mat", model="bundled", heads=2)
result.save(reference)  # the whole run, to compare with
if moment == "moving":  # Ctrl-C just after the first file moved into place: attnviz holds it until all are in
    real_replace = os.replace

    def replace_then_interrupt(source, destination):
        real_replace(source, destination)
        os.replace = real_replace
        os.kill(os.getpid(), signal.SIGINT)

    os.replace = replace_then_interrupt
else:  # Ctrl-C once the first file (attention.json) is in the staging folder, while the others are written
    real_write_text = Path.write_text

    def write_then_interrupt(path, *args, **kwargs):
        written = real_write_text(path, *args, **kwargs)
        if path.parent.name.endswith(".partial"):  # at that very moment, not whenever a polling thread sees it
            Path.write_text = real_write_text
            os.kill(os.getpid(), signal.SIGINT)
        return written

    Path.write_text = write_then_interrupt
try:
    result.save(folder)
    print(json.dumps({"caught": None}))
except KeyboardInterrupt as caught:
    print(json.dumps({"caught": type(caught).__name__, "written": str(getattr(caught, "written", None))}))
"""


def contents(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()} if folder.exists() else {}


@pytest.mark.slow  # fresh processes
@pytest.mark.parametrize("moment", ["moving", "writing"])
def test_ctrl_c_during_save_is_a_keyboard_interrupt_and_leaves_a_whole_run_or_nothing(moment, tmp_path):
    reference, folder = tmp_path / "reference", tmp_path / "saved"
    done = subprocess.run(
        [sys.executable, "-c", SAVE_UNDER_SIGINT, moment, str(reference), str(folder)],
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["caught"] in ("KeyboardInterrupt", "Interrupted"), report
    if moment == "moving":  # the signal waited for the files: they are all in place
        assert report == {"caught": "Interrupted", "written": str(folder)}
    if report["caught"] == "Interrupted":
        assert contents(folder) == contents(reference)
    else:
        assert contents(folder) == {}
    assert [path for path in tmp_path.rglob(".attnviz-*") if path.is_dir()] == []  # no staging, probe or trash folder left


HEADS_FILES = [".attnviz-files.json", "attention.json", "head_00.png", "head_01.png", "heads.png", "report.html"]


@pytest.mark.slow  # fresh processes
def test_a_full_disk_under_standard_output_costs_no_file_and_is_exit_2(tmp_path):
    """`attnviz heads ... > file` on a full disk (/dev/full: every write is ENOSPC): the run writes all its files."""
    target = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = attnviz("heads", "the cat sat", "--model", "bundled", "--heads", "2", "--out", str(target), stdout=full, text=True)
    assert done.returncode == 2
    assert done.stderr == f"error: cannot write the standard output: the disk is full (the files were written in full: {target})\n"
    assert sorted(path.name for path in target.iterdir()) == HEADS_FILES
    assert json.loads((target / "attention.json").read_text(encoding="utf-8"))["text"] == "the cat sat"


def test_a_command_that_writes_no_file_says_its_output_was_lost(tmp_path):
    with open("/dev/full", "w") as full:
        done = attnviz("models", stdout=full, text=True)
    assert done.returncode == 2 and done.stderr == "error: cannot write the standard output: the disk is full\n"


@pytest.mark.slow  # fresh processes
def test_a_full_disk_under_standard_error_costs_nothing(tmp_path):
    """Nothing can be said there: the run goes on, its files are written, its output printed."""
    target = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = attnviz("heads", "the cat sat", "--model", "bundled", "--heads", "2", "--out", str(target), stderr=full, stdout=subprocess.PIPE, text=True)
    assert done.returncode == 0 and done.stdout.startswith("model")
    assert sorted(path.name for path in target.iterdir()) == HEADS_FILES


def integer_options() -> list[tuple[str, str, object]]:
    """(command, flag, click's parameter) of every integer option of every command, from the app through typer's and
    click's public API: a command or option added later is swept too."""
    import typing

    import typer.main

    from attnviz.cli.main import app

    group = typer.main.get_command(app)
    found = []
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        hints = typing.get_type_hints(command.callback)
        for parameter in group.commands[name].params:
            if hints.get(parameter.name) in (int, typing.Optional[int]):
                found.append((name, max(parameter.opts, key=len), parameter))
    return found


def test_the_sweep_finds_the_integer_options():
    found = {(command, flag) for command, flag, _ in integer_options()}
    assert {("roles", "--sinks"), ("heads", "--layer"), ("serve", "--port"), ("trace", "--d-q"), ("stats", "--chunk-lines")} <= found
    assert len(found) > 30


@pytest.mark.parametrize("command, flag", [(command, flag) for command, flag, _ in integer_options()])
def test_every_integer_option_refuses_a_huge_number_in_one_line_with_exit_2(command, flag, tmp_path, capsys, monkeypatch):
    """99999999999999999999999 is past a C integer: each option's maximum refuses it as the command line is read."""
    monkeypatch.chdir(tmp_path)
    assert run([command, flag, "99999999999999999999999"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: Invalid value for '{flag}'") and "less than or equal to" in error, error
    assert error.count("\n") == 1, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "tensor, family",
    [("cls.predictions.bias", "bert"), ("cls.predictions.transform.dense.weight", "bert"), ("lm_head.weight", "llama")],
)
def test_a_task_head_with_nan_in_its_weights_is_refused_in_one_line_and_writes_nothing(tensor, family, tmp_path, capsys):
    """A checkpoint whose masked-LM head (or language-model head) holds NaN: patch reads it, and refuses it as heads
    refuses a projection's NaN, naming the tensor (it wrote NaN into patch.json)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from tiny_families import _DECODER, _ENCODER, WORDPIECE_VOCAB, bpe_tokenizer, save_checkpoint, wordpiece_tokenizer

    folder = tmp_path / "model"
    if family == "bert":
        save_checkpoint(transformers.BertConfig(vocab_size=WORDPIECE_VOCAB, **_ENCODER), transformers.BertForMaskedLM, wordpiece_tokenizer(), folder)
        texts = ["The cat sat on the [MASK].", "--corrupt", "The dog sat on the [MASK].", "--answer", "mat", "--wrong", "floor"]
    else:
        config = transformers.LlamaConfig(**{**_DECODER, "tie_word_embeddings": False})
        save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), folder)
        texts = ["The cat sat on the", "--corrupt", "The mat sat on the", "--answer", " mat", "--wrong", " cat"]
    weights = load_file(folder / "model.safetensors")
    assert tensor in weights
    weights[tensor].view(-1)[:3] = torch.tensor([float("nan"), float("inf"), 1.0])
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()  # transformers' own progress bars while saving
    out = tmp_path / "run"
    assert run(["patch", *texts, "--model", str(folder), "--device", "cpu", "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"error: the model's {tensor} holds 2 NaN or infinite values: its checkpoint is damaged\n"
    assert not out.exists()


def test_the_api_takes_more_sinks_or_a_wider_band_than_keys_as_every_key():
    """attnviz.roles(sinks=10**23), attnviz.layers(band=10**23): the first S keys, the keys within w, are all of them,
    as S or w = N says (each ended in an OverflowError)."""
    import attnviz as api

    model = api.load("bundled", device="cpu")
    text = "the cat sat on the mat"  # 8 tokens
    huge, every = (api.roles(text, model=model, sinks=sinks).scores["streaming"] for sinks in (10**23, 8))
    np.testing.assert_allclose(huge, every, atol=1e-6, rtol=0)
    np.testing.assert_allclose(every, 1.0, atol=1e-6)  # every key a sink: each row's whole weight
    huge, every = (api.layers(text, model=model, band=band).summaries.values["local"] for band in (10**23, 7))
    np.testing.assert_allclose(huge, every, atol=1e-6, rtol=0)
    np.testing.assert_allclose(every, 1.0, atol=1e-6)


def test_the_api_refuses_a_tutorial_head_too_wide_in_one_line():
    import attnviz as api

    with pytest.raises(api.AttnvizError, match="^--d-q 100000000000000000000000: at most 65,536 features$"):
        api.trace("the cat", model="bundled", layout="single-head", weights="random", d_q=10**23)

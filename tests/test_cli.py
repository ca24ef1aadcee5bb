"""The command line end to end: real model, real files, one-line errors."""

import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from attnviz.cli import run
from attnviz.output.runs import MANIFEST

HEAD_FILES = [f"head_{h:02d}.png" for h in range(12)]
ENGLISH = "The animal didn't cross the street because it was too tired."


def heads(*args):
    return run(["heads", *args, "--model", "bundled"])


@pytest.fixture(scope="module")
def bert(reference_bert):
    return reference_bert


@pytest.mark.parametrize("text", ["我想吃酸菜鱼", ENGLISH])
def test_heads_writes_every_head_the_grid_and_berts_own_weights(text, tmp_path, capsys, bert):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert heads(text, "--out", str(tmp_path / "run")) == 0
    assert not [w for w in caught if "missing from font" in str(w.message)]

    written = sorted(path.name for path in (tmp_path / "run").iterdir())
    assert written == sorted(HEAD_FILES + ["heads.png", "attention.json", "report.html", MANIFEST])
    for name in HEAD_FILES + ["heads.png"]:
        assert (tmp_path / "run" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    record = json.loads((tmp_path / "run" / "attention.json").read_text(encoding="utf-8"))
    tokenizer, model = bert
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch, output_attentions=True).attentions[0][0].numpy()
    assert record["text"] == text and record["layer"] == 0 and record["weights"] == "pretrained"
    assert record["num_heads"] == 12 and record["device"] == "cpu" and record["model"] == "all-MiniLM-L6-v2"
    assert record["query_tokens"] == record["key_tokens"] == tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    np.testing.assert_allclose(np.array(record["attention"]), expected, atol=1e-5, rtol=0)

    shown = capsys.readouterr().out
    for expected_text in ("all-MiniLM-L6-v2", "layer", "cpu", "pretrained", "[CLS]", "[SEP]", "entropy", "heads.png"):
        assert expected_text in shown


@pytest.mark.slow
def test_default_run_folders_are_named_after_the_text_and_never_overwritten(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert heads("我爱中国") == 0
    assert heads("我爱中国", "--format", "svg") == 0
    assert sorted(path.name for path in (tmp_path / "outputs").iterdir()) == ["我爱中国", "我爱中国-2"]
    assert (tmp_path / "outputs" / "我爱中国-2" / "head_00.svg").exists()


@pytest.mark.slow
def test_dollar_signs_in_a_text_print_as_themselves_not_as_math(tmp_path):
    # matplotlib reads "$...$" as mathtext: "$$" failed to parse in the head figures' titles
    assert heads("$$ and $x$", "--heads", "2", "--out", str(tmp_path / "dollars")) == 0
    assert run(["compare", "$$", "--heads", "1,2", "--model", "bundled", "--out", str(tmp_path / "compare")]) == 0


@pytest.mark.slow
def test_cross_attention_and_causal_options(tmp_path):
    assert heads("我爱中国", "--kv", "我想吃酸菜鱼", "--heads", "2", "--out", str(tmp_path / "kv")) == 0
    record = json.loads((tmp_path / "kv" / "attention.json").read_text(encoding="utf-8"))
    assert record["kv_text"] == "我想吃酸菜鱼" and record["causal"] is False
    assert np.array(record["attention"]).shape == (2, len(record["query_tokens"]), len(record["key_tokens"]))
    assert heads("我爱中国", "--causal", "--heads", "2", "--out", str(tmp_path / "causal")) == 0
    record = json.loads((tmp_path / "causal" / "attention.json").read_text(encoding="utf-8"))
    assert record["causal"] is True and np.triu(np.array(record["attention"]), k=1).max() == 0
    assert record["causal_note"] is None  # layer 0's input, the embeddings, holds no later token


@pytest.mark.slow
def test_causal_past_layer_0_says_the_mask_is_over_a_bidirectional_models_hidden_states(tmp_path, capsys):
    assert heads("The cat sat.", "--causal", "--layer", "2", "--out", str(tmp_path / "run")) == 0
    record = json.loads((tmp_path / "run" / "attention.json").read_text(encoding="utf-8"))
    assert record["causal_note"].startswith("causal mask over a bidirectional model's hidden states: ")
    assert "a causal mask over a bidirectional model's hidden states" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["heads", "trace"])
def test_causal_cross_attention_is_refused_before_the_model_loads(command, tmp_path, capsys, monkeypatch):
    """tril(Nq, Nk) over two different texts masks nothing meaningful."""
    import attnviz.models.loading

    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))
    args = [command, "我爱中国", "--kv", "我想吃酸菜鱼", "--causal", "--model", "bundled", "--out", str(tmp_path / "r")]
    assert run(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --causal and --kv do not go together") and error.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["heads", "stats", "layers", "trace"])
def test_zero_heads_is_an_error_that_lists_the_counts_dividing_the_model_size(command, tmp_path, capsys):
    assert run([command, "hi", "--heads", "0", "--model", "bundled", "--out", str(tmp_path / "r")]) == 2
    error = capsys.readouterr().err
    divisors = ", ".join(str(count) for count in range(1, 385) if 384 % count == 0)
    assert error == f"error: --heads 0: a layer needs at least one head; choose a count that divides " \
                    f"the model size 384: {divisors}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_setup_calls_the_layer_s_parameters_parameters_and_gives_their_seed(tmp_path, capsys):
    assert heads("the cat", "--weights", "random", "--seed", "11", "--heads", "2", "--out", str(tmp_path)) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^parameters +random, seed 11 *$", shown, re.MULTILINE)
    assert not re.search(r"^weights ", shown, re.MULTILINE)
    assert "index token id" in shown  # the token list's legend


@pytest.mark.slow
def test_unknown_token_notes_say_which_text_they_are_about(tmp_path, capsys):
    emoji = "😀😀 😀😀"
    assert heads("the cat sat", "--kv", emoji, "--heads", "2", "--out", str(tmp_path / "kv")) == 0
    out = " ".join(capsys.readouterr().err.split())  # notes go to stderr
    assert f'tokens of the --kv text "{emoji}" are [UNK]' in out
    lines = tmp_path / "texts.txt"
    lines.write_text(f"{emoji}\n🙂🙂🙂\n", encoding="utf-8")
    assert heads("--file", str(lines), "--heads", "2", "--out", str(tmp_path / "batch")) == 0
    out = " ".join(capsys.readouterr().err.split())
    assert f'tokens of the text "{emoji}" are [UNK]' in out and 'tokens of the text "🙂🙂🙂" are [UNK]' in out


LONG_TEXT = "word " * 600

BAD_INPUTS = {
    "empty text": ([""], "the text is empty"),
    "blank text": (["  \n\t "], "the text is empty"),
    "too long": ([LONG_TEXT], "the text has 602 tokens, more than the model's 512 positions; shorten it or pass --truncate"),
    "heads that do not divide": (["hi", "--heads", "5"], "5 heads do not divide the model size 384; choose one of: 1, 2, 3, 4, 6, 8"),
    "layer too high": (["hi", "--layer", "6"], "layer 6 is out of range: all-MiniLM-L6-v2 has layers 0 to 5"),
    "negative layer": (["hi", "--layer", "-1"], "layer -1 is out of range"),
    "unknown weights": (["hi", "--weights", "trained"], "'trained' is not one of"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_code_2_and_writes_nothing(case, tmp_path, capsys):
    args, message = BAD_INPUTS[case]
    assert heads(*args, "--out", str(tmp_path / "run")) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error
    assert error.count("\n") == 1, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_truncate_accepts_a_text_longer_than_the_model(tmp_path):
    assert heads(LONG_TEXT, "--truncate", "--out", str(tmp_path)) == 0
    assert len(json.loads((tmp_path / "attention.json").read_text())["query_tokens"]) == 512


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_an_error(tmp_path, capsys):
    assert heads("hi", "--device", "cuda", "--out", str(tmp_path / "run")) == 2
    assert capsys.readouterr().err == "error: --device cuda: torch sees no GPU on this machine; use --device cpu or auto\n"


def test_an_unknown_model_is_an_error_not_a_fallback(tmp_path, capsys):
    assert run(["heads", "hi", "--model", "no-such-org/no-such-bert", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: cannot load model 'no-such-org/no-such-bert'") and error.count("\n") == 1


def test_an_output_folder_that_cannot_be_written_is_an_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert heads("hi", "--out", str(blocker / "run")) == 2
    assert capsys.readouterr().err == f"error: cannot write the output folder {blocker / 'run'}: {blocker} is a file\n"
    assert heads("hi", "--out", str(blocker)) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_models_lists_the_bundled_model(capsys):
    assert run(["models"]) == 0
    assert "all-MiniLM-L6-v2" in capsys.readouterr().out


def test_help_imports_no_heavy_library():
    script = (
        "import sys\n"
        "from attnviz.cli import run\n"
        "for args in (['--help'], ['heads', '--help'], ['models', '--help'], ['stats', '--help'], ['layers', '--help'],\n"
        "             ['compare', '--help'], ['position', '--help'], ['trace', '--help']):\n"
        "    assert run(args) == 0\n"
        "print(sorted({'torch', 'transformers', 'matplotlib'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("[]")
    assert "heads" in result.stdout and "--layer" in result.stdout


COMMANDS = ("heads", "report", "stats", "layers", "compare", "position", "diff", "roles", "compose", "generate", "patch", "trace", "why", "serve", "models")


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    """`attnviz --help` (key "") and every command's --help, at 80 columns, from one process."""
    script = (
        "from attnviz.cli import run\n"
        f"for command in ('', *{COMMANDS!r}):\n"
        "    assert run([command, '--help'] if command else ['--help']) == 0\n"
        "    print('\\f')\n"
    )
    env = {**os.environ, "COLUMNS": "80"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return dict(zip(("", *COMMANDS), result.stdout.split("\f\n")))


def test_every_command_has_a_complete_one_line_summary(help_texts):
    listing = help_texts[""].split("Commands:\n", 1)[1]
    summaries = {}  # a summary may wrap onto indented lines below its command
    for line in listing.splitlines():
        name, _, rest = line.strip().partition(" ")
        if line.startswith("  ") and not line.startswith("   "):
            summaries[name] = rest.strip()
        elif line.strip():
            summaries[list(summaries)[-1]] += " " + line.strip()
    assert sorted(summaries) == sorted(COMMANDS)
    for name, summary in summaries.items():
        assert summary.endswith(".") and not summary.endswith("..."), (name, summary)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_writes_option_types_as_typer_does(command, help_texts):
    """Each option's type as typer 0.29 writes it (<int>, <path>, a choice's values as <a|b>; a metavar where a command
    gives one), with no patch of typer's classes: the types the tests read are typer's own."""
    text = help_texts[command]
    if command not in ("models", "serve", "compose"):  # compose reads the weights alone: no text
        assert "TEXT <str>" in text and "--out <path>" in text  # the text argument, --out
    if command == "compose":
        assert "TEXT" not in text and "--out <path>" in text and "--top N" in text
    if command != "models":
        assert "--device <auto|cpu|cuda>" in text
    if command == "serve":  # no text and no files: the page's and the requests' texts
        assert "--model NAME" in text and "--port <int range>" in text and "--host <str>" in text and "--max-tokens N" in text
    if command in ("heads", "trace"):
        assert "--layer <int range>" in text and "--seed <int range>" in text  # a bounded int, as typer writes it
        assert "--weights <pretrained|random>" in text
        assert "parameters" in text.split("--weights", 1)[1][:200]  # --weights is about the layer's parameters
    if command == "heads":
        assert "--head N" in text and "--format <png|svg|pdf>" in text


def test_no_class_of_typer_is_patched():
    """The command line uses typer through its public names: building it changes none of typer's classes."""
    script = (
        "from typer import core\n"
        "before = {kind: dict(vars(kind)) for kind in (core.TyperArgument, core.TyperOption)}\n"
        "from attnviz.cli import run\nassert run(['heads', '--help']) == 0\n"  # every command's options built
        "print('\\f', [kind.__name__ for kind in before if dict(vars(kind)) != before[kind]])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split("\f")[-1].strip() == "[]"


def test_version_prints_the_package_version_without_importing_torch():
    from importlib.metadata import version

    import attnviz

    script = "import sys\nfrom attnviz.cli import run\nrun(['--version'])\nprint('torch' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [f"attnviz {version('attnviz')}", "False"]
    assert version("attnviz") == attnviz.__version__


def test_the_console_scripts_version_is_the_commands_and_imports_no_torch():
    """attnviz --version: the command line's one answer (no second way to print it), without torch."""
    from importlib.metadata import version

    script = (
        "import atexit, sys\nsys.argv = ['attnviz', '--version']\nfrom attnviz.__main__ import main\n"
        "atexit.register(lambda: print(sorted({'torch', 'transformers', 'matplotlib'} & set(sys.modules))))\nmain()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"attnviz {version('attnviz')}", "[]"]


def test_python_dash_m_and_the_console_script_run(tmp_path):
    env = {**os.environ, "COLUMNS": "80"}
    module = subprocess.run([sys.executable, "-m", "attnviz", "--help"], capture_output=True, text=True, env=env)
    assert module.returncode == 0 and "heads" in module.stdout
    script = os.path.join(os.path.dirname(sys.executable), "attnviz")
    usage = subprocess.run([script, "heads"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and usage.stderr.lower().startswith("error: missing argument 'text'")


SEED_HEAD = {"d_q", "d_out"}  # trace's alone: the single-head tutorial's own sizes
EVERY_OPTION = {
    "model", "layer", "heads", "weights", "seed", "kv", "causal", "stack", "device", "dtype", "truncate", "words", "memory",
    "allow_pickle", "layer_at_a_time",
} | SEED_HEAD  # fmt: skip
OFFERED = {  # the run options each command offers: those its API function takes (docs/python.md)
    "heads": EVERY_OPTION - SEED_HEAD,
    "trace": EVERY_OPTION,
    "report": EVERY_OPTION - SEED_HEAD,
    "stats": EVERY_OPTION - {"layer", "kv"} - SEED_HEAD,
    "layers": EVERY_OPTION - {"layer", "kv"} - SEED_HEAD,
    "compare": {"model", "layer", "seed", "device", "dtype", "truncate", "allow_pickle"},
    "position": {"model", "device", "dtype", "allow_pickle"},
    "diff": {"model", "seed", "stack", "device", "dtype", "truncate", "memory", "allow_pickle", "layer_at_a_time"},
    "generate": {"model", "layer", "seed", "device", "dtype", "layer_at_a_time"},
    "roles": {"model", "stack", "device", "dtype", "truncate", "memory", "allow_pickle", "layer_at_a_time"},
    "patch": {"model", "device", "dtype", "truncate", "allow_pickle", "layer_at_a_time"},
    "why": {"model", "layer", "kv", "stack", "device", "dtype", "truncate", "allow_pickle", "layer_at_a_time"},
    "compose": {"model", "device", "allow_pickle", "layer_at_a_time"},  # the weights alone, read in float64
    "models": set(),
    # the models it loads (--model again for more), where and in what; --port, --host and --max-tokens are the server's
    # own settings (serve/explorer.py's ServeSettings), not a run's; a request gives its run's layer, heads, kv...
    "serve": {"model", "device", "dtype", "layer_at_a_time"},
}


def test_each_command_offers_the_run_options_of_its_api_function_under_their_names():
    """A command's parameters named as RunOptions' fields are the options that reach the API (cli/options.run_options)."""
    import dataclasses
    import inspect

    from attnviz.api.options import RunOptions
    from attnviz.cli.main import app

    assert {field.name for field in dataclasses.fields(RunOptions)} == EVERY_OPTION
    commands = {command.name or command.callback.__name__: command.callback for command in app.registered_commands}
    assert set(commands) == set(COMMANDS)
    for name, callback in commands.items():
        assert set(inspect.signature(callback).parameters) & EVERY_OPTION == OFFERED[name], name


def test_run_options_takes_a_commands_options_by_name_and_their_choices_values():
    from attnviz.api.options import RunOptions
    from attnviz.cli.options import Device, Stack, Weights, run_options

    given = run_options(heads=4, weights=Weights.random, stack=Stack.decoder, device=Device.cpu, memory=None)
    assert given == RunOptions(heads=4, weights="random", stack="decoder", device="cpu")
    with pytest.raises(TypeError):  # a command's own parameter is no option: naming it is a bug, not ignored
        run_options(text="hi")


# Each run option on the command line, given a value other than its default, and that value in RunOptions.
GIVEN_OPTIONS = {
    "model": (["--model", "some-model"], "some-model"),
    "layer": (["--layer", "2"], 2),
    "heads": (["--heads", "4"], 4),
    "weights": (["--weights", "random"], "random"),
    "seed": (["--seed", "7"], 7),
    "kv": (["--kv", "a dog"], "a dog"),
    "causal": (["--causal"], True),
    "stack": (["--stack", "decoder"], "decoder"),
    "device": (["--device", "cpu"], "cpu"),
    "dtype": (["--dtype", "float16"], "float16"),
    "truncate": (["--truncate"], True),
    "words": (["--words"], True),
    "memory": (["--memory", "9"], 9),
    "allow_pickle": (["--allow-pickle"], True),
    "layer_at_a_time": (["--layer-at-a-time"], True),
    "d_q": (["--d-q", "8"], 8),
    "d_out": (["--d-out", "8"], 8),
}
REQUIRED = {"diff": ["--against", "random"], "patch": ["--corrupt", "the dog", "--answer", " a", "--wrong", " b"], "why": ["--head", "0", "--query", "0"]}
RUN_COMMANDS = [name for name in COMMANDS if name not in ("serve", "models")]  # those that run through run_command


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_each_option_a_command_offers_reaches_its_run_options_and_no_other(command, monkeypatch, tmp_path):
    """Each command names its options to run_options one by one: every option it offers, given alone on the command
    line, is that option of the RunOptions that reach run_command, and no other option differs from its default."""
    import importlib

    from attnviz.errors import AttnvizError

    module = importlib.import_module(f"attnviz.cli.{command}")
    reached = []

    def stop(options, *args, **kwargs):
        reached.append(options)
        raise AttnvizError("stopped before any work")

    monkeypatch.setattr(module, "run_command", stop)
    for name in sorted(OFFERED[command]):
        args, value = GIVEN_OPTIONS[name]
        reached.clear()
        text = [] if command == "compose" else ["hi"]  # compose reads the weights alone
        assert run([command, *text, *REQUIRED.get(command, []), *args, "--out", str(tmp_path / "run")]) == 2, name
        (options,) = reached
        assert options.keywords() == {name: value}, (command, name)

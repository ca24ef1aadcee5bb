"""The commands and the API say the truth for every family: decoders' own causal mask, grouped-query
heads, an encoder-decoder's --stack, and the refusals (--stack elsewhere, BERT-only commands, --heads
that would break the groups), on tiny checkpoints built with transformers' own classes (tiny_families.py).

Titles are read back from the drawn SVG files, as test_titles.py reads them.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import attnviz
from attnviz.analysis.statistics import absent_key_kinds_note, is_punctuation
from attnviz.cli import run
from tiny_families import build_checkpoint, wordpiece_tokenizer

TEXT = "The cat sat on the mat, because it was tired."
SOURCE = "Le chat."
BIDIRECTIONAL = "bidirectional"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """model_type -> a tiny checkpoint's folder: Llama (6 heads, 2 key/value heads), T5, GPT-2."""
    root = tmp_path_factory.mktemp("cli-families")
    for model_type in ("llama", "t5", "gpt2"):
        build_checkpoint(model_type, root / model_type)
    return {model_type: str(root / model_type) for model_type in ("llama", "t5", "gpt2")}


def drawn_lines(path) -> list[str]:
    """The text lines drawn in an SVG figure, in drawing order (matplotlib writes each as an XML comment)."""
    return re.findall(r"<!-- (.*?) -->", path.read_text(encoding="utf-8"))


def one_line_error(capsys) -> str:
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1, error
    return error


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if any model loads: the refusal must come first."""
    import attnviz.models.loading

    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))


def test_a_decoder_says_its_causal_mask_is_its_own_and_names_its_key_value_heads(folders, tmp_path, capsys):
    """Layer 1 of Llama: on main the setup, title and JSON called this --causal over a bidirectional model."""
    out = tmp_path / "llama"
    assert run(["heads", TEXT, "--model", folders["llama"], "--layer", "1", "--format", "svg", "--out", str(out)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "(Llama, local folder)" in shown
    assert "heads 6 × d=8, 2 key/value heads (grouped-query)" in shown
    assert "mask causal, the model's own: Llama is a decoder, each token attends to itself and the tokens before it" in shown
    assert "index 0 is [CLS]" not in shown and BIDIRECTIONAL not in shown

    record = json.loads((out / "attention.json").read_text(encoding="utf-8"))
    assert record["settings"]["causal"] is True and record["settings"]["stack"] is None
    assert record["causal"] is True
    assert record["causal_note"] == "causal: Llama is a decoder, each token attends to itself and the tokens before it"
    attention = np.array(record["attention"])  # (H, N, N): nothing above the diagonal
    assert np.all(np.triu(attention, k=1) == 0)

    lines = drawn_lines(out / "heads.svg")
    assert "llama · Llama · layer 1 · 6 heads · causal" in lines
    assert any("2 key/value heads (grouped-query)" in line for line in lines)
    assert not any(BIDIRECTIONAL in line for line in lines)


def test_causal_given_to_a_decoder_changes_nothing(folders, tmp_path):
    plain = attnviz.heads(TEXT, model=folders["gpt2"])
    given = attnviz.heads(TEXT, model=folders["gpt2"], causal=True)
    assert plain.spec == given.spec and plain.run.causal and plain.run.model_causal
    np.testing.assert_array_equal(plain.run.attention, given.run.attention)
    assert plain.to_dict()["causal_note"] == "causal: GPT-2 is a decoder, each token attends to itself and the tokens before it"


def test_stack_cross_on_t5_takes_the_keys_from_the_encoder_s_output_for_the_kv_text(folders, tmp_path, capsys):
    out = tmp_path / "t5"
    args = ["heads", "The cat sat.", "--model", folders["t5"], "--stack", "cross", "--kv", SOURCE, "--format", "svg"]
    assert run([*args, "--out", str(out)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    cross = "decoder cross-attention (keys: the encoder's output for: “Le chat.”)"
    assert f"attention {cross}" in shown and "(T5, local folder)" in shown
    assert "mask" not in shown.split("tokens")[0]  # cross-attention is not causal

    record = json.loads((out / "attention.json").read_text(encoding="utf-8"))
    assert record["settings"]["stack"] == "cross" and record["settings"]["kv_text"] == SOURCE
    assert record["causal"] is False and record["causal_note"] is None
    tokenizer = wordpiece_tokenizer()
    source_tokens = tokenizer.convert_ids_to_tokens(tokenizer(SOURCE)["input_ids"])
    text_tokens = tokenizer.convert_ids_to_tokens(tokenizer("The cat sat.")["input_ids"])
    assert record["key_tokens"] == source_tokens  # what the encoder reads
    assert record["query_tokens"] == ["[PAD]", *text_tokens[:-1]]  # the decoder: shifted right behind its start token
    assert np.array(record["attention"]).shape == (4, len(text_tokens), len(source_tokens))

    lines = drawn_lines(out / "head_00.svg")
    assert "t5 · T5 · layer 0 · head 0" in lines and cross in " ".join(lines)  # cut at spaces to fit the figure


def test_stack_decoder_is_causal_and_says_it_is_the_decoder_s_own_mask(folders):
    result = attnviz.heads("The cat sat.", model=folders["t5"], stack="decoder", layer=1)
    assert result.spec.stack == "decoder" and result.run.causal and result.run.model_causal
    assert result.to_dict()["causal_note"] == (
        "causal: T5's decoder attends from each token to itself and the tokens before it"
    )


@pytest.mark.parametrize(
    "model, expected",
    [
        ("gpt2", "error: --stack cross: {folder} is a GPT-2 decoder, not an encoder-decoder; leave --stack out\n"),
        ("bundled", "error: --stack cross: bundled is a BERT encoder, not an encoder-decoder; leave --stack out\n"),
    ],
)
@pytest.mark.parametrize("command", ["heads", "trace"])
def test_stack_on_a_model_that_is_not_an_encoder_decoder_is_refused_before_loading(
    command, model, expected, folders, tmp_path, capsys, no_loading
):
    folder = folders.get(model, model)
    assert run([command, "hi", "--model", folder, "--stack", "cross", "--out", str(tmp_path / "r")]) == 2
    assert one_line_error(capsys) == expected.format(folder=folder)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["stats", "layers"])
def test_every_layer_commands_refuse_cross_attention_before_loading(command, folders, tmp_path, capsys, no_loading):
    assert run([command, "hi", "--model", folders["t5"], "--stack", "cross", "--out", str(tmp_path / "r")]) == 2
    assert "--stack cross: stats and layers measure self-attention" in one_line_error(capsys)


def test_stack_on_a_loaded_decoder_is_refused_by_the_api(folders):
    model = attnviz.load(folders["llama"])
    with pytest.raises(attnviz.AttnvizError, match="is a Llama decoder, not an encoder-decoder"):
        attnviz.heads("hi", model=model, stack="decoder")


@pytest.mark.parametrize("command, needs", [("position", "attnviz position needs a BERT model"), ("compare", "attnviz compare needs a BERT model")])
def test_bert_only_commands_refuse_other_families_before_loading(command, needs, folders, tmp_path, capsys, no_loading):
    assert run([command, "hi there", "--model", folders["gpt2"], "--out", str(tmp_path / "r")]) == 2
    error = one_line_error(capsys)
    assert error.startswith(f"error: {needs}") and f"{folders['gpt2']} is a GPT-2 decoder" in error


def test_bert_only_commands_refuse_a_loaded_model_of_another_family(folders):
    model = attnviz.load(folders["gpt2"])
    for command in (attnviz.position, attnviz.compare):
        with pytest.raises(attnviz.AttnvizError, match="needs a BERT model"):
            command("hi there", model=model)


def test_heads_that_would_break_the_key_value_groups_or_t5_s_bias_are_one_line_errors(folders, tmp_path, capsys):
    assert run(["heads", "hi", "--model", folders["llama"], "--heads", "4", "--out", str(tmp_path / "a")]) == 2
    error = one_line_error(capsys)
    assert "6 query heads share 2 key/value heads in groups of 3" in error and "keep the groups whole" in error
    assert run(["heads", "hi", "--model", folders["t5"], "--heads", "2", "--out", str(tmp_path / "b")]) == 2
    assert "position bias" in one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_stats_on_gpt2_says_its_tokens_hold_no_cls_or_sep_and_its_mask_is_its_own(folders, tmp_path, capsys):
    out = tmp_path / "stats"
    assert run(["stats", TEXT, "--model", folders["gpt2"], "--format", "svg", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "hold no [CLS] or [SEP]" in " ".join(captured.err.split())
    assert "--causal" not in captured.out and BIDIRECTIONAL not in captured.out
    record = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert record["causal"] is True
    assert record["causal_note"] == "causal: GPT-2 is a decoder, each token attends to itself and the tokens before it"
    assert record["key_kinds_note"].startswith("the tokens GPT-2 reads here hold no [CLS] or [SEP]")
    assert all(head["cls"] == 0 and head["sep"] == 0 and head["label"] not in ("[CLS]", "[SEP]") for head in record["heads"])
    assert all(head["punctuation"] > 0 for head in record["heads"])  # "," and "." count, "Ġ" or not
    assert not any(BIDIRECTIONAL in line for line in drawn_lines(out / "js_distance.svg"))


def test_punctuation_after_a_space_mark_is_punctuation_and_bert_tokens_need_no_note():
    assert is_punctuation("Ġ,") and is_punctuation("▁.") and is_punctuation("##.")
    assert not is_punctuation("Ġ") and not is_punctuation("Ġcat") and not is_punctuation("▁")
    assert absent_key_kinds_note("BERT", ["[CLS]", "the", "[SEP]"]) is None
    assert "no [SEP]: the sep share is 0" in absent_key_kinds_note("Llama", ["<s>", "[CLS]", "the"])


def test_a_model_handle_names_its_family_and_key_value_heads(folders):
    model = attnviz.load(folders["llama"])
    assert (model.family, model.kind, model.num_heads, model.num_kv_heads) == ("Llama", "decoder", 6, 2)
    assert "Llama decoder" in repr(model) and "6 heads, 2 key/value heads" in repr(model)
    t5 = attnviz.load(folders["t5"])
    assert (t5.family, t5.kind, t5.num_kv_heads) == ("T5", "encoder-decoder", 4)
    assert "key/value" not in repr(t5)


def test_causal_with_stack_cross_is_refused_before_loading(folders, tmp_path, capsys, no_loading):
    """The decoder's queries and the encoder's keys are two sequences: a causal mask has no order to keep between them."""
    assert run(["heads", "hi", "--model", folders["t5"], "--stack", "cross", "--causal", "--out", str(tmp_path / "r")]) == 2
    assert one_line_error(capsys).startswith("error: --causal and --stack cross do not go together")


def test_gpt2_traces_as_the_fused_qkv_layout_on_its_own_c_attn_by_default(folders):
    """GPT-2 stores W_q, W_k, W_v as one Conv1D, c_attn: its trace is the fused-qkv layout, on that weight."""
    from safetensors.torch import load_file

    traced = attnviz.trace(TEXT, model=folders["gpt2"], device="cpu")
    [layout] = traced.trace.layouts
    assert layout.layout == "fused-qkv"
    [weight] = [step for step in layout.steps if step.role == "qkv_weight"]
    assert "h.0.attn.c_attn" in weight.operation
    c_attn = load_file(f"{folders['gpt2']}/model.safetensors")["h.0.attn.c_attn.weight"]  # (D, 3D), as stored
    assert weight.output_shape == list(c_attn.shape)
    assert attnviz.trace(TEXT, model=folders["llama"], device="cpu").trace.layouts[0].layout == "view-permute"

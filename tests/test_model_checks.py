"""A model folder's config.json checked against its weights, RoPE re-splits with the model's own scaling, and threads.

Each test here failed before the family adapters: a config naming the wrong family ran on
random weights, sizes were not checked against the safetensors headers (a million layers ran
until killed), a re-split recomputed RoPE's frequencies from rope_theta alone, and threads
sharing a handle raised KeyError or IndexError from each other's hooks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import attnviz
from attnviz.errors import AttnvizError
from attnviz.models.loading import load_model
from attnviz.layer_inputs import encode_texts, layer_states
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec
from tiny_families import bpe_tokenizer, build_checkpoint, save_checkpoint, wordpiece_tokenizer

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """model_type -> a tiny checkpoint's folder, built once for the module."""
    root = tmp_path_factory.mktemp("checks")
    for model_type in ("llama", "gpt2", "t5", "bart"):
        build_checkpoint(model_type, root / model_type)
    return {model_type: root / model_type for model_type in ("llama", "gpt2", "t5", "bart")}


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A tiny BERT (6 layers, as the bundled one) saved by transformers with the bundled WordPiece."""
    folder = tmp_path_factory.mktemp("bert") / "bert"
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    save_checkpoint(config, transformers.BertModel, wordpiece_tokenizer(), folder)
    return folder


def with_config(source: Path, folder: Path, **changes) -> Path:
    """A copy of a checkpoint folder whose config.json has `changes` (None removes a key); the source is left alone."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    config = {key: value for key, value in config.items() if value is not None}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def refusal(folder: Path) -> str:
    with pytest.raises(AttnvizError) as refused:
        load_model(str(folder))
    message = str(refused.value)
    assert message.startswith(f"cannot load model {str(folder)!r}: ") and "\n" not in message
    return message.removeprefix(f"cannot load model {str(folder)!r}: ")


# ---- a config that names the wrong family: never random weights ------------------------------------


def test_a_llama_config_over_bert_tensors_is_refused(tmp_path, bert_folder, checkpoints):
    llama = config_of(checkpoints["llama"])
    folder = tmp_path / "bert-as-llama"
    shutil.copytree(bert_folder, folder)
    (folder / "config.json").write_text(json.dumps(llama))
    assert refusal(folder) == (
        "the weights lack embed_tokens.weight, which every Llama model has: config.json's model_type 'llama' "
        "does not describe them, or they are damaged"
    )


def test_a_gpt2_config_over_llama_tensors_is_refused(tmp_path, checkpoints):
    gpt2 = config_of(checkpoints["gpt2"])
    folder = tmp_path / "llama-as-gpt2"
    shutil.copytree(checkpoints["llama"], folder)
    (folder / "config.json").write_text(json.dumps(gpt2))
    assert refusal(folder).startswith("the weights lack wte.weight, which every GPT-2 model has")


def test_a_bart_config_over_t5_tensors_is_refused(tmp_path, checkpoints):
    """T5's shared.weight has BART's shape here (same vocabulary and width): the layers are what differ."""
    bart = config_of(checkpoints["bart"])
    folder = tmp_path / "t5-as-bart"
    shutil.copytree(checkpoints["t5"], folder)
    (folder / "config.json").write_text(json.dumps(bart))
    assert refusal(folder) == (
        "config.json's encoder_layers is 2, but the weights hold none (no encoder.layers.0.self_attn.q_proj.weight) "
        "of those encoder layers"
    )


@pytest.mark.slow  # fresh processes
def test_a_bert_folder_whose_config_says_gpt2_exits_2_with_one_line(tmp_path, bert_folder):
    """On main: exit 1, "ModuleList has no attribute `6`" (GPT-2's default 12 layers over 6)."""
    folder = with_config(bert_folder, tmp_path / "bert-as-gpt2", model_type="gpt2")
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", "heads", TEXT, "--model", str(folder), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "the weights lack wte.weight, which every GPT-2 model has" in done.stderr


def save_tensors(folder: Path, change) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_a_missing_tensor_is_refused_not_left_random(tmp_path, checkpoints):
    folder = with_config(checkpoints["llama"], tmp_path / "no-mlp")
    save_tensors(folder, lambda tensors: tensors.pop("layers.1.mlp.down_proj.weight"))
    assert refusal(folder) == (
        "1 tensor missing from the weights (they would be random) (layers.1.mlp.down_proj.weight): "
        "config.json does not describe these weights as a Llama model"
    )


def test_an_unexpected_tensor_is_refused(tmp_path, checkpoints):
    folder = with_config(checkpoints["gpt2"], tmp_path / "extra")
    save_tensors(folder, lambda tensors: tensors.update({"h.0.extra.weight": torch.zeros(2, 2), "h.1.extra.weight": torch.zeros(2)}))
    assert refusal(folder) == (
        "2 tensors in the weights but not in the model (h.0.extra.weight, h.1.extra.weight): "
        "config.json does not describe these weights as a GPT-2 model"
    )


def test_a_task_heads_tensors_are_left_unused(tmp_path):
    """LlamaForCausalLM's lm_head sits beside the base model (model.*): it is not the attention's, and not an error."""
    folder = tmp_path / "llama-lm"
    config = transformers.LlamaConfig(vocab_size=400, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                      tie_word_embeddings=False)  # fmt: skip
    model = save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), folder)
    assert "lm_head.weight" in load_file(folder / "model.safetensors")
    loaded = load_model(str(folder))
    assert torch.equal(loaded.model.model.layers[1].self_attn.q_proj.weight, model.model.layers[1].self_attn.q_proj.weight)


def test_a_task_head_beside_unprefixed_weights_is_left_unused(tmp_path, checkpoints):
    """T5 v1.1's kind: shared, encoder and decoder with no prefix, and an lm_head of its own beside them."""
    folder = with_config(checkpoints["t5"], tmp_path / "t5-lm")
    save_tensors(folder, lambda tensors: tensors.update({"lm_head.weight": torch.ones(30522, 32)}))
    loaded = load_model(str(folder))
    expected = load_file(checkpoints["t5"] / "model.safetensors")["encoder.block.1.layer.0.SelfAttention.q.weight"]
    assert torch.equal(loaded.model.model.encoder.block[1].layer[0].SelfAttention.q.weight, expected)


# ---- every size against the safetensors headers, before anything is built -------------------------


@pytest.mark.slow  # fresh processes
def test_a_million_layers_are_refused_from_the_headers_at_once(tmp_path, checkpoints):
    """On main transformers built the million layers until killed: here a fresh process must answer within a minute."""
    folder = with_config(checkpoints["llama"], tmp_path / "million", num_hidden_layers=1_000_000)
    code = "import sys; from attnviz.models.loading import load_model; load_model(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert "config.json's num_hidden_layers is 1000000, but the weights hold 2 of those layers" in done.stderr


@pytest.mark.parametrize(
    ("model_type", "changes", "message"),
    [
        (
            "llama",
            {"num_attention_heads": 4},  # config.json keeps head_dim 8: q_proj would have 4 × 8 rows, not 6 × 8
            "config.json does not match the weights: layers.0.self_attn.q_proj.weight is (48, 48) there, but "
            "num_attention_heads × head_dim by hidden_size make it (32, 48)",
        ),
        (
            "llama",
            {"num_key_value_heads": 3},
            "config.json does not match the weights: layers.0.self_attn.k_proj.weight is (16, 48) there, but "
            "num_key_value_heads × head_dim by hidden_size make it (24, 48)",
        ),
        (
            "llama",
            {"vocab_size": 500},
            "config.json does not match the weights: embed_tokens.weight is (400, 48) there, but vocab_size by hidden_size make it (500, 48)",
        ),
        (
            "gpt2",
            {"n_positions": 128},
            "config.json does not match the weights: wpe.weight is (64, 32) there, but n_positions by n_embd make it (128, 32)",
        ),
        (
            "t5",
            {"d_kv": 4},
            "config.json does not match the weights: encoder.block.0.layer.0.SelfAttention.q.weight is (32, 32) there, "
            "but num_heads × d_kv by d_model make it (16, 32)",
        ),
        ("t5", {"num_decoder_layers": 3}, "config.json's num_decoder_layers is 3, but the weights hold 2 of those decoder layers"),
        ("llama", {"rope_theta": 0.0, "rope_parameters": None}, "config.json: rope_theta must be a positive number, not 0.0"),
        (  # a size the adapter does not read: transformers' own accounting, in attnviz's words
            "llama",
            {"intermediate_size": 32},
            "6 tensors of another shape than the model's (layers.0.mlp.down_proj.weight, layers.0.mlp.gate_proj.weight, "
            "layers.0.mlp.up_proj.weight, ...): config.json does not describe these weights as a Llama model",
        ),
    ],
)
def test_a_size_the_weights_contradict_is_named(tmp_path, checkpoints, model_type, changes, message):
    folder = with_config(checkpoints[model_type], tmp_path / "changed", **changes)
    assert refusal(folder) == message


# ---- RoPE re-split with the model's own rope type and scaling ------------------------------------


def test_a_resplit_of_llama3_scaled_rope_equals_transformers_attention_with_those_heads(tmp_path):
    """--heads 4 on 8 query heads over 2 key/value heads with llama3 RoPE scaling: 4 heads of 16 features over 1.

    On main the re-split recomputed the frequencies from rope_theta alone (2.8e-3 off at full size).
    """
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}  # fmt: skip
    config = transformers.LlamaConfig(vocab_size=400, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                      rope_parameters=rope)  # fmt: skip
    folder = tmp_path / "llama3-rope"
    model = save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), folder)
    loaded = load_model(str(folder))
    spec = run_spec(loaded, str(folder), layer=1, num_heads=4)
    [run] = run_attention(loaded, [TEXT], spec)
    assert (run.num_heads, run.num_kv_heads, run.head_dim) == (4, 1, 16)

    resplit = transformers.LlamaConfig(
        **{**model.config.to_dict(), "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16}, attn_implementation="eager"
    )
    attention = transformers.models.llama.modeling_llama.LlamaAttention(resplit, layer_idx=1).eval()
    attention.load_state_dict(model.layers[1].self_attn.state_dict())
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(resplit)
    assert rotary.rope_type == "llama3"
    hidden = layer_states(loaded, encode_texts(loaded, [TEXT], spec), [1], spec)[1].queries  # what enters layer 1
    positions = torch.arange(hidden.shape[1])[None]
    mask = torch.full((hidden.shape[1],) * 2, float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        _, expected = attention(hidden, rotary(hidden, positions), attention_mask=mask)
    assert torch.allclose(torch.from_numpy(run.attention), expected[0], atol=1e-5, rtol=0)


# ---- one handle, several threads ------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "t5"])
def test_four_threads_on_one_handle_get_the_single_threaded_results(checkpoints, model_type):
    """On main the threads' hooks saw each other's forward passes: KeyError or IndexError."""
    handle = attnviz.load(str(checkpoints[model_type]), device="cpu", cache=False)
    texts = [TEXT, "Attention is all you need, they said.", "我想吃酸菜鱼", "The mat was tired of the cat."]
    expected = {(text, layer): attnviz.heads(text, model=handle, layer=layer).attention for text in texts for layer in (0, 1)}
    results, errors = {}, []

    def work(text: str) -> None:
        try:
            for _ in range(3):
                for layer in (0, 1):
                    results.setdefault((text, layer), []).append(attnviz.heads(text, model=handle, layer=layer).attention)
        except Exception as error:  # noqa: BLE001 - the test reports any error a thread met
            errors.append(error)

    threads = [threading.Thread(target=work, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for key, attentions in results.items():
        assert len(attentions) == 3
        for attention in attentions:
            np.testing.assert_array_equal(attention, expected[key])

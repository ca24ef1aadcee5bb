"""--dtype: the model loads and attnviz's layer computes in float32, bfloat16 or float16, and equals transformers there.

A tiny Llama-style checkpoint (grouped-query heads, RoPE, RMSNorm) is built here with transformers'
own classes. In each dtype, attnviz's weights are compared with transformers' eager
output_attentions of the same checkpoint loaded in the same dtype.

Tolerance in half precision: a score s is rounded to the dtype, an error of up to eps * |s| (eps:
2**-7 for bfloat16's 8 bits of mantissa, 2**-10 for float16's 11), and two computations of the
same score (attnviz's and eager's: other kernels, another order of sums) may round it one step
apart. A weight p_j = softmax(s)_j moves by p_j (δ_j - Σ_k p_k δ_k) when the scores move by δ, at
most max|δ| in all; so a fixed 1e-2 would be too loose for small scores and too tight for large
ones: the tolerance is eps * max |score| of the layer (scores computed here in float64).
Rows sum to 1 within
eps: each weight rounded to the dtype is off by at most eps / 2 of itself.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from tiny_families import bpe_tokenizer

from attnviz.cli import run
from attnviz.errors import AttnvizError
from attnviz.layer_inputs import encode_texts, layer_states
from attnviz.models.loading import load_model, resolve_dtype
from attnviz.own_layer import build_layer
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec

DTYPES = ["float32", "bfloat16", "float16"]
TEXTS = ["The cat sat on the mat.", "The animal didn't cross the street because it was too tired."]
# Parameters drawn with this spread give scores of up to 3 to 4: rows far from uniform (a weight past 0.4 after
# the first few), a tolerance of 1.4e-2 to 3.3e-2 in bfloat16 and 1.8e-3 to 4.2e-3 in float16 (measured differences: 0.1 to 0.3 of it).
PARAMETER_STD = 0.12


def llama_config(**given) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=400, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0, **given,
    )  # fmt: skip


def build_llama(folder: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A tiny LlamaModel saved in dtype (config.json's dtype says it), parameters drawn from PARAMETER_STD."""
    torch.manual_seed(0)
    model = transformers.LlamaModel(llama_config(attn_implementation="eager")).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, PARAMETER_STD)
    tokenizer = bpe_tokenizer(bos=True)
    model.to(dtype).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return str(build_llama(tmp_path_factory.mktemp("tiny-llama")))


def eager_attentions(folder: str, dtype: str, ids: list[int], layer: int) -> np.ndarray:
    """transformers' own eager output_attentions of layer `layer`, the model loaded in dtype: (H, N, N) as float32."""
    model = transformers.LlamaModel.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([ids]), output_attentions=True).attentions[layer][0].float().numpy()


def largest_score(loaded, text: str, spec) -> float:
    """max |q k^T * scale| of the layer over the text, in float64 from the layer's own input and projections."""
    states = layer_states(loaded, encode_texts(loaded, [text], spec), [spec.layer], spec)[spec.layer]
    layer = build_layer(loaded, spec).double()
    with torch.no_grad():
        q, k, _ = layer.project(states.queries.double())
        return float((q @ k.transpose(-2, -1) * layer.scale).abs().max())


def tolerance(dtype: str, scores: float) -> float:
    return 1e-5 if dtype == "float32" else torch.finfo(getattr(torch, dtype)).eps * scores


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [0, 1])
def test_weights_in_each_dtype_equal_transformers_eager_attentions_in_that_dtype(llama, dtype, layer):
    loaded = load_model(llama, "cpu", dtype=dtype)
    assert loaded.dtype == dtype
    assert {parameter.dtype for parameter in loaded.model.model.parameters()} == {getattr(torch, dtype)}
    spec = run_spec(loaded, layer=layer)
    assert spec.dtype == dtype
    for text in TEXTS:
        [run] = run_attention(loaded, [text], spec)
        assert run.attention.dtype == np.float32 and run.dtype == dtype
        expected = eager_attentions(llama, dtype, run.query_ids, layer)
        assert expected[:, 3:].max() > 0.4  # rows past the first few far from uniform (<= 1/4): the comparison can fail
        allowed = tolerance(dtype, largest_score(loaded, text, spec))
        assert allowed < 0.05  # in bfloat16: a test that still tells weights apart
        np.testing.assert_allclose(run.attention, expected, atol=allowed, rtol=0)
        row_error = 1e-5 if dtype == "float32" else torch.finfo(getattr(torch, dtype)).eps
        np.testing.assert_allclose(run.attention.sum(-1), 1.0, atol=row_error, rtol=0)
        assert np.all(np.triu(run.attention, 1) == 0)  # causal: nothing on later keys, in any dtype


def test_the_layer_computes_in_the_models_dtype_from_one_layers_copied_projections(llama):
    loaded = load_model(llama, "cpu", dtype="bfloat16")
    layer = build_layer(loaded, run_spec(loaded, layer=1))
    assert {parameter.dtype for parameter in layer.parameters()} == {torch.bfloat16}
    copied = sum(parameter.numel() for parameter in layer.parameters())
    own = loaded.model.model.layers[1].self_attn
    assert copied == sum(parameter.numel() for parameter in own.parameters())  # one layer's projections, not the model
    assert layer.w_q.weight.data_ptr() != own.q_proj.weight.data_ptr()  # a copy: the model's tensors stay its own
    random = build_layer(loaded, run_spec(loaded, layer=1, weights="random"))
    assert {parameter.dtype for parameter in random.parameters()} == {torch.bfloat16}


def test_auto_is_float32_on_the_cpu_and_the_checkpoints_own_on_a_gpu(tmp_path):
    folder = build_llama(tmp_path / "bf16", torch.bfloat16)
    config = json.loads((folder / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert load_model(str(folder), "cpu").dtype == "float32"  # default: auto
    assert resolve_dtype("auto", "cuda", config) == "bfloat16"
    assert resolve_dtype("auto", "cuda", {"torch_dtype": "float16"}) == "float16"
    assert resolve_dtype("auto", "cuda", {}) == "float32"  # no dtype named: float32
    assert resolve_dtype("float16", "cpu", config) == "float16"


def test_the_bundled_bert_follows_the_dtype_too():
    loaded = load_model("bundled", "cpu", dtype="bfloat16")
    assert {parameter.dtype for parameter in loaded.model.parameters()} == {torch.bfloat16}
    reference = load_model("bundled", "cpu", dtype="float32")
    [half] = run_attention(loaded, TEXTS[:1], run_spec(loaded))
    [full] = run_attention(reference, TEXTS[:1], run_spec(reference))
    assert half.dtype == "bfloat16" and full.dtype == "float32"
    allowed = tolerance("bfloat16", largest_score(reference, TEXTS[0], run_spec(reference)))
    np.testing.assert_allclose(half.attention, full.attention, atol=allowed, rtol=0)


def test_the_api_load_caches_one_handle_per_dtype_and_refuses_another_dtype_for_a_handle(llama):
    import attnviz

    half = attnviz.load(llama, "cpu", dtype="bfloat16")
    assert half.dtype == "bfloat16" and attnviz.load(llama, "cpu", dtype="bfloat16") is half
    full = attnviz.load(llama, "cpu")
    assert full.dtype == "float32" and full is not half and attnviz.load(llama, "cpu", dtype="float32") is full
    assert attnviz.heads(TEXTS[0], model=half).run.dtype == "bfloat16"
    with pytest.raises(AttnvizError, match="loaded in bfloat16, not float16"):
        attnviz.heads(TEXTS[0], model=half, dtype="float16")


def test_a_dtype_outside_the_four_is_one_line_before_loading(capsys, monkeypatch):
    import attnviz
    import attnviz.models.loading

    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))
    with pytest.raises(AttnvizError, match=r"^unknown dtype 'float64': choose auto, float32, bfloat16 or float16$"):
        attnviz.heads("the cat", dtype="float64")
    assert run(["heads", "the cat", "--model", "bundled", "--dtype", "float64"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "float64" in error and "bfloat16" in error


def test_the_command_line_writes_the_dtype_where_it_is_not_float32(llama, tmp_path):
    assert run(["heads", TEXTS[0], "--model", llama, "--dtype", "bfloat16", "--figures", "none", "--out", str(tmp_path / "half"), "-q"]) == 0
    record = json.loads((tmp_path / "half" / "attention.json").read_text())
    assert record["dtype"] == "bfloat16" and record["settings"]["dtype"] == "bfloat16"
    assert run(["heads", TEXTS[0], "--model", llama, "--figures", "none", "--out", str(tmp_path / "full"), "-q"]) == 0
    record = json.loads((tmp_path / "full" / "attention.json").read_text())
    assert "dtype" not in record and "dtype" not in record["settings"]  # a float32 run's file as before --dtype


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU")
def test_auto_on_cuda_is_the_checkpoints_dtype_and_equals_the_cpus_float32_numbers(tmp_path):
    folder = str(build_llama(tmp_path / "bf16", torch.bfloat16))
    on_gpu, on_cpu = load_model(folder, "cuda"), load_model(folder, "cpu")
    assert on_gpu.dtype == "bfloat16" and on_cpu.dtype == "float32"
    assert {parameter.device.type for parameter in on_gpu.model.model.parameters()} == {"cuda"}
    for layer in (0, 1):
        spec = run_spec(on_cpu, layer=layer)
        gpu_runs = run_attention(on_gpu, TEXTS, run_spec(on_gpu, layer=layer, device="cuda"))
        for text, gpu_run, cpu_run in zip(TEXTS, gpu_runs, run_attention(on_cpu, TEXTS, spec)):
            assert gpu_run.dtype == "bfloat16" and gpu_run.device == "cuda"
            # The bfloat16 model's every step rounds, not the scores alone: twice the bound of a same-dtype comparison.
            allowed = 2 * tolerance("bfloat16", largest_score(on_cpu, text, spec))
            np.testing.assert_allclose(gpu_run.attention, cpu_run.attention, atol=allowed, rtol=0)

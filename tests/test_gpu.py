"""The GPU path gives the CPU's numbers. Skipped on a machine where torch sees no GPU (CI has none).

BERT is a tiny checkpoint built here with transformers' BertModel (attnviz's own encoder runs it), so
that the tests need no weights beyond what they build.
"""

import numpy as np
import pytest
import torch

from attnviz.analysis.stats_pass import measure_heads
from attnviz.models.loading import load_model
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU"),
]

TEXTS = ["The cat sat on the mat.", "The animal didn't cross the street because it was too tired."]


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> str:
    from stream_corpus import build_tiny_bert

    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


@pytest.mark.parametrize("weights", ["pretrained", "random"])
@pytest.mark.parametrize("layer", [0, 1])
def test_weights_on_cuda_equal_weights_on_cpu(bert, weights, layer):
    models = {device: load_model(bert, device) for device in ("cpu", "cuda")}
    runs = {
        device: run_attention(loaded, TEXTS, run_spec(loaded, layer=layer, weights=weights, device=device))
        for device, loaded in models.items()
    }
    for on_cpu, on_cuda in zip(runs["cpu"], runs["cuda"]):
        assert on_cuda.device == "cuda"
        np.testing.assert_allclose(on_cuda.attention, on_cpu.attention, atol=1e-4, rtol=0)
        np.testing.assert_allclose(on_cuda.output, on_cpu.output, atol=1e-4, rtol=0)


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"words": True}, {"words": True, "causal": True}])  # attnviz's layers in BERT's place, and beside it; --words
def test_statistics_on_cuda_equal_statistics_on_cpu(bert, options):
    models = {device: load_model(bert, device) for device in ("cpu", "cuda")}
    results = {
        device: measure_heads(loaded, TEXTS, run_spec(loaded, device=device, **options))[0]
        for device, loaded in models.items()
    }
    np.testing.assert_allclose(results["cuda"].values, results["cpu"].values, atol=1e-4, rtol=0)
    np.testing.assert_allclose(results["cuda"].js_distance, results["cpu"].js_distance, atol=1e-4, rtol=0)


@pytest.mark.parametrize("command", ["heads", "stats"])
def test_the_command_line_on_cuda_writes_the_cpu_numbers(bert, tmp_path, capsys, command):
    """End to end: `heads` forks a process for the grid after CUDA is up; `stats` keeps its sums on the GPU."""
    import json

    from attnviz.cli import run

    files = {"heads": "attention.json", "stats": "stats.json"}[command]
    records = {}
    for device in ("cpu", "cuda"):
        assert run([command, TEXTS[1], "--model", bert, "--device", device, "--out", str(tmp_path / device)]) == 0
        records[device] = json.loads((tmp_path / device / files).read_text(encoding="utf-8"))
    assert "cuda (" in capsys.readouterr().out  # the setup names the GPU
    key = {"heads": "attention", "stats": "js_distance"}[command]
    np.testing.assert_allclose(np.array(records["cuda"][key]), np.array(records["cpu"][key]), atol=1e-4, rtol=0)
    if command == "heads":
        assert (tmp_path / "cuda" / "heads.png").stat().st_size > 0


@pytest.mark.parametrize("model_type", ["llama", "t5", "gpt2"])
def test_every_family_on_cuda_equals_the_cpu(model_type, tmp_path):
    """Grouped-query heads and RoPE (Llama), position bias and cross-attention (T5), GPT-2's fused c_attn."""
    from tiny_families import build_checkpoint

    build_checkpoint(model_type, tmp_path / model_type)
    stack = "cross" if model_type == "t5" else None
    runs = {}
    for device in ("cpu", "cuda"):
        loaded = load_model(str(tmp_path / model_type), device)
        runs[device] = run_attention(loaded, TEXTS, run_spec(loaded, layer=1, stack=stack, device=device))
    for on_cpu, on_cuda in zip(runs["cpu"], runs["cuda"]):
        np.testing.assert_allclose(on_cuda.attention, on_cpu.attention, atol=1e-4, rtol=0)


def test_a_long_map_in_blocks_on_cuda_equals_the_cpu(tmp_path):
    """The block path (a map past --memory, written block by block into attention.npy) and every layer's summaries,
    on a tiny Llama (grouped-query heads, RoPE) over 1,500 tokens."""
    from tiny_families import FAMILY_CHECKPOINTS, save_checkpoint

    from attnviz.analysis.head_summaries import summarise_layers

    config, model_class, tokenizer = FAMILY_CHECKPOINTS["llama"]()
    config.max_position_embeddings = 2048
    save_checkpoint(config, model_class, tokenizer(), tmp_path / "llama")
    text = " ".join(["the cat sat on the mat because it was tired"] * 160)
    maps, summaries = {}, {}
    for device in ("cpu", "cuda"):
        loaded = load_model(str(tmp_path / "llama"), device)
        spec = run_spec(loaded, layer=1, device=device, memory=1, truncate=True)
        (run,) = run_attention(loaded, [text], spec)
        assert run.map_on_disk and run.attention.shape[1] >= 1500
        maps[device] = np.asarray(run.attention)
        summaries[device] = summarise_layers(loaded, text, spec, budget_bytes=2**20)
    np.testing.assert_allclose(maps["cuda"], maps["cpu"], atol=1e-4, rtol=0)
    for name, values in summaries["cpu"].values.items():
        np.testing.assert_allclose(summaries["cuda"].values[name], values, atol=1e-4, rtol=1e-4, err_msg=name)


def _causal_lm(folder):
    """A tiny Llama (6 query heads over 2 key/value heads, RoPE) with its own language-model head."""
    import transformers
    from tiny_families import FAMILY_CHECKPOINTS, save_checkpoint

    config, _, tokenizer = FAMILY_CHECKPOINTS["llama"]()
    config.tie_word_embeddings = False
    save_checkpoint(config, transformers.LlamaForCausalLM, tokenizer(), folder, seed=1)
    return str(folder)


def test_patching_on_cuda_equals_the_cpu(tmp_path, device="cuda"):
    """Issue 38: every head's output, q and pattern patched, and the direct attribution, on a grouped-query Llama."""
    import attnviz

    folder = _causal_lm(tmp_path / "llama")
    given = dict(corrupt="The mat sat on the cat because it was tired.", answer=" cat", wrong=" mat", model=folder)
    results = {on: attnviz.patch("The cat sat on the mat because it was tired.", component="q", device=on, **given) for on in ("cpu", device)}
    cpu, gpu = results["cpu"].patching, results[device].patching
    np.testing.assert_allclose([gpu.clean, gpu.corrupt], [cpu.clean, cpu.corrupt], atol=1e-4, rtol=0)
    for name in ("out", "q"):
        np.testing.assert_allclose(gpu.scores[name], cpu.scores[name], atol=1e-4, rtol=0, err_msg=name)
    np.testing.assert_allclose(gpu.direct, cpu.direct, atol=1e-4, rtol=0)


def test_roles_on_cuda_equal_the_cpu(tmp_path, device="cuda"):
    """Issue 37: every head's text scores, prefix matching and copying, on a grouped-query Llama."""
    import attnviz

    folder = _causal_lm(tmp_path / "llama")
    text = " ".join(["the cat sat on the mat because it was tired"] * 3)
    results = {on: attnviz.roles(text, model=folder, device=on) for on in ("cpu", device)}
    cpu, gpu = results["cpu"].scores, results[device].scores
    assert set(gpu) == set(cpu) >= {"previous_token", "induction", "top_256", "prefix_matching", "copying"}
    for name, values in cpu.items():
        np.testing.assert_allclose(gpu[name], values, atol=1e-4, rtol=0, err_msg=name)


@pytest.fixture(scope="module")
def llama_folders(tmp_path_factory):
    """(a tiny grouped-query Llama stored in bfloat16, the same values stored in float32): test_layer_at_a_time's pair."""
    import transformers
    from test_layer_at_a_time import tiny_llama
    from tiny_families import bpe_tokenizer

    folder = tmp_path_factory.mktemp("gpu-llama")
    stored = tiny_llama(folder / "bf16" / "llama", torch.bfloat16)
    reference = folder / "f32" / "llama"
    transformers.LlamaModel.from_pretrained(stored, dtype=torch.float32).save_pretrained(reference)
    bpe_tokenizer(bos=True).save_pretrained(reference)
    return stored, str(reference)


# where a layer-at-a-time run's layers stay (layer_places): budgets in layers' bytes on the GPU that computes and on a
# second one; None: the model whole on the GPU
PLACES = {
    "whole": None,
    "streamed": {"cuda": 0},  # a GPU with less memory than the checkpoint: every layer read as it runs
    "gpu-and-cpu": {"cuda": 2.5},  # one kept (room for a layer read as it runs is kept free), two read as each runs
    "kept": {"cuda": 2**20},  # every layer read once
    "two-gpus": {"cuda": 2.5, "cuda:1": 1.2},  # one kept, one held on the second GPU, one read as it runs
}
EXPECTED_PLACES = {"gpu-and-cpu": {"layers.0": "cuda"}, "kept": dict.fromkeys(["layers.0", "layers.1", "layers.2"], "cuda"), "two-gpus": {"layers.0": "cuda", "layers.1": "cuda:1"}}


@pytest.mark.parametrize("places", PLACES)
@pytest.mark.parametrize("command", ["heads", "layers", "stats", "roles", "patch", "generate", "why", "compose", "effect", "diff"])
def test_each_command_on_cuda_equals_the_cpu(llama_folders, command, places, monkeypatch):
    """Every command that runs a model (effect, diff, generate, roles, patch, why and compose too) gives the CPU's numbers
    on cuda: the model whole on the GPU; or read a layer's weights at a time from the bfloat16 file (issue 47 part 3),
    its 3 layers placed by accelerate's device map within PLACES' budgets: kept on the GPU, held on a second GPU and
    copied as each runs, or streamed to it as each runs; the reference the float32 file whole on the CPU."""
    import attnviz
    import attnviz.models.layer_weights as layer_weights
    from test_layer_at_a_time import COMMANDS, differences

    budgets = PLACES[places]
    if len(budgets or {}) > torch.cuda.device_count():
        pytest.skip(f"{len(budgets)} GPUs wanted, {torch.cuda.device_count()} seen")
    stored, reference = llama_folders
    cpu = attnviz.load(reference, "cpu", cache=False)
    if budgets is None:
        gpu = attnviz.load(reference, "cuda", cache=False)
    else:
        layer_bytes = 4 * sum(parameter.numel() for parameter in cpu.model.model.layers[0].parameters())
        monkeypatch.setattr(layer_weights, "gpu_budgets", lambda device: {name: int(share * layer_bytes) for name, share in budgets.items()})
        gpu = attnviz.load(stored, "cuda", layer_at_a_time=True, cache=False)
        assert gpu.model.layer_places == EXPECTED_PLACES.get(places, {})
    assert gpu.model.layer_at_a_time == (budgets is not None)
    actual, expected = COMMANDS[command](gpu), COMMANDS[command](cpu)
    # the same numbers within float32's error on another device; the device's and the model's name read as the CPU's
    assert differences(_renamed(actual.to_dict(), gpu.loaded.name, cpu.loaded.name), expected.to_dict(), ("cuda", "cpu")) <= 1e-4


def test_the_gpu_budgets_are_shares_of_each_gpus_free_memory():
    """gpu_budgets: the GPU that computes first, under the name runs give it, then every other GPU by index."""
    import attnviz.models.layer_weights as layer_weights

    budgets = layer_weights.gpu_budgets("cuda")
    others = [f"cuda:{index}" for index in range(torch.cuda.device_count()) if index != torch.cuda.current_device()]
    assert list(budgets) == ["cuda", *others]
    free = torch.cuda.mem_get_info()[0]  # read again: what the caching allocator holds may move it a little
    assert budgets["cuda"] == pytest.approx(layer_weights.KEPT_GPU_SHARE * free, rel=0.05)
    assert layer_weights.gpu_budgets("cpu") == {}


def test_edges_on_cuda_equal_the_cpu(tmp_path):
    """Issue 46: every edge's EAP score and the top edges' path patching, on a grouped-query Llama."""
    import attnviz

    folder = _causal_lm(tmp_path / "llama")
    given = dict(corrupt="The mat sat on the cat because it was tired.", answer=" cat", wrong=" mat", model=folder, edges=True)
    results = {on: attnviz.patch("The cat sat on the mat because it was tired.", device=on, **given).patching.edges for on in ("cpu", "cuda")}
    cpu, gpu = results["cpu"], results["cuda"]
    for name, values in cpu.scores.items():
        np.testing.assert_allclose(gpu.scores[name], values, atol=1e-4, rtol=0, equal_nan=True, err_msg=name)
    assert [edge for edge, _, _ in gpu.checked] == [edge for edge, _, _ in cpu.checked]
    np.testing.assert_allclose([patched for _, _, patched in gpu.checked], [patched for _, _, patched in cpu.checked], atol=1e-4, rtol=0)


def _renamed(value, name: str, other: str):
    """A result's dict with one model's name (a folder's path, in titles and specs) read as the other's."""
    if isinstance(value, dict):
        return {key: _renamed(each, name, other) for key, each in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_renamed(each, name, other) for each in value)
    return value.replace(name, other) if isinstance(value, str) else value

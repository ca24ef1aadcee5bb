"""The GPU path gives the CPU's numbers. Skipped on a machine where torch sees no GPU (CI has none)."""

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


@pytest.mark.parametrize("weights", ["pretrained", "random"])
@pytest.mark.parametrize("layer", [0, 5])
def test_weights_on_cuda_equal_weights_on_cpu(weights, layer):
    models = {device: load_model("bundled", device) for device in ("cpu", "cuda")}
    runs = {
        device: run_attention(loaded, TEXTS, run_spec(loaded, layer=layer, weights=weights, device=device))
        for device, loaded in models.items()
    }
    for on_cpu, on_cuda in zip(runs["cpu"], runs["cuda"]):
        assert on_cuda.device == "cuda"
        np.testing.assert_allclose(on_cuda.attention, on_cpu.attention, atol=1e-4, rtol=0)
        np.testing.assert_allclose(on_cuda.output, on_cpu.output, atol=1e-4, rtol=0)


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"words": True}, {"words": True, "causal": True}])  # attnviz's layers in BERT's place, and beside it; --words
def test_statistics_on_cuda_equal_statistics_on_cpu(options):
    models = {device: load_model("bundled", device) for device in ("cpu", "cuda")}
    results = {
        device: measure_heads(loaded, TEXTS, run_spec(loaded, device=device, **options))[0]
        for device, loaded in models.items()
    }
    np.testing.assert_allclose(results["cuda"].values, results["cpu"].values, atol=1e-4, rtol=0)
    np.testing.assert_allclose(results["cuda"].js_distance, results["cpu"].js_distance, atol=1e-4, rtol=0)


@pytest.mark.parametrize("command", ["heads", "stats"])
def test_the_command_line_on_cuda_writes_the_cpu_numbers(tmp_path, capsys, command):
    """End to end: `heads` forks a process for the grid after CUDA is up; `stats` keeps its sums on the GPU."""
    import json

    from attnviz.cli import run

    files = {"heads": "attention.json", "stats": "stats.json"}[command]
    records = {}
    for device in ("cpu", "cuda"):
        assert run([command, TEXTS[1], "--model", "bundled", "--device", device, "--out", str(tmp_path / device)]) == 0
        records[device] = json.loads((tmp_path / device / files).read_text(encoding="utf-8"))
    assert "cuda (" in capsys.readouterr().out  # the setup names the GPU
    key = {"heads": "attention", "stats": "js_distance"}[command]
    np.testing.assert_allclose(np.array(records["cuda"][key]), np.array(records["cpu"][key]), atol=1e-4, rtol=0)
    if command == "heads":
        assert (tmp_path / "cuda" / "heads.png").stat().st_size > 0  # drawn by the forked process


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

"""Long texts: the layer runs a block of queries at a time and a map past its size goes to attention.npy.

Short texts keep today's attention.json (the weights as text, no attention_file) and a torch
tensor; a map past the size (64 MB, or --memory's MB: here 1, to make the bundled BERT's 400-odd
tokens "long") is a read-only memmap of attention.npy whose rows equal transformers' eager
attentions, and the run folder holds the .npy (a Python result's save, heads --save-map) beside a small
attention.json that names it. On a tiny random Llama at 4,096 tokens (its positions: the text cut there),
sampled rows equal a float64 computation written here, and the process's peak memory stays below the map's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import attnviz

LONG_TEXT = "The cat sat on the mat because it was tired. " * 40  # 442 BERT tokens: a (12, 442, 442) map of 9.4 MB


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


def reference_attention(reference_bert, text: str, layer: int) -> np.ndarray:
    tokenizer, bert = reference_bert
    with torch.no_grad():
        return bert(**tokenizer([text], return_tensors="pt"), output_attentions=True).attentions[layer][0].numpy()


def test_a_short_text_keeps_its_weights_as_text_and_a_tensor(model, tmp_path):
    result = attnviz.heads("The cat sat on the mat.", model=model, layer=1)
    assert isinstance(result.attention, torch.Tensor) and not result.run.map_on_disk
    result.save(tmp_path / "run")
    record = json.loads((tmp_path / "run" / "attention.json").read_text(encoding="utf-8"))
    assert "attention_file" not in record and "memory" not in record["settings"]
    assert np.allclose(np.array(record["attention"]), result.attention.numpy(), atol=1e-7, rtol=0)
    assert not (tmp_path / "run" / "attention.npy").exists()


@pytest.mark.slow
def test_a_short_texts_attention_json_is_the_same_bytes_within_any_budget_that_holds_it(model, tmp_path):
    """--memory does not change a run's numbers nor its files: 2048 MB holds the map whole, the default too."""
    attnviz.heads("The cat sat on the mat.", model=model).save(tmp_path / "default")
    attnviz.heads("The cat sat on the mat.", model=model, memory=2048).save(tmp_path / "large")
    assert (tmp_path / "default" / "attention.json").read_bytes() == (tmp_path / "large" / "attention.json").read_bytes()


@pytest.mark.slow
def test_a_map_past_the_budget_is_a_memmap_of_attention_npy_equal_to_transformers(model, reference_bert, tmp_path):
    result = attnviz.heads(LONG_TEXT, model=model, layer=2, memory=1)
    attention = result.attention
    assert isinstance(attention, np.memmap) and not attention.flags.writeable
    expected = reference_attention(reference_bert, LONG_TEXT, 2)  # (H, N, N)
    assert attention.shape == expected.shape
    assert np.allclose(attention, expected, atol=1e-5, rtol=0)
    assert np.allclose(np.asarray(attention[3, 400]), expected[3, 400], atol=1e-5, rtol=0)  # a notebook's slice

    written = result.save(tmp_path / "run")
    assert tmp_path / "run" / "attention.npy" in written
    record = json.loads((tmp_path / "run" / "attention.json").read_text(encoding="utf-8"))
    assert record["attention"] is None and record["attention_file"] == "attention.npy"
    assert record["attention_shape"] == list(expected.shape) and record["attention_dtype"] == "float32"
    assert record["query_tokens"] == result.tokens and record["layer"] == 2  # every other field kept
    stored = np.load(tmp_path / "run" / "attention.npy", mmap_mode="r")
    assert stored.dtype == np.float32 and np.array_equal(stored, attention)


def test_the_head_summaries_of_a_map_on_disk_are_those_of_the_whole_map(model):
    from attnviz.analysis.statistics import summarize_heads

    on_disk = attnviz.heads(LONG_TEXT, model=model, memory=1).summaries
    whole = summarize_heads(np.asarray(attnviz.heads(LONG_TEXT, model=model).attention.numpy()), False)
    for blocked, expected in zip(on_disk, whole, strict=True):
        assert blocked.entropy == pytest.approx(expected.entropy, abs=1e-5)
        assert blocked.relative_entropy == pytest.approx(expected.relative_entropy, abs=1e-5)
        assert blocked.mean_max == pytest.approx(expected.mean_max, abs=1e-5)
        assert blocked.top_keys == expected.top_keys


LLAMA_SCRIPT = """
import resource, sys
import numpy as np, torch, transformers
sys.path.insert(0, {tests!r})
from tiny_families import _DECODER, bpe_tokenizer, save_checkpoint
import attnviz

folder = {folder!r}
config = transformers.LlamaConfig(num_key_value_heads=2, **{{**_DECODER, "max_position_embeddings": 4096}})
reference = save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), folder)
model = attnviz.load(folder, device="cpu")
attnviz.heads("The cat sat.", model=model, layer=1)  # everything loaded and warm: the peak so far is the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
text = " ".join(["The cat sat on the mat because it was tired."] * 400)
result = attnviz.heads(text, model=model, layer=1, truncate=True, memory=16)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
attention = result.attention
print("memmap", isinstance(attention, np.memmap), attention.shape, attention.nbytes, after - before)

# float64 from layer 1's input as transformers' float32 forward gives it: its projections, RoPE and a row's softmax written here
ids = torch.tensor([result.run.query_ids])
seen = {{}}
def hook(module, args, kwargs):
    seen["hidden"] = kwargs["hidden_states"]
attn = reference.layers[1].self_attn
attn.register_forward_pre_hook(hook, with_kwargs=True)
reference.set_attn_implementation("sdpa")  # no eager maps of 4,096 tokens in the reference either
with torch.no_grad():
    reference(ids)
    hidden = seen["hidden"][0].double()  # (N, D)
    heads, kv_heads, d = 6, 2, 8
    q = (hidden @ attn.q_proj.weight.double().T).view(-1, heads, d).transpose(0, 1)  # (H, N, d)
    k = (hidden @ attn.k_proj.weight.double().T).view(-1, kv_heads, d).transpose(0, 1)  # (H_kv, N, d)
    theta = config.rope_parameters["rope_theta"]
    angles = torch.arange(len(hidden), dtype=torch.float64)[:, None] / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # (N, d)
    turn = lambda x: torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    q, k = q * cos + turn(q) * sin, k * cos + turn(k) * sin
    worst = 0.0
    for head, row in [(0, 0), (2, 1234), (4, 2999), (5, len(ids[0]) - 1)]:
        scores = k[head // 3, : row + 1] @ q[head, row] / d**0.5  # causal: keys 0..row
        weights = torch.softmax(scores, dim=0).numpy()
        got = np.asarray(attention[head, row])
        worst = max(worst, abs(got[: row + 1] - weights).max(), abs(got[row + 1 :]).max(initial=0))
print("worst", worst)
"""


@pytest.mark.slow
def test_a_long_text_on_a_tiny_llama_is_exact_on_sampled_rows_and_never_whole_in_memory(tmp_path):
    from pathlib import Path

    script = LLAMA_SCRIPT.format(tests=str(Path(__file__).parent), folder=str(tmp_path / "llama"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("memmap ", "worst ")))
    assert set(lines) == {"memmap", "worst"}, done.stdout[-3000:]
    fields = lines["memmap"].split()
    assert fields[0] == "True"
    map_bytes, grown = int(fields[-2]), int(fields[-1])
    assert map_bytes == 6 * 4096 * 4096 * 4  # (H, N, N) float32: 384 MB
    assert grown < map_bytes / 2, (grown, map_bytes)
    assert float(lines["worst"]) < 1e-5


@pytest.mark.slow
def test_heads_command_writes_attention_npy_and_a_report_html_without_whole_maps(tmp_path):
    from attnviz.cli import run

    out = tmp_path / "run"
    argv = ["heads", LONG_TEXT, "--model", "bundled", "--memory", "1", "--figures", "grid", "--save-map", "--out", str(out)]
    assert run(argv) == 0
    assert (out / "attention.npy").exists() and (out / "report.html").exists()
    report = (out / "report.html").read_text(encoding="utf-8")
    assert '"attention":null' in report and '"layers":null' in report and '"zoom":' in report  # tests/test_report_long.py
    stored = np.load(out / "attention.npy", mmap_mode="r")
    assert stored.shape[0] == 12 and np.allclose(stored.sum(axis=-1), 1, atol=1e-5)
    manifest = json.loads((out / ".attnviz-files.json").read_text(encoding="utf-8"))
    assert "attention.npy" in manifest["files"]


@pytest.mark.slow
def test_heads_file_writes_each_long_texts_attention_npy_in_its_folder(tmp_path):
    from attnviz.cli import run

    (tmp_path / "texts.txt").write_text(f"The cat sat.\n{LONG_TEXT}\n", encoding="utf-8")
    out = tmp_path / "batch"
    argv = ["heads", "--file", str(tmp_path / "texts.txt"), "--model", "bundled", "--memory", "1", "--no-html", "--save-map", "--out", str(out)]
    assert run(argv) == 0
    short, long = sorted(path for path in out.iterdir() if path.is_dir())
    assert not (short / "attention.npy").exists() and json.loads((short / "attention.json").read_text(encoding="utf-8"))["attention"]
    stored = np.load(long / "attention.npy", mmap_mode="r")
    assert json.loads((long / "attention.json").read_text(encoding="utf-8"))["attention_shape"] == list(stored.shape)

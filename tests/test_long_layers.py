"""stats and layers at long lengths: every layer a block of queries at a time, no map ever whole.

Past the memory budget (here --memory 1 MB makes the bundled BERT's 167 tokens "long": a map of
1.3 MB), stats' statistics and Jensen-Shannon distances are summed block by block of queries and
equal NumPy's per-text definitions on transformers' own maps; layers keeps no map (no .attention, no
rollout) and draws layers.png from block maxima computed from the blocks, pixel for pixel the
whole maps' picture. Short texts keep every file. On a tiny random Llama at 4,096 tokens both run
in a process whose peak memory grows by less than half of one layer's map (slow tier).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_records_match

import attnviz
from attnviz.analysis.statistics import STATISTICS, batch_statistics, head_statistics, js_distance, key_kind_columns
from attnviz.errors import AttnvizError

LONG_TEXT = "The cat sat on the mat because it was tired. " * 15  # 167 BERT tokens: a (12, 167, 167) map of 1.3 MB
SHORT_TEXT = "A dog ran."


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


def reference_maps(reference_bert, text: str) -> list[np.ndarray]:
    """transformers' eager attentions of every layer, (H, N, N) float64 each."""
    tokenizer, bert = reference_bert
    with torch.no_grad():
        attentions = bert(**tokenizer([text], return_tensors="pt"), output_attentions=True).attentions
    return [layer[0].double().numpy() for layer in attentions]


def assert_statistics_close(got: np.ndarray, expected: np.ndarray) -> None:
    """Shares and entropies within 1e-5; distance (tokens, up to ~160) within 1e-5 of its size."""
    distance = STATISTICS.index("distance")
    others = [index for index in range(len(STATISTICS)) if index != distance]
    assert np.abs(got[..., others] - expected[..., others]).max() < 1e-5
    assert np.allclose(got[..., distance], expected[..., distance], rtol=1e-5, atol=1e-5)


# ---- stats ---------------------------------------------------------------------------------------


def test_blocks_of_any_size_add_up_to_the_whole_batchs_statistics():
    """blockwise.block_statistics over a padded, causal batch's query blocks of 1, 5 and N sums to batch_statistics."""
    from attnviz.analysis.blockwise import block_statistics

    generator = torch.Generator().manual_seed(0)
    lengths, num_heads, num_tokens = [11, 7], 4, 11
    scores = torch.randn(2, num_heads, num_tokens, num_tokens, generator=generator, dtype=torch.float64)
    keys = torch.arange(num_tokens)
    masked = (keys[None, None, None, :] > keys[None, None, :, None]) | (keys[None, None, None, :] >= torch.tensor(lengths)[:, None, None, None])
    weights = torch.softmax(scores.masked_fill(masked, -torch.inf), dim=-1)  # causal, zero on padding keys
    tokens = [["[CLS]", *"the cat , sat on the mat".split(), ".", "x", "[SEP]"], ["[CLS]", "a", "dog", "ran", ".", "!", "[SEP]"]]
    kinds, valid = key_kind_columns(tokens, num_tokens), torch.tensor(lengths)
    whole_values, whole_js = batch_statistics(weights, valid, kinds, causal=True)
    for rows in (1, 5, num_tokens):
        values, distances = 0, 0
        for start in range(0, num_tokens, rows):
            block_values, block_js = block_statistics(weights[:, :, start : start + rows], start, valid, kinds, causal=True)
            values, distances = values + block_values, distances + block_js
        assert torch.allclose(values, whole_values, atol=1e-12) and torch.allclose(distances, whole_js, atol=1e-12), rows


@pytest.mark.slow
def test_stats_in_blocks_equal_numpys_definitions_on_transformers_maps(model, reference_bert):
    texts = [LONG_TEXT, SHORT_TEXT]
    result = attnviz.stats(texts, model=model, memory=1, js=True)
    assert isinstance(result.first_run.attention, np.memmap)  # the block path: the first text's layer 0 past 1 MB on disk
    tokenizer, _ = reference_bert
    expected_values, expected_js = 0, 0
    for text in texts:
        tokens = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
        maps = reference_maps(reference_bert, text)
        expected_values = expected_values + np.stack([head_statistics(each, tokens) for each in maps]) / len(texts)
        expected_js = expected_js + np.stack([js_distance(each) for each in maps]) / len(texts)
    assert_statistics_close(result.values, expected_values)
    assert np.abs(result.js_distance - expected_js).max() < 1e-5


@pytest.mark.parametrize("causal", [pytest.param(False, marks=pytest.mark.slow), True])
def test_stats_in_blocks_equal_stats_of_whole_maps(model, causal):
    whole = attnviz.stats([LONG_TEXT, SHORT_TEXT], model=model, causal=causal)
    blocks = attnviz.stats([LONG_TEXT, SHORT_TEXT], model=model, causal=causal, memory=1, js=True)
    assert not isinstance(whole.first_run.attention, np.memmap) and isinstance(blocks.first_run.attention, np.memmap)
    assert_statistics_close(blocks.values, whole.values)
    assert np.abs(blocks.js_distance - whole.js_distance).max() < 1e-5
    assert blocks.labels == whole.labels
    assert np.allclose(blocks.first_run.attention, whole.first_run.attention, atol=1e-6)


# ---- layers --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_layers(model):
    with pytest.warns(attnviz.AttnvizWarning, match="the attention rollout .* is left out"):  # a notebook sees the note
        return attnviz.layers(LONG_TEXT, model=model, memory=1)


@pytest.fixture(scope="module")
def whole_layers(model):
    return attnviz.layers(LONG_TEXT, model=model)


def test_layers_in_blocks_hold_no_map_and_say_so(long_layers, whole_layers):
    assert long_layers.in_blocks and not whole_layers.in_blocks
    assert long_layers.attention is None and long_layers.rollout is None
    assert all(run.attention is None for run in long_layers.layer_runs) and len(long_layers.layer_runs) == 6
    assert "rollout" in long_layers.notes[0] and "block" in long_layers.notes[0]
    assert long_layers.tokens == whole_layers.tokens
    with pytest.raises(AttnvizError, match="no rollout.png for this text"):
        long_layers.figure("rollout")
    with pytest.raises(AttnvizError, match="no report"):
        long_layers.report()


@pytest.mark.slow
def test_layers_block_maxima_are_those_of_transformers_maps(long_layers, reference_bert):
    from attnviz.render.scales import block_maximum

    maps = reference_maps(reference_bert, LONG_TEXT)
    cells = long_layers.maxima.shape[-1]
    assert long_layers.maxima.shape == (6, 12, cells, cells) and cells < len(long_layers.tokens)
    for layer, layer_map in enumerate(maps):
        for head in (0, 5, 11):
            expected = block_maximum(np.ma.asarray(layer_map[head]), cells, cells).filled(np.nan)
            assert np.abs(long_layers.maxima[layer, head] - expected).max() < 1e-5, (layer, head)


@pytest.mark.slow
def test_layers_png_in_blocks_is_the_whole_maps_picture(long_layers, whole_layers, tmp_path):
    from helpers import read_png

    written = long_layers.save(tmp_path / "blocks")
    whole_layers.save(tmp_path / "whole")
    assert {path.name for path in written} == {"layers.png", "summaries.png", "summaries.json"}
    assert np.array_equal(read_png(tmp_path / "blocks" / "layers.png"), read_png(tmp_path / "whole" / "layers.png"))
    for name, values in whole_layers.summaries.values.items():
        assert np.allclose(long_layers.summaries.values[name], values, atol=1e-5, rtol=1e-6), name


@pytest.mark.slow
def test_a_causal_layers_png_in_blocks_masks_the_future_as_the_whole_maps_do(model, tmp_path):
    from helpers import read_png

    with pytest.warns(attnviz.AttnvizWarning):
        attnviz.layers(LONG_TEXT, model=model, causal=True, memory=1).save(tmp_path / "blocks")
    attnviz.layers(LONG_TEXT, model=model, causal=True).save(tmp_path / "whole")
    assert np.array_equal(read_png(tmp_path / "blocks" / "layers.png"), read_png(tmp_path / "whole" / "layers.png"))


def test_layers_in_blocks_refuse_measures_and_words_in_one_line(model):
    with pytest.raises(AttnvizError, match=r"^measure norm over a text this long: [^\n]*$"):
        attnviz.layers(LONG_TEXT, model=model, memory=1, measure="norm")
    with pytest.raises(AttnvizError, match=r"^--words over a text this long: [^\n]*$"):
        attnviz.layers(LONG_TEXT, model=model, memory=1, words=True)


@pytest.mark.slow
def test_a_short_texts_layers_and_stats_files_are_the_same_bytes_within_any_budget_that_holds_them(model, tmp_path):
    for memory in (None, 2048):
        layers = attnviz.layers(SHORT_TEXT, model=model, memory=memory)
        assert layers.attention is not None and layers.rollout is not None and not layers.notes
        layers.save(tmp_path / f"layers{memory}")
        attnviz.stats([SHORT_TEXT], model=model, memory=memory).save(tmp_path / f"stats{memory}")
    for kind in ("layers", "stats"):
        names = sorted(path.name for path in (tmp_path / f"{kind}None").iterdir())
        assert names == sorted(path.name for path in (tmp_path / f"{kind}2048").iterdir())
        for name in names:
            assert (tmp_path / f"{kind}None" / name).read_bytes() == (tmp_path / f"{kind}2048" / name).read_bytes(), name


@pytest.mark.slow
def test_layers_and_stats_commands_on_a_long_text(tmp_path, capsys):
    from attnviz.cli import run

    out = tmp_path / "layers"
    assert run(["layers", LONG_TEXT, "--model", "bundled", "--memory", "1", "--out", str(out)]) == 0
    assert not (out / "rollout.json").exists() and (out / "layers.png").exists() and (out / "summaries.json").exists()
    assert "the attention rollout (N × N products" in " ".join(capsys.readouterr().err.split())
    out = tmp_path / "stats"
    assert run(["stats", LONG_TEXT, "--model", "bundled", "--memory", "1", "--js", "--out", str(out)]) == 0
    record = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert record["num_layers"] == 6 and len(record["heads"]) == 72 and len(record["js_distance"]) == 6
    assert "memory" not in record["settings"]  # how the numbers were computed, not which
    # Past the large-map size the JS distances (H² × N² logs a layer) are measured on request only, and it says so.
    capsys.readouterr()
    assert run(["stats", LONG_TEXT, "--model", "bundled", "--memory", "1", "--out", str(tmp_path / "no-js")]) == 0
    without = json.loads((tmp_path / "no-js" / "stats.json").read_text(encoding="utf-8"))
    assert without["js_distance"] is None
    assert_records_match(without["heads"], record["heads"])  # another run: its numbers within float32
    assert "not measured for a text past 64 MB of maps" in " ".join(capsys.readouterr().out.split())


MEMORY_SCRIPT = """
import resource, sys
import numpy as np, transformers
sys.path.insert(0, {tests!r})
from tiny_families import _DECODER, bpe_tokenizer, save_checkpoint
import attnviz

folder = {folder!r}
config = transformers.LlamaConfig(num_key_value_heads=2, **{{**_DECODER, "max_position_embeddings": 4096}})
save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), folder)
model = attnviz.load(folder, device="cpu")
attnviz.{command}("The cat sat.", model=model)  # everything loaded and warm: the peak so far is the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
text = " ".join(["The cat sat on the mat because it was tired."] * 400)
result = attnviz.{command}(text, model=model, truncate=True, memory=16{js})
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("grown", after - before, 6 * 4096 * 4096 * 4)
print("{command}", {check})
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, check",
    [
        ("stats", "bool(np.isfinite(result.values).all() and np.isfinite(result.js_distance).all())"),
        ("layers", "result.attention is None and result.maxima.shape[:2] == (2, 6) and bool(np.isfinite(result.summaries.values['sink']).all())"),
    ],
)  # fmt: skip
def test_stats_and_layers_of_4096_tokens_never_hold_a_whole_map(command, check, tmp_path):
    js = ", js=True" if command == "stats" else ""
    script = MEMORY_SCRIPT.format(tests=str(Path(__file__).parent), folder=str(tmp_path / "llama"), command=command, check=check, js=js)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("grown ", f"{command} ")))
    assert lines.get(command) == "True", done.stdout[-3000:]
    grown, map_bytes = (int(field) for field in lines["grown"].split())
    assert grown < map_bytes / 2, (grown, map_bytes)  # one layer's (H, N, N) float32 map: 384 MB


@pytest.mark.parametrize("rows", [1, 5, 13, 37])
def test_block_maxima_of_a_causal_map_fed_in_blocks_are_its_masked_block_maxima(rows):
    """BlockMaxima over a causal map's blocks of queries: each block's largest weight over its cells j <= i, -inf
    where it has none, computed here cell by cell in NumPy (blocks of keys past the block's rows are not read)."""
    from attnviz.analysis.long_layers import BlockMaxima

    num_heads, num_tokens, cells = 3, 37, 8
    generator = torch.Generator().manual_seed(7)
    scores = torch.randn(num_heads, num_tokens, num_tokens, generator=generator) * 3
    future = torch.arange(num_tokens)[None, :] > torch.arange(num_tokens)[:, None]  # (N, N): key j after query i
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)  # exactly 0 past each query
    maxima = BlockMaxima(1, num_heads, num_tokens, cells, causal=True)
    for start in range(0, num_tokens, rows):
        maxima.add(0, start, weights[:, start : start + rows])
    edges = [(c * num_tokens + cells - 1) // cells for c in range(cells)] + [num_tokens]
    dense = weights.numpy()
    for head in range(num_heads):
        for r in range(cells):
            for c in range(cells):
                seen = [dense[head, i, j] for i in range(edges[r], edges[r + 1]) for j in range(edges[c], edges[c + 1]) if j <= i]
                assert maxima.values[0, head, r, c] == (max(seen) if seen else -np.inf), (head, r, c)

"""report.html of a long text (past 512 tokens): no whole map in its record (no "attention", no "layers", no rollout,
statistics or trace), the zoom view's pyramid and every layer's summaries instead; short reports unchanged.

The budget: SmolLM2's full context, 9 heads × 8,192 tokens of a causal softmax held as a memory map of a .npy written a
block of rows at a time, with 30 layers × 9 heads of summaries, is a page of at most 25 MB; in Chromium, with every
request blocked, it opens on the Zoom view (within 1 s: measured in bench/report.py --long) and the Summaries view reads out the record's values. End to end:
`attnviz heads` on a tiny Llama with --memory 1 writes report.html, its zoom the block maxima of attention.npy.
"""

from __future__ import annotations

import json
from dataclasses import replace
import math
import re

import numpy as np
import pytest
from helpers import assert_records_match, make_run

from attnviz.analysis.head_summaries import SUMMARIES, TOP_KEYS, LayerSummaries
from attnviz.html import ReportText, report_page, report_record
from attnviz.html.encoding import decode_weights, encode_layers
from attnviz.html.page import LONG_SCRIPTS, SCRIPTS, page_script, static_text
from attnviz.html.pyramid import ZOOM_MIN_TOKENS, levels_bytes
from attnviz.html.record import LONG_TEXT_NOTE, SUMMARIES_LEFT_OUT
from attnviz.output.summaries_json import summaries_record
from attnviz.spec import RunSpec

PAGE_BUDGET_BYTES = 25 * 10**6


def spec_of(num_heads: int, causal: bool = True) -> RunSpec:
    return RunSpec(model=None, resolved_model="m", model_source="bundled", num_heads=num_heads, causal=causal)


def synthetic_summaries(num_layers: int, num_heads: int, tokens: list[str], seed: int = 0) -> LayerSummaries:
    rng = np.random.default_rng(seed)
    values = {name: rng.uniform(0, 1, size=(num_layers, num_heads)) for name in SUMMARIES}
    values["distance"] *= len(tokens) / 3  # in tokens
    values["sink"][0] = [0.9] * (num_heads // 2) + [0.1] * (num_heads - num_heads // 2)  # layer 0: half the heads are sinks
    shares = np.sort(rng.uniform(0, 0.2, size=(num_layers, num_heads, TOP_KEYS)), axis=-1)[..., ::-1]
    top_keys = np.stack([rng.choice(len(tokens), size=TOP_KEYS, replace=False) for _ in range(num_layers * num_heads)])
    return LayerSummaries(
        values=values,
        top_keys=top_keys.reshape(num_layers, num_heads, TOP_KEYS),
        top_shares=shares,
        tokens=tokens,
        shown_tokens=tokens,
        text=" ".join(tokens),
        model="m",
        causal=True,
        rows_per_block=64,
    )


def page_record(page: str) -> dict:
    data = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(data)


def long_report_record(num_tokens: int = 600, num_heads: int = 2, num_layers: int = 4, attention=None, **fields):
    """A long causal text's run (random weights, or attention), synthetic summaries and its report's record;
    fields replace the run's own (model, layer ...)."""
    tokens = [f"w{index}" for index in range(num_tokens)]
    run = replace(make_run(tokens, num_heads=num_heads, causal=True, seed=4, attention=attention), **fields)
    run.model_causal = True
    summaries = synthetic_summaries(num_layers, num_heads, run.query_tokens)
    spec = spec_of(num_heads)
    return run, summaries, spec, report_record([ReportText(run, summaries=summaries)], spec, kind="decoder", num_layers=num_layers)


def test_a_long_texts_record_holds_no_whole_map_and_every_layers_summaries():
    run, summaries, spec, record = long_report_record()
    (text,) = record["texts"]
    assert text["attention"] is None and text["layers"] is None and text["rollout"] is None
    assert text["statistics"] is None and text["trace"] is None and text["mistakes"] == []
    expected = summaries_record(summaries, spec)
    assert text["summaries"] == {name: value for name, value in expected.items() if name not in SUMMARIES_LEFT_OUT}
    assert set(SUMMARIES_LEFT_OUT) == {"format", "version", "settings", "text", "model", "tokens", "shown_tokens"}
    assert text["summaries"]["summaries"]["sink"][0][0] == pytest.approx(0.9) and text["summaries"]["sink_fraction"][0] == 0.5
    # The zoom view's exact rows are the map's own rows, to 4 decimals: the map reached the page only through the pyramid.
    exact = decode_weights(text["zoom"]["exact"])
    np.testing.assert_allclose(exact, run.attention[:, text["zoom"]["exact_rows"]], atol=0.5e-4 + 1e-12, rtol=0)
    assert LONG_TEXT_NOTE in record["notes"]
    page = report_page(record)
    assert page_record(page) == json.loads(json.dumps(record))
    assert "// ---- summaries_view.js ----" in page and "// ---- long_text.js ----" in page


def test_a_short_report_keeps_its_record_and_its_page_script():
    run = make_run([f"w{index}" for index in range(ZOOM_MIN_TOKENS)], num_heads=2, causal=True, seed=4)
    layer_runs = [make_run(run.query_tokens, num_heads=2, causal=True, seed=seed) for seed in range(2)]
    record = report_record([ReportText(run, encode_layers([layer_run.attention for layer_run in layer_runs]))], spec_of(2), kind="decoder", num_layers=2)
    (text,) = record["texts"]
    assert "summaries" not in text and "zoom" not in text and LONG_TEXT_NOTE not in record["notes"]
    np.testing.assert_allclose(decode_weights(text["attention"]), run.attention, atol=0.5e-4 + 1e-12, rtol=0)
    assert decode_weights(text["layers"]).shape == (2, 2, ZOOM_MIN_TOKENS, ZOOM_MIN_TOKENS)
    page = report_page(record)
    # The short page's script is SCRIPTS' files alone, in their order: none of LONG_SCRIPTS.
    assert page_script() == "\n".join(f"// ---- {name} ----\n{static_text(name)}" for name in SCRIPTS)
    assert page_script() in page and not any(f"// ---- {name} ----" in page for name in LONG_SCRIPTS)


def test_the_report_command_summary_names_a_long_texts_summaries():
    from attnviz.cli.report import report_summary

    _, _, _, record = long_report_record(num_layers=4)
    line = report_summary(record, 3_000_000)
    assert "600 tokens" in line and "layer 0 zoomable, every layer's heads summarised (4 × 2 heads)" in line


# --- the budget: SmolLM2's chosen layer at 8,192 tokens ------------------------------------------------------------

BUDGET_TOKENS, BUDGET_HEADS, BUDGET_LAYERS = 8192, 9, 30


def causal_softmax_npy(path, num_heads: int, num_tokens: int, rows: int = 512, seed: int = 0) -> np.memmap:
    """(H, N, N) float32 of a causal softmax of random scores with a sink on key 0, written a band of rows at a time;
    returned as a read-only memory map, as a run's map on disk is."""
    rng = np.random.default_rng(seed)
    stored = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(num_heads, num_tokens, num_tokens))
    keys = np.arange(num_tokens)
    for start in range(0, num_tokens, rows):
        queries = np.arange(start, min(num_tokens, start + rows))
        for head in range(num_heads):
            scores = rng.normal(scale=2.0, size=(len(queries), num_tokens)).astype(np.float32)
            scores[:, 0] += 4.0 * (head % 3)  # some heads a sink
            scores[keys[None, :] > queries[:, None]] = -np.inf
            scores -= scores.max(axis=1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=1, keepdims=True)
            stored[head, start : start + len(queries)] = scores
    stored.flush()
    del stored
    return np.load(path, mmap_mode="r")


@pytest.fixture(scope="module")
def budget_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("budget")
    attention = causal_softmax_npy(folder / "attention.npy", BUDGET_HEADS, BUDGET_TOKENS)
    _, _, _, record = long_report_record(
        BUDGET_TOKENS, BUDGET_HEADS, BUDGET_LAYERS, attention, model="HuggingFaceTB/SmolLM2-135M", layer=10
    )
    path = folder / "report.html"
    path.write_text(report_page(record), encoding="utf-8")
    return attention, record, path


@pytest.mark.slow
def test_8192_tokens_of_9_heads_and_30_layers_of_summaries_are_a_page_within_25_mb(budget_report):
    attention, record, path = budget_report
    size = path.stat().st_size
    assert size <= PAGE_BUDGET_BYTES, size
    # Within the budget however the map compresses: the zoom's codes stored raw (zlib's worst case, a few bytes more),
    # in base64's 4 characters per 3 bytes, in place of what they take here.
    zoom = record["texts"][0]["zoom"]
    compressed = sum(zoom["bytes"].values())
    raw_codes = levels_bytes(BUDGET_HEADS, BUDGET_TOKENS, BUDGET_TOKENS, [entry["level"] for entry in zoom["levels"]])
    raw_codes += 2 * BUDGET_HEADS * len(zoom["exact_rows"]) * BUDGET_TOKENS
    worst = size - compressed + math.ceil(raw_codes * 1.001 / 3) * 4
    assert worst <= PAGE_BUDGET_BYTES, worst
    (text,) = page_record(path.read_text(encoding="utf-8"))["texts"]
    assert text["attention"] is None and text["layers"] is None
    assert np.array(text["summaries"]["summaries"]["relative_entropy"]).shape == (BUDGET_LAYERS, BUDGET_HEADS)
    # The coarsest level's maxima are the map's own (to the log scale's codes): 64 × 64 blocks of head 2.
    coarsest = text["zoom"]["levels"][-1]
    block = coarsest["block"]
    head_map = attention[2]
    expected = np.array([[head_map[r : r + block, c : c + block].max() for c in range(0, BUDGET_TOKENS, block)] for r in range(0, BUDGET_TOKENS, block)])
    got = decode_weights(coarsest["max"][2])
    assert np.all(np.abs(np.log10(np.maximum(got, 1e-3)) - np.log10(np.maximum(expected, 1e-3))) <= 3 / 254 / 2 + 1e-9)


def first_view(page) -> dict:
    return page.page.evaluate(
        "({ tabs: Array.from(document.querySelectorAll('#views button[role=tab]'), (tab) => tab.dataset.view),"
        " shown: document.querySelector('#views button[aria-selected=true]').dataset.view,"
        " drawn: document.querySelector('#zoom-canvas') !== null && document.querySelector('#zoom-canvas').dataset.level !== undefined })"
    )


@pytest.mark.slow
def test_the_8192_token_report_opens_on_the_zoom_view_with_no_request(budget_report, opened):
    _, record, path = budget_report
    page = opened(path)
    seen = first_view(page)
    assert seen["shown"] == "zoom" and seen["drawn"], seen
    assert seen["tabs"][:2] == ["zoom", "summaries"] and not {"head", "heatmap", "model", "stats", "trace"} & set(seen["tabs"])
    assert page.requests == [] and page.errors == []
    assert_summaries_read_out(page, record["texts"][0]["summaries"], layer=17, head=6)


def assert_summaries_read_out(page, summaries: dict, layer: int, head: int) -> None:
    page.page.click("#tab-summaries")
    cell = f"svg[data-summary=relative_entropy] rect[data-layer='{layer}'][data-head='{head}']"
    page.page.hover(cell)
    value = summaries["summaries"]["relative_entropy"][layer][head]
    text = page.page.text_content("#summaries-readout")
    assert text.startswith(f"relative entropy · layer {layer} · head {head} · {value:.4f} · most-attended keys: "), text
    page.page.hover("svg[data-summary=sink_fraction] rect[data-layer='0']")
    over = sum(share > 0.3 for share in summaries["summaries"]["sink"][0])
    assert page.page.text_content("#summaries-readout") == (
        f"sink fraction · layer 0 · {summaries['sink_fraction'][0]:.4f} ({over} of {summaries['num_heads']} heads' sink share over 0.3)"
    )
    # The keyboard: the focused grid's cursor moves a layer down and a head right.
    page.page.focus("svg[data-summary=distance]")
    page.page.keyboard.press("ArrowDown")
    page.page.keyboard.press("ArrowRight")
    distance = summaries["summaries"]["distance"][1][1]
    assert f"layer 1 · head 1 · {distance:.4f} tokens" in page.page.text_content("#summaries-readout")


def test_a_long_report_opens_on_the_zoom_view_and_its_summaries_read_out_the_records_values(opened, tmp_path):
    _, _, _, record = long_report_record(num_tokens=600, num_heads=3, num_layers=5)
    path = tmp_path / "report.html"
    path.write_text(report_page(record), encoding="utf-8")
    page = opened(path)
    seen = first_view(page)
    assert seen["shown"] == "zoom" and seen["drawn"] and seen["tabs"] == ["zoom", "summaries"], seen
    assert LONG_TEXT_NOTE in page.page.text_content("#report-header")
    assert_summaries_read_out(page, record["texts"][0]["summaries"], layer=3, head=2)
    assert page.errors == []


# --- end to end: attnviz heads on a tiny Llama, its map on disk ------------------------------------------------------


LLAMA_TEXT = " ".join(["The cat sat on the mat because it was tired."] * 60)  # about 600 tokens of the tiny BPE


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    import transformers
    from tiny_families import _DECODER, bpe_tokenizer, save_checkpoint

    folder = tmp_path_factory.mktemp("llama") / "llama"
    config = transformers.LlamaConfig(num_key_value_heads=2, **{**_DECODER, "max_position_embeddings": 1024})
    save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), folder)
    return folder


@pytest.mark.slow
def test_heads_writes_report_html_of_a_long_text_whose_zoom_is_the_maps_block_maxima(tiny_llama, tmp_path):
    from attnviz.cli import run as run_cli
    from attnviz.html.pyramid import zoom_record
    from attnviz.html.record import encode_zoom

    out = tmp_path / "run"
    argv = ["heads", LLAMA_TEXT, "--model", str(tiny_llama), "--layer", "1", "--memory", "1", "--figures", "none", "--save-map", "--out", str(out)]
    assert run_cli(argv) == 0
    stored = np.load(out / "attention.npy", mmap_mode="r")  # the map went to disk: --memory 1; saved: --save-map
    assert stored.shape[1] > ZOOM_MIN_TOKENS
    (record_text,) = page_record((out / "report.html").read_text(encoding="utf-8"))["texts"]
    assert record_text["attention"] is None and record_text["layers"] is None and record_text["rollout"] is None
    assert record_text["zoom"] == json.loads(json.dumps(encode_zoom(zoom_record(np.asarray(stored), True))))
    finest = record_text["zoom"]["levels"][0]
    block = finest["block"]
    masked = np.where(np.tril(np.ones(stored.shape[1:], dtype=bool)), stored[0], 0.0)
    expected = np.array(
        [[masked[r : r + block, c : c + block].max() for c in range(0, stored.shape[2], block)] for r in range(0, stored.shape[1], block)]
    )
    got = decode_weights(finest["max"][0])
    assert np.all(np.abs(np.log10(np.maximum(got, 1e-3)) - np.log10(np.maximum(expected, 1e-3))) <= 3 / 254 / 2 + 1e-9)
    summaries = record_text["summaries"]
    assert (summaries["num_layers"], summaries["num_heads"], summaries["num_tokens"]) == (2, 6, stored.shape[1])
    rows = np.asarray(stored[:, :, 0], dtype=np.float64).mean(axis=1)  # layer 1's sink share of each head, from the map
    np.testing.assert_allclose(summaries["summaries"]["sink"][1], rows, atol=1e-5)


@pytest.mark.slow
def test_report_of_a_long_text_on_the_command_line_and_in_python_holds_no_whole_map(tiny_llama, tmp_path, capsys):
    import attnviz
    from attnviz.cli import run as run_cli
    from attnviz.errors import AttnvizError

    out = tmp_path / "report"
    assert run_cli(["report", LLAMA_TEXT, "--model", str(tiny_llama), "--out", str(out)]) == 0
    assert "every layer's heads summarised (2 × 6 heads)" in capsys.readouterr().out
    (from_cli,) = page_record((out / "report.html").read_text(encoding="utf-8"))["texts"]
    result = attnviz.report(LLAMA_TEXT, model=str(tiny_llama))
    (text,) = result.record["texts"]
    assert text["attention"] is None and text["layers"] is None and text["statistics"] is None and text["trace"] is None
    assert_records_match(text["summaries"], from_cli["summaries"])  # two runs: the same records, within float32
    assert_records_match(json.loads(json.dumps(text["zoom"])), json.loads(json.dumps(from_cli["zoom"])))
    # The summaries are attnviz.layers' own (summaries.json), as the other layer of attnviz computes them.
    layers = attnviz.layers(LLAMA_TEXT, model=str(tiny_llama))
    np.testing.assert_allclose(text["summaries"]["summaries"]["relative_entropy"], layers.summaries.values["relative_entropy"], atol=1e-6)
    with pytest.raises(AttnvizError, match="has a report of its own"):
        attnviz.report(["The cat sat.", LLAMA_TEXT], model=str(tiny_llama))


def test_a_map_on_disk_is_read_by_file_reads_into_the_same_zoom(tmp_path):
    from attnviz.html.pyramid import zoom_record
    from attnviz.html.record import FileRows, encode_zoom

    mapped = causal_softmax_npy(tmp_path / "attention.npy", 3, 700, rows=128, seed=2)
    reader = FileRows.of(mapped)
    assert isinstance(reader, FileRows) and not isinstance(FileRows.of(np.asarray(mapped)), FileRows)
    np.testing.assert_array_equal(reader[2][650:700], mapped[2, 650:700])
    np.testing.assert_array_equal(reader[1][5:5], np.zeros((0, 700), dtype=np.float32))
    assert encode_zoom(zoom_record(reader, True, band_values=20_000)) == encode_zoom(zoom_record(np.array(mapped), True, band_values=20_000))


@pytest.mark.slow
@pytest.mark.parametrize("memory", [None, 1])
def test_one_forward_pass_gives_the_run_and_every_layers_summaries_as_two_passes_do(tiny_llama, memory):
    """heads(layer_summaries=True), what heads' and report's long texts run: the map and the summaries from one capture
    of every layer's input are the very numbers of the run alone and of summarise_layers' own pass. With memory=1
    the run goes block by block and its blocks feed the chosen layer's summaries (not computed again)."""
    import attnviz
    from attnviz.analysis.head_summaries import summarise_layers
    from attnviz.errors import AttnvizError
    from attnviz.budgets import block_budget

    model = attnviz.load(str(tiny_llama), device="cpu")
    together = attnviz.heads(LLAMA_TEXT, model=model, layer=1, layer_summaries=True, memory=memory)
    alone = attnviz.heads(LLAMA_TEXT, model=model, layer=1, memory=memory)
    assert together.run.map_on_disk == (memory is not None)
    assert alone.layer_summaries is None
    assert np.array_equal(np.asarray(together.run.attention), np.asarray(alone.run.attention))
    assert np.array_equal(together.run.output, alone.run.output)
    spec = together.spec
    separate = summarise_layers(model.loaded, LLAMA_TEXT, replace(spec, layer=None), block_budget(spec))
    for name, values in separate.values.items():
        assert np.array_equal(together.layer_summaries.values[name], values), name
    assert np.array_equal(together.layer_summaries.top_keys, separate.top_keys)
    with pytest.raises(AttnvizError, match="summarises one text's self-attention"):
        attnviz.heads([LLAMA_TEXT], model=model, layer_summaries=True)

"""The report's zoom view of a long map (html/pyramid.py, static/zoom_view.js): block maxima and means at every level
equal to the map's own, computed a band of rows at a time (also from a read-only memory map), exact rows read out to
4 decimals, the budget at 8,192 tokens, and in Chromium: the view draws, zooms by keyboard to single cells, reads out
a cell's exact weight and a block's maximum, and pans; short reports keep their record and tabs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_run

from attnviz.errors import AttnvizError
from attnviz.html import ReportText, report_page, report_record
from attnviz.html.encoding import decode_weights, encode_quantised
from attnviz.html.pyramid import (
    BAND_VALUES,
    LEVELS_BUDGET_BYTES,
    ZOOM_MIN_TOKENS,
    exact_rows,
    levels_bytes,
    zoom_levels,
    zoom_record,
)
from attnviz.html.record import encode_zoom, text_record


def expected_blocks(weights: np.ndarray, causal: bool, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Each block's max and mean over the cells its queries may see, block by block with plain slicing (0: all masked)."""
    num_queries, num_keys = weights.shape
    rows, columns = -(-num_queries // block), -(-num_keys // block)
    maxima, means = np.zeros((rows, columns)), np.zeros((rows, columns))
    for bi in range(rows):
        for bj in range(columns):
            q = np.arange(bi * block, min(num_queries, (bi + 1) * block))[:, None]
            k = np.arange(bj * block, min(num_keys, (bj + 1) * block))[None, :]
            cells = weights[q, k][~(k > q)] if causal else weights[q, k].ravel()
            if cells.size:
                maxima[bi, bj], means[bi, bj] = cells.max(), cells.mean()
    return maxima, means


@pytest.mark.parametrize("causal", [False, True])
def test_every_levels_block_maxima_and_means_are_the_maps_own(causal):
    tokens = [f"t{index}" for index in range(600)] + ["x"] * 7  # 607: blocks cut short at the edges
    run = make_run(tokens, num_heads=2, causal=causal, seed=3)
    record = zoom_record(run.attention, causal, levels_budget=120_000, band_values=5_000)
    levels = [entry["level"] for entry in record["levels"]]
    assert levels == [2, 3]  # the budget left out levels 0 and 1; level 3 has 76 blocks a side
    assert max(record["levels"][-1]["rows"], record["levels"][-1]["columns"]) <= 128
    encoded = encode_zoom(record)
    for entry, page_entry in zip(record["levels"], encoded["levels"]):
        for head in range(2):
            maxima, means = expected_blocks(run.attention[head], causal, entry["block"])
            assert (entry["rows"], entry["columns"]) == maxima.shape
            np.testing.assert_array_equal(entry["max"][head], maxima.astype(np.float32))
            np.testing.assert_allclose(entry["mean"][head], means, rtol=1e-6, atol=0)
            # The page's codes: the log scale's, as every quantised map of the report.
            np.testing.assert_array_equal(decode_weights(page_entry["max"][head]), decode_weights(encode_quantised(maxima)))


def test_a_memory_map_is_read_a_band_of_rows_at_a_time_and_gives_the_same_record(tmp_path):
    run = make_run([f"t{index}" for index in range(200)], num_heads=3, causal=True, seed=5)
    np.save(tmp_path / "attention.npy", run.attention.astype(np.float32))
    mapped = np.load(tmp_path / "attention.npy", mmap_mode="r")  # read-only (H, Nq, Nk)
    rows_read = []

    class HeadRows:
        """One head of the memory map, noting how many rows each read takes (the real array, read by slicing)."""

        def __init__(self, head_map):
            self.head_map, self.shape = head_map, head_map.shape

        def __getitem__(self, rows: slice):
            part = self.head_map[rows]
            rows_read.append(part.shape[0])
            return part

    class Heads:
        shape = mapped.shape

        def __getitem__(self, head: int):
            return HeadRows(mapped[head])

    import torch

    from_map = encode_zoom(zoom_record(Heads(), True, band_values=2_000))
    in_memory = encode_zoom(zoom_record(run.attention.astype(np.float32), True, band_values=2_000))
    assert from_map == in_memory
    assert encode_zoom(zoom_record(torch.from_numpy(run.attention.astype(np.float32)), True, band_values=2_000)) == in_memory
    assert max(rows_read) <= 16  # bands of about 2,000 weights: 10 rows of 200 keys, or the exact rows' 16
    assert sum(rows_read) == 3 * (200 + 32)  # each row once for the blocks, the exact rows once more


def test_the_exact_rows_are_the_first_and_last_queries_to_4_decimals():
    run = make_run([f"t{index}" for index in range(100)], num_heads=2, seed=7)
    record = zoom_record(run.attention, False)
    assert record["exact_rows"] == [*range(16), *range(84, 100)]
    exact = decode_weights(encode_zoom(record)["exact"])  # (H, rows, Nk), as the page reads it
    np.testing.assert_allclose(exact, run.attention[:, record["exact_rows"]], atol=0.5e-4 + 1e-12, rtol=0)
    assert exact_rows(9, 8192, 8192) == [*range(14), *range(8192 - 14, 8192)]  # 4 MB of uint16: 28 rows
    chosen = zoom_record(run.attention, False, chosen_rows=[50, 40])
    assert chosen["exact_rows"] == [*range(15), 40, 50, *range(85, 100)]  # the chosen, then 15 from each end
    np.testing.assert_allclose(decode_weights(encode_zoom(chosen)["exact"])[:, 15:17], run.attention[:, [40, 50]], atol=0.5e-4 + 1e-12)
    with pytest.raises(AttnvizError, match="query 100 is out of range: the map has queries 0 to 99"):
        exact_rows(2, 100, 100, chosen=[100])


def test_8192_tokens_of_9_heads_fit_the_budget_with_room_for_the_summaries():
    """SmolLM2's full context: blocks of 16×16 cells at the finest zoom, and 28 exact rows; even incompressible,
    with base64's third, the zoom view's data stays under 15 MB of the report's 25."""
    levels = zoom_levels(9, 8192, 8192)
    assert levels == [4, 5, 6]
    level_bytes = {level: levels_bytes(9, 8192, 8192, [level]) for level in levels}
    assert level_bytes == {4: 2 * 9 * 512 * 512, 5: 2 * 9 * 256 * 256, 6: 2 * 9 * 128 * 128}
    assert sum(level_bytes.values()) <= LEVELS_BUDGET_BYTES
    exact = len(exact_rows(9, 8192, 8192)) * 9 * 8192 * 2
    assert (sum(level_bytes.values()) + exact) * 4 / 3 * 1.001 < 15 * 2**20
    assert BAND_VALUES * 8 <= 32 * 2**20  # a band of float64 weights: at most 32 MB held at once


def test_short_records_are_unchanged_and_long_ones_get_the_zoom():
    from attnviz.spec import RunSpec

    spec = RunSpec(model=None, resolved_model="m", model_source="bundled", num_heads=2)
    short = make_run([f"t{index}" for index in range(ZOOM_MIN_TOKENS)], num_heads=2)
    long = make_run([f"t{index}" for index in range(ZOOM_MIN_TOKENS + 1)], num_heads=2)
    assert "zoom" not in text_record(ReportText(short), spec)
    assert text_record(ReportText(long), spec)["zoom"]["exact_rows"][0] == 0


# --- in Chromium -------------------------------------------------------------------------------------------

LONG_TOKENS = 1024


@pytest.fixture(scope="module")
def long_report(tmp_path_factory):
    run = make_run([f"w{index}" for index in range(LONG_TOKENS)], num_heads=2, causal=True, seed=11)
    run.model_causal = True
    from attnviz.spec import RunSpec

    spec = RunSpec(model=None, resolved_model="m", model_source="bundled", num_heads=2, causal=True)
    path = tmp_path_factory.mktemp("zoom") / "report.html"
    path.write_text(report_page(report_record([ReportText(run)], spec, kind="decoder", num_layers=1)), encoding="utf-8")
    return run, path


def readout(page) -> str:
    return page.page.text_content("#zoom-readout")


def press(page, key: str, times: int = 1) -> None:
    for _ in range(times):
        page.page.keyboard.press(key)


def test_the_zoom_view_zooms_to_single_cells_reads_out_exact_weights_and_block_maxima_and_pans(opened, long_report):
    run, path = long_report
    page = opened(path)
    page.page.click("#tab-zoom")
    page.page.wait_for_selector("#zoom-canvas")
    page.wait_until("document.querySelector('#zoom-canvas').dataset.level !== undefined")
    page.page.focus("#zoom-canvas")
    weights = run.attention[0]

    # The whole map: the coarsest level, the cursor on block (0, 0), whose max and mean the read-out names.
    level = int(page.page.get_attribute("#zoom-canvas", "data-level"))
    block = 2**level
    assert level > 0
    press(page, "ArrowDown", 3)  # three blocks down
    page.wait_until(f"document.querySelector('#zoom-readout').textContent.includes('queries {3 * block}–')")
    q0, k0 = 3 * block, 0
    cells = weights[q0 : q0 + block, k0 : k0 + block][np.tril(np.ones((block, block), dtype=bool), k=q0 - k0)]
    expected_max = decode_weights(encode_quantised(np.array([cells.max()])))[0]
    text = readout(page)
    assert f"block of queries {q0}–{q0 + block - 1} × keys 0–{block - 1} ({block}×{block} cells)" in text, text
    assert f"max ≈ {expected_max:.4f}" in text, text

    # Zoom in by keyboard until a cell is 4 pixels or more; the cursor goes to query 5 (an exact row), key 3.
    press(page, "0")
    for _ in range(12):
        press(page, "+")
    scale = float(page.page.get_attribute("#zoom-canvas", "data-scale"))
    assert scale >= 4 and page.page.get_attribute("#zoom-canvas", "data-level") == "0"
    press(page, "ArrowUp", 3 * block)  # back to query 0
    press(page, "ArrowDown", 5)
    press(page, "ArrowRight", 3)
    page.wait_until("document.querySelector('#zoom-readout').textContent.includes('query 5:w5 · key 3:w3')")
    assert readout(page) == f"head 0 · query 5:w5 · key 3:w3 · {weights[5, 3]:.4f}"
    press(page, "ArrowRight", 3)
    assert readout(page).endswith("· masked by the causal mask")  # key 6 after query 5

    # A row not embedded exactly: a value on the 256 levels, marked ≈, never 4 exact decimals.
    press(page, "ArrowDown", 20)  # query 25
    text = readout(page)
    assert "query 25:w25" in text and "≈" in text and "stored as 256 levels" in text and "exact rows: queries 0–15, 1008–1023" in text

    # Pan: Shift+arrows move the view a quarter, a drag moves it back.
    x0 = float(page.page.get_attribute("#zoom-canvas", "data-x0"))
    press(page, "Shift+ArrowRight")
    moved = float(page.page.get_attribute("#zoom-canvas", "data-x0"))
    assert moved > x0
    box = page.page.locator("#zoom-canvas").bounding_box()
    page.page.mouse.move(box["x"] + 100, box["y"] + 100)
    page.page.mouse.down()
    page.page.mouse.move(box["x"] + 300, box["y"] + 100, steps=4)
    page.page.mouse.up()
    assert float(page.page.get_attribute("#zoom-canvas", "data-x0")) < moved

    # The wheel zooms out about the pointer, down to the whole map and no further.
    for _ in range(40):
        page.page.mouse.wheel(0, 200)
    page.wait_until(f"Number(document.querySelector('#zoom-canvas').dataset.scale) === {640 / LONG_TOKENS}")
    assert page.page.get_attribute("#zoom-canvas", "data-level") == str(level)


def test_a_short_report_has_no_zoom_tab(opened, tmp_path):
    from attnviz.spec import RunSpec

    run = make_run([f"w{index}" for index in range(20)], num_heads=2)
    spec = RunSpec(model=None, resolved_model="m", model_source="bundled", num_heads=2)
    path = tmp_path / "report.html"
    path.write_text(report_page(report_record([ReportText(run)], spec, kind="encoder", num_layers=1)), encoding="utf-8")
    page = opened(path)
    assert page.page.query_selector("#tab-zoom") is None
    assert page.page.query_selector("#tab-heatmap") is not None

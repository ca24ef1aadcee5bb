"""The report's head, model and heatmap views and its core (window.AV) in Debian's Chromium.

What these check is computed here independently: colours with matplotlib's viridis and norms
(render/scales.py's rule), weights by decoding the record in Python. Every page is opened from a
file with every request blocked: none may be attempted, and no console or page error may occur.
Locally the tests skip when Chromium or Playwright is missing; under CI=true they fail instead.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import HOSTILE, decoded

LONG_TEXT = " ".join(("The animal didn't cross the street because it was too tired and the rain kept falling. " * 12).split()[:90])


# The session's one Chromium is conftest.py's `browser` (tests/browser.py): Playwright's sync API runs
# one at a time per thread, so a module starting its own would fail beside it.
@pytest.fixture(scope="module")
def pages(bundled_bert, tmp_path_factory):
    """Report files by name: a short text, a causal run at layer 2, and a text of more than 64 tokens."""
    folder = tmp_path_factory.mktemp("report-views")
    texts = {
        "short": dict(text="我想吃酸菜鱼, the cat sat."),
        "causal": dict(text="The cat sat on the mat.", causal=True, layer=2),
        "long": dict(text=LONG_TEXT),
        "several": dict(text=["The cat sat.", HOSTILE]),
    }
    paths = {}
    for name, settings in texts.items():
        path = folder / f"{name}.html"
        path.write_text(_report(bundled_bert, **settings), encoding="utf-8")
        paths[name] = path
    return paths


def _report(loaded, text, causal=False, layer=0):
    from attnviz.html import ReportText, report_page, report_record
    from attnviz.html.encoding import encode_layers
    from attnviz.pipeline import run_attention, run_layers
    from attnviz.spec import RunSpec

    spec = RunSpec(
        model="bundled", resolved_model=loaded.name, model_source=loaded.source, layer=layer,
        num_heads=loaded.num_heads, weights="pretrained", seed=0, causal=causal, kv_text=None, device="cpu",
        truncate=False,
    )  # fmt: skip
    texts = text if isinstance(text, list) else [text]
    runs = run_attention(loaded, texts, spec)
    every_layer = run_layers(loaded, texts, replace(spec, layer=None))
    shown = [ReportText(run, encode_layers([layer_run.attention for layer_run in layer_runs])) for run, layer_runs in zip(runs, every_layer)]
    return report_page(report_record(shown, spec, kind="encoder", num_layers=loaded.num_layers))


def viridis_bytes(weights, num_keys):
    """render/scales.py's colours: viridis on a linear norm up to 64 keys, else a log norm 0.001..1."""
    import matplotlib
    from matplotlib.colors import LogNorm, Normalize

    norm = LogNorm(1e-3, 1.0, clip=True) if num_keys > 64 else Normalize(0.0, 1.0)
    clipped = np.clip(np.asarray(weights, dtype=np.float64), 1e-3 if num_keys > 64 else 0.0, 1.0)
    return matplotlib.colormaps["viridis"](norm(clipped), bytes=True)[..., :3].astype(int)


def test_the_colour_scale_is_matplotlibs_viridis_linear_then_log(pages, opened):
    page = opened(pages["short"])
    weights = [0.0, 0.0004, 0.001, 0.0031, 0.01, 0.1234, 0.25, 0.5, 0.7777, 0.999, 1.0]
    for num_keys in (12, 64, 65, 512):
        log_scale = page.page.evaluate("n => AV.logScale(n)", num_keys)
        assert log_scale == (num_keys > 64)
        colours = page.page.evaluate("([ws, log]) => ws.map(w => AV.colour(w, log))", [weights, log_scale])
        assert np.array(colours).tolist() == viridis_bytes(weights, num_keys).tolist()
    assert page.page.evaluate("AV.MASKED") == "#d0d0d0"
    ticks = page.page.evaluate("[false, true].map(log => Array.from(AV.colourBar(log).querySelectorAll('text')).map(t => t.textContent))")
    assert ticks == [["0", "0.25", "0.5", "0.75", "1"], ["0.001", "0.01", "0.1", "1"]]


def test_the_page_decodes_both_encodings_as_the_record_states(pages, opened):
    from attnviz.html.encoding import decode_weights, encode_exact, encode_quantised

    rng = np.random.default_rng(3)
    weights = rng.dirichlet(np.full(70, 0.3), size=(2, 5)).astype(np.float32)  # (2, 5, 70), rows sum to 1
    weights[0, 0, :] = 0.0
    weights[0, 0, 3] = 1.0
    page = opened(pages["short"])
    for encoded in (encode_exact(weights), encode_quantised(weights)):
        got = page.page.evaluate(
            "async e => { const w = await AV.decode(e); return {shape: w.shape, exact: w.exact, values: Array.from(w.values), at: w.at(1, 4, 69)}; }",
            encoded,
        )
        expected = decode_weights(encoded)
        assert got["shape"] == [2, 5, 70] and got["exact"] == (encoded["dtype"] == "uint16")
        assert np.allclose(np.array(got["values"]).reshape(expected.shape), expected, rtol=1e-6, atol=1e-7)
        assert got["at"] == pytest.approx(expected[1, 4, 69], rel=1e-6, abs=1e-7)
    formatted = page.page.evaluate("[AV.formatWeight(0.1234), AV.formatWeight(0.0123, false), AV.formatWeight(0, false)]")
    assert formatted == ["0.1234", "≈ 0.0123", "< 0.001"]


def test_the_heatmap_draws_each_cell_in_its_colour_and_masked_cells_grey(pages, opened):
    page = opened(pages["causal"])
    text = page.record()["texts"][0]
    page.page.click("button[data-view=heatmap]")
    page.page.select_option("#heatmap-head", "4")
    page.wait_until("document.querySelector('#heatmap-note').textContent.includes('head 4')")
    cells = page.page.evaluate(
        """() => { const c = document.getElementById('heatmap-canvas'); const n = c.width / %d;
        const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; const rows = [];
        for (let i = 0; i < c.height / n; i++) { const row = []; for (let j = 0; j < c.width / n; j++) {
          const p = 4 * ((Math.floor(i * n + n / 2)) * c.width + Math.floor(j * n + n / 2)); row.push([data[p], data[p + 1], data[p + 2]]); }
          rows.push(row); } return rows; }"""
        % len(text["key_tokens"])
    )
    weights = decoded(text["attention"])[4]
    expected = viridis_bytes(weights, weights.shape[1])
    masked = np.triu(np.ones(weights.shape, dtype=bool), k=1)
    expected[masked] = [0xD0, 0xD0, 0xD0]
    assert np.array(cells).tolist() == expected.tolist()
    box = page.page.query_selector("#heatmap-canvas").bounding_box()
    n = len(text["query_tokens"])
    page.page.mouse.move(box["x"] + box["width"] * 2.5 / n, box["y"] + box["height"] * 5.5 / n)
    q, k = text["shown_query_tokens"], text["shown_key_tokens"]
    assert page.page.text_content("#heatmap-readout") == f"layer 2 · head 4 · query 5:{q[5]} · key 2:{k[2]} · {weights[5, 2]:.4f}"


def test_a_causal_runs_head_view_draws_and_counts_only_the_keys_each_query_sees(pages, opened):
    """Under a causal mask a query sees the keys up to itself: N(N + 1) / 2 lines a head, not N², and the note counts those."""
    page = opened(pages["causal"])
    text = page.record()["texts"][0]
    num_tokens, num_heads = len(text["query_tokens"]), page.record()["num_heads"]
    page.wait_until("document.querySelector('#head-note').textContent.includes('lines')")
    lines = page.page.evaluate("Array.from(document.querySelectorAll('#head-lines line')).map(l => [+l.dataset.head, +l.dataset.query, +l.dataset.key])")
    seen = [(head, i, j) for head in range(num_heads) for i in range(num_tokens) for j in range(i + 1)]
    assert sorted(map(tuple, lines)) == seen
    assert page.page.text_content("#head-note").startswith(f"{len(seen):,} lines: heads 0, 1,")
    assert len(seen) == num_heads * num_tokens * (num_tokens + 1) // 2 < num_heads * num_tokens**2


def test_a_long_texts_head_view_draws_head_0s_weights_from_0_01_and_says_what_it_left_out(pages, opened):
    page = opened(pages["long"])
    text = page.record()["texts"][0]
    weights = decoded(text["attention"])
    assert weights.shape[1] > 64
    lines = page.page.evaluate(
        "Array.from(document.querySelectorAll('#head-lines line')).map(l => [+l.dataset.head, +l.dataset.query, +l.dataset.key, l.getAttribute('stroke-opacity')])"
    )
    kept = np.argwhere(weights[0] >= 0.01)
    assert sorted((h, i, j) for h, i, j, _ in lines) == [(0, i, j) for i, j in kept.tolist()]
    assert all(opacity == f"{weights[0, i, j]:.4f}" for _, i, j, opacity in lines)
    left_out = weights[0].size - len(kept)
    note = page.page.text_content("#head-note")
    assert f"{left_out:,} of {weights[0].size:,} query-key pairs are left out" in note and "≥ 0.01" in note
    assert page.page.evaluate("Array.from(document.querySelectorAll('input.head-toggle')).filter(b => b.checked).length") == 1


def test_the_views_are_reachable_by_keyboard(pages, opened):
    page = opened(pages["short"], color_scheme="dark")
    keyboard = page.page.keyboard
    page.page.focus("button[data-view=head]")
    keyboard.press("ArrowRight")
    assert page.page.evaluate("document.activeElement.dataset.view") == "model"
    keyboard.press("Enter")
    page.page.wait_for_selector("canvas.model-cell[data-layer='3'][data-head='7'][data-block]", state="attached")
    page.page.focus("button.model-cell-button:has(canvas[data-layer='3'][data-head='7'])")
    keyboard.press("Enter")
    page.wait_until("(document.querySelector('#heatmap-note') || {textContent: ''}).textContent.startsWith('Layer 3, head 7')")
    assert page.page.evaluate("document.querySelector('#views [aria-selected=true]').dataset.view") == "heatmap"
    page.page.focus("#heatmap-canvas")
    keyboard.press("ArrowDown")
    keyboard.press("ArrowRight")
    weights = decoded(page.record()["texts"][0]["layers"])[3, 7]
    tokens = page.record()["texts"][0]["shown_query_tokens"]
    assert page.page.text_content("#heatmap-readout") == f"layer 3 · head 7 · query 1:{tokens[1]} · key 1:{tokens[1]} · {weights[1, 1]:.4f}"
    page.page.click("button[data-view=head]")
    page.page.focus(".token[data-side=query][data-index='2']")
    visible = page.page.evaluate("Array.from(document.querySelectorAll('#head-lines line')).filter(l => getComputedStyle(l).display !== 'none').map(l => l.dataset.query)")
    assert visible and set(visible) == {"2"}
    assert "我" in page.page.text_content(".token-column.query")


def test_the_text_picker_redraws_the_views_for_another_text_whose_tokens_stay_characters(pages, opened):
    page = opened(pages["several"])
    dialogs = []
    page.page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    title = page.page.title()
    texts = page.record()["texts"]
    page.page.click("button[data-view=heatmap]")
    page.page.select_option("#text-select", "1")
    page.wait_until("document.querySelectorAll('.key-labels span').length > 0 && AV.state.text === 1")
    shown = page.page.evaluate("Array.from(document.querySelectorAll('.key-labels span')).map(s => s.textContent)")
    keys = texts[1]["shown_key_tokens"]
    assert any(shown == keys[::step] for step in range(1, len(keys) + 1))  # every step-th key where cells are small
    page.page.click("button[data-view=head]")
    page.wait_until("document.querySelectorAll('.token[data-side=query]').length > 0")
    tokens = page.page.evaluate("Array.from(document.querySelectorAll('.token[data-side=query]')).map(t => t.textContent)")
    assert tokens == texts[1]["shown_query_tokens"] and "</script>" in "".join(tokens)
    assert page.page.evaluate("[document.images.length, document.querySelectorAll('script').length]") == [0, 2]
    assert page.page.title() == title and dialogs == []


# ---- read-outs never name a weight of another head or layer than the one shown ----

HEATMAP_HINT = "Hover a cell, or Tab to the map and move with the arrow keys, for its weight."
HEAD_HINT = "Hover or focus a token to keep only its lines; click a line for its weight."


def _head_map(text, layer, head):
    """One head's weights of one layer, decoded from the record here: the run's layer from "attention", others from "layers"."""
    return decoded(text["attention"])[head] if layer == text["layer"] else decoded(text["layers"])[layer, head]


def test_the_heatmap_read_out_follows_the_head_and_layer_shown(pages, opened):
    page = opened(pages["short"])
    text = page.record()["texts"][0]
    q, k = text["shown_query_tokens"], text["shown_key_tokens"]
    shown = [(0, 0), (0, 7), (3, 7), (1, 4)]  # (layer, head) in the order the test shows them
    maps = [_head_map(text, layer, head) for layer, head in shown]
    # the cell whose weight changes most at every step, so a stale read-out cannot pass
    steps = np.min([np.abs(after - before) for before, after in zip(maps, maps[1:])], axis=0)
    i, j = np.unravel_index(np.argmax(steps), steps.shape)
    assert steps[i, j] >= 5e-4  # differ in the 4th decimal

    def expected(n):
        layer, head = shown[n]
        return f"layer {layer} · head {head} · query {i}:{q[i]} · key {j}:{k[j]} · {maps[n][i, j]:.4f}"

    page.page.click("button[data-view=heatmap]")
    page.wait_until("document.querySelector('#heatmap-note') && document.querySelector('#heatmap-note').textContent.startsWith('Layer 0, head 0')")
    assert page.page.text_content("#heatmap-readout") == HEATMAP_HINT
    box = page.page.query_selector("#heatmap-canvas").bounding_box()
    page.page.mouse.move(box["x"] + box["width"] * (j + 0.5) / len(k), box["y"] + box["height"] * (i + 0.5) / len(q))
    assert page.page.text_content("#heatmap-readout") == expected(0)
    page.page.select_option("#heatmap-head", "7")  # the pointer stays on the cell
    page.wait_until("document.querySelector('#heatmap-note').textContent.startsWith('Layer 0, head 7')")
    assert page.page.text_content("#heatmap-readout") == expected(1)
    page.page.mouse.move(0, 0)  # off the map: the read-out keeps the last cell, read from the map shown
    page.page.select_option("#heatmap-layer", "3")
    page.wait_until("document.querySelector('#heatmap-note').textContent.startsWith('Layer 3, head 7')")
    assert page.page.text_content("#heatmap-readout") == expected(2)
    page.page.click("button[data-view=model]")
    page.page.click("button.model-cell-button:has(canvas[data-layer='1'][data-head='4'])")
    page.wait_until("document.querySelector('#heatmap-note').textContent.startsWith('Layer 1, head 4')")
    assert page.page.text_content("#heatmap-readout") == expected(3)


def _token_readout(text, maps, layer, side, index, heads):
    """head_view.js's read-out of a token: per chosen head (the first 4), its 3 strongest lines, ties in token order."""
    own, other = (text["shown_query_tokens"], text["shown_key_tokens"]) if side == "query" else (text["shown_key_tokens"], text["shown_query_tokens"])
    parts = []
    for head in heads[:4]:
        row = maps[head][index, :] if side == "query" else maps[head][:, index]
        ranked = sorted(range(len(row)), key=lambda n: -row[n])[:3]
        parts.append(f"head {head}: " + ", ".join(f"{n}:{other[n]} {row[n]:.4f}" for n in ranked))
    more = f" (and {len(heads) - 4} more heads)" if len(heads) > 4 else ""
    return f"layer {layer} · {index}:{own[index]} {'→' if side == 'query' else '←'} strongest: {' · '.join(parts)}{more}"


def test_the_head_view_read_out_follows_the_layer_and_heads_chosen_in_any_view(pages, opened):
    page = opened(pages["short"])
    text = page.record()["texts"][0]
    q, k = text["shown_query_tokens"], text["shown_key_tokens"]
    heads = list(range(page.record()["num_heads"]))  # a short text shows every head at first
    layer_maps = {layer: [_head_map(text, layer, head) for head in heads] for layer in (0, 3)}
    page.page.focus(".token[data-side=query][data-index='2']")
    assert page.page.text_content("#head-readout") == _token_readout(text, layer_maps[0], 0, "query", 2, heads)
    assert page.page.text_content("#head-readout") != _token_readout(text, layer_maps[3], 3, "query", 2, heads)
    page.page.click("button[data-view=heatmap]")  # the layer changes in another view
    page.page.select_option("#heatmap-layer", "3")
    page.page.click("button[data-view=head]")
    page.wait_until("document.querySelector('#head-note').textContent.includes('of layer 3')")
    assert page.page.text_content("#head-readout") == _token_readout(text, layer_maps[3], 3, "query", 2, heads)

    def line(head, i, j):
        page.page.dispatch_event(f"#head-lines line[data-head='{head}'][data-query='{i}'][data-key='{j}']", "click")

    line(5, 1, 3)
    assert page.page.text_content("#head-readout") == f"layer 3 · head 5 · 1:{q[1]} → 3:{k[3]} {layer_maps[3][5][1, 3]:.4f}"
    page.page.uncheck("#head-toggle-5")  # its line is gone: so is its read-out
    page.wait_until("!document.querySelector(\"#head-lines line[data-head='5']\")")
    assert page.page.text_content("#head-readout") == HEAD_HINT
    line(2, 1, 3)
    page.page.select_option("#head-layer", "0")
    page.wait_until("document.querySelector('#head-note').textContent.includes('of layer 0')")
    assert layer_maps[0][2][1, 3] != layer_maps[3][2][1, 3]
    assert page.page.text_content("#head-readout") == f"layer 0 · head 2 · 1:{q[1]} → 3:{k[3]} {layer_maps[0][2][1, 3]:.4f}"

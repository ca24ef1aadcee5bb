"""report.html in Debian's Chromium, opened from its file with every request blocked (docs/formats.md, "report.html").

The reports are built as a user builds them (attnviz.report, .save); what the page must show is
computed here independently: the record's weights decoded with base64, zlib and NumPy, against
attnviz.heads' attention rounded to 4 decimals; the trace view's shapes against attnviz.trace's
own trace.json record; the statistics table's order against the record's statistics sorted here.
One browser for the session (conftest.py's `browser`), each report built once per module.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
from helpers import HOSTILE, assert_close_after_rounding, decoded

import attnviz

ZH = "我想吃酸菜鱼 中国的大学生"  # the bundled vocabulary has 我 中 国 的 大 学 生 (想吃酸菜鱼 are [UNK] there)
ZH_TOKENS = "我中国的大学生"
HEAD = 3
# The record's weights are rounded to 4 decimals (5e-5), attention.json's to 7 (5e-8): a weight near
# a half unit, 0.10035 say, can be 5e-5 from the record in one and a few float64 ulps more in the other.
ROUNDING = 5e-5 + 5e-8 + 1e-12
VIEWS = ["head", "model", "heatmap", "neuron", "trace", "stats"]  # neuron: a text of at most 64 tokens (its q and k)
DATA = re.compile(r'<script type="application/json" id="attnviz-data">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


@pytest.fixture(scope="module")
def zh_heads(model):
    return attnviz.heads(ZH, model=model)


@pytest.fixture(scope="module")
def zh_report(model, tmp_path_factory):
    """The Chinese text's report, saved as a user saves it: (its path, its record as the page carries it)."""
    folder = tmp_path_factory.mktemp("report-zh")
    (path,) = attnviz.report(ZH, model=model).save(folder)
    return path, embedded_record(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def hostile_report(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("report-hostile") / "report.html"
    path.write_text(attnviz.report(HOSTILE, model=model).html, encoding="utf-8")
    return path


@pytest.fixture
def zh_page(zh_report, offline_page):
    path, record = zh_report
    page = offline_page(path)
    page.record = record
    page.text = record["texts"][0]
    return page


def embedded_record(page: str) -> dict:
    (data,) = DATA.findall(page)
    return json.loads(data)


def visible_lines(page) -> list[tuple[int, int, int]]:
    """(head, query, key) of every line of the head view that is drawn (not display: none)."""
    return [
        tuple(line)
        for line in page.page.evaluate(
            "Array.from(document.querySelectorAll('svg#head-lines line')).filter(l => getComputedStyle(l).display !== 'none')"
            ".map(l => [+l.dataset.head, +l.dataset.query, +l.dataset.key])"
        )
    ]


# ---- the record, without a browser ----


def test_the_embedded_record_holds_attention_json_and_its_weights(zh_heads, zh_report):
    path, record = zh_report
    attention_json = json.loads(json.dumps(zh_heads.to_dict()))  # attention.json's content (docs/python.md)
    (text,) = record["texts"]
    assert record["format"] == "attnviz-report" and record["num_layers"] == 6 and record["num_heads"] == 12
    assert {key: text[key] for key in attention_json if key != "attention"} == {
        key: value for key, value in attention_json.items() if key != "attention"
    }
    np.testing.assert_allclose(decoded(text["attention"]), np.array(attention_json["attention"]), atol=ROUNDING, rtol=0)
    assert decoded(text["layers"]).shape == (6, 12, len(text["query_tokens"]), len(text["key_tokens"]))


def test_no_angle_bracket_is_raw_inside_the_data_script(hostile_report):
    page = hostile_report.read_text(encoding="utf-8")
    (data,) = DATA.findall(page)
    assert "<" not in data
    assert embedded_record(page)["texts"][0]["text"] == HOSTILE
    assert page.count("<script") == 2  # the data and the one page script: the text added none


def test_without_chromium_the_browser_tests_skip_locally_and_fail_under_ci(monkeypatch):
    from browser import chromium_executable

    monkeypatch.setenv("ATTNVIZ_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="Chromium is not installed"):
        chromium_executable()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run under CI: .*Chromium is not installed"):
        chromium_executable()


# ---- in the browser ----


def test_the_page_loads_offline_with_no_request_and_no_error(zh_page):
    assert zh_page.page.evaluate("typeof AV.readyMs") == "number"
    zh_page.assert_offline_and_clean()


def test_the_nav_offers_every_view(zh_page):
    assert zh_page.page.eval_on_selector_all("nav#views button[data-view]", "bs => bs.map(b => b.dataset.view)") == VIEWS


def test_the_head_view_draws_one_line_per_query_and_key_with_its_weight_as_opacity(zh_heads, zh_page):
    page, text = zh_page.page, zh_page.text
    page.click("#head-none")
    page.check(f"input.head-toggle[data-head='{HEAD}']")
    zh_page.wait_until(f"document.querySelectorAll('svg#head-lines line:not([data-head=\"{HEAD}\"])').length === 0")
    lines = page.evaluate(
        "Array.from(document.querySelectorAll('svg#head-lines line'))"
        ".map(l => [+l.dataset.head, +l.dataset.query, +l.dataset.key, l.getAttribute('stroke-opacity'), l.getAttribute('stroke')])"
    )
    weights = decoded(text["attention"])[HEAD]  # (Nq, Nk)
    heads = zh_heads.attention.numpy()[HEAD]
    assert_close_after_rounding(weights, heads, 4, rounded=1)  # the report's run and heads': two computations
    num_queries, num_keys = weights.shape
    assert sorted((h, i, j) for h, i, j, _, _ in lines) == [(HEAD, i, j) for i in range(num_queries) for j in range(num_keys)]
    assert all(opacity == f"{weights[i, j]:.4f}" for _, i, j, opacity, _ in lines)
    colours = page.evaluate("Array.from({length: AV.data.num_heads}, (_, h) => AV.headColour(h))")
    assert len(set(colours)) == 12 and {stroke for *_, stroke in lines} == {colours[HEAD]}
    zh_page.assert_offline_and_clean()


def test_hovering_a_token_keeps_only_its_lines(zh_page):
    page = zh_page.page
    num_queries, num_keys = len(zh_page.text["query_tokens"]), len(zh_page.text["key_tokens"])
    every_line = visible_lines(zh_page)
    heads = {head for head, _, _ in every_line}
    assert len(every_line) == len(heads) * num_queries * num_keys
    page.hover(".token[data-side='query'][data-index='2']")
    assert sorted(visible_lines(zh_page)) == sorted(line for line in every_line if line[1] == 2)
    hidden = page.evaluate("Array.from(document.querySelectorAll('svg#head-lines line.hidden')).map(l => +l.dataset.query)")
    assert len(hidden) == len(every_line) - len(heads) * num_keys and 2 not in hidden
    page.hover(".token[data-side='key'][data-index='1']")
    assert sorted(visible_lines(zh_page)) == sorted(line for line in every_line if line[2] == 1)
    page.mouse.move(1, 1)
    page.hover("header#report-header")
    assert sorted(visible_lines(zh_page)) == sorted(every_line)
    zh_page.assert_offline_and_clean()


def test_the_chinese_text_and_tokens_are_characters_in_the_page(zh_page):
    page, text = zh_page.page, zh_page.text
    assert ZH in page.text_content("header#report-header")
    for side, tokens in (("query", text["shown_query_tokens"]), ("key", text["shown_key_tokens"])):
        assert zh_page.texts(f".token[data-side='{side}']") == tokens
    shown = "".join(zh_page.texts(".token[data-side='query']"))
    assert all(character in shown for character in ZH_TOKENS)
    zh_page.assert_offline_and_clean()


def test_a_screenshot_is_not_blank(zh_page):
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(zh_page.page.screenshot())).convert("RGB")).reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background_share = counts.max() / len(pixels)
    assert len(colours) > 200 and background_share < 0.9, (len(colours), background_share)


def test_the_trace_views_shapes_are_trace_json_s(model, zh_page):
    page = zh_page.page
    page.click("button[data-view='trace']")
    page.wait_for_selector("select#trace-layout", state="attached")
    trace_json = attnviz.trace(ZH, model=model, layout="all").to_dict()
    options = page.eval_on_selector_all("select#trace-layout option", "os => os.map(o => [o.value, o.textContent])")
    for layout in trace_json["layouts"]:
        (value,) = [value for value, label in options if label.startswith(layout["layout"]) and "mistake" not in label]
        page.select_option("select#trace-layout", value)
        expected = [",".join(map(str, step["output_shape"])) for step in layout["steps"]]
        zh_page.wait_until(f"document.querySelectorAll('ol#trace-steps > li').length === {len(expected)}")
        shapes = page.eval_on_selector_all("ol#trace-steps > li[data-output-shape]", "ls => ls.map(l => l.dataset.outputShape)")
        assert shapes == expected, layout["layout"]
    mistaken = attnviz.trace(ZH, model=model, mistake="view-without-permute").to_dict()["layouts"][1]
    (value,) = [value for value, label in options if "mistake view-without-permute" in label]
    page.select_option("select#trace-layout", value)
    expected = [",".join(map(str, step["output_shape"])) for step in mistaken["steps"]]
    zh_page.wait_until(f"document.querySelectorAll('ol#trace-steps > li').length === {len(expected)}")
    assert page.eval_on_selector_all("ol#trace-steps > li", "ls => ls.map(l => l.dataset.outputShape)") == expected
    marked = page.eval_on_selector_all("ol#trace-steps > li.mistake", "ls => ls.map(l => +l.dataset.index)")
    assert marked == [step["index"] for step in mistaken["steps"] if step["mistake"]] and marked
    zh_page.assert_offline_and_clean()


def test_the_trace_view_steps_with_buttons_and_arrow_keys(zh_page):
    page = zh_page.page
    page.click("button[data-view='trace']")
    page.wait_for_selector("ol#trace-steps > li[aria-current='step']", state="attached")
    current = "+document.querySelector(\"ol#trace-steps > li[aria-current='step']\").dataset.index"
    first = page.evaluate(current)
    page.click("button#trace-next")
    assert page.evaluate(current) == first + 1
    page.keyboard.press("ArrowRight")
    assert page.evaluate(current) == first + 2
    page.keyboard.press("ArrowLeft")
    page.click("button#trace-prev")
    assert page.evaluate(current) == first
    zh_page.assert_offline_and_clean()


def test_clicking_a_model_view_map_opens_it_in_the_heatmap_view(zh_page):
    page = zh_page.page
    page.click("button[data-view='model']")
    page.wait_for_selector("canvas.model-cell[data-layer='4'][data-head='5']", state="attached")
    page.click("canvas.model-cell[data-layer='4'][data-head='5']")
    zh_page.wait_until("document.querySelector('#views [aria-selected=true]').dataset.view === 'heatmap'")
    zh_page.wait_until("!!document.querySelector('select#heatmap-layer') && document.querySelector('select#heatmap-layer').value === '4'")
    assert page.input_value("select#heatmap-head") == "5"
    assert page.is_visible("canvas#heatmap-canvas") and not page.is_visible("section#view-model")
    zh_page.assert_offline_and_clean()


def test_the_statistics_table_sorts_by_a_column(zh_page):
    page = zh_page.page
    page.click("button[data-view='stats']")
    page.wait_for_selector("table#stats-table tr[data-layer][data-head]", state="attached")
    entropy = {(head["layer"], head["head"]): head["entropy"] for head in zh_page.text["statistics"]["heads"]}
    rows = "Array.from(document.querySelectorAll('table#stats-table tr[data-layer][data-head]')).map(r => [+r.dataset.layer, +r.dataset.head])"
    for _ in range(2):  # one way, then the other
        page.click("table#stats-table th[data-key='entropy']")
        direction = page.get_attribute("table#stats-table th[data-key='entropy']", "aria-sort")
        assert direction in ("ascending", "descending")
        order = [tuple(row) for row in page.evaluate(rows)]
        assert sorted(order) == sorted(entropy)
        assert order == sorted(entropy, key=entropy.get, reverse=direction == "descending")
    # Each statistic's heading says its definition and paper, as the record carries them (analysis/head_numbers.py).
    from attnviz.analysis.head_numbers import HEAD_NUMBERS, STATISTICS

    for name in STATISTICS:
        entry = HEAD_NUMBERS[name]
        assert page.get_attribute(f"table#stats-table th[data-key='{name}'] button", "title") == f"{entry.definition} ({entry.paper})"
    zh_page.assert_offline_and_clean()


def test_tab_reaches_the_view_buttons_and_each_view_can_be_chosen_by_keyboard(zh_page):
    page = zh_page.page
    focused_view = "document.activeElement && document.activeElement.closest('nav#views') ? document.activeElement.dataset.view : null"
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate(focused_view):
            break
    assert page.evaluate(focused_view) == "head"
    reached = ["head"]
    for _ in VIEWS[1:]:
        page.keyboard.press("ArrowRight")
        if page.evaluate(focused_view) == reached[-1]:  # a nav of plain tab stops
            page.keyboard.press("Tab")
        reached.append(page.evaluate(focused_view))
    assert reached == VIEWS
    page.keyboard.press("Enter")
    zh_page.wait_until("document.querySelector('#views [aria-selected=true]').dataset.view === 'stats'")
    zh_page.assert_offline_and_clean()


def test_hostile_text_shows_as_characters_and_runs_nothing(hostile_report, offline_page):
    opened = offline_page(hostile_report)
    page = opened.page
    record = embedded_record(hostile_report.read_text(encoding="utf-8"))
    assert HOSTILE in page.text_content("header#report-header")
    assert opened.texts(".token[data-side='query']") == record["texts"][0]["shown_query_tokens"]
    assert "</script>" in "".join(record["texts"][0]["query_tokens"])
    assert page.title() != "x" and page.title().startswith("attnviz")
    assert page.evaluate("[document.images.length, document.scripts.length]") == [0, 2]
    page.wait_for_timeout(200)  # time for an injected handler to fire
    assert opened.dialogs == [] and not any(url.endswith("/x") for url in opened.requests)
    opened.assert_offline_and_clean()

"""The offline report's why view in Debian's Chromium (tests/browser.py), opened from its file with every request
blocked: a click on a cell of the Heatmap view's map lists its score's largest query part × key part terms and the rest
summed, as attnviz.why splits that cell (why_terms.js, the table the served page draws too); a cell the record holds no
split of says why.
"""

from __future__ import annotations

import pytest

import attnviz

pytestmark = pytest.mark.browser

TEXT = "The cat sat on the mat because it was warm."
LAYER = 2
HEAD = 5


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


@pytest.fixture(scope="module")
def report_path(model, tmp_path_factory):
    (path,) = attnviz.report(TEXT, model=model, layer=LAYER).save(tmp_path_factory.mktemp("why-report"))
    return path


def open_heatmap(offline_page, path, layer: int, head: int):
    opened = offline_page(path)
    page = opened.page
    page.click("button[data-view=heatmap]")
    page.select_option("#heatmap-layer", str(layer))
    page.select_option("#heatmap-head", str(head))
    opened.wait_until(f"(document.querySelector('#heatmap-note') || {{textContent: ''}}).textContent.startsWith('Layer {layer}, head {head}')")
    return opened


def click_cell(opened, query: int, key: int) -> None:
    page = opened.page
    n = len(page.evaluate("AV.data.texts[0].shown_query_tokens"))
    page.locator("#heatmap-canvas").scroll_into_view_if_needed()
    box = page.query_selector("#heatmap-canvas").bounding_box()
    page.mouse.click(box["x"] + box["width"] * (key + 0.5) / n, box["y"] + box["height"] * (query + 0.5) / n)


def assert_table_is_whys(opened, expected) -> None:
    """The why table the click drew against attnviz.why's split of the same cell: its 12 largest terms, then the rest
    summed where there are more; the caption says how many terms the score is the sum of ("1 term" for one)."""
    opened.wait_until("document.querySelector('#why-table') !== null")
    rows = opened.page.eval_on_selector_all("#why-table tr", "rows => rows.slice(1).map(r => Array.from(r.cells, c => c.textContent))")
    top, count = expected.top(12), expected.terms.terms.size
    shown, rest_rows = rows[: len(top)], rows[len(top) :]
    assert [(q, k, float(term)) for q, k, term, _ in shown] == [(q, k, round(term, 4)) for q, k, term in top]
    assert [share for *_, share in shown] == [f"{100 * term / expected.score:.1f}%" for _, _, term in top]
    if count > 12:
        [(others, rest, rest_share)] = rest_rows
        assert others == f"the other {count - 12:,} terms"
        assert float(rest) == round(expected.terms.total - sum(term for _, _, term in top), 4)
    else:
        assert len(top) == count and rest_rows == []
    caption = opened.page.text_content("#why-table caption")
    assert f"its score {expected.score:.4f} (weight {expected.weight:.4f})" in caption
    said = "is 1 term, query part × key part:" if count == 1 else f"is the sum of {count:,} terms, query part × key part"
    assert said in caption and "1 terms" not in caption, caption


def test_a_cell_clicked_in_the_offline_report_lists_its_terms_as_attnviz_why_splits_them(model, report_path, offline_page):
    opened = open_heatmap(offline_page, report_path, LAYER, HEAD)
    query, key = 6, 2
    click_cell(opened, query, key)
    assert_table_is_whys(opened, attnviz.why(TEXT, model=model, layer=LAYER, head=HEAD, query=query, key=key))
    opened.assert_offline_and_clean()


def test_a_decoders_past_cell_lists_its_terms_and_a_future_cell_says_the_mask_leaves_it_no_score(decoder_folder, offline_page, tmp_path):
    """The tiny grouped-query Llama: the causal record holds each query's keys up to itself alone, so a cell below the
    diagonal is read from its own place in it, and one above it says why it has no split."""
    decoder = attnviz.load(str(decoder_folder), device="cpu")
    (path,) = attnviz.report(TEXT, model=decoder, layer=1).save(tmp_path)
    opened = open_heatmap(offline_page, path, 1, 4)
    num_tokens = len(opened.page.evaluate("AV.data.texts[0].shown_query_tokens"))
    query, key = num_tokens - 2, num_tokens // 2  # a late row: its place in the record is far from query × N + key
    click_cell(opened, query, key)
    assert_table_is_whys(opened, attnviz.why(TEXT, model=decoder, layer=1, head=4, query=query, key=key))
    click_cell(opened, 3, 7)
    opened.wait_until("document.querySelector('#why-note') !== null")
    assert opened.page.text_content("#why-note") == "Key 7 comes after query 3: under the causal mask its weight is 0 and it has no score to split."
    opened.assert_offline_and_clean()


def test_a_score_of_one_term_is_said_to_be_1_term(decoder_folder, offline_page, tmp_path):
    """The tiny Llama's layer 0 reads the token embeddings alone (RoPE: no position part): one part a side, so each
    score is one term, which the caption says as "1 term", with no rest row."""
    decoder = attnviz.load(str(decoder_folder), device="cpu")
    (path,) = attnviz.report(TEXT, model=decoder, layer=0).save(tmp_path)
    opened = open_heatmap(offline_page, path, 0, 2)
    click_cell(opened, 6, 2)
    expected = attnviz.why(TEXT, model=decoder, layer=0, head=2, query=6, key=2)
    assert expected.terms.terms.size == 1
    assert_table_is_whys(opened, expected)
    assert opened.page.text_content("#why-table caption").endswith(f"its score {expected.score:.4f} (weight {expected.weight:.4f}) is 1 term, query part × key part:")
    opened.assert_offline_and_clean()


def test_a_cell_of_another_layer_says_the_report_splits_its_own_layer_alone(report_path, offline_page):
    opened = open_heatmap(offline_page, report_path, 4, 0)
    click_cell(opened, 3, 1)
    opened.wait_until("document.querySelector('#why-note') !== null")
    assert opened.page.text_content("#why-note") == f"The report splits the scores of layer {LAYER} alone: attnviz why --layer 4 splits this one."
    opened.assert_offline_and_clean()

"""`attnviz serve`'s page in Debian's Chromium (tests/browser.py), against a real server in a thread of this process:
a text typed is drawn without a reload, and a cell read out in the heatmap view is the API's own number for it.

Every request the page makes is recorded: only the server's own origin is allowed, the rest aborted and failed on.
"""

from __future__ import annotations


import pytest
from helpers import assert_close_after_rounding, decoded, serving


TYPED = "the quick brown fox jumps over the lazy dog"
LAYER = 2
HEAD = 5


@pytest.fixture(scope="module")
def server():
    import attnviz

    with serving({"bundled": attnviz.load("bundled", device="cpu")}) as server:
        yield server


@pytest.fixture
def page(browser, server):
    """The page at the URL `attnviz serve` prints, every request to another origin aborted and recorded."""
    from browser import ACTION_TIMEOUT_MS, READY, READY_TIMEOUT_MS

    origin = server.url.split("/?")[0]
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    foreign, errors = [], []
    opened = context.new_page()
    opened.route("**/*", lambda route: route.continue_() if route.request.url.startswith(origin + "/") else (foreign.append(route.request.url), route.abort()))
    opened.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    opened.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    opened.goto(server.url)
    opened.wait_for_selector(READY, state="attached", timeout=READY_TIMEOUT_MS)
    opened.expected_errors = []  # what a test makes the page log on purpose (Chromium logs each 4xx answer)
    yield opened
    context.close()
    assert foreign == [] and errors == opened.expected_errors


def wait_until(page, expression: str, timeout_ms: int = 20_000) -> None:
    """Polls a JavaScript expression (wait_for_function evals in the page, which its CSP refuses)."""
    for _ in range(timeout_ms // 50):
        if page.evaluate(expression):
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"timed out waiting for {expression}")


def heads(server, body: dict) -> dict:
    import http.client
    import json

    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    connection.request("POST", "/api/heads", json.dumps(body), {"Authorization": f"Bearer {server.token}"})
    response = connection.getresponse()
    assert response.status == 200
    return json.loads(response.read())


def test_a_typed_text_is_drawn_and_a_heatmap_cell_reads_out_the_apis_weight(server, page):
    shown_first = page.evaluate("AV.data.texts[0].text")
    assert shown_first and page.is_visible("#explorer-text")
    page.select_option("#explorer-layer", str(LAYER))
    page.fill("#explorer-text", TYPED)  # an input event: the page asks again once the keys pause
    wait_until(page, f"AV.data.texts[0].text === {TYPED!r} && AV.data.texts[0].layer === {LAYER}")
    assert page.evaluate("document.querySelectorAll('script').length") == 2  # redrawn, not reloaded
    page.click("button[data-view=heatmap]")
    page.select_option("#heatmap-head", str(HEAD))
    wait_until(page, f"(document.querySelector('#heatmap-note') || {{textContent: ''}}).textContent.startsWith('Layer {LAYER}, head {HEAD}')")
    record = heads(server, {"text": TYPED, "layer": LAYER})
    weights = record["attention"][HEAD]
    tokens = record["shown_query_tokens"]
    n = len(tokens)
    page.locator("#heatmap-canvas").scroll_into_view_if_needed()  # below the page's controls: the mouse reaches what is shown
    box = page.query_selector("#heatmap-canvas").bounding_box()
    query, key = 4, 2
    page.mouse.move(box["x"] + box["width"] * (key + 0.5) / n, box["y"] + box["height"] * (query + 0.5) / n)
    readout = page.text_content("#heatmap-readout")  # the page's own request: another run than this one, within float32
    assert readout.startswith(f"layer {LAYER} · head {HEAD} · query {query}:{tokens[query]} · key {key}:{tokens[key]} · ")
    assert_close_after_rounding([float(readout.split(" · ")[-1])], [weights[query][key]], 4, magnitude=1.0)


def test_an_error_of_the_server_is_one_line_on_the_page_and_the_next_text_draws(server, page):
    page.fill("#explorer-text", "   ")
    wait_until(page, "document.querySelector('#explorer-status').textContent.startsWith('error:')")
    assert page.text_content("#explorer-status") == "error: the text is empty: give some words to attend over"
    page.expected_errors.append("Failed to load resource: the server responded with a status of 400 (Bad Request)")
    page.fill("#explorer-text", "a cat")
    wait_until(page, "AV.data.texts[0].text === 'a cat'")


def test_the_neuron_view_of_the_served_page_sums_the_apis_q_and_k(server, page):
    page.fill("#explorer-text", TYPED)
    wait_until(page, f"AV.data.texts[0].text === {TYPED!r}")
    page.click("button[data-view=neuron]")
    page.select_option("#neuron-query", "3")
    page.select_option("#neuron-key", "1")
    wait_until(page, "document.querySelectorAll('.neuron-sum').length > 0")  # drawn once the vectors are decoded
    vectors = heads(server, {"text": TYPED, "layer": page.evaluate("AV.data.texts[0].layer"), "as": "report"})["texts"][0]["vectors"]
    sums = [float(value) for value in page.eval_on_selector_all(".neuron-sum", "spans => spans.map(s => s.textContent)")]
    q, k = decoded(vectors["q"]), decoded(vectors["k"])  # (H, N, d), (H_kv, N, d)
    expected = [float(q[head, 3] @ k[head // vectors["group_size"], 1]) for head in range(len(q))]
    assert sums == pytest.approx(expected, abs=5e-5 + 1e-9)


def test_a_heatmap_cell_clicked_shows_its_scores_largest_terms_as_attnviz_why_splits_it(server, page):
    """The served page's heatmap view: a click on a cell asks POST /api/why and lists the largest query part × key part
    terms of its score; they are attnviz.why's own (the server runs it on the same handle)."""
    import attnviz

    page.select_option("#explorer-layer", str(LAYER))
    page.fill("#explorer-text", TYPED)
    wait_until(page, f"AV.data.texts[0].text === {TYPED!r} && AV.data.texts[0].layer === {LAYER}")
    page.click("button[data-view=heatmap]")
    page.select_option("#heatmap-head", str(HEAD))
    wait_until(page, f"(document.querySelector('#heatmap-note') || {{textContent: ''}}).textContent.startsWith('Layer {LAYER}, head {HEAD}')")
    n = len(page.evaluate("AV.data.texts[0].shown_query_tokens"))
    page.locator("#heatmap-canvas").scroll_into_view_if_needed()
    box = page.query_selector("#heatmap-canvas").bounding_box()
    query, key = 4, 2
    page.mouse.click(box["x"] + box["width"] * (key + 0.5) / n, box["y"] + box["height"] * (query + 0.5) / n)
    wait_until(page, "document.querySelector('#why-table') !== null")
    rows = page.eval_on_selector_all("#why-table tr", "rows => rows.slice(1).map(r => Array.from(r.cells, c => c.textContent))")
    expected = attnviz.why(TYPED, model=server.explorer.handles["bundled"], layer=LAYER, head=HEAD, query=query, key=key)
    *top, (others, rest, _) = rows  # the 12 largest terms, then the rest summed
    assert [(q, k, float(term)) for q, k, term, _ in top] == [(q, k, round(term, 4)) for q, k, term in expected.top(len(top))]
    assert len(top) == 12 and others == f"the other {expected.terms.terms.size - 12:,} terms"
    assert float(rest) == round(expected.terms.total - sum(term for _, _, term in expected.top(12)), 4)
    caption = page.text_content("#why-table caption")
    assert f"is the sum of {expected.terms.terms.size:,} terms, query part × key part; the 12 largest, and the rest summed" in caption

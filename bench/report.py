"""report.html's budgets (issue 13, part 4): its size and how fast headless Chromium shows its first view.

    python bench/report.py [--rounds 5] [--keep DIR]

Builds the report of a 12-, a 128- and a 512-token text on the bundled model (all 6 layers,
attnviz.report as a user calls it), then opens each from its file in Debian's Chromium (no
network: every request is aborted, and any is an error), a new browser context per opening,
once per size in each round, and prints the medians:

- the file's size (budgets: 12 tokens < 1.5 MB, 512 tokens < 15 MB);
- ready: window.AV.readyMs, the page's own clock from navigation start to the first view drawn;
- wall: from page.goto to body[data-ready="true"] seen by Playwright (budget: 128 tokens < 1 s).

--long adds the page of tests/test_report_long.py's budget (SmolLM2's 9 heads x 8,192 tokens of a causal softmax,
30 layers of summaries; the same builder): it opens on the Zoom view, budget < 1 s (a timing the tests leave here).

Chromium is /usr/bin/chromium or $ATTNVIZ_CHROMIUM (never a downloaded browser).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TOKENS = (12, 128, 512)
SENTENCE = "the animal did not cross the street because it was too tired and the rain kept falling on the old town ."
SIZE_BUDGETS_MB = {12: 1.5, 512: 15.0}
WALL_BUDGET_S = {128: 1.0, 8192: 1.0}
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]  # fmt: skip


def text_of(num_tokens: int, tokenizer) -> str:
    """A text of exactly num_tokens tokens with [CLS] and [SEP] (every word of SENTENCE is one token)."""
    words = (SENTENCE.split() * (num_tokens // len(SENTENCE.split()) + 1))[: num_tokens - 2]
    text = " ".join(words)
    assert len(tokenizer.encode(text).ids) == num_tokens, (num_tokens, len(tokenizer.encode(text).ids))
    return text


def build_reports(folder: Path) -> dict[int, tuple[Path, float, float]]:
    """Each size's report.html, the seconds attnviz.report took (the model loaded before) and its MB."""
    from tokenizers import Tokenizer

    import attnviz
    from attnviz.models.loading import bundled_model_path

    tokenizer = Tokenizer.from_file(str(Path(bundled_model_path()) / "tokenizer.json"))
    tokenizer.no_padding()  # its tokenizer.json pads to 128
    tokenizer.no_truncation()
    model = attnviz.load("bundled", device="cpu")
    built = {}
    for num_tokens in TOKENS:
        start = time.perf_counter()
        report = attnviz.report(text_of(num_tokens, tokenizer), model=model)
        (path,) = report.save(folder / f"report-{num_tokens}")
        built[num_tokens] = path, time.perf_counter() - start, path.stat().st_size / 1e6
    return built


def build_long_report(folder: Path) -> tuple[Path, float, float]:
    """The 8,192-token budget page, built as tests/test_report_long.py builds it (its helpers, not a copy)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_report_long import BUDGET_HEADS, BUDGET_LAYERS, BUDGET_TOKENS, causal_softmax_npy, long_report_record

    from attnviz.html import report_page

    start = time.perf_counter()
    attention = causal_softmax_npy(folder / "attention.npy", BUDGET_HEADS, BUDGET_TOKENS)
    *_, record = long_report_record(BUDGET_TOKENS, BUDGET_HEADS, BUDGET_LAYERS, attention, model="HuggingFaceTB/SmolLM2-135M", layer=10)
    path = folder / "report-8192.html"
    path.write_text(report_page(record), encoding="utf-8")
    return path, time.perf_counter() - start, path.stat().st_size / 1e6


def open_once(browser, path: Path) -> tuple[float, float]:
    """(AV.readyMs in s, wall s from goto to ready) of one opening in a fresh context, offline."""
    url = path.resolve().as_uri()
    refused, errors = [], []
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.route("**/*", lambda route: route.continue_() if route.request.url == url else (refused.append(route.request.url), route.abort()))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_selector('body[data-ready="true"]', state="attached", timeout=60_000)
    wall = time.perf_counter() - start
    ready_ms = page.evaluate("window.AV.readyMs")
    context.close()
    if refused or errors:
        raise SystemExit(f"{path}: requests {refused}, errors {errors}")
    return ready_ms / 1000, wall


def measure(built: dict, rounds: int) -> dict[int, list[tuple[float, float]]]:
    from playwright.sync_api import sync_playwright

    executable = os.environ.get("ATTNVIZ_CHROMIUM", "/usr/bin/chromium")
    times = {num_tokens: [] for num_tokens in built}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=LAUNCH_ARGS)
        print(f"Chromium {browser.version} (headless), {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
        open_once(browser, built[TOKENS[0]][0])  # warm-up: the first page of a browser pays its start-up
        for _ in range(rounds):
            for num_tokens, (path, *_) in built.items():  # every size once per round: a drift falls on all alike
                times[num_tokens].append(open_once(browser, path))
        browser.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="write the reports here (default: a temporary folder)")
    parser.add_argument("--long", action="store_true", help="add the 8,192-token budget page (Zoom view first)")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="attnviz-bench-report-") as scratch:
        built = build_reports(options.keep or Path(scratch))
        if options.long:
            built[8192] = build_long_report(options.keep or Path(scratch))
        times = measure(built, options.rounds)
    print(f"medians of {options.rounds} rounds; bundled all-MiniLM-L6-v2, all 6 layers")
    print("| tokens | report.html MB | built s | ready s (AV.readyMs) | wall s (goto to ready) | budget | met |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- |")
    failed = False
    for num_tokens, (_, build_s, size_mb) in built.items():
        ready = statistics.median(ready_s for ready_s, _ in times[num_tokens])
        wall = statistics.median(wall_s for _, wall_s in times[num_tokens])
        budgets, met = [], True
        if num_tokens in SIZE_BUDGETS_MB:
            budgets.append(f"< {SIZE_BUDGETS_MB[num_tokens]} MB")
            met &= size_mb < SIZE_BUDGETS_MB[num_tokens]
        if num_tokens in WALL_BUDGET_S:
            budgets.append(f"first view < {WALL_BUDGET_S[num_tokens]} s")
            met &= wall < WALL_BUDGET_S[num_tokens]
        failed |= not met
        print(f"| {num_tokens} | {size_mb:.2f} | {build_s:.2f} | {ready:.3f} | {wall:.3f} | {', '.join(budgets) or '-'} | {'yes' if met else 'NO'} |")
    if failed:
        raise SystemExit("a budget is not met")


if __name__ == "__main__":
    main()

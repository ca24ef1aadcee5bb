"""Several tokens at once (selection.js) in report.html's heatmap and head views, in Chromium: the sums and means of
the chosen queries' (or keys') attention, against attnviz.heads' map summed here with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import attnviz

TEXT = "The cat sat on the mat because it was tired."
LAYER = 1
HEAD = 4
QUERIES = [1, 3, 4]
KEYS = [0, 2]


@pytest.fixture(scope="module")
def selection_report(tmp_path_factory):
    model = attnviz.load("bundled", device="cpu")
    (path,) = attnviz.report(TEXT, model=model, layer=LAYER).save(tmp_path_factory.mktemp("selection"))
    return path, attnviz.heads(TEXT, model=model, layer=LAYER).attention.numpy()[HEAD].astype(np.float64)  # (N, N)


def table(page, selector: str) -> np.ndarray:
    """(rows, 2): the sum and mean columns of a sums table."""
    rows = page.page.eval_on_selector_all(f"{selector} tr[data-index]", "rows => rows.map(r => [r.querySelector('.sum').textContent, r.querySelector('.mean').textContent])")
    return np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("view", ["heatmap", "head"])
def test_the_chosen_queries_and_keys_attention_summed_and_averaged(selection_report, opened, view):
    path, weights = selection_report
    page = opened(path)
    page.page.click(f"button[data-view={view}]")
    page.page.select_option(f"#{view}-sel-head", str(HEAD))
    page.page.select_option(f"#{view}-sel-queries", [str(index) for index in QUERIES])
    page.wait_until(f"document.querySelector('#{view}-query-sums') !== null")
    # the page adds the record's weights, each to 4 decimals: len(QUERIES) × 5e-5 off at most, and its own rounding
    queries = table(page, f"#{view}-query-sums")
    expected = weights[QUERIES].sum(axis=0)  # (N,): each key's weight summed over the chosen queries
    np.testing.assert_allclose(queries[:, 0], expected, atol=len(QUERIES) * 5e-5 + 5e-5, rtol=0)
    np.testing.assert_allclose(queries[:, 1], expected / len(QUERIES), atol=5e-5 + 5e-5, rtol=0)
    assert f"head {HEAD}: the attention of 3 queries" in page.page.text_content(f"#{view}-query-sums caption")
    page.page.select_option(f"#{view}-sel-keys", [str(index) for index in KEYS])
    page.wait_until(f"document.querySelector('#{view}-key-sums') !== null")
    keys = table(page, f"#{view}-key-sums")
    expected = weights[:, KEYS].sum(axis=1)  # (N,): each query's weight on the chosen keys
    np.testing.assert_allclose(keys[:, 0], expected, atol=len(KEYS) * 5e-5 + 5e-5, rtol=0)
    np.testing.assert_allclose(keys[:, 1], expected / len(KEYS), atol=5e-5 + 5e-5, rtol=0)

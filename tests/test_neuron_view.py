"""The neuron view of report.html in Chromium (conftest.py's offline page): each head's q · k, scaled score and
weight for a query and key chosen, against attnviz.heads(vectors=True)'s own float32 vectors and map."""

from __future__ import annotations

import numpy as np
import pytest

import attnviz

TEXT = "The cat sat on the mat because it was tired."
LAYER = 3
QUERY, KEY = 5, 2


@pytest.fixture(scope="module")
def neuron_report(tmp_path_factory):
    model = attnviz.load("bundled", device="cpu")
    (path,) = attnviz.report(TEXT, model=model, layer=LAYER).save(tmp_path_factory.mktemp("neurons"))
    return path, attnviz.heads(TEXT, model=model, layer=LAYER, vectors=True)


def test_each_heads_q_dot_k_is_the_apis_score_before_the_scale(neuron_report, opened):
    path, result = neuron_report
    page = opened(path)
    page.page.click("button[data-view=neuron]")
    page.page.select_option("#neuron-query", str(QUERY))
    page.page.select_option("#neuron-key", str(KEY))
    sums = [float(value) for value in page.texts(".neuron-sum")]
    scaled = [float(value) for value in page.texts(".neuron-scaled")]
    weights = page.texts(".neuron-weight")
    vectors = result.vectors
    exact = vectors.scores()[:, QUERY, KEY]  # (H,): the API's q · k in float32
    # the page multiplies the record's q and k, each to 4 decimals: at most 5e-5 × Σ(|q| + |k|) off, and its own rounding
    bound = 5e-5 * (np.abs(vectors.q[:, QUERY]).sum(axis=-1) + np.abs(vectors.k[:, KEY]).sum(axis=-1)) + 5e-5 + 1e-4
    assert len(sums) == result.num_heads
    assert np.all(np.abs(np.array(sums) - exact) <= bound), (sums, exact)
    assert np.all(np.abs(np.array(scaled) - exact * vectors.scale) <= bound * vectors.scale + 5e-5)
    assert weights == [f"{w:.4f}" for w in np.round(result.attention.numpy()[:, QUERY, KEY].astype(np.float64), 4)]
    # a cell's read-out names its numbers
    page.page.hover(".neuron-strips[data-head='1'] rect[data-channel='3']")
    q, k = vectors.q[1, QUERY, 3], vectors.k[1, KEY, 3]
    readout = page.page.text_content("#neuron-readout")
    assert readout.startswith(f"head 1 · channel 3: q {q:.4f} × k {k:.4f} = ")

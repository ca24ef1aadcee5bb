"""The neuron view of report.html in Chromium (conftest.py's offline page): each head's q · k, scaled score and
weight for a query and key chosen, against attnviz.heads(vectors=True)'s own float32 vectors and map."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import assert_close_after_rounding

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
    # the view draws its heads once the record's vectors are decoded (asynchronously: AV.decode)
    page.wait_until(f"document.querySelectorAll('.neuron-sum').length === {result.num_heads}")
    sums = [float(value) for value in page.texts(".neuron-sum")]
    scaled = [float(value) for value in page.texts(".neuron-scaled")]
    weights = page.texts(".neuron-weight")
    vectors = result.vectors
    exact = vectors.scores()[:, QUERY, KEY]  # (H,): the API's q · k in float32
    # the page multiplies the record's q and k, the API's float32 values: its sum is off by its 4 decimals' rounding and
    # float32's rounding of the API's sum (well within 1e-6 of Σ|q k| over 32 products)
    bound = 5e-5 + 1e-6 * np.abs(vectors.q[:, QUERY] * vectors.k[:, KEY]).sum(axis=-1) + 1e-9
    assert len(sums) == result.num_heads
    assert np.all(np.abs(np.array(sums) - exact) <= bound), (sums, exact)
    assert np.all(np.abs(np.array(scaled) - exact * vectors.scale) <= bound * vectors.scale + 5e-5)
    assert all(len(weight.split(".")[1]) == 4 for weight in weights)  # the report's run, to 4 decimals: heads' within float32
    assert_close_after_rounding([float(weight) for weight in weights], result.attention.numpy()[:, QUERY, KEY], 4, rounded=1)
    # a cell's read-out names its numbers
    page.page.hover(".neuron-strips[data-head='1'] rect[data-channel='3']")
    q, k = vectors.q[1, QUERY, 3], vectors.k[1, KEY, 3]
    readout = page.page.text_content("#neuron-readout")
    shown = re.match(r"head 1 · channel 3: q (-?\d+\.\d{4}) × k (-?\d+\.\d{4}) = ", readout)
    assert shown, readout  # the report's run: heads' q and k within float32
    magnitude = max(np.abs(vectors.q).max(), np.abs(vectors.k).max())
    assert_close_after_rounding([float(shown[1]), float(shown[2])], [q, k], 4, rounded=1, magnitude=magnitude)

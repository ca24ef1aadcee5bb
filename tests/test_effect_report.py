"""A head's effect in the report (effect=, --effect), in Debian's Chromium: beside each head in the head view, under
each map of the layers measured in the model view, in the heatmap view's note.

The texts expected are written here from the result's own numbers (HeadEffects.values), with the decimals the
report promises: the layer's largest value to 2 significant digits, at least 3 and at most 5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny_families import build_checkpoint

TEXT = "The cat sat on the mat because it was tired."


def said(values: np.ndarray, head: int, name: str) -> str:
    """The value of one head among its layer's values as the report writes it: "0.2010", "+0.220"."""
    largest = float(np.abs(values).max())
    decimals = min(5, max(3, 1 - math.floor(math.log10(largest)))) if largest > 0 else 3
    return f"{values[head]:{'+' if name == 'loss' else ''}.{decimals}f}"


@pytest.fixture(scope="module")
def gpt2_effects(tmp_path_factory):
    """A tiny GPT-2: the report of attnviz.layers(effect="zero") (every layer measured) and its effects."""
    import attnviz

    folder = tmp_path_factory.mktemp("gpt2-effect")
    build_checkpoint("gpt2", folder / "gpt2", seed=1)
    result = attnviz.layers(TEXT, model=str(folder / "gpt2"), effect="zero", device="cpu")
    path = result.report().save(folder / "report")[0]
    return path, result.effects


def test_the_model_view_says_each_heads_effect_under_its_map(gpt2_effects, opened):
    path, effects = gpt2_effects
    page = opened(path)
    page.page.click("button[data-view=model]")
    page.page.wait_for_selector("#view-model .model-cell-effect", state="attached")
    captions = page.texts("#view-model .model-cell-effect")
    kl = effects.values["kl"]
    assert captions == [f"KL {said(kl[layer], head, 'kl')}" for layer in range(kl.shape[0]) for head in range(kl.shape[1])]
    titles = page.page.eval_on_selector_all("#view-model .model-cell-button", "buttons => buttons.map(b => b.title)")
    loss = effects.values["loss"]
    assert titles[5] == f"layer 1 · head 1 · KL {said(kl[1], 1, 'kl')} · Δloss {said(loss[1], 1, 'loss')}"
    note = page.texts("#view-model .note")[0]
    assert "zero ablation" in note and "KL(p ‖ q) of the next-token distributions" in note


def test_the_head_view_labels_each_head_with_its_effect_for_the_layer_shown(gpt2_effects, opened):
    path, effects = gpt2_effects
    page = opened(path)
    page.page.wait_for_selector("#view-head .head-effect", state="attached")
    kl = effects.values["kl"]
    assert [text.strip() for text in page.texts("#view-head .head-effect")] == [f"KL {said(kl[0], head, 'kl')}" for head in range(kl.shape[1])]
    page.page.select_option("#head-layer", "1")
    page.wait_until(f"document.querySelector('#view-head .head-effect').textContent.trim() === 'KL {said(kl[1], 0, 'kl')}'")


def test_the_heatmap_views_note_says_the_heads_effect(gpt2_effects, opened):
    path, effects = gpt2_effects
    page = opened(path)
    page.page.click("button[data-view=heatmap]")
    page.page.wait_for_selector("#heatmap-note", state="attached")
    page.page.select_option("#heatmap-head", "2")
    kl, loss = effects.values["kl"][0], effects.values["loss"][0]
    expected = f"Head 2: KL {said(kl, 2, 'kl')} · Δloss {said(loss, 2, 'loss')}, its effect (--effect, zero ablation)"
    page.wait_until(f"document.querySelector('#heatmap-note').textContent.includes({expected!r})")

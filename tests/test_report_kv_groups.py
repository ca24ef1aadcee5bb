"""The report's model view and header for grouped-query attention and re-split heads, in Debian's Chromium.

A tiny Llama (tests/tiny_families.py: 6 query heads over 2 key/value heads) is run through attnviz and its
report opened offline; the groups expected are computed from its config.json, never from the page.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from tiny_families import build_checkpoint

TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def llama_reports(tmp_path_factory):
    """Report files of the tiny Llama, its own heads ("own") and re-split into one group ("re_split"), and its config."""
    from attnviz.html import ReportText, report_page, report_record
    from attnviz.html.encoding import encode_layers
    from attnviz.models.loading import load_model
    from attnviz.pipeline import run_attention, run_layers
    from attnviz.spec import run_spec

    folder = tmp_path_factory.mktemp("llama-report")
    build_checkpoint("llama", folder / "llama")
    config = json.loads((folder / "llama" / "config.json").read_text())
    loaded = load_model(str(folder / "llama"))
    group = config["num_attention_heads"] // config["num_key_value_heads"]
    paths = {}
    for name, num_heads in (("own", None), ("re_split", group)):
        spec = run_spec(loaded, str(folder / "llama"), layer=0, num_heads=num_heads or loaded.num_heads, device="cpu")
        runs = run_attention(loaded, [TEXT], spec)
        layer_runs = run_layers(loaded, [TEXT], replace(spec, layer=None))
        layers = encode_layers([layer_run.attention for layer_run in layer_runs[0]])
        record = report_record([ReportText(runs[0], layers)], spec, kind="decoder", num_layers=loaded.num_layers)
        paths[name] = folder / f"{name}.html"
        paths[name].write_text(report_page(record), encoding="utf-8")
    return paths, config


def test_the_model_view_groups_the_heads_under_their_key_value_head(llama_reports, opened):
    paths, config = llama_reports
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    group = heads // kv_heads
    page = opened(paths["own"])
    page.page.click("button[data-view=model]")
    page.page.wait_for_selector("#view-model .kv-group", state="attached")

    labels = page.texts("#view-model .kv-group")
    assert labels == [f"kv head {kv}: heads {kv * group}–{kv * group + group - 1}" for kv in range(kv_heads)]
    # each label spans its group's columns, and stands over them
    spans = page.page.eval_on_selector_all("#view-model .kv-group", "els => els.map(e => e.style.gridColumn)")
    assert spans == [f"span {group}"] * kv_heads
    boxes = page.page.eval_on_selector_all(
        "#view-model .kv-group, #view-model .head-label",
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [e.textContent, r.left, r.right]; })",
    )
    group_boxes, head_boxes = boxes[:kv_heads], boxes[kv_heads:]
    for head, (_, left, right) in enumerate(head_boxes):
        _, group_left, group_right = group_boxes[head // group]
        assert group_left - 1 <= left and right <= group_right + 1, f"head {head} is not under its key/value head"

    # every map of a head carries its key/value head, and the frames of one group share a colour no other group has
    # (the open map's frame, aria-current, is the accent colour instead)
    cells = page.page.eval_on_selector_all(
        "#view-model button.model-cell-button",
        "els => els.map(e => [Number(e.firstChild.dataset.head), Number(e.dataset.kvHead), getComputedStyle(e).borderTopColor,"
        " e.hasAttribute('aria-current')])",
    )
    assert len(cells) == heads * config["num_hidden_layers"]
    assert all(kv == head // group for head, kv, _, _ in cells)
    colours = {kv: {colour for head, k, colour, current in cells if k == kv and not current} for kv in range(kv_heads)}
    assert all(len(each) == 1 for each in colours.values()) and len(set.union(*colours.values())) == kv_heads
    assert f"the {heads} heads share {kv_heads} key/value heads" in page.texts("#view-model p.note")[0]


def test_the_header_says_the_heads_are_re_split_from_the_trained_ones(llama_reports, opened):
    paths, config = llama_reports
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    page = opened(paths["re_split"])
    facts = dict(zip(page.texts("#report-facts dt"), page.texts("#report-facts dd")))
    group = heads // kv_heads
    assert f"re-split from the trained {heads} × d" in facts["Heads"]
    assert f"trained: {kv_heads} key/value heads)" in facts["Heads"]
    assert f"split into {group} heads in place of its {heads}" in facts["Parameters"]
    assert any(f"{group} heads re-split from the trained {heads}" in line for line in page.texts(".report-subtitle"))

    own = opened(paths["own"])
    own_facts = dict(zip(own.texts("#report-facts dt"), own.texts("#report-facts dd")))
    assert "re-split" not in own_facts["Heads"] and f"sharing {kv_heads} key/value heads" in own_facts["Heads"]

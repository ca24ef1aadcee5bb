"""attnviz.report and every result's .report(): the record holds the same numbers as the other results and files.

Weights are decoded here on their own (base64, zlib, NumPy), not with attnviz.html's decoder, and
compared with what attnviz.heads, layers, stats and trace return for the same text.
"""

import html
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import assert_close_after_rounding, assert_records_match, decoded

import attnviz
from attnviz.errors import AttnvizError

TEXT = "The cat sat on the mat."
ROUNDING = 5e-5  # the record's exact weights are rounded to 4 decimals: off by at most this from the run they hold


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


@pytest.fixture(scope="module")
def report(model):
    return attnviz.report(TEXT, model=model, layer=2)


def page_record(page: str) -> dict:
    """The record as the page carries it: the JSON of <script type="application/json" id="attnviz-data">."""
    (data,) = re.findall(r'<script type="application/json" id="attnviz-data">(.*?)</script>', page, re.S)
    return json.loads(data)


def test_each_text_holds_attention_json_s_fields_and_its_weights_within_the_rounding(model, report, tmp_path):
    heads = attnviz.heads(TEXT, model=model, layer=2)
    heads.save(tmp_path)
    attention_json = json.loads((tmp_path / "attention.json").read_text(encoding="utf-8"))
    (text,) = report.record["texts"]
    assert set(attention_json) <= set(text)
    # two runs (the report's, heads'): the same fields, their numbers within what float32 allows
    assert_records_match({key: text[key] for key in attention_json if key != "attention"}, {
        key: value for key, value in attention_json.items() if key != "attention"
    })
    weights = decoded(text["attention"])
    assert weights.shape == heads.attention.shape == (12, 9, 9)
    assert_close_after_rounding(weights, np.array(attention_json["attention"]), 4, rounded=1)
    assert report.record["num_layers"] == 6 and report.record["kind"] == "encoder"


def test_every_layer_and_the_rollout_are_attnviz_layers(model, report):
    layers = attnviz.layers(TEXT, model=model)
    (text,) = report.record["texts"]
    every_layer = decoded(text["layers"])
    assert every_layer.shape == (6, 12, 9, 9)
    assert_close_after_rounding(every_layer, layers.attention.numpy(), 4, rounded=1)  # two runs: within float32
    assert_close_after_rounding(decoded(text["rollout"]), layers.rollout, 4, rounded=1)


def test_the_statistics_are_attnviz_stats_of_that_one_text(model, report):
    stats = attnviz.stats(TEXT, model=model).to_dict()
    statistics = report.record["texts"][0]["statistics"]
    assert set(statistics) == {*stats, "definitions"}  # the record also carries each statistic's definition and paper
    from attnviz.analysis.head_numbers import HEAD_NUMBERS

    assert list(statistics["definitions"]) == stats["statistics"]
    for name, defined in statistics["definitions"].items():
        entry = HEAD_NUMBERS[name]
        assert defined == {"name": entry.title, "definition": entry.definition, "paper": entry.paper}
    numbers = ("heads", "js_distance")
    assert {key: statistics[key] for key in stats if key not in numbers} == {key: stats[key] for key in stats if key not in numbers}
    assert [(head["layer"], head["head"], head["label"]) for head in statistics["heads"]] == [
        (head["layer"], head["head"], head["label"]) for head in stats["heads"]
    ]
    for ours, theirs in zip(statistics["heads"], stats["heads"]):
        for name in stats["statistics"]:
            assert ours[name] == pytest.approx(theirs[name], abs=1e-4), (ours["layer"], ours["head"], name)
    np.testing.assert_allclose(statistics["js_distance"], stats["js_distance"], atol=1e-4)


def test_the_trace_is_every_layout_and_each_mistake_as_attnviz_trace_records_them(model, report):
    (text,) = report.record["texts"]
    every_layout = attnviz.trace(TEXT, model=model, layer=2, layout="all").to_dict()
    assert [layout["layout"] for layout in text["trace"]["layouts"]] == ["view-permute", "merged-batch", "fused-qkv", "single-head"]
    assert text["trace"]["layouts"] == every_layout["layouts"]
    assert text["trace"]["checks"] == every_layout["checks"]
    assert [mistaken["mistake"]["mistake"] for mistaken in text["mistakes"]] == ["view-without-permute", "merge-without-permute"]
    for mistaken in text["mistakes"]:
        expected = attnviz.trace(TEXT, model=model, layer=2, mistake=mistaken["mistake"]["mistake"]).to_dict()
        assert mistaken["layouts"] == expected["layouts"] and mistaken["mistake"] == expected["mistake"]


def test_cross_attention_has_no_layers_and_one_head_has_no_mistakes_and_says_why(model):
    cross = attnviz.report(TEXT, model=model, kv="A dog.")
    (text,) = cross.record["texts"]
    assert text["layers"] is None and text["rollout"] is None and text["statistics"] is None
    assert text["key_tokens"] == ["[CLS]", "a", "dog", ".", "[SEP]"]
    assert [layout["layout"] for layout in text["trace"]["layouts"]] == ["view-permute", "merged-batch", "single-head"]
    assert any("fused-qkv left out" in note for note in text["trace"]["notes"])

    one_head = attnviz.report(TEXT, model=model, heads=1)
    assert one_head.record["texts"][0]["mistakes"] == []
    notes = one_head.record["notes"]
    assert [note for note in notes if "mistake" in note] == [
        "no reshape mistake traced in this report: with 1 head the wrong view gives the right tensor"
    ]
    assert not any("--mistake" in note for note in notes)  # the report takes no --mistake: no advice about it


def test_a_decoder_with_grouped_query_heads_has_every_layer_its_own_layout_and_no_mistakes(tmp_path):
    from tiny_families import build_checkpoint

    build_checkpoint("llama", tmp_path / "llama")
    llama = attnviz.report(TEXT, model=str(tmp_path / "llama"), device="cpu", layer=1)
    (text,) = llama.record["texts"]
    assert (llama.record["kind"], llama.record["num_layers"], llama.record["num_heads"], llama.record["num_kv_heads"]) == (
        "decoder", 2, 6, 2
    )
    assert text["causal"] and text["layers"]["shape"][:2] == [2, 6] and text["statistics"]["num_layers"] == 2
    assert [layout["layout"] for layout in text["trace"]["layouts"]] == ["view-permute"]  # RoPE and GQA: the others cannot
    assert text["mistakes"] == []
    notes = llama.record["notes"]
    assert [note for note in notes if "mistake" in note] == [
        "no reshape mistake traced in this report: the mistakes split heads that queries and keys share, "
        "and this layer's 6 query heads share 2 key/value heads"
    ]
    assert not any("--mistake" in note for note in notes)  # the report takes no --mistake: no advice about it


def test_a_list_of_texts_is_one_report_in_order_and_more_than_64_are_refused_before_loading(model, monkeypatch):
    texts = ["the cat", "我想吃酸菜鱼", "a dog barked"]
    several = attnviz.report(texts, model=model)
    assert [text["text"] for text in several.record["texts"]] == several.texts == texts
    for text, alone in zip(several.record["texts"], attnviz.heads(texts, model=model)):
        assert_close_after_rounding(decoded(text["attention"]), alone.attention.numpy(), 4, rounded=1)  # two runs

    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("loaded a model"))
    with pytest.raises(AttnvizError, match="a report holds at most 64 texts, not 65"):
        attnviz.report(["the cat"] * 65, model="bundled")


def test_texts_whose_every_layer_maps_outgrow_a_report_are_refused_but_one_text_never_is(model, monkeypatch):
    # the every-layer maps' weights, 6 layers × 12 heads × N²: "the cat" 4 tokens, "a dog barked" 5, "hi" 3
    assert [6 * 12 * count**2 for count in (4, 5, 3)] == [1152, 1800, 648]
    monkeypatch.setattr(attnviz.api.report, "MAX_REPORT_WEIGHTS", 3000)
    with pytest.raises(AttnvizError) as refused:
        attnviz.report(["the cat", "a dog barked", "hi"], model=model)
    assert str(refused.value) == (
        "these 3 texts are more than one report holds: their maps of every layer have 3,600 attention weights, "
        "and a report holds 3,000 (the first 2 texts fit); give fewer or shorter texts"
    )
    assert len(attnviz.report(["the cat", "a dog barked"], model=model).record["texts"]) == 2
    monkeypatch.setattr(attnviz.api.report, "MAX_REPORT_WEIGHTS", 100)
    assert attnviz.report("a dog barked", model=model).record["texts"][0]["layers"]["shape"] == [6, 12, 5, 5]
    assert len(attnviz.report(["the cat", "hi"], model=model, kv="a dog").record["texts"]) == 2  # no layers: no weights


def test_the_page_carries_the_record_and_the_notebook_shows_it_in_a_sandboxed_srcdoc_iframe(report):
    assert page_record(report.html) == json.loads(json.dumps(report.record))
    shown = report._repr_html_()
    match = re.fullmatch(
        r'<iframe srcdoc=\'([^\']*)\' sandbox="allow-scripts" style="width:100%;height:720px;border:0"></iframe>', shown
    )
    assert match and html.unescape(match.group(1)) == report.html
    assert "<" not in match.group(1)  # the page is an attribute's text, not markup of the notebook


def test_save_writes_report_html_whole_or_not_at_all(report, tmp_path, monkeypatch):
    (written,) = report.save(tmp_path / "new")
    assert written == tmp_path / "new" / "report.html" and written.read_text(encoding="utf-8") == report.html

    broken = attnviz.ReportResult({**report.record, "texts": [object()]})  # the page cannot be made of it
    with pytest.raises(TypeError):
        broken.save(tmp_path / "broken")
    assert not (tmp_path / "broken").exists()
    with pytest.raises(TypeError):
        broken.save(tmp_path / "new")
    assert written.read_text(encoding="utf-8") == report.html  # the earlier report is untouched


def test_results_report_from_the_numbers_they_hold(model):
    heads = attnviz.heads(TEXT, model=model, layer=1)
    (text,) = heads.report().record["texts"]
    np.testing.assert_allclose(decoded(text["attention"]), heads.attention.numpy(), atol=ROUNDING, rtol=0)
    assert text["layer"] == 1 and text["layers"] is None and text["trace"] is None
    assert heads.report().record["num_layers"] == 6

    layers = attnviz.layers(TEXT, model=model)
    (text,) = layers.report().record["texts"]
    np.testing.assert_allclose(decoded(text["layers"]), layers.attention.numpy(), atol=ROUNDING, rtol=0)
    np.testing.assert_allclose(decoded(text["rollout"]), layers.rollout, atol=ROUNDING, rtol=0)
    assert_records_match(text["statistics"]["heads"], attnviz.report(TEXT, model=model).record["texts"][0]["statistics"]["heads"])  # two runs

    traced = attnviz.trace(TEXT, model=model, mistake="view-without-permute")
    (text,) = traced.report().record["texts"]
    assert text["trace"] is None and text["mistakes"] == [traced.to_dict()]

    averaged = attnviz.stats([TEXT, "a dog"], model=model).report()
    assert averaged.record["texts"][0]["statistics"] is None
    assert any("averaged over them" in note for note in averaged.record["notes"])


def test_import_attnviz_still_imports_no_torch_and_exposes_report():
    code = "import sys, attnviz\nattnviz.report, attnviz.ReportResult\nprint('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_the_notebook_s_iframe_runs_the_page_offline_in_a_browser(report, tmp_path, browser):
    """What Jupyter and VS Code do with _repr_html_: the srcdoc page's scripts run, sandboxed, with no request.

    browser: the session's one Chromium (conftest.py; skipped locally without it, failed under CI)."""
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!doctype html><meta charset='utf-8'><body>{report._repr_html_()}</body>", encoding="utf-8")
    requests, problems = [], []
    page = browser.new_page()
    try:
        page.on("request", lambda request: requests.append(request.url))
        page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(notebook.as_uri())
        (frame,) = [frame for frame in page.frames if frame != page.main_frame]
        frame.wait_for_selector('body[data-ready="true"]', timeout=15_000)
        lines = frame.locator("svg#head-lines line").count()
    finally:
        page.close()
    assert requests == [notebook.as_uri()] and problems == []
    assert lines == 12 * 9 * 9  # every head's line from each query to each key of the 9-token text

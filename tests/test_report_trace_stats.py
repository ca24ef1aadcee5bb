"""The report's header, trace view and statistics view in Debian's Chromium.

What they must show is read here from the record (trace.json's objects, stats.json's rows, the
rollout decoded in Python), never from the page's own code. Pages open from a file with every
request blocked; none may be attempted and no console or page error may occur (Page.close).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import HOSTILE, decoded

from attnviz.render.trace_tables import difference_text  # the terminal's words for a difference: "0" for an exact 0

ENGLISH = "The cat sat on the mat, because it was tired."


def _spec(loaded, **changes):
    from attnviz.spec import RunSpec

    spec = RunSpec(
        model="bundled", resolved_model=loaded.name, model_source=loaded.source, layer=0,
        num_heads=loaded.num_heads, weights="pretrained", seed=0, causal=False, kv_text=None, device="cpu",
        truncate=False,
    )  # fmt: skip
    return replace(spec, **changes)


def _full_report(loaded, text, traced=True, **changes):
    """A text with what `attnviz report` shows: every layer, rollout, statistics, every layout, both mistakes
    (traced=False: no trace, for a test that reads the statistics alone)."""
    from attnviz.analysis.rollout import attention_rollout
    from attnviz.analysis.statistics import StatisticsAccumulator
    from attnviz.html import ReportText, report_page, report_record
    from attnviz.html.encoding import encode_layers
    from attnviz.pipeline import run_attention, run_layers
    from attnviz.tracing import LAYOUTS, trace_texts

    spec = _spec(loaded, **changes)
    (run,) = run_attention(loaded, [text], spec)
    layer_runs = rollout = statistics = None
    if spec.kv_text is None:
        (layer_runs,) = run_layers(loaded, [text], replace(spec, layer=None))
        rollout = attention_rollout([layer_run.attention for layer_run in layer_runs])
        accumulator = StatisticsAccumulator(len(layer_runs), causal=spec.causal)
        for index, layer_run in enumerate(layer_runs):
            accumulator.add(index, layer_run.attention, layer_run.query_tokens)
        statistics = accumulator.result()
    trace, mistakes = None, []
    if traced:
        trace = trace_texts(loaded, [text], spec, layouts=LAYOUTS)
        mistakes = [trace_texts(loaded, [text], spec, mistake=name) for name in ("view-without-permute", "merge-without-permute")]
    layers = None if layer_runs is None else encode_layers([layer_run.attention for layer_run in layer_runs])
    shown = ReportText(run, layers, rollout, statistics, trace, mistakes)
    return report_page(report_record([shown], spec, kind="encoder", num_layers=loaded.num_layers, notes=run.notes))


def _plain_report(loaded, text, **changes):
    """The run's layer alone (no trace, no statistics): for the header's facts."""
    from attnviz.html import ReportText, report_page, report_record
    from attnviz.pipeline import run_attention

    spec = _spec(loaded, **changes)
    (run,) = run_attention(loaded, [text], spec)
    return report_page(report_record([ReportText(run)], spec, kind="encoder", num_layers=loaded.num_layers, notes=run.notes))


@pytest.fixture(scope="module")
def pages(bundled_bert, tmp_path_factory):
    folder = tmp_path_factory.mktemp("report-trace-stats")
    builds = {
        "zh": lambda: _full_report(bundled_bert, "我想吃酸菜鱼"),
        "en": lambda: _full_report(bundled_bert, ENGLISH, traced=False, layer=2, causal=True),
        "kv": lambda: _full_report(bundled_bert, "我爱中国", kv_text=ENGLISH),
        "random": lambda: _plain_report(bundled_bert, " ".join(["word"] * 600), weights="random", seed=7, layer=1, truncate=True),
        "hostile": lambda: _plain_report(bundled_bert, HOSTILE),
    }
    paths = {}
    for name, build in builds.items():
        paths[name] = folder / f"{name}.html"
        paths[name].write_text(build(), encoding="utf-8")
    return paths


def _boxes(page, selector):
    return page.page.evaluate(
        f"Array.from(document.querySelectorAll('{selector}')).map(b => [b.dataset.role, b.dataset.shape, b.dataset.axes])"
    )


def _joined(values):
    return ",".join(map(str, values))


def test_the_trace_view_shows_every_layouts_steps_with_trace_jsons_shapes(pages, opened):
    page = opened(pages["zh"])
    text = page.record()["texts"][0]
    page.page.click("button[data-view=trace]")
    choices = [(layout, None) for layout in text["trace"]["layouts"]]
    for run in text["mistakes"]:
        right, wrong = run["layouts"]
        assert right["mistake"] is None and wrong["mistake"] == run["mistake"]["mistake"]
        choices.append((wrong, right))
    names = page.page.evaluate("Array.from(document.querySelectorAll('#trace-layout option')).map(o => o.textContent)")
    assert names == [layout["layout"] + (f" with mistake {layout['mistake']}" if layout["mistake"] else "") for layout, _ in choices]
    assert names[:4] == ["view-permute", "merged-batch", "fused-qkv", "single-head"]
    for option, (layout, right) in enumerate(choices):
        page.page.select_option("#trace-layout", str(option))
        steps = layout["steps"]
        listed = page.page.evaluate(
            "Array.from(document.querySelectorAll('#trace-steps > li')).map(li => [+li.dataset.index, li.dataset.role, li.dataset.outputShape, li.classList.contains('mistake')])"
        )
        assert listed == [[s["index"], s["role"], _joined(s["output_shape"]), s["mistake"]] for s in steps]
        page.page.click("#trace-steps > li[data-index='0'] button")
        page.page.focus("#trace-current")
        for step in steps:
            assert page.page.get_attribute("#trace-steps > li[aria-current=step]", "data-index") == str(step["index"])
            card = "#trace-current > .trace-step:first-child"
            assert _boxes(page, f"{card} svg.trace-output") == [[step["role"], _joined(step["output_shape"]), _joined(step["output_axes"])]]
            assert _boxes(page, f"{card} svg.trace-input") == [
                [role, _joined(shape), _joined(axes)] for role, shape, axes in zip(step["inputs"], step["input_shapes"], step["input_axes"])
            ]
            facts = page.page.evaluate(f"Object.fromEntries(Array.from(document.querySelectorAll('{card} dd')).map(d => [d.dataset.fact, d.textContent]))")
            assert facts["operation"] == step["operation"] and facts["pattern"] == (step["pattern"] or "—")
            assert facts["stride"] == "(" + ", ".join(map(str, step["stride"])) + ("," if len(step["stride"]) == 1 else "") + ")"
            assert facts["contiguous"] == ("yes" if step["contiguous"] else "no")
            assert facts["memory"] == (step["memory"] or "input")
            assert facts["in-tutorial"] == ("yes" if step["in_tutorial"] else f"no (+): {step['note']}")
            heading = page.page.text_content(f"{card} h3")
            assert heading.startswith(f"Step {step['index']}: ") and heading.endswith(step["role"])  # numbered from 0, as trace.json
            assert ("+ " in heading) == (not step["in_tutorial"]) and ("✗" in heading) == step["mistake"]
            if step["mistake"]:
                expected = next(s for s in right["steps"] if s["role"] == step["role"])
                assert _boxes(page, "#trace-current .trace-right-step svg.trace-output") == [
                    [expected["role"], _joined(expected["output_shape"]), _joined(expected["output_axes"])]
                ]
                assert page.page.text_content("#trace-current .trace-right-step dd[data-fact=operation]") == expected["operation"]
            else:
                assert page.page.query_selector("#trace-current .trace-right-step") is None
            page.page.keyboard.press("ArrowRight")
        page.page.keyboard.press("ArrowLeft")
        assert page.page.get_attribute("#trace-steps > li[aria-current=step]", "data-index") == str(len(steps) - 2)
        assert page.page.evaluate("[document.querySelector('#trace-prev').disabled, document.querySelector('#trace-next').disabled]") == [False, False]


def test_the_trace_views_tables_hold_trace_jsons_checks_and_head_slices(pages, opened):
    page = opened(pages["zh"])
    trace = page.record()["texts"][0]["trace"]
    page.page.click("button[data-view=trace]")
    checks = page.page.evaluate("Array.from(document.querySelectorAll('#trace-checks tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))")
    expected = [
        [
            "attnviz's layer (attention/layer.py)" if check["layout"] == "MultiHeadAttention" else check["layout"],
            check["reference"], difference_text(check["weights_max_abs_diff"]), difference_text(check["output_max_abs_diff"]),
            "yes" if check["agree"] else "no",
        ]
        for check in trace["checks"]
    ]  # fmt: skip
    assert checks == expected and len(checks) == 5
    slices = page.page.evaluate("Array.from(document.querySelectorAll('#trace-head-slices tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))")
    assert slices == [
        [str(h["head"]), f"{h['columns'][0]}–{h['columns'][1]}", difference_text(h["scores_max_abs_diff"]), f"{h['scores_max_abs']:.3g}",
         difference_text(h["z_max_abs_diff"]), "yes"]
        for h in trace["head_slices"]
    ]
    assert "B = 1 batch, N = 8 tokens, H = 12 heads, d = 32 head size (D / H), D = 384 model size" in page.page.text_content("#trace-legend")
    assert page.page.evaluate("document.querySelector('#trace-prev').disabled") is True
    page.page.click("#trace-next")
    page.page.click("#trace-next")
    page.page.click("#trace-prev")
    assert page.page.get_attribute("#trace-steps > li[aria-current=step]", "data-index") == "1"
    assert page.page.text_content("#trace-counter") == f"step 1 of 0–{len(trace['layouts'][0]['steps']) - 1}"


def test_the_statistics_table_holds_every_heads_numbers_and_sorts(pages, opened):
    page = opened(pages["en"])
    statistics = page.record()["texts"][0]["statistics"]
    page.page.click("button[data-view=stats]")
    columns = ["layer", "head", "label", *statistics["statistics"]]
    assert page.page.evaluate("Array.from(document.querySelectorAll('#stats-table thead th')).map(th => th.dataset.key)") == columns

    def shown():
        return page.page.evaluate("Array.from(document.querySelectorAll('#stats-table tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))")

    def row_text(row):
        return [str(row["layer"]), str(row["head"]), row["label"] or "·", *(f"{row[name]:.3f}" for name in statistics["statistics"])]

    assert shown() == [row_text(row) for row in statistics["heads"]] and len(statistics["heads"]) == 72
    assert any(row["label"] for row in statistics["heads"])
    page.page.click("#stats-table th[data-key=entropy] button")
    assert page.page.get_attribute("#stats-table th[data-key=entropy]", "aria-sort") == "descending"
    assert page.page.get_attribute("#stats-table th[data-key=layer]", "aria-sort") == "none"
    by_entropy = sorted(statistics["heads"], key=lambda row: -row["entropy"])
    assert [cells[:2] for cells in shown()] == [[str(row["layer"]), str(row["head"])] for row in by_entropy]
    page.page.click("#stats-table th[data-key=entropy] button")
    assert page.page.get_attribute("#stats-table th[data-key=entropy]", "aria-sort") == "ascending"
    assert [cells[:2] for cells in shown()] == [[str(row["layer"]), str(row["head"])] for row in by_entropy[::-1]]
    page.page.focus("#stats-table th[data-key=previous] button")
    page.page.keyboard.press("Enter")
    first = max(statistics["heads"], key=lambda row: row["previous"])
    assert page.page.evaluate("[+document.querySelector('#stats-table tbody tr').dataset.layer, +document.querySelector('#stats-table tbody tr').dataset.head]") == [first["layer"], first["head"]]


def test_the_rollout_map_reads_out_the_records_rollout(pages, opened):
    page = opened(pages["en"])
    text = page.record()["texts"][0]
    rollout = decoded(text["rollout"])
    tokens = text["shown_query_tokens"]  # the page shows the tokens as models/shown.py writes them
    page.page.click("button[data-view=stats]")
    page.page.wait_for_selector("#rollout-canvas", state="attached")
    page.page.locator("#rollout-canvas").scroll_into_view_if_needed()
    box = page.page.query_selector("#rollout-canvas").bounding_box()
    n = len(tokens)
    page.page.mouse.move(box["x"] + box["width"] * 1.5 / n, box["y"] + box["height"] * 4.5 / n)
    assert page.page.text_content("#rollout-readout") == f"token 4:{tokens[4]} · input token 1:{tokens[1]} · {rollout[4, 1]:.4f}"
    page.page.mouse.move(box["x"] + box["width"] * 4.5 / n, box["y"] + box["height"] * 1.5 / n)
    assert page.page.text_content("#rollout-readout") == f"token 1:{tokens[1]} · input token 4:{tokens[4]} · masked by the causal mask"
    labels = page.page.evaluate("Array.from(document.querySelectorAll('#view-stats .query-labels span')).map(s => s.textContent)")
    assert labels == tokens


def test_cross_attention_says_why_it_has_no_statistics_and_its_header_names_the_keys_text(pages, opened):
    page = opened(pages["kv"])
    page.page.click("button[data-view=stats]")
    assert "cross-attention" in page.page.text_content("#stats-missing")
    assert page.page.query_selector("#stats-table") is None and page.page.query_selector("#rollout-canvas") is None
    header = page.page.text_content("#report-header")
    assert "cross-attention" in header and ENGLISH in header and "我爱中国" in header
    page.page.click("button[data-view=trace]")
    names = page.page.evaluate("Array.from(document.querySelectorAll('#trace-layout option')).map(o => o.textContent)")
    assert "fused-qkv" not in names and "view-permute with mistake view-without-permute" in names
    assert "fused-qkv left out" in page.page.text_content("#view-trace")


def test_the_header_names_the_model_layer_parameters_heads_truncation_and_device(pages, opened):
    page = opened(pages["random"])
    text = page.record()["texts"][0]
    assert text["truncated"] == {"from": 602, "to": 512}
    facts = page.page.evaluate("Object.fromEntries(Array.from(document.querySelectorAll('#report-facts > div')).map(d => [d.dataset.fact, d.querySelector('dd').textContent]))")
    assert facts["model"] == "all-MiniLM-L6-v2 (BERT, encoder)"
    assert facts["layer"] == "1 of 6" and facts["parameters"] == "random (seed 7)" and facts["heads"] == "12 × d = 32"
    assert facts["truncation"] == "cut from 602 to 512 tokens" and facts["device"] == "cpu"
    assert facts["attention"].startswith("self-attention, not causal")
    assert page.page.text_content("#report-header h1") == text["title"][0]
    assert page.page.text_content("#report-header .weights-rounding") == page.record()["weights_rounding"]
    page_zh = opened(pages["zh"])
    assert page_zh.page.text_content("#report-header .report-text") == "我想吃酸菜鱼"
    assert page_zh.page.evaluate("Array.from(document.querySelectorAll('#report-header .report-notes li')).map(li => li.textContent)") == page_zh.record()["notes"]
    causal = opened(pages["en"])
    assert causal.page.evaluate("document.querySelector('#report-facts [data-fact=attention] dd').textContent").startswith("causal")


def test_the_headers_text_is_characters_never_markup(pages, opened):
    page = opened(pages["hostile"])
    dialogs = []
    page.page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    assert page.page.text_content("#report-header .report-text") == HOSTILE
    assert page.page.evaluate("[document.images.length, document.querySelectorAll('script').length, document.title.startsWith('attnviz')]") == [0, 2, True]
    page.page.click("button[data-view=trace]")
    page.page.click("button[data-view=stats]")
    assert dialogs == []

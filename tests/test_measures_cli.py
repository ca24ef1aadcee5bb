"""`attnviz heads --measure`: attention.json's measures against computations written out in the tests
(the per-head vectors from the layer's nn.Linear weights, the layer rerun with a value zeroed,
networkx's maximum flow), the figures named by their papers, and what --measure refuses before any pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import bert_inputs, distances_by_reruns, flows_by_networkx, per_head_vectors

import attnviz
from attnviz.cli import run

TEXT = "The unaffable cat sat, quietly."
LAYER = 2
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("measures") / "run"
    options = ["--model", "bundled", "--device", "cpu", "--no-html", "--layer", str(LAYER), "--out", str(folder)]
    assert run(["heads", TEXT, "--measure", "all", *options]) == 0
    return folder, json.loads((folder / "attention.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_the_json_names_each_measure_with_its_paper_and_definition(measured_run):
    _, record = measured_run
    measures = record["measures"]
    assert list(measures) == ["norm", "value-zeroing", "flow"]
    assert "Kobayashi et al. 2020" in measures["norm"]["paper"]
    assert "Mohebbi et al. 2023" in measures["value-zeroing"]["paper"]
    assert "Abnar & Zuidema 2020" in measures["flow"]["paper"]
    assert all(measure["name"] == name and measure["definition"] for name, measure in measures.items())


@pytest.mark.slow
def test_the_norms_equal_the_per_head_vectors_written_out_from_the_weights(bundled_bert, measured_run):
    _, record = measured_run
    x = bert_inputs(bundled_bert, TEXT)[LAYER]
    vectors = per_head_vectors(bundled_bert.model.encoder.layer[LAYER], x, bundled_bert.num_heads)  # (H, N, N, D)
    np.testing.assert_allclose(record["measures"]["norm"]["heads"], vectors.norm(dim=-1).numpy(), atol=TOLERANCE)
    np.testing.assert_allclose(record["measures"]["norm"]["summed"], vectors.sum(dim=0).norm(dim=-1).numpy(), atol=TOLERANCE)


def test_value_zeroing_equals_rerunning_the_layer_with_each_value_zeroed(bundled_bert, measured_run):
    from attnviz.attention.layer import layer_from_weights

    _, record = measured_run
    attention = layer_from_weights(bundled_bert.model.encoder.layer[LAYER].attention_weights()).eval()
    x = bert_inputs(bundled_bert, TEXT)[LAYER].float()[None]
    expected = distances_by_reruns(attention, x, x)
    measure = record["measures"]["value-zeroing"]
    np.testing.assert_allclose(measure["distances"], expected, atol=TOLERANCE)
    np.testing.assert_allclose(measure["rows"], expected / expected.sum(axis=1, keepdims=True), atol=TOLERANCE)


def test_flow_equals_networkx_through_the_layers_up_to_the_runs(measured_run):
    _, record = measured_run
    layers = attnviz.layers(TEXT, model="bundled", device="cpu").layer_runs[: LAYER + 1]
    expected = flows_by_networkx([layer_run.attention for layer_run in layers])
    flow = record["measures"]["flow"]
    assert flow["layers"] == [0, LAYER]
    np.testing.assert_allclose(flow["flow"], expected, atol=TOLERANCE)
    np.testing.assert_allclose(flow["normalised"], expected / expected.sum(axis=1, keepdims=True), atol=TOLERANCE)


def test_every_measure_has_its_figure(measured_run):
    from PIL import Image

    folder, _ = measured_run
    for name in ("norm_heads", "norm", "value_zeroing", "flow", "measures"):
        image = np.asarray(Image.open(folder / f"{name}.png").convert("L"))
        assert image.std() > 10, name  # drawn, not blank


def test_the_figures_name_each_measure_by_its_paper():
    from attnviz.render.measure_figures import measure_panels

    result = attnviz.heads(TEXT, model="bundled", device="cpu", measure="all")
    titles = {name: panel.title for name, panel in measure_panels(result.run, result.measures).items()}
    assert "Kobayashi et al. 2020" in titles["norm"]
    assert "Mohebbi et al. 2023" in titles["value_zeroing"]
    assert "Abnar & Zuidema 2020" in titles["flow"] and "layer 0" in titles["flow"]
    np.testing.assert_allclose(result.measures.norm, result.to_dict()["measures"]["norm"]["summed"], atol=1e-7)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["heads", " ".join(["word"] * 100), "--measure", "flow"], "flow handles texts of up to 88 tokens"),
        (["heads", TEXT, "--measure", "flow", "--kv", "another text"], "flow follows self-attention"),
        (["heads", "--file", "-", "--measure", "norm"], "--measure measures one text"),
        (["heads", TEXT, "--measure", "entropy"], "entropy"),
    ],
)
def test_what_measure_refuses_is_one_line_and_exit_2_with_nothing_written(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert run([*args, "--model", "bundled", "--device", "cpu", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in " ".join(error.split()) and "Traceback" not in error
    assert not out.exists()


# ---- layers --measure: every layer's, flow through all of them beside the rollout ----


@pytest.fixture(scope="module")
def layers_measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("layers-measures") / "run"
    assert run(["layers", TEXT, "--measure", "all", "--model", "bundled", "--device", "cpu", "--out", str(folder)]) == 0
    return folder, json.loads((folder / "measures.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_layers_measures_json_holds_every_layers_norm_and_value_zeroing(bundled_bert, layers_measured):
    from attnviz.attention.layer import layer_from_weights

    _, record = layers_measured
    assert record["format"] == "attnviz-measures" and record["num_layers"] == 6
    norms, zeroing = record["measures"]["norm"]["summed"], record["measures"]["value-zeroing"]["distances"]
    assert len(norms) == len(zeroing) == 6
    for layer in (1, 5):
        x = bert_inputs(bundled_bert, TEXT)[layer]
        bert_layer = bundled_bert.model.encoder.layer[layer]
        vectors = per_head_vectors(bert_layer, x, bundled_bert.num_heads)
        np.testing.assert_allclose(norms[layer], vectors.sum(dim=0).norm(dim=-1).numpy(), atol=TOLERANCE)
        attention = layer_from_weights(bert_layer.attention_weights()).eval()
        np.testing.assert_allclose(zeroing[layer], distances_by_reruns(attention, x.float()[None], x.float()[None]), atol=TOLERANCE)


@pytest.mark.slow
def test_layers_flow_goes_through_every_layer_beside_the_rollout(layers_measured):
    folder, record = layers_measured
    layer_runs = attnviz.layers(TEXT, model="bundled", device="cpu").layer_runs
    expected = flows_by_networkx([layer_run.attention for layer_run in layer_runs])
    np.testing.assert_allclose(record["measures"]["flow"]["flow"], expected, atol=TOLERANCE)
    for name in ("flow", "norm_layers", "value_zeroing_layers", "rollout", "layers"):
        assert (folder / f"{name}.png").is_file()


def test_a_notebook_shows_the_measures_beside_the_heads():
    with_measures = attnviz.heads(TEXT, model="bundled", device="cpu", measure="norm")
    html = with_measures._repr_html_()
    assert html.count("<img") == 2 and "what the weights leave out" in html
    titles = [ax.get_title() for ax in with_measures.measures_figure().axes if ax.get_title()]
    assert titles[:2] == ["weights α, heads averaged", "norm (Kobayashi et al. 2020)"]
    with pytest.raises(attnviz.AttnvizError, match="no measures"):
        attnviz.heads(TEXT, model="bundled", device="cpu").measures_figure()


@pytest.mark.parametrize("command", ["heads", "layers"])
def test_help_names_each_measures_paper_and_flows_limit(command, capsys):
    from attnviz.analysis.flow import FLOW_MAX_TOKENS

    assert run([command, "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for paper in ("Kobayashi et al. 2020", "Mohebbi et al. 2023", "Abnar & Zuidema 2020"):
        assert paper in shown
    assert f"texts of up to {FLOW_MAX_TOKENS} tokens" in shown


def test_measure_all_over_words_keeps_the_papers_and_the_words(tmp_path):
    result = attnviz.heads("我想吃酸菜鱼", model="bundled", device="cpu", measure="all", words=True)
    assert result.run.words.query_plain_words == ["[CLS]", "我", "想", "吃", "酸菜鱼", "[SEP]"]
    assert result.measures.norm_heads.shape == (12, 6, 6)
    for square in (result.measures.norm, result.measures.value_zeroing_rows, result.measures.flow.normalised):
        assert square.shape == (6, 6)
    np.testing.assert_allclose(result.measures.flow.normalised.sum(axis=1), 1.0, atol=1e-9)
    assert result.attention.shape == (12, 6, 6)


def test_a_measure_figures_title_is_wrapped_to_the_figures_width():
    from attnviz.render.measure_figures import maps_figure, measure_panels
    from attnviz.render.titles import chars_across

    result = attnviz.heads(TEXT, model="bundled", device="cpu", measure="value-zeroing")
    panel = measure_panels(result.run, result.measures)["value_zeroing"]
    figure = maps_figure(result.run, [panel._replace(title="")], f"{panel.title}: {panel.about}")
    lines = figure.get_suptitle().split("\n")
    assert len(lines) >= 3 and "Mohebbi et al. 2023" in lines[0]
    assert max(len(line) for line in lines) <= chars_across(figure.get_figwidth())


@pytest.mark.slow
def test_the_measure_figures_of_a_512_token_text_stay_within_the_size_cap(tmp_path):
    from PIL import Image

    from attnviz.render.measure_figures import write_measure_figures
    from attnviz.render.scales import MAX_IMAGE_SIDE_PX

    text = " ".join(["the cat sat on the mat and"] * 80)  # 560 words, cut to the model's 512 positions
    result = attnviz.heads(text, model="bundled", device="cpu", measure="norm", truncate=True)
    assert len(result.tokens) == 512
    for path in write_measure_figures(result.run, result.measures, tmp_path):
        width, height = Image.open(path).size
        assert max(width, height) <= MAX_IMAGE_SIDE_PX, path.name

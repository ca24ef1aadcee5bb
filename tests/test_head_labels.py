"""Heads named as what they are: heads that --heads re-split from a model's own projections say so
(titles, setup lines, heads table, attention.json), and grouped-query heads show the key/value head
they share (heads.png's panel titles and frames).

The expectations come from the model's own numbers (config.json's heads and key/value heads, the
bundled BERT's 12), never from attnviz's run.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from tiny_families import build_checkpoint

from attnviz.output.export import attention_record
from attnviz.pipeline import run_attention
from attnviz.render.heatmap import head_figure, heads_grid_figure
from attnviz.render.terminal import heads_table, print_setup
from attnviz.analysis.statistics import summarize_heads

TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """transformers' tiny Llama (tests/tiny_families.py) loaded by attnviz, and its config.json."""
    from attnviz.models.loading import load_model

    folder = tmp_path_factory.mktemp("llama") / "llama"
    build_checkpoint("llama", folder)
    config = json.loads((folder / "config.json").read_text())
    return load_model(str(folder)), config


def spec_of(loaded, **settings):
    from attnviz.spec import run_spec

    return run_spec(loaded, loaded.name, **{"layer": 0, "num_heads": None, "weights": "pretrained", "seed": 0, **settings})


def setup_lines(run) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    print_setup(console, run, "bundled", "cpu")
    return console.file.getvalue()


# ---- re-split heads -------------------------------------------------------------------------------


def test_bert_heads_re_split_say_so_in_titles_setup_table_and_json(bundled_bert):
    from attnviz.models.loading import bundled_model_path

    trained = json.loads((bundled_model_path() / "config.json").read_text())["num_attention_heads"]  # 12
    spec = spec_of(bundled_bert, num_heads=3)
    (run,) = run_attention(bundled_bert, [TEXT], spec)

    head_title = head_figure(run, 0).axes[0].get_title()
    assert "head 0 of 3" in head_title and "3 heads re-split from the trained 12" in head_title
    grid_title = heads_grid_figure(run).get_suptitle()
    assert "3 heads re-split from the trained 12" in grid_title

    setup = setup_lines(run)
    size = bundled_bert.hidden_size
    assert f"3 × d={size // 3}, re-split from the trained {trained} × d={size // trained}" in setup
    assert "split into 3 heads in place of its 12" in setup

    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(heads_table(run, summarize_heads(run.attention, run.causal)))
    assert "heads (3 heads re-split from the trained 12)" in console.file.getvalue()

    record = attention_record(run, spec)
    assert (record["num_heads"], record["model_heads"], record["re_split"]) == (3, trained, True)


def test_the_models_own_heads_and_random_parameters_are_not_called_re_split(bundled_bert):
    (own,) = run_attention(bundled_bert, [TEXT], spec_of(bundled_bert))
    (random,) = run_attention(bundled_bert, [TEXT], spec_of(bundled_bert, num_heads=3, weights="random"))
    for run in (own, random):
        assert "re-split" not in heads_grid_figure(run).get_suptitle()
        assert "re-split" not in setup_lines(run)
        assert attention_record(run, spec_of(bundled_bert))["re_split"] is False
    assert head_figure(own, 4).axes[0].get_title().split("\n")[0].endswith("head 4")


def test_grouped_query_heads_re_split_name_the_trained_key_value_heads(tiny_llama):
    loaded, config = tiny_llama
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]  # 6 sharing 2: groups of 3
    group = heads // kv_heads
    spec = spec_of(loaded, num_heads=group)  # one group: the whole of W_k, W_v as one key/value head
    (run,) = run_attention(loaded, [TEXT], spec)
    setup = setup_lines(run)
    assert f"re-split from the trained {heads}" in setup
    assert f"1 key/value head (grouped-query; trained: {kv_heads})" in setup
    assert f"{kv_heads} key/value heads (grouped-query)" not in setup
    record = attention_record(run, spec)
    assert (record["num_kv_heads"], record["model_heads"], record["re_split"]) == (1, heads, True)


# ---- key/value groups in heads.png ------------------------------------------------------------------


def test_heads_png_panels_name_and_frame_each_heads_key_value_head(tiny_llama):
    loaded, config = tiny_llama
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    group = heads // kv_heads
    (run,) = run_attention(loaded, [TEXT], spec_of(loaded))
    figure = heads_grid_figure(run)
    panels = [ax for ax in figure.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in panels] == [f"head {h} · kv {h // group}" for h in range(heads)]

    frames = [ax.spines["top"].get_edgecolor() for ax in panels]
    for h in range(heads):
        same_group = [frames[other] == frames[h] for other in range(heads)]
        assert same_group == [other // group == h // group for other in range(heads)]
    # each row of the grid holds whole groups
    rows = {}
    for h, ax in enumerate(panels):
        rows.setdefault(round(ax.get_position().y0, 3), []).append(h // group)
    assert all(len(row) % group == 0 for row in rows.values())

    assert "kv head 1" in head_figure(run, group).axes[0].get_title()  # the first head of the second group


def test_heads_without_shared_key_value_heads_have_plain_panels(bundled_bert):
    (run,) = run_attention(bundled_bert, [TEXT], spec_of(bundled_bert))
    titles = [ax.get_title() for ax in heads_grid_figure(run).axes if ax.get_visible() and ax.get_title()]
    assert titles == [f"head {h}" for h in range(12)]


def test_attention_json_names_each_heads_key_value_head(tiny_llama):
    loaded, config = tiny_llama
    group = config["num_attention_heads"] // config["num_key_value_heads"]
    spec = spec_of(loaded)
    (run,) = run_attention(loaded, [TEXT], spec)
    record = attention_record(run, spec)
    assert record["num_kv_heads"] == config["num_key_value_heads"]
    assert record["kv_head_of_head"] == [h // group for h in range(config["num_attention_heads"])]
    assert record["quantisation"] is None and record["re_split"] is False

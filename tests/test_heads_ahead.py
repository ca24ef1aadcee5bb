"""Figures laid out before the run (render/heads_ahead.py): the foreseen run is the real one but for its numbers,
and figures drawn on what was prepared equal those drawn from scratch, pixel for pixel."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from attnviz.render import heads_ahead, heatmap, laid_out
from attnviz.spec import RunSpec
from helpers import make_run, read_png
from helpers import linux_with_two_cores, run_script

pytestmark = pytest.mark.slow  # figures drawn twice over, and in fresh processes


def options(model: str | None = "bundled", **settings) -> RunSpec:
    """The command line's settings before loading, as attnviz heads gives them to prepare()."""
    return RunSpec(model=model, resolved_model=model or "", model_source="", **settings)


TEXTS = [
    "the quick brown fox jumps over the lazy dog again",
    "Café déjà-vu: naïve coöperation, 3.14 % of $5!",
    "我想吃酸菜鱼 and ❤️ emoji",  # characters outside the English vocabulary: [UNK]s
]


@pytest.fixture(scope="module")
def bundled():
    from attnviz.api.models import load

    return load("bundled", "cpu")


@pytest.mark.parametrize("text", TEXTS)
def test_the_foreseen_run_is_the_real_one_but_for_its_numbers(bundled, text):
    """Tokens from the tokenizer alone (no torch, no model) equal the run's; so does everything its figures show."""
    from attnviz.api import functions

    real = functions.heads(text, model=bundled, layer=2).run
    foreseen = heads_ahead.foreseen_run(text, options(layer=2))
    assert foreseen.query_tokens == real.query_tokens and foreseen.key_tokens == real.key_tokens
    assert laid_out.figure_key(foreseen) == laid_out.figure_key(real)


def test_a_local_folder_is_foreseen_under_the_name_given(bundled, tmp_path):
    from attnviz.api import functions
    from attnviz.models.loading import bundled_model_path

    folder = tmp_path / "model"
    shutil.copytree(bundled_model_path(), folder)
    real = functions.heads(TEXTS[0], model=str(folder), causal=True).run
    foreseen = heads_ahead.foreseen_run(TEXTS[0], options(str(folder), causal=True))
    assert laid_out.figure_key(foreseen) == laid_out.figure_key(real)


def test_other_settings_give_other_keys():
    run = make_run(["[CLS]", "a", "b", "[SEP]"], num_heads=2)
    for change in [dict(layer=1), dict(causal=True), dict(text="other"), dict(query_tokens=["[CLS]", "a", "c", "[SEP]"])]:
        assert laid_out.figure_key(dataclasses.replace(run, **change)) != laid_out.figure_key(run), change
    assert laid_out.figure_key(dataclasses.replace(run, notices=["a notice"], device="cuda")) == laid_out.figure_key(run)


def test_the_default_model_and_hub_ids_are_not_foreseen():
    assert heads_ahead.foreseen_run("a text", options(None)) is None
    assert heads_ahead.foreseen_run("a text", options("org/not-a-folder")) is None
    assert heads_ahead.foreseen_run("a text", options(kv_text="keys")) is None


@pytest.mark.parametrize("causal", [False, True])
def test_figures_drawn_on_prepared_layouts_equal_figures_drawn_from_scratch(tmp_path, causal):
    """prepare() on the foreseen run, then write_heatmaps on the real run (its numbers only now): the same files as without."""
    tokens = heads_ahead.foreseen_run(TEXTS[1], options(causal=causal)).query_tokens
    run = dataclasses.replace(make_run(tokens, num_heads=12, causal=causal), text=TEXTS[1], model="all-MiniLM-L6-v2")
    run = dataclasses.replace(run, num_kv_heads=12)
    heads_ahead.prepare(TEXTS[1], options(causal=causal))
    assert laid_out._laid_out  # foreseen: the figures were laid out
    (head_figure, grid), = laid_out._laid_out.values()
    assert head_figure.pixels is not None and head_figure.titles is not None and all(grid.pixels)  # the fast paths
    (tmp_path / "ahead").mkdir()
    (tmp_path / "scratch").mkdir()
    ahead = heatmap.write_heatmaps(run, tmp_path / "ahead", seed=0)
    assert not laid_out._laid_out  # taken: the real run was the foreseen one
    scratch = heatmap.write_head_heatmaps(run, tmp_path / "scratch", seed=0) + [heatmap.write_heads_grid(run, tmp_path / "scratch", seed=0)]
    assert [path.name for path in ahead] == [path.name for path in scratch] == [*(f"head_{h:02d}.png" for h in range(12)), "heads.png"]
    for drawn, expected in zip(ahead, scratch):
        np.testing.assert_array_equal(read_png(drawn), read_png(expected), err_msg=drawn.name)


def test_a_run_other_than_the_foreseen_one_is_drawn_from_scratch(tmp_path):
    heads_ahead.prepare(TEXTS[0], options())
    run = make_run(["[CLS]", "other", "tokens", "[SEP]"], num_heads=2)
    assert laid_out.take(run, "png", "", "", 0) is None
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    drawn = heatmap.write_heatmaps(run, tmp_path / "a")
    alone = heatmap.write_head_heatmaps(run, tmp_path / "b") + [heatmap.write_heads_grid(run, tmp_path / "b")]
    for one, other in zip(drawn, alone):
        np.testing.assert_array_equal(read_png(one), read_png(other))
    laid_out._laid_out.clear()


@linux_with_two_cores
def test_attnviz_heads_draws_the_same_files_with_its_figures_prepared_ahead(tmp_path):
    """The command, whose figure worker prepares the figures while torch loads: its PNGs equal those drawn here from its run."""
    from attnviz.api import functions

    script = f"""
import sys
from attnviz.cli import main
sys.argv = ["attnviz", "heads", {TEXTS[0]!r}, "--model", "bundled", "--device", "cpu", "--out", {str(tmp_path / "cli")!r}]
main()
"""
    run_script(script, env=None)
    run = functions.heads(TEXTS[0], model="bundled", device="cpu").run
    (tmp_path / "here").mkdir()
    here = heatmap.write_head_heatmaps(run, tmp_path / "here", seed=0) + [heatmap.write_heads_grid(run, tmp_path / "here", seed=0)]
    for path in here:
        np.testing.assert_array_equal(read_png(tmp_path / "cli" / path.name), read_png(path), err_msg=path.name)


def test_warming_up_draws_nothing_anywhere(tmp_path, monkeypatch):
    """warm_up (the worker's work ahead for layers, stats and runs not foreseen) only draws in memory: no file is written."""
    monkeypatch.chdir(tmp_path)
    heads_ahead.warm_up()
    assert list(tmp_path.iterdir()) == []

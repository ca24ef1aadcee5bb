"""position.png and compare.png laid out and rendered before their numbers exist, while the command loads torch.

position.png (render/position_figure.py), laid out with stand-in numbers then shown with the result's, equals the
figure laid out with the result's numbers from the start, pixel for pixel; where a number's text would take other
room, it is laid out again. compare.png (render/compare_figures.py) shows no number but its maps: laid out from
foreseen splits of zeros, it equals the figure of the real splits. Both PNGs, drawn on pixels rendered ahead, equal
the whole figure drawn; and the commands' figure workers do take the figures they laid out.
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from attnviz.analysis.compare import compare_splits
from attnviz.analysis.position import position_experiment
from attnviz.render import compare_figures, laid_out, position_figure
from attnviz.render.compare_figures import ComparisonLayout
from attnviz.render.position_figure import PositionFigure, PositionLayout, _Numbers
from helpers import read_png
from attnviz.spec import RunSpec, run_spec
from helpers import linux_with_two_cores, run_script

pytestmark = pytest.mark.slow  # figures drawn twice over, and in fresh processes

TEXT = "the quick brown fox jumps over the lazy dog again"
CASES = {
    "default": (TEXT, None, None),
    "a chosen head": (TEXT, None, 7),
    "cls and sep moved": ("The cat sat on the mat.", "1,0,2,3,4,5,6,8,7", None),
    "unknown characters": ("我想吃酸菜鱼 and ❤️ emoji", None, None),
    "100 tokens, thinned labels": (" ".join(["the animal did not cross the street"] * 14), None, None),
}


def pixels(figure) -> np.ndarray:
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba()).copy()  # (height, width, 4)


@pytest.fixture(scope="module")
def results(bundled_bert):
    return {case: position_experiment(bundled_bert, text, permutation, head) for case, (text, permutation, head) in CASES.items()}


@pytest.mark.parametrize("case", CASES)
def test_laid_out_with_stand_ins_it_equals_the_figure_laid_out_with_its_own_numbers(results, case):
    result = results[case]
    layout = PositionLayout.of(result)
    own = pixels(PositionFigure(layout, _Numbers.of(result)).show(result).figure)
    np.testing.assert_array_equal(pixels(PositionFigure(layout).show(result).figure), own)
    np.testing.assert_array_equal(pixels(position_figure.position_figure(result)), own)


@pytest.mark.parametrize("case", CASES)
def test_the_png_drawn_on_pixels_rendered_ahead_equals_the_whole_figure_drawn(results, case, tmp_path):
    result = results[case]
    ahead = PositionFigure(PositionLayout.of(result))
    ahead.render_ahead()
    written = ahead.show(result).write_png(tmp_path / "ahead.png")
    whole = PositionFigure(PositionLayout.of(result)).show(result).write_png(tmp_path / "whole.png")
    np.testing.assert_array_equal(read_png(written), read_png(whole))


def test_numbers_whose_text_takes_other_room_are_laid_out_again(results):
    """A difference scale of 0.0123 has wider tick labels than the stand-in's 0.99: the figure is laid out again, and
    equals the one laid out with those numbers from the start."""
    result = results["default"]
    side = result.with_positions
    small = dataclasses.replace(side, permuted_back=side.original + np.float32(0.0123))  # every difference 0.0123
    result = dataclasses.replace(result, with_positions=small)
    layout = PositionLayout.of(result)
    stand_in = PositionFigure(layout)
    room = stand_in._room
    stand_in._write(_Numbers.of(result))
    assert stand_in._room_taken() != room  # the case this test is for
    own = pixels(PositionFigure(layout, _Numbers.of(result)).show(result).figure)
    np.testing.assert_array_equal(pixels(PositionFigure(layout).show(result).figure), own)


def test_a_difference_of_exactly_one_takes_the_stand_ins_room(results):
    """Softmax saturates in float32, so the difference scale is often 1.0 exactly, where a tick would sit at the bar's
    top and reach above it: the difference colour bars have no tick in their top 5 %, and the layout stays."""
    result = results["default"]
    side = result.with_positions
    back = side.permuted_back.copy()
    back[result.head] = np.where(side.original[result.head] > 0.5, 0.0, 1.0)  # differences up to 1.0 exactly
    result = dataclasses.replace(result, with_positions=dataclasses.replace(side, permuted_back=back))
    assert _Numbers.of(result).difference_scale == 1.0
    stand_in = PositionFigure(PositionLayout.of(result))
    assert stand_in.show(result) is stand_in  # no second layout
    for row in stand_in.rows:
        ticks = [tick for tick in row.difference_bar.ax.get_yticks() if 0.0 <= tick <= 1.0]
        assert ticks == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])


@pytest.mark.parametrize("case", CASES)
def test_the_layout_foreseen_from_the_tokenizer_alone_is_the_results(results, case):
    text, permutation, head = CASES[case]
    position_figure.prepare(text, "bundled", permutation, head)
    prepared = laid_out.take_figure(("position", PositionLayout.of(results[case])))
    assert prepared is not None and prepared.background is not None  # laid out and rendered ahead


def test_a_local_folder_is_foreseen_under_the_name_given(tmp_path):
    from attnviz.api import functions
    from attnviz.models.loading import bundled_model_path

    folder = tmp_path / "model"
    shutil.copytree(bundled_model_path(), folder)
    result = functions.position(TEXT, model=str(folder)).result
    position_figure.prepare(TEXT, str(folder), None, None)
    assert laid_out.take_figure(("position", PositionLayout.of(result))) is not None


def test_the_default_model_is_not_foreseen_and_nothing_is_kept():
    laid_out._laid_out.clear()
    position_figure.prepare(TEXT, None, None, None)
    position_figure.prepare(TEXT, "org/not-a-folder", None, None)
    assert not laid_out._laid_out


def run_recording_takes(tmp_path, *argv: str) -> str:
    """Run `attnviz *argv --model bundled --device cpu --out tmp_path/cli`; return what its figure worker took from
    laid_out, a line per take: the figure's kind and whether one was kept for it."""
    taken = tmp_path / "taken"
    arguments = [*argv, "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "cli")]
    script = f"""
import sys
from attnviz.cli import main
from attnviz.render import laid_out

take_figure = laid_out.take_figure
def recording_take_figure(key):
    figure = take_figure(key)
    open({str(taken)!r}, "a").write(f"{{key[0]}} {{figure is not None}}\\n")
    return figure
laid_out.take_figure = recording_take_figure  # the worker, forked from here, records what it takes
sys.argv = ["attnviz", *{arguments!r}]
main()
"""
    run_script(script, env=None)
    return taken.read_text()


@linux_with_two_cores
def test_attnviz_position_lays_its_figure_out_ahead_and_draws_the_same_png(tmp_path):
    """The command's figure worker lays position.png out while torch loads and takes it for the run; the PNG equals
    the one drawn here from the same run."""
    from attnviz.api import functions

    assert run_recording_takes(tmp_path, "position", TEXT) == "position True\n"
    result = functions.position(TEXT, model="bundled", device="cpu")
    (tmp_path / "here").mkdir()
    here = position_figure.write_position_figure(result.result, tmp_path / "here")
    np.testing.assert_array_equal(read_png(tmp_path / "cli" / "position.png"), read_png(here))


COMPARE_CASES = {  # (head counts as --heads gives them, weights, layer, seed)
    "the default": (None, "pretrained", 0, 0),
    "two weights, given counts": ("2,3,12", "pretrained,random", 2, 5),
    "seven counts, wrapped": ("1,2,3,4,6,8,12", "random", 1, 0),
}


def shared_spec(layer: int, seed: int) -> RunSpec:
    """What `attnviz compare --model bundled` gives prepare(): the settings its splits share, before loading."""
    return RunSpec(model="bundled", resolved_model="bundled", model_source="", layer=layer, num_heads=None, weights=None, seed=seed)


def real_splits(bundled_bert, text: str, heads: str | None, weights: str, layer: int, seed: int):
    from attnviz.analysis.compare import default_head_counts, parse_head_counts, parse_weights

    counts = parse_head_counts(heads) if heads else default_head_counts(bundled_bert.hidden_size, bundled_bert.num_heads)
    return compare_splits(bundled_bert, text, counts, parse_weights(weights), run_spec(bundled_bert, layer=layer, seed=seed))


@pytest.mark.parametrize("case", COMPARE_CASES)
def test_compare_png_laid_out_and_rendered_ahead_equals_the_real_splits_figure(bundled_bert, case, tmp_path):
    heads, weights, layer, seed = COMPARE_CASES[case]
    splits = real_splits(bundled_bert, TEXT, heads, weights, layer, seed)
    compare_figures.prepare(TEXT, shared_spec(layer, seed), heads, weights)
    prepared = laid_out.take_figure(("compare", ComparisonLayout.of(splits, seed)))
    assert prepared is not None and prepared.background is not None  # foreseen: laid out and rendered ahead
    prepared.show(splits)
    ahead = prepared.write_png(tmp_path / "ahead.png")
    whole = compare_figures.comparison_figure(splits, seed=seed)
    np.testing.assert_array_equal(read_png(ahead), pixels(whole)[..., :3])


def test_compare_with_more_heads_than_shown_is_not_foreseen(bundled_bert):
    """Past 16 heads the panels shown depend on the maps (the most focused to the broadest)."""
    splits = real_splits(bundled_bert, TEXT, "4,32", "pretrained", 0, 0)
    assert ComparisonLayout.of(splits, 0) is None
    laid_out._laid_out.clear()
    compare_figures.prepare(TEXT, shared_spec(0, 0), "4,32", "pretrained")
    assert not laid_out._laid_out


@linux_with_two_cores
def test_attnviz_compare_lays_its_figure_out_ahead_and_draws_the_same_png(tmp_path):
    from attnviz.api import functions

    argv = ["compare", TEXT, "--weights", "pretrained,random", "--seed", "3"]
    assert run_recording_takes(tmp_path, *argv) == "compare True\n"
    result = functions.compare(TEXT, weights="pretrained,random", seed=3, model="bundled", device="cpu")
    whole = compare_figures.comparison_figure(result.splits, seed=3)
    np.testing.assert_array_equal(read_png(tmp_path / "cli" / "compare.png"), pixels(whole)[..., :3])


def test_laying_out_ahead_writes_nothing_anywhere(tmp_path, monkeypatch):
    """prepare() lays out and renders in memory: no file is written, in the current folder or elsewhere it is told of."""
    monkeypatch.chdir(tmp_path)
    position_figure.prepare(TEXT, "bundled", None, None)
    compare_figures.prepare(TEXT, shared_spec(0, 0), None, "pretrained,random")
    assert len(laid_out._laid_out) == 1  # the latest only
    laid_out._laid_out.clear()
    assert list(tmp_path.iterdir()) == []

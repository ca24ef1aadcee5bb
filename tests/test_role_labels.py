"""analysis/roles.py's labels from scores (no model): each role above its stated threshold, the main role in ROLES'
order, the retrieval heads joined in one call (with_retrieval), and roles.json, roles.png and the terminal from them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnviz.analysis.head_numbers import RoleSettings
from attnviz.analysis.head_summaries import SUMMARIES, LayerSummaries
from attnviz.analysis.roles import ROLE_NAMES, ROLES, RoleScores

SHAPE = (2, 3)  # layers, heads


def spec():
    from attnviz.spec import RunSpec

    return RunSpec(model="tiny", resolved_model="tiny", model_source="local folder")


def summaries(**values) -> LayerSummaries:
    every = {name: np.zeros(SHAPE) for name in SUMMARIES} | values
    return LayerSummaries(values=every, top_keys=np.zeros((*SHAPE, 1), int), top_shares=np.zeros((*SHAPE, 1)),
                          tokens=["a", "b"], shown_tokens=["a", "b"], text="a b", model="tiny", causal=True)  # fmt: skip


def scores(**values) -> dict:
    names = ("previous_token", "duplicate_token", "induction", "streaming", "top_16", "top_64", "top_256", "prefix_matching", "copying")
    return {name: np.zeros(SHAPE) for name in names} | values


def retrieval_heads():
    """output/retrieval_heads.py's result, with scores of our choosing and no test run."""
    from attnviz.output.retrieval_heads import RetrievalHeads

    return RetrievalHeads(np.array([[0.0, 0.5, 0.1], [0.05, 0.0, 0.2]]), [], [100], [0.5])


@pytest.fixture
def roles():
    previous = np.array([[0.9, 0.2, 0.51], [0.0, 0.0, 0.0]])
    prefix = np.array([[0.0, 0.0, 0.6], [0.31, 0.0, 0.0]])
    sink = np.array([[0.0, 0.0, 0.0], [0.0, 0.8, 0.3]])
    return RoleScores(scores(previous_token=previous, prefix_matching=prefix), summaries(sink=sink), [1, 2], RoleSettings())


def test_a_head_has_each_role_whose_score_is_above_its_threshold_and_its_main_role_is_the_first(roles):
    assert roles.labels() == [[["previous-token"], [], ["induction", "previous-token"]], [["induction"], ["sink"], []]]
    chosen, strength = roles.main_roles()
    induction, previous, sink = (ROLE_NAMES.index(name) for name in ("induction", "previous-token", "sink"))
    np.testing.assert_array_equal(chosen, [[previous, -1, induction], [induction, sink, -1]])  # 0.3 is not above 0.3
    np.testing.assert_allclose(strength, [[0.9, 0, 0.6], [0.31, 0.8, 0]])
    assert roles.top_heads(ROLES[ROLE_NAMES.index("previous-token")]) == [(0, 0, 0.9), (0, 2, 0.51)]


def test_the_retrieval_heads_join_in_one_call_and_reach_the_labels_the_json_the_figure_and_the_terminal(roles, tmp_path):
    from attnviz.api.roles import RolesResult
    from attnviz.output.roles_json import roles_record
    from attnviz.render.role_figures import ROLE_COLOURS, role_cells
    from attnviz.render.role_tables import print_roles
    from attnviz.spec import RunSpec

    joined = roles.with_retrieval(retrieval_heads())
    assert "retrieval" not in roles.scores and roles.retrieval is None  # the first is left as it was
    assert joined.labels()[0][1] == ["retrieval"] and joined.labels()[1][2] == ["retrieval"]  # > 0.1, not 0.1
    assert joined.labels()[0][2] == ["induction", "previous-token"]
    record = json.loads(json.dumps(roles_record(joined, spec())))
    assert record["scores"]["retrieval"] == retrieval_heads().scores.tolist()
    assert record["retrieval"] == retrieval_heads().record()["retrieval"] and record["retrieval"]["tests_kept"] == 0
    assert list(record["scores"])[-1] == "retrieval" and "retrieval" in record["definitions"]
    assert record["thresholds"]["retrieval"] == {"score": "retrieval", "above": 0.1, "source": ROLES[0].why}
    assert record["roles"][0][1] == ["retrieval"]
    red = np.array([int(ROLE_COLOURS[0][i : i + 2], 16) / 255 for i in (1, 3, 5)])
    np.testing.assert_allclose(role_cells(joined)[0, 1], 1 - (1 / 3 + 2 / 3 * 0.4 / 0.9) * (1 - red))  # 0.5: 0.4 past 0.1
    result = RolesResult(joined, spec())
    from rich.console import Console

    console = Console(width=100, record=True)
    print_roles(console, joined)
    printed = " ".join(console.export_text().split())
    assert "│ R = retrieval │ retrieval > 0.1 │ L0H1 0.50, L1H2 0.20 │" in printed and "│ L0 │ P │ R │ I+P │" in printed
    assert result.figure().axes[0].get_legend().get_texts()[0].get_text() == "R = retrieval: retrieval > 0.1"


def test_roles_json_without_retrieval_leaves_it_out(roles):
    from attnviz.output.roles_json import roles_record
    from attnviz.spec import RunSpec

    record = roles_record(roles, spec())
    assert "retrieval" not in record and "retrieval" not in record["scores"] and record["roles"][1][1] == ["sink"]
    assert not [name for name, entry in record["definitions"].items() if "the the" in entry["definition"]]
    assert record["definitions"]["top_16"]["definition"].startswith("mean over queries of the weight on the row's 16 largest")


def uniform_written_out(score: str, num_tokens: int, causal: bool, sinks: int, recent: int, window: int) -> float:
    """A uniform head's share, from its (N, N) map: each row 1 / (the keys it may see) on each of them."""
    queries, keys = np.indices((num_tokens, num_tokens))
    seen = keys <= queries if causal else np.ones((num_tokens, num_tokens), bool)
    A = seen / seen.sum(-1, keepdims=True)
    on = {"sink": keys == 0, "local": np.abs(queries - keys) <= window,
          "streaming": (keys < sinks) | ((keys <= queries) & (keys > queries - recent))}[score]  # fmt: skip
    return float((A * on).sum(-1).mean())


@pytest.mark.parametrize("causal", [True, False])
def test_a_uniform_heads_share_is_its_map_written_out(causal):
    from attnviz.analysis.roles import SHARE_ROLES, uniform_score

    for num_tokens, sinks, recent, window in [(1, 4, 256, 8), (14, 4, 256, 8), (40, 2, 5, 3), (300, 4, 256, 8), (9, 12, 3, 20)]:
        settings = RoleSettings(sinks=sinks, recent=recent)
        for score in SHARE_ROLES:
            expected = uniform_written_out(score, num_tokens, causal, sinks, recent, window)
            got = uniform_score(score, num_tokens, causal=causal, settings=settings, window=window)
            assert got == pytest.approx(expected, abs=1e-12), (score, num_tokens, causal)


def test_on_the_readmes_14_tokens_local_sink_and_streaming_are_left_unlabelled_and_say_why_and_from_when():
    """14 causal tokens: a uniform head scores 0.91 in the band of 8, 0.23 on the first token and 1 on the streaming
    keys, each over half its threshold; skipped says so, with the least length where the share can tell (written
    out here: half the threshold reached there and not one token before), and no head gets those roles, whatever
    its score; an encoder's uniform head on 8 tokens has 0.66 on the streaming keys, not 1."""
    from attnviz.analysis.roles import SEPARATION, role_key, share_role_skips

    settings = RoleSettings()
    uniform, skipped = share_role_skips(14, causal=True, settings=settings, window=8)
    assert set(skipped) == {"local role", "sink role", "streaming role"}
    thresholds = {role.name: role.threshold for role in ROLES}
    for name, score in (("local", "local"), ("sink", "sink"), ("streaming", "streaming")):
        assert uniform[name] == pytest.approx(uniform_written_out(score, 14, True, 4, 256, 8), abs=1e-12)
        why = skipped[role_key(name)]
        assert f"scores {uniform[name]:.2f} on these 14 tokens" in why and f"threshold {thresholds[name]:g}" in why
        needed = int(why.split("a text of ")[1].split(" tokens")[0].replace(",", ""))
        half = thresholds[name] / SEPARATION
        assert uniform_written_out(score, needed, True, 4, 256, 8) <= half < uniform_written_out(score, needed - 1, True, 4, 256, 8)
    assert [round(uniform[name], 2) for name in ("local", "sink", "streaming")] == [0.91, 0.23, 1.0]
    everything = {name: np.ones(SHAPE) for name in ("sink", "local")}
    roles = RoleScores(scores(streaming=np.ones(SHAPE)), summaries(**everything), list(range(14)), settings,
                       skipped=skipped, uniform=uniform)  # fmt: skip
    assert roles.labels() == [[[] for _ in range(SHAPE[1])] for _ in range(SHAPE[0])]
    assert all(roles.role_values(role) is None for role in ROLES if role.name in ("local", "sink", "streaming"))
    from attnviz.api.roles import RolesResult

    shown = RolesResult(roles, spec())._repr_html_()  # a notebook's table says so too, not "none"
    assert shown.count("not labelled on this text (the notes say why)") == 3 and "a text of 131 tokens or more can" in shown
    assert share_role_skips(300, causal=True, settings=settings, window=8)[1].keys() == {"streaming role"}
    encoder_uniform, encoder_skipped = share_role_skips(8, causal=False, settings=settings, window=8)
    assert encoder_uniform["streaming"] == pytest.approx(uniform_written_out("streaming", 8, False, 4, 256, 8))
    assert round(encoder_uniform["streaming"], 2) == 0.66 and "scores 0.66 on these 8 tokens" in encoder_skipped["streaming role"]


def test_no_cells_letters_spell_a_token_and_the_legend_and_the_title_spell_them_out():
    """Copying, local and sink in one cell read C+L+S (never CLS); each legend entry spells its letter; the title says
    which roles this text cannot tell, with a uniform head's share."""
    from attnviz.analysis.roles import share_role_skips
    from attnviz.render.role_figures import SHORT, role_code, roles_figure

    assert role_code(["copying", "local", "sink"]) == "C+L+S" and role_code(["induction"]) == "I" and role_code([]) == ""
    heads = np.array([[0.95, 0.0, 0.0], [0.0, 0.0, 0.0]])
    shares = {"sink": np.array([[0.9, 0, 0], [0, 0, 0]]), "local": np.array([[0.9, 0, 0], [0, 0, 0]])}
    long_enough = RoleScores(scores(copying=heads), summaries(**shares), list(range(300)), RoleSettings())
    figure = roles_figure(long_enough)
    cells = [text.get_text() for text in figure.axes[0].texts]
    assert cells[0] == "C+L+S" and all("+" in code or len(code) <= 1 for code in cells)
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend[:-1] == [f"{SHORT[role.name]} = {role.name}: {role.score} > {role.threshold:g}" for role in ROLES
                           if role.name != "retrieval"]  # fmt: skip
    uniform, skipped = share_role_skips(14, causal=True, settings=RoleSettings(), window=8)
    short = RoleScores(scores(copying=heads), summaries(**shares), list(range(14)), RoleSettings(), skipped=skipped, uniform=uniform)
    title = " ".join(roles_figure(short).get_suptitle().split())
    assert "not labelled on 14 tokens, a uniform head's share over half the threshold: local 0.91 > 0.5/2, sink 0.23 > 0.3/2, streaming 1.00 > 0.9/2" in title
    assert [text.get_text() for text in roles_figure(short).axes[0].texts][0] == "C"


@pytest.mark.parametrize("num_layers", [24, 30])
def test_every_layer_of_a_layers_by_heads_grid_is_labelled(num_layers):
    """roles.png and patch.png (grids_figure) label every layer's row: the top head of a 24-layer model (L23) is on
    a labelled row."""
    from attnviz.render.role_figures import roles_figure
    from attnviz.render.summary_figures import grids_figure

    shape = (num_layers, 9)
    every = {name: np.zeros(shape) for name in SUMMARIES}
    summaries_here = LayerSummaries(values=every, top_keys=np.zeros((*shape, 1), int), top_shares=np.zeros((*shape, 1)),
                                    tokens=["a", "b"], shown_tokens=["a", "b"], text="a b", model="tiny", causal=True)  # fmt: skip
    names = ("previous_token", "duplicate_token", "induction", "streaming", "prefix_matching", "copying")
    roles = RoleScores({name: np.zeros(shape) for name in names}, summaries_here, [1, 2], RoleSettings())
    grid = grids_figure([("score", np.zeros(shape), True)], 2, [], None, None, summaries_here)
    for figure in (roles_figure(roles), grid):
        labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
        assert labels == [f"L{layer}" for layer in range(num_layers)]
        assert min(label.get_fontsize() for label in figure.axes[0].get_yticklabels()) >= 4.5

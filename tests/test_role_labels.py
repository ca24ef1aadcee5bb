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
    assert "│ R retrieval │ retrieval > 0.1 │ L0H1 0.50, L1H2 0.20 │" in printed and "│ L0 │ P │ R │ IP │" in printed
    assert result.figure().axes[0].get_legend().get_texts()[0].get_text() == "R retrieval: retrieval > 0.1"


def test_roles_json_without_retrieval_leaves_it_out(roles):
    from attnviz.output.roles_json import roles_record
    from attnviz.spec import RunSpec

    record = roles_record(roles, spec())
    assert "retrieval" not in record and "retrieval" not in record["scores"] and record["roles"][1][1] == ["sink"]

"""roles.json (`attnviz roles`): every layer × head's role scores, the ids they were computed from, the settings,
thresholds, definitions and papers, and each head's roles (docs/formats.md says every field)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.output.summaries_json import DECIMALS, write_record
from attnviz.spec import RunSpec

ROLES_FORMAT_VERSION = 1


def score_definitions() -> dict[str, dict[str, str]]:
    """name -> {"definition", "paper"} of every score roles.json may hold (analysis.roles.SCORE_NAMES)."""
    from attnviz.analysis import circuits, retrieval
    from attnviz.analysis.head_numbers import HEAD_NUMBERS
    from attnviz.analysis.roles import TEMPLATE_SCORES

    definitions = {}
    for name, number in TEMPLATE_SCORES.items():
        entry = HEAD_NUMBERS[number]
        definitions[name] = {
            "definition": f"TransformerLens's {entry.title} score: Σ A'·P / Σ A' over the whole map, A' the map with "
            "key 0 (exclude_bos) and the diagonal (exclude_current) zeroed as asked, P the template",
            "paper": entry.paper,
        }
    for name in ("streaming", "top_16", "top_64", "top_256", "prefix_matching"):
        entry = HEAD_NUMBERS[name]
        definitions[name] = {"definition": f"mean over queries of the {entry.definition}", "paper": entry.paper}
    definitions["prefix_matching"]["definition"] += (
        f", on {circuits.SEQUENCES} sequences of {circuits.PATTERN} random tokens repeated {circuits.REPEATS} times "
        "after the BOS token (random_ids), then the mean over the sequences"
    )
    definitions["copying"] = {
        "definition": "Σ Re λ / Σ |λ| over the eigenvalues of the head's full OV circuit W_U W_O W_V W_E (its "
        "d_head × d_head form, the same nonzero eigenvalues), the norms' weights folded in as TransformerLens's fold_ln",
        "paper": circuits.ELHAGE,
    }
    definitions["retrieval"] = {"definition": retrieval.DEFINITION, "paper": retrieval.PAPER}
    return definitions


def roles_record(roles, spec: RunSpec) -> dict:
    """roles.json's content: scores[name][layer][head], the text's ids, the prefix-matching ids, S and W, the
    exclusions, the thresholds, definitions and papers, each head's roles, what was not computed or labelled and
    why, and a uniform head's score of each share role on this text (what its threshold is judged against)."""
    from attnviz.analysis.roles import ROLES, SCORE_NAMES

    summaries = roles.summaries
    definitions = score_definitions()
    computed = [name for name in SCORE_NAMES if name in roles.scores]
    return {
        "format": "attnviz-roles",
        "version": ROLES_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": summaries.text,
        "model": summaries.model,
        "ids": [int(index) for index in roles.ids],
        "tokens": summaries.tokens,
        "random_ids": roles.random_ids,
        "sinks": roles.settings.sinks,
        "window": roles.settings.recent,
        "exclude_bos": roles.settings.exclude_bos,
        "exclude_current": roles.settings.exclude_current,
        "scores": {name: np.round(roles.scores[name], DECIMALS).tolist() for name in computed},  # [layer][head]
        "summaries": {name: np.round(values, DECIMALS).tolist() for name, values in summaries.values.items()},
        "definitions": {name: definitions[name] for name in computed},
        "skipped": dict(roles.skipped),
        "uniform": {name: round(score, DECIMALS) for name, score in roles.uniform.items()},
        "thresholds": {role.name: {"score": role.score, "above": role.threshold, "source": role.why} for role in ROLES},
        "roles": roles.labels(),  # [layer][head]: the head's roles
        **({"retrieval": roles.retrieval} if roles.retrieval is not None else {}),
    }


def write_roles_json(roles, spec: RunSpec, path: Path) -> Path:
    return write_record(roles_record(roles, spec), path)

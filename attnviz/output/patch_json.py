"""patch.json (`attnviz patch`): every head's patching scores and direct logit attribution, with what they mean."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.output.summaries_json import DECIMALS, write_record
from attnviz.spec import RunSpec

PATCH_FORMAT_VERSION = 1


def patch_record(patching, spec: RunSpec) -> dict:
    """patch.json's content: the metric of both texts, scores[name][layer][head] (normalised; output, and the
    component asked for), scores.direct[layer][head] (logit units; null for a post-norm stack) and the attribution's
    other parts, both texts' tokens, definitions and
    papers; per_position for the most affecting heads when asked."""
    from attnviz.analysis.attribution import DIRECT, NO_DIRECT, PARTS
    from attnviz.analysis.patching import COMPONENTS, METRIC, PAPERS, SCORE, SCORE_NAMES

    rounded = lambda values: np.round(values, DECIMALS).tolist()  # noqa: E731
    parts = {name: (rounded(value) if isinstance(value, np.ndarray) else round(float(value), DECIMALS)) for name, value in patching.parts.items() if name != "heads"}
    return {
        "format": "attnviz-patch",
        "version": PATCH_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "model": patching.model,
        "text": patching.text,
        "corrupt": patching.corrupt_text,
        "tokens": patching.tokens,
        "corrupt_tokens": patching.corrupt_tokens,
        "shown_tokens": list(patching.shown[0]),
        "shown_corrupt_tokens": list(patching.shown[1]),
        "answer": patching.answer,
        "wrong": patching.wrong,
        "position": patching.position,
        "metric": {"clean": round(patching.clean, DECIMALS), "corrupt": round(patching.corrupt, DECIMALS)},
        "scores": {
            **{SCORE_NAMES[name]: rounded(values) for name, values in patching.scores.items()},
            "direct": None if patching.direct is None else rounded(patching.direct),
        },
        "direct_parts": parts,
        **({"per_position": [
            {"layer": layer, "head": head, "scores": rounded(row)} for (layer, head), row in patching.per_position.items()
        ]} if patching.per_position else {}),  # fmt: skip
        "definitions": {
            "metric": METRIC,
            "scores": SCORE,
            **{SCORE_NAMES[name]: COMPONENTS[name] for name in patching.scores},
            "direct": NO_DIRECT if patching.direct is None else DIRECT,
            "direct_parts": PARTS,
        },
        "papers": PAPERS,
    }


def write_patch_json(patching, spec: RunSpec, path: Path) -> Path:
    return write_record(patch_record(patching, spec), path)

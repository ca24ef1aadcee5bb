"""compose.json (`attnviz compose`): every head pair's Q-, K- and V-composition scores, their baselines and the
strongest pairs (docs/formats.md says every field)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.output.summaries_json import write_record

COMPOSE_FORMAT_VERSION = 1


def nested(values: np.ndarray) -> list:
    """An array as nested lists, NaN as None (JSON's null)."""
    return [nested(part) for part in values] if values.ndim > 1 else [None if np.isnan(value) else float(value) for value in values]


def compose_record(compositions, model: str, top: int) -> dict:
    """compose.json's content: analysis.compositions.Compositions of model, its top strongest pairs listed."""
    from attnviz.analysis.compositions import ELHAGE_COMPOSITION, KINDS

    rows = [{**row, "sender": list(row["sender"]), "receiver": list(row["receiver"])} for row in compositions.top(top)]
    return {
        "format": "attnviz-compositions",
        "version": COMPOSE_FORMAT_VERSION,
        "model": model,
        "paper": ELHAGE_COMPOSITION,
        "axes": ["sender layer", "sender head", "receiver layer", "receiver head"],
        "baseline": dict(compositions.baseline),
        "baseline_draws": compositions.baseline_draws,
        "norms_folded": compositions.norms_folded,
        "notes": list(compositions.notes),
        "scores": {kind: nested(compositions.scores[kind]) for kind in KINDS},
        "top": rows,
    }


def write_compose_json(compositions, model: str, top: int, path: Path) -> Path:
    return write_record(compose_record(compositions, model, top), path)

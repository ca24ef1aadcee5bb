"""position.json: the record of `attnviz position` (format documented in docs/commands.md, "position")."""

from __future__ import annotations

import json
from pathlib import Path

from attnviz.analysis.position import LAYER, TOLERANCE, PositionResult, PositionSide
from attnviz.spec import RunSpec

POSITION_FORMAT_VERSION = 1


def position_record(result: PositionResult, spec: RunSpec) -> dict:
    def side(side: PositionSide) -> dict:
        return {
            "max_abs_difference": side.max_difference,
            "head_max_abs_difference": [float(value) for value in side.head_differences],
            "output_max_abs_difference": side.output_difference,
            "equivariant": side.equivariant,
        }

    return {
        "format": "attnviz-position",
        "version": POSITION_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": result.text,
        "truncated": None,  # position never cuts: a text too long for the model is refused
        "model": result.model,
        "layer": LAYER,
        "weights": "pretrained",
        "device": result.device,
        "tokens": result.tokens,
        "shown_tokens": result.shown_tokens,  # as the figure shows them (models/shown.py)
        "permutation": result.permutation,
        "permuted_tokens": result.permuted_tokens,
        "head_shown": result.head,
        "tolerance": TOLERANCE,
        "without_positions": side(result.without_positions),
        "with_positions": side(result.with_positions),
    }


def write_position_json(result: PositionResult, spec: RunSpec, path: Path) -> Path:
    path.write_text(json.dumps(position_record(result, spec), ensure_ascii=False, indent=1), encoding="utf-8")
    return path

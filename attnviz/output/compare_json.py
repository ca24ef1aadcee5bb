"""compare.json: the record of `attnviz compare` (format documented in docs/commands.md, "compare")."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from attnviz.analysis.compare import Split
from attnviz.run_data import truncation_json
from attnviz.spec import RunSpec

COMPARE_FORMAT_VERSION = 1


def comparison_record(splits: list[Split], spec: RunSpec) -> dict:
    """spec holds the settings the splits share (num_heads and weights None); each split gets its own."""
    first = splits[0].run
    return {
        "format": "attnviz-compare",
        "version": COMPARE_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": first.text,
        "truncated": truncation_json(first.truncated),
        "model": first.model,
        "layer": first.layer,
        "device": first.device,
        "tokens": first.query_tokens,
        "shown_tokens": first.shown_tokens[0],  # as figures and tables show them (models/shown.py)
        "splits": [
            {
                "settings": replace(spec, num_heads=split.num_heads, weights=split.weights).to_dict(),
                "weights": split.weights,
                "num_heads": split.num_heads,
                "head_dim": split.run.head_dim,
                "mean_relative_entropy": round(split.mean_relative_entropy, 6),
                "mean_max": round(split.mean_max, 6),
                "heads": [
                    {
                        "head": summary.head,
                        "entropy": round(summary.entropy, 6),
                        "relative_entropy": round(summary.relative_entropy, 6),
                        "mean_max": round(summary.mean_max, 6),
                    }
                    for summary in split.summaries
                ],
            }
            for split in splits
        ],
    }


def write_comparison_json(splits: list[Split], spec: RunSpec, path: Path) -> Path:
    path.write_text(json.dumps(comparison_record(splits, spec), ensure_ascii=False, indent=1), encoding="utf-8")
    return path

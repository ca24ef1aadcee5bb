"""stats.csv, stats.json and rollout.json: the machine-readable results of `attnviz stats` and
`attnviz layers` (formats documented in docs/formats.md and docs/commands.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from attnviz.analysis.head_numbers import STATISTICS
from attnviz.analysis.statistics import (
    BROAD_THRESHOLD,
    CLARK_DIFFERENCES,
    SHARE_LABELS,
    SHARE_THRESHOLD,
    ModelStatistics,
    absent_key_kinds_note,
    run_causal_note,
)
from attnviz.output.export import DECIMALS, measures_record
from attnviz.run_data import AttentionRun, Truncation, truncation_json
from attnviz.spec import RunSpec

FORMAT_VERSION = 1


def write_stats_csv(stats: ModelStatistics, path: Path) -> Path:
    """One row per layer and head: layer, head, label (empty when none), then STATISTICS."""
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["layer", "head", "label", *STATISTICS])
        for layer in range(stats.num_layers):
            for head in range(stats.num_heads):
                values = stats.values[layer, head]
                writer.writerow(
                    [layer, head, stats.label(layer, head) or "", *(f"{value:.{DECIMALS}f}" for value in values)]
                )
    return path


def stats_record(
    stats: ModelStatistics,
    texts: list[str] | None,
    truncated: list[Truncation | None] | None,
    run: AttentionRun,
    spec: RunSpec,
    corpus: dict | None = None,
) -> dict:
    """The stats.json object; truncated is each text's cut, run any one of the runs, for the model and the setup.

    texts and truncated are None for a corpus too large to list (stats --file): corpus then says
    which file it was (its bytes and SHA-256), how many texts it held and how many were cut.
    """
    heads = []
    for layer in range(stats.num_layers):
        for head in range(stats.num_heads):
            values = {name: round(value, DECIMALS) for name, value in stats.head(layer, head).items()}
            heads.append({"layer": layer, "head": head, "label": stats.label(layer, head), **values})
    return {
        "format": "attnviz-stats",
        "version": FORMAT_VERSION,
        "settings": spec.to_dict(),
        "model": run.model,
        "weights": run.weights,
        "seed": spec.seed if run.weights == "random" else None,
        "num_layers": stats.num_layers,
        "num_heads": stats.num_heads,
        "head_dim": run.head_dim,
        "device": run.device,
        "causal": stats.causal,
        "causal_note": run_causal_note(run, every_layer=True),
        "num_texts": stats.num_texts,
        "texts": texts,
        "truncated": [truncation_json(truncation) for truncation in truncated] if truncated is not None else None,
        **({"corpus": corpus} if corpus is not None else {}),
        "statistics": list(STATISTICS),
        "statistics_over": "words" if spec.words else "tokens",  # --words: each text's maps merged over words
        "key_kinds_note": absent_key_kinds_note(run.family, run.query_tokens),
        "thresholds": {
            "share": SHARE_THRESHOLD,
            "share_labels": SHARE_LABELS,
            "broad_relative_entropy": BROAD_THRESHOLD,
        },
        "differences_from_clark_et_al_2019": CLARK_DIFFERENCES,
        "heads": heads,
        "js_distance": np.round(stats.js_distance, DECIMALS).tolist() if stats.js_distance is not None else None,  # None: not measured
    }


def write_stats_json(
    stats: ModelStatistics,
    texts: list[str],
    truncated: list[Truncation | None],
    run: AttentionRun,
    spec: RunSpec,
    path: Path,
    corpus: dict | None = None,
) -> Path:
    record = stats_record(stats, texts, truncated, run, spec, corpus)
    path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return path


def layers_record(format_name: str, layer_runs: list[AttentionRun], spec: RunSpec) -> dict:
    """What rollout.json and measures.json (attnviz layers) both begin with: the settings, the text, the
    model and the mask, the tokens and ids, and with --words the words and each token's word."""
    run = layer_runs[0]
    words = {}
    if run.words is not None:  # the plain words, and as labelled: what the model saw beside a word it did not read ("想 [UNK]")
        words = {"words": run.words.query_plain_words, "words_shown": run.query_tokens, "token_words": run.words.query_word}
    return {
        "format": format_name,
        "version": FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": run.text,
        "truncated": truncation_json(run.truncated),
        "model": run.model,
        "weights": run.weights,
        "seed": spec.seed if run.weights == "random" else None,
        "num_layers": len(layer_runs),
        "num_heads": run.num_heads,
        "device": run.device,
        "causal": run.causal,
        "causal_note": run_causal_note(run, every_layer=True),
        "tokens": run.tokenizer_tokens[0],
        "shown_tokens": run.shown_tokenizer_tokens[0],  # as figures and tables show them (models/shown.py)
        "ids": run.words.query_ids if run.words is not None else run.query_ids,
        **words,
    }


def rollout_record(layer_runs: list[AttentionRun], rollout: np.ndarray, spec: RunSpec) -> dict:
    over_words = {"rollout_over": "words"} if layer_runs[0].words is not None else {}
    return {
        **layers_record("attnviz-rollout", layer_runs, spec),
        **over_words,
        "rollout": np.round(rollout.astype(np.float64), DECIMALS).tolist(),
    }


def write_layers_measures_json(layer_runs: list[AttentionRun], measures, spec: RunSpec, path: Path) -> Path:
    """measures.json of attnviz layers --measure (docs/commands.md, "layers")."""
    record = {**layers_record("attnviz-measures", layer_runs, spec), "measures": measures_record(measures)}
    path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return path


def write_rollout_json(layer_runs: list[AttentionRun], rollout: np.ndarray, spec: RunSpec, path: Path) -> Path:
    path.write_text(json.dumps(rollout_record(layer_runs, rollout, spec), ensure_ascii=False), encoding="utf-8")
    return path

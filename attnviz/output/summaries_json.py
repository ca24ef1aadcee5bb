"""summaries.json: every head of every layer summarised (attnviz layers; analysis/head_summaries.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnviz.analysis.head_summaries import (
    SINK_FRACTION,
    SINK_PAPER,
    SINK_THRESHOLD,
    SUMMARIES,
    TOP_KEYS_DEFINITION,
    LayerSummaries,
)
from attnviz.spec import RunSpec

SUMMARIES_FORMAT_VERSION = 1
GENERATE_FORMAT_VERSION = 2  # 2: rows_are names the rows (1's rows were each generated token's own, unnamed)
DECIMALS = 6  # sums of float32 weights: good to about 1e-6


def rounded(values: np.ndarray) -> list:
    return np.round(np.asarray(values, dtype=np.float64), DECIMALS).tolist()


def summaries_record(summaries: LayerSummaries, spec: RunSpec) -> dict:
    """The record: settings, definitions, per summary an L × H list (summaries[name][layer][head]), top keys."""
    definitions = {name: {"name": what, "definition": definition} for name, (what, definition) in SUMMARIES.items()}
    definitions["sink_fraction"] = {"name": SINK_FRACTION[0], "definition": SINK_FRACTION[1], "paper": SINK_PAPER}
    definitions["top_keys"] = {"name": TOP_KEYS_DEFINITION[0], "definition": TOP_KEYS_DEFINITION[1]}
    shown = summaries.shown_tokens
    top_keys = [
        [
            [{"key": int(key), "token": shown[key], "share": round(float(share), DECIMALS)} for key, share in zip(keys, shares)]
            for keys, shares in zip(layer_keys, layer_shares)
        ]
        for layer_keys, layer_shares in zip(summaries.top_keys, summaries.top_shares)
    ]
    num_layers, num_heads = summaries.values["sink"].shape
    return {
        "format": "attnviz-summaries",
        "version": SUMMARIES_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": summaries.text,
        "model": summaries.model,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_tokens": len(summaries.tokens),
        "causal": summaries.causal,
        "window": summaries.window,
        "sink_threshold": SINK_THRESHOLD,
        "rows_per_block": summaries.rows_per_block,
        "tokens": summaries.tokens,
        "shown_tokens": shown,
        "definitions": definitions,
        "summaries": {name: rounded(values) for name, values in summaries.values.items()},
        "sink_fraction": rounded(summaries.sink_fraction),
        "model_sink_fraction": round(summaries.model_sink_fraction, DECIMALS),
        "top_keys": top_keys,  # top_keys[layer][head]: most attended first
    }


def write_record(record: dict, path: Path) -> Path:
    """A JSON file of this module's records (summaries, effects, diff, generate): UTF-8, characters as they are."""
    path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return path


def write_summaries_json(summaries: LayerSummaries, spec: RunSpec, path: Path) -> Path:
    return write_record(summaries_record(summaries, spec), path)


def write_effects_json(effects, spec: RunSpec, path: Path) -> Path:
    """effects.json (`layers --effect`): every head of every layer taken out (analysis.effect.HeadEffects), as
    attention.json's "effects" holds one layer's, with the settings, the text and its tokens."""
    from attnviz.output.export import effects_record

    record = {
        "format": "attnviz-effects",
        "version": SUMMARIES_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": effects.text,
        "model": effects.model,
        "tokens": effects.tokens,
        **effects_record(effects, effects.layers),  # kl[layer][head], loss[layer][head] (an encoder's cosine, pooled)
    }
    return write_record(record, path)


def differences_record(differences, spec: RunSpec) -> dict:
    """diff.json (`attnviz diff`): every layer × head's distances between two checkpoints' maps of one text
    (analysis.diff.HeadDifferences), with what each means and the most changed heads."""
    from attnviz.analysis.diff import CLARK, DISTANCES

    values = differences.values
    return {
        "format": "attnviz-diff",
        "version": SUMMARIES_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": differences.text,
        "model": differences.model,
        "against": differences.against,
        **({"seed": differences.seed} if differences.seed is not None else {}),
        "tokens": differences.tokens,
        "paper": CLARK,
        "definitions": {name: definition for name, (_, definition) in DISTANCES.items()},
        **{name: np.round(values[name], DECIMALS).tolist() for name in DISTANCES},  # js[layer][head]
        "most_changed": [
            {"layer": layer, "head": head, **{name: round(float(values[name][layer, head]), DECIMALS) for name in DISTANCES}}
            for layer, head in differences.top
        ],
    }


def write_differences_json(differences, spec: RunSpec, path: Path) -> Path:
    return write_record(differences_record(differences, spec), path)


def generation_record(generation, spec: RunSpec, rows_are: str = "chosen") -> dict:
    """generate.json (`attnviz generate`): the prompt, the generated ids and text, every token as shown, and the run
    layer's rows named by rows_are (analysis.generation.ROWS; H, n, P + n: generated token t's row, that of the
    query queries[t], over every token, 0 past its query), with each step's sink share (the weight on the first
    token), share on the token before the query, entropy (nats) and mean distance back (tokens, weighted) for every
    layer and head."""
    from attnviz.analysis.generation import ROWS
    from attnviz.analysis.statistics import row_entropy

    rows = generation.rows(rows_are).astype(np.float64)  # (L, H, n, T)
    entropy = row_entropy(rows)  # (L, H, n)
    queries = generation.queries(rows_are)  # each row's query position (n,)
    distance = (rows * (queries[:, None] - np.arange(rows.shape[3])[None, :]).clip(min=0)).sum(axis=-1)  # (L, H, n)
    previous = np.take_along_axis(rows, (queries - 1).clip(min=0)[None, None, :, None], axis=-1)[..., 0] * (queries > 0)  # (L, H, n)
    return {
        "format": "attnviz-generate",
        "version": GENERATE_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "model": generation.model,
        "prompt": generation.prompt,
        "continuation": generation.continuation,
        "prompt_ids": generation.prompt_ids,
        "ids": generation.ids,
        "tokens": generation.shown_tokens,
        "sample": generation.sample,
        **({"seed": generation.seed} if generation.sample else {}),
        "layer": spec.layer,
        "rows_are": rows_are,
        "rows_definition": ROWS[rows_are],
        "queries": queries.tolist(),
        "rows": np.round(rows[spec.layer], DECIMALS).tolist(),  # rows[head][step][key]
        "sink": np.round(rows[..., 0], DECIMALS).tolist(),  # sink[layer][head][step]
        "previous": np.round(previous, DECIMALS).tolist(),  # previous[layer][head][step]
        "entropy": np.round(entropy, DECIMALS).tolist(),  # entropy[layer][head][step]
        "distance": np.round(distance, DECIMALS).tolist(),  # distance[layer][head][step]
    }


def write_generation_json(generation, spec: RunSpec, rows_are: str, path: Path) -> Path:
    return write_record(generation_record(generation, spec, rows_are), path)

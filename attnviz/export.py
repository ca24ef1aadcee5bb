"""attention.json: the machine-readable record of a run (format documented in README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnviz.result import AttentionRun

FORMAT_VERSION = 1
DECIMALS = 7  # float32 weights rounded to 1e-7: far below the 1e-5 the tests hold them to


def attention_record(run: AttentionRun) -> dict:
    return {
        "format": "attnviz-attention",
        "version": FORMAT_VERSION,
        "text": run.text,
        "kv_text": run.kv_text,
        "model": run.model,
        "layer": run.layer,
        "weights": run.weights,
        "num_heads": run.num_heads,
        "head_dim": run.head_dim,
        "device": run.device,
        "causal": run.causal,
        "query_tokens": run.query_tokens,
        "key_tokens": run.key_tokens,
        "query_ids": run.query_ids,
        "key_ids": run.key_ids,
        "attention": np.round(run.attention.astype(np.float64), DECIMALS).tolist(),
    }


def write_attention_json(run: AttentionRun, path: Path) -> Path:
    path.write_text(json.dumps(attention_record(run), ensure_ascii=False), encoding="utf-8")
    return path

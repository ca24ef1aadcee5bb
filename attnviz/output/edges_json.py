"""edges.json (`attnviz patch --edges`): every edge's EAP (or EAP-IG) score, the top edges checked by path patching,
with the metric, the inputs' definitions, the settings and the papers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.output.summaries_json import DECIMALS, write_record
from attnviz.spec import RunSpec

EDGES_FORMAT_VERSION = 1


def _rounded(values: np.ndarray) -> list:
    """Nested lists, NaN (no edge: the receiver's layer is not after the sender's) as None (null)."""
    rounded = np.round(values, DECIMALS).astype(object)
    rounded[np.isnan(values)] = None
    return rounded.tolist()


def edges_record(patching, spec: RunSpec) -> dict:
    """edges.json's content: scores[input][sender layer][sender head][receiver layer][receiver head] for q, k and v
    (k and v by key/value head), scores.logits[sender layer][sender head]; checked: the top edges with their path
    patching; everything normalised by m_clean - m_corrupt."""
    from attnviz.analysis.edges import CHECKED, INPUTS, PAPERS, PATCHED, POST_NORM_INPUTS, POST_NORM_PATH, SCORE, SCORE_IG, node_name, receiver_name
    from attnviz.analysis.patching import METRIC

    edges = patching.edges
    path = POST_NORM_PATH if edges.post_norm else ""
    number = lambda value: round(float(value), DECIMALS)  # noqa: E731
    checked = [
        {
            "sender": node_name(*edge.sender), "sender_layer": edge.sender[0], "sender_head": edge.sender[1],
            "receiver": receiver_name(edge, edges.grouped), "receiver_layer": edge.layer, "receiver_head": edge.head,
            "input": edge.input, "score": number(score), "path_patched": number(patched),
        }
        for edge, score, patched in edges.checked
    ]  # fmt: skip
    return {
        "format": "attnviz-edges",
        "version": EDGES_FORMAT_VERSION,
        "settings": spec.to_dict(),
        "model": patching.model,
        "text": patching.text,
        "corrupt": patching.corrupt_text,
        "answer": patching.answer,
        "wrong": patching.wrong,
        "position": patching.position,
        "metric": {"clean": number(patching.clean), "corrupt": number(patching.corrupt)},
        "method": "eap" if edges.ig is None else "eap-ig",
        "ig_steps": edges.ig,
        "layers": int(edges.scores["logits"].shape[0]),
        "heads": edges.num_heads,
        "kv_heads": edges.num_kv_heads,
        "scores": {name: _rounded(values) for name, values in edges.scores.items()},
        "checked": checked,
        "definitions": {
            "metric": METRIC,
            "score": (SCORE if edges.ig is None else SCORE_IG) + path,
            "path_patched": PATCHED + path,
            "inputs": POST_NORM_INPUTS if edges.post_norm else INPUTS,
            "checked": f"the edges of largest |score| (default {CHECKED}), each path patched",
        },
        "papers": PAPERS,
    }


def write_edges_json(patching, spec: RunSpec, path: Path) -> Path:
    return write_record(edges_record(patching, spec), path)

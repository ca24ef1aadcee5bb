"""The report's data: attention.json's record of each text, its weights encoded compactly (html/encoding.py).

A long text (past pyramid.ZOOM_MIN_TOKENS queries or keys, or whose map is on disk: is_long) holds no whole map: its "attention"
and "layers" are null, the zoom view's pyramid ("zoom") shows the run's layer, and "summaries" (the
summaries.json object of every layer's heads, without what the record already holds) replaces the
maps of every layer; it has no rollout, statistics or trace (report_record's LONG_TEXT_NOTE says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from attnviz.html.encoding import MAX_EXACT_VALUES, encode_exact, encode_layers, encode_quantised, encode_values
from attnviz.html.pyramid import ZOOM_MIN_TOKENS, needs_zoom, zoom_record
from attnviz.output.export import attention_record
from attnviz.analysis.head_numbers import HEAD_NUMBERS
from attnviz.output.stats_export import stats_record
from attnviz.output.trace_files import trace_record
from attnviz.render.heatmap import KV_GROUP_COLORS
from attnviz.run_data import AttentionRun, map_rows
from attnviz.spec import RunSpec
from attnviz.version import __version__

FORMAT_VERSION = 1

WEIGHTS_ROUNDING = (
    "Weights are stored rounded to 4 decimals, the precision read out here; "
    "for long texts the maps of every layer are drawn from 256 levels of the log colour scale "
    "(0.001 to 1), and their read-outs are marked ≈."
)
LONG_TEXT_NOTE = (
    f"Past {ZOOM_MIN_TOKENS} tokens (or a map held on disk) the report holds no whole map: the Zoom view shows the layer's map, the Summaries "
    "view every head of every layer; the head, heatmap and model views, the statistics, the rollout and the trace, "
    "which need whole maps, are left out."
)
# summaries.json's fields that a text's record already holds, or that it does not need (8,192 tokens twice).
SUMMARIES_LEFT_OUT = ("format", "version", "settings", "text", "model", "tokens", "shown_tokens")


@dataclass(frozen=True)
class ReportText:
    """What the report shows of one text: the run's layer, and, for self-attention, every layer."""

    run: AttentionRun  # the run's layer (spec.layer)
    layers: dict | None = None  # every layer's maps, in order, encoded (html.encoding.LayerCodes); None for cross-attention
    rollout: np.ndarray | None = None  # (N, N)
    statistics: object | None = None  # analysis.statistics.ModelStatistics of this text alone
    trace: object | None = None  # tracing.TraceResult of every layout the layer allows
    mistakes: list = field(default_factory=list)  # tracing.TraceResult of each --mistake run
    summaries: object | None = None  # analysis.head_summaries.LayerSummaries of every layer: a long text's (is_long)
    differences: object | None = None  # analysis.diff.HeadDifferences: another checkpoint's heads beside these (diff)
    generation: object | None = None  # analysis.generation.Generation: the text continued, token by token (generate)
    generation_rows: str = "chosen"  # analysis.generation.ROWS: the rows its stepper shows first
    roles: object | None = None  # analysis.roles.RoleScores: every head's roles (roles)
    # (analysis.patching.Patching, the corrupted text's every layer's runs): which heads carry the answer (patch)
    patching: tuple | None = None
    # analysis.why.CellSplits: the layer's scores split cell by cell (the heatmap view's click), or why there are none
    why: object | None = None


def is_long(run: AttentionRun) -> bool:
    """A text whose report holds no whole map, only the zoom view's pyramid and every layer's summaries: past
    ZOOM_MIN_TOKENS, or its map on disk (past 64 MB, or --memory: the run was asked not to hold whole maps)."""
    return needs_zoom(*run.attention.shape[1:]) or run.map_on_disk


def encode_zoom(zoom: dict) -> dict:
    """html/pyramid.py's zoom record as the page reads it: the levels' maxima and means on the log scale's uint8 codes
    (encode_quantised), the exact rows to 4 decimals (encode_exact); "bytes": each part's size in the page."""
    levels = [
        {**entry, "max": [encode_quantised(values) for values in entry["max"]], "mean": [encode_quantised(values) for values in entry["mean"]]}
        for entry in zoom["levels"]
    ]
    encoded = {"levels": levels, "exact_rows": zoom["exact_rows"], "exact": encode_exact(zoom["exact"])}
    sizes = {f"level {entry['level']}": sum(len(each["data"]) for each in entry["max"] + entry["mean"]) for entry in levels}
    return {**encoded, "bytes": {**sizes, "exact rows": len(encoded["exact"]["data"])}}


def _title_scope(text: ReportText) -> list[str]:
    """What the page's title says the run is: its layer; for a generation every layer's rows, step by step; for roles
    every layer × head (its maps shown at layer 0 are one view of it)."""
    from attnviz.render.titles import counted

    if text.generation is not None:
        generated = counted(len(text.generation.ids), "token")
        return [f"{counted(text.generation.num_prompt, 'token')} continued by {generated}", "every layer"]
    if text.roles is not None:
        return [every_head_scope(text.roles.summaries)]
    return [f"layer {text.run.layer}"]


def text_record(text: ReportText, spec: RunSpec) -> dict:
    """attention.json's record of text.run, its weights encoded, with the layers, rollout, statistics and traces."""
    from attnviz.render.titles import run_title

    run = text.run
    record = attention_record(run, spec, effects=run.effects)  # --effect: each head's effect beside its map
    if run.words is not None:  # the page shows what the maps are over: its query_tokens are the words, the tokens are kept
        record["query_pieces"], record["key_pieces"] = record["query_tokens"], record["key_tokens"]
        record["shown_query_pieces"], record["shown_key_pieces"] = record["shown_query_tokens"], record["shown_key_tokens"]
        record["query_tokens"], record["key_tokens"] = record["query_words_shown"], record["key_words_shown"]
    record["shown_query_tokens"], record["shown_key_tokens"] = run.shown_tokens  # the page's labels (models/shown.py)
    if is_long(run):  # a long map: its pyramid for the zoom view (html/pyramid.py), never the map itself
        record["attention"] = None
        record["zoom"] = encode_zoom(zoom_record(FileRows.of(run.attention), run.causal))
    else:
        record["attention"] = encode_exact(run.attention)
    record["title"] = run_title(run, _title_scope(text), seed=spec.seed if run.weights == "random" else None, fonts=False).split("\n")
    every_layer = replace(spec, layer=None, js=True)  # stats.json's settings: one text's statistics, its JS distances measured
    record["layers"] = text.layers
    record["rollout"] = encode_exact(text.rollout) if text.rollout is not None else None
    record["statistics"] = (
        stats_record(text.statistics, [run.text], [run.truncated], run, every_layer) if text.statistics is not None else None
    )
    if record["statistics"] is not None:  # each statistic's definition and paper, as the page shows them (head_numbers)
        record["statistics"]["definitions"] = {name: HEAD_NUMBERS[name].record() for name in record["statistics"]["statistics"]}
    record["trace"] = trace_record(text.trace, spec) if text.trace is not None else None
    record["mistakes"] = [trace_record(mistaken, spec) for mistaken in text.mistakes]
    if is_long(run):
        record["summaries"] = summaries_of(text.summaries, spec)
    if text.differences is not None:
        record["diff"] = differences_of(text.differences, spec)
    if text.generation is not None:
        record["generation"] = generation_of(text.generation, text.generation_rows)
    if run.vectors is not None:
        record["vectors"] = vectors_of(run.vectors)
    if text.roles is not None:
        record["roles"] = roles_of(text.roles, spec)
    if text.patching is not None:
        record["patch"] = patching_of(*text.patching, spec)
    record["why"] = why_of(text.why)
    return record


def why_of(splits) -> dict | None:
    """The heatmap view's splits of the layer's scores (analysis.why.CellSplits): each cell's largest terms (its query
    part and key part indices into query_parts and key_parts, the terms), the rest of its terms summed and its score,
    every head's cells ("every": each (query, key), row by row; "causal": each query's keys up to itself, row by row;
    "top key": each query's top key, keys[head][query]); {"none": why} where the report holds none; None where it was
    not asked."""
    if splits is None or isinstance(splits, str):
        return None if splits is None else {"none": splits}
    indices = "uint8" if max(len(splits.query_parts), len(splits.key_parts)) <= 256 else "uint16"  # pairs' dtype
    return {
        "layer": splits.layer, "cells": splits.cells,
        "query_parts": splits.query_parts, "key_parts": splits.key_parts,
        "num_terms": len(splits.query_parts) * len(splits.key_parts),
        "keys": splits.keys.tolist() if splits.cells == "top key" else None,
        "pairs": encode_values(splits.pairs, indices), "terms": encode_values(splits.terms, "float32"),
        "rest": encode_values(splits.rest, "float32"), "scores": encode_values(splits.scores, "float32"),
    }  # fmt: skip


def vectors_of(vectors) -> dict:
    """The neuron view's data (analysis.neurons.QueryKeyVectors): q (H, Nq, d) and k (H_kv, Nk, d), encoded as float32
    (the values attnviz's layer multiplies; as JSON numbers to 4 decimals they took 1.8 times the bytes), the scale and
    the query heads per key/value head; position_bias: the weights also add a bias (T5)."""
    return {
        "q": encode_values(vectors.q, "float32"),
        "k": encode_values(vectors.k, "float32"),
        "scale": vectors.scale,
        "group_size": vectors.group_size,
        "position_bias": vectors.position_bias,
    }


def every_head_scope(summaries) -> str:
    """'30 layers × 9 heads, every head's roles': a roles report's title scope (LayerSummaries: its (L, H))."""
    from attnviz.render.titles import counted

    num_layers, num_heads = summaries.values["sink"].shape
    return f"{counted(num_layers, 'layer')} × {counted(num_heads, 'head')}, every head's roles"


def roles_of(roles, spec: RunSpec) -> dict:
    """The Roles view's data: roles.json's object (less what the text's record holds), each role's colour, each
    head's main role (analysis.roles.RoleScores.main_roles: an index of roles_order, -1 none) and its score, and the
    roles a head could be labelled with (their scores computed and telling: labelled)."""
    from attnviz.analysis.roles import ROLE_NAMES, ROLES
    from attnviz.output.roles_json import roles_record
    from attnviz.render.role_figures import ROLE_COLOURS, SHORT

    chosen, strength = roles.main_roles()
    full = roles_record(roles, spec)
    return {name: value for name, value in full.items() if name not in SUMMARIES_LEFT_OUT} | {
        "roles_order": list(ROLE_NAMES), "colours": list(ROLE_COLOURS), "letters": [SHORT[name] for name in ROLE_NAMES],
        "main_role": chosen.tolist(), "main_score": np.round(strength, 4).tolist(),
        "labelled": [role.name for role in ROLES if roles.role_values(role) is not None],  # the legend's roles
    }


def patching_of(patching, corrupt_runs: list[AttentionRun], spec: RunSpec) -> dict:
    """The Patching view's data: patch.json's object, the corrupted text's tokens as shown and its every layer's maps
    (L, H, N, N), encoded as the clean text's "layers" are (exact up to MAX_EXACT_VALUES weights)."""
    from attnviz.output.patch_json import patch_record

    full = patch_record(patching, spec)
    layers = encode_layers([run.attention for run in corrupt_runs])  # (L, H, N, N)
    kept = {name: value for name, value in full.items() if name not in ("format", "version", "settings")} | {"corrupt_layers": layers}
    return kept | ({"edges": edges_of(patching, spec)} if patching.edges is not None else {})


def edges_of(patching, spec: RunSpec) -> dict:
    """The Edges view's data: edges.json's object but its every edge's scores, in their place the edges edges.png
    draws (analysis/edges.DRAWN of largest |score|), each as edges.json's checked entries are, path_patched
    where it was checked (else null)."""
    from attnviz.analysis.edges import DRAWN, node_name, receiver_name
    from attnviz.output.edges_json import edges_record

    edges = patching.edges
    full = edges_record(patching, spec)
    checked = {edge: patched for edge, _, patched in edges.checked}
    top = [
        {
            "sender": node_name(*edge.sender), "sender_layer": edge.sender[0], "sender_head": edge.sender[1],
            "receiver": receiver_name(edge, edges.grouped), "receiver_layer": edge.layer, "receiver_head": edge.head,
            "input": edge.input, "score": round(edges.score(edge), 6),
            "path_patched": None if edge not in checked else round(float(checked[edge]), 6),
        }
        for edge in edges.ranked(DRAWN)
    ]  # fmt: skip
    return {name: value for name, value in full.items() if name not in ("format", "version", "settings", "scores")} | {"top": top}


def generation_of(generation, rows_are: str = "chosen") -> dict:
    """The Generation view's data: the prompt's and the continuation's tokens and ids, every layer's query_rows
    (L, H, n + 1, P + n: the rows of positions P - 1 .. P + n - 1, from which the view takes both rows of each
    generated token), exact up to MAX_EXACT_VALUES weights, else on the log scale's 256 levels, and rows_are, the
    rows it shows first, with the words of both (analysis.generation.ROWS)."""
    from attnviz.analysis.generation import ROWS

    rows = generation.query_rows
    return {
        "prompt_length": generation.num_prompt,
        "tokens": generation.shown_tokens,
        "ids": generation.prompt_ids + generation.ids,
        "continuation": generation.continuation,
        "sample": generation.sample,
        "seed": generation.seed,
        "rows_are": rows_are,
        "rows_words": ROWS,
        "query_rows": encode_exact(rows) if rows.size <= MAX_EXACT_VALUES else encode_quantised(rows),
    }


def differences_of(differences, spec: RunSpec) -> dict:
    """The Diff view's data: diff.json's object, its words for the other side, and the most changed heads' two maps
    each (exact, 4 decimals), as [{layer, head, model, against}]."""
    from attnviz.analysis.diff import against_words
    from attnviz.output.summaries_json import differences_record

    full = differences_record(differences, spec)
    maps = [
        {"layer": layer, "head": head, "model": encode_exact(ours), "against": encode_exact(theirs)}
        for (layer, head), (ours, theirs) in differences.maps.items()
    ]
    return {name: value for name, value in full.items() if name not in SUMMARIES_LEFT_OUT} | {
        "against_words": against_words(differences), "maps": maps
    }


class FileRows:
    """A map on disk (a run's np.memmap (H, Nq, Nk)) read by plain file reads (run_data.map_rows): fileRows[head][r0:r1]
    is (r1 - r0, Nk), read anew, so that the pages read are the page cache's, not the process's resident memory."""

    def __init__(self, mapped: np.memmap):
        self.mapped, self.shape = mapped, mapped.shape  # the memmap kept: its file goes when it does (run_data.MapFile)

    @staticmethod
    def of(attention):
        """attention itself unless it is a memmap of a file (a run's map on disk)."""
        return FileRows(attention) if isinstance(attention, np.memmap) and attention.filename else attention

    def __getitem__(self, head: int) -> "_HeadRows":
        return _HeadRows(self.mapped, head)


class _HeadRows:
    def __init__(self, mapped: np.memmap, head: int):
        self.mapped, self.head, self.shape = mapped, head, mapped.shape[1:]

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("rows are read as one contiguous slice")
        return map_rows(self.mapped, self.head, start, stop)


def summaries_of(summaries, spec: RunSpec) -> dict | None:
    """A long text's summaries of every layer: summaries.json's object but what the record holds already (SUMMARIES_LEFT_OUT)."""
    if summaries is None:
        return None
    from attnviz.output.summaries_json import summaries_record

    full = summaries_record(summaries, replace(spec, layer=None))
    return {name: value for name, value in full.items() if name not in SUMMARIES_LEFT_OUT}


def report_record(
    texts: list[ReportText], spec: RunSpec, *, kind: str, num_layers: int, notes: list[str] = (), advance=lambda done: None
) -> dict:
    """The report's data (docs/formats.md, "report.html"): the run's settings and one record per text.

    kind: the model's kind ("encoder", "decoder", "encoder-decoder"); num_layers: its layers (of
    the stack shown); notes: what the run printed as notes, in order, without repeats; advance(1) as each text's
    record is made (its weights encoded: seconds for a long text).
    """
    first = texts[0].run
    if any(is_long(text.run) for text in texts):
        notes = [*notes, LONG_TEXT_NOTE]
    return {
        "format": "attnviz-report",
        "version": FORMAT_VERSION,
        "settings": spec.to_dict(),
        "attnviz_version": __version__,
        "family": first.family,
        "kind": kind,
        "num_layers": num_layers,
        "num_heads": first.num_heads,
        "num_kv_heads": first.num_kv_heads or first.num_heads,
        "kv_group_colors": list(KV_GROUP_COLORS),  # the model view frames each key/value head's group as heads.png does
        "head_dim": first.head_dim,
        "weights_rounding": WEIGHTS_ROUNDING,
        "notes": list(dict.fromkeys([*notes, *(note for text in texts for note in text.run.notes)])),
        "texts": [_counted(text_record(text, spec), advance) for text in texts],
    }


def _counted(record: dict, advance) -> dict:
    advance(1)
    return record

"""attention.json: the machine-readable record of a run (format documented in docs/formats.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnviz.analysis.statistics import run_causal_note
from attnviz.run_data import AttentionRun, truncation_json
from attnviz.spec import RunSpec

FORMAT_VERSION = 1
PYTHON_SAVE = " (in Python: result.save(folder))"  # how a map not saved is saved from the API, in attention.json's note
DECIMALS = 7  # float32 weights rounded to 1e-7: far below the 1e-5 the tests hold them to


def attention_record(run: AttentionRun, spec: RunSpec, measures=None, effects=None) -> dict:
    """attention.json's object but its weights; measures (analysis.measures.RunMeasures, --measure) adds "measures",
    effects (analysis.effect.HeadEffects, --effect) "effects"."""
    return {
        "format": "attnviz-attention",
        "version": FORMAT_VERSION,
        "settings": spec.to_dict(),
        "text": run.text,
        "kv_text": run.kv_text,
        "truncated": truncation_json(run.truncated),
        "kv_truncated": truncation_json(run.kv_truncated),
        "model": run.model,
        "fallback": run.fallback_for is not None,  # the model loaded in place of the one asked for (offline: the bundled one)
        "fallback_for": run.fallback_for,  # the model asked for, when "fallback"
        "unknown_tokens": run.unknown.to_dict() if run.unknown is not None else None,
        "kv_unknown_tokens": run.kv_unknown.to_dict() if run.kv_unknown is not None else None,
        "layer": run.layer,
        "weights": run.weights,
        "num_heads": run.num_heads,
        "head_dim": run.head_dim,
        "num_kv_heads": run.num_kv_heads or run.num_heads,  # fewer than num_heads: grouped-query attention
        "kv_head_of_head": [head // run.group_size for head in range(run.num_heads)],  # the key/value head each head reads
        "model_heads": run.model_heads,  # the model's own head count
        "re_split": run.re_split,  # the model's projections split into num_heads heads by --heads, not its own
        "quantisation": run.quantisation.to_dict() if run.quantisation is not None else None,  # weights stored quantised
        "device": run.device,
        **({"dtype": run.dtype} if run.dtype != "float32" else {}),  # computed in half precision (--dtype); absent: float32
        "causal": run.causal,
        "causal_note": run_causal_note(run),
        "query_tokens": run.query_tokens,
        "key_tokens": run.key_tokens,
        "shown_query_tokens": run.shown_tokenizer_tokens[0],  # as figures and tables show them (models/shown.py): 我¹/₂, ␣cat
        "shown_key_tokens": run.shown_tokenizer_tokens[1],
        "query_ids": run.query_ids,
        "key_ids": run.key_ids,
        **(words_record(run) if run.words is not None else {}),
        **({"measures": measures_record(measures)} if measures is not None and measures.names else {}),
        **({"effects": effects_record(effects, effects.layers)} if effects is not None else {}),
        "attention": None,  # written by weights_json: the last key, so it can go in at the end
    }


def effects_record(effects, layers: list[int]) -> dict:
    """The "effects" of attention.json (one layer's heads) or of effects.json (every layer): what was taken out and
    how, what each number means, and per name the model has (EFFECTS: a decoder's kl and loss, an encoder's cosine
    and pooled) (L', H) values of `layers`, rounded."""
    from attnviz.analysis.effect import ABLATIONS, EFFECTS, PAPER

    return {
        "ablation": effects.ablation,
        "ablation_definition": ABLATIONS[effects.ablation],
        "paper": PAPER,
        **({"stack": effects.stack} if effects.stack is not None else {}),
        **({"pooling": effects.pooling} if effects.pooling is not None else {}),
        "definitions": {name: EFFECTS[name][2] for name in effects.names},
        "short_names": {name: EFFECTS[name][0] for name in effects.names},  # as the tables and titles name them
        **({"loss_with_every_head": round(effects.loss, DECIMALS)} if effects.loss is not None else {}),
        "layers": layers,
        **{name: np.round(effects.values[name][layers], DECIMALS).tolist() for name in effects.names},
    }


def words_record(run: AttentionRun) -> dict:
    """A run over words (--words): the tokens stay tokens, the words and each token's word are added, and
    "attention" (H, Wq, Wk) is over the words (docs/formats.md, "attention.json")."""
    words = run.words
    return {
        "query_tokens": words.query_tokens,
        "key_tokens": words.key_tokens,
        "query_ids": words.query_ids,
        "key_ids": words.key_ids,
        "query_words": words.query_plain_words,  # as in the text
        "key_words": words.key_plain_words,
        "query_words_shown": run.query_tokens,  # as labelled: what the model saw beside a word it did not read ("想 [UNK]")
        "key_words_shown": run.key_tokens,
        "query_token_words": words.query_word,  # the index in query_words of each query token's word
        "key_token_words": words.key_word,
        "attention_over": "words",
    }


def write_attention_files(
    run: AttentionRun, spec: RunSpec, folder: Path, measures=None, save_map: bool = True, effects=None
) -> list[Path]:
    """attention.json in folder, and beside it attention.npy when the run's map is one (a long text: run_data.MapFile)
    and save_map (`heads --save-map`; a Python result's save)."""
    from attnviz.run_data import MAP_FILE

    written = write_attention_json(run, spec, folder / "attention.json", measures, save_map, effects)
    return [written, *([folder / MAP_FILE] if run.map_on_disk and save_map else [])]


def map_file_record(run: AttentionRun, saved: bool = True) -> dict:
    """attention.json's fields for a map on disk (a long text): "attention" itself is null, and "attention_file"
    names attention.npy; a map not saved (`heads` without --save-map) has "attention_file" null and a note instead."""
    from attnviz.run_data import MAP_FILE, map_bytes

    shape = {"attention_shape": list(run.attention.shape), "attention_dtype": "float32"}
    if saved:
        return {"attention_file": MAP_FILE, **shape, "attention": None}
    return {"attention_file": None, **shape, "attention_note": map_not_saved(map_bytes(run.attention)) + PYTHON_SAVE, "attention": None}


def map_not_saved(num_bytes: int, count: int = 1) -> str:
    """The line that says long texts' maps (count of them, num_bytes in all) were not saved, and how to get them."""
    size = f"{num_bytes / 1e6:,.0f} MB"
    if count == 1:
        return f"the whole map ({size}) was not saved; --save-map writes attention.npy"
    return f"the whole maps of {count} long texts ({size}) were not saved; --save-map writes each one's attention.npy"


def write_attention_json(run: AttentionRun, spec: RunSpec, path: Path, measures=None, save_map: bool = True, effects=None) -> Path:
    """attention.json; measures (analysis.measures.RunMeasures, --measure) adds "measures" before "attention",
    effects (analysis.effect.HeadEffects, --effect) "effects".

    A map on disk (a long text) is named, not written: its shape and dtype, "attention" null, and with
    save_map, attention.npy put beside (run_data.place_map); without, "attention_file" null and a note.
    """
    from attnviz.run_data import place_map

    if run.map_on_disk:
        if save_map:
            place_map(run.attention, path.parent)
        record = {**attention_record(run, spec, measures, effects), **map_file_record(run, saved=save_map)}
        path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
        return path
    record = json.dumps(attention_record(run, spec, measures, effects), ensure_ascii=False)
    attention = weights_json(run.attention)
    path.write_text(record.removesuffix("null}") + attention + "}", encoding="utf-8")
    return path


def weights_json(weights: np.ndarray, decimals: int = DECIMALS) -> str:
    """JSON nested lists of an array of weights in [0, 1], each with `decimals` decimals: "[[0.2500000,0.7500000]]".

    The same numbers as json.dumps(np.round(weights, decimals).tolist()), written by numpy a
    digit at a time, several times faster than json.dumps (bench/RESULTS.md, "Timings behind the code").
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.size and not (weights.min() >= 0 and weights.max() <= 1):  # also refuses NaN
        raise ValueError("weights_json writes numbers in [0, 1] only")
    scaled = np.rint(weights * 10**decimals).astype(np.uint32)  # (..., N): 0 to 10**decimals
    chars = np.full((*scaled.shape, decimals + 3), ord(","), dtype=np.uint8)  # each number as "d.ddddddd,"
    chars[..., 1] = ord(".")
    for position in [*range(decimals + 1, 1, -1), 0]:  # the last decimal first, the units digit last
        chars[..., position] = scaled % 10 + ord("0")
        scaled //= 10
    rows = chars.reshape(-1, chars.shape[-2] * chars.shape[-1])  # one line of numbers per row
    texts = ["[" + row.tobytes()[:-1].decode() + "]" for row in rows]  # without the last comma
    for size in reversed(weights.shape[:-1]):  # rows into their lists, outermost last
        texts = ["[" + ",".join(texts[start : start + size]) + "]" for start in range(0, len(texts), size)]
    return texts[0]


def measures_record(measures, decimals: int = DECIMALS) -> dict:
    """The "measures" of attention.json (heads --measure: analysis.measures.RunMeasures, maps of the run's
    layer) or of measures.json (layers --measure: LayersMeasures, maps with a leading layer axis): per
    measure its name, title, paper and definition, and its maps over the run's tokens or words, rounded."""
    from attnviz.analysis.measure_names import MEASURES

    def rounded(values) -> list:
        return np.round(np.asarray(values, dtype=np.float64), decimals).tolist()

    norm_heads = getattr(measures, "norm_heads", None)  # per head: heads --measure only
    flow_layers = getattr(measures, "flow_layers", None)  # through layers 0..L of the run; layers: every one
    maps = {
        "norm": lambda: {**({"heads": rounded(norm_heads)} if norm_heads is not None else {}), "summed": rounded(measures.norm)},
        "value-zeroing": lambda: {"distances": rounded(measures.value_zeroing), "rows": rounded(measures.value_zeroing_rows)},
        "flow": lambda: {
            **({"layers": [0, flow_layers - 1]} if flow_layers else {}),
            "flow": rounded(measures.flow.flow),
            "normalised": rounded(measures.flow.normalised),
        },
    }
    record = {}
    for name in measures.names:
        title, paper, definition = MEASURES[name]
        record[name] = {"name": name, "title": title, "paper": paper, "definition": definition, **maps[name]()}
    return record

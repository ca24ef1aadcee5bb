"""attnviz.why and what it returns: why a head attends, its score of one (query, key) split into query part x key part
terms (analysis/why.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.api import display
from attnviz.api.arguments import must_be_int
from attnviz.api.checks import _check_lengths, _texts, refuse_before_loading
from attnviz.api.options import WHY_OPTIONS, run_options, takes_options
from attnviz.api.run_results import Rendered, save_run_files
from attnviz.errors import AttnvizError, option
from attnviz.spec import RunSpec

TOP_TERMS = 10  # the terms the table shows, largest first


@takes_options(WHY_OPTIONS)
def why(text: str, *, head: int, query: int, key: int | None = None, **options):
    """Why head `head` of the layer (options' layer) attends from token `query` to token `key` of text (a WhyResult): the pre-softmax
    score split exactly into terms, each a part of the query's residual stream x a part of the key's (the
    embeddings, each earlier layer's heads one by one, each MLP, the biases), through the norms with each position's
    scale frozen, W_Q or W_K and RoPE (analysis/why.py). key None: the key the head weighs most from that query.
    Pre-norm decoders (Llama, Qwen, SmolLM2, GPT-2) and post-norm encoders (BERT, RoBERTa, XLM-RoBERTa, ELECTRA,
    DistilBERT, ALBERT); one pass of the model. BART's and Marian's encoder and decoder self-attentions (stack), and the
    cross-attention of T5, BART and Marian with stack="cross" (analysis/why_cross.py): query
    a decoder token, key an encoder token of kv (the source text; default: text itself), the decoder's parts × the
    encoder's. options: model, layer (default 0), kv, stack, device, dtype, truncate, allow_pickle.
    """
    from attnviz.analysis.why import score_terms, splits_post_norm, splits_pre_norm
    from attnviz.analysis.why_cross import cross_score_terms, refuse_cross, self_score_terms, splits_cross
    from attnviz.layer_inputs import check_layer, encode_texts

    options = run_options("why", options, WHY_OPTIONS)
    (text,) = _texts(text, one=True)
    layer = options.layer
    for name, value in (("head", head), ("query", query)):
        if must_be_int(name, value) < 0:
            raise AttnvizError(f"{option(name, value)}: a {name} is counted from 0")
    if must_be_int("key", key, none=True) is not None and key < 0:
        raise AttnvizError(f"{option('key', key)}: a key is counted from 0")
    refuse_before_loading(options)
    handle = options.load()
    loaded = handle.loaded
    cross = options.stack == "cross"
    if cross:
        refuse_cross(loaded)
    elif options.kv is not None:
        raise AttnvizError("--kv: why splits the model's own attention, whose keys are its text's (--kv with --stack cross: the encoder's source text)")
    elif loaded.family.cross_attention_norm is not None:  # T5: its self-attentions add a relative position bias
        raise AttnvizError(
            f"why splits {loaded.family.name}'s cross-attention (--stack cross), not its {options.stack or 'encoder'}'s self-attention: "
            "the relative position bias its scores add is not split yet"
        )
    elif not (splits_pre_norm(loaded) or splits_post_norm(loaded) or splits_cross(loaded)):
        raise AttnvizError(f"why splits the scores of pre-norm decoders (Llama, Qwen, SmolLM2, GPT-2) and of post-norm encoders (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT), not {loaded.family.name}'s")
    check_layer(loaded, layer, options.stack)
    num_heads = loaded.num_heads_of(options.stack)
    if head >= num_heads:
        raise AttnvizError(f"head {head} is out of range: {loaded.name} has heads 0 to {num_heads - 1}")
    _check_lengths(loaded, [text], options.truncate)
    spec = options.run_spec(handle)
    encoded = encode_texts(loaded, [text], spec)
    counts = {"query": len(encoded.queries.ids[0]), "key": len((encoded.keys or encoded.queries).ids[0])}
    for name, value in (("query", query), ("key", key)):
        count = counts[name]
        if value is not None and value >= count:
            read = ("the decoder" if name == "query" else "the encoder") if cross else "the model"
            raise AttnvizError(f"{option(name, value)} is past the text: it is {count} tokens as {read} reads it (0 to {count - 1})")
    if key is not None and spec.causal and key > query:
        raise AttnvizError(f"key {key} comes after query {query}: under the causal mask its weight is 0 and it has no score to split")
    if cross:
        split = cross_score_terms(loaded, encoded, spec, head, query, key)
    elif splits_cross(loaded):  # BART's and Marian's encoder and decoder self-attentions: the post-norm walks of cross's sides
        split = self_score_terms(loaded, encoded, spec, head, query, key)
    else:
        split = score_terms(loaded, encoded, spec, layer, head, query, key)
    return WhyResult(split, spec, text, loaded.name)


@dataclass(frozen=True, repr=False)
class WhyResult:
    """terms (analysis.why.ScoreTerms): .score, .weight, .query_parts, .key_parts, .terms (P_q, P_k); .top(n) the
    largest terms."""

    terms: Any  # analysis.why.ScoreTerms
    spec: RunSpec
    text: str
    model: str = ""  # the model's name, as its figures title it

    @property
    def score(self) -> float:
        return self.terms.score

    @property
    def weight(self) -> float:
        return self.terms.weight

    def top(self, count: int = TOP_TERMS) -> list[tuple[str, str, float]]:
        """The `count` terms of largest size: (query part, key part, term), largest first (a tie to the earlier pair)."""
        t = self.terms
        order = np.argsort(-np.abs(t.terms), axis=None, kind="stable")[:count]
        return [(t.query_parts[i], t.key_parts[j], float(t.terms[i, j])) for i, j in zip(*np.unravel_index(order, t.terms.shape))]

    def sides(self, side: str, count: int = 3) -> list[tuple[str, float]]:
        """The `count` parts of one side ("query" or "key") that add most to the score, each with its terms summed over
        the other side's parts (its row's or column's sum), largest first: which part of the key, say, the head reads."""
        t = self.terms
        totals, names = (t.terms.sum(axis=1), t.query_parts) if side == "query" else (t.terms.sum(axis=0), t.key_parts)
        order = np.argsort(-totals, kind="stable")[:count]
        return [(names[index], float(totals[index])) for index in order]

    def figure(self):
        """why.png: the term matrix, the parts of largest terms on each side, the rest of each side summed."""
        from attnviz.render.why_figures import why_figure

        return why_figure(self.terms, self.model)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz why --out folder` writes: why.<format> and why.json."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        import json

        from attnviz.render.why_figures import write_why_figure

        figure = write_why_figure(self.terms, self.model, folder, format)
        path = folder / "why.json"
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return [figure, path]

    def to_dict(self) -> dict:
        """why.json's content: every term, as float64 written out (repr), so that they add up to the score."""
        t = self.terms
        return {
            "format": "attnviz-why", "version": 1, "settings": self.spec.to_dict(), "text": self.text, "tokens": t.tokens,
            "layer": t.layer, "head": t.head, "query": t.query, "key": t.key,
            "query_token": t.query_token, "key_token": t.key_token, "score": t.score, "weight": t.weight,
            "query_parts": t.query_parts, "key_parts": t.key_parts, "terms": t.terms.tolist(),
        } | ({"key_tokens": t.key_tokens} if t.key_tokens is not None else {})  # fmt: skip

    def __rich_console__(self, console, options):
        from attnviz.render.why_figures import print_terms

        printed = display.Printed(options.max_width)
        print_terms(printed, self.terms, self.top(), {side: self.sides(side) for side in ("query", "key")})
        yield printed.group()

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        t = self.terms
        rows = [[q, k, display.number(term, 4), display.number(term / t.score, 3) if t.score else "n/a"] for q, k, term in self.top()]
        caption = f"the largest terms of the score {display.number(t.score, 4)} (weight {display.number(t.weight, 4)})"
        parts = [display.figure_html(self.figure(), "query part × key part"), display.table_html(["query part", "key part", "term", "share"], rows, caption)]
        return display.result_html(f"layer {t.layer} head {t.head}: {t.shown_query} → {t.shown_key}", *parts)

    def __repr__(self) -> str:
        from attnviz.render.titles import counted

        t = self.terms
        return f"<attnviz.WhyResult layer {t.layer} head {t.head}, query {t.query} key {t.key}: score {t.score:.4f} in {counted(t.terms.size, 'term')}>"

"""The report's record of why a head attends (html/record.py "why", analysis/why.py cell_splits): its layer's scores
split at write time, cell by cell, from the capture the report already has (no pass of its own).

Each cell's terms in the record, decoded here with base64, zlib and NumPy, are attnviz.why's largest terms of that
cell, in its order, within 1e-6 or float32's rounding (the record holds them as float32); its terms and its rest add up to the score attnviz's
layer computed (1e-5); every cell up to EVERY_CELL_TOKENS tokens, each query's top key past it, none past CELL_TOKENS.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnviz
from attnviz.analysis.why import CELL_TOKENS, EVERY_CELL_TOKENS, TOP_TERMS
from attnviz.html.encoding import decode_weights

TEXT = "The cat sat on the mat because it was tired. The cat sat"


def why_record(report) -> dict:
    (text,) = report.record["texts"]
    return text


FLOAT32_ROUNDING = 2.0**-24  # half a float32 ulp, relative


def decoded_cells(why: dict) -> dict:
    return {name: decode_weights(why[name]) for name in ("pairs", "terms", "rest", "scores")}


def cell_of(why: dict, num_tokens: int, query: int, key: int) -> int:
    """The record's cell of (query, key), row by row: every key of each query, or under a causal mask its keys up to
    itself (why_terms.js reads the same)."""
    return query * (query + 1) // 2 + key if why["cells"] == "causal" else query * num_tokens + key


def assert_cell_is_whys(why: dict, arrays: dict, cell: int, expected) -> None:
    """The record's cell against attnviz.why's result of the same (layer, head, query, key)."""
    head = expected.terms.head
    pairs = arrays["pairs"][head, cell].astype(int)
    named = [(why["query_parts"][a], why["key_parts"][b]) for a, b in pairs]
    top = expected.top(TOP_TERMS)
    assert named == [(q, k) for q, k, _ in top]
    # held as float32: within 1e-6, or float32's own rounding of a larger value
    assert arrays["terms"][head, cell] == pytest.approx([term for _, _, term in top], abs=1e-6, rel=FLOAT32_ROUNDING)
    assert arrays["scores"][head, cell] == pytest.approx(expected.score, abs=1e-6, rel=FLOAT32_ROUNDING)
    assert arrays["rest"][head, cell] == pytest.approx(expected.terms.total - sum(term for _, _, term in top), abs=1e-6, rel=FLOAT32_ROUNDING)
    assert why["num_terms"] == expected.terms.terms.size
    # the terms and the rest add up to the score attnviz's layer computed
    score = arrays["scores"][head, cell]
    assert arrays["terms"][head, cell].sum() + arrays["rest"][head, cell] == pytest.approx(score, abs=1e-5 * max(1.0, abs(score)))


@pytest.mark.parametrize("layer", [0, 1])
def test_a_decoders_record_holds_every_cells_largest_terms_as_attnviz_why_splits_them(decoder_folder, layer):
    """The tiny grouped-query Llama (RoPE, 6 heads over 2 key/value heads), 16 tokens: every cell of the causal map
    that has a score, each query's keys up to itself (a future key's weight is 0: the record leaves it out)."""
    model = attnviz.load(str(decoder_folder), device="cpu")
    text = why_record(attnviz.report(TEXT, model=model, layer=layer))
    why = text["why"]
    num_tokens = len(text["query_tokens"])
    assert why["layer"] == layer and why["cells"] == "causal" and why["keys"] is None
    arrays = decoded_cells(why)
    assert arrays["scores"].shape == (6, num_tokens * (num_tokens + 1) // 2)
    for head, query, key in ((0, 0, 0), (4, 11, 3), (5, 15, 15), (2, 9, 8)):
        assert_cell_is_whys(why, arrays, cell_of(why, num_tokens, query, key), attnviz.why(TEXT, model=model, layer=layer, head=head, query=query, key=key))
    assert np.isfinite(arrays["scores"]).all()  # no masked cell: every cell held has a score


def test_the_bundled_berts_record_splits_every_cell_through_its_post_norms(model):
    """attnviz's own BERT, layer 3: the parts through the embeddings' norm and three layers' two norms each."""
    text = why_record(attnviz.report(TEXT, model=model, layer=3))
    why = text["why"]
    num_tokens = len(text["query_tokens"])
    arrays = decoded_cells(why)
    assert why["cells"] == "every" and len(why["query_parts"]) == 4 + 3 * 16 + 1  # the embeddings' 4, each layer's 16, W_Q's bias
    for head, query, key in ((0, 1, 5), (7, 12, 0), (11, num_tokens - 1, num_tokens - 1)):
        assert_cell_is_whys(why, arrays, cell_of(why, num_tokens, query, key), attnviz.why(TEXT, model=model, layer=3, head=head, query=query, key=key))


def test_past_every_cells_length_each_querys_top_key_and_past_its_bound_none(model):
    """A text past EVERY_CELL_TOKENS tokens: each query's top key (the key attnviz.why splits when given none); past
    CELL_TOKENS the record says why it holds no split."""
    longer = " ".join(["the cat sat on the mat"] * 7)  # 44 tokens
    text = why_record(attnviz.report(longer, model=model, layer=2))
    num_tokens = len(text["query_tokens"])
    assert EVERY_CELL_TOKENS < num_tokens <= CELL_TOKENS
    why = text["why"]
    arrays = decoded_cells(why)
    assert why["cells"] == "top key" and arrays["scores"].shape == (model.num_heads, num_tokens)
    for head, query in ((1, 0), (6, 20), (10, num_tokens - 1)):
        expected = attnviz.why(longer, model=model, layer=2, head=head, query=query)
        assert why["keys"][head][query] == expected.terms.key
        assert_cell_is_whys(why, arrays, query, expected)
    longest = " ".join(["the cat sat on the mat"] * 11)  # past 64 tokens
    assert why_record(attnviz.report(longest, model=model))["why"] == {
        "none": f"past {CELL_TOKENS} tokens the report holds no splits of the scores: attnviz why splits any cell"
    }


def test_a_map_that_is_not_the_models_attention_holds_no_split_and_says_why(model):
    random = why_record(attnviz.report(TEXT, model=model, weights="random"))
    assert "is not the model's own self-attention" in random["why"]["none"]
    words = why_record(attnviz.report(TEXT, model=model, words=True))
    assert words["why"] == {"none": "this map is over words (--words): why splits the score of a token"}


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")

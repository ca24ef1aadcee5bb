"""The measures over words (analysis/word_measures.py, --words --measure), each against a computation written
out here: the per-head vectors built from the layer's nn.Linear weights and summed over a word's pieces,
the layer rerun with all of a word's value vectors zeroed, networkx's maximum flow into a word's pieces;
from a query word, the mean over its pieces. With one token per word every map is the token map."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch
from helpers import bert_inputs, per_head_vectors, rerun_with_value_zeroed  # its key may be a word's list of tokens

import attnviz
from attnviz.attention.layer import layer_from_weights
from attnviz.models.words import merge_attention

TOLERANCE = 1e-5
ENGLISH = "The unaffable cat sat, embarrassingly."  # una ##ffa ##ble, em ##bar ##rass ##ingly
CHINESE = "我想吃酸菜鱼"  # 酸菜鱼: one word of three tokens ([UNK] [UNK] [UNK] under the bundled model)
LAYER = 1


def measured(text: str, words: bool, layer: int = LAYER):
    return attnviz.heads(text, model="bundled", device="cpu", layer=layer, measure="all", words=words)


def rows_mean(values: np.ndarray, words: list[int]) -> np.ndarray:
    """(..., N, X) -> (..., W, X): each query word's mean over its pieces, written out."""
    return np.stack([values[..., [i for i, w in enumerate(words) if w == word], :].mean(axis=-2) for word in range(max(words) + 1)], axis=-2)


def pieces_of(words: list[int]) -> list[list[int]]:
    return [[j for j, w in enumerate(words) if w == word] for word in range(max(words) + 1)]


@pytest.mark.parametrize("text", [ENGLISH, CHINESE])
def test_word_norms_are_the_norms_of_the_words_summed_vectors(bundled_bert, text):
    result = measured(text, words=True)
    words = result.run.words
    x = bert_inputs(bundled_bert, text)[LAYER]
    vectors = per_head_vectors(bundled_bert.model.encoder.layer[LAYER], x, bundled_bert.num_heads)  # (H, N, N, D)
    word_vectors = torch.stack([vectors[:, :, pieces].sum(dim=2) for pieces in pieces_of(words.key_word)], dim=2)  # (H, N, Wk, D)
    expected_heads = rows_mean(word_vectors.norm(dim=-1).numpy(), words.query_word)
    expected_summed = rows_mean(word_vectors.sum(dim=0).norm(dim=-1).numpy(), words.query_word)
    np.testing.assert_allclose(result.measures.norm_heads, expected_heads, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(result.measures.norm, expected_summed, atol=TOLERANCE, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("text", [ENGLISH, CHINESE])
def test_word_value_zeroing_reruns_the_layer_with_all_its_pieces_zeroed(bundled_bert, text):
    result = measured(text, words=True)
    words = result.run.words
    layer = layer_from_weights(bundled_bert.model.encoder.layer[LAYER].attention_weights()).eval()
    x = bert_inputs(bundled_bert, text)[LAYER].float()[None]
    with torch.no_grad():
        original = layer(x, x, x)[0][0].double()
    columns = [
        1 - torch.nn.functional.cosine_similarity(original, rerun_with_value_zeroed(layer, x, x, pieces).double(), dim=-1)
        for pieces in pieces_of(words.key_word)
    ]
    expected = rows_mean(torch.stack(columns, dim=-1).numpy(), words.query_word)
    np.testing.assert_allclose(result.measures.value_zeroing, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(result.measures.value_zeroing_rows, expected / expected.sum(axis=1, keepdims=True), atol=TOLERANCE)


@pytest.mark.slow
def test_word_flow_is_networkx_maximum_flow_into_the_words_pieces():
    text, layer = ENGLISH, 2
    result = measured(text, words=True, layer=layer)
    words = result.run.words
    layer_runs = attnviz.layers(text, model="bundled", device="cpu").layer_runs[: layer + 1]
    num_tokens = len(words.key_tokens)
    graph = nx.DiGraph()
    for depth, layer_run in enumerate(layer_runs):
        mixed = layer_run.attention.astype(np.float64).mean(axis=0) + np.eye(num_tokens)
        mixed /= mixed.sum(axis=1, keepdims=True)
        for i in range(num_tokens):
            for j in range(num_tokens):
                graph.add_edge((depth + 1, i), (depth, j), capacity=float(mixed[i, j]))
    for j, word in enumerate(words.key_word):
        graph.add_edge((0, j), ("word", word))  # no capacity: unlimited
    top = len(layer_runs)
    flows = np.array(
        [[nx.maximum_flow_value(graph, (top, i), ("word", w)) for w in range(max(words.key_word) + 1)] for i in range(num_tokens)]
    )
    np.testing.assert_allclose(result.measures.flow.flow, rows_mean(flows, words.query_word), atol=TOLERANCE, rtol=0)


@pytest.mark.slow
def test_with_one_token_per_word_every_measure_is_the_token_measure():
    text = "the cat sat on the mat"  # six words, six tokens
    over_words, over_tokens = measured(text, words=True), measured(text, words=False)
    assert over_words.run.words.query_word == list(range(8))
    for name in ("norm_heads", "norm", "value_zeroing", "value_zeroing_rows"):
        np.testing.assert_allclose(getattr(over_words.measures, name), getattr(over_tokens.measures, name), atol=1e-9, rtol=0)
    np.testing.assert_allclose(over_words.measures.flow.flow, over_tokens.measures.flow.flow, atol=1e-12, rtol=0)


def test_a_words_norm_is_at_most_the_sum_of_its_pieces_norms():
    """The triangle inequality, so merging the token norms by Clark's rule would overstate every word of several pieces."""
    over_words, over_tokens = measured(ENGLISH, words=True), measured(ENGLISH, words=False)
    words = over_words.run.words
    merged = merge_attention(over_tokens.measures.norm_heads, words.query_word, words.key_word)  # sums of the pieces' norms
    assert np.all(over_words.measures.norm_heads <= merged + 1e-9)
    assert np.any(over_words.measures.norm_heads < merged - 1e-3)  # and strictly less for some: the vectors do not align

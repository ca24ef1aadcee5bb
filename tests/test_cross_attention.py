"""`heads --kv`: queries from one text, keys and values from another; rectangular maps, both token lists."""

import json

import numpy as np
import pytest
import torch

from attnviz.cli import run
from attnviz.pipeline import run_attention
from attnviz.render import heatmap
from attnviz.spec import run_spec

TOLERANCE = 1e-5
QUERIES = "The cat sat on the mat."  # 9 tokens
KEYS = "The animal didn't cross the street because it was too tired."  # 16 tokens


@pytest.fixture(scope="module")
def cross(bundled_bert):
    (result,) = run_attention(bundled_bert, [QUERIES], run_spec(bundled_bert, kv_text=KEYS, layer=3))
    return result


def reference_cross_attention(reference, layer):
    """softmax(Q K^T / sqrt(d)) per head, from transformers' hidden states and layer weights, in torch."""
    tokenizer, model = reference
    with torch.no_grad():
        states = [
            model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states[layer][0]
            for text in (QUERIES, KEYS)
        ]  # (Nq, D), (Nk, D)
        projections = model.encoder.layer[layer].attention.self
        q, k = projections.query(states[0]), projections.key(states[1])  # (Nq, D), (Nk, D)
        num_heads = model.config.num_attention_heads
        head_dim = q.shape[-1] // num_heads
        q = q.view(-1, num_heads, head_dim).transpose(0, 1)  # (H, Nq, d)
        k = k.view(-1, num_heads, head_dim).transpose(0, 1)  # (H, Nk, d)
        return (q @ k.transpose(1, 2) / head_dim**0.5).softmax(-1).numpy()  # (H, Nq, Nk)


def test_cross_attention_is_each_query_against_the_other_texts_keys(cross, reference_bert):
    tokenizer, _ = reference_bert
    assert cross.attention.shape == (12, 9, 16)
    assert cross.query_tokens == tokenizer.convert_ids_to_tokens(tokenizer(QUERIES)["input_ids"])
    assert cross.key_tokens == tokenizer.convert_ids_to_tokens(tokenizer(KEYS)["input_ids"])
    assert cross.kv_text == KEYS and cross.text == QUERIES
    np.testing.assert_allclose(cross.attention, reference_cross_attention(reference_bert, 3), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(cross.attention.sum(-1), 1, atol=TOLERANCE)
    assert cross.output.shape == (9, 384)  # one output per query


def test_the_heatmap_labels_rows_with_query_tokens_and_columns_with_key_tokens(cross):
    figure = heatmap.head_figure(cross, 0)
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == cross.shown_tokens[0]  # as shown: "␣cat" (models/shown.py)
    assert [label.get_text() for label in ax.get_xticklabels()] == cross.shown_tokens[1]
    assert cross.shown_tokens[0] != cross.shown_tokens[1]
    assert ax.images[0].get_array().shape == (9, 16)  # Nq rows, Nk columns
    width, height = figure.get_size_inches()
    assert width > height  # 16 key columns, 9 query rows


@pytest.mark.slow
def test_heads_kv_end_to_end(tmp_path, capsys, bundled_bert):
    assert run(["heads", QUERIES, "--kv", KEYS, "--layer", "3", "--model", "bundled", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "attention.json").read_text(encoding="utf-8"))
    (expected,) = run_attention(bundled_bert, [QUERIES], run_spec(bundled_bert, kv_text=KEYS, layer=3))
    assert record["text"] == QUERIES and record["kv_text"] == KEYS
    assert record["query_tokens"] == expected.query_tokens and len(record["query_tokens"]) == 9
    assert record["key_tokens"] == expected.key_tokens and len(record["key_tokens"]) == 16
    assert record["query_ids"] == expected.query_ids and record["key_ids"] == expected.key_ids
    np.testing.assert_allclose(np.array(record["attention"]), expected.attention, atol=TOLERANCE, rtol=0)
    assert (tmp_path / "heads.png").exists() and (tmp_path / "head_11.png").exists()
    shown = capsys.readouterr().out
    assert "query tokens" in shown and "key/value tokens" in shown and "animal" in shown


@pytest.mark.parametrize(
    "kv, message",
    [
        ("", "error: the --kv text is empty: give some words to attend over\n"),
        ("word " * 600, "error: the text has 602 tokens, more than the model's 512 positions; shorten it or pass --truncate\n"),
    ],
)
def test_a_bad_kv_text_is_one_line_exit_2_and_writes_nothing(kv, message, tmp_path, capsys):
    assert run(["heads", QUERIES, "--kv", kv, "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == message
    assert list(tmp_path.iterdir()) == []

"""--words on the commands (heads, layers, trace, report) and words=True in the API: every word map is
the token map merged by hand here (sum over a word's key pieces, mean over its query pieces), the
labels are the words, the tokens stay in the JSON, and the trace's tensors stay over tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
from attnviz.analysis.rollout import attention_rollout
from attnviz.cli import run

CHINESE = "我想吃酸菜鱼"
CHINESE_WORDS = ["[CLS]", "我", "想", "吃", "酸菜鱼", "[SEP]"]
# The bundled all-MiniLM reads only 我: each word the model saw as [UNK] is labelled with what it saw.
CHINESE_SHOWN = ["[CLS]", "我", "想 [UNK]", "吃 [UNK]", "酸菜鱼 [UNK]×3", "[SEP]"]
ENGLISH = "The unaffable cat sat."  # unaffable: three WordPiece pieces, una ##ffa ##ble


def merged_by_hand(attention: np.ndarray, query_word: list[int], key_word: list[int]) -> np.ndarray:
    """Clark et al.'s rule cell by cell: (..., Nq, Nk) -> (..., Wq, Wk)."""
    attention = np.asarray(attention, dtype=np.float64)
    words_q, words_k = max(query_word) + 1, max(key_word) + 1
    merged = np.zeros((*attention.shape[:-2], words_q, words_k))
    for a in range(words_q):
        rows = [i for i, word in enumerate(query_word) if word == a]
        for b in range(words_k):
            cols = [j for j, word in enumerate(key_word) if word == b]
            merged[..., a, b] = attention[..., rows, :][..., :, cols].sum(axis=-1).mean(axis=-1)
    return merged


def bundled(**options):
    return dict(model="bundled", device="cpu", **options)


ENGLISH_WORDS = ["[CLS]", "The", "unaffable", "cat", "sat", ".", "[SEP]"]


@pytest.mark.parametrize(
    ("text", "words", "shown"),
    [(CHINESE, CHINESE_WORDS, CHINESE_SHOWN), (ENGLISH, ENGLISH_WORDS, ENGLISH_WORDS)],
)
def test_heads_over_words_merge_the_token_maps_by_clarks_rule(text, words, shown):
    tokens = attnviz.heads(text, **bundled(layer=2))
    merged = attnviz.heads(text, **bundled(layer=2, words=True))
    run = merged.run
    assert run.query_tokens == run.key_tokens == shown
    assert run.words.query_plain_words == run.words.key_plain_words == words
    assert run.words.query_tokens == tokens.run.query_tokens and run.words.query_ids == tokens.run.query_ids
    expected = merged_by_hand(tokens.run.attention, run.words.query_word, run.words.key_word)
    np.testing.assert_allclose(run.attention, expected, atol=1e-6)
    assert run.attention.shape == (12, len(words), len(words))  # square: self-attention
    np.testing.assert_allclose(run.attention.sum(axis=-1), 1.0, atol=1e-5)


def test_smollm2_shows_the_four_chinese_words_as_characters_and_stays_causal(smollm2_cached):
    result = attnviz.heads(CHINESE, model="smollm2", device="cpu", words=True)
    run = result.run
    assert run.query_tokens == ["我", "想", "吃", "酸菜鱼"]  # 16 byte-level pieces, none shown as mojibake
    assert len(run.words.query_tokens) == 16
    assert np.all(np.triu(run.attention, k=1) == 0)  # no word attends to a later word
    np.testing.assert_allclose(run.attention.sum(axis=-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_heads_words_writes_the_words_and_keeps_the_tokens_in_attention_json(tmp_path, capsys):
    assert run(["heads", CHINESE, "--words", "--no-html", "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "w")]) == 0
    assert run(["heads", CHINESE, "--no-html", "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "t")]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    words = json.loads((tmp_path / "w" / "attention.json").read_text(encoding="utf-8"))
    tokens = json.loads((tmp_path / "t" / "attention.json").read_text(encoding="utf-8"))
    assert words["settings"]["words"] is True and tokens["settings"]["words"] is False
    assert words["attention_over"] == "words" and "attention_over" not in tokens
    assert words["query_words"] == words["key_words"] == CHINESE_WORDS
    assert words["query_words_shown"] == words["key_words_shown"] == CHINESE_SHOWN
    assert words["query_tokens"] == tokens["query_tokens"] and words["query_ids"] == tokens["query_ids"]
    assert words["query_token_words"] == [0, 1, 2, 3, 4, 4, 4, 5]
    expected = merged_by_hand(tokens["attention"], words["query_token_words"], words["key_token_words"])
    np.testing.assert_allclose(words["attention"], expected, atol=1e-6)
    assert "4 酸菜鱼 = [UNK] [UNK] [UNK]" in shown  # the terminal lists each word's tokens


@pytest.mark.slow
def test_layers_rollout_over_words_is_the_token_rollout_merged():
    tokens = attnviz.layers(ENGLISH, **bundled())
    words = attnviz.layers(ENGLISH, **bundled(words=True))
    first = words.layer_runs[0]
    token_rollout = attention_rollout([layer_run.attention for layer_run in tokens.layer_runs])
    expected = merged_by_hand(token_rollout, first.words.query_word, first.words.key_word)
    np.testing.assert_allclose(words.rollout, expected, atol=1e-9)
    np.testing.assert_allclose(words.rollout.sum(axis=-1), 1.0, atol=1e-9)
    for token_run, word_run in zip(tokens.layer_runs, words.layer_runs):
        np.testing.assert_allclose(word_run.attention, merged_by_hand(token_run.attention, first.words.query_word, first.words.key_word), atol=1e-6)


def test_trace_with_words_keeps_the_tensors_shapes_over_tokens(tmp_path):
    traced = attnviz.trace(ENGLISH, **bundled(words=True))
    plain = attnviz.trace(ENGLISH, **bundled())
    assert traced.to_dict()["layouts"] == plain.to_dict()["layouts"]  # the reshapes are the tensors' own: 9 tokens
    assert traced.trace.layouts[0].steps[0].output_shape == [1, 9, 384]  # (B, N, D): 9 tokens, not the 7 words
    assert traced.runs[0].query_tokens[2] == "unaffable"  # its maps are over words


@pytest.mark.slow
def test_the_report_over_words_shows_words_and_keeps_the_tokens():
    record = attnviz.report(CHINESE, **bundled(words=True)).record
    (text,) = record["texts"]
    assert text["query_tokens"] == CHINESE_SHOWN  # what the page draws
    assert text["query_pieces"][4:7] == ["[UNK]", "[UNK]", "[UNK]"]
    assert text["settings"]["words"] is True


@pytest.mark.slow
def test_the_report_command_counts_tokens_and_words(tmp_path, capsys):
    args = ["report", CHINESE, "--words", "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "r")]
    assert run(args) == 0
    assert "1 text, 8 tokens in 6 words;" in " ".join(capsys.readouterr().out.split())


def test_the_page_over_words_draws_the_words_and_says_how_many_tokens_they_merge(tmp_path, opened):
    attnviz.report(CHINESE, **bundled(words=True)).save(tmp_path)
    page = opened(tmp_path / "report.html")
    assert page.texts(".token[data-side='query']") == CHINESE_SHOWN
    (words_fact,) = page.texts("[data-fact='words'] dd")
    assert words_fact.startswith("6 words of 8 tokens (Clark et al. 2019")


@pytest.mark.slow
def test_heads_file_with_words_counts_tokens_and_words_per_text(tmp_path):
    import csv

    corpus = tmp_path / "texts.txt"
    corpus.write_text(f"{CHINESE}\n{ENGLISH}\n", encoding="utf-8")
    args = ["heads", "--file", str(corpus), "--words", "--no-html", "--model", "bundled", "--device", "cpu"]
    assert run([*args, "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "summary.csv", encoding="utf-8") as summary:
        rows = list(csv.DictReader(summary))
    assert [(row["tokens"], row["words"]) for row in rows] == [("8", "6"), ("9", "7")]
    first = json.loads((tmp_path / "out" / rows[0]["folder"] / "attention.json").read_text(encoding="utf-8"))
    assert first["query_words"] == CHINESE_WORDS

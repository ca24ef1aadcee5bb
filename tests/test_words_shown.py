"""--words never labels a word the model did not read as if it had: a word whose pieces include the
unknown token reads "想 [UNK]" (the word, then what the model saw) in the run's labels, the terminal's
heads table, the figures' axes, the report and attention.json (which keeps the plain words beside).

On the real bundled fallback (all-MiniLM-L6-v2, English vocabulary), 我想吃酸菜鱼 is [CLS] 我 [UNK]×5 [SEP]:
only 我 was read."""

from __future__ import annotations

import warnings

import pytest
from rich.console import Console

import attnviz
from attnviz.models.words import shown_labels, token_words
from attnviz.render.heatmap import head_figure, heads_grid_figure
from attnviz.render.terminal import heads_table

CHINESE = "我想吃酸菜鱼"
CHINESE_WORDS = ["[CLS]", "我", "想", "吃", "酸菜鱼", "[SEP]"]
CHINESE_SHOWN = ["[CLS]", "我", "想 [UNK]", "吃 [UNK]", "酸菜鱼 [UNK]×3", "[SEP]"]


# ---- the labels, from tokens written by hand -----------------------------------------------------


def shown(tokens: list[str], text: str) -> list[str]:
    return shown_labels(token_words(tokens, text), tokens)


def test_each_word_read_as_unk_says_so_and_a_run_of_unks_is_counted():
    tokens = ["[CLS]", "我", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[SEP]"]
    assert shown(tokens, CHINESE) == CHINESE_SHOWN


def test_a_word_partly_read_shows_its_known_pieces_around_the_unk():
    # a Chinese vocabulary that knows 酸 and 鱼 but not 菜: the word is still 酸菜鱼, the model saw 酸 [UNK] 鱼
    assert shown(["[CLS]", "酸", "[UNK]", "鱼", "[SEP]"], "酸菜鱼") == ["[CLS]", "酸菜鱼 酸[UNK]鱼", "[SEP]"]


def test_an_english_text_with_an_emoji_marks_only_the_emoji():
    tokens = ["[CLS]", "the", "[UNK]", "cat", "[SEP]"]
    assert shown(tokens, "The 😀 cat") == ["[CLS]", "The", "😀 [UNK]", "cat", "[SEP]"]


def test_sentencepiece_unk_and_known_pieces():
    tokens = ["▁The", "<unk>", "▁cat", "</s>"]
    assert shown(tokens, "The 😀 cat") == ["The", "😀 <unk>", "cat", "</s>"]


def test_words_the_model_read_keep_their_labels():
    tokens = ["[CLS]", "the", "una", "##ffa", "##ble", "cat", "[SEP]"]
    words = token_words(tokens, "The unaffable cat")
    assert shown_labels(words, tokens) == words.labels == ["[CLS]", "The", "unaffable", "cat", "[SEP]"]


def test_an_unk_with_no_text_to_show_is_not_said_twice():
    # the text has nothing where the [UNK] stands (a token without its text): its label is the token itself
    assert shown(["[CLS]", "cat", "[UNK]", "[SEP]"], "cat") == ["[CLS]", "cat", "[UNK]", "[SEP]"]


# ---- every place the bundled fallback's words appear ---------------------------------------------


@pytest.fixture(scope="module")
def result():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", attnviz.AttnvizWarning)  # the [UNK]s' warning: tests/test_headline.py counts it
        return attnviz.heads(CHINESE, model="bundled", device="cpu", words=True)


def test_the_bundled_model_reads_only_one_character_of_the_headline(result):
    assert result.run.words.query_tokens == ["[CLS]", "我", *["[UNK]"] * 5, "[SEP]"]
    assert result.run.query_tokens == result.run.key_tokens == CHINESE_SHOWN
    assert result.run.words.query_plain_words == result.run.words.key_plain_words == CHINESE_WORDS
    assert result.tokens == CHINESE_SHOWN  # the API's labels, which the notebook shows


def test_the_heads_table_shows_what_the_model_saw(result):
    console = Console(width=400, record=True)
    console.print(heads_table(result.run, result.summaries))
    table = console.export_text()
    assert "2:想 [UNK]→" in table and "4:酸菜鱼 [UNK]×3" in table
    assert "2:想→" not in table and "4:酸菜鱼→" not in table


@pytest.mark.slow
def test_the_figures_axes_show_what_the_model_saw(result):
    head = head_figure(result.run, 0)
    (axes, *_) = head.axes
    assert [label.get_text() for label in axes.get_yticklabels()] == CHINESE_SHOWN
    assert [label.get_text() for label in axes.get_xticklabels()] == CHINESE_SHOWN
    grid = heads_grid_figure(result.run)
    labels = {label.get_text() for axes in grid.axes for label in [*axes.get_xticklabels(), *axes.get_yticklabels()]}
    assert {"想 [UNK]", "酸菜鱼 [UNK]×3"} <= labels and not {"想", "酸菜鱼"} & labels


def test_attention_json_keeps_the_plain_words_and_adds_the_shown_labels(result):
    record = result.to_dict()
    assert record["query_words"] == record["key_words"] == CHINESE_WORDS
    assert record["query_words_shown"] == record["key_words_shown"] == CHINESE_SHOWN
    assert record["query_token_words"] == [0, 1, 2, 3, 4, 4, 4, 5]


def test_the_report_draws_the_shown_labels(result):
    (text,) = result.report().record["texts"]
    assert text["query_tokens"] == text["key_tokens"] == CHINESE_SHOWN
    assert text["query_pieces"] == result.run.words.query_tokens


def test_smollm2_reads_every_character_so_its_words_are_plain(smollm2_cached):
    result = attnviz.heads(CHINESE, model="smollm2", device="cpu", words=True)
    assert result.run.query_tokens == result.run.words.query_plain_words == ["我", "想", "吃", "酸菜鱼"]


def test_keys_from_another_text_say_what_the_model_saw_too():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", attnviz.AttnvizWarning)
        result = attnviz.heads("The cat sat.", kv=CHINESE, model="bundled", device="cpu", words=True)
    assert result.run.key_tokens == CHINESE_SHOWN and result.run.words.key_plain_words == CHINESE_WORDS
    assert result.run.query_tokens == ["[CLS]", "The", "cat", "sat", ".", "[SEP]"]
    record = result.to_dict()
    assert record["key_words_shown"] == CHINESE_SHOWN and record["query_words_shown"] == record["query_words"]

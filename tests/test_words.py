"""Words, not word pieces (attnviz.models.words.py): hand-worked examples of the word of every token,
in Chinese and English, under WordPiece, SentencePiece and byte-level tokenizers; merged attention
against hand-computed sums and means; properties of the merge (rows still sum to 1, one-token words
change nothing, a causal mask stays a mask)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnviz.models.words import (
    BYTE_LEVEL,
    SENTENCEPIECE,
    WORDPIECE,
    Words,
    byte_level_alphabet,
    guess_scheme,
    merge_attention,
    token_words,
)

CHINESE = "我想吃酸菜鱼"  # I want to eat pickled-cabbage fish: 我 / 想 / 吃 / 酸菜鱼


# ---- Chinese -----------------------------------------------------------------------------------


def _bundled_tokens(text: str) -> list[str]:
    """The bundled BERT's tokens of text, as attnviz's own tokenizer gives them."""
    from attnviz.models.loading import bundled_model_path
    from attnviz.models.tokens import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(bundled_model_path())
    return tokenizer.convert_ids_to_tokens(tokenizer.encode_batch([text])[0])


def test_chinese_under_the_bundled_bert_groups_its_unks_by_the_segmenters_words():
    tokens = _bundled_tokens(CHINESE)
    # The bundled (English, uncased) vocabulary knows 我 and none of the other five characters.
    assert tokens == ["[CLS]", "我", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[SEP]"]
    words = token_words(tokens, CHINESE)
    assert words == Words([0, 1, 2, 3, 4, 4, 4, 5], ["[CLS]", "我", "想", "吃", "酸菜鱼", "[SEP]"])


def _tiny_wordpiece(tmp_path, characters: str):
    from tokenizers.implementations import BertWordPieceTokenizer

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *characters]) + "\n", encoding="utf-8")
    return BertWordPieceTokenizer(str(vocab))


def test_chinese_under_a_vocabulary_covering_every_character(tmp_path):
    tokens = _tiny_wordpiece(tmp_path, CHINESE).encode(CHINESE).tokens
    assert tokens == ["[CLS]", "我", "想", "吃", "酸", "菜", "鱼", "[SEP]"]
    assert token_words(tokens, CHINESE) == Words([0, 1, 2, 3, 4, 4, 4, 5], ["[CLS]", "我", "想", "吃", "酸菜鱼", "[SEP]"])


def test_an_unk_inside_a_chinese_word_stays_in_that_word(tmp_path):
    tokens = _tiny_wordpiece(tmp_path, "我想吃酸鱼").encode(CHINESE).tokens  # 菜 unknown
    assert tokens == ["[CLS]", "我", "想", "吃", "酸", "[UNK]", "鱼", "[SEP]"]
    assert token_words(tokens, CHINESE) == Words([0, 1, 2, 3, 4, 4, 4, 5], ["[CLS]", "我", "想", "吃", "酸菜鱼", "[SEP]"])


def test_chinese_under_smollm2s_byte_level_tokenizer_shows_the_characters(smollm2_cached):
    from attnviz.models.transformers_tokenizer import load_transformers_tokenizer

    tokenizer = load_transformers_tokenizer(smollm2_cached.tokenizer_folder, embedding_rows=49152)
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode_batch([CHINESE])[0])
    # Byte pieces, several to a character: each character is three UTF-8 bytes.
    assert len(tokens) > len(CHINESE) and "æĪ" in tokens
    assert guess_scheme(tokens) == BYTE_LEVEL
    words = token_words(tokens, CHINESE, BYTE_LEVEL)
    assert words.labels == ["我", "想", "吃", "酸菜鱼"]
    # Independently: the character each token's bytes belong to (3 bytes a character), and the
    # hand-worked word of each character.
    alphabet = {char: byte for byte, char in byte_level_alphabet().items()}
    word_of_character = [0, 1, 2, 3, 3, 3]
    first_byte = np.cumsum([0] + [len(token) for token in tokens])[:-1]  # one alphabet char per byte
    assert b"".join(bytes(alphabet[c] for c in token) for token in tokens) == CHINESE.encode()
    assert words.index == [word_of_character[start // 3] for start in first_byte]


def test_split_characters_are_labelled_as_the_character_never_mojibake():
    tokens = ["æĪ", "ĳ", "ç", "Ī", "±", "N", "LP", "Ġmodels"]  # GPT-2-style bytes of 我爱NLP models
    words = token_words(tokens, "我爱NLP models", BYTE_LEVEL)
    assert words == Words([0, 0, 1, 1, 1, 2, 2, 3], ["我", "爱", "NLP", "models"])


def test_japanese_keeps_characters_apart_and_korean_follows_its_spaces():
    # No Japanese segmenter: each kana and kanji is a word of its own (and no jieba over kana text).
    assert token_words(["こ", "##ん", "##に", "世", "界"], "こんに世界").labels == ["こ", "ん", "に", "世", "界"]
    # Korean writes spaces between words; hangul pieces join by the marks (here byte-level Ġ).
    tokens = ["íķľ", "êµŃ", "ìĸ´", "Ġë¬¸", "ìŀ¥"]  # 한 국 어 ␣문 장
    assert token_words(tokens, "한국어 문장", BYTE_LEVEL) == Words([0, 0, 0, 1, 1], ["한국어", "문장"])


# ---- English -------------------------------------------------------------------------------------

ENGLISH = "The unaffable xylophonist 𝔘 said hi."


def test_english_wordpiece_with_a_word_of_three_pieces_and_an_unk():
    tokens = _bundled_tokens(ENGLISH)
    assert tokens[:5] == ["[CLS]", "the", "una", "##ffa", "##ble"] and tokens[10] == "[UNK]"
    assert guess_scheme(tokens) == WORDPIECE
    words = token_words(tokens, ENGLISH)
    assert words.index == [0, 1, 2, 2, 2, 3, 3, 3, 3, 3, 4, 5, 6, 7, 8]
    # Labels are the text's own words, cased as written; the [UNK] is the character it stands for.
    assert words.labels == ["[CLS]", "The", "unaffable", "xylophonist", "𝔘", "said", "hi", ".", "[SEP]"]


def test_byte_level_words_start_at_g_dot():
    tokens = ["<|endoftext|>", "Hello", ",", "Ġunbelie", "vable", "Ġworld", "!"]
    words = token_words(tokens, "Hello, unbelievable world!", BYTE_LEVEL)
    assert words == Words([0, 1, 2, 3, 3, 4, 5], ["<|endoftext|>", "Hello", ",", "unbelievable", "world", "!"])


def test_sentencepiece_words_start_at_the_bar_and_byte_fallback_is_read():
    tokens = ["<s>", "▁The", "▁un", "aff", "able", "▁", "<0xE6>", "<0x88>", "<0x91>", "想", "</s>"]
    assert guess_scheme(tokens) == SENTENCEPIECE
    words = token_words(tokens, "The unaffable 我想")
    assert words == Words([0, 1, 2, 2, 2, 3, 3, 3, 3, 4, 5], ["<s>", "The", "unaffable", "我", "想", "</s>"])


def test_the_byte_alphabet_is_gpt2s():
    alphabet = byte_level_alphabet()
    assert alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ" and alphabet[ord("A")] == "A"
    assert len(set(alphabet.values())) == 256
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert alphabet == bytes_to_unicode()
    assert set(alphabet.values()) == set(ByteLevel.alphabet())


def test_an_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="scheme"):
        token_words(["a"], "a", "morfessor")


# ---- merging attention -----------------------------------------------------------------------------


def test_merge_by_hand():
    attention = np.array(
        [
            [0.1, 0.2, 0.3, 0.4],
            [0.5, 0.1, 0.1, 0.3],
            [0.2, 0.2, 0.2, 0.4],
            [0.0, 0.6, 0.4, 0.0],
        ]
    )
    words = [0, 1, 1, 2]  # the middle two tokens are one word
    merged = merge_attention(attention, words, words)
    expected = np.array(
        [
            [0.1, 0.2 + 0.3, 0.4],
            [(0.5 + 0.2) / 2, (0.1 + 0.1 + 0.2 + 0.2) / 2, (0.3 + 0.4) / 2],
            [0.0, 0.6 + 0.4, 0.0],
        ]
    )
    np.testing.assert_allclose(merged, expected, atol=1e-12)


def test_merge_works_on_batched_torch_tensors_and_keeps_a_causal_mask():
    causal = torch.tril(torch.rand(2, 3, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    causal = causal / causal.sum(-1, keepdim=True)  # (B, H, N, N), rows summing to 1
    words = [0, 1, 1, 2, 2]
    merged = merge_attention(causal, words, words)
    assert merged.shape == (2, 3, 3, 3) and isinstance(merged, torch.Tensor)
    torch.testing.assert_close(merged.sum(-1), torch.ones(2, 3, 3, dtype=torch.float64))
    assert (merged.triu(1) == 0).all()  # a word attends to no later word


def test_merge_refuses_words_that_do_not_fit():
    with pytest.raises(ValueError, match="3 query words for 2 query tokens"):
        merge_attention(np.eye(2), [0, 1, 2], [0, 1])
    with pytest.raises(ValueError, match="numbered"):
        merge_attention(np.eye(2), [0, 2], [0, 1])


@st.composite
def attention_and_words(draw):
    num_tokens = draw(st.integers(1, 8))
    scores = draw(arrays(np.float64, (num_tokens, num_tokens), elements=st.floats(0.0, 1.0)))
    attention = (scores + 1e-3) / (scores + 1e-3).sum(axis=1, keepdims=True)
    starts = draw(st.lists(st.booleans(), min_size=num_tokens - 1, max_size=num_tokens - 1))
    words = np.cumsum([0, *starts]).tolist()  # contiguous words: a new word where a start is drawn
    return attention, words


@settings(max_examples=60, deadline=None)
@given(attention_and_words())
def test_merged_rows_still_sum_to_one(drawn):
    attention, words = drawn
    merged = merge_attention(attention, words, words)
    assert merged.shape == (max(words) + 1,) * 2
    np.testing.assert_allclose(merged.sum(axis=1), 1.0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(attention_and_words())
def test_one_token_words_are_the_identity(drawn):
    attention, _ = drawn
    one_each = list(range(len(attention)))
    np.testing.assert_array_equal(merge_attention(attention, one_each, one_each), attention)


def test_a_text_cut_inside_a_character_shows_the_replacement_character_not_mojibake():
    tokens = ["æĪ", "ĳ", "æ", "ĥ"]  # 我 and the first two of 想's three bytes (--truncate cut the third)
    assert token_words(tokens, "我想", BYTE_LEVEL).labels == ["我", "\ufffd"]
    cut_before_end = token_words([*tokens, "<|endoftext|>"], "我想", BYTE_LEVEL)
    assert cut_before_end == Words([0, 0, 1, 1, 2], ["我", "\ufffd", "<|endoftext|>"])


def test_the_scheme_of_a_real_tokenizer_json(smollm2_cached):
    import json

    from attnviz.models.words import tokenizer_scheme
    from attnviz.models.loading import bundled_model_path

    def scheme(folder):
        return tokenizer_scheme(json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")))

    assert scheme(bundled_model_path()) == WORDPIECE
    assert scheme(smollm2_cached.tokenizer_folder) == BYTE_LEVEL
    metaspace = {"model": {"type": "Unigram"}, "pre_tokenizer": {"type": "Metaspace"}, "decoder": {"type": "Metaspace"}}
    assert tokenizer_scheme(metaspace) == SENTENCEPIECE
    # With the scheme known, a byte-level word with no space before it is one word, as the marks say.
    assert token_words(["un", "bel", "ievable"], "unbelievable", BYTE_LEVEL).labels == ["unbelievable"]


def test_a_word_of_whitespace_alone_keeps_its_mark_as_its_label():
    tokens = ["Ġ", "Ġleading", "Ċ", "OK"]  # GPT-2's tokens of "  leading\nOK": the newline opens the word OK
    assert token_words(tokens, "  leading\nOK", BYTE_LEVEL) == Words([0, 1, 2, 2], ["Ġ", "leading", "OK"])

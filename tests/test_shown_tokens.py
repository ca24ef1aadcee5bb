"""Readable tokens (models/shown.py): byte-level, SentencePiece and WordPiece pieces shown as text with
visible whitespace marks, split characters as their parts, never as the byte alphabet's mojibake; the
same in the terminal, the figures and the report, with the raw tokens kept in the JSON."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tiny_families import bpe_tokenizer, build_checkpoint

import attnviz
from attnviz.cli import run
from attnviz.models.shown import MARKS, shown_tokens, unshown
from attnviz.models.words import BYTE_LEVEL, SENTENCEPIECE, WORDPIECE, byte_level_alphabet

ZH = "我想吃酸菜鱼"
# The characters GPT-2's byte alphabet puts in place of the bytes that are not printable Latin-1 (U+0100 on).
REMAPPED = {char for byte, char in byte_level_alphabet().items() if ord(char) > 0xFF}
MOJIBAKE = re.compile(r"[\u0100-\u0143]|[\u00c0-\u00ff]{2}")
# Texts mixing Chinese, English, emoji, digits, punctuation, spaces, newlines and tabs.
MIXED = st.lists(st.sampled_from([*"我想吃酸菜鱼中国 catsheTm.,!?12\n\t", "😀", "é", "👍🏽"]), min_size=1, max_size=30).map("".join)


def byte_pieces(text: str, cuts: list[int]) -> list[str]:
    """text's UTF-8 bytes cut at the byte offsets `cuts`, each piece in GPT-2's byte alphabet (independent of shown.py)."""
    alphabet = byte_level_alphabet()
    data = text.encode()
    bounds = [0, *cuts, len(data)]
    return ["".join(alphabet[byte] for byte in data[start:end]) for start, end in zip(bounds, bounds[1:])]


def test_each_scheme_shows_text_with_the_marks_and_split_characters_as_parts():
    assert shown_tokens(byte_pieces("我 cat\n\tx", [2, 3]), BYTE_LEVEL) == ["我¹/₂", "我²/₂", "␣cat↵⇥x"]
    assert shown_tokens(["<|im_start|>", *byte_pieces(" 想", [2]), "<|im_end|>"], BYTE_LEVEL) == ["<|im_start|>", "␣想¹/₂", "想²/₂", "<|im_end|>"]
    assert shown_tokens(["<s>", "▁the", "▁cat", "<0xE6>", "<0x88>", "<0x91>", "s"], SENTENCEPIECE) == ["<s>", "␣the", "␣cat", "我¹/₃", "我²/₃", "我³/₃", "s"]
    spaced = [False, False, True, False, True, False, False]
    assert shown_tokens(["[CLS]", "the", "una", "##ffa", "##ble", ".", "[SEP]"], WORDPIECE, spaced) == ["[CLS]", "the", "␣una", "ffa", "ble", ".", "[SEP]"]
    assert MARKS[" "] == "␣" and MARKS["\n"] == "↵" and MARKS["\t"] == "⇥"


def test_bytes_that_never_form_a_character_show_as_hex_not_mojibake():
    cut_short = byte_pieces("我", [2])[:1]  # 0xE6 0x88: a character's first two bytes, its last one cut off
    assert shown_tokens([*cut_short, "<|endoftext|>"], BYTE_LEVEL) == ["<E6><88>", "<|endoftext|>"]
    assert shown_tokens(["<0x91>", "▁a"], SENTENCEPIECE) == ["<91>", "␣a"]  # a lone continuation byte


@given(text=MIXED, data=st.data())
@settings(max_examples=200, deadline=None)
def test_any_cut_of_a_texts_bytes_shows_back_the_text_and_no_byte_alphabet(text, data):
    size = len(text.encode())
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, size - 1)), max_size=size)) - {size})
    shown = shown_tokens(byte_pieces(text, cuts), BYTE_LEVEL)
    assert unshown(shown) == text
    assert not any(char in REMAPPED for token in shown for char in token)


@pytest.fixture(scope="module")
def byte_level():
    return bpe_tokenizer(bos=True)  # tiny_families' byte-level BPE (Llama's kind: <s> first)


@given(text=MIXED)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_byte_level_tokenizers_tokens_show_its_own_decode(byte_level, text):
    ids = byte_level(text)["input_ids"]
    shown = shown_tokens(byte_level.convert_ids_to_tokens(ids), BYTE_LEVEL)
    assert unshown(shown[1:]) == byte_level.decode(ids, skip_special_tokens=True) == text
    assert shown[0] == "<s>"
    assert not any(char in REMAPPED for token in shown for char in token)


def sentencepiece_tokenizer() -> Tokenizer:
    """A Llama-2-like SentencePiece BPE: ▁ for spaces, a few merges, and byte fallback (<0xE6>) for the rest."""
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz.,!?", "我", "想", "▁t", "▁th", "▁the", "▁c", "▁ca", "▁cat"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{byte:02X}>": 3 + byte for byte in range(256)}}
    vocab.update({piece: len(vocab) + index for index, piece in enumerate(pieces)})
    merges = [("▁", "t"), ("▁t", "h"), ("▁th", "e"), ("▁", "c"), ("▁c", "a"), ("▁ca", "t")]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tokenizer


@given(text=MIXED)
@settings(max_examples=100, deadline=None)
def test_a_sentencepiece_tokenizers_tokens_show_its_own_decode(text):
    tokenizer = sentencepiece_tokenizer()
    encoding = tokenizer.encode(text)
    shown = shown_tokens(encoding.tokens, SENTENCEPIECE)
    # The ▁ that Metaspace puts before the text shows as a space; the decoder strips it (Strip(" ", 1, 0)).
    assert unshown(shown).removeprefix(" ") == tokenizer.decode(encoding.ids)
    assert not any(re.fullmatch(r"<0x[0-9A-F]{2}>", token) for token in shown)
    assert not any("▁" in token for token in shown)


@given(text=st.lists(st.sampled_from([*"the cat sat on mat playing unaffable.,!?", "  ", "\n"]), min_size=1, max_size=40).map("".join))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_wordpiece_tokens_show_their_text_with_a_mark_where_whitespace_precedes(bundled_bert, text):
    from attnviz.models.tokens import encode

    if not text.strip():
        return
    encoded = encode(bundled_bert.tokenizer, [text], bundled_bert.max_positions)
    shown = encoded.shown[0]
    assert shown[0] == "[CLS]" and shown[-1] == "[SEP]"
    # Each run of whitespace before a piece is one mark (a leading one too); the text is lower case already.
    assert unshown(shown[1:-1]) == re.sub(r"\s+", " ", text.rstrip())
    assert not any(token.startswith("##") for token in shown)


def test_the_bundled_bert_shows_the_cat_sat_with_space_marks():
    result = attnviz.heads("the cat sat", model="bundled")
    assert result.run.query_tokens == ["[CLS]", "the", "cat", "sat", "[SEP]"]  # the raw tokens stay raw
    assert result.run.shown_tokens[0] == ["[CLS]", "the", "␣cat", "␣sat", "[SEP]"]
    words = attnviz.heads("the unaffable cat", model="bundled")
    assert words.run.query_tokens[2:5] == ["una", "##ffa", "##ble"]
    assert words.run.shown_tokens[0][2:5] == ["␣una", "ffa", "ble"]


def test_attention_json_keeps_the_raw_tokens_and_adds_the_shown_ones(tmp_path):
    result = attnviz.heads("the unaffable cat", model="bundled")
    result.save(tmp_path)
    record = json.loads((tmp_path / "attention.json").read_text(encoding="utf-8"))
    assert record["query_tokens"] == record["key_tokens"] == ["[CLS]", "the", "una", "##ffa", "##ble", "cat", "[SEP]"]
    assert record["shown_query_tokens"] == record["shown_key_tokens"] == ["[CLS]", "the", "␣una", "ffa", "ble", "␣cat", "[SEP]"]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "llama"
    build_checkpoint("llama", folder)
    return folder


def tick_labels(figure) -> list[str]:
    """The heatmap's token labels (its first axes; the colour bar's numbers left out)."""
    ax = figure.axes[0]
    return [label.get_text() for label in [*ax.get_xticklabels(), *ax.get_yticklabels()]]


def test_a_tiny_byte_level_models_table_figure_and_json_show_readable_tokens(tiny_llama, tmp_path, capsys):
    text = "我想吃 cat\n"
    assert run(["heads", text, "--model", str(tiny_llama), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    record = json.loads((tmp_path / "attention.json").read_text(encoding="utf-8"))
    raw, shown = record["query_tokens"], record["shown_query_tokens"]
    assert any(char in REMAPPED for token in raw for char in token)  # the tokenizer's own spelling is the byte alphabet
    assert unshown(shown[1:]) == text and shown[0] == "<s>"
    assert "␣cat" in shown and "↵" in "".join(shown)
    for token in shown[1:]:
        assert token in printed
    assert not MOJIBAKE.search(printed)
    assert "␣ a space; ↵ a newline" in printed  # the legend says what the marks are
    result = attnviz.heads(text, model=str(tiny_llama))
    labels = tick_labels(result.figure(head=0))
    assert labels and set(labels) <= set(shown) and "␣cat" in labels
    assert not any(MOJIBAKE.search(label) for label in labels)


@pytest.mark.slow
def test_smollm2_shows_the_parts_of_chinese_characters_everywhere(tmp_path, capsys, smollm2_cached):  # in the session's cache
    assert run(["heads", ZH, "--model", "smollm2", "--out", str(tmp_path / "heads")]) == 0
    printed = capsys.readouterr().out
    assert "我¹/₂" in printed and "我²/₂" in printed and "鱼³/₃" in printed
    assert not MOJIBAKE.search(printed)
    record = json.loads((tmp_path / "heads" / "attention.json").read_text(encoding="utf-8"))
    assert record["query_tokens"][:2] == ["æĪ", "ĳ"]  # raw: 我's two byte-level pieces
    assert unshown(record["shown_query_tokens"]) == ZH
    labels = tick_labels(attnviz.heads(ZH, model="smollm2").figure(head=0))
    assert {"我¹/₂", "我²/₂"} <= set(labels) and not any(MOJIBAKE.search(label) for label in labels)
    report = tmp_path / "report" / "report.html"
    assert run(["report", ZH, "--model", "smollm2", "--out", str(report.parent)]) == 0
    (data,) = re.findall(r'<script type="application/json" id="attnviz-data">(.*?)</script>', report.read_text(encoding="utf-8"), re.S)
    page_text = json.loads(data)["texts"][0]
    assert page_text["shown_query_tokens"][:2] == ["我¹/₂", "我²/₂"] and page_text["query_tokens"][:2] == ["æĪ", "ĳ"]

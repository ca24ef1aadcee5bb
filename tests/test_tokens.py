"""A batch of texts is tokenized once (models/tokens.encode): its ids and the whitespace before each token (the ␣ of
WordPiece's shown tokens) come from one call of the real tokenizer, attnviz's own WordPiece one and transformers'
fast one alike; the tokens shown are the hand-worked ones."""

from __future__ import annotations

import functools

import pytest
from tiny_families import WORDPIECE_VOCAB, wordpiece_tokenizer

from attnviz.models.loading import bundled_model_path
from attnviz.models.tokens import WordPieceTokenizer, encode
from attnviz.models.transformers_tokenizer import TransformersTokenizer

TEXTS = ["the unaffable cat  sat", "我想吃酸菜鱼 fish"]
# Hand-worked: the bundled (English, uncased) WordPiece vocabulary splits "unaffable", knows 我 and none of the other
# five characters; ␣ marks a token that whitespace precedes in the text ("  " before sat is one mark).
SHOWN = [
    ["[CLS]", "the", "␣una", "ffa", "ble", "␣cat", "␣sat", "[SEP]"],
    ["[CLS]", "我", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "␣fish", "[SEP]"],
]
LOOKUPS = {"convert_ids_to_tokens", "decode"}  # ids to strings: no text tokenized


def counted(tokenizer) -> dict[str, int]:
    """Wrap every public method of the instance but the lookups (the real ones still run); return the calls made, by
    method: each is a call into the tokenizer library over text."""
    public = [name for name in dir(type(tokenizer)) if not name.startswith("_") and callable(getattr(tokenizer, name))]
    calls = dict.fromkeys([name for name in public if name not in LOOKUPS], 0)

    def counting(name, method):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return method(*args, **kwargs)

        return wrapper

    for name in calls:
        setattr(tokenizer, name, counting(name, getattr(tokenizer, name)))
    return calls


def attnviz_wordpiece():
    return WordPieceTokenizer(bundled_model_path())


def transformers_wordpiece():
    return TransformersTokenizer(wordpiece_tokenizer(), WORDPIECE_VOCAB)


@pytest.mark.parametrize("make", [attnviz_wordpiece, transformers_wordpiece], ids=["attnviz", "transformers"])
def test_one_encode_tokenizes_the_batch_once_for_its_ids_and_the_spaces_shown(make):
    tokenizer = make()
    expected_ids = tokenizer.encode_batch(TEXTS)
    calls = counted(tokenizer)
    encoded = encode(tokenizer, TEXTS, max_positions=64)
    assert sum(calls.values()) == 1, calls
    assert encoded.ids == expected_ids
    assert encoded.shown == SHOWN


@pytest.mark.parametrize("make", [attnviz_wordpiece, transformers_wordpiece], ids=["attnviz", "transformers"])
def test_truncate_cuts_the_spaces_with_the_ids_in_the_same_one_call(make):
    tokenizer = make()
    calls = counted(tokenizer)
    encoded = encode(tokenizer, TEXTS, max_positions=5, truncate=True)
    assert sum(calls.values()) == 1, calls
    assert encoded.shown == [[*SHOWN[0][:4], "[SEP]"], [*SHOWN[1][:4], "[SEP]"]]  # the first 4 tokens and the final [SEP]


def test_a_decoders_view_shifts_its_spaces_with_its_ids_behind_the_start_token():
    tokenizer = transformers_wordpiece().for_decoder(start_token_id=102)  # [SEP], as the tiny BART's decoder starts
    calls = counted(tokenizer)
    encoded = encode(tokenizer, TEXTS[:1], max_positions=64)
    assert sum(calls.values()) == 1, calls
    assert encoded.shown == [["[SEP]", *SHOWN[0][:-1]]]

"""Tokenization with the model's own BERT tokenizer, [CLS] and [SEP] included."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.errors import AttnvizError, first_line
from attnviz.models.shown import shown_tokens, space_before
from attnviz.models.words import SPECIAL_TOKENS, WORDPIECE, guess_scheme, tokenizer_scheme
from attnviz.run_data import Truncation, UnknownTokens

if TYPE_CHECKING:
    import torch

# CJK ideographs, kana and hangul: text a Chinese, Japanese or Korean vocabulary handles.
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")


SPECIAL_TOKEN_ROLES = ("unk_token", "cls_token", "sep_token", "pad_token", "mask_token")
DEFAULT_SPECIAL_TOKENS = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]"}


class WordPieceTokenizer:
    """A BERT tokenizer read from a model folder with the `tokenizers` library.

    tokenizer.json when the folder has one (the exact pipeline the model was saved with),
    else vocab.txt with the lower-casing its tokenizer_config.json asks for. transformers'
    tokenizer classes would do the same, but importing them takes longer than the whole run.

    embedding_rows, the rows of the model's word embedding table, is the bound on token ids:
    a vocabulary larger than the table is refused here, and an id past it (a gap in a
    vocabulary's numbering) when a text meets it, instead of indexing past the table.
    """

    def __init__(self, folder: Path, embedding_rows: int | None = None):
        settings = _read_json(folder / "tokenizer_config.json")
        special = {**DEFAULT_SPECIAL_TOKENS, **_special_tokens(settings), **_special_tokens(_read_json(folder / "special_tokens_map.json"))}
        self._tokenizer = _read_tokenizer(folder, settings, special)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.unk_token = special["unk_token"]
        self.unk_token_id = self._tokenizer.token_to_id(self.unk_token)
        self.pad_token_id = self._tokenizer.token_to_id(special["pad_token"]) or 0
        self.mask_token = special["mask_token"]  # where a masked-LM head predicts (analysis/patching.py)
        self.mask_token_id = self._tokenizer.token_to_id(self.mask_token)
        ids = (self._tokenizer.token_to_id(special[role]) for role in SPECIAL_TOKEN_ROLES)
        self.all_special_ids = sorted({token_id for token_id in ids if token_id is not None})
        self.embedding_rows = embedding_rows
        if embedding_rows is not None:
            size = self._tokenizer.get_vocab_size(with_added_tokens=True)
            if size > embedding_rows:
                raise AttnvizError(
                    f"the tokenizer has {size} tokens, more than the {embedding_rows} rows of the model's "
                    "embedding table (vocab_size): the tokenizer is not this model's"
                )
            self._check_ids([self.pad_token_id, *self.all_special_ids])

    @cached_property
    def word_scheme(self) -> str:
        """How its tokens mark words (models/words.py: WORDPIECE, SENTENCEPIECE or BYTE_LEVEL), from its tokenizer.json."""
        return tokenizer_scheme(json.loads(self._tokenizer.to_str()))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] included, never cut."""
        return self._checked([encoding.ids for encoding in self._tokenizer.encode_batch(texts)])

    def encode_with_spaces(self, texts: list[str]) -> tuple[list[list[int]], list[list[bool]]]:
        """encode_batch's ids, and whether whitespace precedes each of their tokens (from the same encodings' offsets)."""
        encodings = self._tokenizer.encode_batch(texts)  # the one call: ids and offsets of one encoding
        spaces = [space_before(text, encoding.offsets) for text, encoding in zip(texts, encodings)]
        return self._checked([encoding.ids for encoding in encodings]), spaces

    def _checked(self, ids: list[list[int]]) -> list[list[int]]:
        for row in ids:
            self._check_ids(row)
        return ids

    def _check_ids(self, ids: list[int]) -> None:
        if self.embedding_rows is not None and ids and max(ids) >= self.embedding_rows:
            token_id = max(ids)
            raise AttnvizError(
                f"the tokenizer gives {self._tokenizer.id_to_token(token_id)!r} the id {token_id}, past the "
                f"{self.embedding_rows} rows of the model's embedding table: the tokenizer is not this model's"
            )

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self._tokenizer.id_to_token(token_id) for token_id in ids]

    def pieces(self, text: str) -> list[int]:
        """The ids of a piece of text alone, no [CLS] or [SEP] around it (an answer token: analysis/patching.py)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


def _read_tokenizer(folder: Path, settings: dict, special: dict[str, str]):
    """A `tokenizers` Tokenizer from tokenizer.json, else from vocab.txt; a broken file is an AttnvizError naming it."""
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    file = folder / "tokenizer.json"
    try:
        if file.is_file():
            return Tokenizer.from_file(str(file))
        file = folder / "vocab.txt"
        wordpiece = BertWordPieceTokenizer(
            str(file),
            unk_token=special["unk_token"],
            sep_token=special["sep_token"],
            cls_token=special["cls_token"],
            pad_token=special["pad_token"],
            mask_token=special["mask_token"],
            lowercase=settings.get("do_lower_case", True),
            strip_accents=settings.get("strip_accents"),
            handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
        )
        return Tokenizer.from_str(wordpiece.to_str())  # the Tokenizer it wraps, through its public JSON
    except Exception as error:  # the tokenizers library raises plain Exceptions for a file it cannot parse
        raise AttnvizError(f"unreadable {file.name} ({first_line(error)})") from error


def _read_json(path: Path) -> dict:
    """A tokenizer settings file's object; {} when there is none, an AttnvizError naming it when it is broken."""
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise AttnvizError(f"unreadable {path.name} ({first_line(error)})") from error
    if not isinstance(settings, dict):
        raise AttnvizError(f"{path.name} holds no object of settings")
    return settings


def _special_tokens(settings: dict) -> dict[str, str]:
    """Special tokens named in a tokenizer config; a token may be a string or {"content": ...}."""
    found = {}
    for role in SPECIAL_TOKEN_ROLES:
        token = settings.get(role)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            found[role] = token
    return found


@dataclass
class Encoded:
    """A padded batch of texts. input_ids, attention_mask, token_type_ids: (B, N)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    tokens: list[list[str]]  # each text's tokens, padding left out
    ids: list[list[int]]
    truncations: list[Truncation | None]  # each text's cut by --truncate, None when it fit
    shown: list[list[str]] = field(default_factory=list)  # each text's tokens as a reader sees them (models/shown.py)

    @property
    def valid_lens(self) -> torch.Tensor:
        """(B,) the number of real tokens of each text."""
        return self.attention_mask.sum(dim=1)

    def model_inputs(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids.to(device),
            "attention_mask": self.attention_mask.to(device),
            "token_type_ids": self.token_type_ids.to(device),
        }


def check_lengths(token_counts: list[int], max_positions: int, where: list[str] | None = None) -> None:
    """Refuse the first text longer than the model's positions; `where` names each text (e.g. "line 3")."""
    for index, count in enumerate(token_counts):
        if count > max_positions:
            subject = f"{where[index]} has" if where else "the text has"
            raise AttnvizError(
                f"{subject} {count} tokens, more than the model's {max_positions} positions; "
                "shorten it or pass --truncate"
            )


def encode(tokenizer: WordPieceTokenizer, texts: list[str], max_positions: int, truncate: bool = False) -> Encoded:
    """Tokenize texts into one padded batch, refusing blank texts and texts too long for the model.

    --truncate keeps the first max_positions - 1 tokens and the final [SEP] (or </s>: the special
    token a tokenizer ends every text with); a tokenizer that ends texts with none (GPT-2, Llama)
    keeps the first max_positions tokens.
    """
    for text in texts:
        if not text.strip():
            raise AttnvizError("the text is empty: give some words to attend over")
    if tokenizer.word_scheme == WORDPIECE:  # shown_tokens' space marks, from the same call of the tokenizer
        ids, spaces = tokenizer.encode_with_spaces(texts)
    else:
        ids, spaces = tokenizer.encode_batch(texts), None
    truncations = [None] * len(ids)
    if truncate:
        finals = [final_token(tokenizer, row) for row in ids]
        spaces = spaces and [truncate_ids(row, max_positions, final)[0] for row, final in zip(spaces, finals)]
        cuts = [truncate_ids(row, max_positions, final) for row, final in zip(ids, finals)]
        ids, truncations = [row for row, _ in cuts], [cut for _, cut in cuts]
    check_lengths([len(row) for row in ids], max_positions)
    return encode_ids(tokenizer, ids, truncations, spaces)


def encode_ids(tokenizer, ids: list[list[int]], truncations: list | None = None, spaces=None) -> Encoded:
    """Token ids, as a tokenizer gave them or drawn (roles' prefix-matching sequences), as one padded batch."""
    truncations = truncations or [None] * len(ids)
    tokens = [tokenizer.convert_ids_to_tokens(row) for row in ids]

    import torch  # here: the tokenizer alone needs no torch

    longest = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), longest), tokenizer.pad_token_id, dtype=torch.long)  # (B, N)
    attention_mask = torch.zeros((len(ids), longest), dtype=torch.long)  # (B, N): 1 = real token
    for row, token_ids in enumerate(ids):
        input_ids[row, : len(token_ids)] = torch.tensor(token_ids)
        attention_mask[row, : len(token_ids)] = 1
    return Encoded(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=torch.zeros_like(input_ids),  # one segment: every token is sentence A
        tokens=tokens,
        ids=ids,
        truncations=truncations,
        shown=shown_rows(tokenizer, tokens, spaces),
    )


def shown_rows(tokenizer, tokens: list[list[str]], spaces: list[list[bool]] | None) -> list[list[str]]:
    """Each text's tokens as a reader sees them (models/shown.py), by the tokenizer's scheme and special tokens."""
    special = SPECIAL_TOKENS | set(tokenizer.convert_ids_to_tokens(tokenizer.all_special_ids))
    return [
        shown_tokens(row, tokenizer.word_scheme or guess_scheme(row), row_spaces, special)
        for row, row_spaces in zip(tokens, spaces or [None] * len(tokens))
    ]


def final_token(tokenizer, ids: list[int]) -> str | None:
    """The special token the tokenizer ends every text with ([SEP], </s>), which --truncate keeps; None if it ends with none."""
    if not ids or not getattr(tokenizer, "ends_with_special", True):
        return None
    return tokenizer.convert_ids_to_tokens(ids[-1:])[0]


def truncate_ids(ids: list[int], max_positions: int, final: str | None = "[SEP]") -> tuple[list[int], Truncation | None]:
    """--truncate: the first max_positions - 1 tokens and the final special token (final, e.g. "[SEP]"),
    or with final None the first max_positions; and the cut, None when it fits."""
    if len(ids) <= max_positions:
        return ids, None
    kept = ids[: max_positions - 1] + ids[-1:] if final is not None else ids[:max_positions]
    return kept, Truncation(len(ids), max_positions, kept_final=final)


def text_truncations(tokenizer: WordPieceTokenizer, texts: list[str], max_positions: int) -> list[Truncation | None]:
    """What --truncate cuts from each text, as encode cuts it."""
    return [truncate_ids(ids, max_positions, final_token(tokenizer, ids))[1] for ids in tokenizer.encode_batch(texts)]


NOTE_QUOTE_CHARS = 24  # enough of a text to tell it from the others in a batch


def truncation_note(text: str, truncation: Truncation | None, what: str = "the text") -> str | None:
    """One line saying what --truncate dropped, naming the text by its start; None when nothing was cut."""
    if truncation is None:
        return None
    start = " ".join(text.split())
    quoted = start if len(start) <= NOTE_QUOTE_CHARS else start[:NOTE_QUOTE_CHARS].rstrip() + "…"
    if truncation.kept_final is not None:
        dropped = f"the {truncation.dropped} tokens before its final {truncation.kept_final}"
    else:
        dropped = f"its last {truncation.dropped} tokens"
    return f'--truncate cut {what} "{quoted}" from {truncation.before} to {truncation.after} tokens: dropped {dropped}'



def unknown_tokens(tokenizer, ids: list[int]) -> UnknownTokens:
    """How many of a text's own tokens (its ids less the special ones) are the tokenizer's unknown token."""
    unk = tokenizer.unk_token_id
    special = set(tokenizer.all_special_ids)
    own = [i for i in ids if i not in special or (unk is not None and i == unk)]
    count = sum(i == unk for i in own) if unk is not None else 0
    return UnknownTokens(count, len(own), tokenizer.unk_token or "[UNK]")


def better_models(text: str) -> str:
    """What to run instead when a model's vocabulary does not cover the text: offline and online.

    SmolLM2 is bundled and byte-level (no token is unknown to it), and reads Chinese; the online
    models are BERTs whose vocabularies cover the script.
    """
    if _CJK.search(text):
        return "offline: --model smollm2 --words (SmolLM2 reads Chinese); online: --model bert-base-chinese"
    return "offline: --model smollm2 --words (byte-level: no [UNK]); online: --model bert-base-multilingual-cased"


def unknown_token_note(
    tokenizer: WordPieceTokenizer, text: str, ids: list[int], model_name: str, what: str = "the text"
) -> str | None:
    """A warning when UNKNOWN_SHARE_NOTED or more of the text's own tokens are [UNK] for this model.

    The note names the text by what it is ("the text", "the --kv text") and its start, so that
    among several texts (--file, --kv) it says which one it is about.
    """
    from attnviz.text import shorten

    unknown = unknown_tokens(tokenizer, ids)
    if not unknown.high:
        return None
    return (
        f'{unknown.count} of {unknown.of} tokens of {what} "{shorten(text, NOTE_QUOTE_CHARS)}" are '
        f"{unknown.token} for {model_name}: its vocabulary does not cover this text; {better_models(text)}"
    )


def text_notes(
    loaded, texts: list[str], ids: list[list[int]], whats: list[str] | None = None
) -> list[str]:
    """What to tell the user about these texts on a loaded model (a LoadedModel): its note, and texts mostly [UNK].

    whats name each text in its note ("the text", "the --kv text"); each note quotes its text.
    """
    whats = whats or ["the text"] * len(texts)
    notes = (
        unknown_token_note(loaded.tokenizer, text, text_ids, loaded.name, what)
        for text, text_ids, what in zip(texts, ids, whats)
    )
    return ([loaded.note] if loaded.note else []) + [note for note in notes if note]


def truncation_notes(texts: list[str], truncations: list, what: str = "the text") -> list[str]:
    notes = (truncation_note(text, truncation, what) for text, truncation in zip(texts, truncations))
    return [note for note in notes if note]

"""Every family but BERT's tokenizer, through transformers: its AutoTokenizer (never remote code) with the interface
attnviz's encoding reads (models/tokens.py has BERT's own)."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from torch import nn

from attnviz.errors import AttnvizError
from attnviz.models.shown import space_before
from attnviz.models.words import tokenizer_scheme


class TransformersTokenizer:
    """A family's own tokenizer (transformers' AutoTokenizer, never remote code) with the interface encode() needs.

    start_token_id set: a decoder's view of it, the ids shifted right behind the decoder's start
    token, as an encoder-decoder's decoder reads a text (teacher forcing).
    """

    def __init__(self, tokenizer: Any, embedding_rows: int, start_token_id: int | None = None):
        self._tokenizer = tokenizer
        self.embedding_rows = embedding_rows
        self.start_token_id = start_token_id
        self.unk_token = tokenizer.unk_token or "<unk>"
        self.unk_token_id = tokenizer.unk_token_id
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.all_special_ids = sorted(set(tokenizer.all_special_ids))
        self.mask_token, self.mask_token_id = tokenizer.mask_token, tokenizer.mask_token_id  # an encoder's, else None
        ids = self._raw_ids(["a"])[0]
        # e.g. [SEP], </s>: --truncate keeps it. A decoder's shifted view ends with the text's own last token.
        self.ends_with_special = start_token_id is None and bool(ids) and ids[-1] in self.all_special_ids

    @cached_property
    def word_scheme(self) -> str | None:
        """How its tokens mark words (models/words.py), from the fast tokenizer's tokenizer.json; None (guessed from the tokens) for a slow one."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        return tokenizer_scheme(json.loads(backend.to_str())) if backend is not None else None

    def for_decoder(self, start_token_id: int) -> "TransformersTokenizer":
        return TransformersTokenizer(self._tokenizer, self.embedding_rows, start_token_id)

    def _raw_ids(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self._tokenizer(texts, add_special_tokens=True)["input_ids"]]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._as_read(self._raw_ids(texts))

    def encode_with_spaces(self, texts: list[str]) -> tuple[list[list[int]], list[list[bool]] | None]:
        """encode_batch's ids, and whether whitespace precedes each of their tokens, from one call of the tokenizer:
        a fast tokenizer's offsets of the same encoding; None for a slow one (it has no offsets)."""
        if not self._tokenizer.is_fast:
            return self.encode_batch(texts), None
        encoded = self._tokenizer(texts, add_special_tokens=True, return_offsets_mapping=True)
        spaces = [space_before(text, row) for text, row in zip(texts, encoded["offset_mapping"])]
        if self.start_token_id is not None:  # the decoder's view: shifted right behind its start token
            spaces = [[False, *row[:-1]] for row in spaces]
        return self._as_read([list(ids) for ids in encoded["input_ids"]]), spaces

    def _as_read(self, ids: list[list[int]]) -> list[list[int]]:
        """ids as the model reads them: shifted for a decoder's view (start_token_id), each row checked against the embedding table."""
        if self.start_token_id is not None:
            ids = [[self.start_token_id, *row[:-1]] for row in ids]
        for row in ids:
            if row and max(row) >= self.embedding_rows:
                raise AttnvizError(
                    f"the tokenizer gives the id {max(row)}, past the {self.embedding_rows} rows of the model's "
                    "embedding table: the tokenizer is not this model's"
                )
        return ids

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return self._tokenizer.convert_ids_to_tokens(ids)

    def pieces(self, text: str) -> list[int]:
        """The ids of a piece of text alone, no special token around it (an answer token: analysis/patching.py)."""
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """The text of ids (a continuation: generate), special tokens kept as they are."""
        return self._tokenizer.decode(ids)

    def chat_prompt(self, text: str) -> str | None:
        """text as the user's turn of the checkpoint's chat template, the assistant's turn opened after it (an
        instruct model's prompt); None where the checkpoint has no chat template."""
        if not getattr(self._tokenizer, "chat_template", None):
            return None
        return self._tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def load_transformers_tokenizer(folder: Path, embedding_rows: int) -> TransformersTokenizer:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    finally:
        hf_logging.set_verbosity(verbosity)
    return TransformersTokenizer(tokenizer, embedding_rows)


def embedding_rows(model: nn.Module) -> int:
    return model.get_input_embeddings().weight.shape[0]

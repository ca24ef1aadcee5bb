"""Tokenization with the model's own BERT tokenizer, [CLS] and [SEP] included."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from attnviz.errors import AttnvizError

# CJK ideographs, kana and hangul: text a Chinese, Japanese or Korean vocabulary handles.
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")


@dataclass
class Encoded:
    """A padded batch of texts. input_ids, attention_mask, token_type_ids: (B, N)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    tokens: list[list[str]]  # each text's tokens, padding left out
    ids: list[list[int]]

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


def encode(tokenizer, texts: list[str], max_positions: int, truncate: bool = False) -> Encoded:
    """Tokenize texts into one padded batch, refusing blank texts and texts too long for the model."""
    for text in texts:
        if not text.strip():
            raise AttnvizError("the text is empty: give some words to attend over")
    if not truncate:
        lengths = [len(ids) for ids in tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
        longest = max(lengths)
        if longest > max_positions:
            raise AttnvizError(
                f"the text has {longest} tokens, more than the model's {max_positions} positions; "
                "shorten it or pass --truncate"
            )
    batch = tokenizer(
        texts,
        padding=True,
        truncation=truncate,
        max_length=max_positions if truncate else None,
        return_tensors="pt",
        return_token_type_ids=True,
    )
    ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    return Encoded(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        tokens=[tokenizer.convert_ids_to_tokens(row) for row in ids],
        ids=ids,
    )


def unknown_token_notice(tokenizer, text: str, ids: list[int], model_name: str) -> str | None:
    """A warning when more than a third of the text's own tokens are [UNK] for this model."""
    special = set(tokenizer.all_special_ids)
    own = [i for i in ids if i not in special or i == tokenizer.unk_token_id]
    unknown = sum(i == tokenizer.unk_token_id for i in own)
    if not own or unknown * 3 <= len(own):
        return None
    better = "bert-base-chinese" if _CJK.search(text) else "bert-base-multilingual-cased"
    return (
        f"{unknown} of {len(own)} tokens are {tokenizer.unk_token} for {model_name}: "
        f"its vocabulary does not cover this text; try --model {better}"
    )

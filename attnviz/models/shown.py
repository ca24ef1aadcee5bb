"""Tokens as a reader sees them: the text each token stands for, whitespace made visible.

The tokenizers' own spellings are codes: byte-level BPE (GPT-2, SmolLM2, Llama 3) writes each byte as a
stand-in character ("Ġcat" for " cat", "Ċ" for a newline, "æĪ" "ĳ" for the two pieces of 我),
SentencePiece writes a space as "▁" and unknown bytes as "<0xE6>", WordPiece marks a continuation "##".
shown_tokens turns them into one convention for every scheme:

- Whitespace shows as a mark (MARKS): "␣" a space, "↵" a newline, "⇥" a tab, control characters as
  their Unicode control pictures. " cat" is "␣cat"; a piece with no mark continues the text before it.
- WordPiece: "##ing" is "ing" (it continues the piece before it, as any unmarked piece does), and a piece
  that follows whitespace in the text gets "␣", as byte-level and SentencePiece pieces do; whether
  whitespace precedes a piece comes from the tokenizer's offsets (space_before). Without them the
  tokens are shown as the tokenizer made them ("##" kept), which is still true.
- A character whose UTF-8 bytes are split over several tokens shows in each with its part: 我¹/₂, 我²/₂.
- Bytes that never form a valid character show as hex, <E6>; never as Latin-1 mojibake.
- Special tokens ([CLS], <s>, <|im_start|>) and unknown ones ([UNK], <unk>) are shown unchanged.

Joining the shown tokens with the marks turned back into whitespace and each split character's parts
merged gives back the text the tokenizer decodes the tokens to.
"""

from __future__ import annotations

import re

from attnviz.models.words import BYTE_LEVEL, SENTENCEPIECE, SPECIAL_TOKENS, UNKNOWN_TOKENS, WORDPIECE, token_bytes

# Whitespace and control characters as visible marks: U+2423 for a space, U+21B5 a newline, U+21E5 a
# tab, and the other C0 controls (and DEL) as Unicode's control pictures (U+2400 + code, U+2421).
MARKS = {
    **{chr(code): chr(0x2400 + code) for code in range(32)},
    " ": "␣",
    "\n": "↵",
    "\t": "⇥",
    "\x7f": "␡",
}
SPACE_MARK = MARKS[" "]
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
_SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")

_SPECIAL_PATTERN = re.compile(r"<\|[^|]*\|>|\[[A-Z_]+\]")  # <|endoftext|>, <|im_start|>, [CLS]-like


def shown_tokens(
    tokens: list[str],
    scheme: str,
    space_before: list[bool] | None = None,
    special_tokens: frozenset[str] | set[str] = SPECIAL_TOKENS,
) -> list[str]:
    """Each token as shown to a reader (the module's docstring gives the convention).

    scheme: models/words.py's WORDPIECE, SENTENCEPIECE or BYTE_LEVEL. space_before: for WordPiece,
    whether whitespace precedes each token in the text (see space_before). special_tokens: shown as they
    are, besides any <|...|> and [NAME] token.
    """
    if scheme == WORDPIECE:
        if space_before is None:
            return list(tokens)
        return [
            token if _is_special(token, special_tokens) else token[2:] if token.startswith("##") else SPACE_MARK * spaced + token
            for token, spaced in zip(tokens, space_before)
        ]
    shown, run = list(tokens), []  # run: the positions of consecutive text tokens, shown together
    for position, token in enumerate([*tokens, None]):
        if token is not None and not _is_special(token, special_tokens):
            run.append(position)
            continue
        for index, text in zip(run, _shown_bytes([token_bytes(tokens[index], scheme) for index in run])):
            shown[index] = text
        run = []
    return shown


def space_before(text: str, offsets: list[tuple[int, int]]) -> list[bool]:
    """Whether whitespace comes right before each token in text, from the tokenizer's (start, end) offsets."""
    return [0 < start <= len(text) and text[start - 1].isspace() for start, _ in offsets]


def part(char: str, index: int, count: int) -> str:
    """ "我¹/₂": part index (from 1) of a character whose bytes are split over count tokens."""
    return f"{char}{str(index).translate(_SUPERSCRIPT)}/{str(count).translate(_SUBSCRIPT)}"


def _shown_bytes(pieces: list[bytes]) -> list[str]:
    """Consecutive tokens' bytes as text: whole characters, the parts of split ones, hex for invalid bytes."""
    data = b"".join(pieces)
    owner = [index for index, piece in enumerate(pieces) for _ in piece]  # the token of each byte
    shown = [""] * len(pieces)
    position = 0
    while position < len(data):
        length = _character_length(data, position)
        if length == 0:
            shown[owner[position]] += f"<{data[position]:02X}>"
            position += 1
            continue
        char = data[position : position + length].decode()
        char = MARKS.get(char, char)
        holders = sorted(set(owner[position : position + length]))
        for index, holder in enumerate(holders, 1):
            shown[holder] += char if len(holders) == 1 else part(char, index, len(holders))
        position += length
    return shown


def _character_length(data: bytes, position: int) -> int:
    """The number of bytes of the valid UTF-8 character that starts at position; 0 when none does."""
    for length in range(1, 5):
        try:
            if len(data[position : position + length].decode("utf-8")) == 1:
                return length
        except UnicodeDecodeError:
            continue
    return 0


def _is_special(token: str, special_tokens) -> bool:
    return token in special_tokens or token in UNKNOWN_TOKENS or bool(_SPECIAL_PATTERN.fullmatch(token))


_MARK_NAMES = {"␣": "a space", "↵": "a newline", "⇥": "a tab"}


def marks_legend(shown: list[str]) -> str:
    """What the marks in these shown tokens stand for, e.g. "␣ a space; 我¹/₂ part 1 of 2 of a character's bytes"; "" when none shows."""
    text = "".join(shown)
    parts = [f"{mark} {name}" for mark, name in _MARK_NAMES.items() if mark in text]
    split = _PART.search(text)
    if split:
        index, count = (int(digits.translate(_DIGITS)) for digits in split.group(0)[1:].split("/"))
        parts.append(f"{split.group(0)} part {index} of a character split over {count} tokens")
    return "; ".join(parts)


_DIGITS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹₀₁₂₃₄₅₆₇₈₉", "01234567890123456789")


def unshown(shown: list[str]) -> str:
    """The text shown tokens spell: marks back to whitespace, each split character once (its first part
    kept, the others dropped). The inverse of shown_tokens, for tests and checks."""
    whitespace = {mark: char for char, mark in MARKS.items()}
    text = _PART.sub(lambda found: found.group(1) if found.group(2) == "¹" else "", "".join(shown))
    return "".join(whitespace.get(char, char) for char in text)


_PART = re.compile(r"(.)([⁰¹²³⁴⁵⁶⁷⁸⁹]+)/[₀₁₂₃₄₅₆₇₈₉]+")

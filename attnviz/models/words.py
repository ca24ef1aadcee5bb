"""Words, not word pieces: which word each token belongs to, and attention merged over words.

token_words(tokens, text) gives the word of every token and each word's label, from the tokens'
strings and the text alone (no tokenizer object: the marks and the text are enough):

- Special tokens ([CLS], [SEP], [PAD], <s>, </s>, <|endoftext|>, ...) are words of their own.
- WordPiece: a "##" piece continues the word before it ("una" "##ffa" "##ble" -> unaffable).
- SentencePiece: a piece starting with "▁" starts a word, any other continues one; byte-fallback
  pieces ("<0xE6>") are read as the bytes they stand for.
- Byte-level BPE (GPT-2, SmolLM2, Llama 3): the pieces are read back to bytes through GPT-2's
  byte alphabet; a piece starting with a space ("Ġ") starts a word. Pieces that split one UTF-8
  character ('æĪ' 'ĳ' for 我) are one unit, labelled as that character, never as mojibake.
- Punctuation is a word of its own (as BERT's pre-tokenizer makes it), and a change between CJK
  characters and other script starts a word.
- Chinese (text with Han characters and no kana): the Han characters are grouped by rjieba's words
  over the text (jieba's dictionary, in Rust), so 我想吃酸菜鱼 -> 我 / 想 / 吃 / 酸菜鱼.
- Japanese (text with kana): no segmenter is used; each kanji and kana character is a word of its own
  (a piece holding several characters keeps them together).
- Korean: hangul words are written with spaces, so the pieces' marks give its words (no segmenter).
- [UNK] stands for the text between its neighbours' texts (one chunk per [UNK] where BERT's
  pre-tokenizer split the gap into as many chunks: a CJK character, a run of letters or digits, a
  punctuation mark). It is a word of its own, unless the Chinese segmenter's word spans it (酸 [UNK] 鱼
  with 菜 unknown is still one word 酸菜鱼).

shown_labels(words, tokens) puts beside a word what the model saw where its pieces include the unknown token:
"想 [UNK]", "酸菜鱼 [UNK]×3", "酸菜鱼 酸[UNK]鱼", so that a run over words never labels a word the model did not read
as if it had (merge_run's labels; the plain words stay in the run's TokenWords).

merge_attention(attention, query_words, key_words) merges a map by Clark et al. (2019): attention TO
a word is the sum over its pieces (columns), FROM a word the mean over its pieces (rows), so rows
still sum to 1.
"""

from __future__ import annotations

import codecs
import itertools
import re
import unicodedata
from dataclasses import dataclass, replace

from attnviz.run_data import AttentionRun, TokenWords


WORDPIECE = "wordpiece"
SENTENCEPIECE = "sentencepiece"
BYTE_LEVEL = "byte-level"
SCHEMES = (WORDPIECE, SENTENCEPIECE, BYTE_LEVEL)

SPECIAL_TOKENS = frozenset(
    {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "<s>", "</s>", "<pad>", "<mask>", "<bos>", "<eos>", "<cls>", "<sep>"}
)
UNKNOWN_TOKENS = frozenset({"[UNK]", "<unk>"})
_SPECIAL_PATTERN = re.compile(r"<\|[^|]*\|>|\[[A-Z_]+\]")  # <|endoftext|>, <|im_start|>, [CLS]-like
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback pieces

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
# One pre-token of BERT's: a CJK character, a run of letters and digits, or one other mark.
_PRE_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]+|[^\w\s]")


@dataclass(frozen=True)
class Words:
    """index: the word of every token (0, 1, ... in order); labels: each word's text."""

    index: list[int]
    labels: list[str]


@dataclass
class _Unit:
    """Tokens that go together whatever the words: one token, or byte pieces that complete characters."""

    tokens: list[int]
    kind: str  # "special", "unknown" or "text"
    surface: str | None  # the text the tokens spell; None for special and unknown
    starts_word: bool  # the first token's mark says a word starts here (no ##; ▁ or a space)
    span: tuple[int, int] | None = None  # its characters in the text, once aligned


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's bytes_to_unicode: each byte's printable stand-in (printable Latin-1 bytes are themselves;
    the rest are numbered from U+0100 in byte order, so the space 0x20 is 'Ġ' and the newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in alphabet:
            alphabet[byte] = chr(256 + extra)
            extra += 1
    return alphabet


_BYTE_OF_CHAR = {char: byte for byte, char in byte_level_alphabet().items()}


def guess_scheme(tokens: list[str]) -> str:
    """The tokenizer's marks as the tokens show them: "##" WordPiece, "▁" SentencePiece, "Ġ" or
    another char of the byte alphabet past U+00FF byte-level BPE; WordPiece when none shows.
    A guess: one byte-level word of several pieces with no space before it ("un" "bel" "ievable")
    shows no mark and reads as WordPiece's separate words; a caller with the tokenizer's
    tokenizer.json should pass tokenizer_scheme(...) instead."""
    pieces = [token for token in tokens if not _is_special(token)]
    if any(token.startswith("##") for token in pieces):
        return WORDPIECE
    if any("▁" in token or _BYTE_FALLBACK.fullmatch(token) for token in pieces):
        return SENTENCEPIECE
    if any(char in _BYTE_OF_CHAR and ord(char) > 0xFF for token in pieces for char in token):
        return BYTE_LEVEL
    return WORDPIECE


def tokenizer_scheme(tokenizer_json: dict) -> str:
    """The scheme of a tokenizer.json's tokenizer: byte-level where a ByteLevel step reads its text
    (GPT-2, SmolLM2, Llama 3), WordPiece for a WordPiece model, else SentencePiece (▁ marks: T5, Llama 2)."""
    steps = [tokenizer_json.get(key) or {} for key in ("pre_tokenizer", "decoder")]
    steps += [inner for step in steps for inner in step.get("pretokenizers", []) + step.get("decoders", [])]
    if any(step.get("type") == "ByteLevel" for step in steps):
        return BYTE_LEVEL
    return WORDPIECE if (tokenizer_json.get("model") or {}).get("type") == "WordPiece" else SENTENCEPIECE


def token_words(
    tokens: list[str], text: str, scheme: str | None = None, special_tokens: frozenset[str] | set[str] = SPECIAL_TOKENS
) -> Words:
    """The word of every token of `text` and the words' labels (see the module's docstring for the rules).

    scheme: WORDPIECE, SENTENCEPIECE or BYTE_LEVEL (tokenizer_scheme(...) of the tokenizer.json), guessed
    from the tokens when None. special_tokens: the tokens that are words of their own, besides any
    <|...|> and [NAME] token.
    """
    scheme = scheme or guess_scheme(tokens)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tokenizer scheme {scheme!r}; one of {', '.join(SCHEMES)}")
    units = _units(tokens, scheme, special_tokens)
    _align(units, text)
    chinese = _chinese_words(text) if _HAN.search(text) and not _KANA.search(text) else None
    index, groups = [0] * len(tokens), []
    for position, unit in enumerate(units):
        if position == 0 or not _joins(units[position - 1], unit, text, chinese):
            groups.append([])
        groups[-1].append(unit)
        for token in unit.tokens:
            index[token] = len(groups) - 1
    return Words(index, [_label(group, tokens, text) for group in groups])


def _is_special(token: str, special_tokens=SPECIAL_TOKENS) -> bool:
    return token in special_tokens or bool(_SPECIAL_PATTERN.fullmatch(token)) and token not in UNKNOWN_TOKENS


def _units(tokens: list[str], scheme: str, special_tokens) -> list[_Unit]:
    """The tokens as units; byte pieces are gathered until they complete their characters."""
    units: list[_Unit] = []
    pending: _Unit | None = None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for position, token in enumerate(tokens):
        if _is_special(token, special_tokens) or token in UNKNOWN_TOKENS:
            if pending is not None:  # a character cut short before a special token: U+FFFD
                pending.surface += decoder.decode(b"", final=True)
            pending = None
            kind = "unknown" if token in UNKNOWN_TOKENS else "special"
            units.append(_Unit([position], kind, None, kind == "unknown"))
        elif scheme == WORDPIECE:
            units.append(_Unit([position], "text", token.removeprefix("##"), not token.startswith("##")))
        else:
            raw = token_bytes(token, scheme)
            if pending is None:
                pending = _Unit([], "text", "", raw[:1].isspace() or token.startswith("▁"))
                units.append(pending)
            pending.tokens.append(position)
            pending.surface += decoder.decode(raw)
            if not decoder.getstate()[0]:  # no bytes left waiting for the rest of a character
                pending = None
    if pending is not None:  # a text cut inside a character (--truncate): its bytes show as U+FFFD
        pending.surface += decoder.decode(b"", final=True)
    return units


def token_bytes(token: str, scheme: str) -> bytes:
    """The bytes of the text a byte-level or SentencePiece token stands for."""
    if scheme == SENTENCEPIECE:
        fallback = _BYTE_FALLBACK.fullmatch(token)
        return bytes([int(fallback.group(1), 16)]) if fallback else token.replace("▁", " ").encode()
    if all(char in _BYTE_OF_CHAR for char in token):
        return bytes(_BYTE_OF_CHAR[char] for char in token)
    return token.encode()  # an added token written as plain text


def _fold(text: str) -> str:
    """Text as an uncased WordPiece vocabulary writes it: lower case, accents dropped."""
    return "".join(char for char in unicodedata.normalize("NFD", text.lower()) if not unicodedata.combining(char))


def _align(units: list[_Unit], text: str) -> None:
    """Give each text unit its characters in `text`, searching forward; an [UNK] gets the gap its
    neighbours leave (shared with the [UNK]s beside it unless the gap splits into one chunk each)."""
    folded, origin = [], []  # the folded text, and each folded character's index in text
    for position, char in enumerate(text):
        for folded_char in _fold(char):
            folded.append(folded_char)
            origin.append(position)
    folded_text = "".join(folded)
    cursor, unknowns = 0, []
    for unit in units:
        if unit.kind == "unknown":
            unknowns.append(unit)
        if unit.kind != "text" or not unit.surface.strip():
            continue
        needle = _fold(unit.surface.strip())
        found = folded_text.find(needle, cursor)
        if found < 0:
            continue
        _share_gap(unknowns, text, origin[cursor] if cursor < len(origin) else len(text), origin[found])
        unknowns = []
        unit.span = (origin[found], origin[found + len(needle) - 1] + 1)
        cursor = found + len(needle)
    _share_gap(unknowns, text, origin[cursor] if cursor < len(origin) else len(text), len(text))


def _share_gap(unknowns: list[_Unit], text: str, start: int, end: int) -> None:
    if not unknowns:
        return
    chunks = [(start + m.start(), start + m.end()) for m in _PRE_TOKEN.finditer(text[start:end])]
    if not chunks:
        return
    for position, unit in enumerate(unknowns):
        unit.span = chunks[position] if len(chunks) == len(unknowns) else (chunks[0][0], chunks[-1][1])


def _chinese_words(text: str) -> list[int]:
    """The index of rjieba's word each character of `text` lies in."""
    import rjieba

    word_of_char = [0] * len(text)
    for number, (_, start, end) in enumerate(rjieba.tokenize(text)):
        word_of_char[start:end] = [number] * (end - start)
    return word_of_char


def _is_cjk(char: str) -> bool:
    return bool(_HAN.match(char) or _KANA.match(char))


def _joins(previous: _Unit, unit: _Unit, text: str, chinese: list[int] | None) -> bool:
    """Whether `unit` continues the word of the unit before it."""
    if "special" in (previous.kind, unit.kind):
        return False
    if not (previous.span and unit.span) and "\ufffd" in (previous.surface or "") + (unit.surface or ""):
        return False  # a character cut short is not in the text: it cannot be placed in a word
    if previous.span and unit.span:
        if text[previous.span[1] : unit.span[0]].strip() != text[previous.span[1] : unit.span[0]]:
            return False  # a space lies between them
        before, after = text[previous.span[1] - 1], text[unit.span[0]]
        if _is_cjk(before) != _is_cjk(after):
            return False
        if _is_cjk(before):  # and after: Chinese words by the segmenter, Japanese characters apart
            return chinese is not None and chinese[previous.span[1] - 1] == chinese[unit.span[0]]
    if "unknown" in (previous.kind, unit.kind):
        return False
    if _is_punctuation((previous.surface or "").strip()) or _is_punctuation((unit.surface or "").strip()):
        return False
    return not unit.starts_word


def _is_punctuation(text: str) -> bool:
    """Text made only of Unicode punctuation (categories P*): a word of its own, as BERT's pre-tokenizer makes it."""
    return bool(text) and all(unicodedata.category(char).startswith("P") for char in text)


def _label(group: list[_Unit], tokens: list[str], text: str) -> str:
    """A word's text: its characters in the text where they were found, else what its pieces spell;
    a word of whitespace alone (GPT-2's lone "Ġ", "Ċ") keeps its tokens' own marks, never an empty label."""
    if all(unit.span for unit in group):
        label = text[group[0].span[0] : group[-1].span[1]].strip()
    else:
        label = "".join(unit.surface.strip() if unit.surface else tokens[unit.tokens[0]] for unit in group)
    return label or "".join(tokens[token] for unit in group for token in unit.tokens)


def shown_labels(words: Words, tokens: list[str], unknown: frozenset[str] | set[str] = UNKNOWN_TOKENS) -> list[str]:
    """Each word's label, with what the model saw beside it where a piece of the word is an unknown token:
    "想 [UNK]", "酸菜鱼 [UNK]×3" (a run of unknown pieces counted), "酸菜鱼 酸[UNK]鱼" (the known pieces' text, ## and ▁
    dropped); a word with no unknown piece, or that shows nothing more ("[UNK]" alone), is its label alone."""
    pieces: list[list[str]] = [[] for _ in words.labels]
    for token, word in zip(tokens, words.index):
        pieces[word].append(token)
    shown = []
    for label, parts in zip(words.labels, pieces):
        seen = _seen(parts, unknown) if any(part in unknown for part in parts) else label
        shown.append(label if seen == label else f"{label} {seen}")
    return shown


def _seen(pieces: list[str], unknown) -> str:
    """What a word's pieces gave the model: the known pieces' text, each run of unknown ones as "[UNK]" or "[UNK]×3"."""
    parts = []
    for piece, same in itertools.groupby(pieces):
        count = len(list(same))
        if piece in unknown:
            parts.append(piece if count == 1 else f"{piece}×{count}")
        else:
            parts += [piece.removeprefix("##").replace("▁", "")] * count
    return "".join(parts)


def merge_attention(attention, query_words: list[int], key_words: list[int]):
    """Attention (..., Nq, Nk) over tokens -> (..., Wq, Wk) over words, by Clark et al. (2019).

    Attention to a word is the sum over its pieces' columns; attention from a word is the mean
    over its pieces' rows, so a row that summed to 1 still does. A merged cell is 0 only where all
    its pieces' cells are (a causal mask stays a mask). Works on NumPy arrays and torch tensors.
    """
    *_, num_queries, num_keys = attention.shape
    rows = word_means(query_words, num_queries, "query")  # (Wq, Nq): each word's mean over its pieces
    cols = _membership(key_words, num_keys, "key")  # (Wk, Nk): 1 where a token is in the word
    if hasattr(attention, "new_tensor"):  # torch
        return attention.new_tensor(rows) @ attention @ attention.new_tensor(cols.T)
    return rows.astype(attention.dtype) @ attention @ cols.T.astype(attention.dtype)


def run_words(tokenizer, run: AttentionRun) -> tuple[Words, Words]:
    """The words of a run's query and key tokens, by its tokenizer's marks (tokens.py's word_scheme) and
    special tokens; keys read from the --kv text, or, for an encoder-decoder's cross stack, the encoder's view of the text."""
    query = tokenizer_words(tokenizer, run.query_tokens, run.text)
    if run.key_tokens == run.query_tokens and run.kv_text is None:
        return query, query
    return query, tokenizer_words(tokenizer, run.key_tokens, run.kv_text or run.text)


def tokenizer_words(tokenizer, tokens: list[str], text: str) -> Words:
    """The words of `text`'s tokens as `tokenizer` made them: token_words by its marks (tokens.py's word_scheme) and special tokens."""
    special = SPECIAL_TOKENS | set(tokenizer.convert_ids_to_tokens(tokenizer.all_special_ids))
    return token_words(tokens, text, tokenizer.word_scheme, special)


def merge_run(run: AttentionRun, query: Words, key: Words) -> AttentionRun:
    """The run over words: labels for tokens (shown_labels: "想 [UNK]" where the model read an unknown token), attention
    merged (merge_attention), each word's output the mean of its pieces' outputs (the rows' rule); the tokens and the
    plain words kept in run.words."""
    if run.words is not None:
        raise ValueError("the run is over words already")
    unknown = UNKNOWN_TOKENS | ({run.unknown.token} if run.unknown is not None else set())
    tokens = TokenWords(
        run.query_tokens, run.query_ids, list(query.index), run.key_tokens, run.key_ids, list(key.index), run.attention,
        query_plain_words=list(query.labels), key_plain_words=list(key.labels),
    )  # fmt: skip
    return replace(
        run,
        query_tokens=shown_labels(query, run.query_tokens, unknown),
        key_tokens=shown_labels(key, run.key_tokens, unknown),
        query_ids=[],
        key_ids=[],
        attention=merge_attention(run.attention, query.index, key.index),
        output=word_means(query.index, len(run.query_tokens), "query").astype(run.output.dtype) @ run.output,
        words=tokens,
    )


def word_means(words: list[int], num_tokens: int | None = None, side: str = "query"):
    """(W, N): each word's mean over its tokens, row w 1/|w| on w's tokens (Clark et al.'s rule for rows)."""
    rows = _membership(words, len(words) if num_tokens is None else num_tokens, side)
    return rows / rows.sum(axis=1, keepdims=True)


def _membership(words: list[int], num_tokens: int, side: str):
    import numpy as np

    if len(words) != num_tokens:
        raise ValueError(f"{len(words)} {side} words for {num_tokens} {side} tokens")
    if list(words) and sorted(set(words)) != list(range(max(words) + 1)):
        raise ValueError(f"the {side} words must be numbered 0, 1, ... with none left out")
    matrix = np.zeros((max(words, default=-1) + 1, num_tokens))
    matrix[list(words), range(num_tokens)] = 1.0
    return matrix

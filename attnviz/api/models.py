"""attnviz.load: a model handle, loaded once per process, device and dtype.

Every API function takes model= as a name ("bundled", a hub id), a local folder, or a handle
that load returned; a name already loaded on the same device in the same dtype is not loaded again.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.api.arguments import must_be_bool, must_be_device, must_be_dtype, refuse
from attnviz.api.notes import warn_notes
from attnviz.errors import AttnvizError

MODEL_TYPES = "a name, a folder or an attnviz.load() handle"  # what model= takes
_LOADED: dict[tuple, "Model"] = {}  # (model key, device, dtype asked for, allow_pickle, layer_at_a_time) -> its handle


@dataclass(frozen=True, repr=False)
class Model:
    """A loaded model (any family attnviz supports) and its tokenizer, where they came from, and the device they are on.

    name is the model as given to load (None: the default), resolved the one that loaded (a hub
    id, the bundled model's name, or a folder's absolute path), source where it came from.
    The sizes (num_layers, num_heads, num_kv_heads) are an encoder-decoder's encoder's.
    """

    name: str | None
    resolved: str
    source: str  # "local folder", "local file" (a GGUF file), "hub cache", "hub download" or "bundled"
    device: str  # "cpu" or "cuda"
    loaded: Any  # attnviz.models.loading.LoadedModel

    @property
    def tokenizer(self):
        """The model's tokenizer: attnviz's WordPiece tokenizer for BERT, the checkpoint's own through transformers otherwise."""
        return self.loaded.tokenizer

    @property
    def model(self):
        """The model in eval mode: attnviz's BertEncoder for BERT, a transformers_model.TransformersModel otherwise."""
        return self.loaded.model

    @property
    def family(self) -> str:
        """The model's family as people write it: "BERT", "GPT-2", "Llama", "T5"..."""
        return self.loaded.family.name

    @property
    def kind(self) -> str:
        """ "encoder", "decoder" (causal) or "encoder-decoder"."""
        return self.loaded.family.kind

    @property
    def dtype(self) -> str:
        """What the model computes in: "float32", "bfloat16" or "float16" (load's dtype, "auto" resolved)."""
        return self.loaded.dtype

    @property
    def device_label(self) -> str:
        """The device as the command line's setup names it (with the GPU's name)."""
        from attnviz.layer_inputs import device_label

        return device_label(self.device)

    @property
    def num_layers(self) -> int:
        return self.loaded.num_layers

    @property
    def num_heads(self) -> int:
        return self.loaded.num_heads

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads: fewer than num_heads with grouped-query attention, else the same."""
        return self.loaded.num_kv_heads

    @property
    def hidden_size(self) -> int:
        return self.loaded.hidden_size

    def __repr__(self) -> str:
        kv_heads = f", {self.num_kv_heads} key/value heads" if self.num_kv_heads != self.num_heads else ""
        return (
            f"attnviz.Model({self.resolved!r}, {self.family} {self.kind}, source={self.source!r}, device={self.device!r}, dtype={self.dtype!r}, "
            f"{self.num_layers} layers × {self.num_heads} heads{kv_heads})"
        )


def load(
    model: str | Path | Model | None = None,
    device: str = "auto",
    *,
    dtype: str = "auto",
    allow_pickle: bool = False,
    layer_at_a_time: bool = False,
    cache: bool = True,
) -> Model:
    """Load a model of any supported family by hub id, local folder or "bundled" (None: the default model); once per process.

    device is "auto" (the GPU when torch sees one), "cpu" or "cuda". dtype is what the model loads
    and computes in: "float32", "bfloat16", "float16", or "auto" (the checkpoint's own on a GPU,
    float32 on the CPU). layer_at_a_time reads a transformers family's layers' weights from the checkpoint's files as
    each layer runs, not held (taken anyway where its weights pass 1 GB in dtype: models/layer_weights.py). A handle
    passes through.
    A fallback (the bundled model in place of the default, offline) is an AttnvizWarning when the model loads.
    cache=False loads it afresh and keeps no handle.
    """
    from attnviz.models.listing import refuse_near_miss
    from attnviz.models.loading import load_model
    from attnviz.layer_inputs import resolve_device
    from attnviz.spec import resolved_model_name

    must_be_device(device)
    must_be_dtype(dtype)
    must_be_bool("allow_pickle", allow_pickle)
    must_be_bool("layer_at_a_time", layer_at_a_time)
    must_be_bool("cache", cache)
    if isinstance(model, Model):
        return _on_device(model, device, dtype)
    if model is not None and not isinstance(model, (str, Path)):
        refuse("model", MODEL_TYPES, model)
    name = str(model) if model is not None else None
    device_name = resolve_device(device)
    asked = "float32" if dtype == "auto" and device_name == "cpu" else dtype  # auto on the CPU is float32 (resolve_dtype)
    key = (_model_key(name), device_name, asked, allow_pickle, layer_at_a_time)
    if key in _LOADED and cache:
        return _LOADED[key]
    if name is not None:
        refuse_near_miss(name)  # a typo of a listed model ("smolm2"), before the hub is asked
    loaded = load_model(name, device_name, dtype=dtype, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time)
    handle = Model(name, resolved_model_name(name, loaded), loaded.source, device_name, loaded)
    if cache:
        _LOADED[key] = handle
    warn_notes([loaded.note])  # the fallback, once: when the model loads (api/notes.py's rule)
    return handle


def loaded_models() -> list[Model]:
    """The handles loaded so far in this process, oldest first."""
    return list(_LOADED.values())


@contextlib.contextmanager
def handles_of_its_own():
    """Within, load starts with no handle and keeps those it makes apart; after, the handles of before are back. A command
    line run in a process that has loaded models (tests, a notebook) then loads as a process of its own would."""
    global _LOADED
    before, _LOADED = _LOADED, {}
    try:
        yield
    finally:
        _LOADED = before


def _on_device(model: Model, device: str, dtype: str = "auto") -> Model:
    from attnviz.layer_inputs import resolve_device

    if device != "auto" and resolve_device(device) != model.device:
        raise AttnvizError(
            f"the model is loaded on {model.device}, not {device}: load it with attnviz.load(..., device={device!r})"
        )
    if dtype != "auto" and dtype != model.dtype:
        raise AttnvizError(
            f"the model is loaded in {model.dtype}, not {dtype}: load it with attnviz.load(..., dtype={dtype!r})"
        )
    return model


def family_before_loading(model):
    """The model's Family when it is known without loading it (a handle, the bundled or default BERT, a folder's config.json), else None.

    So that a setting the family rules out (--stack on a decoder, position on GPT-2) is refused before a slow load.
    """
    import json

    from attnviz.models.families import FAMILIES, family_of

    if isinstance(model, Model):
        return model.loaded.family
    if model is None or _model_key(str(model)) == "bundled":
        return FAMILIES[0]  # BERT: the default model and its offline fallback, the bundled one
    config = Path(str(model)).expanduser() / "config.json"
    try:
        return family_of(json.loads(config.read_text(encoding="utf-8")))
    except (OSError, ValueError):  # not a folder, or not one attnviz can read: load_model will say why
        return None


def _model_key(name: str | None) -> str | None:
    """One key per model, however it is named: "bundled" or its name, a folder as its absolute path."""
    from attnviz.models.loading import BUNDLED_NAME
    from attnviz.models.smollm2 import SMOLLM2_NAME, is_smollm2

    if name is None:
        return None
    if name.strip().lower() in (BUNDLED_NAME.lower(), "bundled"):
        return "bundled"
    if is_smollm2(name):
        return SMOLLM2_NAME
    folder = Path(name).expanduser()
    return str(folder.resolve()) if folder.is_dir() else name

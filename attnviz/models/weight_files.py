"""A BERT checkpoint folder, checked before any model is built or any tensor read.

open_checkpoint reads config.json and the weight files' headers (tensor names and shapes, no
data) and refuses, each with a message that completes "cannot load model NAME: ...":

- a config.json size that is not a positive whole number, or a setting of the wrong type;
- a weight file outside the folder: a shard named "../x" or "/etc/x" in an index, or a link
  that leads out (but for links into the hub cache's blobs/, which is how it stores files);
- pickle weights, also as shards that a model.safetensors.index.json names, unless allowed;
- a config whose sizes disagree with the tensors: num_hidden_layers 1,000,000 over a 6-layer
  checkpoint fails here, in milliseconds, instead of building a model for minutes.

load_bert then builds the encoder (on the meta device: no memory), checks every tensor's
shape against it, and puts the checkpoint's tensors in. NaN or infinity in the weights is
found where they are used (bert.py): scanning every weight on every load would cost more than
the rest of the load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import torch

from attnviz.errors import first_line
from attnviz.models.bert_encoder import BertConfig, BertEncoder

SINGLE_FILE = {True: "model.safetensors", False: "pytorch_model.bin"}

# Where each size in config.json can be read off the checkpoint: (tensor, axis). The encoder's
# other shapes follow from these; load_bert checks every tensor once these agree.
SIZE_SOURCES = {
    "hidden_size": ("embeddings.word_embeddings.weight", 1),
    "vocab_size": ("embeddings.word_embeddings.weight", 0),
    "max_position_embeddings": ("embeddings.position_embeddings.weight", 0),
    "type_vocab_size": ("embeddings.token_type_embeddings.weight", 0),
    "intermediate_size": ("encoder.layer.0.intermediate.dense.weight", 0),
}

PICKLE_WARNING = "a pickle file that can run code when loaded; convert it to safetensors, or allow pickle files if you trust it"


class CheckpointError(ValueError):
    """A checkpoint that attnviz will not load; the message says why, in one line."""


@dataclass
class Checkpoint:
    """A checked checkpoint: its config, its weight files, and the shape of every tensor in them."""

    config: BertConfig
    files: list[Path]
    shapes: dict[str, tuple[int, ...]]  # by our parameter name (checkpoint_name)
    unpickled: dict[Path, dict] = field(default_factory=dict, repr=False)  # pickle files, read once for their shapes


def open_checkpoint(folder: Path, config_values: dict, safetensors: bool, allow_pickle: bool) -> Checkpoint:
    """The checkpoint in `folder` with config.json's values, checked; safetensors=False reads pytorch_model.bin."""
    config = BertConfig.from_dict(config_values)
    files = weight_files(folder, safetensors, allow_pickle)
    shapes, unpickled = {}, {}
    for path in files:
        if path.suffix == ".safetensors":
            keyed = safetensors_shapes(path)
        else:  # allowed by now: torch.load(weights_only=True) refuses to run code
            unpickled[path] = _unpickle(path)
            keyed = {key: tuple(tensor.shape) for key, tensor in unpickled[path].items()}
        shapes.update({name: shape for key, shape in keyed.items() if (name := checkpoint_name(key))})
    check_sizes(config, shapes, given=set(config_values))
    return Checkpoint(config, files, shapes, unpickled)


def load_bert(checkpoint: Checkpoint) -> BertEncoder:
    """A BertEncoder (eval mode) holding the checkpoint's tensors, each checked for its shape first."""
    from safetensors.torch import load_file

    with torch.device("meta"):  # no memory and no random initialisation: the checkpoint's tensors replace it all
        model = BertEncoder(checkpoint.config)
    wanted = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    missing = sorted(set(wanted) - set(checkpoint.shapes))
    if missing:
        raise CheckpointError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[0]}")
    for name, shape in wanted.items():
        _require_shape(name, checkpoint.shapes.get(name), shape)
    state = {}
    for path in checkpoint.files:
        tensors = checkpoint.unpickled.pop(path) if path in checkpoint.unpickled else load_file(path)
        state.update({name: tensor for key, tensor in tensors.items() if (name := checkpoint_name(key)) in wanted})
    model.load_state_dict(state, assign=True)
    return model.eval()


def check_sizes(config: BertConfig, shapes: dict[str, tuple[int, ...]], given: set[str]) -> None:
    """Every size in the config against the checkpoint's tensor shapes, before anything is built to those sizes.

    `given` names the fields that config.json sets (the others are BertConfig's defaults).
    """

    def says(size_name: str) -> str:
        value = getattr(config, size_name)
        if size_name in given:
            return f"config.json says {size_name} {value}"
        return f"config.json has no {size_name}, so it is BERT's default {value}"

    for size_name, (tensor, axis) in SIZE_SOURCES.items():
        if tensor not in shapes:
            raise CheckpointError(f"the checkpoint lacks {tensor}")
        shape = shapes[tensor]
        if len(shape) != 2:
            raise CheckpointError(f"the checkpoint's {tensor} has shape {_shape(shape)}, not a matrix")
        if getattr(config, size_name) != shape[axis]:
            raise CheckpointError(f"{says(size_name)}, but the checkpoint's {tensor} has {shape[axis]} (shape {_shape(shape)})")
    layer_numbers = {name.split(".")[2] for name in shapes if name.startswith("encoder.layer.")}
    layers = 1 + max((int(number) for number in layer_numbers if number.isdigit()), default=-1)
    if config.num_hidden_layers > layers:
        raise CheckpointError(f"{says('num_hidden_layers')}, but the checkpoint holds {layers} layers")
    # A header alone could name a million layers of empty tensors: each layer's query weight
    # at full size shows that the file holds the layer, before load_bert builds them all.
    for layer in range(config.num_hidden_layers):
        name = f"encoder.layer.{layer}.attention.self.query.weight"
        _require_shape(name, shapes.get(name), (config.hidden_size, config.hidden_size))


def _require_shape(name: str, found: tuple[int, ...] | None, wanted: tuple[int, ...]) -> None:
    if found is None:
        raise CheckpointError(f"the checkpoint lacks {name}")
    if found != wanted:
        raise CheckpointError(f"the checkpoint's {name} has shape {_shape(found)}, where config.json implies {_shape(wanted)}")


def checkpoint_name(key: str) -> str | None:
    """Our parameter name for a checkpoint tensor's key, or None for tensors we do not use.

    BERT checkpoints prefix the encoder with "bert." when saved with a task head (cls.*,
    pooler.*), and old ones call LayerNorm's weight and bias gamma and beta.
    """
    key = key.removeprefix("bert.")
    if not key.startswith(("embeddings.", "encoder.")) or key.endswith("position_ids"):
        return None
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


# ---- weight files ------------------------------------------------------------------------------


def stored_tensors(folder: Path | None, names, like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Those of `names` that the folder's safetensors hold, by their names there (a task head's, which the base model
    leaves out: a language-model head, a masked-LM head), in like's dtype and on its device; one that holds NaN or
    infinity is refused, naming it."""
    from safetensors import safe_open

    from attnviz.models.families.family import check_finite

    found = {}
    for path in weight_files(folder, safetensors=True, allow_pickle=False) if folder is not None else []:
        if not path.is_file():  # weights in pickle files alone (BERT's, allowed): no head read from them
            continue
        with safe_open(str(path), framework="pt") as tensors:
            found.update({name: tensors.get_tensor(name).to(like) for name in names if name in tensors.keys()})
    for name, tensor in found.items():
        check_finite(tensor, name)
    return found


def weight_files(folder: Path, safetensors: bool, allow_pickle: bool) -> list[Path]:
    """model.safetensors (or pytorch_model.bin), or the shards its index names: each a file inside `folder`."""
    single = folder / SINGLE_FILE[safetensors]
    index = single.with_name(single.name + ".index.json")
    names = shard_names(index, allow_pickle) if index.is_file() else [single.name]
    return [_inside(folder, name) for name in names]


def shard_names(index: Path, allow_pickle: bool) -> list[str]:
    """The shard files that a sharded checkpoint's index (*.index.json) names, checked by name alone.

    A shard is a file name or a relative path that stays in the folder; it is safetensors,
    unless pickle files are allowed. (_inside also follows links, once the files are on disk.)
    """
    try:
        contents = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"unreadable {index.name} ({first_line(error)})") from error
    weight_map = contents.get("weight_map") if isinstance(contents, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(n, str) for n in weight_map.values()):
        raise CheckpointError(f"{index.name} has no weight_map from tensor names to shard files")
    names = sorted(set(weight_map.values()))
    for name in names:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not path.parts or "\\" in name:
            raise CheckpointError(f"{index.name} names the shard {name!r}, which is not a file inside the model folder")
        if path.suffix != ".safetensors" and not allow_pickle:
            raise CheckpointError(f"{index.name} names the shard {name!r}, {PICKLE_WARNING}")
    return names


def _inside(folder: Path, name: str) -> Path:
    """folder / name, refused unless its real path (links followed) is a file in the folder or a hub blob.

    The hub cache keeps files in models--org--name/blobs/ and links to them from the snapshot
    folders (and from folders that `hf download --local-dir` filled in older versions).
    """
    path = folder / name
    real = path.resolve()
    in_hub_blobs = real.parent.name == "blobs" and real.parent.parent.name.startswith("models--")
    if not (real.is_relative_to(folder.resolve()) or in_hub_blobs):
        raise CheckpointError(f"{name} leads outside the model folder (to {real}); weights are read only from inside it")
    if not real.is_file():
        raise CheckpointError(f"the weight file {name} is missing" if not real.exists() else f"{name} is not a file")
    return path


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from a safetensors file's header; the data is not read."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as file:
            return {key: tuple(file.get_slice(key).get_shape()) for key in file.keys()}
    except Exception as error:  # safetensors raises its own error type for a damaged or truncated file
        raise CheckpointError(f"{path.name} is damaged or not safetensors ({first_line(error)})") from error


def _unpickle(path: Path) -> dict:
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch's error for a damaged file, or an unpickling it refused
        raise CheckpointError(f"cannot read {path.name} ({first_line(error)})") from error
    if not isinstance(tensors, dict) or not all(isinstance(tensor, torch.Tensor) for tensor in tensors.values()):
        raise CheckpointError(f"{path.name} does not hold a dictionary of tensors")
    return tensors


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"

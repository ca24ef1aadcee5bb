"""A GPT-2-sized checkpoint for families.py: GPT2Config()'s defaults, random weights (seed 0), no network.

Saves config.json and model.safetensors with the tokenizer files of TOKENIZER_FOLDER (SmolLM2's
byte-level BPE, 49152 tokens: every id has a row in the 50257-row embedding) into SNAPSHOT, and
prints the number of parameters. Run as its own process, so that the bench's own memory (torch,
the model) does not count in the peak memory of the processes it times.

    python bench/gpt2_sized.py SNAPSHOT TOKENIZER_FOLDER
"""

import shutil
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2Model
from transformers.utils import logging as hf_logging

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def main(snapshot: str, tokenizer_folder: str) -> None:
    hf_logging.disable_progress_bar()  # save_pretrained's bar for one shard
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config())  # 12 layers, 12 heads, 768 wide, vocab 50257, 1024 positions
    model.save_pretrained(snapshot)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_folder) / name).exists():
            shutil.copy(Path(tokenizer_folder) / name, Path(snapshot) / name)
    print(sum(parameter.numel() for parameter in model.parameters()))


if __name__ == "__main__":
    main(*sys.argv[1:3])

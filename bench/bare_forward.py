"""The throughput limit under `attnviz stats`: a bare transformers forward pass with attentions.

Loads the model (AutoModel, any family, eager attention) and its tokenizer, tokenizes the file's
texts in the batches `attnviz stats` makes (sorted by length, BATCH_SIZE at a time) and runs the
model with output_attentions=True over them, nothing else. Prints the seconds spent in the loop.
With one text and BATCH_SIZE 1 it is families.py's baseline for `attnviz heads`.

    python bench/bare_forward.py MODEL_DIR TEXTS_FILE BATCH_SIZE DEVICE
"""

import sys
import time

import torch
from transformers import AutoModel, AutoTokenizer


def main(model_dir: str, texts_file: str, batch_size: str, device: str) -> None:
    texts = sorted((line.strip() for line in open(texts_file, encoding="utf-8") if line.strip()), key=len)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").to(device).eval()
    size = int(batch_size)
    start, start_cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for first in range(0, len(texts), size):
            batch = tokenizer(texts[first : first + size], padding=True, return_tensors="pt").to(device)
            attentions = model(**batch, output_attentions=True).attentions
            [layer.cpu() for layer in attentions]
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"loop_cpu_seconds={time.process_time() - start_cpu:.3f}")  # every thread's, for a busy machine
    print(f"loop_seconds={time.perf_counter() - start:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:5])

"""What the corpus tests share (test_stream_stats.py, test_ray.py): a tiny BERT checkpoint and corpora of short lines.

The tiny BERT (2 layers of 4 heads, 64 positions) has the bundled model's WordPiece, so its
tokens, [CLS], [SEP] and punctuation are real; it measures 10,000 lines in about a second.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
import transformers

from tiny_families import wordpiece_tokenizer

WORDS = "the cat sat on a mat dog ran to big red house , . why not 我 想 吃".split()


def build_tiny_bert(folder: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.BertModel(config).eval()
    with torch.no_grad():  # wider than the initialisation: attention far from uniform
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.4)
    model.save_pretrained(folder)
    wordpiece_tokenizer().save_pretrained(folder)
    return folder


def corpus_lines(count: int, seed: int = 0, max_words: int = 8) -> list[str]:
    """Short lines of 1 to max_words words, seeded."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, max_words))) for _ in range(count)]


def write_corpus(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def stats_numbers(folder: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """stats.json's statistics (L*H, S) and JS distances (L, H, H), and the record."""
    record = json.loads((folder / "stats.json").read_text(encoding="utf-8"))
    values = np.array([[head[name] for name in record["statistics"]] for head in record["heads"]])
    return values, np.array(record["js_distance"]), record

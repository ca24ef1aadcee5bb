"""A sentence-embedding model's pooling: how a sentence-transformers folder turns the last hidden states into one vector.

A folder saved by sentence-transformers (all-MiniLM-L6-v2, the bundled model) lists its modules in modules.json:
the transformer, then a Pooling module whose config.json names the pooling (mean over the tokens, the [CLS]
token's state, ...), then perhaps Normalize (which no cosine sees). Only that layout is read: a folder with
other modules after the pooling (a Dense projection) embeds with more than the encoder, and gets no pooling here.
"""

from __future__ import annotations

import json
from pathlib import Path

# sentence-transformers' Pooling config keys, in the order it concatenates the pooled vectors.
POOLINGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
MODULES = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling", "sentence_transformers.models.Normalize"}


def sentence_pooling(folder: Path | None) -> str | None:
    """The pooling of the sentence-transformers model in folder, as "mean" or "cls+mean"; None when folder is no
    such model, or one whose modules are more than a transformer, a pooling and a normalisation."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        kinds = [module["type"] for module in modules]
        pooling = next(module for module in modules if module["type"].endswith(".Pooling"))
        config = json.loads((folder / pooling["path"] / "config.json").read_text(encoding="utf-8"))
    except (TypeError, OSError, ValueError, KeyError, StopIteration):  # no folder, no modules.json, not readable
        return None
    modes = [mode for key, mode in POOLINGS.items() if config.get(key) is True]
    return "+".join(modes) if modes and set(kinds) <= MODULES else None


def pooled(states, pooling: str):
    """The sentence embedding (..., D × modes) of last hidden states (..., N, D) of one unpadded text, pooled as
    sentence-transformers' Pooling does: each mode of pooling ("cls+mean") in turn, concatenated."""
    import torch

    tokens = states.shape[-2]
    weights = torch.arange(1, tokens + 1, dtype=states.dtype, device=states.device)[:, None]  # weightedmean: 1, 2, ...
    each = {
        "cls": lambda: states[..., 0, :],
        "max": lambda: states.max(dim=-2).values,
        "mean": lambda: states.mean(dim=-2),
        "mean_sqrt_len": lambda: states.sum(dim=-2) / tokens**0.5,
        "weightedmean": lambda: (states * weights).sum(dim=-2) / weights.sum(),
        "lasttoken": lambda: states[..., -1, :],
    }
    return torch.cat([each[mode]() for mode in pooling.split("+")], dim=-1)

"""A small BERT encoder that reads Hugging Face BERT checkpoints (config.json + safetensors).

It exists for speed: importing transformers' modeling code takes seconds, longer than
everything else `attnviz heads` does. The modules carry the names of transformers' BertModel
(embeddings.word_embeddings, encoder.layer[i].attention.self.query, ...), so a checkpoint's
tensors load by name, and the tests check that its hidden states equal transformers' own.

Its attention only feeds the next layer; the weights attnviz shows come from attnviz's own
layer (attention.py), built from the same projections.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnviz.attention import merge_heads, split_heads

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass
class BertConfig:
    """The fields of a BERT config.json that the encoder needs, with BertConfig's defaults."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    position_embedding_type: str = "absolute"

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(**{field.name: values[field.name] for field in fields(cls) if field.name in values})


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = _table(config.vocab_size, config.hidden_size)
        self.position_embeddings = _table(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = _table(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (N,)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)  # (B, N, D)
        return self.LayerNorm(x + self.position_embeddings(positions))  # (B, N, D)


def _table(rows: int, size: int) -> nn.Embedding:
    """An embedding table left as it is allocated: load_bert fills it from the checkpoint.

    (nn.Embedding's own random initialisation, on the meta device, imports seconds of torch.)
    """
    return nn.Embedding(rows, size, _weight=torch.empty(rows, size))


def _dense_and_norm(config: BertConfig, size_in: int) -> nn.Module:
    block = nn.Module()
    block.dense = nn.Linear(size_in, config.hidden_size)
    block.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    return block


class BertLayer(nn.Module):
    """Self-attention, then a feed-forward block, each with a residual and LayerNorm (post-norm)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.activation = ACTIVATIONS[config.hidden_act]
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = nn.Linear(size, size)
        self.attention.self.key = nn.Linear(size, size)
        self.attention.self.value = nn.Linear(size, size)
        self.attention.output = _dense_and_norm(config, size)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(size, config.intermediate_size)
        self.output = _dense_and_norm(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        return self.finish(x, self.attend(x, allowed))

    def attend(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention's output (B, N, D), projected by attention.output.dense."""
        projections = self.attention.self
        q = split_heads(projections.query(x), self.num_heads)  # (B, H, N, d)
        k = split_heads(projections.key(x), self.num_heads)  # (B, H, N, d)
        v = split_heads(projections.value(x), self.num_heads)  # (B, H, N, d)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, N, d)
        return self.attention.output.dense(merge_heads(z))  # (B, N, D)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention: residual and LayerNorm, feed-forward, residual and LayerNorm."""
        x = self.attention.output.LayerNorm(x + attended)  # (B, N, D)
        hidden = self.activation(self.intermediate.dense(x))  # (B, N, 4D)
        return self.output.LayerNorm(x + self.output.dense(hidden))  # (B, N, D)


class BertEncoder(nn.Module):
    """BERT's embeddings and encoder layers. Its embedding tables start uninitialised: build it with load_bert."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor, num_layers: int | None = None
    ) -> list[torch.Tensor]:
        """Hidden states [embeddings, after layer 0, ...], `num_layers` layers deep (default all): each (B, N, D)."""
        allowed = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, N): padding keys masked
        states = [self.embeddings(input_ids, token_type_ids)]
        for layer in self.encoder.layer[: self.config.num_hidden_layers if num_layers is None else num_layers]:
            states.append(layer(states[-1], allowed))
        return states


def checkpoint_name(key: str) -> str | None:
    """Our parameter name for a checkpoint tensor's key, or None for tensors we do not use.

    BERT checkpoints prefix the encoder with "bert." when saved with a task head (cls.*,
    pooler.*), and old ones call LayerNorm's weight and bias gamma and beta.
    """
    key = key.removeprefix("bert.")
    if not key.startswith(("embeddings.", "encoder.")) or key.endswith("position_ids"):
        return None
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def index_shards(index: Path) -> list[str]:
    """The shard file names that a sharded checkpoint's index (*.index.json) lists."""
    return sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))


def checkpoint_files(folder: Path, safetensors: bool = True) -> list[Path]:
    """The weight files to read: model.safetensors (or pytorch_model.bin), or the shards of its index."""
    single = folder / ("model.safetensors" if safetensors else "pytorch_model.bin")
    index = single.with_name(single.name + ".index.json")
    return [folder / shard for shard in index_shards(index)] if index.is_file() else [single]


def load_bert(folder: Path, safetensors: bool = True) -> BertEncoder:
    """A BertEncoder (eval mode) with the weights of the checkpoint in `folder`.

    safetensors=False reads pytorch_model.bin instead, with torch.load(weights_only=True),
    which refuses to run code.
    Raises ValueError for a variant it cannot run, KeyError naming tensors the checkpoint lacks.
    """
    from safetensors.torch import load_file

    config = BertConfig.from_json(folder / "config.json")
    if config.position_embedding_type != "absolute" or config.hidden_act not in ACTIVATIONS:
        raise ValueError(
            f"unsupported BERT variant: position embeddings {config.position_embedding_type!r}, "
            f"activation {config.hidden_act!r}"
        )
    with torch.device("meta"):  # no memory and no random initialisation: the checkpoint's tensors replace it all
        model = BertEncoder(config)
    state = {}
    for path in checkpoint_files(folder, safetensors):
        tensors = load_file(path) if path.suffix == ".safetensors" else torch.load(path, weights_only=True)
        state.update({name: tensor for key, tensor in tensors.items() if (name := checkpoint_name(key))})
    missing = sorted(set(model.state_dict()) - set(state))
    if missing:
        raise KeyError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[0]}")
    model.load_state_dict(state, strict=False, assign=True)
    return model.eval()

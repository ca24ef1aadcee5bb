"""An encoder's masked-LM head, read from its checkpoint: what `attnviz patch` reads at a mask token.

A checkpoint saved from an encoder's *ForMaskedLM class (BERT's, RoBERTa's, DistilBERT's, ALBERT's, ELECTRA's
generator) holds, beside the base model's tensors, a head that predicts the token at a mask from the last hidden
state h: logits = LayerNorm(activation(dense(h))) @ W_U^T + bias, W_U the word embeddings (tied, as those classes
tie them; the checkpoint's own W_U where it holds one). The base model attnviz loads leaves the head out: its
tensors are read here, by the names the family's adapter gives (families.family.MaskedLM). A checkpoint saved
without it (a base model's, a sentence-embedding model's) has none: None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from attnviz.errors import AttnvizError


@dataclass(frozen=True)
class MaskedLMHead:
    """The head's parameters: dense (E, D) and its bias, the activation, LayerNorm's weight, bias and eps (E,), and
    the unembedding W_U (V, E) and its bias (V,)."""

    dense: tuple[torch.Tensor, torch.Tensor]
    activation: Callable[[torch.Tensor], torch.Tensor]
    norm: tuple[torch.Tensor, torch.Tensor, float]
    weight: torch.Tensor
    bias: torch.Tensor

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """LayerNorm(activation(dense(h))): (..., D) -> (..., E), what W_U reads."""
        weight, bias, eps = self.norm
        x = self.activation(F.linear(hidden, *(tensor.to(hidden.dtype) for tensor in self.dense)))
        return F.layer_norm(x, x.shape[-1:], weight.to(x.dtype), bias.to(x.dtype), eps)


def masked_lm_head(loaded) -> MaskedLMHead | None:
    """The encoder's masked-LM head from its checkpoint's safetensors; None where its family has none or its
    checkpoint was saved without one. An activation attnviz does not know is refused, naming it."""
    from attnviz.models.bert_encoder import ACTIVATIONS
    from attnviz.models.weight_files import stored_tensors

    names = loaded.family.masked_lm
    if names is None:
        return None
    embeddings = loaded.model.get_input_embeddings().weight  # (V, E); as stored where read a layer at a time
    like = embeddings.new_empty(0, dtype=getattr(torch, loaded.dtype))  # the head's tensors in the model's dtype
    norms = [f"{names.norm}.{part}" for part in ("weight", "bias", "gamma", "beta")]  # old BERTs: gamma and beta
    stored = stored_tensors(loaded.folder, (f"{names.dense}.weight", f"{names.dense}.bias", *norms, names.bias, names.decoder), like)
    norm_weight = stored.get(norms[0], stored.get(norms[2]))
    norm_bias = stored.get(norms[1], stored.get(norms[3]))
    if any(tensor is None for tensor in (stored.get(f"{names.dense}.weight"), norm_weight, stored.get(names.bias))):
        return None
    config = loaded.config or vars(loaded.model.config)  # BERT's own encoder keeps its config as a dataclass
    (activation_key, activation), (eps_key, eps) = names.activation, names.eps
    activation = config.get(activation_key, activation) if activation_key else activation
    if activation not in ACTIVATIONS:
        raise AttnvizError(f"the masked-LM head's activation {activation!r} is not one attnviz runs ({', '.join(ACTIVATIONS)})")
    dense_bias = stored.get(f"{names.dense}.bias")
    return MaskedLMHead(
        dense=(stored[f"{names.dense}.weight"], torch.zeros_like(norm_weight) if dense_bias is None else dense_bias),
        activation=ACTIVATIONS[activation],
        norm=(norm_weight, torch.zeros_like(norm_weight) if norm_bias is None else norm_bias, float(config.get(eps_key, eps) if eps_key else eps)),
        weight=stored.get(names.decoder, embeddings),
        bias=stored[names.bias],
    )

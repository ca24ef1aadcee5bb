"""attnviz's own layer for a model's layer: the model's projections copied in, or a fresh layer drawn from a seed.

With pretrained weights the layer gets the query, key, value and output projections of layer L (BERT's, or those a
transformers family's adapter names), split into the model's heads or the count --heads asks; with random weights it
is a fresh layer, as in the tutorials. Only one layer's projections are copied, never the whole model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from attnviz.attention.layer import MultiHeadAttention, check_num_heads, check_split, layer_from_weights
from attnviz.models.loading import LoadedModel
from attnviz.spec import RunSpec


def layer_from_bert(bert_layer, num_heads: int) -> MultiHeadAttention:
    """Our layer with the projections of one BertLayer copied in, split into num_heads heads."""
    return layer_from_weights(bert_layer.attention_weights(), num_heads)


def random_layer(model_size: int, num_heads: int, seed: int) -> MultiHeadAttention:
    """A fresh layer, the same for the same seed on any device (it is built on the CPU)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(model_size, num_heads, bias=True)


def build_layer(loaded: LoadedModel, spec: RunSpec) -> MultiHeadAttention:
    """attnviz's layer for spec.layer: BERT's projections or random ones from spec.seed, split into spec.num_heads.

    Its parameters are one layer's projections copied (layer_from_weights), never the whole model,
    cast to the model's dtype (random ones are drawn in float32 first, the same for every dtype).
    """
    num_heads = resolve_num_heads(loaded, spec.num_heads, spec.stack)
    if spec.weights == "random":  # a fresh layer of the tutorials' kind: RunSpec admits no other
        attention = random_layer(loaded.hidden_size, num_heads, spec.seed)
    elif loaded.is_bert:
        attention = layer_from_bert(loaded.model.encoder.layer[spec.layer], num_heads)
    else:
        attention = layer_from_weights(loaded.model.attention_weights(spec.layer, spec.stack), num_heads)
    return attention.to(spec.device, getattr(torch, loaded.dtype)).eval()  # in the model's dtype, as its own layer is


def resolve_num_heads(loaded: LoadedModel, num_heads: int | None, stack: str | None = None) -> int:
    """--heads: the model's own count when not given; a count given (0 too) must split the projections.

    For BERT and random parameters it must divide the model size; for the other families
    check_split also keeps grouped-query attention's groups whole and RoPE's pairs of features.
    """
    own = loaded.num_heads_of(stack)
    if num_heads is None or num_heads == own:  # the model's own split: nothing to check (no layer's weights read)
        return own
    if loaded.is_bert:
        check_num_heads(loaded.hidden_size, num_heads)
    else:
        check_split(loaded.model.attention_weights(0, stack), num_heads)
    return num_heads


def build_layers(loaded: LoadedModel, spec: RunSpec, count: int | None = None) -> Sequence[MultiHeadAttention]:
    """attnviz's layer for every layer of spec.stack (the first count of them), in order (spec.layer is not used): a
    list, or for a model read a layer's weights at a time, LayersOnDemand."""
    count = loaded.num_layers_of(spec.stack) if count is None else count
    if getattr(loaded.model, "layer_at_a_time", False):
        return LayersOnDemand(loaded, spec, count)
    return [build_layer(loaded, replace(spec, layer=layer)) for layer in range(count)]


class LayersOnDemand(Sequence):
    """attnviz's layers of a model read a layer's weights at a time (models/layer_weights.py), each built from its
    layer's projections when asked for: one layer's copy held at a time, the last asked for (a pass asks for each
    layer in turn), not every layer's (in the model's own forward pass, from the weights the pass has read already).
    sizes: every layer's heads, key/value heads and H * d, its first layer's (a stack of one model splits each layer
    alike: each layer built is checked against it), so that what needs the sizes alone builds no layer."""

    def __init__(self, loaded: LoadedModel, spec: RunSpec, count: int):
        self.loaded, self.spec, self.count = loaded, spec, count
        self.last = (0, build_layer(loaded, replace(spec, layer=0)))
        self.sizes = layer_sizes(self.last[1])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, layer):
        if isinstance(layer, slice):
            return [self[index] for index in range(*layer.indices(self.count))]
        if not -self.count <= layer < self.count:
            raise IndexError(f"layer {layer} of {self.count}")
        layer %= self.count
        if self.last[0] != layer:
            self.last = (layer, build_layer(self.loaded, replace(self.spec, layer=layer)))
            if layer_sizes(self.last[1]) != self.sizes:
                raise ValueError(f"layer {layer} splits into {layer_sizes(self.last[1])} (heads, key/value heads, H * d), layer 0 into {self.sizes}")
        return self.last[1]


def layer_sizes(attention: MultiHeadAttention) -> tuple[int, int, int]:
    """The heads, key/value heads and H * d of a layer: what split_runs records with each run."""
    return attention.num_heads, attention.num_kv_heads, attention.num_heads * attention.head_dim


def every_layer_sizes(layers: Sequence[MultiHeadAttention]) -> list[tuple[int, int, int]]:
    """layer_sizes of each of layers, without building a layer of LayersOnDemand (its sizes)."""
    if isinstance(layers, LayersOnDemand):
        return [layers.sizes] * len(layers)
    return [layer_sizes(attention) for attention in layers]

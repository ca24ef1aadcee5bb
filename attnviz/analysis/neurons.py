"""The neuron view's numbers (Vig 2019, BertViz's neuron view): each head's query and key vectors of a text.

A head's score of query i and key j, before the scale, is q_i · k_j = Σ_c q_i[c] k_j[c]: the sum of the elementwise
product that the view draws. q and k are what attnviz's layer multiplies (MultiHeadAttention.project): projected,
split into heads, normalised (q/k norms), rotated by RoPE at their positions; a key/value head is shared by the
group_size query heads of its group (grouped-query attention), so k is kept once per key/value head. The weights
are softmax(scale * q · k + mask + position bias) over the keys: the bias (T5) is not in the product.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.spec import RunSpec

MAX_VECTOR_TOKENS = 64  # a text's vectors go into its record up to this many tokens: H × N × d numbers, twice


@dataclass(frozen=True)
class QueryKeyVectors:
    """q (H, Nq, d) of every query head and k (H_kv, Nk, d) of every key/value head, float32; scale multiplies q · k."""

    q: np.ndarray
    k: np.ndarray
    scale: float
    group_size: int  # query heads per key/value head: head h reads k[h // group_size]
    position_bias: bool  # a bias is added to the scaled scores (T5): the weights are not softmax(scale * q · k) alone

    def scores(self) -> np.ndarray:
        """(H, Nq, Nk): every head's q · k, before the scale."""
        k = np.repeat(self.k, self.group_size, axis=0)  # (H, Nk, d)
        return self.q @ k.transpose(0, 2, 1)  # (H, Nq, Nk)


def query_key_vectors(loaded, text: str, spec: RunSpec, captured=None) -> QueryKeyVectors:
    """The text's q and k at spec.layer, from the layer and the input that attnviz's run of it uses (pipeline.layer_pass);
    captured: the text's capture (EncodedTexts, {layer: LayerStates}), whose layer input is read: no pass of the model."""
    import torch

    from attnviz.pipeline import layer_pass

    with torch.inference_mode():
        layer_run = layer_pass(loaded, [text], spec, captured=None if captured is None else (captured[0], captured[1][spec.layer]))
        attention, states = layer_run.attention, layer_run.states
        q, k, _ = attention.project(states.queries, states.keys, states.keys)  # (1, H, Nq, d), k (1, H, Nk, d): repeated
    group = attention.group_size
    return QueryKeyVectors(
        q=q[0].float().cpu().numpy(),  # (H, Nq, d)
        k=k[0, ::group].float().cpu().numpy(),  # (H_kv, Nk, d): one per key/value head
        scale=float(attention.scale),
        group_size=group,
        position_bias=states.position_bias is not None,
    )

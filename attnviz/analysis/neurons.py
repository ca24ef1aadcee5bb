"""The neuron view's numbers (Vig 2019, BertViz's neuron view): each head's query and key vectors of a text.

A head's score of query i and key j, before the scale, is q_i · k_j = Σ_c q_i[c] k_j[c]: the sum of the elementwise
product that the view draws. q and k are what attnviz's layer multiplies (MultiHeadAttention.project): projected,
split into heads, normalised (q/k norms), rotated by RoPE at their positions; a key/value head is shared by the
group_size query heads of its group (grouped-query attention), so k is kept once per key/value head. The weights
are softmax(scale * q · k + mask + position bias) over the keys: the bias (T5) is not in the product.
"""

from __future__ import annotations

from attnviz.run_data import QueryKeyVectors

__all__ = ["MAX_VECTOR_TOKENS", "QueryKeyVectors"]

# A text's vectors go into its record up to this many tokens: H × N × d numbers, twice. They are kept by the run that
# makes the map (pipeline.run_attention's vector_tokens), from the very projection its scores are made of: the neuron
# view's q · k and the map are one computation, on any CPU and thread count.
MAX_VECTOR_TOKENS = 64

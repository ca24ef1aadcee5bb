"""Attention flow (Abnar & Zuidema 2020): the maximum flow from each output token to each input token
through the layers' graph.

The graph has a node for every token at every depth: depth 0 the input tokens, depth l + 1 the tokens
after layer l. Token i at depth l + 1 has an edge to token j at depth l with capacity A'_l[i, j],
A'_l = (mean_h A_l,h + I) / 2 the layer's heads averaged with its residual connection, the very
matrix attention rollout multiplies (rollout.residual_attention). flow[i, j] is the value of a
maximum flow from token i after the last layer to input token j. Rollout multiplies the paths'
weights; flow treats them as pipes, so one strong path does not need every layer's weight on it.

Each row's capacity out of token i is 1, so no value exceeds 1, but a row sums to more than 1
(every input token is a separate flow); Abnar & Zuidema divide each row by its sum for their
maps: both are kept (AttentionFlow).

Exact to about 1e-9 per edge: scipy's maximum flow takes integer capacities, so each A' entry is
rounded down to a multiple of 2^-30 (FLOW_RESOLUTION). A flow is never more than the exact one (so
never more than 1), and less by under 2^-30 for every edge its minimum cut crosses: about 1e-9
times N for the usual cuts (around one token), 2e-5 at worst for 6 layers of 64 tokens. N^2 maximum flows over (L + 1) N nodes and L N^2 edges
take time: FLOW_MAX_TOKENS is the longest text the flow is computed for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.analysis.rollout import normalise_rows, residual_attention
from attnviz.errors import AttnvizError

# Capacities are whole multiples of 2^-30: scipy's flows are int32, and a row's capacities,
# which sum to 1, must stay below 2^31 however they round.
FLOW_SCALE = 2**30
FLOW_RESOLUTION = 1 / FLOW_SCALE

# The longest text, in tokens with the special ones, whose flow through the bundled model's 6 layers
# takes under 10 s on the project's 2-core CPU, with room for its drift; the time grows about as N^4
# (N^2 flows over L N^2 edges). Measured with bench/measures.py: bench/RESULTS.md, "Timings behind the code".
FLOW_MAX_TOKENS = 88


@dataclass
class AttentionFlow:
    """flow[i, j] (N, N): the maximum flow from token i after the last layer to input token j, each at
    most 1; normalised: each row divided by its sum (Abnar & Zuidema's maps), rows summing to 1."""

    flow: np.ndarray
    normalised: np.ndarray


def check_flow_length(num_tokens: int) -> None:
    """Refuse a text too long for attention flow: an AttnvizError that names the limit."""
    if num_tokens > FLOW_MAX_TOKENS:
        raise AttnvizError(
            f"flow handles texts of up to {FLOW_MAX_TOKENS} tokens (about 10 s); this text has {num_tokens}"
        )


def attention_flow(
    layer_attention: list[np.ndarray], max_tokens: int | None = FLOW_MAX_TOKENS, key_words: list[int] | None = None
) -> AttentionFlow:
    """Attention flow of self-attention through the layers, in order: each layer's weights (H, N, N).

    max_tokens: refuse longer texts (check_flow_length); None computes any length. key_words, the word
    of every input token (0, 1, ... in order): flow[i, w] is then the maximum flow from token i into the
    set of word w's input tokens, (N, W) (word_measures.py), through one sink per word fed by its tokens.
    """
    from scipy.sparse.csgraph import maximum_flow

    if not layer_attention:
        raise ValueError("attention flow needs at least one layer")
    num_tokens = np.shape(layer_attention[0])[-1]
    if max_tokens is not None:
        check_flow_length(num_tokens)
    graph = flow_graph([residual_attention(attention) for attention in layer_attention], key_words)
    last = len(layer_attention) * num_tokens  # node of token 0 after the last layer
    sinks = range(num_tokens) if key_words is None else range(last + num_tokens, last + num_tokens + max(key_words) + 1)
    flow = np.zeros((num_tokens, len(sinks)))
    for i in range(num_tokens):
        for column, sink in enumerate(sinks):
            flow[i, column] = maximum_flow(graph, last + i, sink).flow_value
    flow *= FLOW_RESOLUTION
    return AttentionFlow(flow, normalise_rows(flow))


def flow_graph(layer_matrices: list[np.ndarray], key_words: list[int] | None = None):
    """The layers' graph as scipy's csr_array of int32 capacities, (L + 1) N nodes square (and W more).

    Node l * N + t is token t at depth l; A'_l[i, j] (N, N) is the capacity of the edge from node
    (l + 1) * N + i to node l * N + j, in units of FLOW_RESOLUTION. Edges that round to 0 are left out.
    With key_words, node (L + 1) * N + w is word w's sink, with an edge from each of its input tokens
    of capacity FLOW_SCALE: more than a token can receive (a flow is at most 1), so never the bottleneck.
    """
    from scipy.sparse import csr_array

    num_tokens = layer_matrices[0].shape[-1]
    num_nodes = (len(layer_matrices) + 1) * num_tokens
    sources, targets, capacities = [], [], []
    if key_words is not None:
        sources.append(np.arange(num_tokens))
        targets.append(num_nodes + np.asarray(key_words))
        capacities.append(np.full(num_tokens, FLOW_SCALE, dtype=np.int32))
        num_nodes += max(key_words) + 1
    for depth, matrix in enumerate(layer_matrices):
        units = np.floor(matrix * FLOW_SCALE).astype(np.int32)  # (N, N): down, so no flow is overstated
        i, j = np.nonzero(units)
        sources.append((depth + 1) * num_tokens + i)
        targets.append(depth * num_tokens + j)
        capacities.append(units[i, j])
    edges = (np.concatenate(sources), np.concatenate(targets))
    return csr_array((np.concatenate(capacities), edges), shape=(num_nodes, num_nodes))

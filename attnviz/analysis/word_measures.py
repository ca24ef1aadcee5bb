"""The measures over words (--words --measure), each by its own definition, never by adding up the pieces' numbers.

Clark et al.'s rule (sum to a word, mean from a word) is exact for weights and rollout, which are
shares. The measures are not: the norm of a sum is not the sum of the norms, zeroing a word is not
zeroing each piece in turn, and a maximum flow into a set of tokens is not the sum of the flows into
each. So, with W a key word (its pieces j ∈ W) and i a query token:

- norm per head: ‖Σ_{j∈W} α^h_ij f^h(x_j)‖, what the word adds to i's output through head h;
  heads summed: ‖Σ_h Σ_{j∈W} α^h_ij f^h(x_j)‖ (f as in norms.py);
- value zeroing: the value vectors of all of W's pieces zeroed at once, in every head; the cosine
  distance between out_i and the altered out_i (value_zeroing.py: attnviz's attention output, the
  same VANISHED rule), raw and with rows divided by their sums;
- flow: the maximum flow from token i after the last layer into the set of W's input pieces
  (flow.py's graph with one sink per word, fed by its pieces; flow.attention_flow's key_words).

From a query word, each is the mean over its pieces (Clark's rule for rows). With one token per word
every map equals the token map (the tests hold them to that).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz.analysis.norms import head_norms, head_values, summed_squared_norms, transformed_values
from attnviz.analysis.rollout import normalise_rows
from attnviz.analysis.value_zeroing import VANISHED, float64_output, value_zeroing_distances
from attnviz.attention.layer import MultiHeadAttention
from attnviz.models.words import word_means


@dataclass
class WordMaps:
    """One text's measures over words: head_norms (H, Wq, Wk), summed_norms (Wq, Wk), value_zeroing and
    value_zeroing_rows (Wq, Wk), float64; the fields of measures.MeasuredLayer."""

    head_norms: np.ndarray
    summed_norms: np.ndarray
    value_zeroing: np.ndarray
    value_zeroing_rows: np.ndarray


@torch.inference_mode()
def word_maps(
    attention: MultiHeadAttention, values: torch.Tensor, pattern: torch.Tensor, query_words: list[int], key_words: list[int]
) -> WordMaps:
    """The measures of one text over words: attention the layer, values (Nk, D_v) the values' input of the
    text's own keys, pattern (H, Nq, Nk) its weights over them (no padding); the word of every query and key token.

    A key word of one token is that token's column of the token maps (norms.py, value_zeroing.py, all
    keys at once); only the words of several tokens are summed here, one word at a time.
    """
    alpha = pattern[None]  # (1, H, Nq, Nk)
    transformed = transformed_values(attention, values[None])  # (1, H, Nk, D), float64
    summed_squared = summed_squared_norms(alpha, transformed)  # (1, Nq, Nk)
    token_heads = head_norms(alpha.double(), transformed)[0]  # (H, Nq, Nk)
    token_distances = value_zeroing_distances(attention, values[None], alpha, summed_squared)[0]  # (Nq, Nk)
    output = float64_output(attention, alpha.double(), head_values(attention, values[None]))[0]  # (Nq, D)
    first = torch.as_tensor([key_words.index(word) for word in range(max(key_words) + 1)], device=pattern.device)
    heads = token_heads[:, :, first]  # (H, Nq, Wk): each word's first token's column, right for the one-token words
    summed = summed_squared[0][:, first].sqrt()  # (Nq, Wk)
    distances = token_distances[:, first]  # (Nq, Wk)
    for word, pieces in _words_of_several_tokens(key_words):
        per_head = alpha[0, :, :, pieces].double() @ transformed[0, :, pieces]  # (H, Nq, D): Σ_{j∈W} α^h_ij f^h(x_j)
        added = per_head.sum(dim=0)  # (Nq, D): what the word adds through every head
        heads[:, :, word] = per_head.norm(dim=-1)
        summed[:, word] = added.norm(dim=-1)
        distances[:, word] = _cosine_distance(output, output - added)
    rows = torch.as_tensor(word_means(query_words), device=pattern.device)  # (Wq, Nq): mean over a query word's pieces
    heads, summed, distances = ((rows @ columns).cpu().numpy() for columns in (heads, summed, distances))  # over Wq
    return WordMaps(heads, summed, distances, normalise_rows(distances))


def _words_of_several_tokens(words: list[int]) -> list[tuple[int, list[int]]]:
    """(word, its tokens) for every word of more than one token."""
    pieces: dict[int, list[int]] = {}
    for token, word in enumerate(words):
        pieces.setdefault(word, []).append(token)
    return [(word, tokens) for word, tokens in pieces.items() if len(tokens) > 1]


def _cosine_distance(output: torch.Tensor, altered: torch.Tensor) -> torch.Tensor:
    """1 - cos(out_i, altered_i) for every row (Nq,); an altered output under VANISHED of the output's norm is at distance 1."""
    out_norm, altered_norm = output.norm(dim=-1), altered.norm(dim=-1)
    cosine = (output * altered).sum(dim=-1) / (out_norm * altered_norm).clamp_min(torch.finfo(torch.float64).tiny)
    cosine = cosine.masked_fill(altered_norm <= VANISHED * out_norm, 0.0)
    return (1 - cosine).clamp(0, 2)

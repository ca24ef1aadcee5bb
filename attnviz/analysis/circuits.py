"""Olsson et al.'s two text-free scores of every head: prefix matching on random repeated tokens, and copying.

Prefix matching (Olsson et al. 2022, their data-collection appendix): SEQUENCES sequences of PATTERN random tokens
(the tokenizer's special tokens and the most and least common left out), each repeated REPEATS times after the
BOS token; a head's score is head_numbers' "prefix_matching" (each query whose token occurred before: its weight on
the tokens that followed those occurrences, mean over such queries), then the mean over the sequences, computed
a block of queries at a time as every per-head number is.

Copying (Elhage et al. 2021): the eigenvalues λ of a head's full OV circuit W_U W_O^h W_V^h W_E, scored
Σ Re λ / Σ |λ| (1: the head copies the token it attends to into the logits). The V × V circuit's nonzero
eigenvalues are those of its d_head × d_head form W_V^h (W_E W_U) W_O^h (XY and YX share them), which is what is
computed: W_E W_U (D × D) once, then a d_head × d_head product per head. The norms' weights are folded in as
TransformerLens's fold_ln does (the norm before the layer's attention into W_V, the final norm into W_U: their
weights only, the per-token 1/RMS and LayerNorm's centring and bias left out); grouped-query heads through their
key/value head's W_V.
"""

from __future__ import annotations

import numpy as np

from attnviz.errors import AttnvizError
from attnviz.run_data import Progress

PATTERN, REPEATS, SEQUENCES = 25, 4, 10  # Olsson et al.'s: 25 random tokens, repeated 4 times, 10 sequences
COMMON_CUT = 0.1  # the share of the ordinary vocabulary left out at each end (BPE and SentencePiece order by frequency)
PREFIX_SEED = 0
OLSSON = 'Olsson et al. 2022, "In-context Learning and Induction Heads" (arXiv 2209.11895), Appendix: data collection'
ELHAGE = 'Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits" (transformer-circuits.pub), the OV circuit\'s eigenvalues'


def random_sequences(loaded, seed: int = PREFIX_SEED) -> list[list[int]]:
    """SEQUENCES lists of ids: the BOS token (the special token the tokenizer starts a text with, else config.json's
    bos_token_id, where the model has one), then PATTERN
    distinct random ids repeated REPEATS times; the ids drawn from the ordinary vocabulary (no special token) less
    its first and last COMMON_CUT (BPE's and SentencePiece's vocabularies put the most common first)."""
    tokenizer = loaded.tokenizer
    special = set(tokenizer.all_special_ids)
    ordinary = [index for index in range(tokenizer.embedding_rows) if index not in special]
    cut = int(len(ordinary) * COMMON_CUT)
    pool = np.array(ordinary[cut : len(ordinary) - cut])
    first = tokenizer.encode_batch(["a"])[0][:1]  # the special token the tokenizer starts a text with (Llama's <s>)
    bos = first[0] if first and first[0] in special else (loaded.config or {}).get("bos_token_id")
    rng = np.random.default_rng(seed)
    start = [] if bos is None else [int(bos)]
    return [start + [int(index) for index in rng.choice(pool, PATTERN, replace=False)] * REPEATS for _ in range(SEQUENCES)]


def prefix_matching(
    loaded, spec, budget_bytes: int, sequences: list[list[int]], progress: Progress = Progress(), layers=None
) -> np.ndarray:
    """(L, H): every head's prefix-matching score, the mean over the sequences (all of one length) of its mean over
    the queries whose token occurred before; spec: a causal self-attention run of the model's own heads. progress:
    the layers the model's forward pass over the sequences reaches (most of the time), then the layers scored.
    layers: attnviz's layers for spec (own_layer.build_layers'), where a pass before this one built them; else built."""
    import torch

    from attnviz.analysis.head_numbers import Block, block_sums
    from attnviz.layer_inputs import EncodedTexts, threads_for
    from attnviz.models.tokens import encode_ids
    from attnviz.own_layer import build_layers, every_layer_sizes
    from attnviz.passes import blocks_in_place, capture_states, in_models_place, iter_layer_blocks

    encoded = EncodedTexts(encode_ids(loaded.tokenizer, sequences))
    ids = encoded.queries.input_ids  # (B, N): one length, no padding
    if layers is None:
        with threads_for(encoded):
            layers = build_layers(loaded, spec)
    sums = torch.zeros(len(layers), max(heads for heads, _, _ in every_layer_sizes(layers)), dtype=torch.float64)
    in_place = in_models_place(loaded, spec)  # one pass, attnviz's layers in the model's place, scored as they run
    if not in_place:
        entered = progress.counting("layers of prefix matching's forward pass", len(layers))
        with threads_for(encoded):
            states = capture_states(loaded, encoded, list(range(len(layers))), spec, entered)
    advance = progress.counting("layers of prefix matching", len(layers))

    def add(layer: int, first_query: int, weights) -> None:  # weights (B, H, b, K)
        block = Block(weights, first_query, encoded.queries.valid_lens, causal=True, num_queries=ids.shape[1], token_ids=ids)
        sums[layer, : weights.shape[1]] += block_sums(block, ("prefix_matching",))[:, 0].cpu()
        if first_query + weights.shape[2] == ids.shape[1]:  # the layer's last block
            advance(1)

    if in_place:
        blocks_in_place(loaded, encoded, layers, spec, budget_bytes, add)
    else:
        for layer, first_query, weights in iter_layer_blocks(loaded, encoded, layers, spec, budget_bytes, states=states):
            add(layer, first_query, weights)
    return (sums / len(sequences)).numpy()


def copying(loaded, progress: Progress = Progress()) -> np.ndarray:
    """(L, H): every head's copying score Σ Re λ / Σ |λ| over the eigenvalues of its full OV circuit (float64);
    progress: its layers, once the model is known to have what it needs.

    Refused (an AttnvizError saying why) for a model without a language-model head, or whose adapter names no norm
    before attention (attention_norm)."""
    import torch

    from attnviz.models.layer_weights import vocabulary_chunks

    model, family = loaded.model, loaded.family
    if family.attention_norm is None:
        raise AttnvizError(f"copying needs the norm before each attention, which attnviz's {family.name} adapter does not name")
    base = model.model
    with torch.no_grad():
        unembedding, _ = model.output_head()  # (V, D), as stored where read a layer at a time
        # fold_ln: W_U diag(g), g the final norm's weight
        gain = base.get_submodule(family.final_norm_name(None)).weight.float() if family.final_norm is not None else 1.0
        advance = progress.counting("layers of copying", model.num_layers())  # W_E W_U first, at 0 of them
        embedding = base.get_input_embeddings().weight  # (V, D), as stored where read a layer at a time
        # (D, D): W_E W_U, a token's embedding to its logits' direction; float32 over V (twice as fast as float64 on
        # the CPU, within 1e-6 of it), LOGIT_ROWS of the vocabulary at a time, the small products after it in float64
        through_vocabulary = sum(
            embedding[rows].float().T @ (unembedding[rows].float() * gain)
            for rows in vocabulary_chunks(embedding, unembedding)
        ).double()
        scores = np.zeros((model.num_layers(), model.num_heads()))
        for layer in range(model.num_layers()):
            weights = model.attention_weights(layer)
            name = family.attention_norm.format(index=layer)
            with model.resident(name):  # a layer's weights read a layer at a time: on the device within
                norm = base.get_submodule(name).weight.double()  # (D,)
            values = weights.w_v[0].double() * norm  # (H_kv d, D): W_V diag(g), fold_ln
            outputs = weights.w_o[0].double()  # (D, H d)
            head_dim, group = weights.head_dim, weights.num_heads // weights.num_kv_heads
            for head in range(weights.num_heads):
                kv = head // group  # grouped-query attention: the head's key/value head
                w_v = values[kv * head_dim : (kv + 1) * head_dim]  # (d, D)
                w_o = outputs[:, head * head_dim : (head + 1) * head_dim]  # (D, d)
                eigenvalues = torch.linalg.eigvals(w_v @ through_vocabulary @ w_o)  # (d,): the V × V circuit's nonzero ones
                scores[layer, head] = float(eigenvalues.real.sum() / eigenvalues.abs().sum())
            advance(1)
    return scores

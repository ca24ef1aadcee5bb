"""Elhage et al.'s composition scores from the weights: how much each head reads what an earlier head wrote.

Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits"), row-vector convention as TransformerLens's
all_composition_scores. Per head h of a layer: W_Q^h, W_K^h, W_V^h (D × d, the key/value head's for grouped-query
heads) and W_O^h (d × D); W_OV^h = W_V^h W_O^h, W_QK^h = W_Q^h W_K^hT (both D × D, rank d). For a sender s of layer
l1 and a receiver r of layer l2 > l1, over the Frobenius norm:

    Q: |W_OV^s W_QK^r| / (|W_OV^s| |W_QK^r|)    K: |W_OV^s W_QK^rT| / (...)    V: |W_OV^s W_OV^r| / (|W_OV^s| |W_OV^r|)

The norm before each layer's attention (family.attention_norm) is folded in as circuits.copying folds it: W_Q, W_K
and W_V of layer l get diag(g_l) on their input side (its weight only; 1/RMS, LayerNorm's centring and bias left
out). A family whose adapter names no such norm (the post-norm BERTs) is scored on its raw weights, and said so.

Never a D × D matrix: |X Y|_F = |R X|_F where R (d × d) is the triangular factor of X's QR (R^T R = X^T X, the
Gram matrix), so every score is the norm of a d × d product of two d × D factors, e.g. for Q
|V1 O1 Q2 K2^T| = |R(V1) O1 Q2 R(K2)^T|, batched over a layer pair's heads, in float64.

The baseline: the same score for Gaussian matrices of the same shapes (BASELINE_DRAWS draws from BASELINE_SEED, the
mean), per kind; a composition "above baseline" is its score less it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.run_data import Progress

KINDS = ("q", "k", "v")
BASELINE_DRAWS, BASELINE_SEED = 48, 0
ELHAGE_COMPOSITION = 'Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits" (transformer-circuits.pub), composition scores'


@dataclass(frozen=True)
class Compositions:
    """scores[kind] (L, H, L, H) float64: sender layer, sender head, receiver layer, receiver head; NaN where the
    sender's layer is not before the receiver's. baseline[kind]: the mean score of Gaussian matrices of the same
    shapes over baseline_draws draws. norms_folded: the attention norms' weights folded in (else raw weights)."""

    scores: dict[str, np.ndarray]
    baseline: dict[str, float]
    baseline_draws: int
    norms_folded: bool
    notes: tuple[str, ...] = ()

    def top(self, n: int) -> list[dict]:
        """The n compositions most above their kind's baseline, every kind together, strongest first: dicts of kind,
        sender (layer, head), receiver (layer, head), score, baseline, above."""
        rows = []
        for kind in KINDS:
            above = np.nan_to_num(self.scores[kind] - self.baseline[kind], nan=-np.inf).ravel()  # no pair: never chosen
            count = min(n, int(np.isfinite(above).sum()))
            for index in np.argpartition(-above, count - 1)[:count] if count else ():  # this kind's n strongest, unordered
                sender_layer, sender_head, receiver_layer, receiver_head = np.unravel_index(index, self.scores[kind].shape)
                rows.append({"kind": kind, "sender": (int(sender_layer), int(sender_head)),
                             "receiver": (int(receiver_layer), int(receiver_head)), "score": float(self.scores[kind].flat[index]),
                             "baseline": self.baseline[kind], "above": float(above[index])})  # fmt: skip
        return sorted(rows, key=lambda row: -row["above"])[:n]

    def strongest(self, kind: str) -> np.ndarray:
        """(L, L): for each sender layer × receiver layer, its strongest head pair's score above baseline (NaN where
        the sender's layer is not before the receiver's)."""
        scores = self.scores[kind]  # (L, H, L, H)
        strongest = np.full((scores.shape[0], scores.shape[2]), np.nan)
        for sender in range(scores.shape[0]):
            for receiver in range(sender + 1, scores.shape[2]):
                strongest[sender, receiver] = np.nanmax(scores[sender, :, receiver, :]) - self.baseline[kind]
        return strongest


@dataclass(frozen=True)
class LayerFactors:
    """One layer's heads as the scores read them, torch float64: q (H, D, d), k and v (H_kv, D, d), the key/value
    heads a group of query heads shares, o (H, d, D); group: the query heads per key/value head."""

    q: Any
    k: Any
    v: Any
    o: Any
    group: int

    def kv(self, heads):
        """(H, ...): each query head's key/value head of heads (H_kv, ...)."""
        return heads.repeat_interleave(self.group, dim=0)


def layer_factors(loaded, layer: int) -> LayerFactors:
    """Layer's W_Q, W_K, W_V (norm folded where the family names it) and W_O per head, from AttentionWeights'
    nn.Linear layout (weight (out, in))."""
    import torch

    weights = loaded.model.attention_weights(layer)
    heads, head_dim = weights.num_heads, weights.head_dim
    with torch.no_grad():
        norm = attention_norm_weight(loaded, layer)  # (D,) or None

        def per_head(projection):  # (count d, D) -> (count, D, d)
            weight = projection[0].detach().cpu().double()
            if norm is not None:
                weight = weight * norm  # W diag(g): the norm's weight on the input side
            return weight.reshape(-1, head_dim, weight.shape[1]).transpose(1, 2)

        output = weights.w_o[0].detach().cpu().double()  # (D, H d)
        o = output.reshape(output.shape[0], heads, head_dim).permute(1, 2, 0)  # (H, d, D)
        return LayerFactors(per_head(weights.w_q), per_head(weights.w_k), per_head(weights.w_v), o, weights.group_size)


def attention_norm_weight(loaded, layer: int):
    """(D,) float64: the weight of the norm before layer's attention, None where the family's adapter names none."""
    family = loaded.family
    if loaded.is_bert or family.attention_norm is None:
        return None
    return loaded.model.model.get_submodule(family.attention_norm.format(index=layer)).weight.detach().cpu().double()


def gram_factor(matrices):
    """(..., D, d) -> (..., d, d): R of each matrix's QR, so R^T R = X^T X and |X Y|_F = |R Y|_F for any Y."""
    import torch

    return torch.linalg.qr(matrices, mode="r").R


@dataclass(frozen=True)
class Receivers:
    """A layer's receivers of one kind: head r's matrix (W_QK, W_QK^T or W_OV) has the factor shared[index[r]]
    right[r]^T (D × d), so |X M_r|_F = |X shared[index[r]] right[r]^T|_F for any X; norm[r] = |M_r|_F. Q: W_Q R(W_K)^T;
    K: W_K R(W_Q)^T and V: W_V R(W_O^T)^T, the first shared by a key/value head's group (one product for the group)."""

    shared: Any  # (U, D, d)
    index: Any  # (H,) long
    right: Any  # (H, d, d), or None where shared holds each head's whole factor (Q)
    norm: Any  # (H,)


def receivers(kind: str, factors: LayerFactors) -> Receivers:
    import torch

    heads = factors.q.shape[0]
    if kind == "q":  # every head its own W_Q: its right factor folded in, none left (right None)
        shared = factors.q @ gram_factor(factors.kv(factors.k)).transpose(1, 2)
        return Receivers(shared, torch.arange(heads), None, torch.linalg.matrix_norm(shared))
    shared, other = (factors.k, factors.q) if kind == "k" else (factors.v, factors.o.transpose(1, 2))
    index, right = torch.arange(heads) // factors.group, gram_factor(other)
    norm = torch.linalg.matrix_norm(shared[index] @ right.transpose(1, 2))  # (H,)
    return Receivers(shared, index, right, norm)


def stacked(layers: list[Receivers]) -> Receivers:
    """Several layers' receivers as one: shared (U, D, d) stacked, index into it, right (R, d, d), norm (R,)."""
    import torch

    offsets = torch.tensor([0, *[layer.shared.shape[0] for layer in layers]]).cumsum(0)[:-1]
    return Receivers(torch.cat([layer.shared for layer in layers]),
                     torch.cat([layer.index + offset for layer, offset in zip(layers, offsets)]),
                     None if layers[0].right is None else torch.cat([layer.right for layer in layers]),
                     torch.cat([layer.norm for layer in layers]))  # fmt: skip


def pair_scores(senders, sender_norms, receivers: Receivers):
    """(Hs, d, D) senders' factors R(W_V) W_O and their norms |W_OV| (Hs,) against every receiver -> (Hs, R)
    float64: |W_OV^s M_r| / (|W_OV^s| |M_r|)."""
    num_senders, head_dim, model_dim = senders.shape
    columns = receivers.shared.permute(1, 0, 2).reshape(model_dim, -1)  # (D, U d)
    products = (senders.reshape(-1, model_dim) @ columns).reshape(num_senders, head_dim, -1, head_dim)  # (Hs, d, U, d)
    pairs = products[:, :, receivers.index].permute(2, 0, 1, 3).reshape(-1, num_senders * head_dim, head_dim)
    if receivers.right is not None:
        pairs = pairs @ receivers.right.transpose(1, 2)  # (R, Hs d, d): each pair's d × d product, stacked
    squares = pairs.square().reshape(-1, num_senders, head_dim * head_dim).sum(dim=2)  # (R, Hs)
    return (squares.sqrt().T / sender_norms[:, None] / receivers.norm[None, :]).numpy()


def compositions(loaded, progress: Progress = Progress()) -> Compositions:
    """Every head pair's Q-, K- and V-composition scores (sender layer before receiver layer) and their baselines;
    progress: the sender layers done."""
    import torch

    from attnviz.layer_inputs import threads_for_tokens

    num_layers = loaded.num_layers
    # On one thread (threads_for_tokens' rule for small tensors): on the busy 2-core VM (load 2.1 to 2.6) the QRs of
    # (D, d) matrices ran 5 to 30 times slower on two threads, and SmolLM2's pairs took 3.5 to 23.0 s on two, 6.5 to
    # 13.3 s on one: one thread is the steadier.
    with torch.no_grad(), threads_for_tokens(0):
        factors = [layer_factors(loaded, layer) for layer in range(num_layers)]
        heads, (model_dim, head_dim) = factors[0].q.shape[0], factors[0].q.shape[1:]
        senders = [gram_factor(layer.kv(layer.v)) @ layer.o for layer in factors]  # (H, d, D): |R(W_V) W_O X| = |W_OV X|
        sender_norms = [torch.linalg.matrix_norm(sender) for sender in senders]  # (H,): |W_OV|
        received = {kind: [receivers(kind, layer) for layer in factors] for kind in KINDS}
        chance = baseline(int(model_dim), int(head_dim))
        scores = {kind: np.full((num_layers, heads, num_layers, heads), np.nan) for kind in KINDS}
        advance = progress.counting("sender layers of compositions", num_layers)
        for sender in range(num_layers):
            for kind in KINDS:
                if sender + 1 < num_layers:
                    found = pair_scores(senders[sender], sender_norms[sender], stacked(received[kind][sender + 1 :]))
                    scores[kind][sender, :, sender + 1 :, :] = found.reshape(heads, -1, heads)  # (H, later L, H)
            advance(1)
    folded = attention_norm_weight(loaded, 0) is not None
    notes = () if folded else (f"attnviz's {loaded.family.name} adapter names no norm before attention: the raw weights are scored",)
    return Compositions(scores, chance, BASELINE_DRAWS, folded, notes)


def baseline(model_dim: int, head_dim: int, draws: int = BASELINE_DRAWS, seed: int = BASELINE_SEED) -> dict[str, float]:
    """Per kind, the mean over draws of the score of standard Gaussian matrices of the heads' shapes. Each draw, kind
    by kind in KINDS' order, draws from one generator: the sender's W_V (D, d) and W_O (d, D), then the receiver's
    first (D, d) and second (D, d) matrix, its matrix first second^T (Q: W_Q W_K^T; K: W_K W_Q^T; V: W_V W_O, W_O^T
    drawn (D, d))."""
    import torch

    rng = np.random.default_rng(seed)
    totals = dict.fromkeys(KINDS, 0.0)
    for _ in range(draws):
        for kind in KINDS:
            v, o = rng.standard_normal((model_dim, head_dim)), rng.standard_normal((head_dim, model_dim))
            first, second = rng.standard_normal((model_dim, head_dim)), rng.standard_normal((model_dim, head_dim))
            v, o, first, second = (torch.from_numpy(matrix)[None] for matrix in (v, o, first, second))
            sender = gram_factor(v) @ o  # (1, d, D)
            right = gram_factor(second)  # (1, d, d)
            receiver = Receivers(first, torch.zeros(1, dtype=torch.long), right, torch.linalg.matrix_norm(first @ right.transpose(1, 2)))
            totals[kind] += float(pair_scores(sender, torch.linalg.matrix_norm(sender), receiver)[0, 0])
    return {kind: total / draws for kind, total in totals.items()}

"""Elhage et al.'s composition scores from the weights: how much each head reads what an earlier head wrote.

Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits"), row-vector convention as TransformerLens's
all_composition_scores. Per head h of a layer: W_Q^h, W_K^h, W_V^h (D × d, the key/value head's for grouped-query
heads) and W_O^h (d × D); W_OV^h = W_V^h W_O^h, W_QK^h = W_Q^h W_K^hT (both D × D, rank d). For a sender s of layer
l1 and a receiver r of layer l2 > l1, over the Frobenius norm:

    Q: |W_OV^s W_QK^r| / (|W_OV^s| |W_QK^r|)    K: |W_OV^s W_QK^rT| / (...)    V: |W_OV^s W_OV^r| / (|W_OV^s| |W_OV^r|)

The norm before each layer's attention (family.attention_norm) is folded in as circuits.copying folds it: W_Q, W_K
and W_V of layer l get diag(g_l) on their input side (its weight only; 1/RMS, LayerNorm's centring and bias left
out). A family whose adapter names no such norm (the post-norm BERTs) is scored on its raw weights, and said so.

W_QK is the weights' alone, as TransformerLens's: RoPE's rotation by position and Qwen3's RMSNorm over each head's q
and k are not in it (the latter said in the notes).

Never a D × D matrix: |X Y|_F = |R Y|_F where R (d × d) is the triangular factor of X's QR (R^T R = X^T X, the
Gram matrix), so every score is the norm of a d × d product of two d × D factors, e.g. for Q
|V1 O1 Q2 K2^T| = |R(V1) O1 Q2 R(K2)^T|: a sender layer's heads against every later layer's in one matrix product,
in float64.

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
    name = family.attention_norm.format(index=layer)
    with loaded.model.resident(name):  # a layer's weights read a layer at a time: on the device within
        return loaded.model.model.get_submodule(name).weight.detach().cpu().double()


def gram_factor(matrices):
    """(..., D, d) -> (..., d, d): R of each matrix's QR, so R^T R = X^T X and |X Y|_F = |R Y|_F for any Y."""
    import torch

    return torch.linalg.qr(matrices, mode="r").R


@dataclass(frozen=True)
class Receivers:
    """Receivers of one kind, layer after layer: head r's matrix M_r (W_QK, W_QK^T or W_OV) is Y_u R_r^T, u its
    key/value head, so |X M_r|_F = |X Y_u R_r^T|_F for any X. Q: Y = W_Q R(W_K)^T, every head its own (no R left);
    K: Y = W_K, R = R(W_Q); V: Y = W_V, R = R(W_O^T): a group's heads share Y, one product for the group.

    columns (D, U d): the Y_u side by side; right (U, d, group d): each group's R_r^T side by side, or None (Q);
    norm (U group,): |M_r|, the heads in order (head r of a layer belongs to its key/value head r // group)."""

    columns: Any
    right: Any
    norm: Any
    group: int  # receivers per Y: a key/value head's query heads (Q: 1)
    per_layer: int  # U of one layer
    head_dim: int

    def after(self, layer: int) -> "Receivers":
        """The receivers of the layers after layer."""
        start = (layer + 1) * self.per_layer
        return Receivers(self.columns[:, start * self.head_dim :], None if self.right is None else self.right[start:],
                         self.norm[start * self.group :], self.group, self.per_layer, self.head_dim)  # fmt: skip


def receivers(kind: str, factors: list[LayerFactors]) -> Receivers:
    """Every layer's receivers of kind, stacked layer after layer."""
    import torch

    if kind == "q":
        shared = torch.cat([layer.q @ gram_factor(layer.kv(layer.k)).transpose(1, 2) for layer in factors])  # (L H, D, d)
        right, group, norm = None, 1, torch.linalg.matrix_norm(shared)
    else:
        shared = torch.cat([layer.k if kind == "k" else layer.v for layer in factors])  # (L H_kv, D, d)
        others = torch.cat([layer.q if kind == "k" else layer.o.transpose(1, 2) for layer in factors])  # (L H, D, d)
        group, (units, _, head_dim) = factors[0].group, shared.shape
        transposed = gram_factor(others).transpose(1, 2)  # (L H, d, d): each head's R^T
        norm = torch.linalg.matrix_norm(shared.repeat_interleave(group, dim=0) @ transposed)  # (L H,)
        right = transposed.reshape(units, group, head_dim, head_dim).permute(0, 2, 1, 3).reshape(units, head_dim, group * head_dim)
    columns = shared.permute(1, 0, 2).reshape(shared.shape[1], -1)  # (D, U d)
    return Receivers(columns, right, norm, group, shared.shape[0] // len(factors), shared.shape[2])


def pair_scores(senders, sender_norms, receivers: Receivers):
    """(Hs, d, D) senders' factors R(W_V) W_O and their norms |W_OV| (Hs,) against every receiver -> (Hs, R)
    float64: |W_OV^s M_r| / (|W_OV^s| |M_r|)."""
    import torch

    num_senders, head_dim, model_dim = senders.shape
    products = senders.reshape(-1, model_dim) @ receivers.columns  # (Hs d, U d): one GEMM, every pair's d × d
    units = products.shape[1] // head_dim
    if receivers.right is None:
        norms = torch.linalg.vector_norm(products.reshape(num_senders, head_dim, units, head_dim), dim=(1, 3))  # (Hs, U)
    else:
        by_unit = products.reshape(-1, units, head_dim).transpose(0, 1)  # (U, Hs d, d)
        pairs = (by_unit @ receivers.right).reshape(units, num_senders, head_dim, receivers.group, head_dim)
        norms = torch.linalg.vector_norm(pairs, dim=(2, 4)).transpose(0, 1).reshape(num_senders, -1)  # (Hs, U group)
    return (norms / sender_norms[:, None] / receivers.norm[None, :]).numpy()


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
        received = {kind: receivers(kind, factors) for kind in KINDS}
        chance = baseline(int(model_dim), int(head_dim))
        scores = {kind: np.full((num_layers, heads, num_layers, heads), np.nan) for kind in KINDS}
        advance = progress.counting("sender layers of compositions", num_layers)
        for sender in range(num_layers):
            for kind in KINDS:
                if sender + 1 < num_layers:
                    found = pair_scores(senders[sender], sender_norms[sender], received[kind].after(sender))
                    scores[kind][sender, :, sender + 1 :, :] = found.reshape(heads, -1, heads)  # (H, later L, H)
            advance(1)
    folded = attention_norm_weight(loaded, 0) is not None
    notes = () if folded else (f"attnviz's {loaded.family.name} adapter names no norm before attention: the raw weights are scored",)
    if loaded.model.attention_weights(0).q_norm is not None:
        notes += ("the RMSNorm over each head's q and k is not folded in: W_QK is the projections' alone",)
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
            v, o, first, second = (torch.from_numpy(matrix) for matrix in (v, o, first, second))
            sender = gram_factor(v) @ o  # (d, D)
            right = gram_factor(second).T  # (d, d)
            receiver = Receivers(first, right[None], torch.linalg.matrix_norm(first @ right)[None], 1, 1, head_dim)
            totals[kind] += float(pair_scores(sender[None], torch.linalg.matrix_norm(sender)[None], receiver)[0, 0])
    return {kind: total / draws for kind, total in totals.items()}

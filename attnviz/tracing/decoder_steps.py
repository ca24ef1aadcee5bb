"""The steps current models add to the tutorials' attention, recorded from the real tensors.

RMSNorm over each head's q and k (Qwen3), rotary position embeddings on q and k (RoPE: Llama,
Mistral, Qwen, SmolLM), key/value heads repeated for the query heads that share them
(grouped-query attention), a scale other than 1/sqrt(d) (T5: none) and a position bias added to
the scores (T5). Each step is computed here the way attention/layer.py computes it, written out
in its operation, so the trace is the layer's own arithmetic. Axis names beyond the recorder's:
H_kv key/value heads, G = H / H_kv query heads per key/value head, d/2 pairs of features.
"""

from __future__ import annotations

import math

import torch

from attnviz.attention.layer import MultiHeadAttention, rotary_frequencies
from attnviz.tracing.recorder import LayerInputs, Recorder

NORM_ADDED = "Qwen3 normalises each head's q and k"
ROPE_TABLE_ADDED = "RoPE's table (the tutorials' positions are added to the embeddings)"
ROPE_ADDED = "RoPE turns q and k by their position, so q·k depends on the distance"
BIAS_ADDED = "T5 adds a learned bias per head and relative distance to the scores"


def record_head_norms(record: Recorder, layer: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, kv_heads: str):
    """q_normed, k_normed: x / sqrt(mean(x²) + eps) * weight over each head's d features (B, H or H_kv, N, d)."""
    note = f"RMSNorm over d: x / sqrt(mean(x²) + {layer.q_norm.eps:g}) * weight (d,)"
    q = record("q_normed", layer.q_norm(q), f"self.q_norm({record.role_of(q)})", "B H Nq d", (q,), note=note, added=NORM_ADDED)
    k = record(
        "k_normed", layer.k_norm(k), f"self.k_norm({record.role_of(k)})", f"B {kv_heads} Nk d", (k,), note=note,
        added=NORM_ADDED,
    )
    return q, k


def theta_of(inv_freq: torch.Tensor) -> float | None:
    """RoPE's base theta when inv_freq is exactly theta^(-2i/d); None when it is not (a scaled rope type)."""
    head_dim = 2 * len(inv_freq)
    if len(inv_freq) < 2:
        return None
    theta = round(float(inv_freq[1].double()) ** (-head_dim / 2))
    expected = rotary_frequencies(head_dim, theta).float()
    return theta if torch.allclose(inv_freq.float().cpu(), expected, rtol=1e-5, atol=0) else None


def record_rotary_tables(record: Recorder, layer: MultiHeadAttention, num_tokens: int, tokens: str):
    """positions (N,), inv_freq (d/2,), angles (N, d/2) and cos, sin (N, d): attention/layer.py's rotary_tables."""
    inv_freq = layer.rotary_inv_freq
    theta = theta_of(inv_freq)
    frequencies = (
        f"1.0 / {theta} ** (torch.arange(0, d, 2) / d)"
        if theta is not None
        else "the model's rotary_emb.inv_freq"
    )
    frequencies_note = (
        f"θ_i = {theta}^(-2i/d): the first pairs turn fast, the last slowly"
        if theta is not None
        else "the model's own frequencies (a scaled rope type: not θ^(-2i/d) throughout)"
    )
    positions = record(
        "positions", torch.arange(num_tokens, dtype=torch.float64, device=inv_freq.device), f"torch.arange({tokens})",
        tokens, note="float64, so long texts' angles stay exact",
        added=ROPE_TABLE_ADDED,
    )
    inv_freq = record("inv_freq", inv_freq, frequencies, "d/2", note=frequencies_note, added=ROPE_TABLE_ADDED)
    angles = record(
        "angles", torch.outer(positions, inv_freq.double()), "torch.outer(positions, inv_freq)", f"{tokens} d/2",
        (positions, inv_freq), pattern="n, i -> n i", note="pair i at position n turns by n·θ_i",
        added=ROPE_TABLE_ADDED,
    )
    doubled = torch.cat([angles, angles], dim=-1)  # (N, d): feature i and i + d/2 form a pair, turned alike
    tables = []
    for name in ("cos", "sin"):
        table = (getattr(doubled, name)() * layer.rotary_scaling).float()
        operation = f"torch.cat([angles, angles], dim=-1).{name}()"
        if layer.rotary_scaling != 1:  # a rope type's attention factor
            operation = f"({operation} * {layer.rotary_scaling:g})"
        tables.append(
            record(
                name, table, f"{operation}.float()", f"{tokens} d",
                (angles,), pattern="n i -> n (2 i)",
                note="features i and i + d/2 form a pair, turned alike",
                added=ROPE_TABLE_ADDED,
            )
        )
    return tables


def record_rotation(record: Recorder, name: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, axes: str):
    """q_rot or k_rot: x·cos + rotate_half(x)·sin, rotate_half(x) = cat(-x2, x1), written out."""
    source, tokens = record.role_of(x), x.shape[2]
    cut = "" if tokens == cos.shape[0] else f"[:{axes.split()[2]}]"
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (B, H, N, d)
    rotated = x * cos[:tokens] + rotated_half * sin[:tokens]
    operation = (
        f"{source} * cos{cut} + torch.cat([-{source}[..., d//2:], {source}[..., :d//2]], dim=-1) * sin{cut}"
    )
    note = "pair (x_i, x_i+d/2) → (x_i cos − x_i+d/2 sin, x_i+d/2 cos + x_i sin); cos, sin broadcast over B and heads"
    return record(f"{name}_rot", rotated, operation, axes, (x, cos, sin), note=note, added=ROPE_ADDED)


def record_repeat(record: Recorder, layer: MultiHeadAttention, name: str, x: torch.Tensor) -> torch.Tensor:
    """k_repeated or v_repeated: (B, H_kv, Nk, d) -> (B, H, Nk, d), each key/value head once per query head."""
    group = layer.group_size
    shared = ", ".join(f"{h * group}–{(h + 1) * group - 1} → {h}" for h in range(min(layer.num_kv_heads, 3)))
    more = ", ..." if layer.num_kv_heads > 3 else ""
    return record(
        f"{name}_repeated", x.repeat_interleave(group, dim=1), f"{record.role_of(x)}.repeat_interleave(G, dim=1)",
        "B H Nk d", (x,), pattern="b h_kv n d -> b (h_kv g) n d",
        note=f"query head h reads key/value head h // G ({shared}{more})",
        added=f"the tutorials give each query head its own key/value head; here G = {group} query heads share each of "
        f"the H_kv = {layer.num_kv_heads}",
    )


def record_scores(record: Recorder, layer: MultiHeadAttention, q: torch.Tensor, k_t: torch.Tensor) -> torch.Tensor:
    """scores: q @ k_t scaled as the model scales them (1/sqrt(d) for most, 1 for T5)."""
    d = q.shape[-1]
    product, note = f"{record.role_of(q)} @ k_t", None
    if math.isclose(layer.scale, 1 / math.sqrt(d), rel_tol=1e-6):
        scores, operation = q @ k_t / math.sqrt(d), f"{product} / math.sqrt(d)"
    elif layer.scale == 1:
        scores, operation = q @ k_t, product
        note = f"no scaling: the model's scale is 1, not 1/sqrt(d) = {1 / math.sqrt(d):.4g}"
    else:
        scores, operation = q @ k_t * layer.scale, f"{product} * scale"
        note = f"scale = {layer.scale:.6g}, the model's own (1/sqrt(d) would be {1 / math.sqrt(d):.4g})"
    return record(
        "scores", scores, operation, "B H Nq Nk", (q, k_t), pattern="b h nq d, b h d nk -> b h nq nk", note=note
    )


def record_position_bias(record: Recorder, inputs: LayerInputs, scores: torch.Tensor) -> torch.Tensor:
    """biased_scores: scores + the model's position bias (1 or B, H, Nq, Nk)."""
    bias = inputs.position_bias.to(scores.device, scores.dtype)
    axes = f"{'B' if bias.shape[0] > 1 else '1'} H Nq Nk"
    bias = record("position_bias", bias, inputs.position_bias_source, axes, note="one learned bias per head and relative distance")
    return record(
        "biased_scores", scores + bias, "scores + position_bias", "B H Nq Nk", (scores, bias), added=BIAS_ADDED,
        note="the bias broadcasts over B" if bias.shape[0] == 1 and scores.shape[0] > 1 else None,
    )

"""The d2l.ai tutorial's MultiHeadAttention: heads folded into the batch axis, (B*H, N, d)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnviz.attention.layer import MultiHeadAttention
from attnviz.tracing.recorder import LayerInputs, LayoutTrace, Recorder, axis_sizes, finish_trace, record_projections

D2L_MASK_VALUE = -1e6  # d2l's masked_softmax: large negative, not -inf


def merged_batch(layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int) -> LayoutTrace:
    """d2l.ai's MultiHeadAttention: transpose_qkv, DotProductAttention, masked_softmax, transpose_output."""
    sizes = axis_sizes(inputs, num_heads)
    B, Nq, Nk, H, d = (sizes[name] for name in ("B", "Nq", "Nk", "H", "d"))
    record = Recorder(sizes, inputs.self_attention)
    token_sizes = {"Nq": Nq, "Nk": Nk}

    def transpose_qkv(name: str, projected: torch.Tensor, tokens: str) -> torch.Tensor:
        viewed = record(
            f"{name}_view", projected.reshape(B, token_sizes[tokens], H, -1), f"{name}.reshape(B, {tokens}, H, -1)",
            f"B {tokens} H d", (projected,), pattern="b n (h d) -> b n h d",
        )  # (B, N, H, d)
        permuted = record(
            f"{name}_permuted", viewed.permute(0, 2, 1, 3), f"{name}_view.permute(0, 2, 1, 3)",
            f"B H {tokens} d", (viewed,), pattern="b n h d -> b h n d",
        )  # (B, H, N, d)
        return record(
            f"{name}_heads", permuted.reshape(-1, token_sizes[tokens], d), f"{name}_permuted.reshape(-1, {tokens}, d)",
            f"B*H {tokens} d", (permuted,), pattern="b h n d -> (b h) n d",
            note="heads folded into the batch axis: row b*H + h is head h of text b",
        )  # (B*H, N, d)

    q, k, v = record_projections(record, layer, inputs, "self.W_{}")  # (B, N, D) each
    q, k, v = transpose_qkv("q", q, "Nq"), transpose_qkv("k", k, "Nk"), transpose_qkv("v", v, "Nk")

    k_t = record("k_t", k.transpose(1, 2), "k_heads.transpose(1, 2)", "B*H d Nk", (k,), pattern="bh n d -> bh d n")
    scores = record(
        "scores", torch.bmm(q, k_t) / math.sqrt(d), "torch.bmm(q_heads, k_t) / math.sqrt(d)", "B*H Nq Nk", (q, k_t),
        pattern="bh nq d, bh d nk -> bh nq nk",
    )  # (B*H, Nq, Nk)

    valid_lens, valid_axes = None, ""
    if inputs.valid_lens is not None:
        valid_lens = record("valid_lens", inputs.valid_lens.to(q.device), "encoded.valid_lens", "B")
        valid_axes = "B"
    if inputs.causal:
        # d2l's decoder masks the future with one valid length per query: query i sees keys 0..i.
        per_query = torch.arange(1, Nq + 1, device=q.device).repeat(B, 1)  # (B, Nq)
        added = "the tutorial takes valid_lens of shape (B, Nq) as given; d2l's decoder makes them so for --causal"
        if valid_lens is None:
            valid_lens = record("valid_lens", per_query, "torch.arange(1, Nq + 1).repeat(B, 1)", "B Nq", added=added)
        else:
            valid_lens = record(
                "valid_lens_causal", torch.minimum(valid_lens[:, None], per_query),
                "torch.minimum(valid_lens[:, None], torch.arange(1, Nq + 1))", "B Nq", (valid_lens,), added=added,
            )
        valid_axes = "B Nq"
    if valid_lens is not None:
        head_axes = valid_axes.replace("B", "B*H", 1)
        valid_lens = record(
            "valid_lens_heads", torch.repeat_interleave(valid_lens, repeats=H, dim=0),
            "torch.repeat_interleave(valid_lens, repeats=H, dim=0)", head_axes, (valid_lens,),
            note="one copy per head, in the order of the folded batch axis",
        )  # (B*H,) or (B*H, Nq)
        if valid_lens.dim() == 1:
            rows = record(
                "valid_lens_rows", torch.repeat_interleave(valid_lens, Nq), "torch.repeat_interleave(valid_lens, Nq)",
                "B*H*Nq", (valid_lens,), note="masked_softmax: one valid length per row of scores",
            )
        else:
            rows = record("valid_lens_rows", valid_lens.reshape(-1), "valid_lens.reshape(-1)", "B*H*Nq", (valid_lens,))
        score_rows = record(
            "score_rows", scores.reshape(-1, Nk), "scores.reshape(-1, Nk)", "B*H*Nq Nk", (scores,),
            pattern="bh nq nk -> (bh nq) nk",
        )
        mask = record(
            "mask", torch.arange(Nk, device=q.device)[None, :] < rows[:, None],
            "torch.arange(Nk)[None, :] < valid_lens_rows[:, None]", "B*H*Nq Nk", (rows,),
            note="d2l's sequence_mask: True where the key is within the valid length",
        )
        masked_rows = record(
            "masked_rows", score_rows.masked_fill(~mask, D2L_MASK_VALUE), "sequence_mask(X, valid_lens, value=-1e6)",
            "B*H*Nq Nk", (score_rows, mask), note="d2l writes X[~mask] = -1e6: exp(-1e6) is exactly 0 in float32",
        )
        scores = record(
            "masked_scores", masked_rows.reshape(B * H, Nq, Nk), "X.reshape(shape)", "B*H Nq Nk", (masked_rows,),
            pattern="(bh nq) nk -> bh nq nk",
        )
    pattern = record(
        "pattern", F.softmax(scores, dim=-1), f"F.softmax({record.role_of(scores)}, dim=-1)", "B*H Nq Nk", (scores,)
    )  # (B*H, Nq, Nk)
    z = record("z", torch.bmm(pattern, v), "torch.bmm(pattern, v_heads)", "B*H Nq d", (pattern, v), pattern="bh nq nk, bh nk d -> bh nq d")

    # transpose_output: the inverse of transpose_qkv
    z_view = record("z_view", z.reshape(-1, H, Nq, d), "z.reshape(-1, H, Nq, d)", "B H Nq d", (z,), pattern="(b h) n d -> b h n d")
    permuted = record(
        "z_permuted", z_view.permute(0, 2, 1, 3), "z_view.permute(0, 2, 1, 3)", "B Nq H d", (z_view,), pattern="b h n d -> b n h d"
    )
    merged = record(
        "z_merged", permuted.reshape(B, Nq, -1), "z_permuted.reshape(B, Nq, -1)", "B Nq D", (permuted,),
        pattern="b n h d -> b n (h d)", note="reshape copies when view cannot: no .contiguous() needed",
    )
    out = record("out", layer.w_o(merged), "self.W_o(z_merged)", "B Nq D", (merged,))
    notes = ["d2l's W_q, W_k, W_v, W_o here carry the BERT layer's biases too (d2l's have none)"]
    weights = pattern.reshape(B, H, Nq, Nk)  # (B, H, Nq, Nk): unfold the heads to compare
    return finish_trace("merged-batch", record, H, d, weights, out, notes=notes)

"""attnviz's own layer (attention/layer.py), step by step: view + permute to (B, H, N, d).

It also makes the two mistakes of MISTAKES on request, so a learner sees where they go wrong.
"""

from __future__ import annotations

import math

import torch

from attnviz.attention.layer import MultiHeadAttention, allowed_keys
from attnviz.errors import AttnvizError
from attnviz.tracing.mistakes import MISTAKES, WRONG_MERGE_NOTE, WRONG_SPLIT_NOTE
from attnviz.tracing.recorder import (
    LayerInputs, LayoutTrace, Recorder, axis_sizes, broadcast_note, finish_trace, record_projections,
)  # fmt: skip


def view_permute(
    layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int, mistake: str | None = None
) -> LayoutTrace:
    """attnviz's layer (attention/layer.py), step by step: view + permute to (B, H, N, d)."""
    if mistake not in (None, *MISTAKES):
        raise AttnvizError(f"unknown mistake {mistake!r}: choose one of {', '.join(MISTAKES)}")
    sizes = axis_sizes(inputs, num_heads)
    B, Nq, Nk, H, d, D = (sizes[name] for name in ("B", "Nq", "Nk", "H", "d", "D"))
    record = Recorder(sizes, inputs.self_attention)
    token_sizes = {"Nq": Nq, "Nk": Nk}

    def split(name: str, projected: torch.Tensor, tokens: str) -> torch.Tensor:
        if mistake == "view-without-permute":
            wrong = projected.view(B, H, token_sizes[tokens], d)  # (B, H, N, d) of the wrong numbers
            return record(
                f"{name}_heads", wrong, f"{name}.view(B, H, {tokens}, d)", f"B H {tokens} d", (projected,),
                note=WRONG_SPLIT_NOTE, mistake=True,
            )
        viewed = record(
            f"{name}_view", projected.view(B, token_sizes[tokens], H, d), f"{name}.view(B, {tokens}, H, d)",
            f"B {tokens} H d", (projected,), pattern="b n (h d) -> b n h d",
        )  # (B, N, H, d)
        return record(
            f"{name}_heads", viewed.permute(0, 2, 1, 3), f"{name}_view.permute(0, 2, 1, 3)",
            f"B H {tokens} d", (viewed,), pattern="b n h d -> b h n d",
        )  # (B, H, N, d)

    q, k, v = record_projections(record, layer, inputs, "self.w_{}")  # (B, N, D) each
    q, k, v = split("q", q, "Nq"), split("k", k, "Nk"), split("v", v, "Nk")  # (B, H, N, d)

    k_t = record("k_t", k.transpose(-2, -1), "k_heads.transpose(-2, -1)", "B H d Nk", (k,), pattern="b h n d -> b h d n")
    scores = record(
        "scores", q @ k_t / math.sqrt(d), "q_heads @ k_t / math.sqrt(d)", "B H Nq Nk", (q, k_t),
        pattern="b h nq d, b h d nk -> b h nq nk",
    )
    mask_inputs = ()
    if inputs.valid_lens is not None:
        mask_inputs = (record("valid_lens", inputs.valid_lens.to(q.device), "encoded.valid_lens", "B"),)
    allowed = allowed_keys(Nq, Nk, inputs.valid_lens, inputs.causal, scores.device)
    if allowed is not None:
        mask_axes = allowed_axes(inputs.valid_lens, inputs.causal)
        mask = record(
            "mask", allowed, "allowed_keys(Nq, Nk, valid_lens, causal)", mask_axes, mask_inputs,
            note="True where the query may attend to the key",
        )  # (B or 1, 1, Nq or 1, Nk)
        scores = record(
            "masked_scores", scores.masked_fill(~mask, float("-inf")), "scores.masked_fill(~mask, float('-inf'))",
            "B H Nq Nk", (scores, mask), note=broadcast_note(mask, mask_axes, scores, "B H Nq Nk"),
        )
    pattern = record(
        "pattern", scores.softmax(dim=-1), f"{record.role_of(scores)}.softmax(dim=-1)", "B H Nq Nk", (scores,)
    )
    z = record("z", pattern @ v, "pattern @ v_heads", "B H Nq d", (pattern, v), pattern="b h nq nk, b h nk d -> b h nq d")

    if mistake == "merge-without-permute":
        merged = record(
            "z_merged", z.view(B, Nq, D), "z.view(B, Nq, D)", "B Nq D", (z,), note=WRONG_MERGE_NOTE, mistake=True
        )  # (B, N, D) with the wrong numbers in each row
    else:
        permuted = record(
            "z_permuted", z.permute(0, 2, 1, 3), "z.permute(0, 2, 1, 3)", "B Nq H d", (z,), pattern="b h n d -> b n h d"
        )  # (B, N, H, d)
        contiguous = record(
            "z_contiguous", permuted.contiguous(), "z_permuted.contiguous()", "B Nq H d", (permuted,),
            note="view needs contiguous memory: this copies the heads next to each other"
            if not permuted.is_contiguous()
            else "already contiguous (one head): no copy",
        )
        merged = record(
            "z_merged", contiguous.view(B, Nq, D), "z_contiguous.view(B, Nq, D)", "B Nq D", (contiguous,),
            pattern="b n h d -> b n (h d)",
        )  # (B, N, D)
    out = record("out", layer.w_o(merged), "self.w_o(z_merged)", "B Nq D", (merged,))
    return finish_trace("view-permute", record, H, d, pattern, out, mistake=mistake)


def allowed_axes(valid_lens: torch.Tensor | None, causal: bool) -> str:
    """Axis names of allowed_keys' result: (B or 1, 1, Nq or 1, Nk)."""
    return f"{'B' if valid_lens is not None else '1'} 1 {'Nq' if causal else '1'} Nk"

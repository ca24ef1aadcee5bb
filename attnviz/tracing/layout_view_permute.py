"""attnviz's own layer (attention/layer.py), step by step: view + permute to (B, H, N, d).

It also makes the two mistakes of MISTAKES on request, so a learner sees where they go wrong.
"""

from __future__ import annotations

import math

import torch

from attnviz.attention.layer import MultiHeadAttention, allowed_keys
from attnviz.errors import AttnvizError
from attnviz.tracing.mistakes import MISTAKES, WRONG_MERGE_NOTE, WRONG_SPLIT_NOTE
from attnviz.tracing.decoder_steps import (
    record_head_norms, record_position_bias, record_repeat, record_rotary_tables, record_rotation, record_scores,
)  # fmt: skip
from attnviz.tracing.recorder import (
    LayerInputs, LayoutTrace, Recorder, axis_sizes, beyond_tutorials, broadcast_note, finish_trace, inner_axes,
    record_projections,
)  # fmt: skip


def view_permute(
    layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int, mistake: str | None = None
) -> LayoutTrace:
    """attnviz's layer (attention/layer.py), step by step: view + permute to (B, H, N, d).

    Split into the layer's own heads, it traces what current models add as well (decoder_steps):
    q/k norms, RoPE, the key/value heads repeated for grouped-query attention, the model's
    scale and position bias.
    """
    if mistake not in (None, *MISTAKES):
        raise AttnvizError(f"unknown mistake {mistake!r}: choose one of {', '.join(MISTAKES)}")
    own_heads = num_heads == layer.num_heads
    if not own_heads and beyond_tutorials(layer, inputs):
        raise RuntimeError(f"trace bug: a layer with {beyond_tutorials(layer, inputs)[0]} is traced in its own heads only")
    if mistake is not None and layer.group_size > 1:
        raise AttnvizError(
            f"--mistake shows a wrong split of heads that queries and keys share; this layer's {layer.num_heads} "
            f"query heads share {layer.num_kv_heads} key/value heads: leave out --mistake"
        )
    sizes = axis_sizes(inputs, num_heads, layer)
    B, Nq, Nk, H, d = (sizes[name] for name in ("B", "Nq", "Nk", "H", "d"))
    query_axis, _ = inner_axes(layer, num_heads)
    H_kv = sizes.get("H_kv", H)
    kv_heads = "H_kv" if H_kv != H else "H"
    record = Recorder(sizes, inputs.self_attention)
    token_sizes = {"Nq": Nq, "Nk": Nk}

    def split(name: str, projected: torch.Tensor, tokens: str, heads: str) -> torch.Tensor:
        if mistake == "view-without-permute":
            wrong = projected.view(B, H, token_sizes[tokens], d)  # (B, H, N, d) of the wrong numbers
            return record(
                f"{name}_heads", wrong, f"{name}.view(B, H, {tokens}, d)", f"B H {tokens} d", (projected,),
                note=WRONG_SPLIT_NOTE, mistake=True,
            )
        viewed = record(
            f"{name}_view", projected.view(B, token_sizes[tokens], sizes[heads], d), f"{name}.view(B, {tokens}, {heads}, d)",
            f"B {tokens} {heads} d", (projected,), pattern=f"b n ({heads.lower()} d) -> b n {heads.lower()} d",
        )  # (B, N, H, d)
        return record(
            f"{name}_heads", viewed.permute(0, 2, 1, 3), f"{name}_view.permute(0, 2, 1, 3)",
            f"B {heads} {tokens} d", (viewed,), pattern=f"b n {heads.lower()} d -> b {heads.lower()} n d",
        )  # (B, H, N, d)

    q, k, v = record_projections(record, layer, inputs, "self.w_{}", num_heads)  # (B, N, H*d), (B, N, H_kv*d) ...
    q, k, v = split("q", q, "Nq", "H"), split("k", k, "Nk", kv_heads), split("v", v, "Nk", kv_heads)  # (B, H, N, d)
    if own_heads and layer.q_norm is not None:
        q, k = record_head_norms(record, layer, q, k, kv_heads)
    if own_heads and layer.rotary_inv_freq is not None:
        tokens = "Nq" if Nq >= Nk else "Nk"
        cos, sin = record_rotary_tables(record, layer, token_sizes[tokens], tokens)  # (N, d) each
        q = record_rotation(record, "q", q, cos, sin, "B H Nq d")
        k = record_rotation(record, "k", k, cos, sin, f"B {kv_heads} Nk d")
    if own_heads and layer.group_size > 1:
        k, v = record_repeat(record, layer, "k", k), record_repeat(record, layer, "v", v)  # (B, H, Nk, d)

    k_t = record(
        "k_t", k.transpose(-2, -1), f"{record.role_of(k)}.transpose(-2, -1)", "B H d Nk", (k,), pattern="b h n d -> b h d n"
    )
    scores = record_scores(record, layer, q, k_t) if own_heads else record(
        "scores", q @ k_t / math.sqrt(d), "q_heads @ k_t / math.sqrt(d)", "B H Nq Nk", (q, k_t),
        pattern="b h nq d, b h d nk -> b h nq nk",
    )
    if inputs.position_bias is not None:
        scores = record_position_bias(record, inputs, scores)
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
            "masked_scores", scores.masked_fill(~mask, float("-inf")),
            f"{record.role_of(scores)}.masked_fill(~mask, float('-inf'))",
            "B H Nq Nk", (scores, mask), note=broadcast_note(mask, mask_axes, scores, "B H Nq Nk"),
        )
    pattern = record(
        "pattern", scores.softmax(dim=-1), f"{record.role_of(scores)}.softmax(dim=-1)", "B H Nq Nk", (scores,)
    )
    z = record(
        "z", pattern @ v, f"pattern @ {record.role_of(v)}", "B H Nq d", (pattern, v),
        pattern="b h nq nk, b h nk d -> b h nq d",
    )

    if mistake == "merge-without-permute":
        merged = record(
            "z_merged", z.view(B, Nq, H * d), f"z.view(B, Nq, {query_axis})", f"B Nq {query_axis}", (z,),
            note=WRONG_MERGE_NOTE, mistake=True,
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
            "z_merged", contiguous.view(B, Nq, H * d), f"z_contiguous.view(B, Nq, {query_axis})", f"B Nq {query_axis}",
            (contiguous,), pattern="b n h d -> b n (h d)",
        )  # (B, N, H*d)
    out = record("out", layer.w_o(merged), "self.w_o(z_merged)", "B Nq D", (merged,))
    return finish_trace("view-permute", record, H, d, pattern, out, mistake=mistake, notes=fused_note(layer))


def fused_note(layer: MultiHeadAttention) -> list[str]:
    """A model that stores W_q, W_k, W_v as one fused projection (GPT-2's c_attn) is traced as stored by fused-qkv."""
    name = getattr(layer, "fused_qkv_name", None)
    if name is None:
        return []
    return [f"the model stores W_q, W_k, W_v as one projection, {name}: --layout fused-qkv traces it as stored"]


def allowed_axes(valid_lens: torch.Tensor | None, causal: bool) -> str:
    """Axis names of allowed_keys' result: (B or 1, 1, Nq or 1, Nk)."""
    return f"{'B' if valid_lens is not None else '1'} 1 {'Nq' if causal else '1'} Nk"

"""The nanoGPT-style tutorial's attention: one Linear(D, 3D), split, view, transpose(1, 2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnviz.attention.layer import MultiHeadAttention
from attnviz.errors import AttnvizError
from attnviz.tracing.recorder import LayerInputs, LayoutTrace, Recorder, axis_sizes, broadcast_note, finish_trace


def fused_projection(layer: MultiHeadAttention) -> torch.nn.Linear:
    """nanoGPT's c_attn: one Linear(D, 3D) whose weight is W_q, W_k, W_v stacked."""
    model_size = layer.w_q.in_features
    if not layer.w_q.in_features == layer.w_k.in_features == layer.w_v.in_features:
        raise AttnvizError("fused-qkv needs queries, keys and values of one size: it projects one sequence")
    c_attn = torch.nn.Linear(model_size, 3 * model_size, bias=layer.w_q.bias is not None)
    c_attn = c_attn.to(layer.w_q.weight.device, layer.w_q.weight.dtype)
    with torch.no_grad():
        c_attn.weight.copy_(torch.cat([layer.w_q.weight, layer.w_k.weight, layer.w_v.weight]))  # (3D, D)
        if c_attn.bias is not None:
            c_attn.bias.copy_(torch.cat([layer.w_q.bias, layer.w_k.bias, layer.w_v.bias]))  # (3D,)
    return c_attn


def record_conv1d_projection(record: Recorder, c_attn: torch.nn.Linear, x: torch.Tensor, name: str) -> torch.Tensor:
    """GPT-2's c_attn as it stores it: a Conv1D, x @ weight + bias with weight (D, 3D), nn.Linear's transposed."""
    batch, tokens, model_size = x.shape
    weight = record(
        "qkv_weight", c_attn.weight.T.contiguous(), f"{name}.weight", "D 3D",
        note="Conv1D keeps (in, out) = (D, 3D), the transpose of nn.Linear's (out, in); "
        "rebuilt here from W_q, W_k, W_v, equal to the model's",
    )  # (D, 3D)
    bias = c_attn.bias if c_attn.bias is not None else torch.zeros_like(weight[0])  # (3D,)
    flat = torch.addmm(bias, x.reshape(-1, model_size), weight)  # (B*N, 3D): Conv1D.forward
    return record(
        "qkv", flat.view(batch, tokens, -1), "self.c_attn(x)", "B Nq 3D", (x, weight),
        pattern="b n i, i o -> b n o", note="Conv1D.forward: torch.addmm(bias, x.view(-1, D), weight), no transpose",
    )  # (B, N, 3D)


def fused_qkv(layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int) -> LayoutTrace:
    """nanoGPT's CausalSelfAttention.forward; --causal adds its lower-triangular buffer."""
    if not inputs.self_attention:
        raise AttnvizError(
            "fused-qkv is self-attention only: its one Linear(D, 3D) projects one sequence; "
            "leave out --kv or choose another --layout"
        )
    sizes = axis_sizes(inputs, num_heads)
    B, N, H, d, D = (sizes[name] for name in ("B", "Nq", "H", "d", "D"))
    record = Recorder(sizes, self_attention=True)
    c_attn = fused_projection(layer)

    x = record("x", inputs.queries, inputs.source, "B Nq D")
    stored_as = getattr(layer, "fused_qkv_name", None)  # GPT-2: "h.L.attn.c_attn", a Conv1D
    if stored_as is None:
        qkv = record("qkv", c_attn(x), "self.attn(x)", "B Nq 3D", (x,))  # (B, N, 3D)
    else:
        qkv = record_conv1d_projection(record, c_attn, x, stored_as)  # (B, N, 3D)
    q, k, v = qkv.split(D, dim=2)  # three (B, N, D) views into qkv
    heads = []
    for index, (name, projected) in enumerate((("q", q), ("k", k), ("v", v))):
        projected = record(
            name, projected, f"qkv.split(D, dim=2)[{index}]", "B Nq D", (qkv,), pattern="b n (3 D) -> 3 b n D",
        )
        viewed = record(
            f"{name}_view", projected.view(B, N, H, d), f"{name}.view(B, Nq, H, D // H)", "B Nq H d",
            (projected,), pattern="b n (h d) -> b n h d",
        )  # (B, N, H, d)
        heads.append(
            record(
                f"{name}_heads", viewed.transpose(1, 2), f"{name}_view.transpose(1, 2)", "B H Nq d", (viewed,),
                pattern="b n h d -> b h n d",
            )
        )  # (B, H, N, d)
    q, k, v = heads

    k_t = record("k_t", k.transpose(-2, -1), "k_heads.transpose(-2, -1)", "B H d Nq", (k,), pattern="b h n d -> b h d n")
    scores = record(
        "scores", (q @ k_t) * (1.0 / math.sqrt(k.size(-1))), "(q_heads @ k_t) * (1.0 / math.sqrt(k_heads.size(-1)))",
        "B H Nq Nq", (q, k_t), pattern="b h nq d, b h d nk -> b h nq nk",
    )
    masks, mask_axes = [], ""
    if inputs.causal:
        tril = torch.tril(torch.ones(N, N, device=x.device)).view(1, 1, N, N)  # the tutorial's registered buffer
        bias = record(
            "causal_bias", tril, "self.bias[:, :, :Nq, :Nq]", "1 1 Nq Nq",
            note="registered as torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)",
        )
        masks.append(record("causal_mask", bias != 0, "self.bias[:, :, :Nq, :Nq] != 0", "1 1 Nq Nq", (bias,)))
        mask_axes = "1 1 Nq Nq"
    if inputs.valid_lens is not None:
        # The tutorial has no padding: this key padding mask is attnviz's, so batches work too.
        padding_added = "the tutorial has no padding; this masks the padding keys of a batch"
        valid_lens = record("valid_lens", inputs.valid_lens.to(x.device), "encoded.valid_lens", "B")
        padding = torch.arange(N, device=x.device)[None, :] < valid_lens[:, None]  # (B, N)
        masks.append(
            record(
                "padding_mask", padding[:, None, None, :], "(torch.arange(Nq) < valid_lens[:, None])[:, None, None, :]",
                "B 1 1 Nq", (valid_lens,), added=padding_added,
            )
        )
        mask_axes = "B 1 1 Nq"
    if len(masks) == 2:
        masks = [
            record(
                "mask", masks[0] & masks[1], "causal_mask & padding_mask", "B 1 Nq Nq", tuple(masks),
                added="the tutorial masks only the future",
            )
        ]
        mask_axes = "B 1 Nq Nq"
    if masks:
        (mask,) = masks
        operation = "scores.masked_fill(~mask, -float('inf'))"
        if inputs.valid_lens is None:  # the tutorial's own line
            operation = "scores.masked_fill(self.bias[:, :, :Nq, :Nq] == 0, -float('inf'))"
        scores = record(
            "masked_scores", scores.masked_fill(~mask, float("-inf")), operation, "B H Nq Nq", (scores, mask),
            note=broadcast_note(mask, mask_axes, scores, "B H Nq Nq"),
            added=None if inputs.causal else "the tutorial masks only the future",
        )
    pattern = record(
        "pattern", F.softmax(scores, dim=-1), f"F.softmax({record.role_of(scores)}, dim=-1)", "B H Nq Nq", (scores,)
    )
    z = record("z", pattern @ v, "pattern @ v_heads", "B H Nq d", (pattern, v), pattern="b h nq nk, b h nk d -> b h nq d")
    transposed = record("z_permuted", z.transpose(1, 2), "z.transpose(1, 2)", "B Nq H d", (z,), pattern="b h n d -> b n h d")
    contiguous = record("z_contiguous", transposed.contiguous(), "z_permuted.contiguous()", "B Nq H d", (transposed,))
    merged = record(
        "z_merged", contiguous.view(B, N, D), "z_contiguous.view(B, Nq, D)", "B Nq D", (contiguous,), pattern="b n h d -> b n (h d)"
    )
    out = record(
        "out", layer.w_o(merged), "self.c_proj(z_merged)", "B Nq D", (merged,),
        added="the tutorial returns the merged heads; W_o (nanoGPT's c_proj), so the output compares with the other layouts",
    )
    fused = (
        "the tutorial's self.attn = nn.Linear(n_embd, 3 * n_embd) (nanoGPT's c_attn); its weight here is "
        "torch.cat([W_q, W_k, W_v]) (3D, D), so split(D, dim=2) gives back q, k and v"
    )
    if stored_as is not None:
        fused = (
            f"the model's own fused projection {stored_as}: a Conv1D, whose weight (D, 3D) is the transpose of "
            "nn.Linear's (3D, D); its columns are W_q, W_k, W_v side by side, so split(D, dim=2) gives back q, k and v"
        )
    notes = [
        fused,
        "the tutorial's T is Nq here, C and n_embd are D, n_heads is H",
        "the tutorial always masks the future; here only with --causal"
        if stored_as is None
        else "the tutorial always masks the future, and so does this model: a decoder's own mask",
    ]
    return finish_trace("fused-qkv", record, H, d, pattern, out, notes=notes)

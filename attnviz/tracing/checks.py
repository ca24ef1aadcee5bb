"""Is every layout right? Each against torch's own layer, and each head against its slice of the weights."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnviz.attention.layer import MultiHeadAttention
from attnviz.tracing.recorder import LayerInputs, LayoutTrace, beyond_tutorials

TOLERANCE = 1e-5
LAYER_NAME = "MultiHeadAttention"  # attnviz's own layer (attention/layer.py), checked beside the layouts


@dataclass
class Check:
    """How far a layout's weights and output are from its reference's."""

    layout: str
    reference: str
    weights_diff: float
    output_diff: float
    num_heads: int

    @property
    def agree(self) -> bool:
        return max(self.weights_diff, self.output_diff) <= TOLERANCE


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64; where the two have one shape, the difference and its absolute value in a's float64 copy,
    beside b's (two float64 buffers at once, not four: a layer's weights of 32 heads at 512 tokens are 67 MB in
    float64)."""
    if a.shape != b.shape:  # one broadcast against the other
        return float((a.double().cpu() - b.double().cpu()).abs().max())
    difference = a.cpu().to(torch.float64, copy=True)
    return float(difference.sub_(b.cpu().double()).abs_().max())


def torch_reference(layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.MultiheadAttention loaded with the layer's W_q, W_k, W_v, W_o, split into num_heads heads.

    Independent of attention/layer.py: torch's own projections, head split, masks and softmax, in
    float64, so that a difference is the float32 layout's own rounding, not the sum of two layers'.
    Returns the output (B, Nq, D) and the weights (B, H, Nq, Nk), float64.
    """
    model_size = layer.w_q.out_features
    key_size, value_size = layer.w_k.in_features, layer.w_v.in_features
    linears = (layer.w_q, layer.w_k, layer.w_v, layer.w_o)
    biased = any(linear.bias is not None for linear in linears)  # Qwen2-like: W_q, W_k, W_v biased, W_o not
    reference = torch.nn.MultiheadAttention(
        model_size, num_heads, bias=biased, kdim=key_size, vdim=value_size, batch_first=True,
    ).to(layer.w_q.weight.device, torch.float64).eval()
    with torch.no_grad():
        if reference.in_proj_weight is not None:  # one (3D, D) for W_q, W_k, W_v; else one weight each
            reference.in_proj_weight.copy_(torch.cat([layer.w_q.weight, layer.w_k.weight, layer.w_v.weight]))  # (3D, D)
        else:
            for name, linear in (("q", layer.w_q), ("k", layer.w_k), ("v", layer.w_v)):
                getattr(reference, f"{name}_proj_weight").copy_(linear.weight)
        if biased:
            q_bias, k_bias, v_bias, o_bias = (matrix_and_bias(linear)[1] for linear in linears)  # zeros where none
            reference.in_proj_bias.copy_(torch.cat([q_bias, k_bias, v_bias]))  # (3D,)
            reference.out_proj.bias.copy_(o_bias)
        reference.out_proj.weight.copy_(layer.w_o.weight)
    num_queries, num_keys = inputs.queries.shape[1], inputs.keys_values.shape[1]
    device = inputs.queries.device
    padding = None  # (B, Nk): True where the key is padding, torch's convention
    if inputs.valid_lens is not None:
        padding = torch.arange(num_keys, device=device)[None, :] >= inputs.valid_lens.to(device)[:, None]
    future = None  # (Nq, Nk): True where the key comes after the query
    if inputs.causal:
        future = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).triu(1)
    with torch.inference_mode():
        queries, keys_values = inputs.queries.double(), inputs.keys_values.double()
        return reference(
            queries, keys_values, keys_values, key_padding_mask=padding, attn_mask=future,
            need_weights=True, average_attn_weights=False,
        )


def complex_rotation(x: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0) -> torch.Tensor:
    """RoPE on (B, H, N, d) as complex numbers: pair (x_i, x_i+d/2) is x_i + i·x_i+d/2, times e^(i·n·θ_i).

    Independent of attention/layer.py's rotate: torch.polar and complex multiplication, in float64.
    """
    half = x.shape[-1] // 2
    positions = torch.arange(x.shape[2], dtype=torch.float64, device=x.device)  # (N,)
    angles = positions[:, None] * inv_freq.double().to(x.device)[None, :]  # (N, d/2)
    turns = torch.polar(torch.full_like(angles, scaling), angles)  # (N, d/2), complex128
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double()) * turns  # (B, H, N, d/2)
    return torch.cat([pairs.real, pairs.imag], dim=-1).to(x.dtype)  # (B, H, N, d)


def sdpa_heads(layer: MultiHeadAttention, inputs: LayerInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, Nq, d), k and v (B, H_kv, Nk, d) from torch's F.linear, F.rms_norm and complex_rotation."""
    d = layer.head_dim

    def heads(x: torch.Tensor, linear: torch.nn.Linear, count: int) -> torch.Tensor:
        return F.linear(x, linear.weight, linear.bias).unflatten(-1, (count, d)).transpose(1, 2)  # (B, count, N, d)

    q = heads(inputs.queries, layer.w_q, layer.num_heads)
    k = heads(inputs.keys_values, layer.w_k, layer.num_kv_heads)
    v = heads(inputs.keys_values, layer.w_v, layer.num_kv_heads)
    if layer.q_norm is not None:
        q = F.rms_norm(q, (d,), layer.q_norm.weight, layer.q_norm.eps)
        k = F.rms_norm(k, (d,), layer.k_norm.weight, layer.k_norm.eps)
    if layer.rotary_inv_freq is not None:
        q = complex_rotation(q, layer.rotary_inv_freq, layer.rotary_scaling)
        k = complex_rotation(k, layer.rotary_inv_freq, layer.rotary_scaling)
    return q, k, v


def sdpa_reference(layer: MultiHeadAttention, inputs: LayerInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """For what nn.MultiheadAttention cannot do (grouped-query attention, RoPE, q/k norms, another
    scale, a position bias): F.scaled_dot_product_attention with enable_gqa, on q and k turned by
    complex_rotation; the weights from a softmax of scores computed here, each query head reading
    its key head by index. Returns the output (B, Nq, D) and the weights (B, H, Nq, Nk).
    """
    with torch.inference_mode():
        q, k, v = sdpa_heads(layer, inputs)
    num_queries, num_keys = q.shape[2], k.shape[2]
    device = q.device
    additive = torch.zeros(1, 1, num_queries, num_keys, device=device)  # (B or 1, 1, Nq, Nk): 0 or -inf
    if inputs.valid_lens is not None:
        padding = torch.arange(num_keys, device=device)[None, :] >= inputs.valid_lens.to(device)[:, None]  # (B, Nk)
        additive = additive.masked_fill(padding[:, None, None, :], float("-inf"))
    if inputs.causal:
        future = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).triu(1)  # (Nq, Nk)
        additive = additive.masked_fill(future, float("-inf"))
    if inputs.position_bias is not None:
        additive = additive + inputs.position_bias.to(device, additive.dtype)  # (B or 1, H, Nq, Nk)
    with torch.inference_mode():
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=layer.scale, enable_gqa=True)  # (B, H, Nq, d)
        key_head = torch.arange(layer.num_heads, device=device) // layer.group_size  # (H,): query head h reads h // G
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k[:, key_head]) * layer.scale + additive  # (B, H, Nq, Nk)
        output = F.linear(z.transpose(1, 2).flatten(2), layer.w_o.weight, layer.w_o.bias)  # (B, Nq, D)
        return output, scores.softmax(dim=-1)


def sdpa_name(layer: MultiHeadAttention) -> str:
    name = f"F.scaled_dot_product_attention, {layer.num_heads} heads"
    if layer.group_size > 1:
        name += f" on {layer.num_kv_heads} key/value heads"
    return name + (", RoPE as complex rotation" if layer.rotary_inv_freq is not None else "")


def check_layouts(layer: MultiHeadAttention, inputs: LayerInputs, traces: list[LayoutTrace]) -> list[Check]:
    """attnviz's layer and each layout against torch.nn.MultiheadAttention with the same weights
    and number of heads (1 for single-head): a reference that shares no code with attnviz. A layer
    beyond the tutorials' (beyond_tutorials) is checked against sdpa_reference instead."""
    references = {}

    def reference_for(num_heads: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        if beyond_tutorials(layer, inputs):
            if "sdpa" not in references:
                references["sdpa"] = sdpa_reference(layer, inputs)
            output, weights = references["sdpa"]
            return sdpa_name(layer), weights, output
        if num_heads not in references:
            references[num_heads] = torch_reference(layer, inputs, num_heads)
        output, weights = references[num_heads]
        return f"nn.MultiheadAttention, {num_heads} head{'s' if num_heads > 1 else ''}", weights, output

    with torch.inference_mode():
        output, weights = layer(
            inputs.queries, inputs.keys_values, inputs.keys_values, valid_lens=inputs.valid_lens, causal=inputs.causal,
            position_bias=inputs.position_bias,
        )  # (B, Nq, D), (B, H, Nq, Nk)
    runs = [(LAYER_NAME, layer.num_heads, weights, output)]
    runs += [(trace.layout, trace.num_heads, trace.weights, trace.output) for trace in traces if trace.mistake is None]
    checks = []
    for name, num_heads, weights, output in runs:
        reference_name, reference_weights, reference_output = reference_for(num_heads)
        checks.append(
            Check(
                layout=name,
                reference=reference_name,
                weights_diff=max_abs_diff(weights, reference_weights),
                output_diff=max_abs_diff(output, reference_output),
                num_heads=num_heads,
            )
        )
    return checks


def matrix_and_bias(linear: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """W (in, out) and b (out,) with linear(x) == x @ W + b; b is zeros for a Linear without bias."""
    bias = linear.bias if linear.bias is not None else torch.zeros_like(linear.weight[:, 0])
    return linear.weight.T, bias


@dataclass
class HeadSlice:
    """Head h uses columns start..stop-1 of W_q, and kv_start..kv_stop-1 of W_k and W_v (x @ W; rows of
    nn.Linear.weight): those of key/value head kv_head = h // G, the same as W_q's without grouped-query attention."""

    head: int
    start: int
    stop: int
    scores_diff: float  # max |Q_h K_h^T * scale - the layer's scores for head h|
    z_diff: float  # max |A_h V_h - the layer's z for head h|
    scores_scale: float  # max |scores| of head h: float32 rounding grows with it
    kv_head: int = 0
    kv_start: int = 0
    kv_stop: int = 0

    @property
    def agree(self) -> bool:
        """Equal up to float32 rounding: trained scores reach 70 and more, where 1e-5 is a few ulps."""
        return self.scores_diff <= TOLERANCE * max(1.0, self.scores_scale) and self.z_diff <= TOLERANCE


def head_slices(layer: MultiHeadAttention, inputs: LayerInputs, trace: LayoutTrace) -> list[HeadSlice]:
    """Recompute each head from its slices of the weights alone and compare with the trace.

    With grouped-query attention, query head h takes key/value head h // G's slices of W_k and
    W_v; q/k norms and RoPE are applied to the head's slices as sdpa_heads applies them.
    """
    scores, pattern, z = (trace.tensors[role].float().cpu() for role in ("scores", "pattern", "z"))  # (B, H, ...)
    queries, keys_values = inputs.queries.float().cpu(), inputs.keys_values.float().cpu()
    d = trace.head_dim
    own_heads = trace.num_heads == layer.num_heads
    group = layer.group_size if own_heads else 1
    scale = layer.scale if own_heads else 1 / math.sqrt(d)
    slices = []
    with torch.inference_mode():
        (W_q, b_q), (W_k, b_k), (W_v, b_v) = (
            (matrix.float().cpu(), bias.float().cpu())
            for matrix, bias in map(matrix_and_bias, (layer.w_q, layer.w_k, layer.w_v))
        )  # (D, H*d), (D, H_kv*d) and their biases: x @ W + b
        for head in range(trace.num_heads):
            kv_head = head // group
            columns, kv_columns = slice(head * d, (head + 1) * d), slice(kv_head * d, (kv_head + 1) * d)
            q_h = queries @ W_q[:, columns] + b_q[columns]  # (B, Nq, d)
            k_h = keys_values @ W_k[:, kv_columns] + b_k[kv_columns]  # (B, Nk, d)
            v_h = keys_values @ W_v[:, kv_columns] + b_v[kv_columns]  # (B, Nk, d)
            if own_heads:
                q_h, k_h = positioned(layer, q_h, k_h)
            scores_h = q_h @ k_h.transpose(-2, -1) * scale  # (B, Nq, Nk)
            z_h = pattern[:, head] @ v_h  # (B, Nq, d)
            slices.append(
                HeadSlice(
                    head=head,
                    start=columns.start,
                    stop=columns.stop,
                    scores_diff=max_abs_diff(scores_h, scores[:, head]),
                    z_diff=max_abs_diff(z_h, z[:, head]),
                    scores_scale=float(scores[:, head].abs().max()),
                    kv_head=kv_head,
                    kv_start=kv_columns.start,
                    kv_stop=kv_columns.stop,
                )
            )
    return slices


def positioned(layer: MultiHeadAttention, q_h: torch.Tensor, k_h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's q (B, Nq, d) and k (B, Nk, d) after the layer's q/k norms and RoPE, if it has them."""
    d = q_h.shape[-1]
    if layer.q_norm is not None:
        q_h = F.rms_norm(q_h, (d,), layer.q_norm.weight.float().cpu(), layer.q_norm.eps)
        k_h = F.rms_norm(k_h, (d,), layer.k_norm.weight.float().cpu(), layer.k_norm.eps)
    if layer.rotary_inv_freq is not None:
        inv_freq = layer.rotary_inv_freq.cpu()
        q_h = complex_rotation(q_h[:, None], inv_freq, layer.rotary_scaling)[:, 0]
        k_h = complex_rotation(k_h[:, None], inv_freq, layer.rotary_scaling)[:, 0]
    return q_h, k_h


def check_seed_head(head, inputs: LayerInputs, trace: LayoutTrace) -> Check:
    """Seed 001's single head (layout_single_head.SeedHead) against F.scaled_dot_product_attention in float64.

    nn.MultiheadAttention cannot hold W_v's own d_out; SDPA takes values of another width. Its weights
    are SDPA over the identity as values (softmax(Q K^T s) I = A), so no line of the layout is reused.
    Each text alone, its padding keys cut off, as the tutorial's unbatched sequence.
    """
    batch, num_queries, _ = inputs.queries.shape
    num_keys = inputs.keys_values.shape[1]
    valid = inputs.valid_lens.tolist() if inputs.valid_lens is not None else [num_keys] * batch
    weights, outputs = [], []
    with torch.inference_mode():
        for b in range(batch):
            x, x_kv = inputs.queries[b].double(), inputs.keys_values[b, : valid[b]].double()  # (Nq, D), (Nk, D)
            q, k = x @ head.w_q.weight.double().T, x_kv @ head.w_k.weight.double().T  # (Nq, d_q), (Nk, d_q)
            v = x_kv @ head.w_v.weight.double().T  # (Nk, d_out)
            mask = torch.ones(num_queries, valid[b], dtype=torch.bool, device=x.device).tril() if inputs.causal else None
            identity = torch.eye(valid[b], dtype=torch.float64, device=x.device)  # (Nk, Nk)
            pattern = F.scaled_dot_product_attention(q, k, identity, attn_mask=mask, scale=head.scale)  # (Nq, Nk)
            weights.append(F.pad(pattern, (0, num_keys - valid[b])))  # (Nq, Nk): cut keys weigh 0
            outputs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=head.scale))  # (Nq, d_out)
    return Check(
        layout=trace.layout,
        reference="F.scaled_dot_product_attention, 1 head",
        weights_diff=max_abs_diff(trace.weights, torch.stack(weights)[:, None]),  # (B, 1, Nq, Nk)
        output_diff=max_abs_diff(trace.output, torch.stack(outputs)),  # (B, Nq, d_out)
        num_heads=1,
    )

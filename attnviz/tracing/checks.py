"""Is every layout right? Each against torch's own layer, and each head against its slice of the weights."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnviz.attention.layer import MultiHeadAttention
from attnviz.tracing.recorder import LayerInputs, LayoutTrace

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
    return float((a.float().cpu() - b.float().cpu()).abs().max())


def torch_reference(layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.MultiheadAttention loaded with the layer's W_q, W_k, W_v, W_o, split into num_heads heads.

    Independent of attention/layer.py: torch's own projections, head split, masks and softmax.
    Returns the output (B, Nq, D) and the weights (B, H, Nq, Nk).
    """
    model_size = layer.w_q.out_features
    key_size, value_size = layer.w_k.in_features, layer.w_v.in_features
    reference = torch.nn.MultiheadAttention(
        model_size, num_heads, bias=layer.w_q.bias is not None, kdim=key_size, vdim=value_size, batch_first=True,
    ).to(layer.w_q.weight.device, layer.w_q.weight.dtype).eval()
    with torch.no_grad():
        if reference._qkv_same_embed_dim:
            reference.in_proj_weight.copy_(torch.cat([layer.w_q.weight, layer.w_k.weight, layer.w_v.weight]))  # (3D, D)
        else:
            for name, linear in (("q", layer.w_q), ("k", layer.w_k), ("v", layer.w_v)):
                getattr(reference, f"{name}_proj_weight").copy_(linear.weight)
        if layer.w_q.bias is not None:
            reference.in_proj_bias.copy_(torch.cat([layer.w_q.bias, layer.w_k.bias, layer.w_v.bias]))  # (3D,)
            reference.out_proj.bias.copy_(layer.w_o.bias)
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
        return reference(
            inputs.queries, inputs.keys_values, inputs.keys_values, key_padding_mask=padding, attn_mask=future,
            need_weights=True, average_attn_weights=False,
        )


def check_layouts(layer: MultiHeadAttention, inputs: LayerInputs, traces: list[LayoutTrace]) -> list[Check]:
    """attnviz's layer and each layout against torch.nn.MultiheadAttention with the same weights
    and number of heads (1 for single-head): a reference that shares no code with attnviz."""
    references = {}

    def reference_for(num_heads: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        if num_heads not in references:
            references[num_heads] = torch_reference(layer, inputs, num_heads)
        output, weights = references[num_heads]
        return f"nn.MultiheadAttention, {num_heads} head{'s' if num_heads > 1 else ''}", weights, output

    with torch.inference_mode():
        output, weights = layer(
            inputs.queries, inputs.keys_values, inputs.keys_values, valid_lens=inputs.valid_lens, causal=inputs.causal
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
    """Head h uses columns start..stop-1 of W_q, W_k and W_v (x @ W; rows of nn.Linear.weight)."""

    head: int
    start: int
    stop: int
    scores_diff: float  # max |Q_h K_h^T / sqrt(d) - the layer's scores for head h|
    z_diff: float  # max |A_h V_h - the layer's z for head h|
    scores_scale: float  # max |scores| of head h: float32 rounding grows with it

    @property
    def agree(self) -> bool:
        """Equal up to float32 rounding: trained scores reach 70 and more, where 1e-5 is a few ulps."""
        return self.scores_diff <= TOLERANCE * max(1.0, self.scores_scale) and self.z_diff <= TOLERANCE


def head_slices(layer: MultiHeadAttention, inputs: LayerInputs, trace: LayoutTrace) -> list[HeadSlice]:
    """Recompute each head from its slices of the weights alone and compare with the trace."""
    scores, pattern, z = (trace.tensors[role].float().cpu() for role in ("scores", "pattern", "z"))  # (B, H, ...)
    queries, keys_values = inputs.queries.float().cpu(), inputs.keys_values.float().cpu()
    d = trace.head_dim
    slices = []
    with torch.inference_mode():
        (W_q, b_q), (W_k, b_k), (W_v, b_v) = (
            (matrix.float().cpu(), bias.float().cpu())
            for matrix, bias in map(matrix_and_bias, (layer.w_q, layer.w_k, layer.w_v))
        )  # (D, D) and (D,): x @ W + b
        for head in range(trace.num_heads):
            columns = slice(head * d, (head + 1) * d)
            q_h = queries @ W_q[:, columns] + b_q[columns]  # (B, Nq, d)
            k_h = keys_values @ W_k[:, columns] + b_k[columns]  # (B, Nk, d)
            v_h = keys_values @ W_v[:, columns] + b_v[columns]  # (B, Nk, d)
            scores_h = q_h @ k_h.transpose(-2, -1) / math.sqrt(d)  # (B, Nq, Nk)
            z_h = pattern[:, head] @ v_h  # (B, Nq, d)
            slices.append(
                HeadSlice(
                    head=head,
                    start=columns.start,
                    stop=columns.stop,
                    scores_diff=max_abs_diff(scores_h, scores[:, head]),
                    z_diff=max_abs_diff(z_h, z[:, head]),
                    scores_scale=float(scores[:, head].abs().max()),
                )
            )
    return slices

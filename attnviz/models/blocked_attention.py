"""The capture pass's attention: transformers' model run up to the chosen layer without ever making a whole map.

A capture pass runs transformers' model up to the chosen layer. Past a size it cannot run eager
attention (every layer would make its (H, N, N) maps), and on CUDA, SDPA in float32 over grouped-query
heads has no fused kernel and falls back to one that makes the maps too (32 heads at 32,768 tokens
asked for 128 GiB). This function, registered with transformers' public AttentionInterface, gives
each layer's attention output as eager's within float rounding, in bounded memory:
- a text whose scores fit one block (BLOCK_BYTES), or one with padding or T5's position bias: a block of
  queries at a time, each row's softmax over its whole row, eager's very operations (as attnviz's own
  layer, attention/layer.py), so that a short text's numbers are eager's;
- a longer text with no mask to apply but a causal one (one text, no padding: transformers leaves the
  mask out): torch's scaled_dot_product_attention over the key/value heads repeated for their query heads,
  whose fused kernels (flash on the CPU, memory-efficient on CUDA) never make the maps and skip the future
  (a third of the blocks' time; eager's output within float rounding).
"""

from __future__ import annotations

import torch

from attnviz.attention.layer import allowed_keys, repeat_kv, rows_per_block

NAME = "attnviz_blocks"
# A block's scores and weights: on the CPU within the map size past which attnviz itself computes in blocks
# (budgets.LARGE_MAP_BYTES); on a GPU larger, fewer blocks (a capture's forward pass is short-lived).
BLOCK_BYTES = {"cpu": 64 * 2**20}
DEVICE_BLOCK_BYTES = 2**30


def blocked_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, position_bias=None, block_bytes=None,
    attnviz_in_place=None, **kwargs,
):
    """transformers' attention function: query (B, H, Nq, d), key and value (B, H_kv, Nk, d); the output (B, Nq, H, d).

    attnviz_in_place, when the forward pass is given it (TransformersModel.in_place_pass): attnviz's own layer stands
    in for the attention, attnviz_in_place() its output over what entered the module (the model's query, key and value
    are not read).

    attention_mask: transformers' boolean mask (True: may attend) or additive float mask, (B, 1, Nq, Nk); None
    for a module that attends to every key, or causally (module.is_causal). position_bias: T5's, added to the scores.
    block_bytes: a block's scores and weights (default: BLOCK_BYTES of the device); past one block, a text without
    a mask or a position bias goes to SDPA. No dropout: eval mode only.
    """
    if attnviz_in_place is not None:
        return attnviz_in_place(), None
    key, value = repeat_kv(key, query.shape[1] // key.shape[1]), repeat_kv(value, query.shape[1] // value.shape[1])
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    batch, heads, num_queries, _ = query.shape
    num_keys = key.shape[2]
    # As transformers' own SDPA attention: no mask, several queries and a module not said to be bidirectional is causal.
    causal = attention_mask is None and num_queries > 1 and getattr(module, "is_causal", True)
    budget = block_bytes or BLOCK_BYTES.get(query.device.type, DEVICE_BLOCK_BYTES)
    rows = rows_per_block(budget, batch, heads, num_keys, query.element_size())
    if rows < num_queries and attention_mask is None and position_bias is None:
        output = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling)
        return output.transpose(1, 2).contiguous(), None  # (B, Nq, H, d)
    lowest = torch.finfo(query.dtype).min  # as eager's masks: a row with no key left is uniform, not NaN
    output = torch.empty_like(query)  # (B, H, Nq, d)
    for start in range(0, num_queries, rows):
        stop = min(start + rows, num_queries)
        scores = query[:, :, start:stop] @ key.transpose(-2, -1) * scaling  # (B, H, b, Nk)
        if position_bias is not None:
            scores += position_bias[:, :, start:stop]
        if attention_mask is not None:
            mask = attention_mask[:, :, start:stop, :num_keys]
            scores = scores.masked_fill(~mask, lowest) if mask.dtype == torch.bool else scores + mask
        elif causal:
            allowed = allowed_keys(stop - start, num_keys, causal=True, device=scores.device, first_query=start + num_keys - num_queries)
            scores.masked_fill_(~allowed, lowest)
        output[:, :, start:stop] = scores.softmax(dim=-1, dtype=torch.float32).to(value.dtype) @ value  # as eager
    return output.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function and its mask with transformers (once is enough; again changes nothing); returns its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, blocked_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # None where SDPA's is_causal (or no mask) says it all
    return NAME

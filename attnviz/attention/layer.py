"""attnviz's own multi-head attention layer, written from the shapes up.

Axis names used in shape comments: B batch, Nq query tokens, Nk key tokens,
D model size, H heads, d = D / H head size. Head h owns columns h*d .. (h+1)*d - 1
of the projected queries, keys and values.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnviz.errors import AttnvizError


def valid_head_counts(model_size: int) -> list[int]:
    """The numbers of heads that split a model of this size evenly."""
    return [h for h in range(1, model_size + 1) if model_size % h == 0]


def check_num_heads(model_size: int, num_heads: int) -> None:
    """Refuse a head count that does not split the model size evenly, 0 and negative ones too."""
    choices = ", ".join(map(str, valid_head_counts(model_size)))
    if num_heads < 1:
        raise AttnvizError(
            f"--heads {num_heads}: a layer needs at least one head; choose a count that divides "
            f"the model size {model_size}: {choices}"
        )
    if model_size % num_heads:
        raise AttnvizError(
            f"{num_heads} heads do not divide the model size {model_size}; choose one of: {choices}"
        )


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """b n (h d) -> b h n d: give every head its own slice of the features."""
    batch, tokens, model_size = x.shape
    x = x.view(batch, tokens, num_heads, model_size // num_heads)  # (B, N, H, d)
    return x.permute(0, 2, 1, 3)  # (B, H, N, d)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """b h n d -> b n (h d): the inverse of split_heads."""
    batch, num_heads, tokens, head_dim = x.shape
    x = x.permute(0, 2, 1, 3).contiguous()  # (B, N, H, d): view needs contiguous memory
    return x.view(batch, tokens, num_heads * head_dim)  # (B, N, D)


def allowed_keys(
    num_queries: int,
    num_keys: int,
    valid_lens: torch.Tensor | None = None,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """Which (query, key) pairs may attend: True where allowed, None when all are.

    valid_lens (B,) masks the padding keys of each sequence; causal masks keys
    after the query. The result broadcasts over heads: (B or 1, 1, Nq or 1, Nk).
    """
    allowed = None
    if valid_lens is not None:
        key_positions = torch.arange(num_keys, device=device)  # (Nk,)
        allowed = key_positions[None, :] < valid_lens.to(device)[:, None]  # (B, Nk)
        allowed = allowed[:, None, None, :]  # (B, 1, 1, Nk)
    if causal:
        lower = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril()
        lower = lower[None, None]  # (1, 1, Nq, Nk)
        allowed = lower if allowed is None else allowed & lower
    return allowed


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project, split into heads, attend, merge, project.

    query_size, key_size and value_size default to model_size; they may differ
    (cross-attention between sequences of other widths, as in d2l.ai).
    """

    def __init__(
        self,
        model_size: int,
        num_heads: int,
        *,
        query_size: int | None = None,
        key_size: int | None = None,
        value_size: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        check_num_heads(model_size, num_heads)
        self.num_heads = num_heads
        self.head_dim = model_size // num_heads
        self.w_q = nn.Linear(query_size or model_size, model_size, bias=bias)
        self.w_k = nn.Linear(key_size or model_size, model_size, bias=bias)
        self.w_v = nn.Linear(value_size or model_size, model_size, bias=bias)
        self.w_o = nn.Linear(model_size, model_size, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        *,
        valid_lens: torch.Tensor | None = None,
        causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the output (B, Nq, D) and the attention weights (B, H, Nq, Nk).

        keys and values default to queries (self-attention); valid_lens (B,)
        counts the real keys of each sequence, the rest is padding.
        """
        keys = queries if keys is None else keys
        values = keys if values is None else values
        q = split_heads(self.w_q(queries), self.num_heads)  # (B, H, Nq, d)
        k = split_heads(self.w_k(keys), self.num_heads)  # (B, H, Nk, d)
        v = split_heads(self.w_v(values), self.num_heads)  # (B, H, Nk, d)

        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Nq, Nk)
        allowed = allowed_keys(q.shape[2], k.shape[2], valid_lens, causal, scores.device)
        if allowed is not None:
            # -inf gives masked keys exactly zero weight; every row keeps at least key 0.
            scores.masked_fill_(~allowed, float("-inf"))  # in place: scores is ours, and may be large
        pattern = scores.softmax(dim=-1)  # (B, H, Nq, Nk)

        z = self.dropout(pattern) @ v  # (B, H, Nq, d)
        out = self.w_o(merge_heads(z))  # (B, Nq, D)
        return out, pattern

"""The two reshape mistakes of the view-permute layout, and where each puts the numbers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.tracing.checks import max_abs_diff
from attnviz.tracing.recorder import LayoutTrace

MISTAKES = ("view-without-permute", "merge-without-permute")

WRONG_SPLIT_NOTE = (
    "mistake: view keeps memory order, so row n of 'head' h is slice (h*N + n) % H of token (h*N + n) // H "
    "(slice k: columns k*d..(k+1)*d-1), not slice h of token n; right: .view(B, N, H, d).permute(0, 2, 1, 3)"
)
WRONG_MERGE_NOTE = (
    "mistake: z is (B, H, N, d) in memory, so view puts other tokens' head outputs into "
    "token n's row; right: .permute(0, 2, 1, 3).contiguous().view(B, N, D)"
)


@dataclass
class MistakeResult:
    """How far a mistaken run lands from the right one, and which steps went wrong."""

    mistake: str
    wrong_steps: list[str]
    weights_diff: float
    output_diff: float


def compare_mistake(right: LayoutTrace, wrong: LayoutTrace) -> MistakeResult:
    return MistakeResult(
        mistake=wrong.mistake,
        wrong_steps=[step.role for step in wrong.steps if step.mistake],
        weights_diff=max_abs_diff(wrong.weights, right.weights),
        output_diff=max_abs_diff(wrong.output, right.output),
    )


def split_provenance(num_heads: int, num_tokens: int, head_dim: int, mistake: str | None = None) -> torch.Tensor:
    """What each row of each head holds after the split: (H, N, 2) of (token, slice).

    Slice k of a token is its columns k*d..(k+1)*d-1. Computed by splitting a projection whose
    every (token, slice) holds its own label, with the same code as the layout.
    """
    labels = torch.arange(num_tokens * num_heads, dtype=torch.float32).view(1, num_tokens, num_heads, 1)
    projected = labels.expand(1, num_tokens, num_heads, head_dim).reshape(1, num_tokens, num_heads * head_dim)
    if mistake == "view-without-permute":  # (1, N, D): column k*d + j of token t holds t*H + k
        heads = projected.view(1, num_heads, num_tokens, head_dim)  # (1, H, N, d)
    else:
        heads = projected.view(1, num_tokens, num_heads, head_dim).permute(0, 2, 1, 3)  # (1, H, N, d)
    rows = heads[0, :, :, 0].long()  # (H, N): the label at each row's first column
    return torch.stack([rows // num_heads, rows % num_heads], dim=-1)  # (H, N, 2)


def merge_provenance(num_heads: int, num_tokens: int, head_dim: int, mistake: str | None = None) -> torch.Tensor:
    """Where each slot of a merged row comes from: (N, H, 2) of (head, token).

    Row n, slot j is columns j*d..(j+1)*d-1 of token n's merged output. Computed by merging
    a z whose every (head, token) row holds its own label, with the same code as the layout.
    """
    labels = torch.arange(num_heads * num_tokens, dtype=torch.float32).view(1, num_heads, num_tokens, 1)
    z = labels.expand(1, num_heads, num_tokens, head_dim).contiguous()  # (1, H, N, d): z[0, h, n] = h*N + n
    if mistake == "merge-without-permute":
        merged = z.view(1, num_tokens, num_heads * head_dim)  # (1, N, D)
    else:
        merged = z.permute(0, 2, 1, 3).contiguous().view(1, num_tokens, num_heads * head_dim)  # (1, N, D)
    slots = merged[0, :, ::head_dim].long()  # (N, H): the label at each slot's first column
    return torch.stack([slots // num_tokens, slots % num_tokens], dim=-1)  # (N, H, 2)

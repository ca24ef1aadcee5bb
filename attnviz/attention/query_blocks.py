"""A long text's attention a block of queries at a time: the blocks, their narrowing and their scratch buffer.

MultiHeadAttention.blocks projects the text once and runs each block through the layer's own forward
(a QueryBlock in place of the queries, keys and values), so the math is forward's and nothing else; step,
the key/value cache's path of generate, passes its new tokens the same way. What a long text needs
beyond the math lives here: under a causal mask a block's queries see no key past their last one, so
its keys stop there; and every block's scores go into one buffer, which a new tensor of that size would
cost its page faults again. So may its weights (reuse, for a caller that reads each block's weights before it takes
the next): the softmax then runs in place in that buffer (float32 scores), or in one float32 buffer of the blocks'
(scores in a half dtype).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class QueryBlock:
    """Queries whose heads are projected already, and the keys and values they attend to.

    first: the position of the first query among the keys' (a block of a long text's queries, or the
    tokens that follow a key/value cache); q (B, H, b, d), k and v (B, H, K, d). scratch: a buffer for
    the scores (B, H, b, K), None for a new tensor; weights_room: the buffer the weights go into (softmax: scratch
    itself for float32 scores, a float32 one for others), None for a new tensor. outputs=False leaves out the
    weighted sum of the values and W_o (the weights alone are wanted); outputs="heads" leaves out W_o alone: each
    head's output, unmerged, is what the layer gives (a model's own W_o follows: passes.blocks_in_place).
    """

    first: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scratch: torch.Tensor | None = None
    outputs: bool | str = True  # True, False or "heads"
    weights_room: torch.Tensor | None = None

    @property
    def stop(self) -> int:
        """One past the block's last query."""
        return self.first + self.q.shape[2]

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """forward's softmax of scores in weights_room: each row's over its keys, in float32 whatever the scores' dtype,
        as eager attention's, in place in the scores' buffer (float32) or copied into weights_room and in place there.
        torch's own softmax from a half dtype makes that float32 copy a new tensor, and its output another, each block:
        with their page faults (a layer's weights at a time, blocks of 4 MB or more come straight from the system), a
        Llama-1B-shaped layer's blocks at 2,048 tokens in bfloat16 took 0.74 s, against 0.45 s so (bench/RESULTS.md,
        session 29). The same kernel on the same floats: the same bits."""
        weights = scores if scores.dtype == torch.float32 else self.weights_room.copy_(scores)
        return torch.softmax(weights, dim=-1, out=weights)


def query_blocks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int | None, causal: bool, outputs: bool | str = True,
    reuse: bool = False,
) -> Iterator[QueryBlock]:
    """q (B, H, Nq, d), k and v (B, H, Nk, d) in blocks of `rows` queries (all of them when None).

    Under a causal mask a block's keys stop at its last query (K = its last query + 1, or Nk when
    smaller): the keys past it would get weight 0. The blocks' scores share one buffer, and with reuse their weights
    too (QueryBlock.softmax), unless autograd needs each kept.
    """
    batch, num_heads, num_queries, _ = q.shape
    num_keys = k.shape[2]
    rows = rows or num_queries
    room = None if torch.is_grad_enabled() else q.new_empty(batch * num_heads * min(rows, num_queries) * num_keys)
    reuse = reuse and room is not None
    weights_room = (room if q.dtype == torch.float32 else torch.empty_like(room, dtype=torch.float32)) if reuse else None
    for start in range(0, num_queries, rows):
        stop = min(start + rows, num_queries)
        seen = min(stop, num_keys) if causal else num_keys  # the keys the block's queries may see
        shape = (batch, num_heads, stop - start, seen)
        scratch, weights = (None if each is None else each[: math.prod(shape)].view(shape) for each in (room, weights_room))
        yield QueryBlock(start, q[:, :, start:stop], k[:, :, :seen], v[:, :, :seen], scratch, outputs, weights)


def widen(pattern: torch.Tensor, num_keys: int) -> torch.Tensor:
    """A causal block's weights (B, H, b, K) with the keys past K added back as their zeros: (B, H, b, Nk)."""
    if pattern.shape[-1] == num_keys:
        return pattern
    return torch.nn.functional.pad(pattern, (0, num_keys - pattern.shape[-1]))  # (B, H, b, Nk)

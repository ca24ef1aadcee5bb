"""attnviz's own multi-head attention layer, written from the shapes up.

Axis names used in shape comments: B batch, Nq query tokens, Nk key tokens,
D model size, H heads, d head size (D / H unless a model sets it apart), H_kv key/value
heads (H unless the model shares them: grouped-query attention). Head h owns columns
h*d .. (h+1)*d - 1 of the projected queries; with grouped-query attention, query heads
h*G .. (h+1)*G - 1 (G = H / H_kv) share key/value head h.

Beyond the tutorials' layer, the same layer runs current models with their own
projections: key/value heads shared by groups of query heads (Llama, Mistral, Qwen),
rotary position embeddings applied to q and k (RoPE), RMSNorm over each head's q and k
(Qwen3), another scale than 1/sqrt(d) (T5: none), and an additive position bias (T5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from attnviz.attention.query_blocks import QueryBlock, query_blocks, widen
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


def repeat_kv(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """b h_kv n d -> b (h_kv g) n d: each key/value head repeated for the g query heads that share it."""
    return x if group_size == 1 else x.repeat_interleave(group_size, dim=1)  # (B, H, N, d)


def rotary_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """RoPE's angle per position for each pair of features: theta^(-2i/d), i = 0 .. d/2 - 1, (d/2,)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def rotary_tables(num_tokens: int, inv_freq: torch.Tensor, scaling: float = 1.0, first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angle position * frequency for positions first .. first + N - 1, each (N, d): the d/2
    angles written twice (a step of generation needs its own positions' alone, not the cache's too).

    Feature i and feature i + d/2 form a pair, rotated by the same angle (the half-split layout
    of transformers' Llama; scaling is a rope type's attention factor, 1 for the default).
    """
    positions = torch.arange(first, first + num_tokens, dtype=torch.float64, device=inv_freq.device)
    angles = torch.outer(positions, inv_freq.double())  # (N, d/2)
    angles = torch.cat([angles, angles], dim=-1)  # (N, d)
    return (angles.cos() * scaling).float(), (angles.sin() * scaling).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, H, N, d): each pair (x1, x2) of features becomes (x1 cos - x2 sin, x2 cos + x1 sin)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated_half = torch.cat([-x2, x1], dim=-1)  # (B, H, N, d)
    return x * cos + rotated_half * sin


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
    first_query: int = 0,
) -> torch.Tensor | None:
    """Which (query, key) pairs may attend: True where allowed, None when all are.

    valid_lens (B,) masks the padding keys of each sequence; causal masks keys
    after the query, for queries first_query .. first_query + num_queries - 1 (a block
    of a longer text's queries). The result broadcasts over heads: (B or 1, 1, Nq or 1, Nk).
    """
    allowed = None
    key_positions = torch.arange(num_keys, device=device)  # (Nk,)
    if valid_lens is not None:
        allowed = key_positions[None, :] < valid_lens.to(device)[:, None]  # (B, Nk)
        allowed = allowed[:, None, None, :]  # (B, 1, 1, Nk)
    if causal:
        query_positions = torch.arange(first_query, first_query + num_queries, device=device)  # (Nq,)
        lower = key_positions[None, :] <= query_positions[:, None]  # (Nq, Nk)
        lower = lower[None, None]  # (1, 1, Nq, Nk)
        allowed = lower if allowed is None else allowed & lower
    return allowed


def rows_per_block(budget_bytes: int, batch: int, num_heads: int, num_keys: int, element_size: int = 4) -> int:
    """How many queries a block of attention may hold: its scores and weights, (B, H, rows, Nk) each, within the budget."""
    return max(1, budget_bytes // (2 * batch * num_heads * num_keys * element_size))


class HeadNorm(nn.Module):
    """RMSNorm over each head's d features (Qwen3's q_norm and k_norm): x / rms(x) * weight."""

    def __init__(self, head_dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight  # (B, H, N, d)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project, split into heads, attend, merge, project.

    query_size, key_size and value_size default to model_size; they may differ
    (cross-attention between sequences of other widths, as in d2l.ai). The rest is for
    current models: num_kv_heads (grouped-query attention: H_kv key/value heads, each shared
    by H / H_kv query heads), head_dim (d, when a model sets it apart from D / H), scale
    (default 1/sqrt(d)), out_bias (default: bias), rotary_inv_freq (RoPE's frequencies, d/2:
    q and k are rotated by position) and q_norm / k_norm (HeadNorm, set after building).
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
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        scale: float | None = None,
        out_bias: bool | None = None,
        rotary_inv_freq: torch.Tensor | None = None,
        rotary_scaling: float = 1.0,
    ):
        super().__init__()
        if head_dim is None:
            check_num_heads(model_size, num_heads)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise AttnvizError(f"{self.num_kv_heads} key/value heads cannot be shared evenly by {num_heads} query heads")
        self.head_dim = head_dim or model_size // num_heads
        self.scale = 1 / math.sqrt(self.head_dim) if scale is None else scale
        inner, kv_inner = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.w_q = nn.Linear(query_size or model_size, inner, bias=bias)
        self.w_k = nn.Linear(key_size or model_size, kv_inner, bias=bias)
        self.w_v = nn.Linear(value_size or model_size, kv_inner, bias=bias)
        self.w_o = nn.Linear(inner, model_size, bias=bias if out_bias is None else out_bias)
        self.q_norm: HeadNorm | None = None
        self.k_norm: HeadNorm | None = None
        self.register_buffer("rotary_inv_freq", rotary_inv_freq, persistent=False)
        self.rotary_scaling = rotary_scaling
        self.fused_qkv_name: str | None = None  # the model's one fused W_q, W_k, W_v (GPT-2's c_attn), for traces
        self.dropout = nn.Dropout(dropout)

    @property
    def group_size(self) -> int:
        """G: the query heads that share one key/value head (1 without grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    def rotary(self, num_tokens: int, first: int = 0) -> tuple[torch.Tensor, torch.Tensor] | None:
        """RoPE's cos and sin tables (N, d) for positions first .. first + N - 1; None for a layer without RoPE."""
        if self.rotary_inv_freq is None:
            return None
        return rotary_tables(num_tokens, self.rotary_inv_freq, self.rotary_scaling, first)

    def project(
        self, queries: torch.Tensor, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, first: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, Nq, d), and k and v (B, H, Nk, d): projected, split into heads, normalised, rotated (RoPE),
        and each key/value head repeated for the query heads that share it. keys and values default to queries.
        first: the position of the first query and key (RoPE's angles), past a cache's tokens (step).

        k is stored as kᵀ (B, H, d, Nk): the scores' product q kᵀ then reads rows of contiguous keys, which the CPU's
        matrix product does up to 1.8 times as fast on a long text's blocks, to the same bits (bench/RESULTS.md,
        session 28); every run, whole or in blocks, multiplies the same layout."""
        keys = queries if keys is None else keys
        values = keys if values is None else values
        q = split_heads(self.w_q(queries), self.num_heads)  # (B, H, Nq, d)
        k = split_heads(self.w_k(keys), self.num_kv_heads)  # (B, H_kv, Nk, d)
        v = split_heads(self.w_v(values), self.num_kv_heads)  # (B, H_kv, Nk, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary_inv_freq is not None:
            cos, sin = (table.to(q.dtype) for table in self.rotary(max(q.shape[2], k.shape[2]), first))  # (N, d) each, as transformers casts them
            q = rotate(q, cos[: q.shape[2]], sin[: q.shape[2]])  # (B, H, Nq, d)
            k = rotate(k, cos[: k.shape[2]], sin[: k.shape[2]])  # (B, H_kv, Nk, d)
        k = repeat_kv(k, self.group_size).transpose(-2, -1).contiguous().transpose(-2, -1)  # (B, H, Nk, d), stored as kᵀ
        return q, k, repeat_kv(v, self.group_size)  # (B, H, Nk, d) each

    def forward(
        self,
        queries: torch.Tensor | None = None,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        *,
        valid_lens: torch.Tensor | None = None,
        causal: bool = False,
        position_bias: torch.Tensor | None = None,
        block: QueryBlock | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Returns the output (B, Nq, D) and the attention weights (B, H, Nq, Nk).

        keys and values default to queries (self-attention); valid_lens (B,) counts the real keys of each
        sequence, the rest is padding. position_bias (1 or B, H, Nq, Nk) is added to the scores (T5's
        relative position bias). block stands in for queries, keys and values whose heads blocks() or
        step() projected already (query_blocks.QueryBlock: its queries start at block.first).
        """
        block = block or QueryBlock(0, *self.project(queries, keys, values))  # project, split heads
        q, k, v = block.q, block.k, block.v  # (B, H, Nq, d); k and v (B, H, Nk, d)
        scores = torch.matmul(q, k.transpose(-2, -1), out=block.scratch)  # (B, H, Nq, Nk)
        scores.mul_(self.scale)
        if position_bias is not None:
            scores.add_(position_bias)
        if valid_lens is not None and bool((valid_lens >= k.shape[2]).all()):
            valid_lens = None  # no padding: nothing to mask but a causal block's future
        # Without padding, a causal block's keys before its first query are all allowed: only the rest is masked.
        unmasked = block.first if causal and valid_lens is None else 0
        allowed = allowed_keys(
            q.shape[2], k.shape[2] - unmasked, valid_lens, causal, q.device, first_query=block.first - unmasked
        )  # (B or 1, 1, Nq or 1, Nk - unmasked), or None: nothing to mask
        if allowed is not None:
            scores[..., unmasked:].masked_fill_(~allowed, float("-inf"))  # exactly zero weight; every row keeps key 0
        pattern = scores.softmax(dim=-1, dtype=torch.float32) if block.weights_room is None else block.softmax(scores)
        if not block.outputs:
            return None, pattern
        z = self.dropout(pattern).to(v.dtype) @ v  # (B, H, Nq, d): each query's weighted sum of the values
        if block.outputs == "heads":
            return z.transpose(1, 2), pattern  # (B, Nq, H, d): what enters W_o, the heads not yet merged
        return self.w_o(merge_heads(z)), pattern  # merge heads, W_o: (B, Nq, D)

    def blocks(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        *,
        valid_lens: torch.Tensor | None = None,
        causal: bool = False,
        position_bias: torch.Tensor | None = None,
        rows: int | None = None,
        narrow: bool = False,
        outputs: bool | str = True,
        reuse: bool = False,
    ) -> Iterator[tuple[int, torch.Tensor | None, torch.Tensor]]:
        """The layer a block of queries at a time: (first query, output (B, b, D), weights (B, H, b, Nk)) per block.

        The text is projected once; each block of `rows` queries (all of them when None; rows_per_block
        picks a count for a memory budget) runs through forward over every key: each row's softmax is
        over its whole row, so the blocks are the very rows forward returns, and no (H, Nq, Nk) tensor
        is made whole. position_bias as in forward. Under a causal mask a block's queries see no key past
        its last one: those keys are left out of the products and the softmax (query_blocks), and their
        weights, exactly 0, are added back as zeros; narrow leaves them out: weights (B, H, b, K), K = the
        block's last query + 1 (or Nk, when smaller). outputs=False leaves out the weighted sum of the
        values and the output projection: None in the output's place; outputs="heads" leaves out the output
        projection alone: each head's output (B, b, H, d) in the output's place (a model's own W_o follows).
        reuse: each block's weights in one buffer that the next block's overwrite (QueryBlock.softmax; not under
        autograd), for a caller that uses or copies them before it takes the next: no new tensor of a block's size, and
        its page faults, each block.
        """
        q, k, v = self.project(queries, keys, values)  # (B, H, Nq, d); k, v (B, H, Nk, d)
        for block in query_blocks(q, k, v, rows, causal, outputs, reuse):
            bias = None if position_bias is None else position_bias[:, :, block.first : block.stop, : block.k.shape[2]]
            output, pattern = self.forward(valid_lens=valid_lens, causal=causal, position_bias=bias, block=block)
            yield block.first, output, pattern if narrow else widen(pattern, k.shape[2])  # (B, b, D), (B, H, b, Nk or K)

    def step(self, queries: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None, attend: bool = True):
        """Causal self-attention of the next tokens with a key/value cache, as a decoder generates: queries (B, n, D)
        are the hidden states of n tokens that follow the cache's T. Returns the output (B, n, D), the weights
        (B, H, n, T + n) over every token so far (each of the n sees itself and those before it), and the cache
        with the n tokens' keys and values (rotated, repeated for the query heads: (B, H, T + n, d) each).
        attend=False only fills the cache (a prompt whose rows are not wanted: no (n, n) of scores): None, None, cache."""
        past = 0 if cache is None else cache[0].shape[2]
        q, k, v = self.project(queries, first=past)  # (B, H, n, d) each
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # (B, H, T + n, d)
        if not attend:
            return None, None, (k, v)
        output, pattern = self.forward(causal=True, block=QueryBlock(past, q, k, v))  # (B, n, D), (B, H, n, T + n)
        return output, pattern, (k, v)


@dataclass
class AttentionWeights:
    """One layer's attention parameters as a model stores them: what attnviz's layer is built from.

    Each projection is (weight (out, in), bias or None) in nn.Linear's layout; names are the
    model's own names of w_q, w_k, w_v, w_o (e.g. "model.layers.3.self_attn.q_proj"), for
    traces and messages. scale None means 1/sqrt(d). rope_theta and rotary_inv_freq are
    RoPE's base and its frequencies for head_dim (None without RoPE); rotary_for gives the
    frequencies and attention factor for another head size, with the model's own rope type and
    scaling (the family's adapter: None refuses a re-split of RoPE's heads); q_norm and k_norm are
    (weight, eps) of an RMSNorm over each head (Qwen3). position_bias: the model adds a bias
    per head to the scores (T5), so its heads cannot be split another way. fused_qkv: the
    model's name of one projection holding W_q, W_k, W_v, stored transposed (GPT-2's Conv1D
    "h.0.attn.c_attn", weight (D, 3D)); None when the model keeps them apart.
    """

    w_q: tuple[torch.Tensor, torch.Tensor | None]
    w_k: tuple[torch.Tensor, torch.Tensor | None]
    w_v: tuple[torch.Tensor, torch.Tensor | None]
    w_o: tuple[torch.Tensor, torch.Tensor | None]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    names: dict[str, str] = field(default_factory=dict)
    scale: float | None = None
    rope_theta: float | None = None
    rotary_inv_freq: torch.Tensor | None = None
    rotary_scaling: float = 1.0
    rotary_for: Callable[[int], tuple[torch.Tensor, float]] | None = None
    q_norm: tuple[torch.Tensor, float] | None = None
    k_norm: tuple[torch.Tensor, float] | None = None
    position_bias: bool = False
    family: str = "BERT"  # for messages
    fused_qkv: str | None = None

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads


def check_split(weights: AttentionWeights, num_heads: int) -> None:
    """Refuse a head count the model's projections cannot be split into: an AttnvizError that says which would do."""
    inner = weights.num_heads * weights.head_dim
    if num_heads == weights.num_heads:
        return
    if weights.position_bias:
        raise AttnvizError(
            f"--heads {num_heads}: {weights.family} adds a learned position bias per head to the scores, "
            f"so its {weights.num_heads} heads cannot be split another way; leave --heads out"
        )
    if weights.q_norm is not None:
        raise AttnvizError(
            f"--heads {num_heads}: {weights.family} normalises each head's q and k over its {weights.head_dim} "
            f"features, so its {weights.num_heads} heads cannot be split another way; leave --heads out"
        )
    group, rotary = weights.group_size, weights.rotary_inv_freq is not None
    if group == 1 and not rotary:
        check_num_heads(inner, num_heads)
        return
    # RoPE rotates pairs of features: a head needs an even number of them.
    choices = [h for h in valid_head_counts(inner) if h % group == 0 and not (rotary and (inner // h) % 2)]
    if num_heads in choices:
        return
    if group == 1:
        raise AttnvizError(
            f"--heads {num_heads}: RoPE rotates pairs of features, so a head needs an even number of them; "
            f"choose a count that splits {inner} into even heads: {', '.join(map(str, choices))}"
        )
    raise AttnvizError(
        f"--heads {num_heads}: {weights.family}'s {weights.num_heads} query heads share "
        f"{weights.num_kv_heads} key/value heads in groups of {group}; a split must keep the groups whole: "
        f"choose a multiple of {group} that divides {inner}: {', '.join(map(str, choices))}"
    )


def layer_from_weights(weights: AttentionWeights, num_heads: int | None = None) -> MultiHeadAttention:
    """attnviz's layer holding a model's projections, split into num_heads heads (default: the model's own).

    Another count re-splits the same projections (check_split says which counts can be): with
    grouped-query attention the groups stay whole, H / H_kv query heads to each key/value head;
    with RoPE a new head size gets RoPE's frequencies and attention factor for that size from
    the model's own rope type and scaling (weights.rotary_for).
    """
    num_heads = num_heads or weights.num_heads
    check_split(weights, num_heads)
    head_dim = weights.num_heads * weights.head_dim // num_heads
    num_kv_heads = num_heads // weights.group_size
    inv_freq, rotary_scaling = weights.rotary_inv_freq, weights.rotary_scaling
    if inv_freq is not None and head_dim != weights.head_dim:
        if weights.rotary_for is None:
            raise AttnvizError(
                f"--heads {num_heads}: RoPE's frequencies for heads of {head_dim} features are not known for these "
                f"weights (only the model's own {weights.head_dim}); leave --heads out"
            )
        inv_freq, rotary_scaling = weights.rotary_for(head_dim)
    (q, q_bias), (k, k_bias), (v, v_bias), (o, o_bias) = weights.w_q, weights.w_k, weights.w_v, weights.w_o
    with torch.device("meta"):  # no random initialisation: the model's tensors replace it
        layer = MultiHeadAttention(
            o.shape[0],
            num_heads,
            query_size=q.shape[1],
            key_size=k.shape[1],
            value_size=v.shape[1],
            bias=q_bias is not None,
            out_bias=o_bias is not None,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=weights.scale if head_dim == weights.head_dim else None,
        )
    for linear, (weight, bias) in zip((layer.w_q, layer.w_k, layer.w_v, layer.w_o), (weights.w_q, weights.w_k, weights.w_v, weights.w_o)):
        state = {"weight": weight.detach().clone()} | ({"bias": bias.detach().clone()} if bias is not None else {})
        linear.load_state_dict(state, assign=True)
    layer.rotary_inv_freq = None if inv_freq is None else inv_freq.detach().clone().float()
    layer.rotary_scaling = rotary_scaling
    layer.fused_qkv_name = weights.fused_qkv
    for name, norm in (("q_norm", weights.q_norm), ("k_norm", weights.k_norm)):
        if norm is not None:
            head_norm = HeadNorm(head_dim, eps=norm[1])
            head_norm.weight = nn.Parameter(norm[0].detach().clone(), requires_grad=False)
            setattr(layer, name, head_norm)
    return layer

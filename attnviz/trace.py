"""Shape traces: every split and merge of the heads, recorded from the real tensors.

Four layouts compute the same multi-head attention on the same weights (the Linear layers
of one MultiHeadAttention), each the way its tutorial writes it (DESIGN.md, "The five
implementations"):

    view-permute   attnviz's own layer and the BERT-fed tutorial: separate W_q, W_k, W_v,
                   view + permute to (B, H, N, d)
    merged-batch   d2l.ai: heads folded into the batch axis, (B*H, N, d); valid lengths
                   repeated per head; masked scores set to -1e6
    fused-qkv      nanoGPT: one Linear(D, 3D), split, view, transpose; causal tril buffer
    single-head    one head over one unbatched sequence: Q K^T / sqrt(d_q), A V

A layout passes every tensor it makes through `record(role, tensor, operation, axes, ...)`:
the shape, stride, contiguity and memory sharing are read from that tensor, and the axis
names are checked against the sizes, so a trace cannot claim a shape the run did not have.

Step roles, stable across layouts (in the spirit of TransformerLens' hook names):

    x, x_kv                    the layer's query and key/value inputs
    qkv                        fused-qkv: the one projection (B, N, 3D)
    q, k, v                    the projections (B, N, D)
    q_view, k_view, v_view     (B, N, H, d): the model axis split into heads
    q_permuted, ...            merged-batch: (B, H, N, d) before folding heads into the batch
    q_heads, k_heads, v_heads  each head's tokens: (B, H, N, d), or (B*H, N, d) merged-batch
    k_t                        the keys transposed for the product
    scores                     Q K^T / sqrt(d)
    valid_lens, ...            the padding path: valid lengths, repeated, and the masks
    mask                       the boolean mask the scores are filled by (True = may attend)
    masked_scores              the scores with masked keys at -inf (or -1e6 in d2l)
    pattern                    the attention weights: softmax over the keys
    z                          pattern @ v, per head
    z_view, z_permuted, z_contiguous, z_merged   back to (B, N, D)
    out                        W_o(z_merged)

Axis names: B batch, N tokens (Nq queries and Nk keys when they differ), H heads, d head
size, D model size, "1" a broadcast axis; products such as B*H name a merged axis.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnviz.attention import MultiHeadAttention, allowed_keys
from attnviz.errors import AttnvizError
from attnviz.result import Truncation

LAYOUTS = ("view-permute", "merged-batch", "fused-qkv", "single-head")
DEFAULT_LAYOUT = "view-permute"
MISTAKES = ("view-without-permute", "merge-without-permute")
TOLERANCE = 1e-5
LAYER_NAME = "MultiHeadAttention"  # attnviz's own layer (attention.py), checked beside the layouts
D2L_MASK_VALUE = -1e6  # d2l's masked_softmax: large negative, not -inf

LAYOUT_DESCRIPTIONS = {
    "view-permute": "attnviz's own layer (attention.py), split as the BERT-fed and cross-attention tutorials "
    "split it: separate W_q, W_k, W_v; view + permute to (B, H, N, d)",
    "merged-batch": "the d2l.ai tutorial's code: heads folded into the batch axis as (B*H, N, d); valid lengths "
    "repeated per head, masked scores set to -1e6",
    "fused-qkv": "the nanoGPT-style tutorial's code: one nn.Linear(D, 3D) (self.attn) whose weight stacks W_q, W_k, "
    "W_v; split, view, transpose(1, 2)",
    "single-head": "the single-head tutorial's code (Self_attention): self.Wq, self.Wk, self.Wv over one unbatched "
    "sequence, one head of d = D",
}
ADDED_MARK = "+"  # marks a step the layout's tutorial does not have

WRONG_SPLIT_NOTE = (
    "mistake: view keeps memory order, so row n of 'head' h is slice (h*N + n) % H of token (h*N + n) // H "
    "(slice k: columns k*d..(k+1)*d-1), not slice h of token n; right: .view(B, N, H, d).permute(0, 2, 1, 3)"
)
WRONG_MERGE_NOTE = (
    "mistake: z is (B, H, N, d) in memory, so view puts other tokens' head outputs into "
    "token n's row; right: .permute(0, 2, 1, 3).contiguous().view(B, N, D)"
)


@dataclass
class Step:
    """One tensor a layout made, as read from the tensor itself."""

    role: str
    operation: str  # the PyTorch code, as the tutorial writes it
    inputs: list[str]  # roles of the recorded tensors it was made from
    input_shapes: list[list[int]]
    input_axes: list[list[str]]
    output_shape: list[int]
    output_axes: list[str]
    pattern: str | None  # einops-style: rearrange pattern, or einsum pattern for a product
    stride: list[int]
    contiguous: bool
    memory: str | None  # "view": shares memory with an input; "new": its own; None: an input
    dtype: str
    note: str | None = None
    mistake: bool = False
    in_tutorial: bool = True  # False: a step attnviz adds to the tutorial's code (the note says why)


@dataclass
class LayerInputs:
    """What every layout gets: the same tensors, masks and options.

    keys_values is the same object as queries for self-attention. valid_lens counts each
    sequence's real keys (the rest is padding); None when nothing is padded.
    """

    queries: torch.Tensor  # (B, Nq, D)
    keys_values: torch.Tensor  # (B, Nk, D)
    valid_lens: torch.Tensor | None = None  # (B,)
    causal: bool = False
    source: str = "x"  # the code that made queries: the x step's operation
    kv_source: str = "x_kv"

    @property
    def self_attention(self) -> bool:
        return self.keys_values is self.queries


@dataclass
class LayoutTrace:
    """One layout's run: its steps, and its weights and output in the common shapes."""

    layout: str
    num_heads: int
    head_dim: int
    steps: list[Step]
    weights: torch.Tensor  # (B, H, Nq, Nk), on the CPU
    output: torch.Tensor  # (B, Nq, D), on the CPU
    mistake: str | None = None
    notes: list[str] = field(default_factory=list)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # by role
    shown_text: int | None = None  # single-head: the text of the batch whose steps are recorded (from 0)

    @property
    def name(self) -> str:
        return f"{self.layout} (mistake: {self.mistake})" if self.mistake else self.layout

    def step(self, role: str) -> Step:
        return next(step for step in self.steps if step.role == role)


class Recorder:
    """Collects the steps of one layout; `record(...)` returns the tensor it was given."""

    def __init__(self, sizes: dict[str, int], self_attention: bool, enabled: bool = True):
        self.sizes = sizes
        self.self_attention = self_attention
        self.enabled = enabled
        self.steps: list[Step] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self._role_of: dict[int, str] = {}  # id(tensor) -> role; tensors stay alive in self.tensors

    def __call__(
        self,
        role: str,
        tensor: torch.Tensor,
        operation: str,
        axes: str,
        inputs: tuple[torch.Tensor, ...] = (),
        *,
        pattern: str | None = None,
        note: str | None = None,
        mistake: bool = False,
        added: str | None = None,
    ) -> torch.Tensor:
        """added: why attnviz adds this step, which the tutorial's code does not have."""
        if not self.enabled:
            return tensor
        if role in self.tensors:
            raise RuntimeError(f"trace bug: role {role!r} recorded twice")
        axis_names = axes.split()
        self._check_axes(role, tensor, axis_names)
        input_roles = [self._role_of[id(source)] for source in inputs]
        note = _join_notes(f"not in the tutorial: {added}" if added else None, note)
        storage = tensor.untyped_storage().data_ptr()
        shares = any(source.untyped_storage().data_ptr() == storage for source in inputs)
        self.steps.append(
            Step(
                role=role,
                operation=self._tokens(operation),
                inputs=input_roles,
                input_shapes=[list(source.shape) for source in inputs],
                input_axes=[self._step(source_role).output_axes for source_role in input_roles],
                output_shape=list(tensor.shape),
                output_axes=[self._tokens(name) for name in axis_names],
                pattern=pattern,
                stride=list(tensor.stride()),
                contiguous=tensor.is_contiguous(),
                memory=("view" if shares else "new") if inputs else None,
                dtype=str(tensor.dtype).removeprefix("torch."),
                note=self._tokens(note) if note else None,
                mistake=mistake,
                in_tutorial=added is None,
            )
        )
        self.tensors[role] = tensor
        self._role_of[id(tensor)] = role
        return tensor

    def role_of(self, tensor: torch.Tensor) -> str:
        """The role a recorded tensor goes by: an operation names what it reads (scores or masked_scores)."""
        return self._role_of.get(id(tensor), "scores")

    def _step(self, role: str) -> Step:
        return next(step for step in self.steps if step.role == role)

    def _check_axes(self, role: str, tensor: torch.Tensor, names: list[str]) -> None:
        sizes = [axis_size(name, self.sizes) for name in names]
        if list(tensor.shape) != sizes:
            raise RuntimeError(f"trace bug: {role} has shape {tuple(tensor.shape)}, not {names} = {sizes}")

    def _tokens(self, text: str) -> str:
        """Self-attention has one token axis: Nq and Nk are both N."""
        return re.sub(r"\bN[qk]\b", "N", text) if self.self_attention else text


def _join_notes(*notes: str | None) -> str | None:
    return "; ".join(note for note in notes if note) or None


def axis_size(name: str, sizes: dict[str, int]) -> int:
    """The size of a named axis: "H" -> sizes["H"], "3D" -> 3 * D, "B*H" -> B * H, "1" -> 1."""
    size = 1
    for part in name.split("*"):
        factor, base = re.fullmatch(r"(\d*)(.*)", part).groups()
        size *= int(factor or 1) * (sizes[base] if base else 1)
    return size


def axis_sizes(inputs: LayerInputs, num_heads: int) -> dict[str, int]:
    batch, num_queries, model_size = inputs.queries.shape
    return {
        "B": batch,
        "Nq": num_queries,
        "Nk": inputs.keys_values.shape[1],
        "H": num_heads,
        "d": model_size // num_heads,
        "D": model_size,
    }


def _mask_axes(valid_lens: torch.Tensor | None, causal: bool) -> str:
    """Axis names of allowed_keys' result: (B or 1, 1, Nq or 1, Nk)."""
    return f"{'B' if valid_lens is not None else '1'} 1 {'Nq' if causal else '1'} Nk"


def broadcast_note(mask: torch.Tensor, mask_axes: str, target: torch.Tensor, target_axes: str) -> str:
    """Which axes of the target a mask is broadcast over, read from the two shapes."""
    over = [
        name
        for mask_name, mask_size, name, size in zip(mask_axes.split(), mask.shape, target_axes.split(), target.shape)
        if mask_size == 1 and (size > 1 or mask_name == "1")
    ]
    shape = ", ".join(map(str, mask.shape))
    return f"the mask ({shape}) broadcasts over {', '.join(over)}" if over else "the mask has the scores' shape"


def _finish(layout: str, record: Recorder, num_heads: int, head_dim: int, weights, output, **extra) -> LayoutTrace:
    return LayoutTrace(
        layout=layout,
        num_heads=num_heads,
        head_dim=head_dim,
        steps=record.steps,
        weights=weights.detach().float().cpu(),
        output=output.detach().float().cpu(),
        tensors=record.tensors,
        **extra,
    )


def record_projections(record: Recorder, layer: MultiHeadAttention, inputs: LayerInputs, spelling: str):
    """Record x (and x_kv for cross-attention) and the three projections of a batched layout.

    spelling names the projections as the tutorial's code does: "self.w_{}" gives self.w_q(x).
    Returns q (B, Nq, D), k and v (B, Nk, D).
    """
    x = record("x", inputs.queries, inputs.source, "B Nq D")
    x_kv = x if inputs.self_attention else record("x_kv", inputs.keys_values, inputs.kv_source, "B Nk D")
    kv_name = "x" if inputs.self_attention else "x_kv"
    q = record("q", layer.w_q(x), f"{spelling.format('q')}(x)", "B Nq D", (x,))
    k = record("k", layer.w_k(x_kv), f"{spelling.format('k')}({kv_name})", "B Nk D", (x_kv,))
    v = record("v", layer.w_v(x_kv), f"{spelling.format('v')}({kv_name})", "B Nk D", (x_kv,))
    return q, k, v


def view_permute(
    layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int, mistake: str | None = None
) -> LayoutTrace:
    """attnviz's layer (attention.py), step by step: view + permute to (B, H, N, d)."""
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
        mask_axes = _mask_axes(inputs.valid_lens, inputs.causal)
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
    return _finish("view-permute", record, H, d, pattern, out, mistake=mistake)


def merged_batch(layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int) -> LayoutTrace:
    """d2l.ai's MultiHeadAttention: transpose_qkv, DotProductAttention, masked_softmax, transpose_output."""
    sizes = axis_sizes(inputs, num_heads)
    B, Nq, Nk, H, d = (sizes[name] for name in ("B", "Nq", "Nk", "H", "d"))
    record = Recorder(sizes, inputs.self_attention)
    token_sizes = {"Nq": Nq, "Nk": Nk}

    def transpose_qkv(name: str, projected: torch.Tensor, tokens: str) -> torch.Tensor:
        viewed = record(
            f"{name}_view", projected.reshape(B, token_sizes[tokens], H, -1), f"{name}.reshape(B, {tokens}, H, -1)",
            f"B {tokens} H d", (projected,), pattern="b n (h d) -> b n h d",
        )  # (B, N, H, d)
        permuted = record(
            f"{name}_permuted", viewed.permute(0, 2, 1, 3), f"{name}_view.permute(0, 2, 1, 3)",
            f"B H {tokens} d", (viewed,), pattern="b n h d -> b h n d",
        )  # (B, H, N, d)
        return record(
            f"{name}_heads", permuted.reshape(-1, token_sizes[tokens], d), f"{name}_permuted.reshape(-1, {tokens}, d)",
            f"B*H {tokens} d", (permuted,), pattern="b h n d -> (b h) n d",
            note="heads folded into the batch axis: row b*H + h is head h of sequence b",
        )  # (B*H, N, d)

    q, k, v = record_projections(record, layer, inputs, "self.W_{}")  # (B, N, D) each
    q, k, v = transpose_qkv("q", q, "Nq"), transpose_qkv("k", k, "Nk"), transpose_qkv("v", v, "Nk")

    k_t = record("k_t", k.transpose(1, 2), "k_heads.transpose(1, 2)", "B*H d Nk", (k,), pattern="bh n d -> bh d n")
    scores = record(
        "scores", torch.bmm(q, k_t) / math.sqrt(d), "torch.bmm(q_heads, k_t) / math.sqrt(d)", "B*H Nq Nk", (q, k_t),
        pattern="bh nq d, bh d nk -> bh nq nk",
    )  # (B*H, Nq, Nk)

    valid_lens, valid_axes = None, ""
    if inputs.valid_lens is not None:
        valid_lens = record("valid_lens", inputs.valid_lens.to(q.device), "encoded.valid_lens", "B")
        valid_axes = "B"
    if inputs.causal:
        # d2l's decoder masks the future with one valid length per query: query i sees keys 0..i.
        per_query = torch.arange(1, Nq + 1, device=q.device).repeat(B, 1)  # (B, Nq)
        added = "the tutorial takes valid_lens of shape (B, Nq) as given; d2l's decoder makes them so for --causal"
        if valid_lens is None:
            valid_lens = record("valid_lens", per_query, "torch.arange(1, Nq + 1).repeat(B, 1)", "B Nq", added=added)
        else:
            valid_lens = record(
                "valid_lens_causal", torch.minimum(valid_lens[:, None], per_query),
                "torch.minimum(valid_lens[:, None], torch.arange(1, Nq + 1))", "B Nq", (valid_lens,), added=added,
            )
        valid_axes = "B Nq"
    if valid_lens is not None:
        head_axes = valid_axes.replace("B", "B*H", 1)
        valid_lens = record(
            "valid_lens_heads", torch.repeat_interleave(valid_lens, repeats=H, dim=0),
            "torch.repeat_interleave(valid_lens, repeats=H, dim=0)", head_axes, (valid_lens,),
            note="one copy per head, in the order of the folded batch axis",
        )  # (B*H,) or (B*H, Nq)
        if valid_lens.dim() == 1:
            rows = record(
                "valid_lens_rows", torch.repeat_interleave(valid_lens, Nq), "torch.repeat_interleave(valid_lens, Nq)",
                "B*H*Nq", (valid_lens,), note="masked_softmax: one valid length per row of scores",
            )
        else:
            rows = record("valid_lens_rows", valid_lens.reshape(-1), "valid_lens.reshape(-1)", "B*H*Nq", (valid_lens,))
        score_rows = record(
            "score_rows", scores.reshape(-1, Nk), "scores.reshape(-1, Nk)", "B*H*Nq Nk", (scores,),
            pattern="bh nq nk -> (bh nq) nk",
        )
        mask = record(
            "mask", torch.arange(Nk, device=q.device)[None, :] < rows[:, None],
            "torch.arange(Nk)[None, :] < valid_lens_rows[:, None]", "B*H*Nq Nk", (rows,),
            note="d2l's sequence_mask: True where the key is within the valid length",
        )
        masked_rows = record(
            "masked_rows", score_rows.masked_fill(~mask, D2L_MASK_VALUE), "sequence_mask(X, valid_lens, value=-1e6)",
            "B*H*Nq Nk", (score_rows, mask), note="d2l writes X[~mask] = -1e6: exp(-1e6) is exactly 0 in float32",
        )
        scores = record(
            "masked_scores", masked_rows.reshape(B * H, Nq, Nk), "X.reshape(shape)", "B*H Nq Nk", (masked_rows,),
            pattern="(bh nq) nk -> bh nq nk",
        )
    pattern = record(
        "pattern", F.softmax(scores, dim=-1), f"F.softmax({record.role_of(scores)}, dim=-1)", "B*H Nq Nk", (scores,)
    )  # (B*H, Nq, Nk)
    z = record("z", torch.bmm(pattern, v), "torch.bmm(pattern, v_heads)", "B*H Nq d", (pattern, v), pattern="bh nq nk, bh nk d -> bh nq d")

    # transpose_output: the inverse of transpose_qkv
    z_view = record("z_view", z.reshape(-1, H, Nq, d), "z.reshape(-1, H, Nq, d)", "B H Nq d", (z,), pattern="(b h) n d -> b h n d")
    permuted = record(
        "z_permuted", z_view.permute(0, 2, 1, 3), "z_view.permute(0, 2, 1, 3)", "B Nq H d", (z_view,), pattern="b h n d -> b n h d"
    )
    merged = record(
        "z_merged", permuted.reshape(B, Nq, -1), "z_permuted.reshape(B, Nq, -1)", "B Nq D", (permuted,),
        pattern="b n h d -> b n (h d)", note="reshape copies when view cannot: no .contiguous() needed",
    )
    out = record("out", layer.w_o(merged), "self.W_o(z_merged)", "B Nq D", (merged,))
    notes = ["d2l's W_q, W_k, W_v, W_o here carry the BERT layer's biases too (d2l's have none)"]
    weights = pattern.reshape(B, H, Nq, Nk)  # (B, H, Nq, Nk): unfold the heads to compare
    return _finish("merged-batch", record, H, d, weights, out, notes=notes)


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
    qkv = record("qkv", c_attn(x), "self.attn(x)", "B Nq 3D", (x,))  # (B, N, 3D)
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
    notes = [
        "the tutorial's self.attn = nn.Linear(n_embd, 3 * n_embd) (nanoGPT's c_attn); its weight here is "
        "torch.cat([W_q, W_k, W_v]) (3D, D), so split(D, dim=2) gives back q, k and v",
        "the tutorial's T is Nq here, C and n_embd are D, n_heads is H",
        "the tutorial always masks the future; here only with --causal",
    ]
    return _finish("fused-qkv", record, H, d, pattern, out, notes=notes)


def matrix_and_bias(linear: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """W (in, out) and b (out,) with linear(x) == x @ W + b; b is zeros for a Linear without bias."""
    bias = linear.bias if linear.bias is not None else torch.zeros_like(linear.weight[:, 0])
    return linear.weight.T, bias


def single_head(layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int = 1) -> LayoutTrace:
    """The single-head tutorial's Self_attention.forward, one unbatched sequence at a time (H = 1, d = D).

    With trained weights, one head uses all of W_q, W_k and W_v: it equals the layer split
    into 1 head (scale 1/sqrt(D)), not into the model's own number of heads. A batch runs one
    text at a time, its padding keys cut off instead of masked; the trace shows the text with
    the most padding.
    """
    batch, num_queries, model_size = inputs.queries.shape
    num_keys = inputs.keys_values.shape[1]
    head_dim = layer.w_q.out_features  # one head: d = D
    valid = inputs.valid_lens.tolist() if inputs.valid_lens is not None else [num_keys] * batch
    shown = min(range(batch), key=lambda b: (valid[b], b))  # the most padding, else the first
    cut = inputs.valid_lens is not None
    self_attention = inputs.self_attention and not cut  # cut keys: Nk (real keys) is not Nq

    weights, outputs, recorders = [], [], []
    for b in range(batch):
        sizes = {"Nq": num_queries, "Nk": valid[b], "d": head_dim, "D": model_size}
        record = Recorder(sizes, self_attention, enabled=b == shown)
        x = record("x", inputs.queries[b], f"queries[{b}]", "Nq D")  # (Nq, D): one unbatched sequence
        if cut:
            x_kv = record(
                "x_kv", inputs.keys_values[b, : valid[b]], f"keys_values[{b}, :valid_lens[{b}]]", "Nk D",
                added="the tutorial takes one unpadded sequence: the padding keys are cut off, so nothing needs a mask",
            )  # (Nk, D)
        elif inputs.self_attention:
            x_kv = x
        else:
            x_kv = record(
                "x_kv", inputs.keys_values[b], f"keys_values[{b}]", "Nk D",
                added="the tutorial is self-attention: its keys and values come from x",
            )
        kv_name = "x" if x_kv is x else "x_kv"
        Q = record("q", layer.w_q(x), "self.Wq(x)", "Nq d", (x,))
        K = record("k", layer.w_k(x_kv), f"self.Wk({kv_name})", "Nk d", (x_kv,))
        V = record("v", layer.w_v(x_kv), f"self.Wv({kv_name})", "Nk d", (x_kv,))
        K_t = record("k_t", K.T, "K.T", "d Nk", (K,), pattern="n d -> d n")
        scores = record(
            "scores", torch.matmul(Q, K_t) * (1 / math.sqrt(head_dim)), "torch.matmul(Q, K.T) * self._norm_fact",
            "Nq Nk", (Q, K_t), pattern="nq d, d nk -> nq nk", note="self._norm_fact = 1 / sqrt(d)",
        )
        if inputs.causal:
            mask = record(
                "mask", torch.tril(torch.ones(num_queries, valid[b], dtype=torch.bool, device=x.device)),
                "torch.tril(torch.ones(Nq, Nk, dtype=torch.bool))", "Nq Nk", added="the tutorial has no mask: --causal",
            )
            scores = record(
                "masked_scores", scores.masked_fill(~mask, float("-inf")), "scores.masked_fill(~mask, float('-inf'))",
                "Nq Nk", (scores, mask), added="the tutorial has no mask: --causal",
            )
        pattern = record(
            "pattern", torch.softmax(scores, dim=-1), f"torch.softmax({record.role_of(scores)}, dim=-1)", "Nq Nk", (scores,)
        )
        z = record("z", torch.matmul(pattern, V), "torch.matmul(A, V)", "Nq d", (pattern, V), pattern="nq nk, nk d -> nq d")
        out = record(
            "out", layer.w_o(z), "self.w_o(C)", "Nq D", (z,),
            added="the tutorial returns C; W_o, so the output compares with the other layouts",
        )
        weights.append(F.pad(pattern, (0, num_keys - valid[b])))  # (Nq, Nk): the cut keys get weight 0
        outputs.append(out)
        recorders.append(record)

    notes = [
        f"one head: d = D = {head_dim} (the tutorial's d_in, d_q and d_out), so it uses every column of W_q, W_k, W_v, "
        f"scale 1/sqrt({head_dim})",
        "Q, K, V, A, C are the tutorial's names for q, k, v, pattern, z; its A = torch.softmax(torch.matmul(Q, K.T) "
        "* self._norm_fact, dim=-1) is split into scores and pattern here",
        "the tutorial's Wq, Wk, Wv have bias=False; here they are the BERT layer's, biases included",
    ]
    if batch > 1:
        padding = num_keys - valid[shown]
        notes.append(
            f"a batch runs one text at a time (texts numbered from 0); the steps below are text {shown}'s"
            + (f", the one with the most padding: its {padding} padding keys are cut off" if padding else "")
        )
    record = recorders[shown]
    weights = torch.stack(weights)[:, None]  # (B, 1, Nq, Nk)
    return _finish("single-head", record, 1, head_dim, weights, torch.stack(outputs), notes=notes, shown_text=shown)


def trace_layout(
    name: str, layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int, mistake: str | None = None
) -> LayoutTrace:
    if name not in LAYOUTS:
        raise AttnvizError(f"unknown layout {name!r}: choose one of {', '.join(LAYOUTS)} or all")
    if mistake is not None and name != "view-permute":
        raise AttnvizError("--mistake is shown in the view-permute layout: leave out --layout or use --layout view-permute")
    with torch.inference_mode():
        if name == "view-permute":
            return view_permute(layer, inputs, num_heads, mistake)
        layout = {"merged-batch": merged_batch, "fused-qkv": fused_qkv, "single-head": single_head}[name]
        return layout(layer, inputs, num_heads)


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

    Independent of attention.py: torch's own projections, head split, masks and softmax.
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


@dataclass
class TraceResult:
    """Everything `attnviz trace` shows and writes."""

    texts: list[str]
    kv_text: str | None
    model: str
    layer: int
    weights: str
    num_heads: int
    head_dim: int
    model_size: int
    causal: bool
    device: str
    valid_lens: list[int] | None
    layouts: list[LayoutTrace]
    checks: list[Check]
    head_slices: list[HeadSlice]
    mistake: MistakeResult | None = None
    notes: list[str] = field(default_factory=list)
    truncated: list[Truncation | None] = field(default_factory=list)  # each text's cut by --truncate
    kv_truncated: Truncation | None = None  # the --kv text's

    @property
    def agree(self) -> bool:
        return all(check.agree for check in self.checks)


def trace_layouts(
    layer: MultiHeadAttention, inputs: LayerInputs, layouts: list[str], mistake: str | None = None
) -> tuple[list[LayoutTrace], list[Check], list[HeadSlice], MistakeResult | None, list[str]]:
    """Run the layouts (in LAYOUTS' order), check them against torch, slice the heads.

    The head slices are checked against the default layout's scores, run for that even when
    not shown.
    """
    num_heads = layer.num_heads
    if mistake is not None and any(name != DEFAULT_LAYOUT for name in layouts):
        raise AttnvizError("--mistake is shown in the view-permute layout: leave out --layout or use --layout view-permute")
    if mistake is not None and num_heads == 1:
        raise AttnvizError("--mistake needs more than one head: with 1 head the wrong view gives the right tensor")
    notes = []
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        trace_layout(unknown[0], layer, inputs, num_heads)  # raises the clear error
    names = [name for name in LAYOUTS if name in layouts]
    if not inputs.self_attention and "fused-qkv" in names:
        if len(names) == 1:
            trace_layout("fused-qkv", layer, inputs, num_heads)  # raises the clear error
        names.remove("fused-qkv")
        notes.append("fused-qkv left out: it is self-attention only, and --kv makes this cross-attention")
    traces = [trace_layout(name, layer, inputs, num_heads) for name in names]
    # The head slices are those of the heads shown: one head of D columns when single-head is all there is.
    sliced_heads = 1 if names == ["single-head"] else num_heads
    sliced = next((trace for trace in traces if trace.layout == DEFAULT_LAYOUT), None)
    if sliced is None or sliced.num_heads != sliced_heads:
        sliced = trace_layout(DEFAULT_LAYOUT, layer, inputs, sliced_heads)
    mistake_result = None
    if mistake is not None:
        wrong = trace_layout(DEFAULT_LAYOUT, layer, inputs, num_heads, mistake)
        mistake_result = compare_mistake(traces[0], wrong)
        traces.append(wrong)
    checks = check_layouts(layer, inputs, traces)
    return traces, checks, head_slices(layer, inputs, sliced), mistake_result, notes


def trace_texts(
    loaded,
    texts: list[str],
    *,
    kv_text: str | None = None,
    layer: int = 0,
    num_heads: int | None = None,
    weights: str = "pretrained",
    seed: int = 0,
    causal: bool = False,
    device: str = "cpu",
    layouts: tuple[str, ...] = (DEFAULT_LAYOUT,),
    mistake: str | None = None,
    truncate: bool = False,
) -> TraceResult:
    """Trace the layouts over BERT layer `layer`'s input for a padded batch of texts.

    The weights are build_layer's (BERT's own, or random with seed); a batch of more than
    one text passes its valid lengths, so the trace shows the padding path.
    """
    from attnviz.pipeline import build_layer, check_layer, layer_input, resolve_num_heads
    from attnviz.tokens import encode

    check_layer(loaded, layer)
    num_heads = resolve_num_heads(loaded, num_heads)
    attention = build_layer(loaded, layer, num_heads, weights, seed, device)
    queries = encode(loaded.tokenizer, texts, loaded.max_positions, truncate)
    query_states = layer_input(loaded, queries, layer, device)  # (B, Nq, D)
    key_states, key_valid_lens = query_states, queries.valid_lens  # (B, Nk, D), (B,)
    keys = None
    if kv_text is not None:
        keys = encode(loaded.tokenizer, [kv_text], loaded.max_positions, truncate)
        key_states = layer_input(loaded, keys, layer, device).expand(len(texts), -1, -1)  # (B, Nk, D)
        key_valid_lens = keys.valid_lens.expand(len(texts))  # (B,)
    inputs = LayerInputs(
        query_states,
        key_states,
        valid_lens=key_valid_lens.to(device) if len(texts) > 1 else None,  # a batch shows the padding path
        causal=causal,
        source=f"layer_input(bert, encode(texts), layer={layer})",
        kv_source=f"layer_input(bert, encode([kv_text]), layer={layer}).expand(B, -1, -1)",
    )

    traces, checks, slices, mistake_result, notes = trace_layouts(attention, inputs, list(layouts), mistake)
    return TraceResult(
        texts=list(texts),
        kv_text=kv_text,
        model=loaded.name,
        layer=layer,
        weights=weights,
        num_heads=num_heads,
        head_dim=loaded.hidden_size // num_heads,
        model_size=loaded.hidden_size,
        causal=causal,
        device=device,
        valid_lens=inputs.valid_lens.tolist() if inputs.valid_lens is not None else None,
        layouts=traces,
        checks=checks,
        head_slices=slices,
        mistake=mistake_result,
        notes=notes,
        truncated=queries.truncations,
        kv_truncated=keys.truncations[0] if keys is not None else None,
    )

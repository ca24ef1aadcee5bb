"""The recorder every layout passes its tensors through, and the records it keeps.

`record(role, tensor, operation, axes, ...)` reads the shape, stride, contiguity and memory
sharing from the tensor itself and checks the axis names against the sizes, so a trace cannot
claim a shape the run did not have.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from attnviz.attention.layer import MultiHeadAttention

ADDED_MARK = "+"  # marks a step the layout's tutorial does not have


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
    position_bias: torch.Tensor | None = None  # (1 or B, H, Nq, Nk): added to the scores (T5)
    position_bias_source: str = "position_bias"

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


def axis_sizes(inputs: LayerInputs, num_heads: int, layer: MultiHeadAttention | None = None) -> dict[str, int]:
    """The named axes' sizes; given the layer (split into its own num_heads), its H_kv, G and d too."""
    batch, num_queries, model_size = inputs.queries.shape
    sizes = {
        "B": batch,
        "Nq": num_queries,
        "Nk": inputs.keys_values.shape[1],
        "H": num_heads,
        "d": model_size // num_heads,
        "D": model_size,
    }
    if layer is not None and num_heads == layer.num_heads:
        sizes |= {"H_kv": layer.num_kv_heads, "G": layer.group_size, "d": layer.head_dim, "d/2": layer.head_dim // 2}
    return sizes


def beyond_tutorials(layer: MultiHeadAttention, inputs: LayerInputs | None = None) -> list[str]:
    """What this layer does that the tutorials' layers do not, in words; [] for a BERT-era layer.

    Only the view-permute layout traces these (the others refuse such a layer), and torch's
    nn.MultiheadAttention cannot check them (checks.py takes scaled_dot_product_attention then).
    """
    features = []
    if layer.group_size > 1:
        features.append(
            f"grouped-query attention ({layer.num_heads} query heads share {layer.num_kv_heads} key/value heads)"
        )
    if layer.rotary_inv_freq is not None:
        features.append("rotary position embeddings (RoPE) on q and k")
    if layer.q_norm is not None:
        features.append("an RMSNorm over each head's q and k")
    if not math.isclose(layer.scale, 1 / math.sqrt(layer.head_dim), rel_tol=1e-6):
        features.append(f"scale {layer.scale:g}, not 1/sqrt(d)")
    if inputs is not None and inputs.position_bias is not None:
        features.append("a position bias added to the scores")
    if layer.num_heads * layer.head_dim != layer.w_o.out_features:
        features.append(f"heads of d = {layer.head_dim}, not D / H")
    return features


def inner_axes(layer: MultiHeadAttention, num_heads: int) -> tuple[str, str]:
    """The axis names of the projected queries' and keys' features: D, or H*d and H_kv*d when they are not D."""
    if num_heads != layer.num_heads:
        return "D", "D"
    model_size = layer.w_o.out_features
    query_axis = "D" if layer.num_heads * layer.head_dim == model_size else "H*d"
    return query_axis, query_axis if layer.group_size == 1 else "H_kv*d"


def broadcast_note(mask: torch.Tensor, mask_axes: str, target: torch.Tensor, target_axes: str) -> str:
    """Which axes of the target a mask is broadcast over, read from the two shapes."""
    over = [
        name
        for mask_name, mask_size, name, size in zip(mask_axes.split(), mask.shape, target_axes.split(), target.shape)
        if mask_size == 1 and (size > 1 or mask_name == "1")
    ]
    shape = ", ".join(map(str, mask.shape))
    return f"the mask ({shape}) broadcasts over {', '.join(over)}" if over else "the mask has the scores' shape"


def finish_trace(layout: str, record: Recorder, num_heads: int, head_dim: int, weights, output, **extra) -> LayoutTrace:
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


def record_projections(
    record: Recorder, layer: MultiHeadAttention, inputs: LayerInputs, spelling: str, num_heads: int | None = None
):
    """Record x (and x_kv for cross-attention) and the three projections of a batched layout.

    spelling names the projections as the tutorial's code does: "self.w_{}" gives self.w_q(x).
    Returns q (B, Nq, D), k and v (B, Nk, D); with grouped-query attention k and v are
    (B, Nk, H_kv*d), and with a head size set apart from D / H, q is (B, Nq, H*d).
    """
    query_axis, kv_axis = inner_axes(layer, num_heads or layer.num_heads)
    x = record("x", inputs.queries, inputs.source, "B Nq D")
    x_kv = x if inputs.self_attention else record("x_kv", inputs.keys_values, inputs.kv_source, "B Nk D")
    kv_name = "x" if inputs.self_attention else "x_kv"
    q = record("q", layer.w_q(x), f"{spelling.format('q')}(x)", f"B Nq {query_axis}", (x,))
    k = record("k", layer.w_k(x_kv), f"{spelling.format('k')}({kv_name})", f"B Nk {kv_axis}", (x_kv,))
    v = record("v", layer.w_v(x_kv), f"{spelling.format('v')}({kv_name})", f"B Nk {kv_axis}", (x_kv,))
    return q, k, v

"""One forward pass of a model, and what the stages ask of it: attnviz's one way of taking tensors out of a model.

Every stage that needs more than attnviz's own layers reads it from a pass of the model (transformers' or attnviz's
BERT), and this module is how: forward pre-hooks and hooks on the stack's modules, by role, installed for one
pass and removed after it. The roles (the trace's names where it has one: tracing/__init__.py):

- x, x_kv: what enters each layer's attention (after the family's own norm: Llama's input_layernorm), and for
  cross-attention the encoder's output (key_value_states). Every run's map is made of x.
- calls: each layer's call, its (args, kwargs): the residual stream entering it first, the mask, the positions, T5's
  bias. run_from (layer_runs.py) replays the layers from any one of them (effect, patch).
- z_merged: what enters each layer's W_o (B, N, H * d): every head's output side by side.
- projections q, k, v: what W_q, W_k, W_v gave (B, N, features), before RoPE and any q/k norm (a fused one, GPT-2's
  c_attn, whole: the caller slices it).
- mlp: what each layer's MLP gave (B, N, D), its share of the residual stream before it is added (and before a
  post-norm layer's own norm: BERT's output.dense, BART's fc2).
- embedded: what enters a post-norm encoder's embeddings' norm (B, N, D): the word, position and type embeddings summed.
- final: what enters the stack's final norm (B, N, D), and the model's last hidden state (the pass's own output).

A pass that only needs x stops after the last layer asked for (_Stop, raised by its hook): the layers after it never
run. Asked for anything of every layer (calls, z_merged, projections, final), the pass runs whole.
q, k and v after RoPE are not hooked: attnviz's own layer makes them from x (MultiHeadAttention.project), and they
are what its maps are made of.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from attnviz.errors import AttnvizError
from attnviz.models.layer_runs import LayerStack, Recorded

PROJECTIONS = ("q", "k", "v")


def projection_slice(model, weights, component: str) -> tuple[nn.Module, int, int, int]:
    """(module, first feature, heads, d) of a layer's W_q, W_k or W_v output (a fused one: GPT-2's c_attn), weights its
    AttentionWeights (model.attention_weights): head i's part of the module's output is features first + i * d to
    first + (i + 1) * d (heads: H for q, H_kv for k, v)."""
    role = {"q": "w_q", "k": "w_k", "v": "w_v"}[component]
    module = model.get_submodule(weights.names[role])
    inner, kv_inner = weights.num_heads * weights.head_dim, weights.num_kv_heads * weights.head_dim
    first = {"w_q": 0, "w_k": inner, "w_v": inner + kv_inner}[role] if weights.fused_qkv else 0
    count = weights.num_heads if role == "w_q" else weights.num_kv_heads
    return module, first, count, weights.head_dim


@dataclass(frozen=True)
class Wanted:
    """What the stages of one call ask of its pass: x of `layers`, and of every layer each role set here."""

    layers: frozenset[int] = frozenset()  # whose attention input x (and x_kv) is kept
    calls: bool = False  # each layer's (args, kwargs): run_from
    z_merged: bool = False  # (B, N, H * d) entering each W_o
    projections: frozenset[str] = frozenset()  # "q", "k", "v": what W_q, W_k, W_v gave
    final: bool = False  # (B, N, D) entering the final norm
    mlp: bool = False  # (B, N, D): each layer's MLP's output
    embedded: bool = False  # (B, N, D) entering a post-norm encoder's embeddings' norm
    whole: bool = False  # the pass runs to its end whatever is asked (attnviz's layers in the model's place)

    @property
    def whole_pass(self) -> bool:
        """Whether the pass runs to its end: something of every layer, or of the stack's end, is asked for."""
        return self.whole or self.calls or self.z_merged or bool(self.projections) or self.final or self.mlp


@dataclass
class Captured:
    """What entered one attention module: the hidden state x (B, Nq, D) and, for cross-attention, the encoder's x_kv (B, Nk, D)."""

    hidden: torch.Tensor
    kv_hidden: torch.Tensor | None = None


@dataclass
class Capture:
    """What one pass gave, by role (the module's docstring): each None, or empty, when not asked for."""

    x: dict[int, Captured] = field(default_factory=dict)
    calls: list[tuple[tuple, dict]] | None = None
    z_merged: list[torch.Tensor] | None = None
    projections: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)  # "q" -> layer -> (B, N, features)
    mlp: dict[int, torch.Tensor] | None = None  # layer -> (B, N, D): what its MLP added to the residual stream
    embedded: torch.Tensor | None = None  # (B, N, D): what entered the embeddings' norm (Wanted.embedded)
    final_in: torch.Tensor | None = None  # (B, N, D); None also for a stack without a final norm
    last_hidden: torch.Tensor | None = None  # (B, N, D): what the pass's forward returned (None: stopped early)

    def recorded(self, rest: Callable | None = None) -> Recorded:
        """The layers' calls and z_merged as run_from replays them (rest: Recorded's)."""
        return Recorded(self.calls, self.z_merged, rest)


@dataclass
class HookPoints:
    """A stack's modules by role, modules[i] being layer i's (a module several layers share, ALBERT's, listed for each)."""

    stack: LayerStack  # the layers (their calls), their W_o (z_merged), the final norm
    attention: list[nn.Module]  # the module whose input is x
    projections: dict[str, list[nn.Module]]  # "q", "k", "v" -> each layer's W_q, W_k, W_v
    mlps: list[nn.Module]  # the module whose output is the layer's MLP's share of the residual stream
    cross: bool = False  # the attention's keys are the key_value_states keyword's (x_kv)
    embedding_norm: nn.Module | None = None  # a post-norm encoder's embeddings' LayerNorm


class _Stop(Exception):
    """Raised by a hook once every layer asked for is captured: the rest of the forward pass is not needed."""


def capture(points: HookPoints, forward: Callable[[], Any], wanted: Wanted, entered=lambda done: None) -> Capture:
    """forward() (one pass of the model; it returns the last hidden state, or anything) with what `wanted` names
    taken from points' modules; entered(1) as each layer of wanted.layers is reached. The caller holds the model
    (no other pass at a time: the hooks sit on modules that threads share)."""
    num_layers = len(points.stack.layers)
    captured = Capture(
        calls=[None] * num_layers if wanted.calls else None,
        z_merged=[None] * num_layers if wanted.z_merged else None,
        projections={role: {} for role in wanted.projections},
        mlp={} if wanted.mlp else None,
    )
    stops = not wanted.whole_pass

    def keep_x(layer: int, args: tuple, kwargs: dict) -> None:
        if layer in wanted.layers:
            hidden = args[0] if args else kwargs["hidden_states"]
            if not torch.isfinite(hidden).all():
                raise AttnvizError(f"NaN or infinity in the input of layer {layer}: the model's weights hold them, or overflow")
            kv = kwargs.get("key_value_states") if points.cross else None
            captured.x[layer] = Captured(hidden.detach().clone(), None if kv is None else kv.detach().clone())
            entered(1)
        if stops and len(captured.x) == len(wanted.layers):
            raise _Stop

    def keep_call(layer: int, args: tuple, kwargs: dict) -> None:
        captured.calls[layer] = (args, kwargs)

    def keep_z(layer: int, args: tuple, kwargs: dict) -> None:
        captured.z_merged[layer] = args[0].detach().clone()

    def keeping(role: str):
        def keep(layer: int, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
            captured.projections[role].setdefault(layer, output.detach().clone())  # its first call's

        return keep

    def keep_mlp(layer: int, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
        captured.mlp.setdefault(layer, output.detach().clone())

    def keep_embedded(module, args) -> None:
        captured.embedded = args[0].detach().clone()

    def keep_final(module, args) -> None:
        captured.final_in = args[0].detach().clone()  # the last call's: the stack's end

    handles = []
    if wanted.layers:  # a stopping pass hooks only the layers up to the last asked for
        handles += hook_layers(points.attention[: max(wanted.layers) + 1] if stops else points.attention, keep_x)
    if wanted.calls:
        handles += hook_layers(points.stack.layers, keep_call)
    if wanted.z_merged:
        handles += hook_layers(points.stack.projections, keep_z)
    for role in wanted.projections:
        handles += hook_layers(points.projections[role], keeping(role), after=True)
    if wanted.mlp:
        handles += hook_layers(points.mlps, keep_mlp, after=True)
    if wanted.embedded and points.embedding_norm is not None:
        handles.append(points.embedding_norm.register_forward_pre_hook(keep_embedded))
    if wanted.final and points.stack.final is not None:
        handles.append(points.stack.final.register_forward_pre_hook(keep_final))
    try:
        captured.last_hidden = forward()
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    missing = [role for role, kept in (("calls", captured.calls), ("z_merged", captured.z_merged)) if kept is not None and None in kept]
    missing += [role for role, kept in captured.projections.items() if len(kept) < num_layers]
    missing += ["mlp"] if captured.mlp is not None and len(captured.mlp) < num_layers else []
    if missing:
        raise RuntimeError(f"the forward pass did not call every layer of the stack ({', '.join(missing)} missing)")
    return captured


def hook_layers(modules: list[nn.Module], keep: Callable[..., None], after: bool = False) -> list:
    """Forward pre-hooks that call keep(layer, args, kwargs) as each layer's module is called, modules[i] being
    layer i's; after: forward hooks that call keep(layer, args, kwargs, output) once it has run. A module several
    layers share (ALBERT's) is called once for each of them, in order: its k-th call in a pass is the k-th of its
    layers, pass after pass. Returns the hooks' handles, for the caller to remove."""
    owners: dict[int, list[int]] = {}  # id(module) -> the layers it serves, in order
    for layer, module in enumerate(modules):
        owners.setdefault(id(module), []).append(layer)
    calls = dict.fromkeys(owners, 0)

    def hook(module, args, kwargs, *output):
        layers = owners[id(module)]
        layer = layers[calls[id(module)] % len(layers)]
        calls[id(module)] += 1
        keep(layer, args, kwargs, *output)

    unique = {id(module): module for module in modules}
    if after:
        return [module.register_forward_hook(hook, with_kwargs=True) for module in unique.values()]
    return [module.register_forward_pre_hook(hook, with_kwargs=True) for module in unique.values()]

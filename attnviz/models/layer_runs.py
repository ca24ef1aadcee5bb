"""A stack of layers run one by one, from any layer on, with one layer's heads changed (analysis/effect.py).

One forward pass of the model, under pre-hooks, records how each layer was called (its arguments: the hidden
state entering it, the mask, the positions, T5's position bias) and what entered each layer's output projection
W_o (every head's output side by side). A batch of copies of what entered layer L can then run through layers
L, L+1, ... with those very arguments, and the stack's final norm, as the model would have run them: the layers
before L do not run again. The same for attnviz's BERT and transformers' models of every family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass
class LayerStack:
    """A stack's layers in the order they run (a module shared by several layers, ALBERT's, is listed for each),
    each layer's output projection W_o, and the norm after the last layer (None: the last layer's output is the
    stack's)."""

    layers: list[nn.Module]
    projections: list[nn.Module]
    final: nn.Module | None = None


@dataclass
class Captured:
    """What entered one attention module: the hidden state (B, Nq, D) and, for cross-attention, the encoder's (B, Nk, D)."""

    hidden: torch.Tensor
    kv_hidden: torch.Tensor | None = None


@dataclass
class Recorded:
    """A forward pass's layer calls: each layer's (args, kwargs), the hidden state entering it first (B, N, D), and
    what entered each layer's W_o (B, N, H * d)."""

    calls: list[tuple[tuple, dict]]
    heads: list[torch.Tensor]
    # what the model makes of the stack's output (B, N, D), when the stack is not its last: an encoder-decoder's
    # decoder reading its encoder's output
    rest: Callable[[torch.Tensor], torch.Tensor] | None = None

    def entering(self, layer: int) -> torch.Tensor:
        args, kwargs = self.calls[layer]
        return args[0] if args else kwargs["hidden_states"]


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


def record(stack: LayerStack, forward: Callable[[], object]) -> tuple[Recorded, object]:
    """Run forward() (the model's whole pass) with the stack's calls recorded; returns them and forward's result."""
    calls: list = [None] * len(stack.layers)
    heads: list = [None] * len(stack.layers)

    def keep_call(layer: int, args: tuple, kwargs: dict) -> None:
        calls[layer] = (args, kwargs)

    def keep_input(layer: int, args: tuple, kwargs: dict) -> None:
        heads[layer] = args[0].detach().clone()

    handles = hook_layers(stack.layers, keep_call) + hook_layers(stack.projections, keep_input)
    try:
        result = forward()
    finally:
        for handle in handles:
            handle.remove()
    if any(call is None for call in calls) or any(head is None for head in heads):
        raise RuntimeError("the forward pass did not call every layer of the stack")
    return Recorded(calls, heads), result


def run_from(
    stack: LayerStack, layer: int, hidden: torch.Tensor, recorded: Recorded, heads=None, output=None
) -> torch.Tensor:
    """The stack's output (B, N, D) (what the model makes of it: Recorded.rest) when hidden (B, N, D) enters layer `layer`: that layer and the ones after it,
    each called with its recorded arguments (a tensor of batch 1 among them broadcast to B: the mask, the
    positions, an encoder's output), then the final norm; the layers before it do not run. heads(x), when given,
    changes what enters layer `layer`'s W_o: x (B, N, H * d), every head's output side by side. output, when
    given, is (module, change): change(y) replaces what the module (one of layer `layer`'s projections: its
    W_q, W_k, W_v) gives at its first call, y (B, N, features) (analysis/patching.py)."""
    batch = hidden.shape[0]
    handles = []
    if heads is not None:  # layer `layer`'s call only: ALBERT's later layers share its W_o
        handles.append(stack.projections[layer].register_forward_pre_hook(_first_call(lambda args: (heads(args[0]), *args[1:]))))
    if output is not None:
        module, change = output
        handles.append(module.register_forward_hook(_first_call(lambda args, y: change(y))))
    try:
        for index in range(layer, len(stack.layers)):
            args, kwargs = _batched(recorded.calls[index], batch)
            if args:
                hidden = stack.layers[index](hidden, *args[1:], **kwargs)
            else:
                hidden = stack.layers[index](**{**kwargs, "hidden_states": hidden})
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    finally:
        for handle in handles:
            handle.remove()
    hidden = hidden if stack.final is None else stack.final(hidden)
    return hidden if recorded.rest is None else recorded.rest(hidden)


def _first_call(change):
    """A hook (module, *given) -> change(*given) at its first call, None (nothing changed) at the later ones."""
    done = []

    def hook(module, *given):
        if not done:
            done.append(True)
            return change(*given)
        return None

    return hook


def _batched(call: tuple[tuple, dict], batch: int) -> tuple[tuple, dict]:
    """A recorded call's arguments with every tensor of batch 1 (2 dimensions or more) expanded to `batch`, a view."""

    def grown(value):
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == 1 and batch > 1:
            return value.expand(batch, *value.shape[1:])
        if isinstance(value, tuple):
            return tuple(grown(part) for part in value)
        return value

    args, kwargs = call
    return tuple(grown(value) for value in args), {name: grown(value) for name, value in kwargs.items()}

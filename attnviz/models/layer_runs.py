"""A stack of layers run one by one, from any layer on, with one layer's heads changed (analysis/effect.py).

One forward pass of the model records how each layer was called (its arguments: the hidden state entering it,
the mask, the positions, T5's position bias) and what entered each layer's output projection W_o (every head's
output side by side): models/capture.py's roles calls and z_merged, as Recorded. A batch of copies of what
entered layer L can then run through layers L, L+1, ... with those very arguments, and the stack's final norm, as
the model would have run them: the layers before L do not run again. The same for attnviz's BERT and transformers' models of every family.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop


@dataclass
class LayerStack:
    """A stack's layers in the order they run (a module shared by several layers, ALBERT's, is listed for each),
    each layer's output projection W_o, and the norm after the last layer (None: the last layer's output is the
    stack's)."""

    layers: list[nn.Module]
    projections: list[nn.Module]
    final: nn.Module | None = None


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

    def for_gradients(self) -> "Recorded":
        """The same calls with every tensor copied out of inference mode (a pass recorded under torch.inference_mode
        holds tensors autograd cannot save for a backward pass: the mask, RoPE's cos and sin): analysis/edges.py's
        differentiated run."""

        def copied(value):
            if isinstance(value, torch.Tensor):
                return value.clone()
            if isinstance(value, tuple):
                return tuple(copied(part) for part in value)
            return value

        calls = [(tuple(copied(value) for value in args), {name: copied(value) for name, value in kwargs.items()}) for args, kwargs in self.calls]
        return Recorded(calls, self.heads, self.rest)


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


def differentiable_run(
    stack: LayerStack, hidden: torch.Tensor, recorded: Recorded, hooks=lambda: [], recomputed: bool = False
) -> torch.Tensor:
    """run_from from layer 0 with autograd on (analysis/edges.py differentiates the metric): hidden (B, N, D) enters
    the first layer, the layers run with recorded's calls copied out of inference mode (Recorded.for_gradients);
    hooks() installs the caller's hooks and returns their handles, removed after. The caller holds the model.
    recomputed: each layer run under torch's activation checkpointing, so that the graph keeps none of what a layer
    saved for its backward (its weights among it: a model read a layer's weights at a time holds one layer's), the
    backward pass running each layer again, its weights read again, as it reaches it. Each layer runs to its end there
    (no early stop): where the layer's forward ends, its weights are let go (layer_weights.load_layer_at_a_time)."""
    if recomputed:
        layers = [functools.partial(checkpoint, layer, use_reentrant=False) for layer in stack.layers]
        stack = LayerStack(layers, stack.projections, stack.final)
    with torch.inference_mode(False), torch.enable_grad(), set_checkpoint_early_stop(False):
        handles = hooks()
        try:
            return run_from(stack, 0, hidden, recorded.for_gradients())
        finally:
            for handle in handles:
                handle.remove()


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

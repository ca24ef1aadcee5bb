"""A run's texts and each layer's input: the first half of the pipeline (attnviz/pipeline.py runs the layers).

The texts tokenized as the run's stack reads them (EncodedTexts), and what each layer's attention
runs over (LayerStates): for BERT its own encoder's hidden states, for the other families what
enters each attention module in transformers' forward pass; the device, the layer checked, and one
torch thread for a small run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnviz.errors import AttnvizError, option
from attnviz.models.loading import LoadedModel
from attnviz.models.tokens import Encoded, encode
from attnviz.spec import RunSpec

# A run over at most this many tokens (its padded batches' queries, keys and source together) uses one torch thread.
SMALL_RUN_TOKENS = 256


def resolve_device(requested: str) -> str:
    """'auto' means the GPU when torch sees one."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise AttnvizError(f"{option('device', 'cuda')}: torch sees no GPU on this machine; use {option('device', 'cpu')} or auto")
    if requested not in ("cpu", "cuda"):
        raise AttnvizError(f"unknown device {requested!r}: choose auto, cpu or cuda")
    return requested


def device_label(device: str) -> str:
    """'cpu', or 'cuda (NVIDIA H100 80GB HBM3)'."""
    return f"cuda ({torch.cuda.get_device_name()})" if device == "cuda" else device


def check_layer(loaded: LoadedModel, layer: int, stack: str | None = None) -> None:
    num_layers = loaded.num_layers_of(stack)
    if not 0 <= layer < num_layers:
        where = f"'s {'decoder' if stack in ('decoder', 'cross') else 'encoder'}" if stack else ""
        raise AttnvizError(f"layer {layer} is out of range: {loaded.name}{where} has layers 0 to {num_layers - 1}")


def threads_for(encoded: "EncodedTexts"):
    """threads_for_tokens over a run's texts as encoded: its padded batches' queries, keys and source together."""
    parts = (encoded.queries, encoded.keys, encoded.source)
    return threads_for_tokens(sum(part.input_ids.numel() for part in parts if part is not None))


@contextmanager
def threads_for_tokens(tokens: int) -> Iterator[None]:
    """attnviz's one rule for torch's threads: one thread for a small run (SMALL_RUN_TOKENS), the caller's count
    restored after it, even on an error; the API and the command line alike (a command sets no thread count).

    A dozen tokens make tensors so small that a second thread only adds waiting: each of torch's
    parallel regions waits for every thread, and while another process holds a core that is a
    time slice of the scheduler's (a warm attnviz.heads call: 0.02 s on a quiet machine, 0.4 s with
    one core busy; `attnviz heads` on 12 tokens, its report's traces and statistics on two threads: 2.2 s
    of CPU more, bench/RESULTS.md).
    """
    before = torch.get_num_threads()
    if tokens > SMALL_RUN_TOKENS or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class StreamParts:
    """What the residual stream entering a layer L is made of, from the capture's pass (analysis/why.py splits a score
    over them): the stream entering each layer 0 .. L (B, N, D), what entered each earlier layer's W_o (B, N, H d: the
    heads' outputs side by side), each earlier MLP's output (B, N, D), and for a post-norm encoder what entered its
    embeddings' norm (B, N, D)."""

    entering: dict[int, torch.Tensor]
    z_merged: dict[int, torch.Tensor]
    mlp: dict[int, torch.Tensor]
    embedded: torch.Tensor | None = None

    def cut(self, cut) -> "StreamParts":
        """Each tensor through cut (one text's rows of a padded batch)."""
        each = lambda tensors: {layer: cut(tensor) for layer, tensor in tensors.items()}  # noqa: E731
        return StreamParts(each(self.entering), each(self.z_merged), each(self.mlp), None if self.embedded is None else cut(self.embedded))


@dataclass
class LayerStates:
    """What one layer's attention runs over: queries' states (B, Nq, D), keys' (B, Nk, D), and T5's position bias;
    stream: the parts of the residual stream entering the layer, where the capture was asked for them (why's split)."""

    queries: torch.Tensor
    keys: torch.Tensor
    position_bias: torch.Tensor | None = None
    stream: StreamParts | None = None


@dataclass
class EncodedTexts:
    """A run's padded batches: the queries' texts; the keys' when they are another text (--kv, or an
    encoder-decoder's cross-attention: the source); and the source the encoder reads for the
    decoder and cross stacks."""

    queries: Encoded
    keys: Encoded | None = None
    source: Encoded | None = None


def encode_texts(loaded: LoadedModel, texts: list[str], spec: RunSpec) -> EncodedTexts:
    """The texts as the run's stack reads them (an encoder-decoder's decoder: shifted right), and the keys' text.

    Keys come from spec.kv_text (--kv: one text); for cross-attention without --kv, and for the
    decoder's self-attention, the encoder reads each text itself.
    """
    queries = encode(loaded.tokenizer_for(spec.stack), texts, loaded.max_positions, spec.truncate)
    keys = None
    if spec.kv_text is not None:
        keys = encode(loaded.tokenizer, [spec.kv_text], loaded.max_positions, spec.truncate)
    elif spec.stack in ("decoder", "cross"):
        keys = encode(loaded.tokenizer, texts, loaded.max_positions, spec.truncate)
    if spec.stack == "decoder":
        return EncodedTexts(queries, None, keys)
    return EncodedTexts(queries, keys, keys if spec.stack == "cross" else None)


# A capture: a run's texts encoded once (a padded batch) and every layer's input from one pass of the model (layer 0 to
# L - 1 of spec.stack, or the layers asked for). Every stage of a command reads it: the run, every layer's runs, the
# traces and the neuron view's vectors (passes.capture_texts makes it).
Capture = tuple["EncodedTexts", dict[int, LayerStates]]


def text_captures(capture: Capture) -> list[Capture]:
    """Each text's own capture, cut from a padded batch's: its encoding and each layer's input, its own tokens alone
    (a batch of one is its text's capture as it is). The cut tensors are contiguous copies, as a one-text batch's are;
    a self-attention layer's keys stay its queries' very tensor (a trace tells self-attention by it)."""
    encoded, states = capture
    count = len(encoded.queries.ids)
    if count == 1:
        return [capture]
    cut = []
    for i in range(count):
        own = EncodedTexts(*(_one_text(part, i, count) for part in (encoded.queries, encoded.keys, encoded.source)))
        num_queries = len(own.queries.ids[0])
        num_keys = len((own.keys or own.queries).ids[0])
        cut.append((own, {layer: _text_states(state, i, num_queries, num_keys) for layer, state in states.items()}))
    return cut


def _one_text(encoded: Encoded | None, i: int, count: int) -> Encoded | None:
    """Text i of a padded batch of count texts, alone; a part of one text (the --kv text) as it is."""
    if encoded is None or len(encoded.ids) != count:
        return encoded
    num_tokens = len(encoded.ids[i])
    return Encoded(
        input_ids=encoded.input_ids[i : i + 1, :num_tokens],  # (1, N_i)
        attention_mask=encoded.attention_mask[i : i + 1, :num_tokens],
        token_type_ids=encoded.token_type_ids[i : i + 1, :num_tokens],
        tokens=encoded.tokens[i : i + 1],
        ids=encoded.ids[i : i + 1],
        truncations=encoded.truncations[i : i + 1],
        shown=encoded.shown[i : i + 1],
    )


def _text_states(state: LayerStates, i: int, num_queries: int, num_keys: int) -> LayerStates:
    """Text i's rows of a layer's input: (1, Nq_i, D), (1, Nk_i, D), the bias (1, H, Nq_i, Nk_i)."""

    def own(tensor: torch.Tensor, num_tokens: int) -> torch.Tensor:
        return tensor[i : i + 1, :num_tokens].clone(memory_format=torch.contiguous_format)

    queries = own(state.queries, num_queries)
    keys = queries if state.keys is state.queries else own(state.keys, num_keys)
    bias = None if state.position_bias is None else state.position_bias[:, :, :num_queries, :num_keys].contiguous()
    stream = None if state.stream is None else state.stream.cut(lambda tensor: own(tensor, num_queries))
    return LayerStates(queries, keys, bias, stream)


def _model_inputs(encoded: Encoded, device: str, batch: int | None = None) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask on device; a one-text batch repeated `batch` times."""
    ids, mask = encoded.input_ids.to(device), encoded.attention_mask.to(device)
    if batch is not None and ids.shape[0] != batch:
        ids, mask = ids.expand(batch, -1), mask.expand(batch, -1)
    return {"input_ids": ids, "attention_mask": mask}


@torch.inference_mode()
def layer_states(
    loaded: LoadedModel, encoded: EncodedTexts, layers: list[int], spec: RunSpec, entered=lambda done: None
) -> dict[int, LayerStates]:
    """What each of `layers` attends with, over the queries' batch and, when given, the keys' text; entered(n) as n
    more of layers are reached by the queries' forward pass (its progress).

    BERT: its own encoder's hidden states. Other families: what enters each attention module in
    transformers' forward pass (the encoder reading encoded.source for an encoder-decoder's
    decoder and cross stacks).
    """
    device, stack, queries, keys = spec.device, spec.stack, encoded.queries, encoded.keys
    batch = len(queries.ids)
    if loaded.is_bert:
        states = layer_inputs(loaded, queries, device, max(layers))
        entered(len(layers))
        key_states = layer_inputs(loaded, keys, device, max(layers)) if keys is not None else states
        return {  # self-attention: the keys are the queries' very tensor (a trace tells self-attention by it)
            layer: LayerStates(states[layer], states[layer] if keys is None else key_states[layer].expand(batch, -1, -1))
            for layer in layers
        }
    model = loaded.model
    source = _model_inputs(encoded.source, device, batch) if encoded.source is not None else None
    captured = model.capture(_model_inputs(queries, device), layers, stack, source, entered)
    key_captured = None
    if keys is not None and stack != "cross":  # --kv on an encoder: the other text's own pass
        key_captured = model.capture(_model_inputs(keys, device), layers, stack)
    result = {}
    for layer in layers:
        hidden = captured[layer].hidden
        if stack == "cross":
            key_hidden = captured[layer].kv_hidden
        elif key_captured is not None:
            key_hidden = key_captured[layer].hidden.expand(batch, -1, -1)
        else:
            key_hidden = hidden
        bias = model.position_bias(stack, hidden.shape[1], key_hidden.shape[1], device)
        result[layer] = LayerStates(hidden, key_hidden, bias)
    return result


@torch.inference_mode()
def layer_input(loaded: LoadedModel, encoded: Encoded, layer: int, device: str) -> torch.Tensor:
    """The hidden state that enters BERT layer `layer`: (B, N, D). Layer 0 gets the embeddings."""
    return loaded.model(**encoded.model_inputs(device), num_layers=layer)[-1]


@torch.inference_mode()
def layer_inputs(loaded: LoadedModel, encoded: Encoded, device: str, last: int | None = None) -> list[torch.Tensor]:
    """The input of every BERT layer up to `last` (default: all) from one forward pass: element L (B, N, D) enters layer L."""
    last = loaded.num_layers - 1 if last is None else last
    return loaded.model(**encoded.model_inputs(device), num_layers=last)


@torch.inference_mode()
def embedding_output(loaded: LoadedModel, encoded: Encoded, device: str, positions: bool = True) -> torch.Tensor:
    """BERT's embedding output (B, N, D): LayerNorm(word + token type [+ position]).

    With positions=False the position embeddings are left out: attention over the result
    cannot tell word order, which is what `attnviz position` shows.
    """
    return loaded.model.embeddings(encoded.input_ids.to(device), encoded.token_type_ids.to(device), positions)

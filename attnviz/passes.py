"""Every layer's input from one pass of the model, and the passes that run attnviz's layer at every layer.

capture_texts and capture_states give each layer's input from one forward pass (layer_inputs.Capture), every stage of
a command reading it. Where attnviz's layers compute just what the model's attention does (its projections, heads and
mask: in_berts_place, in_models_place) they run in its place in that pass: layer L + 1's input is the model's finish
of attnviz's output at layer L, and blocks_in_place gives each layer's blocks of weights as the pass makes them
(docs/architecture.md, "One pass, one capture"). iter_layer_passes and iter_layer_blocks run every layer over such a
capture, whole or a block of queries at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch

from attnviz.attention.layer import MultiHeadAttention, rows_per_block
from attnviz.budgets import block_budget, memory_budget
from attnviz.layer_inputs import Capture, EncodedTexts, LayerStates, StreamParts, encode_texts, layer_input, layer_states, threads_for
from attnviz.models.capture import Wanted, capture
from attnviz.models.loading import LoadedModel
from attnviz.own_layer import build_layers
from attnviz.run_data import FORWARD_PASS, LAYERS_OF_THE_TEXT, Progress
from attnviz.spec import RunSpec, model_is_causal


@torch.inference_mode()
def capture_texts(
    loaded: LoadedModel, texts: list[str], spec: RunSpec, layers: list[int] | None = None, entered=lambda done: None, stream_of: int | None = None
) -> Capture:
    """The texts' capture (layer_inputs.Capture): encoded once as one padded batch, and the input of each of `layers`
    (default: every layer of spec.stack) from one pass of the model (capture_states, stream_of its), under threads_for."""
    encoded = encode_texts(loaded, texts, spec)
    layers = list(range(loaded.num_layers_of(spec.stack))) if layers is None else layers
    with threads_for(encoded):
        return encoded, capture_states(loaded, encoded, layers, spec, entered, stream_of)


@torch.inference_mode()
def capture_states(
    loaded: LoadedModel, encoded: EncodedTexts, layers: list[int], spec: RunSpec, entered=lambda done: None, stream_of: int | None = None
) -> dict[int, LayerStates]:
    """The input of each of `layers` from one pass of the model: layer_inputs.layer_states' (entered its progress), or
    where attnviz's layers run in the model's place (self-attention with the model's own projections, heads and mask)
    that pass's: layer L + 1's input is the model's finish of layer L's input and attnviz's output over it. BERT's
    (in_berts_place): the very states run_layers runs every layer over; a transformers model's (in_models_place,
    blocks_in_place, as far as the last of layers): those the summaries' pass of blocks_in_place reads. So a layer's
    run, every layer's runs (report, layers, stats), the summaries and the traces of a text read one pass's floats.

    stream_of: a layer of `layers` whose LayerStates also holds the parts of the residual stream entering it
    (layer_inputs.StreamParts, what analysis/why.py splits a score over), taken from the same pass, in place alone.
    """
    berts = in_berts_place(loaded, spec) and spec.kv_text is None
    if not (berts or in_models_place(loaded, spec)):
        if stream_of is not None:
            raise ValueError("the stream's parts are taken from a pass with attnviz's layers in the model's place")
        return layer_states(loaded, encoded, layers, spec, entered)
    last = max(layers)
    # the parts of the stream come from a whole pass (its every layer's MLP hooked): every layer attends
    attending = loaded.num_layers_of(spec.stack) if stream_of is not None else last
    attentions = build_layers(loaded, spec, attending)
    if not berts:
        return blocks_in_place(loaded, encoded, attentions, spec, block_budget(spec), keep=frozenset(layers), whole=False, entered=entered, stream_of=stream_of)
    valid_lens = encoded.queries.valid_lens.to(spec.device).expand(len(encoded.queries.ids))  # (B,)
    states, entering, z_merged = {}, {}, {}

    def run() -> None:
        hidden = layer_input(loaded, encoded.queries, 0, spec.device)  # (B, N, D): the embeddings
        for layer in range(len(attentions) + 1):
            entering[layer] = hidden
            if layer in layers:
                states[layer] = LayerStates(hidden, hidden)  # self-attention: the keys are the queries' very tensor
            if layer == len(attentions):
                return
            if stream_of is not None:  # what enters W_o kept: each head's share of the stream
                z_merged[layer] = in_place_heads(attentions[layer], hidden, valid_lens, spec)  # (B, N, H d)
                attended = attentions[layer].w_o(z_merged[layer])
            else:
                attended = in_place_output(attentions[layer], hidden, valid_lens, spec)
            hidden = loaded.model.encoder.layer[layer].finish(hidden, attended)

    if stream_of is None:
        run()
    else:  # each MLP's output and the embeddings' sum before their norm, from this pass's hooks
        captured = capture(loaded.model.hook_points(), run, Wanted(mlp=True, embedded=True))
        states[stream_of].stream = stream_parts(entering, z_merged, captured, stream_of)
    entered(len(layers))
    return states


def stream_parts(entering: dict, z_merged: dict, captured, layer: int) -> StreamParts:
    """The parts of the stream entering `layer` (layer_inputs.StreamParts): entering and z_merged by layer, and what
    captured (models.capture.Capture) holds of the MLPs and the embeddings' norm."""
    return StreamParts(
        {earlier: entering[earlier] for earlier in range(layer + 1)},
        {earlier: z_merged[earlier] for earlier in range(layer)},
        {earlier: captured.mlp[earlier] for earlier in range(layer)},
        captured.embedded,
    )


def in_place_heads(attention: MultiHeadAttention, hidden: torch.Tensor, valid_lens: torch.Tensor, spec: RunSpec) -> torch.Tensor:
    """What enters attnviz's layer's W_o over BERT's hidden state (B, N, D), in its place: every head's output side
    by side (B, N, H d), gathered from blocks of queries within the block budget."""
    rows = rows_per_block(block_budget(spec), hidden.shape[0], attention.num_heads, hidden.shape[1])
    blocks = attention.blocks(hidden, valid_lens=valid_lens, rows=rows, narrow=True, outputs="heads", reuse=True)
    return torch.cat([heads for _, heads, _ in blocks], dim=1).flatten(2)  # (B, N, H, d) -> (B, N, H d)


def in_place_output(attention: MultiHeadAttention, hidden: torch.Tensor, valid_lens: torch.Tensor, spec: RunSpec) -> torch.Tensor:
    """attnviz's layer's output over BERT's hidden state (B, N, D), in its place: whole, as iter_layer_passes runs it,
    where the batch's weights fit the memory budget (as layer_pass decides); else gathered from blocks of queries
    (cache-sized, as layer_pass takes them), no (B, H, N, N) whole."""
    batch, num_tokens = hidden.shape[:2]
    if rows_per_block(memory_budget(spec), batch, attention.num_heads, num_tokens) >= num_tokens:
        return attention(hidden, valid_lens=valid_lens)[0]  # (B, N, D)
    rows = rows_per_block(block_budget(spec), batch, attention.num_heads, num_tokens)
    blocks = attention.blocks(hidden, valid_lens=valid_lens, rows=rows, narrow=True, reuse=True)
    return torch.cat([output for _, output, _ in blocks], dim=1)  # (B, N, D)


def layer_stages(progress: Progress, num_layers: int, in_place: bool):
    """progress's stages of a pass over every layer: entered(n) as its forward pass reaches n more layers (layer_states';
    none in BERT's place, where each layer runs in turn), then done(n) as n more layers are done, the stage begun at
    the first."""
    if in_place:
        return (lambda count: None), progress.counting(LAYERS_OF_THE_TEXT, num_layers)
    entered, advance = progress.counting(FORWARD_PASS, num_layers), None

    def done(count: int) -> None:
        nonlocal advance
        advance = advance or progress.counting(LAYERS_OF_THE_TEXT, num_layers)  # the forward pass is over
        advance(count)

    return entered, done


def computes_models_attention(loaded: LoadedModel, spec: RunSpec) -> bool:
    """True when attnviz's layers compute just what the model's own attention does: with its projections (pretrained),
    split into its heads, under its own mask (causal for a decoder, none for an encoder)."""
    return spec.weights == "pretrained" and spec.num_heads in (None, loaded.num_heads) and spec.causal == model_is_causal(loaded, spec.stack)


def in_berts_place(loaded: LoadedModel, spec: RunSpec) -> bool:
    """True when attnviz's layers can run in attnviz's BERT's place (computes_models_attention): each layer in turn,
    the attention computed once, not twice."""
    return loaded.is_bert and computes_models_attention(loaded, spec)


def in_models_place(loaded: LoadedModel, spec: RunSpec) -> bool:
    """True when attnviz's layers can run in the place of a transformers model's one stack's attention (a decoder's or
    an encoder's: not an encoder-decoder's; self-attention) in its forward pass (blocks_in_place): computes_models_attention."""
    from attnviz.models.families import ENCODER_DECODER

    return not loaded.is_bert and loaded.family.kind != ENCODER_DECODER and spec.kv_text is None and computes_models_attention(loaded, spec)


@torch.inference_mode()
def blocks_in_place(
    loaded: LoadedModel,
    encoded: EncodedTexts,
    layers: list[MultiHeadAttention],
    spec: RunSpec,
    budget_bytes: int,
    each_block=None,
    keep: frozenset[int] = frozenset(),
    whole: bool = True,
    entered=lambda done: None,
    stream_of: int | None = None,
    maps_of: dict | None = None,
) -> dict[int, LayerStates]:
    """One forward pass of a transformers model with attnviz's layers in the place of its attention (in_models_place):
    each layer's blocks of queries (as many as rows_per_block allows for budget_bytes) computed once, their weights
    (B, H, b, K) given to each_block(layer, first query, weights), when given, as they are made (K as
    iter_layer_blocks' narrow blocks; valid during the call: the blocks' one buffer), and the heads' outputs going on
    through the model's W_o and the rest of its layer to the next one. Returns the input of each layer of keep, as
    this pass made it (entered(1) as each is reached); whole=False stops the pass there (layers holds the layers
    before the last of keep, at least).
    stream_of: a layer of keep whose LayerStates holds the parts of the stream entering it (capture_states'); the
    pass then runs whole (layers holds every layer). maps_of: layer -> pipeline.BlockMaps (pass_maps') that the layer's
    blocks fill, with their output after attnviz's W_o: that layer's run made from this pass (pipeline.runs_of_pass)."""
    valid_lens = encoded.queries.valid_lens.to(spec.device).expand(len(encoded.queries.ids))  # (B,)
    maps_of = maps_of or {}

    def attend(layer: int, hidden: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> the heads' outputs (B, N, H, d)
        attention = layers[layer]
        rows = rows_per_block(budget_bytes, hidden.shape[0], attention.num_heads, hidden.shape[1])
        heads = None  # (B, N, H, d), filled a block at a time: no list of blocks between the blocks' buffers, no copy
        for first_query, output, weights in attention.blocks(
            hidden, valid_lens=valid_lens, causal=spec.causal, rows=rows, narrow=True, outputs="heads", reuse=True
        ):
            if heads is None:
                heads = output.new_empty(output.shape[0], hidden.shape[1], *output.shape[2:])
            heads[:, first_query : first_query + output.shape[1]] = output  # (B, b, H, d)
            if each_block is not None:
                each_block(layer, first_query, weights)
            if layer in maps_of:  # the heads merged and through attnviz's W_o, as its forward's output
                maps_of[layer].add(first_query, attention.w_o(output.flatten(2)), weights)
        return heads

    with threads_for(encoded):
        kept = loaded.model.in_place_pass(encoded.queries.model_inputs(spec.device), attend, keep, whole, entered, parts=stream_of is not None)
    states = {layer: LayerStates(captured.hidden, captured.hidden) for layer, captured in kept.x.items()}
    if stream_of is not None:
        recorded = kept.recorded()
        entering = {layer: recorded.entering(layer) for layer in range(stream_of + 1)}
        states[stream_of].stream = stream_parts(entering, dict(enumerate(kept.z_merged)), kept, stream_of)
    return states


@torch.inference_mode()
def iter_layer_weights(
    loaded: LoadedModel,
    encoded: EncodedTexts,
    layers: list[MultiHeadAttention],
    spec: RunSpec,
    in_place: bool = False,
    entered=lambda done: None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per model layer, attnviz's layer over the padded batch: output (B, N, D) and weights (B, H, N, Nk).

    Each layer runs over the hidden state that enters that layer's attention. With in_place (see
    in_berts_place) attnviz's layer stands in for BERT's attention in the forward pass, and
    its output goes on through the rest of BERT's layer to the next.
    """
    for _, output, patterns in iter_layer_passes(loaded, encoded, layers, spec, in_place, entered):
        yield output, patterns


@torch.inference_mode()
def iter_layer_passes(
    loaded: LoadedModel,
    encoded: EncodedTexts,
    layers: list[MultiHeadAttention],
    spec: RunSpec,
    in_place: bool = False,
    entered=lambda done: None,
    states: dict[int, LayerStates] | None = None,
) -> Iterator[tuple[LayerStates, torch.Tensor, torch.Tensor]]:
    """iter_layer_weights with what each layer ran over: its LayerStates, output (B, N, D), weights (B, H, N, Nk);
    entered: the progress of the forward pass that gives every layer's input (layer_states'), not in place; states:
    every layer's input, already captured (each is let go once used), not in place."""
    device = spec.device
    keys = encoded.keys if encoded.keys is not None else encoded.queries
    valid_lens = keys.valid_lens.to(device).expand(len(encoded.queries.ids))  # (B,)
    # Each step in threads_for, each yield outside it: the caller's code between layers keeps its own threads.
    if not in_place:
        if states is None:
            with threads_for(encoded):
                states = capture_states(loaded, encoded, list(range(len(layers))), spec, entered)
        for layer, attention in enumerate(layers):
            state = states.pop(layer)  # let each layer's states go once used
            with threads_for(encoded):
                output, patterns = attention(
                    state.queries, state.keys, state.keys, valid_lens=valid_lens, causal=spec.causal, position_bias=state.position_bias
                )
            yield state, output, patterns
        return
    with threads_for(encoded):
        hidden = layer_input(loaded, encoded.queries, 0, device)  # (B, N, D): the embeddings
    for layer, attention in enumerate(layers):
        with threads_for(encoded):
            if layer:
                hidden = loaded.model.encoder.layer[layer - 1].finish(hidden, output)  # enters this layer
            output, patterns = attention(hidden, valid_lens=valid_lens)
        yield LayerStates(hidden, hidden), output, patterns


@torch.inference_mode()
def iter_layer_blocks(
    loaded: LoadedModel,
    encoded: EncodedTexts,
    layers: list[MultiHeadAttention],
    spec: RunSpec,
    budget_bytes: int,
    in_place: bool = False,
    states: dict[int, LayerStates] | None = None,
    skip: frozenset[int] = frozenset(),
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """iter_layer_weights a block of queries at a time: (layer, first query, weights (B, H, b, K)), layer by layer.

    Each block holds as many queries as rows_per_block allows for budget_bytes, so no layer's
    (B, H, N, Nk) weights are ever whole; K is Nk, or under a causal mask the block's last query + 1 (the
    keys past it have weight 0: MultiHeadAttention.blocks' narrow). One forward pass gives every layer's input, as in
    iter_layer_passes; with in_place each layer's output, gathered from its blocks ((B, N, D), not
    the weights), goes on through the rest of BERT's layer to the next. states: every layer's input, already
    captured (layer_states; each is let go once used), else captured here. skip: layers whose blocks are not
    wanted (not with in_place, where each layer's output is the next one's input); in place, states may hold layer 0's
    input alone (the embeddings, captured already). A block's weights are valid until the next block is taken (the
    blocks' one buffer: MultiHeadAttention.blocks' reuse): use or copy them before.
    """
    device = spec.device
    keys = encoded.keys if encoded.keys is not None else encoded.queries
    batch = len(encoded.queries.ids)
    valid_lens = keys.valid_lens.to(device).expand(batch)  # (B,)
    if in_place:
        with threads_for(encoded):
            hidden = states[0].queries if states else layer_input(loaded, encoded.queries, 0, device)  # (B, N, D): the embeddings
    elif states is None:
        with threads_for(encoded):
            states = capture_states(loaded, encoded, list(range(len(layers))), spec)
    for layer, attention in enumerate(layers):
        if in_place:
            state = LayerStates(hidden, hidden)
        else:
            state = states.pop(layer)  # let each layer's states go once used
            if layer in skip:
                continue
        rows = rows_per_block(budget_bytes, batch, attention.num_heads, state.keys.shape[1])
        blocks = attention.blocks(
            state.queries, state.keys, state.keys,
            valid_lens=valid_lens, causal=spec.causal, position_bias=state.position_bias, rows=rows, narrow=True, outputs=in_place,
            reuse=True,
        )  # fmt: skip
        outputs = []
        while True:
            with threads_for(encoded):
                block = next(blocks, None)
            if block is None:
                break
            first_query, output, weights = block
            if in_place:
                outputs.append(output)  # (B, b, D)
            yield layer, first_query, weights
        if in_place and layer + 1 < len(layers):
            with threads_for(encoded):
                hidden = loaded.model.encoder.layer[layer].finish(hidden, torch.cat(outputs, dim=1))  # enters the next layer

"""From text to attention: tokenize, take a model layer's input, run attnviz's own layer.

With pretrained weights our layer gets the query, key, value and output projections of
layer L and that layer's input (for BERT's L = 0, its embedding output; for the other families,
what enters the attention module, after the family's own norms), so its weights are the model's
own attention pattern. With random weights it is a fresh layer, as in the tutorials.
For every layer at once (stats, layers), one forward pass gives each layer's input; with
BERT's own projections and heads our layers stand in for BERT's attention in that pass.

Every run takes its settings whole, as a RunSpec (attnviz.spec). The stage between models,
layer_inputs (the texts tokenized and each layer's input) and attention below, and analysis and
trace above (the stats loop, measure_heads, is in analysis).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch

from attnviz.attention.layer import MultiHeadAttention, check_num_heads, check_split, layer_from_weights, rows_per_block
from attnviz.attention.query_blocks import QueryBlock
from attnviz.budgets import LARGE_MAP_BYTES, block_budget, memory_budget
from attnviz.layer_inputs import Capture, EncodedTexts, LayerStates, check_layer, encode_texts, layer_input, layer_states, threads_for
from attnviz.models.loading import LoadedModel
from attnviz.models.tokens import Encoded, text_notes, truncation_notes, unknown_tokens
from attnviz.models.words import merge_run, run_words
from attnviz.run_data import FORWARD_PASS, LAYERS_OF_THE_TEXT, AttentionRun, Progress, QueryKeyVectors
from attnviz.spec import RunSpec, model_is_causal

# Texts per forward pass. The weights of a batch are (B, H, N, N) floats: for 32 texts of
# 512 tokens and 12 heads that is 400 MB, the most we want to hold at once.
BATCH_SIZE = 32


def batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def layer_from_bert(bert_layer, num_heads: int) -> MultiHeadAttention:
    """Our layer with the projections of one BertLayer copied in, split into num_heads heads."""
    return layer_from_weights(bert_layer.attention_weights(), num_heads)


def random_layer(model_size: int, num_heads: int, seed: int) -> MultiHeadAttention:
    """A fresh layer, the same for the same seed on any device (it is built on the CPU)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(model_size, num_heads, bias=True)


def build_layer(loaded: LoadedModel, spec: RunSpec) -> MultiHeadAttention:
    """attnviz's layer for spec.layer: BERT's projections or random ones from spec.seed, split into spec.num_heads.

    Its parameters are one layer's projections copied (layer_from_weights), never the whole model,
    cast to the model's dtype (random ones are drawn in float32 first, the same for every dtype).
    """
    num_heads = resolve_num_heads(loaded, spec.num_heads, spec.stack)
    if spec.weights == "random":  # a fresh layer of the tutorials' kind: RunSpec admits no other
        attention = random_layer(loaded.hidden_size, num_heads, spec.seed)
    elif loaded.is_bert:
        attention = layer_from_bert(loaded.model.encoder.layer[spec.layer], num_heads)
    else:
        attention = layer_from_weights(loaded.model.attention_weights(spec.layer, spec.stack), num_heads)
    return attention.to(spec.device, getattr(torch, loaded.dtype)).eval()  # in the model's dtype, as its own layer is


def resolve_num_heads(loaded: LoadedModel, num_heads: int | None, stack: str | None = None) -> int:
    """--heads: the model's own count when not given; a count given (0 too) must split the projections.

    For BERT and random parameters it must divide the model size; for the other families
    check_split also keeps grouped-query attention's groups whole and RoPE's pairs of features.
    """
    if num_heads is None:
        return loaded.num_heads_of(stack)
    if loaded.is_bert:
        check_num_heads(loaded.hidden_size, num_heads)
    else:
        check_split(loaded.model.attention_weights(0, stack), num_heads)
    return num_heads


def build_layers(loaded: LoadedModel, spec: RunSpec) -> list[MultiHeadAttention]:
    """attnviz's layer for every layer of spec.stack, in order (spec.layer is not used)."""
    return [build_layer(loaded, replace(spec, layer=layer)) for layer in range(loaded.num_layers_of(spec.stack))]


class LayerPass(NamedTuple):
    """One layer's pass over a padded batch: the layer, the texts, its input and what it returned.

    output and patterns are the padded batch's tensors, (B, Nq, D) and (B, H, Nq, Nk); from
    layer_pass(..., in_blocks=True) past the memory budget, each text's own arrays instead,
    (Nq_i, D) and (H, Nq_i, Nk_i), a map past the large-map size a read-only memmap of a temporary .npy.
    """

    attention: MultiHeadAttention
    encoded: EncodedTexts
    states: LayerStates
    keys: Encoded  # the keys' texts: encoded.keys with --kv, else encoded.queries
    output: torch.Tensor | list[np.ndarray]
    patterns: torch.Tensor | list[np.ndarray]
    vectors: list[QueryKeyVectors | None] | None = None  # each text's q and k (layer_pass' vector_tokens), else None


@torch.inference_mode()
def layer_pass(
    loaded: LoadedModel,
    texts: list[str],
    spec: RunSpec,
    in_blocks: bool = False,
    captured: tuple[EncodedTexts, LayerStates] | None = None,
    each_block=None,
    vector_tokens: int = 0,
) -> LayerPass:
    """attnviz's layer spec.layer over a padded batch of texts, on that layer's real input.

    With spec.kv_text, queries come from each text and keys and values from kv_text (for an
    encoder-decoder's cross-attention, the source the encoder reads). in_blocks: when the
    batch's weights pass the memory budget (memory_budget) or a text's map passes the large-map
    size, the layer runs a block of queries at a time and each block goes straight into its
    text's array (block_maps); within both, the one block is today's whole tensor. captured: the texts'
    encoding and the layer's input, already captured by a pass that goes on through other layers (no capture here).
    each_block(first query, weights (B, H, b, K)), when given, gets each block of a run in blocks too, as it is made.
    vector_tokens: each text of at most this many queries and keys keeps its q and k (text_vectors).
    """
    check_layer(loaded, spec.layer, spec.stack)
    encoded = encode_texts(loaded, texts, spec) if captured is None else captured[0]
    keys = encoded.keys if encoded.keys is not None else encoded.queries
    with threads_for(encoded):  # the layer's weights copied and checked too: as much work as the run, for a short text
        attention = build_layer(loaded, spec)
        states = capture_states(loaded, encoded, [spec.layer], spec)[spec.layer] if captured is None else captured[1]
        valid_lens = keys.valid_lens.to(spec.device).expand(len(texts))  # (B,)
        budget = memory_budget(spec)
        batch, num_queries, num_keys = len(texts), states.queries.shape[1], states.keys.shape[1]
        rows = rows_per_block(budget, batch, attention.num_heads, num_keys)
        large = min(LARGE_MAP_BYTES, budget)
        sizes = [(len(encoded.queries.ids[i]), len(keys.ids[0 if spec.kv_text is not None else i])) for i in range(batch)]
        if in_blocks and (rows < num_queries or any(4 * attention.num_heads * q * k > large for q, k in sizes)):
            rows = rows_per_block(block_budget(spec), batch, attention.num_heads, num_keys)  # cache-sized blocks on the CPU
            blocks = attention.blocks(
                states.queries, states.keys, states.keys,
                valid_lens=valid_lens, causal=spec.causal, position_bias=states.position_bias, rows=rows, narrow=True,
            )  # fmt: skip
            output, patterns = block_maps(blocks, sizes, attention.num_heads, large, each_block)
            vectors = text_vectors(attention, states, sizes, vector_tokens)
            return LayerPass(attention, encoded, states, keys, output, patterns, vectors)
        projected = QueryBlock(0, *attention.project(states.queries, states.keys, states.keys))  # (B, H, N, d) each
        output, patterns = attention(
            valid_lens=valid_lens, causal=spec.causal, position_bias=states.position_bias, block=projected
        )  # (B, Nq, D), (B, H, Nq, Nk)
        vectors = text_vectors(attention, states, sizes, vector_tokens, projected)
    return LayerPass(attention, encoded, states, keys, output, patterns, vectors)


def text_vectors(
    attention: MultiHeadAttention, states: LayerStates, sizes: list[tuple[int, int]], vector_tokens: int, projected=None
) -> list[QueryKeyVectors | None] | None:
    """Each text's q (H, Nq_i, d) and k (H_kv, Nk_i, d) where it has at most vector_tokens queries and keys (else None);
    None for every text when vector_tokens is 0.

    A batch of one text takes them from `projected`, the projection its map was made of, when given: the neuron
    view's q · k is then the map's own score. In a padded batch each text's own rows are projected alone, so a text
    has the same vectors whatever batch it runs in.
    """
    if not vector_tokens:
        return None
    vectors = []
    for i, (num_queries, num_keys) in enumerate(sizes):
        if max(num_queries, num_keys) > vector_tokens:
            vectors.append(None)
            continue
        if len(sizes) == 1 and projected is not None:
            q, k = projected.q, projected.k  # (1, H, Nq, d), (1, H, Nk, d): repeated for the query heads
        else:
            queries = states.queries[i : i + 1, :num_queries]  # (1, Nq_i, D)
            keys = queries if states.keys is states.queries else states.keys[i : i + 1, :num_keys]  # (1, Nk_i, D)
            q, k, _ = attention.project(queries, keys, keys)
        group = attention.group_size
        vectors.append(
            QueryKeyVectors(
                q=q[0].float().cpu().numpy(),  # (H, Nq, d)
                k=k[0, ::group].float().cpu().numpy(),  # (H_kv, Nk, d): one per key/value head
                scale=float(attention.scale),
                group_size=group,
                position_bias=states.position_bias is not None,
            )
        )
    return vectors


def block_maps(blocks, sizes: list[tuple[int, int]], num_heads: int, large: int, each_block=None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each text's output (Nq_i, D) and weights (H, Nq_i, Nk_i) from the layer's blocks (first query, (B, b, D), (B, H, b, K)).

    sizes: each text's (Nq_i, Nk_i). A block's weights may stop at K keys (MultiHeadAttention.blocks' narrow: a causal
    block's later keys have weight 0), and the maps hold 0 past them. A map of more than `large` bytes is written block
    by block into a .npy in a temporary folder of its own (run_data.MapFile, whose zeros are never written) and comes
    back as a read-only memmap of it; the others are arrays in memory. No (B, H, Nq, Nk) tensor is ever whole.
    each_block(first query, weights), when given, gets each block's weights (a tensor) first.
    """
    from attnviz.run_data import MapFile

    outputs: list[np.ndarray | None] = [None] * len(sizes)
    maps = [MapFile((num_heads, q, k)) if 4 * num_heads * q * k > large else np.zeros((num_heads, q, k), np.float32) for q, k in sizes]
    for start, output, weights in blocks:
        if each_block is not None:
            each_block(start, weights)
        output, weights = output.float().cpu().numpy(), weights.float().cpu().numpy()  # (B, b, D), (B, H, b, K)
        for i, (num_queries, num_keys) in enumerate(sizes):
            stop = min(start + weights.shape[2], num_queries)
            if stop <= start:  # padding queries of a shorter text
                continue
            if outputs[i] is None:
                outputs[i] = np.empty((num_queries, output.shape[-1]), np.float32)
            outputs[i][start:stop] = output[i, : stop - start]
            width = min(weights.shape[3], num_keys)
            maps[i][:, start:stop, :width] = weights[i, :, : stop - start, :width]
    return outputs, [each.finish() if isinstance(each, MapFile) else each for each in maps]


def run_attention(
    loaded: LoadedModel,
    texts: list[str],
    spec: RunSpec,
    captured: tuple[EncodedTexts, LayerStates] | None = None,
    each_block=None,
    vector_tokens: int = 0,
) -> list[AttentionRun]:
    """Run attnviz's layer over a padded batch of texts with spec's settings (layer_pass, captured, each_block and
    vector_tokens as there); one AttentionRun per text, with its vectors where kept (over tokens: not with spec.words)."""
    done = layer_pass(loaded, texts, spec, in_blocks=True, captured=captured, each_block=each_block, vector_tokens=vector_tokens)
    sizes = layer_sizes(done.attention)
    runs = split_runs(loaded, texts, done.encoded.queries, done.keys, done.output, done.patterns, spec, spec.layer, *sizes)
    if done.vectors is None or spec.words:
        return runs
    return [replace(run, vectors=vectors) for run, vectors in zip(runs, done.vectors)]


@torch.inference_mode()
def capture_texts(loaded: LoadedModel, texts: list[str], spec: RunSpec, layers: list[int] | None = None, entered=lambda done: None) -> Capture:
    """The texts' capture (layer_inputs.Capture): encoded once as one padded batch, and the input of each of `layers`
    (default: every layer of spec.stack) from one pass of the model (capture_states), under threads_for."""
    encoded = encode_texts(loaded, texts, spec)
    layers = list(range(loaded.num_layers_of(spec.stack))) if layers is None else layers
    with threads_for(encoded):
        return encoded, capture_states(loaded, encoded, layers, spec, entered)


@torch.inference_mode()
def capture_states(
    loaded: LoadedModel, encoded: EncodedTexts, layers: list[int], spec: RunSpec, entered=lambda done: None
) -> dict[int, LayerStates]:
    """The input of each of `layers` from one pass of the model: layer_inputs.layer_states' (entered its progress), or
    where attnviz's layers run in the model's place (self-attention with the model's own projections, heads and mask)
    that pass's: layer L + 1's input is the model's finish of layer L's input and attnviz's output over it. BERT's
    (in_berts_place): the very states run_layers runs every layer over; a transformers model's (in_models_place,
    blocks_in_place, as far as the last of layers): those the summaries' pass of blocks_in_place reads. So a layer's
    run, every layer's runs (report, layers, stats), the summaries and the traces of a text read one pass's floats.
    """
    berts = in_berts_place(loaded, spec) and spec.kv_text is None
    if not (berts or in_models_place(loaded, spec)):
        return layer_states(loaded, encoded, layers, spec, entered)
    last = max(layers)
    attentions = [build_layer(loaded, replace(spec, layer=layer)) for layer in range(last)]
    if not berts:
        return blocks_in_place(loaded, encoded, attentions, spec, block_budget(spec), keep=frozenset(layers), whole=False, entered=entered)
    valid_lens = encoded.queries.valid_lens.to(spec.device).expand(len(encoded.queries.ids))  # (B,)
    hidden = layer_input(loaded, encoded.queries, 0, spec.device)  # (B, N, D): the embeddings
    states = {}
    for layer in range(last + 1):
        if layer in layers:
            states[layer] = LayerStates(hidden, hidden)  # self-attention: the keys are the queries' very tensor
        if layer < last:
            hidden = loaded.model.encoder.layer[layer].finish(hidden, in_place_output(attentions[layer], hidden, valid_lens, spec))
    entered(len(layers))
    return states


def in_place_output(attention: MultiHeadAttention, hidden: torch.Tensor, valid_lens: torch.Tensor, spec: RunSpec) -> torch.Tensor:
    """attnviz's layer's output over BERT's hidden state (B, N, D), in its place: whole, as iter_layer_passes runs it,
    where the batch's weights fit the memory budget (as layer_pass decides); else gathered from blocks of queries
    (cache-sized, as layer_pass takes them), no (B, H, N, N) whole."""
    batch, num_tokens = hidden.shape[:2]
    if rows_per_block(memory_budget(spec), batch, attention.num_heads, num_tokens) >= num_tokens:
        return attention(hidden, valid_lens=valid_lens)[0]  # (B, N, D)
    rows = rows_per_block(block_budget(spec), batch, attention.num_heads, num_tokens)
    blocks = attention.blocks(hidden, valid_lens=valid_lens, rows=rows, narrow=True)
    return torch.cat([output for _, output, _ in blocks], dim=1)  # (B, N, D)


@torch.inference_mode()
def iter_layer_runs(
    loaded: LoadedModel, texts: list[str], spec: RunSpec, entered=lambda done: None, captured: Capture | None = None
) -> Iterator[list[AttentionRun]]:
    """attnviz's layer in place of every model layer over a padded batch: per layer, one run per text.

    spec.layer and spec.kv_text are not used (self-attention of spec.stack). One forward pass gives
    every layer's input; layer L's run of a text is what run_attention with layer L gives for it.
    Layer by layer, so that a caller who only needs numbers holds one layer's weights at a time;
    each run holds a copy of its text's unpadded weights. entered: the forward pass's progress (layer_states').
    captured: the texts' capture of every layer (capture_texts'), read in place of a pass of the model.
    """
    spec = replace(spec, kv_text=None)
    in_place = in_berts_place(loaded, spec) and captured is None
    encoded = encode_texts(loaded, texts, spec) if captured is None else captured[0]
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    keys = encoded.keys if encoded.keys is not None else encoded.queries
    states = None if captured is None else dict(captured[1])  # the caller's capture is not emptied
    passes = iter_layer_passes(loaded, encoded, layers, spec, in_place, entered, states)
    for layer, (_, output, patterns) in enumerate(passes):
        yield split_runs(loaded, texts, encoded.queries, keys, output, patterns, spec, layer, *layer_sizes(layers[layer]))


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


def layer_sizes(attention: MultiHeadAttention) -> tuple[int, int, int]:
    """The heads, key/value heads and H * d of a layer: what split_runs records with each run."""
    return attention.num_heads, attention.num_kv_heads, attention.num_heads * attention.head_dim


def in_berts_place(loaded: LoadedModel, spec: RunSpec) -> bool:
    """True when attnviz's layers compute just what BERT's own attention does.

    That is with BERT's projections (pretrained), split into BERT's heads, without a causal
    mask: then each layer can run in BERT's place and the attention is computed once, not twice.
    """
    return loaded.is_bert and spec.weights == "pretrained" and spec.num_heads in (None, loaded.num_heads) and not spec.causal


def in_models_place(loaded: LoadedModel, spec: RunSpec) -> bool:
    """True when attnviz's layers compute just what the attention of a transformers model's one stack does (a decoder's
    or an encoder's: not an encoder-decoder's), so that they can run in its place (blocks_in_place): its projections
    (pretrained), split into its heads, under its own mask (causal for a decoder, none for an encoder), self-attention."""
    from attnviz.models.families import ENCODER_DECODER

    return (
        not loaded.is_bert and loaded.family.kind != ENCODER_DECODER and spec.weights == "pretrained" and spec.kv_text is None
        and spec.num_heads in (None, loaded.num_heads) and spec.causal == model_is_causal(loaded, spec.stack)
    )  # fmt: skip


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
) -> dict[int, LayerStates]:
    """One forward pass of a transformers model with attnviz's layers in the place of its attention (in_models_place):
    each layer's blocks of queries (as many as rows_per_block allows for budget_bytes) computed once, their weights
    (B, H, b, K) given to each_block(layer, first query, weights), when given, as they are made (K as
    iter_layer_blocks' narrow blocks), and the heads' outputs going on through the model's W_o and the rest of its
    layer to the next one. Returns the input of each layer of keep, as this pass made it (entered(1) as each is
    reached); whole=False stops the pass there (layers holds the layers before the last of keep, at least)."""
    valid_lens = encoded.queries.valid_lens.to(spec.device).expand(len(encoded.queries.ids))  # (B,)

    def attend(layer: int, hidden: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> the heads' outputs (B, N, H, d)
        attention = layers[layer]
        rows = rows_per_block(budget_bytes, hidden.shape[0], attention.num_heads, hidden.shape[1])
        heads = []
        for first_query, output, weights in attention.blocks(
            hidden, valid_lens=valid_lens, causal=spec.causal, rows=rows, narrow=True, outputs="heads"
        ):
            heads.append(output)  # (B, b, H, d)
            if each_block is not None:
                each_block(layer, first_query, weights)
        return torch.cat(heads, dim=1)

    with threads_for(encoded):
        kept = loaded.model.in_place_pass(encoded.queries.model_inputs(spec.device), attend, keep, whole, entered)
    return {layer: LayerStates(captured.hidden, captured.hidden) for layer, captured in kept.items()}


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
    input alone (the embeddings, captured already).
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


def run_layers(
    loaded: LoadedModel, texts: list[str], spec: RunSpec, progress: Progress = Progress(), captured: Capture | None = None
) -> list[list[AttentionRun]]:
    """Every layer's run of every text, runs[text][layer], as iter_layer_runs gives them; progress: layer_stages'.
    captured: the texts' capture of every layer (capture_texts'): the layers run over it, the model is not run."""
    no_pass = in_berts_place(loaded, spec) or captured is not None  # no forward pass to count before the layers
    entered, done = layer_stages(progress, loaded.num_layers_of(spec.stack), no_pass)
    by_layer = []  # by_layer[layer][text]
    for runs in iter_layer_runs(loaded, texts, spec, entered, captured):
        by_layer.append(runs)
        done(1)
    return [list(text_runs) for text_runs in zip(*by_layer)]


def split_runs(
    loaded: LoadedModel,
    texts: list[str],
    queries: Encoded,
    keys: Encoded,
    output: torch.Tensor,
    patterns: torch.Tensor,
    spec: RunSpec,
    layer: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    inner_size: int | None = None,
) -> list[AttentionRun]:
    """One AttentionRun per text from a padded batch's output (B, Nq, D) and weights (B, H, Nq, Nk),
    or from each text's own output (Nq_i, D) and weights (H, Nq_i, Nk_i) (layer_pass in blocks), taken as they are.

    Each run holds a copy of its own unpadded block, so a caller may drop the batch. keys holds
    one text (spec.kv_text) for cross-attention, else the same texts as queries. layer and
    num_heads are the run's (spec may leave them to the model: None).
    """
    kv_text = spec.kv_text
    padded = isinstance(patterns, torch.Tensor)  # else each text's own arrays already
    if padded:
        output, patterns = output.float().cpu().numpy(), patterns.float().cpu().numpy()
    runs = []
    for i, text in enumerate(texts):
        query_ids = queries.ids[i]
        key_index = 0 if kv_text is not None else i
        key_ids = keys.ids[key_index]
        own_texts = [text, kv_text] if kv_text else [text]
        notes = text_notes(loaded, own_texts, [query_ids, key_ids], ["the text", "the --kv text"])
        truncated = queries.truncations[i]
        kv_truncated = keys.truncations[0] if kv_text is not None else None
        notes += truncation_notes([text], [truncated])
        notes += truncation_notes([kv_text], [kv_truncated], "the --kv text")
        runs.append(
            AttentionRun(
                text=text,
                kv_text=kv_text,
                model=loaded.name,
                query_tokens=queries.tokens[i],
                key_tokens=keys.tokens[key_index],
                query_shown=queries.shown[i],
                key_shown=keys.shown[key_index],
                query_ids=query_ids,
                key_ids=key_ids,
                attention=patterns[i, :, : len(query_ids), : len(key_ids)].copy() if padded else patterns[i],  # (H, Nq_i, Nk_i)
                output=output[i, : len(query_ids)].copy() if padded else output[i],  # (Nq_i, D)
                notes=notes,
                truncated=truncated,
                kv_truncated=kv_truncated,
                layer=layer,
                weights=spec.weights,
                num_heads=num_heads,
                device=spec.device,
                dtype=spec.dtype,
                causal=spec.causal,
                family=loaded.family.name,
                stack=spec.stack,
                model_causal=model_is_causal(loaded, spec.stack),
                num_kv_heads=num_kv_heads,
                inner_size=inner_size,
                unknown=unknown_tokens(loaded.tokenizer, query_ids),
                kv_unknown=unknown_tokens(loaded.tokenizer, key_ids) if kv_text is not None else None,
                fallback_for=loaded.fallback_for,
                model_heads=loaded.num_heads_of(spec.stack),
                quantisation=loaded.quantisation,
            )
        )
    return over_words(loaded, spec, runs) if spec.words else runs


def over_words(loaded: LoadedModel, spec: RunSpec, runs: list[AttentionRun]) -> list[AttentionRun]:
    """Runs over tokens merged over words (--words: Clark et al.'s rule, models/words.py)."""
    tokenizer = loaded.tokenizer_for(spec.stack)
    return [merge_run(run, *run_words(tokenizer, run)) for run in runs]

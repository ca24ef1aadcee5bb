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

from attnviz.attention.layer import MultiHeadAttention, rows_per_block
from attnviz.attention.query_blocks import QueryBlock
from attnviz.budgets import block_budget, large_map_bytes, memory_budget
from attnviz.layer_inputs import Capture, EncodedTexts, LayerStates, check_layer, encode_texts, threads_for
from attnviz.models.loading import LoadedModel
from attnviz.models.tokens import Encoded, text_notes, truncation_notes, unknown_tokens
from attnviz.models.words import merge_run, run_words
from attnviz.own_layer import build_layer, build_layers, layer_sizes
from attnviz.passes import capture_states, in_berts_place, iter_layer_passes, layer_stages
from attnviz.run_data import AttentionRun, Progress, QueryKeyVectors
from attnviz.spec import RunSpec, model_is_causal

# Texts per forward pass. The weights of a batch are (B, H, N, N) floats: for 32 texts of
# 512 tokens and 12 heads that is 400 MB, the most we want to hold at once.
BATCH_SIZE = 32


def batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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
        large = large_map_bytes(spec)
        sizes = [(len(encoded.queries.ids[i]), len(keys.ids[0 if spec.kv_text is not None else i])) for i in range(batch)]
        if in_blocks and (rows < num_queries or any(4 * attention.num_heads * q * k > large for q, k in sizes)):
            rows = rows_per_block(block_budget(spec), batch, attention.num_heads, num_keys)  # cache-sized blocks on the CPU
            blocks = attention.blocks(
                states.queries, states.keys, states.keys,
                valid_lens=valid_lens, causal=spec.causal, position_bias=states.position_bias, rows=rows, narrow=True, reuse=True,
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
    """Each text's output (Nq_i, D) and weights (H, Nq_i, Nk_i) from the layer's blocks (first query, (B, b, D), (B, H, b, K)),
    as BlockMaps fills them. each_block(first query, weights), when given, gets each block's weights (a tensor) first."""
    maps = BlockMaps(sizes, num_heads, large)
    for start, output, weights in blocks:
        if each_block is not None:
            each_block(start, weights)
        maps.add(start, output, weights)
    return maps.finish()


class BlockMaps:
    """Each text's output (Nq_i, D) and weights (H, Nq_i, Nk_i), filled a block of a layer at a time (add), wherever the
    blocks are made: block_maps' run of the layer, or a pass of the model that runs it in its place (passes.blocks_in_place).

    sizes: each text's (Nq_i, Nk_i). A block's weights may stop at K keys (MultiHeadAttention.blocks' narrow: a causal
    block's later keys have weight 0), and the maps hold 0 past them. A map of more than `large` bytes is written block
    by block into a .npy in a temporary folder of its own (run_data.MapFile, whose zeros are never written) and comes
    back (finish) as a read-only memmap of it; the others are arrays in memory. No (B, H, Nq, Nk) tensor is ever whole.
    """

    def __init__(self, sizes: list[tuple[int, int]], num_heads: int, large: int):
        from attnviz.run_data import MapFile

        self.sizes = sizes
        self.outputs: list[np.ndarray | None] = [None] * len(sizes)
        self.maps = [MapFile((num_heads, q, k)) if 4 * num_heads * q * k > large else np.zeros((num_heads, q, k), np.float32) for q, k in sizes]

    def add(self, start: int, output: torch.Tensor, weights: torch.Tensor) -> None:
        """The block of queries start .. start + b - 1: output (B, b, D), weights (B, H, b, K)."""
        output, weights = output.float().cpu().numpy(), weights.float().cpu().numpy()  # (B, b, D), (B, H, b, K)
        for i, (num_queries, num_keys) in enumerate(self.sizes):
            stop = min(start + weights.shape[2], num_queries)
            if stop <= start:  # padding queries of a shorter text
                continue
            if self.outputs[i] is None:
                self.outputs[i] = np.empty((num_queries, output.shape[-1]), np.float32)
            self.outputs[i][start:stop] = output[i, : stop - start]
            width = min(weights.shape[3], num_keys)
            self.maps[i][:, start:stop, :width] = weights[i, :, : stop - start, :width]

    def finish(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each text's output and map, the maps on disk finished (read-only memmaps)."""
        from attnviz.run_data import MapFile

        return self.outputs, [each.finish() if isinstance(each, MapFile) else each for each in self.maps]


def pass_maps(encoded: EncodedTexts, num_heads: int, spec: RunSpec) -> BlockMaps:
    """The BlockMaps of a layer's run of num_heads heads over encoded's texts (self-attention) that a pass of the model
    fills as it runs the layer in its place (passes.blocks_in_place's maps_of): layer_pass' maps, no run of their own."""
    sizes = [(len(ids), len(ids)) for ids in encoded.queries.ids]
    return BlockMaps(sizes, num_heads, large_map_bytes(spec))


@torch.inference_mode()
def runs_of_pass(
    loaded: LoadedModel, texts: list[str], spec: RunSpec, encoded: EncodedTexts, states: LayerStates,
    attention: MultiHeadAttention, maps: BlockMaps, vector_tokens: int = 0,
) -> list[AttentionRun]:  # fmt: skip
    """run_attention's runs of spec.layer made from the maps a pass filled (pass_maps) and that layer's input as the pass
    kept it: the layer is not run again; the vectors are projected from that input (text_vectors)."""
    output, patterns = maps.finish()
    vectors = text_vectors(attention, states, maps.sizes, vector_tokens)
    return layer_runs(loaded, texts, spec, LayerPass(attention, encoded, states, encoded.queries, output, patterns, vectors))


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
    return layer_runs(loaded, texts, spec, done)


def layer_runs(loaded: LoadedModel, texts: list[str], spec: RunSpec, done: LayerPass) -> list[AttentionRun]:
    """One AttentionRun per text of a layer's pass (split_runs), with its vectors where kept (over tokens: not with spec.words)."""
    sizes = layer_sizes(done.attention)
    runs = split_runs(loaded, texts, done.encoded.queries, done.keys, done.output, done.patterns, spec, spec.layer, *sizes)
    if done.vectors is None or spec.words:
        return runs
    return [replace(run, vectors=vectors) for run, vectors in zip(runs, done.vectors)]


@torch.inference_mode()
def iter_layer_runs(
    loaded: LoadedModel, texts: list[str], spec: RunSpec, progress: Progress = Progress(), captured: Capture | None = None
) -> Iterator[list[AttentionRun]]:
    """attnviz's layer in place of every model layer over a padded batch: per layer, one run per text.

    spec.layer and spec.kv_text are not used (self-attention of spec.stack). One forward pass gives
    every layer's input; layer L's run of a text is what run_attention with layer L gives for it.
    Layer by layer, so that a caller who only needs numbers holds one layer's weights at a time, and one
    layer's maps where it lets each go; each run holds a copy of its text's unpadded weights. progress:
    layer_stages' (a layer is done when the next is asked for). captured: the texts' capture of every layer
    (capture_texts'), read in place of a pass of the model.
    """
    spec = replace(spec, kv_text=None)
    in_place = in_berts_place(loaded, spec) and captured is None
    entered, done = layer_stages(progress, loaded.num_layers_of(spec.stack), in_place or captured is not None)  # no pass to count
    encoded = encode_texts(loaded, texts, spec) if captured is None else captured[0]
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    keys = encoded.keys if encoded.keys is not None else encoded.queries
    states = None if captured is None else dict(captured[1])  # the caller's capture is not emptied
    passes = iter_layer_passes(loaded, encoded, layers, spec, in_place, entered, states)
    for layer, (_, output, patterns) in enumerate(passes):
        yield split_runs(loaded, texts, encoded.queries, keys, output, patterns, spec, layer, *layer_sizes(layers[layer]))
        done(1)


def run_layers(
    loaded: LoadedModel, texts: list[str], spec: RunSpec, progress: Progress = Progress(), captured: Capture | None = None
) -> list[list[AttentionRun]]:
    """Every layer's run of every text, runs[text][layer], as iter_layer_runs gives them (progress and captured as
    there): captured, the layers run over it, the model is not run."""
    by_layer = list(iter_layer_runs(loaded, texts, spec, progress, captured))  # by_layer[layer][text]
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

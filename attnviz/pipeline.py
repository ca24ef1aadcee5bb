"""From text to attention: tokenize, take a BERT layer's input, run attnviz's own layer.

With pretrained weights our layer gets the query, key, value and output projections of
BERT layer L and that layer's input (for L = 0, BERT's embedding output), so its weights
are BERT's own attention pattern. With random weights it is a fresh layer, as in the tutorials.
For every layer at once (stats, layers), one forward pass gives each layer's input; with
BERT's own projections and heads our layers stand in for BERT's attention in that pass.

Every run takes its settings whole, as a RunSpec (attnviz.spec). The stage between models and
attention below, and analysis and trace above (the stats loop, measure_heads, is in analysis).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch

from attnviz.attention.layer import MultiHeadAttention, check_num_heads, layer_from_weights
from attnviz.errors import AttnvizError
from attnviz.models.loading import LoadedModel
from attnviz.models.tokens import Encoded, encode, truncation_notice, unknown_token_notice
from attnviz.result import AttentionRun
from attnviz.spec import RunSpec

# Texts per forward pass. The weights of a batch are (B, H, N, N) floats: for 32 texts of
# 512 tokens and 12 heads that is 400 MB, the most we want to hold at once.
BATCH_SIZE = 32


def batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def resolve_device(requested: str) -> str:
    """'auto' means the GPU when torch sees one."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise AttnvizError("--device cuda: torch sees no GPU on this machine; use --device cpu or auto")
    if requested not in ("cpu", "cuda"):
        raise AttnvizError(f"unknown device {requested!r}: choose auto, cpu or cuda")
    return requested


def device_label(device: str) -> str:
    """'cpu', or 'cuda (NVIDIA H100 80GB HBM3)'."""
    return f"cuda ({torch.cuda.get_device_name()})" if device == "cuda" else device


def check_layer(loaded: LoadedModel, layer: int) -> None:
    if not 0 <= layer < loaded.num_layers:
        raise AttnvizError(
            f"layer {layer} is out of range: {loaded.name} has layers 0 to {loaded.num_layers - 1}"
        )


@torch.inference_mode()
def layer_input(loaded: LoadedModel, encoded: Encoded, layer: int, device: str) -> torch.Tensor:
    """The hidden state that enters BERT layer `layer`: (B, N, D). Layer 0 gets the embeddings."""
    return loaded.model(**encoded.model_inputs(device), num_layers=layer)[-1]


@torch.inference_mode()
def layer_inputs(loaded: LoadedModel, encoded: Encoded, device: str) -> list[torch.Tensor]:
    """The input of every BERT layer from one forward pass: element L (B, N, D) enters layer L."""
    return loaded.model(**encoded.model_inputs(device), num_layers=loaded.num_layers - 1)


@torch.inference_mode()
def embedding_output(loaded: LoadedModel, encoded: Encoded, device: str, positions: bool = True) -> torch.Tensor:
    """BERT's embedding output (B, N, D): LayerNorm(word + token type [+ position]).

    With positions=False the position embeddings are left out: attention over the result
    cannot tell word order, which is what `attnviz position` shows.
    """
    return loaded.model.embeddings(encoded.input_ids.to(device), encoded.token_type_ids.to(device), positions)


def layer_from_bert(bert_layer, num_heads: int) -> MultiHeadAttention:
    """Our layer with the projections of one BertLayer copied in, split into num_heads heads."""
    return layer_from_weights(bert_layer.attention_weights(), num_heads)


def random_layer(model_size: int, num_heads: int, seed: int) -> MultiHeadAttention:
    """A fresh layer, the same for the same seed on any device (it is built on the CPU)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(model_size, num_heads, bias=True)


def build_layer(loaded: LoadedModel, spec: RunSpec) -> MultiHeadAttention:
    """attnviz's layer for spec.layer: BERT's projections or random ones from spec.seed, split into spec.num_heads."""
    num_heads = resolve_num_heads(loaded, spec.num_heads)
    if spec.weights == "pretrained":
        attention = layer_from_bert(loaded.model.encoder.layer[spec.layer], num_heads)
    else:  # "random": RunSpec admits no other
        attention = random_layer(loaded.hidden_size, num_heads, spec.seed)
    return attention.to(spec.device).eval()


def resolve_num_heads(loaded: LoadedModel, num_heads: int | None) -> int:
    """--heads: the model's own count when not given; any count given (0 too) must divide the model size."""
    if num_heads is None:
        return loaded.num_heads
    check_num_heads(loaded.hidden_size, num_heads)
    return num_heads


def build_layers(loaded: LoadedModel, spec: RunSpec) -> list[MultiHeadAttention]:
    """attnviz's layer for every BERT layer, in order (spec.layer is not used)."""
    return [build_layer(loaded, replace(spec, layer=layer)) for layer in range(loaded.num_layers)]


@torch.inference_mode()
def run_attention(loaded: LoadedModel, texts: list[str], spec: RunSpec) -> list[AttentionRun]:
    """Run attnviz's layer over a padded batch of texts with spec's settings; one AttentionRun per text.

    With spec.kv_text, queries come from each text and keys and values from kv_text.
    """
    layer, kv_text, device, truncate = spec.layer, spec.kv_text, spec.device, spec.truncate
    check_layer(loaded, layer)
    attention = build_layer(loaded, spec)

    queries = encode(loaded.tokenizer, texts, loaded.max_positions, truncate)
    keys = queries if kv_text is None else encode(loaded.tokenizer, [kv_text], loaded.max_positions, truncate)
    query_states = layer_input(loaded, queries, layer, device)  # (B, Nq, D)
    key_states = query_states
    if kv_text is not None:
        key_states = layer_input(loaded, keys, layer, device)  # (1, Nk, D)
        key_states = key_states.expand(len(texts), -1, -1)  # (B, Nk, D)
    key_valid_lens = keys.valid_lens.to(device).expand(len(texts))  # (B,)

    output, patterns = attention(
        query_states, key_states, key_states, valid_lens=key_valid_lens, causal=spec.causal
    )  # (B, Nq, D), (B, H, Nq, Nk)
    return split_runs(loaded, texts, queries, keys, output, patterns, spec, layer, attention.num_heads)


@torch.inference_mode()
def iter_layer_runs(loaded: LoadedModel, texts: list[str], spec: RunSpec) -> Iterator[list[AttentionRun]]:
    """attnviz's layer in place of every BERT layer over a padded batch: per layer, one run per text.

    spec.layer is not used. One BERT forward pass gives every layer's input; layer L's run of a
    text is what run_attention with layer L gives for it. Layer by layer, so that a caller who only needs numbers
    holds one layer's weights at a time; each run holds a copy of its text's unpadded weights.
    """
    in_place = in_berts_place(loaded, spec)
    num_heads = resolve_num_heads(loaded, spec.num_heads)
    layers = build_layers(loaded, spec)
    encoded = encode(loaded.tokenizer, texts, loaded.max_positions, spec.truncate)
    weights = iter_layer_weights(loaded, encoded, layers, spec.causal, spec.device, in_place)
    for layer, (output, patterns) in enumerate(weights):
        yield split_runs(loaded, texts, encoded, encoded, output, patterns, replace(spec, kv_text=None), layer, num_heads)


def in_berts_place(loaded: LoadedModel, spec: RunSpec) -> bool:
    """True when attnviz's layers compute just what BERT's own attention does.

    That is with BERT's projections (pretrained), split into BERT's heads, without a causal
    mask: then each layer can run in BERT's place and the attention is computed once, not twice.
    """
    return spec.weights == "pretrained" and spec.num_heads in (None, loaded.num_heads) and not spec.causal


@torch.inference_mode()
def iter_layer_weights(
    loaded: LoadedModel,
    encoded: Encoded,
    layers: list[MultiHeadAttention],
    causal: bool,
    device: str,
    in_place: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per BERT layer, attnviz's layer over the padded batch: output (B, N, D) and weights (B, H, N, N).

    Each layer runs over the hidden state that enters that BERT layer. With in_place (see
    in_berts_place) attnviz's layer stands in for BERT's attention in the forward pass, and
    its output goes on through the rest of BERT's layer to the next.
    """
    valid_lens = encoded.valid_lens.to(device)  # (B,)
    if not in_place:
        for layer, hidden in enumerate(layer_inputs(loaded, encoded, device)):  # hidden: (B, N, D)
            yield layers[layer](hidden, valid_lens=valid_lens, causal=causal)
        return
    hidden = layer_input(loaded, encoded, 0, device)  # (B, N, D): the embeddings
    for layer, attention in enumerate(layers):
        if layer:
            hidden = loaded.model.encoder.layer[layer - 1].finish(hidden, output)  # enters this layer
        output, patterns = attention(hidden, valid_lens=valid_lens)
        yield output, patterns


def run_layers(loaded: LoadedModel, texts: list[str], spec: RunSpec) -> list[list[AttentionRun]]:
    """Every layer's run of every text, runs[text][layer], as iter_layer_runs gives them."""
    by_layer = list(iter_layer_runs(loaded, texts, spec))  # by_layer[layer][text]
    return [list(text_runs) for text_runs in zip(*by_layer)]


def text_notices(
    loaded: LoadedModel, texts: list[str], ids: list[list[int]], whats: list[str] | None = None
) -> list[str]:
    """What to tell the user about these texts: the model's notice, and texts mostly [UNK].

    whats name each text in its note ("the text", "the --kv text"); each note quotes its text.
    """
    whats = whats or ["the text"] * len(texts)
    notices = (
        unknown_token_notice(loaded.tokenizer, text, text_ids, loaded.name, what)
        for text, text_ids, what in zip(texts, ids, whats)
    )
    return ([loaded.notice] if loaded.notice else []) + [notice for notice in notices if notice]


def truncation_notices(texts: list[str], truncations: list, what: str = "the text") -> list[str]:
    notices = (truncation_notice(text, truncation, what) for text, truncation in zip(texts, truncations))
    return [notice for notice in notices if notice]


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
) -> list[AttentionRun]:
    """One AttentionRun per text from a padded batch's output (B, Nq, D) and weights (B, H, Nq, Nk).

    Each run holds a copy of its own unpadded block, so a caller may drop the batch. keys holds
    one text (spec.kv_text) for cross-attention, else the same texts as queries. layer and
    num_heads are the run's (spec may leave them to the model: None).
    """
    kv_text = spec.kv_text
    output, patterns = output.float().cpu().numpy(), patterns.float().cpu().numpy()
    runs = []
    for i, text in enumerate(texts):
        query_ids = queries.ids[i]
        key_index = 0 if kv_text is not None else i
        key_ids = keys.ids[key_index]
        own_texts = [text, kv_text] if kv_text else [text]
        notices = text_notices(loaded, own_texts, [query_ids, key_ids], ["the text", "the --kv text"])
        truncated = queries.truncations[i]
        kv_truncated = keys.truncations[0] if kv_text is not None else None
        notices += truncation_notices([text], [truncated])
        notices += truncation_notices([kv_text], [kv_truncated], "the --kv text")
        runs.append(
            AttentionRun(
                text=text,
                kv_text=kv_text,
                model=loaded.name,
                query_tokens=queries.tokens[i],
                key_tokens=keys.tokens[key_index],
                query_ids=query_ids,
                key_ids=key_ids,
                attention=patterns[i, :, : len(query_ids), : len(key_ids)].copy(),  # (H, Nq_i, Nk_i)
                output=output[i, : len(query_ids)].copy(),  # (Nq_i, D)
                notices=notices,
                truncated=truncated,
                kv_truncated=kv_truncated,
                layer=layer,
                weights=spec.weights,
                num_heads=num_heads,
                device=spec.device,
                causal=spec.causal,
            )
        )
    return runs

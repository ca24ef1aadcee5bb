"""Why a head attends: its pre-softmax score q_i · k_j split exactly into the parts that built its query and its key.

The residual stream entering layer L of a pre-norm decoder is a sum of parts: the token embedding, the position
embedding (GPT-2's learned one), each earlier layer's heads one by one (head h's output z_h through its slice of
W_O), each attention's output bias, each MLP's output. With the norm before the attention frozen at the run's values
(each position's 1/σ, the convention of direct logit attribution; LayerNorm's mean taken from each part, its bias a
part of its own), q_i and k_j are linear in those parts: each part through the frozen norm, W_Q or W_K (the key/value
head's, for grouped-query heads), Qwen3's q/k norm with its frozen scale, and RoPE's rotation at its position; the
projection's bias a part of its own. So the score is the sum over (query part, key part) of scale × q_part · k_part,
and every term is kept (Elhage et al. 2021's QK circuit, read over one prompt's residual stream).

A post-norm encoder (BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT, ALBERT: the norms its family adapter names,
post_norm_names) normalises the stream after each attention
and each MLP instead: every part then goes through each of those norms with its scale frozen (centred, g / σ), and
each norm's bias is a part of its own ("L3.norm1.bias", "L3.norm2.bias"); the embeddings' parts (the word's, the
position's, the token type's) through the embeddings' norm, as far as layer L, whose attention reads the stream as it is.

The parts come from one pass of the model (models/capture.py: each layer's call, what entered each W_o, each MLP's
output); the score they add up to is the one attnviz's own layer computes over that pass's input of layer L.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.errors import AttnvizError

# How far the parts' sum may be from what the pass computed, relative to its size: float32 sums of ~100 parts.
PARTS_TOLERANCE = 1e-4


@dataclass
class ScoreTerms:
    """One score's split: terms[i][j] = query part i × key part j (scale included), every term; their sum is score."""

    layer: int
    head: int
    query: int  # the query's position
    key: int  # the key's position
    score: float  # the pre-softmax score as attnviz's layer computed it, scale included
    weight: float  # the softmax weight it became
    query_parts: list[str]  # "embed", "pos", "L3H5", "L3.bias", "mlp3", "norm.bias", "bias"
    key_parts: list[str]
    terms: np.ndarray  # (P_q, P_k) float64
    tokens: list[str]  # the text's tokens, as the tokenizer gives them (cross-attention: the queries', the decoder's)
    shown_tokens: list[str]  # as figures and tables show them (models/shown.py)
    key_tokens: list[str] | None = None  # cross-attention: the keys' tokens (the encoder's); None: the same as tokens
    shown_key_tokens: list[str] | None = None

    @property
    def total(self) -> float:
        """The terms' sum: the score, within float32's rounding of the parts."""
        return float(self.terms.sum())

    @property
    def query_token(self) -> str:
        return self.tokens[self.query]

    @property
    def key_token(self) -> str:
        return (self.key_tokens or self.tokens)[self.key]

    @property
    def shown_query(self) -> str:
        return self.shown_tokens[self.query]

    @property
    def shown_key(self) -> str:
        return (self.shown_key_tokens or self.shown_tokens)[self.key]


def score_terms(loaded, encoded, spec, layer: int, head: int, query: int, key: int | None = None) -> ScoreTerms:
    """The split of head `head`'s score of (query, key) at `layer` over one text (encoded: its EncodedTexts, one text);
    key None: the key the head weighs most from that query. spec: the model's own projections, heads and mask (the
    pass runs attnviz's layers in the model's place, as a report's capture does); one pass of the model, whole."""
    import torch

    from attnviz.layer_inputs import threads_for
    from attnviz.passes import capture_states

    check_splits(loaded)
    with torch.inference_mode(), threads_for(encoded):
        states = capture_states(loaded, encoded, [layer], spec, stream_of=layer)[layer]
        return cell_terms(loaded, encoded, spec, states, head, query, key)


def check_splits(loaded) -> None:
    if not (splits_post_norm(loaded) or splits_pre_norm(loaded)):
        raise AttnvizError(f"why splits the scores of pre-norm decoders (Llama, Qwen, GPT-2) and of post-norm encoders, not {loaded.family.name}'s")


def cell_terms(loaded, encoded, spec, states, head: int, query: int, key: int | None = None) -> ScoreTerms:
    """One cell's split from a capture already made (states: layer_inputs.LayerStates of spec.layer, with its stream's
    parts: passes.capture_states' stream_of), one text; key None: the key the head weighs most from that query."""
    import torch

    from attnviz.own_layer import build_layer

    layer = spec.layer
    with torch.inference_mode():
        attention = build_layer(loaded, spec)
        scores = layer_scores(attention, states, spec.causal)[head, query]  # (N,): the query's row
        weights = scores.softmax(dim=-1)
        key = int(weights.argmax()) if key is None else key
        rows = torch.tensor([query, key])  # every part is needed at these two positions alone
        normed = normed_parts(loaded, encoded, states.stream, layer, rows)
        query_names, query_vectors = side_vectors(attention, normed, rows, "q")  # (P_q, 2, H, d)
        key_names, key_vectors = side_vectors(attention, normed, rows, "k")  # (P_k, 2, H_kv, d)
        kv_head = head // attention.group_size
        terms = attention.scale * (query_vectors[:, 0, head] @ key_vectors[:, 1, kv_head].T)  # (P_q, P_k)
    return ScoreTerms(
        layer=layer, head=head, query=query, key=key, score=float(scores[key]), weight=float(weights[key]),
        query_parts=query_names, key_parts=key_names, terms=terms.cpu().numpy(), tokens=list(encoded.queries.tokens[0]),
        shown_tokens=list(encoded.queries.shown[0] or encoded.queries.tokens[0]),
    )  # fmt: skip


# A report's record (html/record.py) holds the splits of its layer's cells: every cell up to EVERY_CELL_TOKENS tokens
# (where their terms take at most EVERY_CELL_WORK multiply-adds: a few seconds on two cores), else each query's top key,
# up to CELL_TOKENS; none past it (the view says so). Each cell's TOP_TERMS largest terms and the rest of them summed.
EVERY_CELL_TOKENS = 32
CELL_TOKENS = 64
EVERY_CELL_WORK = 4 * 10**9
TOP_TERMS = 12
TERMS_BUDGET_BYTES = 64 * 2**20  # the float64 terms of a block of cells held at once
CELLS = ("every", "causal", "top key")  # which cells a report splits (CellSplits)


def report_refusal(loaded, spec, num_tokens: int) -> str | None:
    """Why a report of this run holds no splits of its layer's scores (None: it holds them)."""
    from attnviz.passes import computes_models_attention

    if spec.stack == "cross":
        return "the report splits the scores of self-attention: attnviz why --stack cross splits a cell of this cross-attention (T5, BART, Marian)"
    if not (splits_post_norm(loaded) or splits_pre_norm(loaded)):
        return f"why splits the scores of pre-norm decoders (Llama, Qwen, SmolLM2, GPT-2) and of post-norm encoders (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT), not {loaded.family.name}'s"
    if spec.kv_text is not None or spec.cross_attention or not computes_models_attention(loaded, spec):
        return "this map is not the model's own self-attention (random weights, another number of heads, another mask or --kv): its scores are not made of the model's residual stream"
    if spec.words:
        return "this map is over words (--words): why splits the score of a token"
    if num_tokens > CELL_TOKENS:
        return f"past {CELL_TOKENS} tokens the report holds no splits of the scores: attnviz why splits any cell"
    return None


@dataclass
class CellSplits:
    """Every head's scores at `layer` split for a report, cell by cell: each cell's TOP_TERMS largest terms (by size,
    largest first; ties to the earlier pair), the rest of its terms summed, and its score. Cells (CELLS): "every"
    (query, key) of the map, row by row; "causal": under a causal mask, each row's keys up to its query alone (a future
    key's weight is 0: it has no score to split), row by row, cell q (q + 1) / 2 + k; "top key": each query's top key."""

    layer: int
    query_parts: list[str]
    key_parts: list[str]
    cells: str  # CELLS
    keys: np.ndarray  # (H, C) int: each cell's key ("every": C = Nq Nk, the map's cells in order)
    queries: np.ndarray  # (C,) int: each cell's query
    pairs: np.ndarray  # (H, C, T, 2) int: the query part and key part of each top term
    terms: np.ndarray  # (H, C, T) float64
    rest: np.ndarray  # (H, C) float64: the cell's other terms summed
    scores: np.ndarray  # (H, C) float64: attnviz's layer's score, scale included (-inf: masked)


def cell_splits(loaded, encoded, spec, states, progress=lambda done: None) -> CellSplits:
    """Every head's cells at spec.layer split (CellSplits), one text of at most CELL_TOKENS tokens, from a capture
    already made (states: as cell_terms'); vectorised: each head's query and key parts at every position once, then a
    block of cells' terms as one batched matrix product. progress(1) as each head is done."""
    import torch

    from attnviz.own_layer import build_layer

    check_splits(loaded)
    num_tokens = states.queries.shape[1]
    with torch.inference_mode():
        attention = build_layer(loaded, spec)
        scores = layer_scores(attention, states, spec.causal).cpu()  # (H, N, N)
        rows = torch.arange(num_tokens)
        normed = normed_parts(loaded, encoded, states.stream, spec.layer, rows)
        sizes = len(normed[0]) + 1  # the parts of each side, a projection's bias included
        every_cell = num_tokens <= EVERY_CELL_TOKENS and attention.num_heads * num_tokens**2 * sizes**2 * attention.head_dim <= EVERY_CELL_WORK
        cells = ("causal" if spec.causal else "every") if every_cell else "top key"
        heads = range(attention.num_heads)
        if cells == "causal":
            queries, cell_keys = torch.tril_indices(num_tokens, num_tokens)  # (C,) each: keys 0..q of row q, row by row
            keys = cell_keys.expand(len(heads), -1)  # (H, C)
        elif cells == "every":
            queries = rows.repeat_interleave(num_tokens)  # (C,): the map's cells row by row
            keys = rows.repeat(num_tokens).expand(len(heads), -1)  # (H, C)
        else:
            queries, keys = rows, scores.argmax(dim=-1)  # (N,), (H, N): each query's top key, as why's default
        query_names, query_vectors = side_vectors(attention, normed, rows, "q")  # (P_q, N, H, d)
        key_names, key_vectors = side_vectors(attention, normed, rows, "k")  # (P_k, N, H_kv, d)
        splits = []
        for head in heads:
            kv_head = head // attention.group_size
            splits.append(_top_terms(attention.scale * query_vectors[:, :, head], key_vectors[:, :, kv_head], queries, keys[head]))
            progress(1)
    pairs, terms, rest = (np.stack(each) for each in zip(*splits))
    return CellSplits(
        layer=spec.layer, query_parts=query_names, key_parts=key_names, cells=cells, keys=keys.numpy(),
        queries=queries.numpy(), pairs=pairs, terms=terms, rest=rest, scores=scores[torch.arange(len(heads))[:, None], queries, keys].numpy(),
    )  # fmt: skip


def _top_terms(query_vectors, key_vectors, queries, keys):
    """Each cell's (queries[c], keys[c]) TOP_TERMS largest terms (pairs (C, T, 2), terms (C, T)) and the rest (C,):
    query_vectors (P_q, N, d), scale included, key_vectors (P_k, N, d); cells a block at a time, their terms (c, P_q,
    P_k) one batched matrix product."""
    import torch

    num_query_parts, num_key_parts = len(query_vectors), len(key_vectors)
    count = min(TOP_TERMS, num_query_parts * num_key_parts)
    block = max(1, TERMS_BUDGET_BYTES // (8 * num_query_parts * num_key_parts))
    pairs, tops, rests = [], [], []
    for start in range(0, len(queries), block):
        cells = slice(start, start + block)
        left = query_vectors[:, queries[cells]].transpose(0, 1)  # (c, P_q, d)
        right = key_vectors[:, keys[cells]].permute(1, 2, 0)  # (c, d, P_k)
        terms = torch.bmm(left, right).flatten(1)  # (c, P_q P_k)
        chosen = terms.abs().topk(count, dim=1).indices  # (c, T)
        # largest first, a tie to the earlier pair: WhyResult.top's order (a stable sort of the sizes)
        chosen = chosen.sort(dim=1).values  # the earlier pair first, then a stable sort by size
        order = chosen.gather(1, terms.gather(1, chosen).abs().sort(dim=1, descending=True, stable=True).indices)  # (c, T)
        top = terms.gather(1, order)  # (c, T)
        pairs.append(torch.stack([order // num_key_parts, order % num_key_parts], dim=-1))
        tops.append(top)
        rests.append(terms.sum(dim=1) - top.sum(dim=1))
    return torch.cat(pairs).cpu().numpy(), torch.cat(tops).cpu().numpy(), torch.cat(rests).cpu().numpy()


def layer_scores(attention, states, causal: bool):
    """(H, Nq, Nk) float64: attnviz's layer's pre-softmax scores over the capture's input of the layer (one text),
    scale included, keys after each query -inf under a causal mask."""
    import torch

    q, k, _ = attention.project(states.queries, states.keys)  # (1, H, Nq or Nk, d) each, keys repeated for their query heads
    scores = (q[0] @ k[0].transpose(-2, -1)).double() * attention.scale  # (H, Nq, Nk)
    if causal:
        scores.masked_fill_(torch.ones(scores.shape[1:], dtype=torch.bool, device=scores.device).triu(1), float("-inf"))
    return scores


def normed_parts(loaded, encoded, stream, layer: int, rows) -> tuple[list[str], "torch.Tensor"]:
    """(names, (P, R, D) float64) at positions `rows`: the parts of what enters `layer`'s attention (stream:
    layer_inputs.StreamParts of one text), each through the norms on the way with their scales frozen."""
    if splits_post_norm(loaded):  # the stream as it is enters the attention: its parts through every norm before the layer
        return _post_norm_parts(loaded, stream, encoded.queries.model_inputs(str(stream.embedded.device)), layer, rows)
    names, parts = _stream_parts(loaded, stream, encoded.queries.input_ids, layer, rows)
    return _normed(loaded, names, parts, stream.entering[layer][0][rows].double(), layer)


def splits_pre_norm(loaded) -> bool:
    """A decoder whose layers normalise before the attention (the family names that norm)."""
    return not loaded.is_bert and loaded.family.attention_norm is not None


def splits_post_norm(loaded) -> bool:
    """A post-norm encoder whose family names its norms (post_norm_names): BERT's layout (attnviz's BERT, and
    transformers' BERT, RoBERTa, XLM-RoBERTa, ELECTRA), DistilBERT, ALBERT; the embeddings' own norm too."""
    return loaded.family.post_norm_names(0) is not None


def _check_sum(parts, entering, layer: int) -> None:
    """parts (P, R, D) must add up to the stream entering the layer (R, D), within float32's rounding."""
    if (parts.sum(dim=0) - entering).abs().max() > PARTS_TOLERANCE * max(1.0, float(entering.abs().max())):
        raise RuntimeError(f"layer {layer}'s input is not the sum of its parts (the embeddings, the heads, the MLPs, the biases before it)")


def _post_norm_parts(loaded, stream, inputs: dict, layer: int, rows):
    """(names, (P, R, D) float64) at positions `rows`: the parts of what enters `layer` of a post-norm encoder, each
    through every norm on the way with its scale frozen, each norm's bias a part of its own; checked against the
    stream entering every layer."""
    import torch

    model = loaded.model
    embeddings = model.get_submodule("embeddings")
    ids = inputs["input_ids"]
    summed = stream.embedded[0][rows].double()  # what entered the embeddings' norm at those rows
    word = model.get_input_embeddings()(ids)[0][rows].double()
    names, parts = ["embed", "pos"], [word]
    if hasattr(embeddings, "token_type_embeddings"):  # DistilBERT has none
        types = inputs.get("token_type_ids", torch.zeros_like(ids))
        names.append("type")
        parts.append(embeddings.token_type_embeddings(types)[0][rows].double())
    parts.insert(1, summed - sum(parts))  # the position's: what entered the norm less the others
    names, parts = through_norm(names, torch.stack(parts), embeddings.LayerNorm, "emb.norm.bias")
    projection = loaded.family.embedding_projection  # ELECTRA's and ALBERT's: narrower embeddings, projected up
    project = _submodule(model, projection) if projection else None
    if project is not None:
        names, parts = names + ["emb.project.bias"], torch.cat([parts @ project.weight.double().T, project.bias.double().expand(1, len(word), -1)])
    for earlier in range(layer + 1):
        _check_sum(parts, stream.entering[earlier][0][rows].double(), earlier)
        if earlier == layer:
            return names, parts
        more, added = _attention_parts(loaded, stream, earlier, rows)
        index = earlier if loaded.is_bert else loaded.family.stored_index(model.config, earlier, None)  # ALBERT's shared
        norm1, norm2 = (model.get_submodule(name) for name in loaded.family.post_norm_names(index))
        with model.resident(*loaded.family.post_norm_names(index)):  # a layer's weights read a layer at a time: on the device within
            names, parts = through_norm(names + more, torch.cat([parts, added]), norm1, f"L{earlier}.norm1.bias")
            mlp = stream.mlp[earlier][0][rows].double()
            names, parts = through_norm(names + [f"mlp{earlier}"], torch.cat([parts, mlp[None]]), norm2, f"L{earlier}.norm2.bias")
    return names, parts


def _submodule(model, name: str):
    """The model's module of that name, None where it has none (ELECTRA's projection only where it is narrower)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _attention_parts(loaded, stream, layer: int, rows):
    """(names, (P, R, D)): what layer `layer`'s attention added to the stream at `rows` (head_parts)."""
    weights = loaded.model.encoder.layer[layer].attention_weights() if loaded.is_bert else loaded.model.attention_weights(layer)
    return head_parts(weights, stream.z_merged[layer][0][rows], f"L{layer}")


def head_parts(weights, z, label: str):
    """(names, (P, R, D)): what an attention (its AttentionWeights) added to the stream, z (R, H d) having entered its
    W_o: head by head (head h's output z_h through its columns of W_o: "L3H5", label "L3") and W_o's bias ("L3.bias")."""
    import torch

    w_o, b_o = weights.w_o  # (D, H d), (D,) or None
    num_heads, size = weights.num_heads, weights.head_dim
    z = z.double().unflatten(-1, (num_heads, size)).transpose(0, 1)  # (H, R, d)
    heads = z @ w_o.double().T.unflatten(0, (num_heads, size))  # (H, R, d) @ (H, d, D): each head through its columns
    names = [f"{label}H{h}" for h in range(num_heads)]
    if b_o is None:
        return names, heads
    return names + [f"{label}.bias"], torch.cat([heads, b_o.double().expand(1, z.shape[1], -1)])


def through_norm(names: list[str], parts, norm, bias_name: str):
    """Each part (P, R, D) through a LayerNorm with the scale of their sum frozen: g ⊙ (part - its mean) / σ; the
    norm's bias a part of its own."""
    import torch

    whole = parts.sum(dim=0)  # (R, D)
    sigma = ((whole - whole.mean(dim=-1, keepdim=True)).pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt()  # (R, 1)
    normed = norm.weight.double() * (parts - parts.mean(dim=-1, keepdim=True)) / sigma
    return names + [bias_name], torch.cat([normed, norm.bias.double().expand(1, *whole.shape)])


def _stream_parts(loaded, stream, ids, layer: int, rows):
    """(names, (P, R, D) float64) at positions `rows`: the parts whose sum is the residual stream entering `layer`
    (checked against it)."""
    import torch

    model = loaded.model
    entering = stream.entering[0][0][rows].double()  # (R, D): the embeddings, positions included
    embed = model.get_input_embeddings()(ids.to(entering.device))[0][rows].double()
    names, parts = ["embed"], [embed[None]]
    if (entering - embed).abs().max() > 0:  # learned positions added to the tokens (GPT-2's wpe)
        names.append("pos")
        parts.append((entering - embed)[None])
    for earlier in range(layer):
        more, added = _attention_parts(loaded, stream, earlier, rows)
        names += [*more, f"mlp{earlier}"]
        parts += [added, stream.mlp[earlier][0][rows].double()[None]]
    parts = torch.cat(parts)
    _check_sum(parts, stream.entering[layer][0][rows].double(), layer)
    return names, parts


def _normed(loaded, names: list[str], parts, stream, layer: int):
    """Each part (P, R, D) through the norm before layer `layer`'s attention with the run's own scale frozen
    (frozen_norm)."""
    name = loaded.family.attention_norm.format(index=layer)
    with loaded.model.resident(name):  # a layer's weights read a layer at a time: on the device within
        return frozen_norm(loaded.model.model.get_submodule(name), names, parts, stream)


def frozen_norm(norm, names: list[str], parts, stream):
    """Each part (P, R, D) through `norm` with the scale of `stream` (R, D) frozen (what entered it: their sum):
    RMSNorm's g ⊙ part / σ_i; LayerNorm's g ⊙ (part - its mean) / σ_i, its bias b a part of its own ("norm.bias")."""
    import torch
    from torch import nn

    gain = norm.weight.double()
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    if isinstance(norm, nn.LayerNorm):
        sigma = ((stream - stream.mean(dim=-1, keepdim=True)).pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (R, 1)
        normed = gain * (parts - parts.mean(dim=-1, keepdim=True)) / sigma
        if norm.bias is None:
            return names, normed
        return names + ["norm.bias"], torch.cat([normed, norm.bias.double().expand(1, *stream.shape)])
    sigma = (stream.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (R, 1)
    return names, gain * parts / sigma


def side_vectors(attention, normed: tuple, positions, side: str):
    """(names, (P, R, H', d) float64): each part's q (side "q": every query head) or k (every key/value head) at each
    of `positions` (R, the rows of normed's parts (names, (P, R, D)), in order), through W_Q or W_K, the projection's bias a part of
    its own ("bias"), Qwen3's q/k norm with each position's scale frozen, and RoPE's rotation at each position. A query
    head h reads its key/value head h // group_size's keys."""
    import torch

    from attnviz.attention.layer import rotate

    linear = attention.w_q if side == "q" else attention.w_k
    names, parts = normed  # (P, R, D)
    names = list(names)
    vectors = parts @ linear.weight.double().T  # (P, R, H' d)
    if linear.bias is not None:
        names.append("bias")
        vectors = torch.cat([vectors, linear.bias.double().expand(1, vectors.shape[1], -1)])
    vectors = vectors.unflatten(-1, (-1, attention.head_dim))  # (P, R, H', d)
    head_norm = attention.q_norm if side == "q" else attention.k_norm
    if head_norm is not None:  # an RMSNorm over each head's features: its scale at each position frozen
        sigma = (vectors.sum(dim=0).pow(2).mean(dim=-1, keepdim=True) + head_norm.eps).sqrt()  # (R, H', 1)
        vectors = head_norm.weight.double() * vectors / sigma
    table = attention.rotary(int(positions.max()) + 1)
    if table is not None:  # RoPE at each position: a rotation, linear in each part
        cos, sin = (each[positions].double()[:, None] for each in table)  # (R, 1, d)
        vectors = rotate(vectors, cos, sin)
    return names, vectors

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
    tokens: list[str]  # the text's tokens, as the tokenizer gives them
    shown_tokens: list[str]  # as figures and tables show them (models/shown.py)

    @property
    def total(self) -> float:
        """The terms' sum: the score, within float32's rounding of the parts."""
        return float(self.terms.sum())


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
        query_names, query_vectors = side_vectors(attention, normed, head, rows, "q")  # (P_q, 2, d)
        key_names, key_vectors = side_vectors(attention, normed, head, rows, "k")  # (P_k, 2, d)
        terms = attention.scale * (query_vectors[:, 0] @ key_vectors[:, 1].T)  # (P_q, P_k)
    return ScoreTerms(
        layer=layer, head=head, query=query, key=key, score=float(scores[key]), weight=float(weights[key]),
        query_parts=query_names, key_parts=key_names, terms=terms.numpy(), tokens=list(encoded.queries.tokens[0]),
        shown_tokens=list(encoded.queries.shown[0] or encoded.queries.tokens[0]),
    )  # fmt: skip


def layer_scores(attention, states, causal: bool):
    """(H, Nq, Nk) float64: attnviz's layer's pre-softmax scores over the capture's input of the layer (one text),
    scale included, keys after each query -inf under a causal mask."""
    import torch

    q, k, _ = attention.project(states.queries)  # (1, H, N, d) each, keys repeated for their query heads
    scores = (q[0] @ k[0].transpose(-2, -1)).double() * attention.scale  # (H, Nq, Nk)
    if causal:
        scores.masked_fill_(torch.ones(scores.shape[1:], dtype=torch.bool).triu(1), float("-inf"))
    return scores


def normed_parts(loaded, encoded, stream, layer: int, rows) -> dict:
    """name -> (R, D) float64 at positions `rows`: the parts of what enters `layer`'s attention (stream:
    layer_inputs.StreamParts of one text), each through the norms on the way with their scales frozen."""
    if splits_post_norm(loaded):  # the stream as it is enters the attention: its parts through every norm before the layer
        return _post_norm_parts(loaded, stream, encoded.queries.model_inputs(str(stream.embedded.device)), layer, rows)
    parts = _stream_parts(loaded, stream, encoded.queries.input_ids, layer, rows)
    return _normed(loaded, parts, stream.entering[layer][0][rows].double(), layer)


def splits_pre_norm(loaded) -> bool:
    """A decoder whose layers normalise before the attention (the family names that norm)."""
    return not loaded.is_bert and loaded.family.attention_norm is not None


def splits_post_norm(loaded) -> bool:
    """A post-norm encoder whose family names its norms (post_norm_names): BERT's layout (attnviz's BERT, and
    transformers' BERT, RoBERTa, XLM-RoBERTa, ELECTRA), DistilBERT, ALBERT; the embeddings' own norm too."""
    return loaded.family.post_norm_names(0) is not None


def _post_norm_parts(loaded, stream, inputs: dict, layer: int, rows) -> dict:
    """name -> (R, D) float64 at positions `rows`: the parts of what enters `layer` of a post-norm encoder, each through
    every norm on the way with its scale frozen, each norm's bias a part of its own; checked against the stream after
    every layer."""
    import torch

    model = loaded.model
    embeddings = model.get_submodule("embeddings")
    ids = inputs["input_ids"]
    summed = stream.embedded[0][rows].double()  # what entered the embeddings' norm at those rows
    word = model.get_input_embeddings()(ids)[0][rows].double()
    parts = {"embed": word}
    if hasattr(embeddings, "token_type_embeddings"):  # DistilBERT has none
        types = inputs.get("token_type_ids", torch.zeros_like(ids))
        parts["type"] = embeddings.token_type_embeddings(types)[0][rows].double()
    parts = {"embed": word, "pos": summed - sum(parts.values())} | parts  # summed: what entered the norm
    parts = _through_norm(parts, summed, embeddings.LayerNorm, "emb.norm.bias")
    projection = loaded.family.embedding_projection  # ELECTRA's and ALBERT's: narrower embeddings, projected up
    project = _submodule(model, projection) if projection else None
    if project is not None:
        parts = {name: part @ project.weight.double().T for name, part in parts.items()} | {"emb.project.bias": project.bias.double().expand(len(word), -1)}
    for earlier in range(layer + 1):
        entering = stream.entering[earlier][0][rows].double()
        if (sum(parts.values()) - entering).abs().max() > PARTS_TOLERANCE * max(1.0, float(entering.abs().max())):
            raise RuntimeError(f"layer {earlier}'s input is not the sum of its parts")
        if earlier == layer:
            return parts
        parts |= _attention_parts(loaded, stream, earlier, rows)
        index = earlier if loaded.is_bert else loaded.family.stored_index(model.config, earlier, None)  # ALBERT's shared
        norm1, norm2 = (model.get_submodule(name) for name in loaded.family.post_norm_names(index))
        attended = sum(parts.values())  # the stream plus the attention's output: what enters the first norm
        parts = _through_norm(parts, attended, norm1, f"L{earlier}.norm1.bias")
        parts[f"mlp{earlier}"] = stream.mlp[earlier][0][rows].double()
        parts = _through_norm(parts, sum(parts.values()), norm2, f"L{earlier}.norm2.bias")
    return parts


def _submodule(model, name: str):
    """The model's module of that name, None where it has none (ELECTRA's projection only where it is narrower)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _attention_parts(loaded, stream, layer: int, rows) -> dict:
    """name -> (R, D): what layer `layer`'s attention added to the stream at `rows`, head by head (head h's output z_h,
    what entered W_o, through its columns of W_o: "L3H5") and W_o's bias ("L3.bias")."""
    weights = loaded.model.encoder.layer[layer].attention_weights() if loaded.is_bert else loaded.model.attention_weights(layer)
    w_o, b_o = weights.w_o  # (D, H d), (D,) or None
    z = stream.z_merged[layer][0][rows].double()  # (R, H d)
    size = weights.head_dim
    parts = {f"L{layer}H{h}": z[:, h * size : (h + 1) * size] @ w_o[:, h * size : (h + 1) * size].double().T for h in range(weights.num_heads)}
    return parts | ({f"L{layer}.bias": b_o.double().expand(len(rows), -1)} if b_o is not None else {})


def _through_norm(parts: dict, whole, norm, bias_name: str) -> dict:
    """Each part through a LayerNorm with the scale of `whole` (their sum, (R, D)) frozen: g ⊙ (part - its mean) / σ;
    the norm's bias a part of its own."""
    sigma = ((whole - whole.mean(dim=-1, keepdim=True)).pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt()  # (R, 1)
    gain = norm.weight.double()
    normed = {name: gain * (part - part.mean(dim=-1, keepdim=True)) / sigma for name, part in parts.items()}
    return normed | {bias_name: norm.bias.double().expand_as(whole)}


def _stream_parts(loaded, stream, ids, layer: int, rows) -> dict:
    """name -> (R, D) float64 at positions `rows`: the parts whose sum is the residual stream entering `layer` (checked
    against it)."""
    import torch

    model = loaded.model
    entering = stream.entering[0][0][rows].double()  # (R, D): the embeddings, positions included
    embed = model.get_input_embeddings()(ids.to(entering.device))[0][rows].double()
    parts = {"embed": embed}
    if (entering - embed).abs().max() > 0:  # learned positions added to the tokens (GPT-2's wpe)
        parts["pos"] = entering - embed
    for earlier in range(layer):
        parts |= _attention_parts(loaded, stream, earlier, rows)
        parts[f"mlp{earlier}"] = stream.mlp[earlier][0][rows].double()
    entering = stream.entering[layer][0][rows].double()
    summed = torch.stack(list(parts.values())).sum(dim=0)
    if (summed - entering).abs().max() > PARTS_TOLERANCE * max(1.0, float(entering.abs().max())):
        raise RuntimeError(f"layer {layer}'s input is not the sum of the embeddings, the heads and the MLPs before it")
    return parts


def _normed(loaded, parts: dict, stream, layer: int) -> dict:
    """Each part through the norm before layer `layer`'s attention with the run's own scale frozen: RMSNorm's
    g ⊙ part / σ_i; LayerNorm's g ⊙ (part - its mean) / σ_i, its bias b a part of its own ("norm.bias")."""
    from torch import nn

    norm = loaded.model.model.get_submodule(loaded.family.attention_norm.format(index=layer))
    gain = norm.weight.double()
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    if isinstance(norm, nn.LayerNorm):
        centred = {name: part - part.mean(dim=-1, keepdim=True) for name, part in parts.items()}
        sigma = ((stream - stream.mean(dim=-1, keepdim=True)).pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (R, 1)
        normed = {name: gain * part / sigma for name, part in centred.items()}
        if norm.bias is not None:
            normed["norm.bias"] = norm.bias.double().expand_as(stream)
        return normed
    sigma = (stream.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (R, 1)
    return {name: gain * part / sigma for name, part in parts.items()}


def side_vectors(attention, normed: dict, head: int, positions, side: str):
    """(names, (P, R, d) float64): each part's q (side "q", head `head`) or k (its key/value head) at each of
    `positions` (R, the rows of the parts in normed, in order), through W_Q or W_K, the projection's bias a part of its
    own ("bias"), Qwen3's q/k norm with each position's scale frozen, and RoPE's rotation at each position."""
    import torch

    from attnviz.attention.layer import rotate

    size = attention.head_dim
    block = head if side == "q" else head // attention.group_size  # the query head's, or its key/value head's, features
    linear = attention.w_q if side == "q" else attention.w_k
    weight = linear.weight[block * size : (block + 1) * size].double()  # (d, D)
    names = list(normed)
    vectors = torch.stack([normed[name] @ weight.T for name in names])  # (P, R, d)
    if linear.bias is not None:
        names.append("bias")
        bias = linear.bias[block * size : (block + 1) * size].double()  # (d,)
        vectors = torch.cat([vectors, bias.expand(1, vectors.shape[1], -1)])
    head_norm = attention.q_norm if side == "q" else attention.k_norm
    if head_norm is not None:  # an RMSNorm over the head's features: its scale at each position frozen
        sigma = (vectors.sum(dim=0).pow(2).mean(dim=-1, keepdim=True) + head_norm.eps).sqrt()  # (R, 1)
        vectors = head_norm.weight.double() * vectors / sigma
    table = attention.rotary(int(positions.max()) + 1)
    if table is not None:  # RoPE at each position: a rotation, linear in each part
        cos, sin = (each[positions].double() for each in table)  # (R, d)
        vectors = rotate(vectors, cos, sin)
    return names, vectors

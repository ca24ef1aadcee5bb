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

import contextlib
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
    key None: the key the head weighs most from that query. A pre-norm decoder's own self-attention (spec: the model's
    projections and heads); one pass of the model, whole."""
    import torch

    from attnviz.models.capture import Wanted
    from attnviz.own_layer import build_layer

    post_norm = splits_post_norm(loaded)
    if not (post_norm or splits_pre_norm(loaded)):
        raise AttnvizError(f"why splits the scores of pre-norm decoders (Llama, Qwen, GPT-2) and of post-norm encoders, not {loaded.family.name}'s")
    inputs = encoded.queries.model_inputs(spec.device)
    ids = inputs["input_ids"]
    with torch.inference_mode():
        summed = []  # what entered the embeddings' norm (post-norm)
        if post_norm:
            handle = loaded.model.get_submodule("embeddings.LayerNorm").register_forward_pre_hook(lambda module, args: summed.append(args[0][0]))
        try:
            captured = loaded.model.capture_pass(inputs, Wanted(frozenset({layer}), calls=True, z_merged=True, mlp=True))
        finally:
            if post_norm:
                handle.remove()
        recorded = captured.recorded()
        attention = build_layer(loaded, spec)
        x = captured.x[layer].hidden  # (1, N, D): what entered layer L's attention
        q, k, _ = attention.project(x)  # (1, H, N, d) each, keys repeated for their query heads
        scores = (q[0, head, query] @ k[0, head].T).double() * attention.scale  # (N,): the query's row
        if spec.causal:
            scores[query + 1 :] = float("-inf")
        weights = scores.softmax(dim=-1)
        key = int(weights.argmax()) if key is None else key
        rows = torch.tensor([query, key])  # every part is needed at these two positions alone
        if post_norm:  # the stream as it is enters the attention: its parts through every norm before the layer
            normed = _post_norm_parts(loaded, captured, recorded, inputs, summed[0][rows].double(), layer, rows)
        else:
            parts = _stream_parts(loaded, captured, recorded, ids, layer, rows)
            normed = _normed(loaded, parts, recorded.entering(layer)[0][rows].double(), layer)
        query_names, query_vectors = _projected(attention, normed, head, 0, query, "q")
        key_names, key_vectors = _projected(attention, normed, head, 1, key, "k")
        terms = attention.scale * (query_vectors @ key_vectors.T)  # (P_q, P_k)
    return ScoreTerms(
        layer=layer, head=head, query=query, key=key, score=float(scores[key]), weight=float(weights[key]),
        query_parts=query_names, key_parts=key_names, terms=terms.numpy(), tokens=list(encoded.queries.tokens[0]),
        shown_tokens=list(encoded.queries.shown[0] or encoded.queries.tokens[0]),
    )  # fmt: skip


def splits_pre_norm(loaded) -> bool:
    """A decoder whose layers normalise before the attention (the family names that norm)."""
    return not loaded.is_bert and loaded.family.attention_norm is not None


def splits_post_norm(loaded) -> bool:
    """A post-norm encoder whose family names its norms (post_norm_names): BERT's layout (attnviz's BERT, and
    transformers' BERT, RoBERTa, XLM-RoBERTa, ELECTRA), DistilBERT, ALBERT; the embeddings' own norm too."""
    return loaded.family.post_norm_names(0) is not None


def _post_norm_parts(loaded, captured, recorded, inputs: dict, summed, layer: int, rows) -> dict:
    """name -> (R, D) float64 at positions `rows`: the parts of what enters `layer` of a post-norm encoder, each through
    every norm on the way with its scale frozen, each norm's bias a part of its own; checked against the stream after
    every layer. summed: what entered the embeddings' norm at those rows."""
    import torch

    model = loaded.model
    embeddings = model.get_submodule("embeddings")
    ids = inputs["input_ids"]
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
        stream = recorded.entering(earlier)[0][rows].double()
        if (sum(parts.values()) - stream).abs().max() > PARTS_TOLERANCE * max(1.0, float(stream.abs().max())):
            raise RuntimeError(f"layer {earlier}'s input is not the sum of its parts")
        if earlier == layer:
            return parts
        parts |= _attention_parts(loaded, captured, earlier, rows)
        index = earlier if loaded.is_bert else loaded.family.stored_index(model.config, earlier, None)  # ALBERT's shared
        norm1, norm2 = (model.get_submodule(name) for name in loaded.family.post_norm_names(index))
        attended = sum(parts.values())  # the stream plus the attention's output: what enters the first norm
        # a layer's weights read a layer at a time: on the device within
        with contextlib.nullcontext() if loaded.is_bert else model.resident(*loaded.family.post_norm_names(index)):
            parts = _through_norm(parts, attended, norm1, f"L{earlier}.norm1.bias")
            parts[f"mlp{earlier}"] = captured.mlp[earlier][0][rows].double()
            parts = _through_norm(parts, sum(parts.values()), norm2, f"L{earlier}.norm2.bias")
    return parts


def _submodule(model, name: str):
    """The model's module of that name, None where it has none (ELECTRA's projection only where it is narrower)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _attention_parts(loaded, captured, layer: int, rows) -> dict:
    """name -> (R, D): what layer `layer`'s attention added to the stream at `rows`, head by head (head h's output z_h,
    what entered W_o, through its columns of W_o: "L3H5") and W_o's bias ("L3.bias")."""
    weights = loaded.model.encoder.layer[layer].attention_weights() if loaded.is_bert else loaded.model.attention_weights(layer)
    w_o, b_o = weights.w_o  # (D, H d), (D,) or None
    z = captured.z_merged[layer][0][rows].double()  # (R, H d)
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


def _stream_parts(loaded, captured, recorded, ids, layer: int, rows) -> dict:
    """name -> (R, D) float64 at positions `rows`: the parts whose sum is the residual stream entering `layer` (checked
    against it)."""
    import torch

    model = loaded.model
    entering = recorded.entering(0)[0][rows].double()  # (R, D): the embeddings, positions included
    embed = model.get_input_embeddings()(ids)[0][rows].double()
    parts = {"embed": embed}
    if (entering - embed).abs().max() > 0:  # learned positions added to the tokens (GPT-2's wpe)
        parts["pos"] = entering - embed
    for earlier in range(layer):
        parts |= _attention_parts(loaded, captured, earlier, rows)
        parts[f"mlp{earlier}"] = captured.mlp[earlier][0][rows].double()
    stream = recorded.entering(layer)[0][rows].double()
    summed = torch.stack(list(parts.values())).sum(dim=0)
    if (summed - stream).abs().max() > PARTS_TOLERANCE * max(1.0, float(stream.abs().max())):
        raise RuntimeError(f"layer {layer}'s input is not the sum of the embeddings, the heads and the MLPs before it")
    return parts


def _normed(loaded, parts: dict, stream, layer: int) -> dict:
    """Each part through the norm before layer `layer`'s attention with the run's own scale frozen: RMSNorm's
    g ⊙ part / σ_i; LayerNorm's g ⊙ (part - its mean) / σ_i, its bias b a part of its own ("norm.bias")."""
    from torch import nn

    name = loaded.family.attention_norm.format(index=layer)
    norm = loaded.model.model.get_submodule(name)
    with loaded.model.resident(name):  # a layer's weights read a layer at a time: on the device within
        gain, bias = norm.weight.double(), None if getattr(norm, "bias", None) is None else norm.bias.double()
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    if isinstance(norm, nn.LayerNorm):
        centred = {name: part - part.mean(dim=-1, keepdim=True) for name, part in parts.items()}
        sigma = ((stream - stream.mean(dim=-1, keepdim=True)).pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (R, 1)
        normed = {name: gain * part / sigma for name, part in centred.items()}
        if bias is not None:
            normed["norm.bias"] = bias.expand_as(stream)
        return normed
    sigma = (stream.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (R, 1)
    return {name: gain * part / sigma for name, part in parts.items()}


def _projected(attention, normed: dict, head: int, row: int, position: int, side: str):
    """(names, (P, d) float64): each part's q (side "q", head `head`) or k (its key/value head) at `position` (its
    `row` of the parts), through
    W_Q or W_K, the projection's bias a part of its own ("bias"), Qwen3's q/k norm with the position's scale frozen,
    and RoPE's rotation at the position."""
    import torch

    from attnviz.attention.layer import rotate

    size = attention.head_dim
    block = head if side == "q" else head // attention.group_size  # the query head's, or its key/value head's, features
    linear = attention.w_q if side == "q" else attention.w_k
    weight = linear.weight[block * size : (block + 1) * size].double()  # (d, D)
    names = list(normed)
    vectors = torch.stack([normed[name][row] @ weight.T for name in names])  # (P, d)
    if linear.bias is not None:
        names.append("bias")
        vectors = torch.cat([vectors, linear.bias[block * size : (block + 1) * size].double()[None]])
    head_norm = attention.q_norm if side == "q" else attention.k_norm
    if head_norm is not None:  # an RMSNorm over the head's features: its scale at this position frozen
        whole = vectors.sum(dim=0)
        sigma = (whole.pow(2).mean() + head_norm.eps).sqrt()
        vectors = head_norm.weight.double() * vectors / sigma
    table = attention.rotary(position + 1)
    if table is not None:  # RoPE at the position: a rotation, linear in each part
        cos, sin = (each[position].double() for each in table)
        vectors = rotate(vectors, cos, sin)
    return names, vectors

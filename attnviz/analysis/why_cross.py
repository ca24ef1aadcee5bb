"""Why a head of an encoder-decoder's cross-attention attends: its score split into the decoder's parts (the query's)
× the encoder's parts (the key's).

The query of decoder layer L's cross-attention is made from the decoder's residual stream entering that sublayer: the
decoder's token embedding ("embed"), each earlier decoder layer's self-attention heads ("L3H5"), cross-attention heads
("X3H5") and MLP ("mlp3"), and layer L's own self-attention heads, through the norm before the cross-attention with each
position's scale frozen (T5's RMSNorm). The key is made from the encoder's output: the encoder's token embedding
("enc.embed"), each encoder layer's heads ("enc.L3H5") and MLP ("enc.mlp3"), through the encoder's final norm, frozen
too. Cross-attention adds no position bias (T5's relative bias belongs to its self-attentions), so the score, q · k
(T5: no 1/sqrt(d)), is the sum over (decoder part, encoder part) of their products, every term kept.

Every part comes from one pass of the whole model (TransformersModel.stacks_pass: the encoder's, the decoder's and the
cross-attention's hooks at once); the sums are checked against what the pass gave (the stream entering each layer,
what entered the cross-attention and the encoder's output), and the score is the one attnviz's layer computes over
that pass's input of the layer.

BART and Marian normalise after each sublayer instead (post-norm): every part goes through each norm on the way with
its scale frozen (centred, g / σ), each norm's bias a part of its own ("L3.norm1.bias", "L3.norm2.bias", "L3.norm3.bias"
after the decoder's self-attention, cross-attention and MLP; "enc.L3.norm1.bias", "enc.L3.norm2.bias"), the
attentions' output biases parts too ("L3.bias", "X3.bias"), and each side's embeddings are the token's (scaled as the
model scales it) and the position's, through BART's layernorm_embedding (Marian has none). Their encoder and decoder
self-attentions split by the same walks, up to the layer (self_score_terms); T5's add a relative position bias to
their scores, which is not split yet.
"""

from __future__ import annotations

from attnviz.analysis.why import ScoreTerms, frozen_norm, head_parts, layer_scores, side_vectors, through_norm
from attnviz.errors import AttnvizError

TOLERANCE = 1e-4  # as why.PARTS_TOLERANCE: float32 sums of the parts, relative to the stream's size


def splits_cross(loaded) -> bool:
    """An encoder-decoder whose adapter names the norm before its cross-attention (pre-norm: T5) or the norms after each
    sublayer (post-norm: BART, Marian)."""
    return loaded.family.cross_attention_norm is not None or _post_norm(loaded)


def _post_norm(loaded) -> bool:
    return loaded.family.sublayer_norms(0, "cross") is not None


def refuse_cross(loaded) -> None:
    if not splits_cross(loaded):
        raise AttnvizError(f"why splits the cross-attention of encoder-decoders (T5, BART, Marian), not {loaded.family.name}'s")


def cross_score_terms(loaded, encoded, spec, head: int, query: int, key: int | None = None) -> ScoreTerms:
    """Head `head`'s cross-attention score of (query: a decoder token, key: an encoder token) at spec.layer split into
    decoder part × encoder part terms; key None: the key the head weighs most. encoded: one text's EncodedTexts of the
    cross stack (the decoder's queries, the encoder's keys). One pass of the model, whole."""
    import torch

    from attnviz.layer_inputs import LayerStates, threads_for
    from attnviz.models.capture import Wanted
    from attnviz.own_layer import build_layer

    refuse_cross(loaded)
    layer = spec.layer
    inputs, source = encoded.queries.model_inputs(spec.device), encoded.keys.model_inputs(spec.device)
    wanted = {
        "encoder": Wanted(calls=True, z_merged=True, mlp=True, final=True, embedded=True),
        "decoder": Wanted(calls=True, z_merged=True, mlp=True, embedded=True),
        "cross": Wanted(frozenset({layer}), z_merged=True),
    }
    with torch.inference_mode(), threads_for(encoded):
        captured = loaded.model.stacks_pass(inputs, source, wanted)
        entered = captured["cross"].x[layer]  # what entered the cross-attention: (1, Nq, D), the encoder's output (1, Nk, D)
        with loaded.model.norms_resident():  # read a layer's weights at a time: every norm the walks read, after the pass
            attention = build_layer(loaded, spec)
            scores = layer_scores(attention, LayerStates(entered.hidden, entered.kv_hidden), causal=False)[head, query]  # (Nk,)
            weights = scores.softmax(dim=-1)
            key = int(weights.argmax()) if key is None else key
            query_rows, key_rows = torch.tensor([query]), torch.tensor([key])
            decoder_parts, encoder_parts = (_post_norm_decoder_parts, _post_norm_encoder_parts) if _post_norm(loaded) else (_decoder_parts, _encoder_parts)
            query_parts = decoder_parts(loaded, captured, inputs["input_ids"], layer, query_rows, entered.hidden[0][query_rows].double())
            key_parts = encoder_parts(loaded, captured["encoder"], source["input_ids"], key_rows, entered.kv_hidden[0][key_rows].double())
            query_names, query_vectors = side_vectors(attention, query_parts, query_rows, "q")  # (P_q, 1, H, d)
            key_names, key_vectors = side_vectors(attention, key_parts, key_rows, "k")  # (P_k, 1, H_kv, d)
            terms = attention.scale * (query_vectors[:, 0, head] @ key_vectors[:, 0, head // attention.group_size].T)  # (P_q, P_k)
    return ScoreTerms(
        layer=layer, head=head, query=query, key=key, score=float(scores[key]), weight=float(weights[key]),
        query_parts=query_names, key_parts=key_names, terms=terms.cpu().numpy(), tokens=list(encoded.queries.tokens[0]),
        shown_tokens=list(encoded.queries.shown[0] or encoded.queries.tokens[0]), key_tokens=list(encoded.keys.tokens[0]),
        shown_key_tokens=list(encoded.keys.shown[0] or encoded.keys.tokens[0]),
    )  # fmt: skip


def self_score_terms(loaded, encoded, spec, head: int, query: int, key: int | None = None) -> ScoreTerms:
    """A post-norm encoder-decoder's (BART's, Marian's) self-attention at spec.layer of spec.stack ("encoder", the
    default, or "decoder", causal): the score of (query, key) split into part × part terms over that stack's stream,
    every part through each norm on the way with its scale frozen (the walks of the cross-attention's two sides, up to
    the layer). One pass of the whole model (the decoder reads the encoder's text too when the encoder is split)."""
    import torch

    from attnviz.layer_inputs import LayerStates, threads_for
    from attnviz.models.capture import Wanted
    from attnviz.own_layer import build_layer

    if not _post_norm(loaded):
        raise AttnvizError(f"why splits {loaded.family.name}'s cross-attention (--stack cross), not its self-attentions: the relative position bias their scores add is not split yet")
    layer, stack = spec.layer, spec.stack or "encoder"
    inputs = encoded.queries.model_inputs(spec.device)
    source = encoded.source.model_inputs(spec.device) if stack == "decoder" else inputs
    wanted = Wanted(frozenset({layer}), calls=True, z_merged=True, mlp=True, embedded=True)
    with torch.inference_mode(), threads_for(encoded):
        captured = loaded.model.stacks_pass(inputs, source, {stack: wanted} | ({"cross": Wanted(z_merged=True)} if stack == "decoder" else {}))
        entered = captured[stack].x[layer].hidden  # (1, N, D): the stream as it is (post-norm: no norm before the attention)
        with loaded.model.norms_resident():  # read a layer's weights at a time: every norm the walks read, after the pass
            attention = build_layer(loaded, spec)
            scores = layer_scores(attention, LayerStates(entered, entered), spec.causal)[head, query]  # (N,)
            weights = scores.softmax(dim=-1)
            key = int(weights.argmax()) if key is None else key
            rows = torch.tensor([query, key])
            if stack == "decoder":
                parts = _post_norm_decoder_parts(loaded, captured, inputs["input_ids"], layer, rows, entered[0][rows].double(), before_self=True)
            else:
                parts = _post_norm_encoder_parts(loaded, captured["encoder"], inputs["input_ids"], rows, entered[0][rows].double(), stop=layer)
            query_names, query_vectors = side_vectors(attention, parts, rows, "q")  # (P, 2, H, d)
            key_names, key_vectors = side_vectors(attention, parts, rows, "k")
            terms = attention.scale * (query_vectors[:, 0, head] @ key_vectors[:, 1, head // attention.group_size].T)  # (P, P)
    return ScoreTerms(
        layer=layer, head=head, query=query, key=key, score=float(scores[key]), weight=float(weights[key]),
        query_parts=query_names, key_parts=key_names, terms=terms.cpu().numpy(), tokens=list(encoded.queries.tokens[0]),
        shown_tokens=list(encoded.queries.shown[0] or encoded.queries.tokens[0]),
    )  # fmt: skip


def _check(parts, expected, what: str) -> None:
    """parts (P, R, D) must add up to expected (R, D), within float32's rounding."""
    if (parts.sum(dim=0) - expected).abs().max() > TOLERANCE * max(1.0, float(expected.abs().max())):
        raise RuntimeError(f"{what} is not the sum of its parts")


def _embedded(loaded, ids, rows, entering, label: str):
    """(names, (P, R, D)): a stack's token embedding at rows, and what the stream entering its first layer holds besides
    ("pos"; none for T5, whose first layer reads the embedding as it is)."""
    import torch

    embed = loaded.model.get_input_embeddings()(ids.to(entering.device))[0][rows].double()  # (R, D)
    if (entering - embed).abs().max() == 0:
        return [f"{label}embed"], embed[None]
    return [f"{label}embed", f"{label}pos"], torch.stack([embed, entering - embed])


def _decoder_parts(loaded, captured: dict, ids, layer: int, rows, entered):
    """(names, (P, R, D) float64) at decoder positions `rows`: the decoder's stream entering layer `layer`'s
    cross-attention, its parts through the norm before it with its scale frozen; checked against the stream entering
    each decoder layer and against what entered the cross-attention (entered, (R, D))."""
    import torch

    model = loaded.model
    decoder, cross = captured["decoder"], captured["cross"]
    names, parts = _embedded(loaded, ids, rows, decoder.recorded().entering(0)[0][rows].double(), "")
    for earlier in range(layer + 1):
        _check(parts, decoder.recorded().entering(earlier)[0][rows].double(), f"decoder layer {earlier}'s input")
        more, added = head_parts(model.attention_weights(earlier, "decoder"), decoder.z_merged[earlier][0][rows], f"L{earlier}")
        names, parts = names + more, torch.cat([parts, added])
        if earlier == layer:
            break
        more, added = head_parts(model.attention_weights(earlier, "cross"), cross.z_merged[earlier][0][rows], f"X{earlier}")
        names, parts = names + more + [f"mlp{earlier}"], torch.cat([parts, added, decoder.mlp[earlier][0][rows].double()[None]])
    norm = model.get_submodule(loaded.family.cross_attention_norm.format(index=layer))
    names, parts = frozen_norm(norm, names, parts, parts.sum(dim=0))
    _check(parts, entered, f"what entered decoder layer {layer}'s cross-attention")
    return names, parts


def _encoder_parts(loaded, encoder, ids, rows, output):
    """(names, (P, R, D) float64) at encoder positions `rows`: the encoder's output, its parts ("enc.embed", each layer's
    heads "enc.L3H5" and MLP "enc.mlp3") through its final norm with its scale frozen; checked against the stream
    entering each encoder layer, the stream entering the final norm, and the output (R, D)."""
    import torch

    model = loaded.model
    names, parts = _embedded(loaded, ids, rows, encoder.recorded().entering(0)[0][rows].double(), "enc.")
    for layer in range(len(encoder.z_merged)):
        _check(parts, encoder.recorded().entering(layer)[0][rows].double(), f"encoder layer {layer}'s input")
        more, added = head_parts(model.attention_weights(layer, "encoder"), encoder.z_merged[layer][0][rows], f"enc.L{layer}")
        names, parts = names + more + [f"enc.mlp{layer}"], torch.cat([parts, added, encoder.mlp[layer][0][rows].double()[None]])
    _check(parts, encoder.final_in[0][rows].double(), "what entered the encoder's final norm")
    names, parts = frozen_norm(model.get_submodule(loaded.family.final_norm_name("encoder")), names, parts, parts.sum(dim=0))
    _check(parts, output, "the encoder's output")
    return names, parts


def _post_norm_embedded(loaded, captured, ids, rows, side: str, label: str):
    """(names, (P, R, D)): a post-norm side's embeddings at rows, the token's (scaled, as the model scales it) and the
    position's (what entered the embeddings' norm, or the first layer, less the token's), through BART's
    layernorm_embedding with its scale frozen (Marian has none)."""
    import torch

    module = loaded.model.get_submodule(side)
    embed = (module.embed_tokens(ids.to(captured.recorded().entering(0).device)) * getattr(module, "embed_scale", 1.0))[0][rows].double()
    summed = (captured.embedded if captured.embedded is not None else captured.recorded().entering(0))[0][rows].double()
    names, parts = [f"{label}embed", f"{label}pos"], torch.stack([embed, summed - embed])
    if captured.embedded is None:
        return names, parts
    return through_norm(names, parts, loaded.model.get_submodule(loaded.family.embedding_norm_name(side)), f"{label}emb.norm.bias")


def _norm(loaded, name: str):
    return loaded.model.get_submodule(name)


def _post_norm_decoder_parts(loaded, captured: dict, ids, layer: int, rows, entered, before_self: bool = False):
    """(names, (P, R, D) float64) at decoder positions `rows`: what enters decoder layer `layer`'s cross-attention in a
    post-norm encoder-decoder (BART, Marian): the stream after that layer's self-attention and its norm. Each part goes
    through every norm on the way with its scale frozen, each norm's bias a part of its own ("L3.norm1.bias" after the
    self-attention, "L3.norm2.bias" after the cross-attention, "L3.norm3.bias" after the MLP); checked against the
    stream entering each layer and against what entered the cross-attention (entered, (R, D)). before_self: the stream
    entering layer `layer` instead, what its self-attention reads (entered is then that stream)."""
    import torch

    model = loaded.model
    decoder, cross = captured["decoder"], captured["cross"]
    names, parts = _post_norm_embedded(loaded, decoder, ids, rows, "decoder", "")
    for earlier in range(layer + 1):
        _check(parts, decoder.recorded().entering(earlier)[0][rows].double(), f"decoder layer {earlier}'s input")
        if before_self and earlier == layer:
            break
        norms = [_norm(loaded, name) for name in loaded.family.sublayer_norms(earlier, "decoder")]
        more, added = head_parts(model.attention_weights(earlier, "decoder"), decoder.z_merged[earlier][0][rows], f"L{earlier}")
        names, parts = through_norm(names + more, torch.cat([parts, added]), norms[0], f"L{earlier}.norm1.bias")
        if earlier == layer:
            break
        more, added = head_parts(model.attention_weights(earlier, "cross"), cross.z_merged[earlier][0][rows], f"X{earlier}")
        names, parts = through_norm(names + more, torch.cat([parts, added]), norms[1], f"L{earlier}.norm2.bias")
        mlp = decoder.mlp[earlier][0][rows].double()[None]
        names, parts = through_norm(names + [f"mlp{earlier}"], torch.cat([parts, mlp]), norms[2], f"L{earlier}.norm3.bias")
    _check(parts, entered, f"what entered decoder layer {layer}'s {'self' if before_self else 'cross'}-attention")
    return names, parts


def _post_norm_encoder_parts(loaded, encoder, ids, rows, output, stop: int | None = None):
    """(names, (P, R, D) float64) at encoder positions `rows`: a post-norm encoder's output, its parts ("enc.embed",
    "enc.pos", each layer's heads "enc.L3H5" and MLP "enc.mlp3") through every norm with its scale frozen, each norm's
    bias a part of its own; checked against the stream entering each layer and the output (R, D). stop: the stream
    entering layer `stop` instead, what its self-attention reads (output is then that stream)."""
    import torch

    model = loaded.model
    names, parts = _post_norm_embedded(loaded, encoder, ids, rows, "encoder", "enc.")
    for layer in range(len(encoder.z_merged)):
        _check(parts, encoder.recorded().entering(layer)[0][rows].double(), f"encoder layer {layer}'s input")
        if layer == stop:
            break
        norm1, norm2 = (_norm(loaded, name) for name in loaded.family.sublayer_norms(layer, "encoder"))
        more, added = head_parts(model.attention_weights(layer, "encoder"), encoder.z_merged[layer][0][rows], f"enc.L{layer}")
        names, parts = through_norm(names + more, torch.cat([parts, added]), norm1, f"enc.L{layer}.norm1.bias")
        mlp = encoder.mlp[layer][0][rows].double()[None]
        names, parts = through_norm(names + [f"enc.mlp{layer}"], torch.cat([parts, mlp]), norm2, f"enc.L{layer}.norm2.bias")
    _check(parts, output, "the encoder's output" if stop is None else f"what entered encoder layer {stop}'s self-attention")
    return names, parts

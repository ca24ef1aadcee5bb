"""The edges of a circuit for a prompt pair: edge attribution patching (EAP, EAP-IG) and path patching to check it.

The graph (Conmy et al. 2023's, PAPERS): the senders are the heads, each writing its output into the residual stream
(its d features z through its slice of W_o: out = W_o[:, h] z_h, (N, D)); the receivers are each later head's query
input and each later key/value head's key and value inputs (with grouped-query attention a key/value head serves a
group of query heads, and is one receiver: L3KV1.k), and the metric's read-out (the stream entering the final norm,
"logits"). A receiver reads the stream through its layer's norm: its input is the stream x entering the layer, and
its projection is of norm(x) alone (q_h = W_q[h] norm(x) + b; the norm's scale depends on x, so nothing is frozen).
An edge sender -> receiver is the sender's out added to that receiver's copy of x alone.

- EAP (Syed, Rager and Conmy 2023): score(e) = sum over positions of (out_clean - out_corrupt) . dm/dx_r, the
  gradient of the metric m (patching.py's logit difference) with respect to the receiver's own copy of its input,
  on the corrupted run. One forward and one backward pass give every edge: the backward gives dm/d(W_q's output),
  and for each head h, dm/dx_(h, q) = J_norm(x)^T W_q[h]^T dm/dq_h (autograd through the layer's own norm module
  and projection, over H copies of x, one per head).
- EAP-IG (Hanna, Pezzelle and Belinkov 2024): the gradient averaged over N points between the corrupted and the clean
  input, as their code does: the embeddings entering the first layer interpolated, e_k = e_corrupt + (k / N)
  (e_clean - e_corrupt) for k = 0 .. N - 1 (with N = 1, EAP), one batch of N copies, one forward and one backward.
- Path patching (Wang et al. 2022, an edge as Conmy et al.'s ACDC patches it): the corrupted run with the sender's out
  added to the receiver's copy of its input alone, every other path from the sender (through other heads and the
  MLPs) left corrupt; the metric's change. The first-order terms of that change are EAP's score, so the two agree
  where the model is near linear along the edge.

Both numbers are normalised as patching's scores are: divided by m_clean - m_corrupt (1 = the whole clean answer).

A post-norm encoder (BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT, ALBERT; read by its masked-LM head at the mask)
normalises after each sublayer instead. Its layer l: pre1 = x_l + sum_h out_h + b_o; y = LN1(pre1); pre2 = y + MLP(y);
x_(l+1) = LN2(pre2). A sender head writes its out into pre1 of its layer; the receivers are each later layer's heads'
q, k and v inputs (x_r itself: the projections read it with no norm before them) and the read-out (the last layer's
output x_L, which the masked-LM head's transform and W_U read at the mask). An edge s -> r is the sender's
out_clean - out_corrupt carried along the residual path alone to the receiver's own copy of its input: every sublayer
on the way (the other heads, the MLPs) held at the corrupted run's values, the norms on the way (LN1 and LN2 of each
layer from the sender's to the one before the receiver's) recomputed as functions. That is path patching, exact; EAP's
score is its first-order term, (out_clean - out_corrupt) . J_path^T dm/dx_r, J_path the Jacobian of that chain of
norms at the corrupted run (EAP-IG: at each interpolated copy, the products averaged). One backward sweep carries
every later receiver's gradient through each layer's two norms once (edges_postnorm.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnviz.run_data import Progress

PAPERS = {
    "eap": 'Syed, Rager and Conmy, 2023, "Attribution Patching Outperforms Automated Circuit Discovery" (arXiv '
    "2310.10348): edge attribution patching",
    "eap_ig": 'Hanna, Pezzelle and Belinkov, COLM 2024, "Have Faith in Faithfulness: Going Beyond Circuit Overlap When '
    'Finding Model Mechanisms" (arXiv 2403.17806): EAP with integrated gradients',
    "path_patching": 'Wang, Variengien, Conmy, Shlegeris and Steinhardt, ICLR 2023, "Interpretability in the Wild" '
    "(arXiv 2211.00593): path patching",
    "graph": 'Conmy, Mavor-Parker, Lynch, Heimersheim and Garriga-Alonso, NeurIPS 2023, "Towards Automated Circuit '
    'Discovery for Mechanistic Interpretability" (arXiv 2304.14997): the heads\' graph, edges as ACDC patches them',
}
INPUTS = {
    "q": "the receiver head's query input: the stream entering its layer, through the layer's norm and its rows of W_q",
    "k": "the receiver key/value head's key input (its rows of W_k; with grouped-query attention one receiver for its "
    "group of query heads)",
    "v": "the receiver key/value head's value input (its rows of W_v)",
    "logits": "the metric's read-out: the stream entering the final norm, at every position",
}
POST_NORM_INPUTS = {
    "q": "the receiver head's query input: the stream entering its layer (a post-norm layer's output, read with no "
    "norm before the projection) through its rows of W_q",
    "k": "the receiver head's key input (its rows of W_k)",
    "v": "the receiver head's value input (its rows of W_v)",
    "logits": "the metric's read-out: the last layer's output, which the masked-LM head reads at the mask",
}
POST_NORM_PATH = (
    "; a post-norm encoder's: the sender's difference reaches the receiver along the residual path alone, through the "
    "norms after each sublayer on the way (recomputed for path patching, their Jacobians at the run for the score), the "
    "other heads and the MLPs held at the corrupted run's values"
)
SCORE = (
    "EAP: sum over positions of (sender out_clean - out_corrupt) . dm/d(receiver input) on the corrupted run, "
    "divided by m_clean - m_corrupt"
)
SCORE_IG = (
    "EAP-IG: sum over positions of (sender out_clean - out_corrupt) . the mean of dm/d(receiver input) over N runs whose "
    "first layer's input is e_corrupt + (k / N) (e_clean - e_corrupt), k = 0 .. N - 1; divided by m_clean - m_corrupt"
)
PATCHED = (
    "path patching: m of the corrupted run with the sender's out_clean - out_corrupt added to that receiver's input "
    "alone (every other path from the sender left corrupt), minus m_corrupt, divided by m_clean - m_corrupt"
)
CHECKED = 10  # the edges checked by path patching, by |score|
DRAWN = 30  # the edges edges.png and the report's Edges view draw, by |score|


@dataclass(frozen=True)
class EdgeSettings:
    """What patch's --edges asks: EAP-IG's steps (None: EAP) and how many top edges path patching checks."""

    ig: int | None = None
    checked: int = CHECKED


@dataclass(frozen=True)
class Edge:
    """One edge: sender head (layer, head) -> receiver (layer, head, input), input "q", "k", "v" or "logits" (layer
    and head None); for k and v the head is the key/value head's index."""

    sender: tuple[int, int]
    layer: int | None
    head: int | None
    input: str


@dataclass
class Edges:
    """Every edge's score, normalised by m_clean - m_corrupt: scores["q"] (L, H, L, H), scores["k"] and ["v"]
    (L, H, L, H_kv) indexed [sender layer, sender head, receiver layer, receiver head], NaN where the receiver's layer
    is not after the sender's; scores["logits"] (L, H). checked: the top edges by |score| with their path-patched
    value. ig: EAP-IG's steps, None for EAP."""

    scores: dict[str, np.ndarray]
    checked: list[tuple[Edge, float, float]]  # (edge, score, path patched)
    ig: int | None
    num_heads: int
    num_kv_heads: int
    post_norm: bool = False  # a post-norm encoder's: each edge carried through the norms on its path
    grouped: bool = field(init=False)

    def __post_init__(self):
        self.grouped = self.num_kv_heads != self.num_heads

    def score(self, edge: Edge) -> float:
        values = self.scores[edge.input]
        if edge.input == "logits":
            return float(values[edge.sender])
        return float(values[(*edge.sender, edge.layer, edge.head)])

    def ranked(self, limit: int | None = None) -> list[Edge]:
        """The edges by |score|, largest first (the first `limit` of them, or every edge)."""
        names = list(self.scores)
        where = [np.flatnonzero(np.isfinite(self.scores[name])) for name in names]  # each input's edges, flat indices
        values = np.concatenate([self.scores[name].ravel()[flat] for name, flat in zip(names, where)])
        owner = np.concatenate([np.full(len(flat), index) for index, flat in enumerate(where)])
        flats = np.concatenate(where)
        found = []
        for at in np.argsort(-np.abs(values), kind="stable")[:limit]:
            name = names[owner[at]]
            index = tuple(int(i) for i in np.unravel_index(flats[at], self.scores[name].shape))
            found.append(Edge(index[:2], None, None, name) if name == "logits" else Edge(index[:2], index[2], index[3], name))
        return found

    def name(self, edge: Edge) -> str:
        return f"{node_name(*edge.sender)} -> {receiver_name(edge, self.grouped)}"


def node_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def receiver_name(edge: Edge, grouped: bool) -> str:
    """"L3H5.q", "L3KV1.k" (grouped-query: the key/value head), "L3H1.k" (one key/value head per head), "logits"."""
    if edge.input == "logits":
        return "logits"
    kind = "KV" if grouped and edge.input in ("k", "v") else "H"
    return f"L{edge.layer}{kind}{edge.head}.{edge.input}"


@dataclass(frozen=True)
class ReadOut:
    """Where and how the metric reads the model's last hidden state h: m = transform(h[position]) . direction + offset,
    transform None (a decoder's language-model head: linear) or an encoder's masked-LM head's (dense, activation,
    LayerNorm: models/masked_lm.py)."""

    position: int
    direction: object  # (E,) float64 tensor: W_U[answer] - W_U[wrong]
    offset: float
    transform: object = None

    def metric(self, last):  # last (C, N, D) -> (C,)
        hidden = last[:, self.position] if self.transform is None else self.transform(last[:, self.position])
        return hidden.double() @ self.direction + self.offset


def check_edges(loaded, stack) -> None:
    """Edges need a stream that is a sum of the heads' outputs, read by each layer through its own norm (a pre-norm
    decoder whose adapter names that norm), or a post-norm encoder whose adapter names its norms (edges_postnorm.py).
    Refused otherwise, in one line, before any pass."""
    from attnviz.analysis.edges_postnorm import post_norm
    from attnviz.errors import AttnvizError, option
    from attnviz.models.families import DECODER

    family = loaded.family
    pre_norm = family.kind == DECODER and family.attention_norm is not None and not loaded.is_bert
    if not (pre_norm or post_norm(loaded)):
        raise AttnvizError(
            f"{option('edges', True)} needs a decoder that normalises each layer's input before its attention (Llama, Qwen, SmolLM2, "
            f"GPT-2) or a post-norm encoder (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT): {loaded.name} is a {family.kind} "
            f"of the {family.name} family, whose heads reach later layers through cross-attention or norms attnviz does not name"
        )


def circuit_edges(
    loaded, spec, clean, corrupted, read: ReadOut, m_clean: float, m_corrupt: float, settings: EdgeSettings = EdgeSettings(),
    progress: Progress = Progress(),
) -> Edges:  # fmt: skip
    """Every edge's EAP (settings.ig None) or EAP-IG (settings.ig steps) score and the top settings.checked edges' path
    patching, from the two texts' passes (patching.text_pass's TextPass) and one differentiated pass of N copies
    (N = ig or 1)."""
    import torch

    from attnviz.analysis.edges_postnorm import post_norm

    model, stack = loaded.model, spec.stack
    weights = EachLayer(model, stack, loaded.num_layers_of(stack))
    num_layers, num_heads, num_kv = len(weights), weights.num_heads, weights.num_kv_heads
    with torch.inference_mode():
        written = torch.stack([_written(clean.recorded, corrupted.recorded, layer, each) for layer, each in enumerate(weights)])  # (L, H, N, D)
    ig = settings.ig
    scale = 1.0 / (m_clean - m_corrupt)
    if post_norm(loaded):
        from attnviz.analysis.edges_postnorm import post_norm_scores

        scores, norms = post_norm_scores(loaded, spec, weights, written, clean.recorded, corrupted.recorded, read, ig or 1, scale)
        edges = Edges(scores, [], ig, num_heads, num_kv, post_norm=True)

        def carried(edge: Edge):  # (1, N, D): the sender's difference carried to the receiver's layer (the read-out's: past the last)
            return norms.carried(written[edge.sender], edge.sender[0], num_layers if edge.input == "logits" else edge.layer)

        check_by_path_patching(loaded, spec, weights, corrupted, read, edges, settings, carried, (m_corrupt, scale), progress)
        return edges
    gradients, final = _input_gradients(loaded, spec, weights, clean.recorded, corrupted.recorded, read, ig or 1)
    roles = (("q", num_heads), ("k", num_kv), ("v", num_kv))
    scores = {role: np.full((num_layers, num_heads, num_layers, count), np.nan) for role, count in roles}
    senders = written.flatten(2)  # (L, H, N * D)
    for layer in range(1, num_layers):  # the senders before it (l * H, N * D) @ its receivers (N * D, q's H + k's and v's H_kv)
        receivers = torch.cat([gradients[layer][role] for role, _ in roles], dim=1)  # (N, R, D)
        values = (senders[:layer].flatten(0, 1) @ receivers.transpose(1, 2).flatten(0, 1)).view(layer, num_heads, -1).cpu().numpy()
        for (role, count), part in zip(roles, np.split(values * scale, np.cumsum([count for _, count in roles])[:-1], axis=2)):
            scores[role][:layer, :, layer] = part
    scores["logits"] = (senders @ final.flatten()).cpu().numpy() * scale  # (L, H)
    edges = Edges(scores, [], ig, num_heads, num_kv)

    def received(edge: Edge):  # (1, N, D): what the receiver reads with the sender's difference added to its input alone
        added = written[edge.sender]  # (N, D) float64
        if edge.input == "logits":  # the stream entering the final norm: the read-out's input
            entered = corrupted.captured.final_in
            return model.layer_stack(stack).final(entered + added.to(entered.dtype))
        x = corrupted.recorded.entering(edge.layer)  # (1, N, D): the stream entering the receiver's layer
        return attention_norm(loaded, edge.layer, stack)(x + added.to(x.dtype))

    check_by_path_patching(loaded, spec, weights, corrupted, read, edges, settings, received, (m_corrupt, scale), progress)
    return edges


class EachLayer:
    """Each layer's AttentionWeights (model.attention_weights), read as it is asked for, never held together: a model
    read a layer's weights at a time has one layer's at a time (a whole model's are views of its own)."""

    def __init__(self, model, stack, num_layers: int):
        self.model, self.stack, self.num_layers = model, stack, num_layers
        first = model.attention_weights(0, stack)
        self.num_heads, self.num_kv_heads = first.num_heads, first.num_kv_heads

    def __len__(self) -> int:
        return self.num_layers

    def __getitem__(self, layer: int):
        if not 0 <= layer < self.num_layers:
            raise IndexError(layer)
        return self.model.attention_weights(layer, self.stack)


def check_by_path_patching(loaded, spec, weights, corrupted, read: ReadOut, edges: Edges, settings: EdgeSettings, received,
                           normalise: tuple[float, float], progress: Progress) -> None:  # fmt: skip
    """edges.checked: the top settings.checked edges by |score|, each with its path patching, normalised ((m_patched -
    m_corrupt) * scale, normalise = (m_corrupt, scale)); received(edge): what the edge's receiver reads, (1, N, D)."""
    import torch

    m_corrupt, scale = normalise
    chosen = edges.ranked(settings.checked)
    advance = progress.counting("edges checked by path patching", len(chosen))
    for edge in chosen:
        with torch.inference_mode(), loaded.model.norms_resident():  # the norms on its way, read a layer at a time
            given = received(edge)
        patched = _path_patched(loaded, spec, weights[edge.layer] if edge.layer is not None else None, corrupted, read, edge, given)
        edges.checked.append((edge, edges.score(edge), (patched - m_corrupt) * scale))
        advance(1)


def _written(clean, corrupted, layer: int, weights):
    """(H, N, D) float64: each head's out_clean - out_corrupt at layer, its z difference through its slice of W_o
    (W_o's bias is the same in both runs)."""
    import torch

    w_o = weights.w_o[0].double()  # (D, H * d)
    difference = (clean.heads[layer][0] - corrupted.heads[layer][0]).double()  # (N, H * d)
    num_tokens = difference.shape[0]
    z = difference.view(num_tokens, weights.num_heads, weights.head_dim)  # (N, H, d)
    return torch.einsum("nhd,Dhd->hnD", z, w_o.view(w_o.shape[0], weights.num_heads, weights.head_dim))


def _input_gradients(loaded, spec, weights: "EachLayer", clean, corrupted, read: ReadOut, steps: int):
    """dm/d(each receiver's copy of its input), averaged over the steps' copies: ([layer]{"q": (N, H, D), "k", "v":
    (N, H_kv, D)}, the final norm's input's (N, D)), all float64, from one forward and one backward pass of the
    corrupted run (the first layer's input interpolated towards the clean one's with steps > 1). weights: each
    layer's AttentionWeights."""
    import torch

    from attnviz.analysis.edge_gradients import interpolated, through_norm, through_rows
    from attnviz.models.capture import hook_layers, projection_slice

    model, stack = loaded.model, spec.stack
    num_layers = len(weights)
    norms = [attention_norm(loaded, layer, stack) for layer in range(num_layers)]
    slices = [{role: projection_slice(model, each, role) for role in ("q", "k", "v")} for each in weights]
    modules = [list({id(each[0]): each[0] for each in layer.values()}.values()) for layer in slices]  # fused: c_attn once
    entering = {}, {}, []  # the norms' inputs, the projections' outputs by (layer, module), the final norm's input
    first = interpolated(clean, corrupted, steps)

    def hooks():
        inputs, outputs, final = entering
        handles = hook_layers(norms, lambda layer, args, kwargs: inputs.setdefault(layer, args[0]))
        for layer, owned in enumerate(modules):
            for module in owned:
                handles.append(module.register_forward_hook(lambda m, args, out, layer=layer: outputs.setdefault((layer, id(m)), out)))
        handles.append(model.layer_stack(stack).final.register_forward_pre_hook(lambda m, args: final.append(args[0])))
        return handles

    last = model.differentiable_run(first, corrupted, stack, hooks)
    inputs, outputs, final = entering
    keys = list(outputs)
    grads = torch.autograd.grad(read.metric(last).sum(), [outputs[key] for key in keys] + [final[0]])
    by_key = dict(zip(keys, grads[:-1]))
    gradients = []
    with model.norms_resident():  # read a layer's weights at a time: the norms, outside their layers' passes
        for layer, each in enumerate(weights):
            rows = {"q": each.w_q[0], "k": each.w_k[0], "v": each.w_v[0]}  # (n * d, D) each, nn.Linear's layout
            # dm/d(norm output) for each receiver alone: head i's gradient at its d features through its rows, (C, N, n, D)
            through = {role: through_rows(by_key[(layer, id(each[0]))], each, rows[role]) for role, each in slices[layer].items()}
            together = through_norm(norms[layer], inputs[layer].detach(), torch.cat(list(through.values()), dim=2))
            gradients.append(dict(zip(through, together.split([part.shape[2] for part in through.values()], dim=1))))
    return gradients, grads[-1].double().mean(dim=0)


def attention_norm(loaded, layer: int, stack):
    """The norm module before layer `layer`'s attention (the family adapter's attention_norm)."""
    family = loaded.family
    return loaded.model.get_submodule(family.attention_norm.format(index=family.stored_index(loaded.model.config, layer, stack)))


def _path_patched(loaded, spec, weights, corrupted, read: ReadOut, edge: Edge, given) -> float:
    """m of the corrupted run with the edge's receiver alone reading `given` (1, N, D): the read-out's last hidden state,
    or a head's projection input (weights: the receiver layer's AttentionWeights)."""
    import torch

    from attnviz.models.capture import projection_slice

    model, stack = loaded.model, spec.stack
    with torch.inference_mode():
        if edge.input == "logits":
            return float(read.metric(given)[0])
        module, offset, _, head_dim = projection_slice(model, weights, edge.input)
        x = corrupted.recorded.entering(edge.layer)  # (1, N, D): the stream entering the receiver's layer
        part = slice(offset + edge.head * head_dim, offset + (edge.head + 1) * head_dim)
        with model.resident(weights.names[{"q": "w_q", "k": "w_k", "v": "w_v"}[edge.input]]):  # read a layer at a time
            replacement = module(given)[..., part]

        def change(y):  # the receiver's slice of the projection's output, from its own input
            y = y.clone()
            y[..., part] = replacement
            return y

        last = model.run_from(edge.layer, x, corrupted.recorded, stack=stack, output=(module, change))
        return float(read.metric(last)[0])

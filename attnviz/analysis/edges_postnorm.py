"""The edges of a post-norm encoder's circuit: each head's output carried to its receivers through the norms after
each sublayer (BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT, ALBERT, read by the masked-LM head at the mask).

edges.py's docstring gives the definition. A post-norm layer l: pre1 = x_l + sum_h out_h + b_o; y = LN1(pre1);
pre2 = y + MLP(y); x_(l+1) = LN2(pre2). With every sublayer held at the corrupted run's values, a change d of pre1 in
layer l reaches the next layer's input as LN2(pre2 + LN1(pre1 + d) - LN1(pre1)) - x_(l+1), and so on to the receiver;
its first-order term is J^T of each norm in turn, at the corrupted run (the MLP's residual adds y unchanged).

- EAP: one differentiated pass of the corrupted run (edge_gradients.interpolated's N copies for EAP-IG) gives
  dm/d(each receiver's copy of its input): a head's through its rows of W_q, W_k or W_v (edge_gradients.through_rows),
  the read-out's dm/dx_L. Then one backward sweep, from the last layer down: the receivers of the layers after l (and
  the read-out), carried to x_(l+1), go back through l's LN2 and LN1 (autograd through the model's own norm modules
  over a copy per receiver: edge_gradients.through_norm) and arrive at pre1 of layer l, where the senders of layer l
  write; there layer l's own receivers join them (pre1 = x_l + ...). L layers, 2 L norm VJPs over at most
  3 H (L - 1) + 1 receivers each.
- Path patching: the corrupted run with the sender's out_clean - out_corrupt carried by Norms.carried to the
  receiver's layer, the receiver alone reading it (edges.py); the norms' inputs are the differentiated pass's first
  copy's, the corrupted run's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def post_norm(loaded) -> bool:
    """A post-norm encoder whose family names its norms (post_norm_names), as why.py splits it."""
    from attnviz.analysis.why import splits_post_norm
    from attnviz.models.families import ENCODER

    return loaded.family.kind == ENCODER and splits_post_norm(loaded)


@dataclass
class Norms:
    """Each layer's two norms, LN1 after the attention and LN2 after the MLP (the model's own modules; ALBERT's
    layers share them), and what entered them in the corrupted run: pre1[l], pre2[l] (1, N, D)."""

    modules: list[tuple]
    pre1: list
    pre2: list

    def carried(self, added, sender: int, receiver: int):
        """(1, N, D): the stream entering layer `receiver` (the last hidden state for receiver L) when added (N, D)
        joins pre1 of layer `sender` and travels along the residual path alone, the norms recomputed, every sublayer
        held at the corrupted run's values."""
        change = added.to(self.pre1[sender].dtype)  # what pre1 of the layer gains
        for layer in range(sender, receiver):
            norm1, norm2 = self.modules[layer]
            pre1, pre2 = self.pre1[layer], self.pre2[layer]
            x = norm2(pre2 + norm1(pre1 + change) - norm1(pre1))  # (1, N, D): the MLP's output held
            change = x - norm2(pre2)  # pre1 of the next layer is x plus its attention's, held
        return x


def post_norms(loaded, layer: int) -> tuple:
    """Layer `layer`'s (LN1, LN2): the modules the family adapter names (post_norm_names of its stored layer)."""
    model = loaded.model
    index = layer if loaded.is_bert else loaded.family.stored_index(model.config, layer, None)
    return tuple(model.get_submodule(name) for name in loaded.family.post_norm_names(index))


def post_norm_scores(loaded, spec, weights, written, clean, corrupted, read, steps: int, scale: float):
    """(scores, Norms): edges.Edges' scores of a post-norm encoder by EAP (steps 1) or EAP-IG, from one differentiated
    pass and one backward sweep; Norms carries a sender's difference for path patching. written (L, H, N, D): each
    head's out_clean - out_corrupt; clean and corrupted: the texts' Recorded; scale 1 / (m_clean - m_corrupt)."""
    num_layers, num_heads, num_kv = len(weights), weights.num_heads, weights.num_kv_heads
    arrived, norms = _swept_gradients(loaded, spec, weights, clean, corrupted, read, steps)
    roles = (("q", num_heads), ("k", num_kv), ("v", num_kv))
    scores = {role: np.full((num_layers, num_heads, num_layers, count), np.nan) for role, count in roles}
    scores["logits"] = np.zeros((num_layers, num_heads))
    for layer in range(num_layers):  # its senders (H, N * D) @ the receivers after it, arrived at its pre1 (N * D, R)
        values = (written[layer].flatten(1) @ arrived[layer].transpose(0, 1).flatten(1).T).cpu().numpy() * scale  # (H, R)
        at = 0
        for receiver in range(layer + 1, num_layers):
            for role, count in roles:
                scores[role][layer, :, receiver] = values[:, at : at + count]
                at += count
        scores["logits"][layer] = values[:, at]
    return scores, norms


def _swept_gradients(loaded, spec, weights, clean, corrupted, read, steps: int):
    """([layer] (N, R_l, D) float64, Norms): for each layer l, dm/d(each receiver's copy of its input) carried back to
    pre1 of layer l through the norms on the way, averaged over the steps' copies; the receivers (R_l) are layer
    l + 1's q (H), k and v (H_kv) heads, then layer l + 2's, ..., then the read-out. Norms: the corrupted run's (the
    first copy's, k = 0). clean and corrupted: the texts' Recorded."""
    import torch

    from attnviz.analysis.edge_gradients import interpolated, through_norm, through_rows
    from attnviz.models.capture import hook_layers, projection_slice

    model, stack = loaded.model, spec.stack
    num_layers = len(weights)
    modules = [post_norms(loaded, layer) for layer in range(num_layers)]
    slices = [{role: projection_slice(model, each, role) for role in ("q", "k", "v")} for each in weights]
    outputs, entering = {}, {}  # (role, layer): the projection's output; (0 or 1, layer): what entered LN1 or LN2
    first = interpolated(clean, corrupted, steps)

    def hooks():  # by call order: ALBERT's layers share their modules (hook_layers)
        handles = []
        for role in ("q", "k", "v"):
            keep = lambda layer, args, kwargs, out, role=role: outputs.setdefault((role, layer), out)  # noqa: E731
            handles += hook_layers([each[role][0] for each in slices], keep, after=True)
        for which in (0, 1):
            keep = lambda layer, args, kwargs, which=which: entering.setdefault((which, layer), args[0])  # noqa: E731
            handles += hook_layers([each[which] for each in modules], keep)
        return handles

    last = model.differentiable_run(first, corrupted, stack, hooks)  # (C, N, D): x_L
    keys = list(outputs)
    grads = torch.autograd.grad(read.metric(last).sum(), [outputs[key] for key in keys] + [last])
    by_key = dict(zip(keys, grads[:-1]))
    carried = grads[-1].unsqueeze(2)  # (C, N, 1, D): the read-out's, at x_L
    arrived = [None] * num_layers
    with model.norms_resident():  # read a layer's weights at a time: the norms, outside their layers' passes
        for layer in reversed(range(num_layers)):
            norm1, norm2 = modules[layer]
            at_y = through_norm(norm2, entering[(1, layer)].detach(), carried, mean=False)  # at y: the MLP held, pre2 = y + it
            at_pre1 = through_norm(norm1, entering[(0, layer)].detach(), at_y, mean=False)  # (C, N, R, D)
            arrived[layer] = at_pre1.double().mean(dim=0)
            if layer:  # at x_layer: its own receivers join, q, k, v by head
                each = weights[layer]
                rows = {"q": each.w_q[0], "k": each.w_k[0], "v": each.w_v[0]}
                own = [through_rows(by_key[(role, layer)], projection, rows[role]) for role, projection in slices[layer].items()]
                carried = torch.cat([*own, at_pre1], dim=2)
    pre1, pre2 = ([entering[(which, layer)][:1].detach() for layer in range(num_layers)] for which in (0, 1))
    return arrived, Norms(modules, pre1, pre2)

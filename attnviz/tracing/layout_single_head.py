"""The single-head tutorial's Self_attention, one unbatched sequence at a time.

Traced on attnviz's layer split into one head (d = D), or with the seed's own sizes (SeedHead:
W_q, W_k map D to d_q, W_v maps D to d_out, no W_o), as `--d-q` and `--d-out` build it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnviz.attention.layer import MultiHeadAttention
from attnviz.tracing.recorder import LayerInputs, LayoutTrace, Recorder, finish_trace


class SeedHead(nn.Module):
    """The single-head tutorial's layer with its own sizes: W_q, W_k: D to d_q, W_v: D to d_out, no bias, no W_o.

    Its scale is 1/sqrt(d_q); its output is C, (m, d_out). Random parameters from seed, nn.Linear's own
    initialisation, drawn on the CPU: the same for the same seed on any device.
    """

    def __init__(self, model_size: int, d_q: int, d_out: int, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.w_q = nn.Linear(model_size, d_q, bias=False)
            self.w_k = nn.Linear(model_size, d_q, bias=False)
            self.w_v = nn.Linear(model_size, d_out, bias=False)
        self.w_o = None
        self.num_heads = self.num_kv_heads = 1
        self.head_dim = d_q
        self.scale = 1 / math.sqrt(d_q)


def single_head(layer: MultiHeadAttention | SeedHead, inputs: LayerInputs, num_heads: int = 1) -> LayoutTrace:
    """The single-head tutorial's Self_attention.forward, one unbatched sequence at a time (H = 1, d = D).

    With trained weights, one head uses all of W_q, W_k and W_v: it equals the layer split
    into 1 head (scale 1/sqrt(D)), not into the model's own number of heads. A SeedHead has the
    seed's own sizes: Q and K (m, d_q), V and C (m, d_out), no W_o (C is the output). A batch runs one
    text at a time, its padding keys cut off instead of masked; the trace shows the text with
    the most padding.
    """
    batch, num_queries, model_size = inputs.queries.shape
    num_keys = inputs.keys_values.shape[1]
    head_dim = layer.w_q.out_features  # one head: d = D, or the seed's d_q
    seed_sizes = isinstance(layer, SeedHead)
    qk_axis, v_axis = ("d_q", "d_out") if seed_sizes else ("d", "d")
    valid = inputs.valid_lens.tolist() if inputs.valid_lens is not None else [num_keys] * batch
    shown = min(range(batch), key=lambda b: (valid[b], b))  # the most padding, else the first
    cut = inputs.valid_lens is not None
    self_attention = inputs.self_attention and not cut  # cut keys: Nk (real keys) is not Nq

    weights, outputs, recorders = [], [], []
    for b in range(batch):
        sizes = {"Nq": num_queries, "Nk": valid[b], "d": head_dim, "D": model_size}
        if seed_sizes:
            sizes |= {"d_q": head_dim, "d_out": layer.w_v.out_features}
        record = Recorder(sizes, self_attention, enabled=b == shown)
        x = record("x", inputs.queries[b], f"queries[{b}]", "Nq D")  # (Nq, D): one unbatched sequence
        if cut:
            x_kv = record(
                "x_kv", inputs.keys_values[b, : valid[b]], f"keys_values[{b}, :valid_lens[{b}]]", "Nk D",
                added="the tutorial takes one unpadded sequence: the padding keys are cut off, so nothing needs a mask",
            )  # (Nk, D)
        elif inputs.self_attention:
            x_kv = x
        else:
            x_kv = record(
                "x_kv", inputs.keys_values[b], f"keys_values[{b}]", "Nk D",
                added="the tutorial is self-attention: its keys and values come from x",
            )
        kv_name = "x" if x_kv is x else "x_kv"
        Q = record("q", layer.w_q(x), "self.Wq(x)", f"Nq {qk_axis}", (x,))
        K = record("k", layer.w_k(x_kv), f"self.Wk({kv_name})", f"Nk {qk_axis}", (x_kv,))
        V = record("v", layer.w_v(x_kv), f"self.Wv({kv_name})", f"Nk {v_axis}", (x_kv,))
        K_t = record("k_t", K.T, "K.T", f"{qk_axis} Nk", (K,), pattern="n d -> d n")
        scores = record(
            "scores", torch.matmul(Q, K_t) * (1 / math.sqrt(head_dim)), "torch.matmul(Q, K.T) * self._norm_fact",
            "Nq Nk", (Q, K_t), pattern="nq d, d nk -> nq nk", note=f"self._norm_fact = 1 / sqrt({qk_axis})",
        )
        if inputs.causal:
            mask = record(
                "mask", torch.tril(torch.ones(num_queries, valid[b], dtype=torch.bool, device=x.device)),
                "torch.tril(torch.ones(Nq, Nk, dtype=torch.bool))", "Nq Nk", added="the tutorial has no mask: --causal",
            )
            scores = record(
                "masked_scores", scores.masked_fill(~mask, float("-inf")), "scores.masked_fill(~mask, float('-inf'))",
                "Nq Nk", (scores, mask), added="the tutorial has no mask: --causal",
            )
        pattern = record(
            "pattern", torch.softmax(scores, dim=-1), f"torch.softmax({record.role_of(scores)}, dim=-1)", "Nq Nk", (scores,)
        )
        z = record(
            "z", torch.matmul(pattern, V), "torch.matmul(A, V)", f"Nq {v_axis}", (pattern, V), pattern="nq nk, nk d -> nq d"
        )
        out = z if seed_sizes else record(
            "out", layer.w_o(z), "self.w_o(C)", "Nq D", (z,),
            added="the tutorial returns C; W_o, so the output compares with the other layouts",
        )  # the seed's sizes: C is the output
        weights.append(F.pad(pattern, (0, num_keys - valid[b])))  # (Nq, Nk): the cut keys get weight 0
        outputs.append(out)
        recorders.append(record)

    names = (
        "Q, K, V, A, C are the tutorial's names for q, k, v, pattern, z; its A = torch.softmax(torch.matmul(Q, K.T) "
        "* self._norm_fact, dim=-1) is split into scores and pattern here"
    )
    if seed_sizes:
        d_out = layer.w_v.out_features
        notes = [
            f"the tutorial's own sizes: Wq, Wk map d_in = D = {model_size} to d_q = {head_dim}, Wv maps it to d_out = {d_out}, "
            f"bias=False, scale 1/sqrt(d_q) = 1/sqrt({head_dim}); no W_o: C ({num_queries} x {d_out}) is the output",
            names,
            "random parameters (--weights random): the model gives the layer's input x only",
        ]
    else:
        notes = [
            f"one head: d = D = {head_dim} (the tutorial's d_in, d_q and d_out), so it uses every column of W_q, W_k, W_v, "
            f"scale 1/sqrt({head_dim})",
            names,
            "the tutorial's Wq, Wk, Wv have bias=False; here they are the BERT layer's, biases included",
        ]
    if batch > 1:
        padding = num_keys - valid[shown]
        notes.append(
            f"a batch runs one text at a time (texts numbered from 0); the steps below are text {shown}'s"
            + (f", the one with the most padding: its {padding} padding keys are cut off" if padding else "")
        )
    record = recorders[shown]
    weights = torch.stack(weights)[:, None]  # (B, 1, Nq, Nk)
    return finish_trace("single-head", record, 1, head_dim, weights, torch.stack(outputs), notes=notes, shown_text=shown)

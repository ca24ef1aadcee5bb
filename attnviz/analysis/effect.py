"""What a head does to the model's output, measured: the head taken out, the rest of the model run again.

A map of weights says where a head looks, not whether the model needs it. Michel et al. remove one head at a
time and measure what the model loses (PAPER). A head is taken out at its layer's output projection W_o, whose
input is every head's output side by side (H * d features, head h's the h-th d of them), in one of two ways
(ABLATIONS): its output set to 0, or replaced by its mean over the text's positions (the circuits literature's
mean ablation: what the head adds on average stays, what it says about each position goes). What is measured
(EFFECTS), for a decoder, from the next-token distributions p (every head) and q (the head taken out):
KL(p ‖ q), mean over the text's positions, and the change of the text's loss (q's minus p's).

The layers before the head's own run once for all its heads: one forward pass records what enters each layer
and each output projection (TransformersModel.layer_calls); for layer L, H copies of what entered it, each with
another head taken out, run from layer L on as one batch (TransformersModel.run_from). Sums in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The next-token distributions held at once, in float64 (p, log p and one copy's scores, N × vocabulary each): past
# this a text is refused, not computed in more memory; and the logits of a batch of copies (the model's dtype).
DISTRIBUTIONS_BYTES = 2**30
LOGITS_BYTES = 2**28
PAPER = 'Michel, Levy and Neubig, NeurIPS 2019, "Are Sixteen Heads Really Better than One?" (arXiv 1905.10650)'
ABLATIONS = {
    "zero": "the head's output (its d features of W_o's input) set to 0 at every position",
    "mean": "the head's output replaced by its mean over the text's positions (mean ablation, as in the circuits "
    "literature): what the head adds on average stays, what it says about each position goes",
}
# What became of a head's output, as titles and legends say it: "its output set to 0".
TAKEN_OUT = {"zero": "set to 0", "mean": "replaced by its mean over the positions"}
# name -> (what, definition), in the order of HeadEffects.values and of every table of them.
EFFECTS = {
    "kl": (
        "KL divergence",
        "KL(p ‖ q) of the next-token distributions, p with every head and q with this head taken out, in nats, "
        "mean over the text's positions",
    ),
    "loss": (
        "loss change",
        "the change of the text's loss (the mean negative log-likelihood of each next token, nats per token) "
        "when the head is taken out: q's loss minus p's; above 0, the model predicts the text worse without it",
    ),
}


@dataclass
class HeadEffects:
    """Every head of the layers measured, taken out one at a time: per name of EFFECTS an (L, H) array (NaN for a
    layer not measured); loss is the text's loss with every head, in nats per token."""

    values: dict[str, np.ndarray]  # name -> (L, H)
    ablation: str
    layers: list[int]  # the layers measured
    loss: float
    tokens: list[str]
    text: str = ""
    model: str = ""
    causal = True  # a decoder's heads, the only ones taken out


def head_effects(loaded, text: str, spec, ablation: str = "zero", layers: list[int] | None = None) -> HeadEffects:
    """Each head of `layers` (default: every layer) of a decoder over one text, taken out (ablation, ABLATIONS) in
    turn: its EFFECTS. spec gives the device and --truncate; the heads are the model's own."""
    import torch

    from attnviz.errors import AttnvizError
    from attnviz.layer_inputs import encode_texts

    if ablation not in ABLATIONS:
        raise AttnvizError(f"ablation {ablation!r} is not one of {', '.join(ABLATIONS)}")
    if loaded.family.final_norm is None:  # a decoder adapter names its final norm: then its layers can run from one on
        raise AttnvizError(
            f"effect= measures a decoder's heads by its next-token predictions (GPT-2, Llama's layout); "
            f"{loaded.name} is {loaded.family.kind} ({loaded.family.name})"
        )
    encoded = encode_texts(loaded, [text], spec)
    ids = encoded.queries.input_ids.to(spec.device)  # (1, N)
    if ids.shape[1] < 2:
        raise AttnvizError("a head's effect on the text's loss needs at least 2 tokens: one to predict the next from")
    model = loaded.model
    num_layers, num_tokens = loaded.num_layers, ids.shape[1]
    layers = list(range(num_layers)) if layers is None else list(layers)
    values = {name: np.full((num_layers, loaded.num_heads), np.nan) for name in EFFECTS}
    weight, bias = model.output_head()
    distributions = num_tokens * weight.shape[0]  # N × vocabulary
    if 3 * 8 * distributions > DISTRIBUTIONS_BYTES:
        most = DISTRIBUTIONS_BYTES // (3 * 8 * weight.shape[0])
        raise AttnvizError(
            f"effect= compares next-token distributions over the whole vocabulary ({weight.shape[0]:,} tokens) at every "
            f"position: with this model up to {most:,} tokens, and this text has {num_tokens:,}"
        )
    copies_at_once = max(1, LOGITS_BYTES // (4 * distributions))
    with torch.inference_mode():  # torch's own threads: a layer's H copies are one batch, never a small run
        calls, head_outputs, last = model.layer_calls({"input_ids": ids, "attention_mask": encoded.queries.attention_mask.to(spec.device)})
        every = torch.log_softmax(torch.nn.functional.linear(last, weight, bias)[0].double(), dim=-1)  # (N, V)
        p = every.exp()
        plogp = torch.linalg.vecdot(p, every)  # (N,): Σ_v p log p
        targets = ids[0, 1:]  # (N - 1,): each position's next token
        loss = -every[:-1].gather(1, targets[:, None]).mean()
        num_heads = loaded.num_heads
        for layer in layers:
            args, kwargs = calls[layer]
            entering = (args[0] if args else kwargs["hidden_states"]).expand(num_heads, -1, -1)  # (H, N, D)
            out = model.run_from(layer, entering, calls, _taken_out(head_outputs[layer], num_heads, ablation))  # (H, N, D)
            for copy in range(num_heads):  # in float64 a copy at a time: V is tens of thousands
                if copy % copies_at_once == 0:  # the next copies' logits at once, in the model's dtype: (c, N, V)
                    logits = torch.nn.functional.linear(out[copy : copy + copies_at_once], weight, bias)
                scores = logits[copy % copies_at_once].double()  # (N, V)
                # log q = s - logsumexp(s): KL(p ‖ q) = Σ p log p - Σ p s + logsumexp(s), a row at a time, in float64
                normaliser = torch.logsumexp(scores, dim=-1)  # (N,)
                values["kl"][layer, copy] = float((plogp - torch.linalg.vecdot(p, scores) + normaliser).mean())
                without = (normaliser[:-1] - scores[:-1].gather(1, targets[:, None])[:, 0]).mean()
                values["loss"][layer, copy] = float(without - loss)
    return HeadEffects(
        values=values,
        ablation=ablation,
        layers=layers,
        loss=float(loss),
        tokens=list(encoded.queries.tokens[0]),
        text=text,
        model=loaded.name,
    )


def _taken_out(heads_input, num_heads: int, ablation: str):
    """heads_input: what entered W_o in the pass with every head (1, N, H * d). Returns take_out: W_o's input for H
    copies (H, N, H * d) -> the same with copy h's head h taken out (0, or its mean over the positions in heads_input)."""
    batch, num_tokens, width = heads_input.shape
    head_dim = width // num_heads
    per_head = heads_input.view(batch, num_tokens, num_heads, head_dim)
    kept = per_head.mean(dim=1)[0] if ablation == "mean" else per_head.new_zeros(num_heads, head_dim)  # (H, d)

    def take_out(x):
        import torch

        x = x.view(num_heads, num_tokens, num_heads, head_dim).clone()
        copies = torch.arange(num_heads, device=x.device)
        x[copies, :, copies] = kept[:, None, :].to(x.dtype)  # copy h, every position, head h
        return x.view(num_heads, num_tokens, width)

    return take_out

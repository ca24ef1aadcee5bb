"""What a head does to the model's output, measured: the head taken out, the rest of the model run again.

A map of weights says where a head looks, not whether the model needs it. Michel et al. remove one head at a
time and measure what the model loses (PAPER). A head is taken out at its layer's output projection W_o, whose
input is every head's output side by side (H * d features, head h's the h-th d of them), in one of two ways
(ABLATIONS): its output set to 0, or replaced by its mean over the text's positions (the circuits literature's
mean ablation: what the head adds on average stays, what it says about each position goes). What is measured
(EFFECTS) is the model's own output:
- a decoder, and an encoder-decoder (the heads of any of its stacks: the decoder reads the text shifted right,
  teacher-forced, and predicts each next token): from the next-token distributions p (every head) and q (the
  head taken out), KL(p ‖ q), mean over the positions, and the change of the text's loss (q's minus p's);
- an encoder: the cosine distance of each token's last hidden state, mean over the tokens, and for a
  sentence-embedding model (a sentence-transformers folder: all-MiniLM-L6-v2) that of its pooled embedding.

The layers before the head's own run once for all its heads: one forward pass records how each layer was called
and what entered each output projection (models/layer_runs.py); for layer L, H copies of what entered it, each
with another head taken out, run from layer L on as one batch. Distributions and sums in float64, the
vocabulary's distributions a block of positions at a time (bounded memory at any length).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.run_data import Progress

# The next-token distributions held at once, in float64 (p and log p with every head, one copy's scores and
# logsumexp's temporary: four positions × vocabulary arrays), and the logits of a batch of copies (the model's
# dtype): a longer text is measured in blocks of positions.
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
# name -> (short, what, definition): the tables' column, a legend's words, the JSON's definition. A decoder's (and an
# encoder-decoder's) are kl and loss, an encoder's cosine and, for a sentence-embedding model, pooled.
EFFECTS = {
    "kl": (
        "KL",
        "KL(p ‖ q) of the next-token distributions, nats, mean over positions",
        "KL(p ‖ q) of the next-token distributions, p with every head and q with this head taken out, in nats, "
        "mean over the text's positions",
    ),
    "loss": (
        "Δloss",
        "the text's loss without the head minus with it, nats per token",
        "the change of the text's loss (the mean negative log-likelihood of each next token, nats per token) "
        "when the head is taken out: q's loss minus p's; above 0, the model predicts the text worse without it",
    ),
    "cosine": (
        "cos",
        "1 − cos of each token's last hidden state, mean over the tokens",
        "the cosine distance 1 − cos(h, h') of each token's last hidden state, h with every head and h' with "
        "this head taken out, mean over the text's tokens",
    ),
    "pooled": (
        "pooled",
        "1 − cos of the sentence embedding",
        "the cosine distance 1 − cos(e, e') of the sentence embedding, the model's own pooling of its last hidden "
        "states (its sentence-transformers Pooling: see pooling), e with every head and e' with this head taken out",
    ),
}


@dataclass
class HeadEffects:
    """Every head of the layers measured, taken out one at a time: per name of EFFECTS that the model has an (L, H)
    array (NaN for a layer not measured), in EFFECTS' order; loss is the text's loss with every head (nats per token,
    None for an encoder); pooling the sentence embedding's ("mean", ...; None: no pooled embedding)."""

    values: dict[str, np.ndarray]  # name -> (L, H)
    ablation: str
    layers: list[int]  # the layers measured
    loss: float | None
    tokens: list[str]
    text: str = ""
    model: str = ""
    causal: bool = True  # the heads' own attention: a decoder's (or an encoder-decoder's decoder's) is causal
    stack: str | None = None  # an encoder-decoder's stack whose heads were taken out
    pooling: str | None = None

    @property
    def names(self) -> list[str]:
        return list(self.values)


def head_effects(
    loaded, text: str, spec, ablation: str = "zero", layers: list[int] | None = None, progress: Progress = Progress()
) -> HeadEffects:
    """Each head of `layers` (default: every layer) of spec.stack over one text, taken out (ablation, ABLATIONS) in
    turn: its EFFECTS. spec gives the stack, the device and --truncate; the heads are the model's own. progress: the
    heads taken out, a layer's at a time."""
    import torch

    from attnviz.errors import AttnvizError
    from attnviz.models.families import ENCODER
    from attnviz.models.sentence import sentence_pooling
    from attnviz.spec import model_is_causal

    if ablation not in ABLATIONS:
        raise AttnvizError(f"ablation {ablation!r} is not one of {', '.join(ABLATIONS)}")
    stack = spec.stack
    inputs, source, tokens, targets = text_inputs(loaded, text, spec)
    num_layers, num_heads = loaded.num_layers_of(stack), loaded.num_heads_of(stack)
    layers = list(range(num_layers)) if layers is None else list(layers)
    model = loaded.model
    with torch.inference_mode():  # torch's own threads: a layer's H copies are one batch, never a small run
        recorded, last = model.layer_calls(inputs, stack, source)
        if loaded.family.kind == ENCODER:
            output = _Representations(last, sentence_pooling(loaded.folder))
        else:
            output = _Predictions(*model.output_head(), last, targets)
        values = {name: np.full((num_layers, num_heads), np.nan) for name in output.names}
        advance = progress.counting("heads taken out", len(layers) * num_heads)
        for layer in layers:
            entering = recorded.entering(layer).expand(num_heads, -1, -1)  # (H, N, D)
            out = model.run_from(layer, entering, recorded, _taken_out(recorded.heads[layer], num_heads, ablation), stack)
            for name, row in output.measure(out).items():
                values[name][layer] = row
            advance(num_heads)
    return HeadEffects(
        values=values,
        ablation=ablation,
        layers=layers,
        loss=getattr(output, "loss", None),
        tokens=tokens,
        text=text,
        model=loaded.name,
        causal=model_is_causal(loaded, stack),
        stack=stack,
        pooling=getattr(output, "pooling", None),
    )


def text_inputs(loaded, text: str, spec):
    """The model's inputs over one text (the decoder's, for an encoder-decoder), the encoder's (an encoder-decoder's,
    else None), the tokens of the stack's rows, and each predicted position's next token (T,) (None: an encoder)."""
    from attnviz.errors import AttnvizError
    from attnviz.models.families import DECODER, ENCODER, ENCODER_DECODER
    from attnviz.models.tokens import encode

    device, kind = spec.device, loaded.family.kind
    encoded = encode(loaded.tokenizer, [text], loaded.max_positions, spec.truncate)
    ids = encoded.input_ids.to(device)  # (1, N)
    if kind == ENCODER:
        inputs = encoded.model_inputs(device) if loaded.is_bert else {"input_ids": ids, "attention_mask": encoded.attention_mask.to(device)}
        return inputs, None, list(encoded.tokens[0]), None
    if ids.shape[1] < 2 and kind == DECODER:
        raise AttnvizError("a head's effect on the text's loss needs at least 2 tokens: one to predict the next from")
    source = {"input_ids": ids, "attention_mask": encoded.attention_mask.to(device)}
    if kind == DECODER:  # position i predicts token i + 1
        return source, None, list(encoded.tokens[0]), ids[0, 1:]
    assert kind == ENCODER_DECODER
    start = loaded.tokenizer_for("decoder").start_token_id  # the decoder reads the text shifted right: predicts each token
    shifted = _shifted_right(ids, start)
    decoder = {"input_ids": shifted, "attention_mask": source["attention_mask"]}
    rows = encoded.tokens[0] if spec.stack == "encoder" else loaded.tokenizer.convert_ids_to_tokens(shifted[0].tolist())
    return decoder, source, list(rows), ids[0]


def _shifted_right(ids, start: int):
    """ids (1, N) shifted right behind the start token: (1, N), the last token dropped."""
    import torch

    return torch.cat([ids.new_full((1, 1), start), ids[:, :-1]], dim=1)


class _Predictions:
    """The next-token distributions with every head, compared with those of copies: KL and loss change per copy.

    weight (V, D) and bias make the logits from a last hidden state; last (1, N, D) is the model's with every head,
    targets (T,) each of the first T positions' next token. Positions go a block at a time (the whole text when it
    fits DISTRIBUTIONS_BYTES: then p is computed once)."""

    names = ("kl", "loss")

    def __init__(self, weight, bias, last, targets):
        self.weight, self.bias, self.last, self.targets = weight, bias, last[0], targets
        num_tokens, vocabulary = self.last.shape[0], weight.shape[0]
        rows = max(1, DISTRIBUTIONS_BYTES // (4 * 8 * vocabulary))
        self.blocks = [slice(start, min(start + rows, num_tokens)) for start in range(0, num_tokens, rows)]
        self._whole = self._distribution(self.blocks[0]) if len(self.blocks) == 1 else None
        self.loss = float(sum(self._nll(self._baseline(block)[0], block).sum() for block in self.blocks) / len(targets))

    def _distribution(self, block):
        """log p, p and Σ_v p log p over a block of positions: (n, V), (n, V), (n,), in float64."""
        import torch

        from attnviz.models.layer_weights import unembed

        log_p = torch.log_softmax(unembed(self.last[block], self.weight, self.bias).double(), dim=-1)
        p = log_p.exp()
        return log_p, p, _row_dots(p, log_p)

    def _baseline(self, block):
        return self._whole if self._whole is not None else self._distribution(block)

    def _nll(self, log_q, block):
        """-log q of each of the block's positions' next token (those with one): (n',); of scores, -score."""
        predicted = range(block.start, min(block.stop, len(self.targets)))
        if not predicted:
            return log_q.new_zeros(0)
        return -log_q[: len(predicted)].gather(1, self.targets[predicted.start : predicted.stop, None])[:, 0]

    def measure(self, out) -> dict[str, np.ndarray]:
        """out (C, N, D): C copies' last hidden states. KL(p ‖ q) mean over positions and the loss change, each (C,)."""
        import torch

        from attnviz.models.layer_weights import unembed

        copies, num_tokens = out.shape[0], out.shape[1]
        kl, nll = np.zeros(copies), np.zeros(copies)
        for block in self.blocks:
            _, p, plogp = self._baseline(block)
            at_once = max(1, LOGITS_BYTES // (4 * (block.stop - block.start) * self.weight.shape[0]))
            for first in range(0, copies, at_once):  # the next copies' logits at once, in the model's dtype: (c, n, V)
                logits = unembed(out[first : first + at_once, block], self.weight, self.bias)
                for copy in range(first, min(first + at_once, copies)):  # in float64 a copy at a time
                    scores = logits[copy - first].double()  # (n, V)
                    # log q = s - logsumexp(s): KL(p ‖ q) = Σ p log p - Σ p s + logsumexp(s), a row at a time
                    normaliser = torch.logsumexp(scores, dim=-1)  # (n,)
                    kl[copy] += float((plogp - _row_dots(p, scores) + normaliser).sum())
                    negative = self._nll(scores, block)  # -s of each next token: -log q is that + logsumexp(s)
                    nll[copy] += float((negative + normaliser[: len(negative)]).sum())
        return {"kl": kl / num_tokens, "loss": nll / len(self.targets) - self.loss}


def _row_dots(a, b):
    """(n,): each row of a (n, V) times the same row of b, summed: as one batched product, no (n, V) temporary."""
    return (a[:, None, :] @ b[:, :, None])[:, 0, 0]


class _Representations:
    """An encoder's last hidden states with every head, compared with copies': the cosine distance per token (mean
    over the tokens), and of the pooled sentence embedding when the model has one (pooling, POOLINGS)."""

    def __init__(self, last, pooling: str | None):
        self.last, self.pooling = last.double(), pooling
        self.names = ("cosine", "pooled") if pooling is not None else ("cosine",)

    def measure(self, out) -> dict[str, np.ndarray]:
        import torch

        from attnviz.models.sentence import pooled

        out = out.double()
        distance = lambda a, b: (1 - torch.nn.functional.cosine_similarity(a, b, dim=-1)).cpu().numpy()  # noqa: E731
        values = {"cosine": distance(out, self.last).mean(axis=1)}
        if self.pooling is not None:
            values["pooled"] = distance(pooled(out, self.pooling), pooled(self.last, self.pooling))
        return values


def _taken_out(heads_input, num_heads: int, ablation: str):
    """heads_input: what entered W_o in the pass with every head (1, N, H * d). Returns take_out: W_o's input for H
    copies (H, N, H * d) -> the same with copy h's head h taken out (0, or its mean over the positions in heads_input)."""
    batch, num_tokens, width = heads_input.shape
    per_head = heads_input.view(batch, num_tokens, num_heads, width // num_heads)
    kept = per_head.mean(dim=1)[0] if ablation == "mean" else per_head.new_zeros(num_heads, width // num_heads)  # (H, d)
    return one_head_each(num_heads, list(range(num_heads)), kept[:, None, :])


def one_head_each(num_heads: int, heads: list[int], values, positions: list[int] | None = None):
    """change(x) for a batch of copies x (C, N, n * d), n heads' features side by side (what enters W_o, or what a
    projection gives): copy c with head heads[c]'s d features replaced by values[c], (C, N or 1, d) at every
    position, or (C, d) at position positions[c] alone. The effect's ablations, the patching's clean values."""

    def change(x):
        import torch

        copies, num_tokens, width = x.shape
        x = x.view(copies, num_tokens, num_heads, width // num_heads).clone()  # (C, N, n, d)
        copy = torch.arange(copies, device=x.device)
        head = torch.as_tensor(heads, device=x.device)
        if positions is None:
            x[copy, :, head] = values.to(x)  # (C, N, d): copy c, every position, head heads[c]
        else:
            x[copy, torch.as_tensor(positions, device=x.device), head] = values.to(x)  # (C, d)
        return x.view(copies, num_tokens, width)

    return change

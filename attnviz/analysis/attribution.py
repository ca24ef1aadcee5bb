"""Direct logit attribution: what each head writes into the residual stream, read straight through to the logits.

At the position read, the stream entering the final norm is a sum: the embeddings, then for each layer every
head's output through its slice of W_o, W_o's bias, and the rest of the layer's update (its MLP). The final norm is
made linear by taking its scale from the clean run (the cached-scale convention: 1 / RMS, or 1 / std after
centring for a LayerNorm), so each part x_i gives (norm weight * x_i * scale) · (W_U[answer] - W_U[wrong]) in
logit units; with the norm's bias and the unembedding's bias the parts sum to m_clean (Elhage et al. 2021). A
post-norm stack (BART's: a norm after each layer, none at the end) has no such sum: no attribution.
"""

from __future__ import annotations

import numpy as np

DIRECT = (
    "each head's output at the position read, through its slice of W_o and the final norm with its scale from the "
    "clean run (the cached-scale convention), dotted with W_U[answer] - W_U[wrong]: logit units, clean run"
)
NO_DIRECT = (
    "no direct attribution: a post-norm stack (a norm after each layer and none at the end: BERT's, BART's; an "
    "encoder's masked-LM head is not linear either) has no sum of parts read straight to the logits"
)
PARTS = {
    "embeddings": "the embeddings (and position embeddings) entering the first layer",
    "heads": "each head's output through its slice of W_o (L, H): the direct attribution",
    "attention_bias": "each layer's W_o bias (L,)",
    "rest": "the rest of each layer's update of the stream (L,): its MLP",
    "norm_bias": "the final norm's bias",
    "unembedding_bias": "the language-model head's bias, answer's minus wrong's",
}


def direct_attribution(loaded, stack, clean, final_input, position: int, direction, offset: float):
    """(the heads' parts (L, H), every part by name: PARTS, and "total" their sum), or (None, {}) for a stack
    without a final norm. clean: the clean pass's layer_runs.Recorded; final_input (1, N, D): what entered the final
    norm; direction (D,) float64: W_U[answer] - W_U[wrong]; offset: the bias's difference."""
    import torch

    if final_input is None:
        return None, {}
    model = loaded.model
    final = model.layer_stack(stack).final
    num_layers, num_heads = loaded.num_layers_of(stack), loaded.num_heads_of(stack)
    stream = final_input[0, position].double()  # (D,)
    centred = isinstance(final, torch.nn.LayerNorm)
    eps = getattr(final, "variance_epsilon", None) or getattr(final, "eps")
    spread = stream - stream.mean() if centred else stream
    scale = 1 / torch.sqrt(spread.pow(2).mean() + eps)  # the clean run's, held fixed
    read_out = (final.weight.double() * scale) * direction  # (D,): a part x gives (x - mean x) · read_out

    def logits(part) -> np.ndarray:  # part (..., D) -> (...)
        part = part - part.mean(dim=-1, keepdim=True) if centred else part
        return (part @ read_out).cpu().numpy()

    heads, attention_bias, rest = np.zeros((num_layers, num_heads)), np.zeros(num_layers), np.zeros(num_layers)
    for layer in range(num_layers):
        (w_o, b_o) = model.attention_weights(layer, stack).w_o  # (D, H * d), (D,) or None
        z = clean.heads[layer][0, position].double().view(num_heads, -1)  # (H, d)
        written = torch.einsum("hd,Dhd->hD", z, w_o.double().view(w_o.shape[0], num_heads, -1))  # (H, D)
        bias = torch.zeros_like(stream) if b_o is None else b_o.double()
        after = clean.entering(layer + 1)[0, position].double() if layer + 1 < num_layers else stream
        heads[layer], attention_bias[layer] = logits(written), logits(bias)
        rest[layer] = logits(after - clean.entering(layer)[0, position].double() - written.sum(dim=0) - bias)
    norm_bias = float(final.bias.double() @ direction) if getattr(final, "bias", None) is not None else 0.0
    parts = {
        "embeddings": float(logits(clean.entering(0)[0, position].double())),
        "heads": heads, "attention_bias": attention_bias, "rest": rest, "norm_bias": norm_bias, "unembedding_bias": offset,
    }  # fmt: skip
    parts["total"] = float(sum(np.sum(value) for value in parts.values()))
    return heads, parts

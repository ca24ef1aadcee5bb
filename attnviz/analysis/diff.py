"""Two checkpoints side by side (`attnviz diff`): the same text, every layer × head, how far apart their maps are.

Both checkpoints read the text with one tokenizer (the same token ids, else refused) and have one architecture
(the same family, layers and heads). Each runs attnviz's layer with its own projections over its own hidden
states, a block of queries at a time (passes.iter_layer_blocks: any length in bounded memory), and for each
layer × head the two maps' rows are compared (DISTANCES):
- the Jensen-Shannon distance, sqrt(JSD) with base-2 logarithms (0 for equal rows, 1 for rows with no key in
  common), mean over the queries: the distance `attnviz stats --js` measures between the heads of a layer;
- Clark et al.'s divergence: the JSD summed over the queries (Clark, Khandelwal, Levy and Manning 2019, "What
  Does BERT Look At?", section 6), the number their head-distance plots use, growing with the text.
Against "random", the other side is the same model's layer with random projections (drawn from the seed) over
the same hidden states: how far training moved each head from a random one. The model's side reads the text's capture
(passes.capture_texts: one pass, of which attnviz.diff also makes the report); against random the other side reads
it too, and another checkpoint's side takes passes of its own.

The most changed heads (TOP_HEADS, by JS distance) keep both maps for the figures when the text has at most
MAX_DRAWN_TOKENS tokens: their layers run once more, whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from attnviz.run_data import Progress

RANDOM = "random"  # --against random: the layer's random re-initialisation
TOP_HEADS = 4
MAX_DRAWN_TOKENS = 2048  # two maps of a head, 16 MB each in float32
CLARK = 'Clark, Khandelwal, Levy and Manning 2019, "What Does BERT Look At? An Analysis of BERT\'s Attention" (arXiv 1906.04341)'
# name -> (short, definition): the tables' column and the JSON's definition, in the order of HeadDifferences.values.
DISTANCES = {
    "js": (
        "JS",
        "the Jensen-Shannon distance of the two maps' rows, sqrt(JSD) with base-2 logarithms (0: the same row, 1: no "
        "key in common), mean over the queries",
    ),
    "clark": (
        "Clark",
        "the Jensen-Shannon divergence of the two maps' rows (bits), summed over the queries: Clark et al.'s distance "
        "between heads",
    ),
}


def against_words(differences) -> str:
    """What the other side is, as titles say it: "against gpt2-finetuned", "against each layer's random
    re-initialisation (seed 0)"."""
    if differences.against == RANDOM:
        return f"against each layer's random re-initialisation (seed {differences.seed})"
    return f"against {differences.against}"


@dataclass
class HeadDifferences:
    """Every layer × head of two checkpoints over one text: per name of DISTANCES an (L, H) array; the most changed
    heads (layer, head) by JS distance, and (for a text of at most MAX_DRAWN_TOKENS) their two maps."""

    values: dict[str, np.ndarray]
    model: str
    against: str  # the other checkpoint's name, or RANDOM
    tokens: list[str]
    shown_tokens: list[str]  # as figures and tables show them (models/shown.py)
    text: str
    causal: bool
    stack: str | None = None
    seed: int | None = None  # the random layers' (against RANDOM)
    top: list[tuple[int, int]] = field(default_factory=list)
    maps: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # (N, N) each: model, against


def check_pair(loaded, other, text: str, spec) -> None:
    """An AttnvizError, in one line, unless other (a LoadedModel) has loaded's architecture and reads the text with
    the same token ids."""
    from attnviz.errors import AttnvizError
    from attnviz.layer_inputs import encode_texts

    stack = spec.stack
    shape = lambda model: (model.family.name, model.num_layers_of(stack), model.num_heads_of(stack))  # noqa: E731
    if shape(loaded) != shape(other):
        said = lambda model: f"{model.name} is {shape(model)[0]} with {shape(model)[1]} layers × {shape(model)[2]} heads"  # noqa: E731
        raise AttnvizError(f"diff compares two checkpoints of one architecture: {said(loaded)}, {said(other)}")
    ours, theirs = (encode_texts(model, [text], replace(spec, kv_text=None)).queries.ids[0] for model in (loaded, other))
    if list(ours) != list(theirs):
        at = next((index for index, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise AttnvizError(
            f"diff compares two checkpoints of one tokenizer: {loaded.name} reads the text as {len(ours)} tokens, "
            f"{other.name} as {len(theirs)}, the first difference at token {at}"
        )


def head_differences(
    loaded, other, text: str, spec, budget_bytes: int, progress: Progress = Progress(), captured=None
) -> HeadDifferences:
    """Every layer × head of loaded and other (a LoadedModel checked by check_pair, or RANDOM) over one text: the
    DISTANCES of their maps, computed a block of queries at a time within budget_bytes; progress: the layers compared.
    captured: the text's capture on loaded (layer_inputs.Capture of every layer, passes.capture_texts'), else made
    here: loaded's side and a random other side read it, and the model runs no other pass of the text."""
    import torch

    from attnviz.analysis.head_numbers import row_plogp
    from attnviz.layer_inputs import encode_texts
    from attnviz.own_layer import build_layers
    from attnviz.passes import capture_texts, in_berts_place, iter_layer_blocks

    spec = replace(spec, kv_text=None)
    other_spec = replace(spec, weights="random") if other == RANDOM else spec
    other_model = loaded if other == RANDOM else other
    encoded, shared = captured if captured is not None else capture_texts(loaded, [text], spec)

    def blocks(model, run_spec):
        model_encoded = encoded if model is loaded else encode_texts(model, [text], run_spec)
        layers = build_layers(model, run_spec)
        states = dict(shared) if model is loaded else None  # each side lets a layer's states go once used
        return iter_layer_blocks(model, model_encoded, layers, run_spec, budget_bytes, in_berts_place(model, run_spec), states)

    ours, theirs = blocks(loaded, spec), blocks(other_model, other_spec)
    sums = {name: {} for name in DISTANCES}
    num_tokens = len(encoded.queries.ids[0])
    advance = progress.counting("layers compared", loaded.num_layers_of(spec.stack))
    with torch.inference_mode():
        for (layer, first, mine), (other_layer, other_first, others) in zip(ours, theirs, strict=True):
            assert (layer, first) == (other_layer, other_first) and mine.shape == others.shape
            p, q = mine[0].double(), others[0].double()  # (H, b, K): one text
            # JSD = H(m) - (H(p) + H(q)) / 2 = (Σ p log p + Σ q log q) / 2 - Σ m log m, in bits
            divergence = (((row_plogp(p) + row_plogp(q)) / 2 - row_plogp((p + q) / 2)) / np.log(2)).clamp_(0.0, 1.0)
            for name, rows in (("js", divergence.sqrt()), ("clark", divergence)):  # (H, b) each
                sums[name][layer] = sums[name].get(layer, 0.0) + rows.sum(dim=-1).cpu().numpy()
            if first + p.shape[1] == num_tokens:  # the layer's last block
                advance(1)
    values = {name: np.stack([sums[name][layer] for layer in sorted(sums[name])]) for name in DISTANCES}
    values["js"] /= num_tokens
    order = np.argsort(-values["js"], axis=None, kind="stable")[:TOP_HEADS]
    top = [tuple(int(index) for index in np.unravel_index(flat, values["js"].shape)) for flat in order]
    differences = HeadDifferences(
        values=values,
        model=loaded.name,
        against=RANDOM if other == RANDOM else other.name,
        tokens=list(encoded.queries.tokens[0]),
        shown_tokens=list(encoded.queries.shown[0] or encoded.queries.tokens[0]),
        text=text,
        causal=spec.causal,
        stack=spec.stack,
        seed=spec.seed if other == RANDOM else None,
        top=top,
    )
    if num_tokens <= MAX_DRAWN_TOKENS:
        differences.maps = _maps(loaded, other_model, text, spec, other_spec, top, (encoded, shared))
    return differences


def _maps(loaded, other, text: str, spec, other_spec, top: list[tuple[int, int]], captured) -> dict:
    """The two maps (N, N) of each of the top heads: each of their layers runs once more on each side, whole, over
    loaded's capture (captured), or another checkpoint's own pass capturing those layers' inputs."""
    from attnviz.layer_inputs import encode_texts
    from attnviz.passes import capture_states
    from attnviz.pipeline import run_attention

    layers = sorted({layer for layer, _ in top})
    sides = []
    for model, run_spec in ((loaded, spec), (other, other_spec)):
        if model is loaded:
            encoded, states = captured
        else:
            encoded = encode_texts(model, [text], run_spec)
            states = capture_states(model, encoded, layers, run_spec)
        sides.append({layer: run_attention(model, [text], replace(run_spec, layer=layer), (encoded, states[layer]))[0] for layer in layers})
    return {(layer, head): tuple(np.array(side[layer].attention[head]) for side in sides) for layer, head in top}

"""What each head is: every head's role scores over a text, its text-free scores, and its roles above stated thresholds.

One forward pass over the user's text, a block of queries at a time (any length): head_numbers' ROLE_NUMBERS
(TransformerLens's three templates, the streaming share, the top-k coverages) and `layers`' summaries (sink,
entropy, distance, local band) from the same blocks (head_summaries.summarise_blocks). Then Olsson et al.'s prefix
matching and copying (circuits.py), where they apply: a decoder's causal self-attention, a language-model head. The
retrieval score (Wu et al. 2024, analysis/retrieval.py) joins through RoleScores.with_retrieval.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from attnviz.analysis.head_numbers import LOCAL_WINDOW, ROLE_NUMBERS, TEMPLATES, TOP_K, RoleSettings
from attnviz.analysis.head_summaries import SINK_THRESHOLD, LayerSummaries
from attnviz.analysis.retrieval import PAPER as WU, RETRIEVAL_THRESHOLD
from attnviz.errors import AttnvizError
from attnviz.run_data import Progress

# roles.json's score names, in this order: the templates' scores (their numbers over template_weight), the rest as is.
TEMPLATE_SCORES = dict(zip(("previous_token", "duplicate_token", "induction"), TEMPLATES))
TEXT_SCORES = (*TEMPLATE_SCORES, "streaming", *(f"top_{k}" for k in TOP_K))
SCORE_NAMES = (*TEXT_SCORES, "prefix_matching", "copying", "retrieval")


class Role(NamedTuple):
    name: str  # as labels, roles.json and the report name it
    score: str  # the score it reads: a name of SCORE_NAMES or of the summaries
    threshold: float  # the head has the role when its score is above this
    why: str  # where the threshold comes from


# The share roles' sources add when they are labelled (share_role_skips).
SHARE_ROLE_NOTE = "; labelled only on a text where a uniform head's share is at most half of it (uniform, skipped)"
# In the order a head's colour is chosen by (roles.png, the report's grid): the rarer, more specific roles first.
ROLES = (
    Role("retrieval", "retrieval", RETRIEVAL_THRESHOLD, f"the paper's: {WU}"),
    Role("induction", "prefix_matching", 0.3, "attnviz's: Olsson et al. give no threshold; 0.3 is 30 times a uniform row's weight on the one continuation of a 101-token sequence's earlier occurrence"),
    Role("duplicate-token", "duplicate_token", 0.3, "attnviz's: TransformerLens gives none"),
    Role("previous-token", "previous_token", 0.5, "attnviz's: TransformerLens gives none; over half the head's attention on the previous token"),
    Role("copying", "copying", 0.9, "attnviz's, measured (Elhage et al. give none): on SmolLM2-135M the heads above "
         "0.9 put the token they attend to in the top 1% of their OV circuit's logits for 55% of tokens, those from 0.8 "
         "to 0.9 for 19%, from 0.5 to 0.8 for 7%; with W_O turned by a random rotation they pass 0.9 in 0.2% "
         "(bench/copying_threshold.py, docs/measures.md)"),  # fmt: skip
    Role("local", "local", 0.5, f"attnviz's: over half of each query's weight within the local band |i - j| <= w{SHARE_ROLE_NOTE}"),
    Role("sink", "sink", SINK_THRESHOLD, f"Gu et al.'s ε for the first token (head_summaries.SINK_THRESHOLD){SHARE_ROLE_NOTE}"),
    Role("streaming", "streaming", 0.9, f"attnviz's: DuoAttention's streaming heads lose little to S sinks and W recent keys; 0.9 of the weight kept{SHARE_ROLE_NOTE}"),
)
ROLE_NAMES = tuple(role.name for role in ROLES)
# The roles read from where a head's weight falls: a uniform head's share grows as the text shortens (a band of 8
# around each of 14 causal queries holds 0.91 of a uniform row), so each is labelled only on a text where a uniform
# head scores at most 1 / SEPARATION of its threshold: a head so labelled puts at least twice a uniform head's
# weight on the role's keys.
SHARE_ROLES = ("local", "sink", "streaming")
SEPARATION = 2
LONGEST_SEARCHED = 2**20  # the text length up to which a skip says how long a text would let the role tell


def role_key(name: str) -> str:
    """skipped's key of a role left unlabelled on this text ("local role"), beside the scores' keys ("copying")."""
    return f"{name} role"


STREAMING_ROLE = role_key("streaming")


def uniform_score(score: str, num_tokens: int, *, causal: bool, settings: RoleSettings, window: int) -> float:
    """What a uniform head scores on a text of num_tokens: each query's weight spread evenly over the keys it may see
    (0 .. i under a causal mask, all N else); score: "sink" (key 0), "local" (keys with |i - j| <= window) or
    "streaming" (the first S keys and the W ending at the query, each key once)."""
    # more sinks, recent keys or band than keys are every key (the API takes any size: head_numbers does the same)
    sinks, recent, window = (min(count, num_tokens) for count in (settings.sinks, settings.recent, window))
    queries = np.arange(num_tokens)  # (N,)
    last_seen = queries if causal else np.full(num_tokens, num_tokens - 1)  # (N,): each query's last key
    visible = last_seen + 1
    if score == "sink":
        on = np.ones(num_tokens)
    elif score == "local":
        on = np.minimum(queries + window, last_seen) - np.maximum(queries - window, 0) + 1
    elif score == "streaming":
        recent_first = np.maximum(queries - recent + 1, 0)  # the window i - W + 1 .. i
        both = np.maximum(0, np.minimum(sinks, queries + 1) - recent_first)  # (N,): the sinks inside the window
        on = np.minimum(sinks, visible) + (queries - recent_first + 1) - both
    else:
        raise ValueError(f"no uniform score for {score!r}: one of {SHARE_ROLES}")
    return float((on / visible).mean())


def share_role_skips(num_tokens: int, *, causal: bool, settings: RoleSettings, window: int) -> tuple[dict, dict]:
    """({role: a uniform head's score} of SHARE_ROLES on this text, {role_key(role): why} of those it cannot tell)."""
    uniform, skipped = {}, {}
    for role in (role for role in ROLES if role.name in SHARE_ROLES):
        score = uniform_score(role.score, num_tokens, causal=causal, settings=settings, window=window)
        uniform[role.name] = score
        if score > role.threshold / SEPARATION:
            def separates(length: int, role=role) -> bool:
                return uniform_score(role.score, length, causal=causal, settings=settings, window=window) <= role.threshold / SEPARATION

            needed = _shortest(separates, num_tokens)
            longer = (f"a text of {needed:,} tokens or more can" if needed else
                      f"no text up to {LONGEST_SEARCHED:,} tokens can with these settings")  # fmt: skip
            skipped[role_key(role.name)] = (
                f"a uniform head (each query's weight spread evenly over the keys it may see) scores {score:.2f} on "
                f"these {num_tokens:,} tokens, more than 1/{SEPARATION} of the threshold {role.threshold:g}: the "
                f"{role.score} share cannot tell a {role.name} head from a diffuse one here, so no head is labelled "
                f"{role.name}; {longer}"
            )
    return uniform, skipped


def _shortest(separates, shorter: int) -> int | None:
    """The least text length above shorter where separates(length) holds (it holds from some length on), else None."""
    low, high = shorter, max(2 * shorter, 2)
    while not separates(high):
        if high >= LONGEST_SEARCHED:
            return None
        low, high = high, min(2 * high, LONGEST_SEARCHED)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if separates(middle) else (middle, high)
    return high


@dataclass(frozen=True)
class RoleScores:
    """Every head's role scores over one text (scores[name]: (L, H) per name of SCORE_NAMES computed), the text's
    layer summaries from the same pass, the ids the model read, the prefix-matching sequences, and why a score was
    left out (skipped[name]: one sentence)."""

    scores: dict[str, np.ndarray]
    summaries: LayerSummaries
    ids: list[int]
    settings: RoleSettings
    random_ids: list[list[int]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    uniform: dict[str, float] = field(default_factory=dict)  # share_role_skips': a uniform head's score of SHARE_ROLES
    retrieval: dict | None = None  # RetrievalHeads.record()'s "retrieval": each test's length, depth, needle, answer, recall

    def value(self, name: str) -> np.ndarray | None:
        """(L, H): a score of SCORE_NAMES or a summary (sink, local, ...); None where it was not computed."""
        return self.scores.get(name, self.summaries.values.get(name))

    def with_retrieval(self, result) -> "RoleScores":
        """These scores with the retrieval heads' (analysis/retrieval.py's result: .scores (L, H) in [0, 1], .record())."""
        scores = np.asarray(result.scores, dtype=float)
        if scores.shape != self.summaries.values["sink"].shape:
            raise ValueError(f"retrieval scores of shape {scores.shape}, not {self.summaries.values['sink'].shape}")
        return replace(self, scores={**self.scores, "retrieval": scores}, retrieval=result.record()["retrieval"])

    def role_values(self, role: Role) -> np.ndarray | None:
        """(L, H): the score a role reads, None where it was not computed or cannot tell heads apart on this text
        (skipped[role_key(name)]: a share role on a text where a uniform head's share is over 1 / SEPARATION of its
        threshold)."""
        return None if role_key(role.name) in self.skipped else self.value(role.score)

    def labels(self) -> list[list[list[str]]]:
        """[layer][head]: the head's roles (ROLES' names, in ROLES' order) whose score is above its threshold."""
        num_layers, num_heads = self.summaries.values["sink"].shape
        above = {role.name: self.role_values(role) > role.threshold for role in ROLES if self.role_values(role) is not None}
        return [[[name for name in ROLE_NAMES if name in above and above[name][layer, head]] for head in range(num_heads)]
                for layer in range(num_layers)]  # fmt: skip

    def main_roles(self) -> tuple[np.ndarray, np.ndarray]:
        """(L, H) int: each head's first role in ROLES' order (-1: none), and (L, H) float: that role's score (0: none)."""
        shape = self.summaries.values["sink"].shape
        chosen, strength = np.full(shape, -1), np.zeros(shape)
        for index in reversed(range(len(ROLES))):  # the first role of ROLES wins
            values = self.role_values(ROLES[index])
            if values is not None:
                above = values > ROLES[index].threshold
                chosen[above], strength[above] = index, values[above]
        return chosen, strength

    def top_heads(self, role: Role, count: int = 5) -> list[tuple[int, int, float]]:
        """(layer, head, score) of the role's highest-scoring heads above its threshold, highest first."""
        values = self.role_values(role)
        if values is None:
            return []
        order = np.argsort(-values, axis=None, kind="stable")[:count]
        heads = [(int(index // values.shape[1]), int(index % values.shape[1])) for index in order]
        return [(layer, head, float(values[layer, head])) for layer, head in heads if values[layer, head] > role.threshold]


class RoleSums:
    """ROLE_NUMBERS' block sums of every layer's heads over one text, fed block by block (summarise_blocks' also)."""

    def __init__(self, num_layers: int, num_heads: int, ids, *, causal: bool, settings: RoleSettings):
        import torch

        self.ids = torch.tensor(ids)[None]  # (1, N)
        self.causal, self.settings = causal, settings
        self.sums = torch.zeros(num_layers, num_heads, len(ROLE_NUMBERS), dtype=torch.float64)

    def add(self, layer: int, first_query: int, weights) -> None:
        """The rows first_query .. of one layer: weights (H, b, K) (K narrow under a causal mask, as blocks give them)."""
        import torch

        from attnviz.analysis.head_numbers import Block, block_sums

        num_tokens = self.ids.shape[1]
        block = Block(weights[None], first_query, torch.tensor([num_tokens]), causal=self.causal, num_queries=num_tokens,
                      token_ids=self.ids, roles=self.settings)  # fmt: skip
        self.sums[layer, : weights.shape[0]] += block_sums(block, ROLE_NUMBERS).cpu()

    def scores(self) -> dict[str, np.ndarray]:
        """(L, H) per name of TEXT_SCORES: each template's number over template_weight (TransformerLens's ratio)."""
        sums = {name: self.sums[..., index].numpy() for index, name in enumerate(ROLE_NUMBERS)}
        weight = sums["template_weight"]
        ratios = {name: np.divide(sums[number], weight, out=np.zeros_like(weight), where=weight > 0)
                  for name, number in TEMPLATE_SCORES.items()}  # fmt: skip
        return {**ratios, **{name: sums[name] for name in TEXT_SCORES if name not in TEMPLATE_SCORES}}


class TextPass(NamedTuple):
    """text_roles' pass over one text: every head's TEXT_SCORES, the layer summaries and the ids read; layer 0's run
    (an AttentionRun: run_attention's over the pass's capture, or made by the pass itself), whose map gave that layer's numbers; and the
    text's capture, (EncodedTexts, {layer: LayerStates}) as layer_inputs.layer_states gives every layer's input,
    where kept (keep), else None; and attnviz's layers the pass ran (own_layer.build_layers'), for the next pass."""

    scores: dict[str, np.ndarray]
    summaries: LayerSummaries
    ids: list[int]
    run: Any
    capture: tuple | None
    layers: Any


def text_roles(
    loaded, text: str, spec, budget_bytes: int, settings: RoleSettings, progress: Progress = Progress(), keep=lambda tokens, run: False
) -> TextPass:
    """Every head's TEXT_SCORES and layer summaries over one text, from one capture of every layer's input (one forward
    pass), a block of queries at a time (progress: the layers the pass reaches, then those summarised:
    head_summaries.summarise_blocks'); its TextPass. Layer 0 is run as the report shows it (run_attention over the
    capture) and its numbers come from that run's own blocks, or from its whole map where it made one (the weights the
    report shows; for a text within one block, bitwise the block the pass would make), so the layer is not computed
    twice. Where attnviz's layers can run in the model's place (passes.in_models_place), the pass is theirs
    (head_summaries.summarise_in_place): each layer's attention computed once, layer 0's numbers and its run made from
    the pass's blocks (pipeline.pass_maps, runs_of_pass). keep(tokens, run): whether the capture is kept for the report (a
    short text's), asked first before the pass with run None (may a text of this many tokens keep it?), then with layer
    0's run; else each layer's input is let go once summarised (in the model's place: not kept past layer 0's, which
    its run reads, when the first answer is no: 30 layers' inputs are 570 MB of SmolLM2's at 8,192 tokens).

    A text of one token is refused (the templates need two) after tokenizing, before the forward pass."""
    import torch

    from attnviz.analysis.head_summaries import HeadSummaries, summarise_blocks, summarise_in_place
    from attnviz.layer_inputs import encode_texts, threads_for
    from attnviz.own_layer import build_layers, every_layer_sizes
    from attnviz.passes import capture_states, in_models_place
    from attnviz.pipeline import pass_maps, run_attention, runs_of_pass
    from attnviz.run_data import FORWARD_PASS

    spec = replace(spec, kv_text=None)
    encoded = encode_texts(loaded, [text], spec)
    ids = list(encoded.queries.ids[0])
    if len(ids) < 2:
        raise AttnvizError(f"the text is {len(ids)} token as the model reads it: the templates compare a token with those before it, give at least two")
    with threads_for(encoded):
        layers = build_layers(loaded, spec)
    sums = RoleSums(len(layers), max(heads for heads, _, _ in every_layer_sizes(layers)), ids, causal=spec.causal, settings=settings)
    if in_models_place(loaded, spec):  # one pass in the model's place: every layer summarised as it runs, its inputs kept
        kept = range(len(layers)) if keep(len(ids), None) else {0}
        maps = pass_maps(encoded, every_layer_sizes(layers)[0][0], spec)  # layer 0's run, made by the pass
        summaries, states = summarise_in_place(loaded, text, encoded, layers, spec, budget_bytes, also=sums.add, keep=kept,
                                               progress=progress, maps_of={0: maps})  # fmt: skip
        (run,) = runs_of_pass(loaded, [text], replace(spec, layer=0), encoded, states[0], layers[0], maps)
        return TextPass(sums.scores(), summaries, ids, run, (encoded, states) if keep(len(ids), run) else None, layers)
    with threads_for(encoded):
        entered = progress.counting(FORWARD_PASS, len(layers))
        states = capture_states(loaded, encoded, list(range(len(layers))), spec, entered)  # every layer's input, one pass
    first = HeadSummaries(layers[0].num_heads, len(ids), len(ids), causal=spec.causal, window=LOCAL_WINDOW)

    def feed(first_query: int, weights) -> None:  # weights (H, b, K): a block of layer 0's rows
        first.add(first_query, weights)
        sums.add(0, first_query, weights)

    (run,) = run_attention(loaded, [text], replace(spec, layer=0), captured=(encoded, states[0]),
                           each_block=lambda start, weights: feed(start, weights[0]))  # fmt: skip
    if not first.seen:  # the whole map at once (a short text): as one block
        feed(0, torch.from_numpy(run.attention))  # (H, N, N)
    capture = (encoded, states) if keep(len(ids), run) else None
    summaries = summarise_blocks(loaded, text, encoded, layers, spec, budget_bytes, also=sums.add,
                                 states=dict(states) if capture else states, done={0: first},
                                 progress=progress)  # fmt: skip
    return TextPass(sums.scores(), summaries, ids, run, capture, layers)


class RolesPass(NamedTuple):
    """head_roles' answer: every head's roles, and from the text's pass what its report reads (TextPass' run and
    capture: layer 0's AttentionRun, the capture where kept)."""

    roles: RoleScores
    run: Any
    capture: tuple | None


def head_roles(
    loaded, text: str, spec, budget_bytes: int, settings: RoleSettings = RoleSettings(), progress: Progress = Progress(),
    keep=lambda tokens, run: False,
) -> RolesPass:
    """Every head's roles (RoleScores): the text's scores (text_roles, keep as there), then prefix matching and copying
    where they apply, a decoder-only model's heads (said in skipped where not: an encoder's or an encoder-decoder's
    stacks, a model without a language-model head); the share roles this text cannot tell said in skipped too
    (share_role_skips). Two passes of the model: the text's and prefix matching's, through the same attnviz layers
    (built once). progress: each stage's layers as they are done."""
    from attnviz.analysis import circuits
    from attnviz.models.families.family import DECODER

    passed = text_roles(loaded, text, spec, budget_bytes, settings, progress, keep)
    scores, summaries, ids = passed.scores, passed.summaries, passed.ids
    uniform, skipped = share_role_skips(len(ids), causal=spec.causal, settings=settings, window=summaries.window)
    random_ids = []
    if loaded.family.kind != DECODER:
        why = ("an encoder's heads see the tokens after them" if spec.stack in (None, "encoder") else
               "an encoder-decoder's decoder reads the encoder's text too")  # fmt: skip
        why += ": Olsson et al.'s scores are a decoder-only model's (causal self-attention over its own tokens)"
        skipped |= {"prefix_matching": why, "copying": why}
    else:
        random_ids = circuits.random_sequences(loaded)
        scores["prefix_matching"] = circuits.prefix_matching(loaded, spec, budget_bytes, random_ids, progress, passed.layers)
        try:
            scores["copying"] = circuits.copying(loaded, progress)
        except AttnvizError as error:
            skipped["copying"] = str(error)
    return RolesPass(RoleScores(scores, summaries, ids, settings, random_ids, skipped, uniform), passed.run, passed.capture)

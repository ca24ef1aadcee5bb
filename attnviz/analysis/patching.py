"""Which heads carry this answer against that one: activation patching, per layer × head (and position).

Two texts of the same length, a clean one ("When Mary and John went to the store, John gave a drink to") and a
corrupted one (its names swapped), and two tokens, the answer (" Mary") and the wrong one (" John"). The metric m is
logit(answer) - logit(wrong) at one position (the last by default). For each head, the corrupted run with one part
of that head (COMPONENTS) replaced by the clean run's is scored (m_patched - m_corrupt) / (m_clean - m_corrupt):
0, the head's part changes nothing; 1, it alone restores the clean answer (the normalised logit difference of Wang
et al. 2022, PAPERS; TransformerLens's patching module computes the same by hooks, run once per head).

One forward pass of each text (text_pass, models/capture.py) gives all that patching and its report read: each
layer's call and what entered each W_o (models/layer_runs.py replays them, as the effect's: analysis/effect.py), what
entered the final norm, W_q/W_k/W_v's outputs, every layer's attention input. Then only the patched passes run: for
layer L the corrupted run's input of L, copied once per head, runs from L on as one batch, each copy with its own
head's part patched. The direct logit attribution beside it is analysis/attribution.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from attnviz.run_data import Progress

PAPERS = {
    "patching": 'Wang, Variengien, Conmy, Shlegeris and Steinhardt, ICLR 2023, "Interpretability in the Wild: a Circuit '
    'for Indirect Object Identification in GPT-2 small" (arXiv 2211.00593)',
    "method": 'Meng, Bau, Andonian and Belinkov, NeurIPS 2022, "Locating and Editing Factual Associations in GPT" '
    "(arXiv 2202.05262): activation patching (causal tracing)",
    "direct": 'Elhage et al., Transformer Circuits Thread 2021, "A Mathematical Framework for Transformer Circuits": '
    "direct logit attribution",
}
METRIC = (
    "m = logit(answer) - logit(wrong) at the position read: the model's own logits, from its language-model head (an "
    "encoder's masked-LM head, read at a mask token)"
)
SCORE = (
    "(m_patched - m_corrupt) / (m_clean - m_corrupt): the corrupted run with the head's part replaced by the clean "
    "run's, 0 = no effect, 1 = the clean answer restored (the normalised logit difference)"
)
COMPONENTS = {
    "out": "the head's output (its d features entering W_o), at every position",
    "q": "the head's query (its d features of W_q's output, before RoPE and any q norm), at every position",
    "k": "the key of the head's key/value head (its d features of W_k's output, before RoPE and any k norm), at every "
    "position; with grouped-query attention every query head of a group shares it, and the same score",
    "v": "the value of the head's key/value head (its d features of W_v's output), at every position; with "
    "grouped-query attention every query head of a group shares it, and the same score",
    "pattern": "the head's attention weights (its map), the corrupted run's values kept: the clean map times the "
    "corrupted values enters W_o",
}
# their names in patch.json's scores and the table's columns: the output's is "output", the others' their own
SCORE_NAMES = {"out": "output", "q": "q", "k": "k", "v": "v", "pattern": "pattern"}
MOST_AFFECTING = 4  # the heads that --per-position patches position by position, by |output score|


@dataclass
class Patching:
    """Every head of a stack patched from the clean text into the corrupted one.

    scores: component -> (L, H), the normalised scores (SCORE); direct: (L, H) each head's direct logit attribution
    in logit units (None for a post-norm stack: attribution.py); parts the attribution's other parts; clean and
    corrupt: m of each text. per_position: (layer, head) -> (N,) the output score of the head patched at one position
    at a time, for the most affecting heads (with per_position)."""

    scores: dict[str, np.ndarray]
    direct: np.ndarray | None
    parts: dict
    clean: float
    corrupt: float
    position: int
    tokens: list[str]
    corrupt_tokens: list[str]
    answer: str
    wrong: str
    text: str
    corrupt_text: str
    model: str = ""
    stack: str | None = None
    shown: tuple[list[str], list[str]] = ((), ())  # both texts' tokens as a reader sees them (models/shown.py)
    causal: bool = True  # a decoder's heads (or an encoder-decoder's decoder's): titles say so
    per_position: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    edges: object = None  # analysis.edges.Edges, with edges asked for

    @property
    def output(self) -> np.ndarray:
        return self.scores["out"]

    @property
    def top(self) -> list[tuple[int, int]]:
        """The heads by |output score| (or the first component's), most affecting first."""
        values = self.scores["out"] if "out" in self.scores else next(iter(self.scores.values()))
        order = np.argsort(-np.abs(values), axis=None, kind="stable")
        return [tuple(int(i) for i in np.unravel_index(flat, values.shape)) for flat in order]


def check_texts(text: str, corrupt: str, answer: str, wrong: str) -> None:
    """What can be refused before the model loads: the same text twice (m_clean = m_corrupt), the same token twice."""
    from attnviz.errors import AttnvizError, options_named

    if text == corrupt:
        raise AttnvizError(
            f"the clean text and the {options_named('corrupt')} text are the same: m_clean = m_corrupt and the scores "
            "(m_patched - m_corrupt) / (m_clean - m_corrupt) are undefined; give a corrupted text that differs"
        )
    if answer == wrong:
        raise AttnvizError(f"{options_named('answer', 'wrong')} are the same token {answer!r}: m is 0 on every run")


def patch_heads(
    loaded, text: str, corrupt: str, answer: str, wrong: str, spec, position: int | None = None,
    components: tuple[str, ...] = ("out",), per_position: bool = False, progress: Progress = Progress(),
    captures: dict | None = None, edges=None,
) -> Patching:  # fmt: skip
    """Each head of spec.stack (every layer) patched from text (clean) into corrupt, for each of components; the
    direct attribution on the clean run; with per_position, the most affecting heads' output one position at a time.
    progress: the heads patched (a layer's at a time), then the most affecting heads patched by position.
    One pass of each text (text_pass) gives all of it but the patched passes, which start at the patched layer;
    captures, when given a dict, gets each text's capture, "clean" and "corrupt" (EncodedTexts, every layer's
    LayerStates), for the report. edges (analysis.edges.EdgeSettings): also every edge between heads (edges.py)."""
    import torch

    from attnviz.analysis.attribution import direct_attribution
    from attnviz.analysis.edges import ReadOut, check_edges
    from attnviz.layer_inputs import encode_texts
    from attnviz.models.capture import PROJECTIONS

    stack, model = spec.stack, loaded.model
    if edges is not None:
        check_edges(loaded, stack)
    transform, weight, bias = read_out(loaded)
    clean_encoded, corrupt_encoded = (encode_texts(loaded, [each], spec) for each in (text, corrupt))
    tokens, corrupt_tokens = (list(encoded.queries.tokens[0]) for encoded in (clean_encoded, corrupt_encoded))
    check_lengths(tokens, corrupt_tokens)
    if position is not None or transform is None:
        position = check_position(position, len(tokens))  # a decoder's: the last by default
    if transform is not None:  # an encoder's masked-LM head: read at a mask
        ids = [encoded.queries.ids[0] for encoded in (clean_encoded, corrupt_encoded)]
        position = mask_position(position, *ids, loaded.tokenizer)
    answer_id, wrong_id = (token_id(loaded, stack, given, name) for given, name in ((answer, "answer"), (wrong, "wrong")))
    # (E,): W_U[answer] - W_U[wrong], each row in float64 first (as stored, bfloat16, where read a layer at a time)
    direction = weight[answer_id].double() - weight[wrong_id].double()
    offset = 0.0 if bias is None else float(bias[answer_id].double() - bias[wrong_id].double())
    read = ReadOut(position, direction.detach(), offset, transform)
    metric = lambda last: read.metric(last).cpu().numpy()  # noqa: E731  last (C, N, D) -> m of each copy (C,)

    projections = frozenset(component for component in components if component in PROJECTIONS)
    clean = text_pass(loaded, clean_encoded, spec, projections)
    corrupted = text_pass(loaded, corrupt_encoded, spec)
    if captures is not None:
        captures.update(clean=(clean_encoded, clean.states), corrupt=(corrupt_encoded, corrupted.states))
    with torch.inference_mode():
        m_clean, m_corrupt = float(metric(clean.captured.last_hidden)[0]), float(metric(corrupted.captured.last_hidden)[0])
        if m_clean == m_corrupt:
            from attnviz.errors import AttnvizError

            raise AttnvizError(
                f"m_clean = m_corrupt = {m_clean:.4g}: the two texts give the same logit difference at position "
                f"{position}, and the scores (m_patched - m_corrupt) / (m_clean - m_corrupt) are undefined"
            )
        patched = _Patched(loaded, spec, clean, corrupted)
        normalise = lambda values: (values - m_corrupt) / (m_clean - m_corrupt)  # noqa: E731
        advance = progress.counting("heads patched", len(components) * patched.num_layers * patched.num_heads)
        scores = {component: normalise(patched.scores(component, metric, advance)) for component in components}
        direct, parts = direct_attribution(loaded, stack, clean.recorded, clean.captured.final_in, position, direction, offset)
        result = Patching(
            scores=scores, direct=direct, parts=parts, clean=m_clean, corrupt=m_corrupt, position=position,
            tokens=tokens, corrupt_tokens=corrupt_tokens, answer=answer, wrong=wrong, text=text,
            corrupt_text=corrupt, model=loaded.name, stack=stack, shown=_shown(loaded, stack, tokens, corrupt_tokens),
            causal=transform is None,
        )  # fmt: skip
        if per_position:
            chosen = result.top[:MOST_AFFECTING]
            advance = progress.counting("heads patched position by position", len(chosen))
            result.per_position = {head: normalise(row) for head, row in zip(chosen, patched.by_position(chosen, metric, advance))}
    if edges is not None:
        from attnviz.analysis.edges import circuit_edges

        result.edges = circuit_edges(loaded, spec, clean, corrupted, read, m_clean, m_corrupt, edges, progress)
    return result


def read_out(loaded):
    """(transform, W_U (V, E), bias (V,) or None): what makes the logits of the model's last hidden state h,
    transform(h) @ W_U^T + bias. A decoder's language-model head (an encoder-decoder's), linear (transform None); an
    encoder's masked-LM head, read from its checkpoint (models/masked_lm.py); an encoder without one is refused."""
    from attnviz.errors import AttnvizError
    from attnviz.models.families import ENCODER
    from attnviz.models.masked_lm import masked_lm_head

    if loaded.family.kind != ENCODER:
        return None, *loaded.model.output_head()
    head = masked_lm_head(loaded)
    if head is None:
        raise AttnvizError(
            f"{loaded.name} is an encoder without a masked-LM head: it predicts no token whose logits patching could "
            "read; give an encoder saved with its masked-LM head (its *ForMaskedLM class's), a decoder, or an "
            "encoder-decoder (whose decoder is patched)"
        )
    return head.transform, head.weight, head.bias


def mask_position(position: int | None, clean_ids: list[int], corrupt_ids: list[int], tokenizer) -> int:
    """Where an encoder's masked-LM head is read: the clean text's mask token (position, when given, must be one),
    the corrupted text's mask token there too; else refused in one line."""
    from attnviz.errors import AttnvizError, option, options_named

    mask, mask_id = tokenizer.mask_token, tokenizer.mask_token_id
    if mask_id is None:
        raise AttnvizError("the model's tokenizer has no mask token: its masked-LM head has no position to read")
    masks = [index for index, token in enumerate(clean_ids) if token == mask_id]
    at = ", ".join(map(str, masks))
    if not masks:
        raise AttnvizError(
            f"the clean text has no {mask}: an encoder's masked-LM head predicts the token at a mask; put {mask} where "
            f"the answer goes, in both texts"
        )
    if position is None and len(masks) > 1:
        raise AttnvizError(f"the clean text has {len(masks)} {mask} tokens (positions {at}): choose the one to read with {options_named('position')}")
    if position is not None and position not in masks:
        raise AttnvizError(f"{option('position', position)} is not a {mask}: the clean text's {mask} is at position {at}")
    position = masks[0] if position is None else position
    if corrupt_ids[position] != mask_id:
        raise AttnvizError(
            f"the {options_named('corrupt')} text has no {mask} at position {position}: the answer is read at the same "
            f"mask in both texts"
        )
    return position


def _shown(loaded, stack, tokens: list[str], corrupt_tokens: list[str]) -> tuple[list[str], list[str]]:
    from attnviz.models.tokens import shown_rows

    return tuple(shown_rows(loaded.tokenizer_for(stack), [tokens, corrupt_tokens], None))


@dataclass
class TextPass:
    """One text's pass (models/capture.py): every layer's input x as layer_states gives it (LayerStates), the layers'
    calls and z_merged (Recorded: run_from replays them), what entered the final norm, the last hidden state, and
    what W_q, W_k or W_v gave when asked."""

    captured: object  # models.capture.Capture
    recorded: object  # models.layer_runs.Recorded
    states: dict  # layer -> layer_inputs.LayerStates


def text_pass(loaded, encoded, spec, projections: frozenset[str] = frozenset()) -> TextPass:
    """The one pass over one text's encoding (layer_inputs.encode_texts) that patching reads, under the run's thread
    rule (layer_inputs.threads_for): x of every layer, calls, z_merged, final, and the projections named ("q", ...)."""
    from attnviz.layer_inputs import LayerStates, threads_for
    from attnviz.models.capture import Wanted

    model, stack, device = loaded.model, spec.stack, spec.device
    queries = encoded.queries
    if loaded.is_bert:
        inputs = queries.model_inputs(device)
    else:
        inputs = {"input_ids": queries.input_ids.to(device), "attention_mask": queries.attention_mask.to(device)}
    source = encoded.source
    if source is not None:  # an encoder-decoder's decoder: the encoder reads the text
        source = {"input_ids": source.input_ids.to(device), "attention_mask": source.attention_mask.to(device)}
    wanted = Wanted(frozenset(range(loaded.num_layers_of(stack))), calls=True, z_merged=True, projections=projections, final=True)
    with threads_for(encoded):
        captured = model.capture_pass(inputs, wanted, stack, source)
    states = {}
    for layer, entering in captured.x.items():
        hidden = entering.hidden  # self-attention: the keys are the queries' very tensor, as layer_states gives them
        bias = model.position_bias(stack, hidden.shape[1], hidden.shape[1], device)
        states[layer] = LayerStates(hidden, hidden, bias)
    return TextPass(captured, model.recorded(captured, inputs, stack, source), states)


def layer_runs_of(loaded, text: str, capture, spec) -> list:
    """Every layer's AttentionRun of a text from its capture (patch_heads' captures): pipeline.run_layers over it, no
    pass of the model (the report's maps of the corrupted text)."""
    from attnviz.pipeline import run_layers

    return run_layers(loaded, [text], replace(spec, layer=None), captured=capture)[0]


def check_lengths(tokens: list[str], corrupt_tokens: list[str]) -> None:
    """The two texts tokenize to the same length: else refused, naming both lengths and the first differing token."""
    from attnviz.errors import AttnvizError, options_named

    if len(tokens) != len(corrupt_tokens):
        first = next((i for i, (a, b) in enumerate(zip(tokens, corrupt_tokens)) if a != b), min(len(tokens), len(corrupt_tokens)))
        shown = lambda row: repr(row[first]) if first < len(row) else "the end"  # noqa: E731
        raise AttnvizError(
            f"the clean text has {len(tokens)} tokens and the {options_named('corrupt')} text {len(corrupt_tokens)}: patching "
            f"needs the same positions in both (first difference at token {first}: {shown(tokens)} against "
            f"{shown(corrupt_tokens)})"
        )


def check_position(position: int | None, num_tokens: int) -> int:
    from attnviz.errors import AttnvizError, option

    if position is None:
        return num_tokens - 1
    if not 0 <= position < num_tokens:
        raise AttnvizError(f"{option('position', position)} is past the text: its {num_tokens} tokens are positions 0 to {num_tokens - 1}")
    return position


def token_id(loaded, stack, given: str, name: str) -> int:
    """The id of an answer token given as text (" Mary"): exactly one token, else refused naming its pieces."""
    from attnviz.errors import AttnvizError, options_named

    tokenizer = loaded.tokenizer_for(stack)
    ids = tokenizer.pieces(given)
    if len(ids) != 1:
        pieces = ", ".join(repr(piece) for piece in tokenizer.convert_ids_to_tokens(ids)) or "none"
        raise AttnvizError(f"{options_named(name)} {given!r} is {len(ids)} tokens, not one ({pieces}): give a single token of the model's")
    return ids[0]


class _Patched:
    """The corrupted run from layer L on, copies of it with one head's part from the clean run."""

    def __init__(self, loaded, spec, clean: TextPass, corrupted: TextPass):
        self.loaded, self.spec, self.clean, self.corrupted = loaded, spec, clean.recorded, corrupted.recorded
        self.passes = (clean, corrupted)
        self.num_layers, self.num_heads = loaded.num_layers_of(spec.stack), loaded.num_heads_of(spec.stack)

    def run(self, layer: int, copies: int, heads=None, output=None):
        entering = self.corrupted.entering(layer).expand(copies, -1, -1)  # (C, N, D)
        return self.loaded.model.run_from(layer, entering, self.corrupted, heads, self.spec.stack, output)

    def clean_heads(self, layer: int):
        """What entered layer's W_o in the clean run, per head: (H, N, d)."""
        _, num_tokens, width = self.clean.heads[layer].shape
        return self.clean.heads[layer][0].view(num_tokens, self.num_heads, width // self.num_heads).transpose(0, 1)

    def scores(self, component: str, metric, advance) -> np.ndarray:
        """(L, H): m of the corrupted run with each head's component patched; advance(H) after each layer's."""
        from attnviz.analysis.effect import one_head_each

        values = np.zeros((self.num_layers, self.num_heads))
        every = list(range(self.num_heads))
        clean_outputs = self.passes[0].captured.projections.get(component)  # layer -> (1, N, features): q, k, v
        for layer in range(self.num_layers):
            if component == "out":
                values[layer] = metric(self.run(layer, self.num_heads, one_head_each(self.num_heads, every, self.clean_heads(layer))))
            elif component == "pattern":
                mixed = self._clean_maps_corrupt_values(layer)  # (H, N, d)
                values[layer] = metric(self.run(layer, self.num_heads, one_head_each(self.num_heads, every, mixed)))
            else:
                values[layer] = self._projection_scores(layer, component, clean_outputs, metric)
            advance(self.num_heads)
        return values

    def by_position(self, chosen: list[tuple[int, int]], metric, advance) -> list[np.ndarray]:
        """For each (layer, head) of chosen: (N,) m with its output patched at one position at a time; advance(1) after each."""
        from attnviz.analysis.effect import one_head_each

        rows = []
        for layer, head in chosen:
            clean = self.clean_heads(layer)[head]  # (N, d)
            num_tokens = clean.shape[0]
            change = one_head_each(self.num_heads, [head] * num_tokens, clean, positions=list(range(num_tokens)))
            rows.append(metric(self.run(layer, num_tokens, change)))
            advance(1)
        return rows

    def _projection_scores(self, layer: int, component: str, clean_outputs: dict, metric) -> np.ndarray:
        """(H,): each query head's, through its key/value head for k and v (shared by its group)."""
        import torch

        from attnviz.analysis.effect import one_head_each
        from attnviz.models.capture import projection_slice

        model = self.loaded.model
        module, first, count, head_dim = projection_slice(model, model.attention_weights(layer, self.spec.stack), component)
        clean = clean_outputs[layer][0, :, first : first + count * head_dim]  # (N, n * d)
        num_tokens = clean.shape[0]
        per_head = clean.view(num_tokens, count, head_dim).transpose(0, 1)  # (n, N, d)
        replace = one_head_each(count, list(range(count)), per_head)

        def change(y):  # y (C, N, features): the role's n heads' part of it replaced
            part = replace(y[..., first : first + count * head_dim].contiguous())
            return torch.cat([y[..., :first], part, y[..., first + count * head_dim :]], dim=-1)

        values = metric(self.run(layer, count, output=(module, change)))  # (n,)
        return np.repeat(values, self.num_heads // count)  # query head h reads key/value head h // G

    def _clean_maps_corrupt_values(self, layer: int):
        """(H, N, d): each head's clean map times its corrupted values, from attnviz's own layer (attention/layer.py)."""
        from attnviz.attention.layer import layer_from_weights
        from attnviz.spec import model_is_causal

        model, stack = self.loaded.model, self.spec.stack
        attention = layer_from_weights(model.attention_weights(layer, stack))
        device = self.spec.device
        clean_in, corrupt_in = (each.states[layer].queries for each in self.passes)  # (1, N, D) each
        num_tokens = clean_in.shape[1]
        bias = model.position_bias(stack, num_tokens, num_tokens, device)
        _, pattern = attention(clean_in.to(attention.w_q.weight), causal=model_is_causal(self.loaded, stack), position_bias=bias)
        _, _, values = attention.project(corrupt_in.to(attention.w_q.weight))  # (1, H, N, d)
        return (pattern.to(values.dtype) @ values)[0]  # (H, N, d)

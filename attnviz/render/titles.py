"""Figure titles: one helper, so that every figure names its text and setup the same way.

A title has two lines. The first says what is drawn and from which model, layer and head:

    all-MiniLM-L6-v2 · layer 0 · head 3 · causal

the second which text, where the keys come from, and how to draw the same figure again:

    “我爱中国” · cross-attention (keys from: “我想吃酸菜鱼”) · random parameters, seed 7

A model of another family than BERT is named with its family, its key/value heads when fewer
than its heads (grouped-query attention), and an encoder-decoder's attention:

    t5 · T5 · layer 0 · head 3
    “The cat sat.” · decoder cross-attention (keys: the encoder's output for: “Le chat.”)

Weights stored quantised (SmolLM2's GGUF file) are said after the family, and heads that --heads
re-split from the model's own projections say so, each head as "head 0 of 3":

    SmolLM2-135M-Instruct · Llama (Q4_1 GGUF, dequantised) · layer 0 · head 0 of 3
    “the cat sat” · 3 heads re-split from the trained 9 · 1 key/value head (grouped-query; trained: 3)

A fallback model (the bundled one in place of the default, offline) and a text the model read
mostly as [UNK] (UnknownTokens.high) are said in the second line, so that no figure hides them:

    “我想吃酸菜鱼” · fallback for bert-base-chinese · 5 of 6 tokens [UNK]

No heavy imports: the terminal imports it; notes shorten texts with attnviz.text.shorten, as titles do.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

from attnviz.text import shorten

WORDS_NOTE = "over words (pieces merged, Clark et al. 2019)"  # a run of --words
TEXT_CHARS = 60  # a text in a title, shortened to this many characters
CROSS_TEXT_CHARS = 36  # each of the two texts of cross-attention
CHAR_WIDTH = 0.6  # a character's mean width, in font sizes (DejaVu Sans; a CJK character is nearer 1)


def short_model_name(model: str) -> str:
    """The last part of a hub id or folder: "org/all-MiniLM-L6-v2" -> "all-MiniLM-L6-v2"."""
    parts = [part for part in re.split(r"[\\/]", model) if part]
    return parts[-1] if parts else model


def quoted(text: str, max_chars: int = TEXT_CHARS, fonts: bool = True) -> str:
    """ "“text”", shortened, with characters no font can draw written as <U+XXXX> (fonts=False: as they are, for a browser)."""
    short = shorten(text, max_chars)
    if fonts:
        from attnviz.render.fonts import displayable

        short = displayable(short)
    return f"“{short}”"


def counted(count: int, noun: str) -> str:
    """ "1 head", "12 heads"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def chars_across(width_inches: float, font_points: float = 12.0) -> int:
    """About how many characters of a font_points font fit across width_inches."""
    return int(width_inches * 72 / (font_points * CHAR_WIDTH))


def wrapped(parts: Sequence[str], line_chars: int | None, separator: str = " · ") -> str:
    """parts joined by separator, a new line before a part that would make a line longer than line_chars."""
    lines = [""]
    for part in parts:
        # A part longer than a line itself (a cross-attention's source) is cut at its spaces.
        first, *rest = textwrap.wrap(part, line_chars, break_long_words=False) if line_chars and len(part) > line_chars else [part]
        joined = lines[-1] + separator + first if lines[-1] else first
        if lines[-1] and line_chars is not None and len(joined) > line_chars:
            lines.append(first)
        else:
            lines[-1] = joined
        lines += rest
    return "\n".join(lines)


def figure_title(
    model: str,
    scope: Sequence[str],
    *,
    text: str | None = None,
    about: str | None = None,
    kv_text: str | None = None,
    causal: bool = False,
    weights: str | Sequence[str] = "pretrained",
    seed: int | None = None,
    notes: Sequence[str] = (),
    line_chars: int | None = None,
    family: str | None = None,
    stack: str | None = None,
    kv_heads: str | None = None,
    fonts: bool = True,
    fallback_for: str | None = None,
    unknown: Sequence = (),
    quantised: str | None = None,
    heads: str | None = None,
) -> str:
    """The two title lines of a figure (more when they would be longer than line_chars).

    scope: what the figure shows, after the model's name ("layer 0", "head 3"); text: the
    (query) text, or about: what stands in its place ("averaged over 40 texts"); kv_text: the
    text keys and values come from; weights: "pretrained", "random", or a list of both (the
    parameters, not the attention weights), with seed the seed of the random ones; notes:
    more for the second line; line_chars: the characters a line may hold (see chars_across),
    texts are shortened to fit it. family: the model's family, named after the model unless
    it is BERT; stack: an encoder-decoder's attention (stack_words); kv_heads: kv_heads_words;
    fonts=False keeps characters matplotlib's fonts lack (an HTML title, which the browser draws).
    fallback_for and unknown: the headline's warnings (headline_notes). quantised: how the
    weights were stored (Quantisation.short), said after the family; heads: resplit_words.
    """
    named_family = [family] if family and family != "BERT" else []
    if quantised:
        named_family = [f"{named_family[0]} ({quantised})" if named_family else quantised]
    first = [short_model_name(model), *named_family, *scope, *(["causal"] if causal else [])]
    max_chars = CROSS_TEXT_CHARS if kv_text else TEXT_CHARS
    if line_chars is not None:  # a text fits one line; "cross-attention (keys from: “…”)" too
        around = len(_keys_words(stack, "“”")) if kv_text else len("“”")
        max_chars = max(12, min(max_chars, line_chars - around))
    second = [quoted(text, max_chars, fonts)] if text is not None else []
    second += [about] if about else []
    if kv_text or stack:
        second.append(_keys_words(stack, quoted(kv_text, max_chars, fonts) if kv_text else None))
    second += [heads] if heads else []
    second += [kv_heads] if kv_heads else []
    if "random" in ([weights] if isinstance(weights, str) else weights):
        second.append("random parameters" + (f", seed {seed}" if seed is not None else ""))
    second += headline_notes(fallback_for, unknown if text is not None else ())  # counts of the text named, not of a corpus
    second += notes
    return wrapped(first, line_chars) + "\n" + wrapped(second, line_chars)


def _keys_words(stack: str | None, quoted_keys_text: str | None) -> str:
    """Where the keys come from: --kv's text, or an encoder-decoder's stack (stack_words)."""
    if stack is not None:
        return stack_words(stack, quoted_keys_text)
    return f"cross-attention (keys from: {quoted_keys_text})"


def stack_words(stack: str, quoted_kv_text: str | None = None) -> str:
    """An encoder-decoder's attention in words; quoted_kv_text: --kv's text, quoted (None: no --kv).

    Cross-attention's keys are the encoder's output for the --kv text, or for the text itself.
    """
    if stack == "cross":
        source = f": {quoted_kv_text}" if quoted_kv_text else " the same text"
        return f"decoder cross-attention (keys: the encoder's output for{source})"
    if stack == "decoder":
        return "decoder self-attention (the encoder reads the same text)"
    if quoted_kv_text:  # --stack encoder --kv: the encoder's layer, keys from the other text's encoder states
        return f"encoder layer, cross-attention (keys from: {quoted_kv_text})"
    return "encoder self-attention"


def kv_heads_words(num_heads: int, num_kv_heads: int | None, model_kv_heads: int | None = None) -> str | None:
    """ "2 key/value heads (grouped-query)" when the heads share fewer key/value heads; else None.

    model_kv_heads: the model's own count, when --heads re-split them into num_kv_heads: "1 key/value head
    (grouped-query; trained: 3)".
    """
    if num_kv_heads is None or num_kv_heads >= num_heads:
        return None
    resplit = f"; trained: {model_kv_heads}" if model_kv_heads not in (None, num_kv_heads) else ""
    return f"{counted(num_kv_heads, 'key/value head')} (grouped-query{resplit})"


def run_kv_heads_words(run) -> str | None:
    """kv_heads_words of an AttentionRun (its trained key/value heads when re-split)."""
    model_kv_heads = run.model_heads // run.group_size if run.re_split else None
    return kv_heads_words(run.num_heads, run.num_kv_heads, model_kv_heads)


def resplit_words(run) -> str | None:
    """ "3 heads re-split from the trained 12" when --heads split the model's own projections another way; else None."""
    return f"{counted(run.num_heads, 'head')} re-split from the trained {run.model_heads}" if run.re_split else None


def effect_decimals(values) -> int:
    """Decimals that show the largest of values (any shape, NaN ignored) to 2 significant digits: 3 for a KL of 0.7,
    4 for an encoder's cosine distance of 0.005; at most 5."""
    import math

    import numpy as np

    largest = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0
    return 3 if largest == 0.0 else min(5, max(3, 1 - math.floor(math.log10(largest))))


def head_scope(run, head: int, short: bool = False) -> list[str]:
    """A head's part of a title: "head 3", "head 0 of 3" (re-split), the key/value head it shares with
    grouped-query attention, "kv head 1" (short: "head 3 · kv 1", as a grid's panel reads), and with --effect what
    taking it out does: "taken out (zero): KL 0.012, Δloss +0.004" (short: its first effect, "KL 0.012"); with its
    roles (HeadsResult.with_roles), "roles: previous-token, sink" (short: the names)."""
    name = f"head {head} of {run.num_heads}" if run.re_split and not short else f"head {head}"
    kv_head = run.kv_head_of(head)
    scope = [name] if kv_head is None else [name, f"kv {kv_head}" if short else f"kv head {kv_head}"]
    effects = getattr(run, "effects", None)
    if effects is not None:
        from attnviz.analysis.effect import EFFECTS

        said = []
        for effect in effects.names:  # decimals for the layer's heads alike
            layer = effects.values[effect][run.layer]
            said.append(f"{EFFECTS[effect][0]} {layer[head]:{'+' if effect == 'loss' else ''}.{effect_decimals(layer)}f}")
        scope.append(said[0] if short else f"taken out ({effects.ablation}): {', '.join(said)}")
    roles = getattr(run, "head_roles", None)
    if roles is not None:  # attnviz.roles' labels (HeadsResult.with_roles)
        scope.append(("" if short else "roles: ") + (", ".join(roles[head]) or "none"))
    return scope


def headline_notes(fallback_for: str | None, unknown: Sequence = ()) -> list[str]:
    """What a reader must not miss: "fallback for bert-base-chinese" when the model loaded in place of the one
    asked for, and "5 of 6 tokens [UNK]" for each text (run_data.UnknownTokens, None: not counted) mostly unknown."""
    notes = [f"fallback for {fallback_for}"] if fallback_for else []
    return notes + [each.words() for each in unknown if each is not None and each.high]


def headline_recap(run) -> str | None:
    """One short line for the end of a command's output, after the table that scrolls the first notes away:
    "all-MiniLM-L6-v2: fallback for bert-base-chinese · 5 of 6 tokens [UNK]; offline: ...; online: ..."; None when all is well."""
    notes = headline_notes(run.fallback_for, (run.unknown, run.kv_unknown))
    if not notes:
        return None
    unread = [text for text, unknown in ((run.text, run.unknown), (run.kv_text, run.kv_unknown)) if unknown is not None and unknown.high]
    if unread:
        from attnviz.models.tokens import better_models

        advice = better_models(" ".join(unread))
    else:
        advice = "the first note says how to get the real one"
    return f"{short_model_name(run.model)}: {' · '.join(notes)}; {advice}"


def run_setup(run) -> dict:
    """figure_title's settings of an AttentionRun: its text, keys' text, mask, parameters, family, stack, key/value heads,
    whether its model is a fallback and its texts mostly [UNK], its weights' quantisation and a re-split of its heads."""
    return dict(
        text=run.text,
        kv_text=run.kv_text,
        causal=run.causal,
        weights=run.weights,
        family=run.family,
        stack=run.stack,
        kv_heads=run_kv_heads_words(run),
        fallback_for=run.fallback_for,
        unknown=(run.unknown, run.kv_unknown),
        quantised=run.quantisation.short if run.quantisation is not None else None,
        heads=resplit_words(run),
    )


def run_title(run, scope: Sequence[str], *, seed: int | None = None, over_words: bool | None = None, **options) -> str:
    """figure_title of an AttentionRun: its model, text, keys' text, mask and parameters.

    A causal mask (--causal) on a layer past the first is over a bidirectional model's hidden
    states, and the title says so (only layer 0's input, the embeddings, holds no later token);
    a decoder's own causal mask (run.model_causal) needs no such note. A run over words says so (over_words=False: a figure of its tokens' tensors does not).
    """
    from attnviz.analysis.statistics import CAUSAL_OVER_BIDIRECTIONAL

    notes = list(options.pop("notes", ()))
    if run.words is not None if over_words is None else over_words:
        notes.append(WORDS_NOTE)
    if run.causal and run.layer > 0 and not run.model_causal:
        notes = list(dict.fromkeys([*notes, CAUSAL_OVER_BIDIRECTIONAL]))
    return figure_title(run.model, scope, seed=seed, notes=notes, **{**run_setup(run), **options})

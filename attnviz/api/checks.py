"""What every API function checks and shares before its computation: the texts of a call (each checked as the
command line checks its TEXT), their lengths and token counts, the refusals known before a model loads (--stack, a
BERT-only command) or once it has (a decoder's command, a BERT-only one), and the notes of a call's results.
"""

from __future__ import annotations

from contextlib import contextmanager

from attnviz.api.arguments import must_be_str, refuse
from attnviz.api.models import Model
from attnviz.api.notes import warn_notes
from attnviz.api.options import RunOptions
from attnviz.errors import AttnvizError, option
from attnviz.spec import check_text


def summarised_in_its_run(loaded, texts: list[str], cross_attention: bool) -> bool:
    """Whether a report's run of texts is to summarise every layer in its own forward pass (heads' layer_summaries,
    head_summaries.run_and_summarise): one long text alone (past ZOOM_MIN_TOKENS tokens, as --truncate cuts it),
    self-attention, whose report shows those summaries, not whole maps; the forward pass then runs once, not twice."""
    from attnviz.html.pyramid import ZOOM_MIN_TOKENS

    return len(texts) == 1 and not cross_attention and token_counts(loaded, texts)[0] > ZOOM_MIN_TOKENS


def token_counts(loaded, texts: list[str]) -> list[int]:
    """Each text's tokens, at most the model's positions (--truncate's cut; a longer text is refused before)."""
    return [min(len(ids), loaded.max_positions) for ids in loaded.tokenizer.encode_batch(texts)]


def warn_run_notes(notes, handle: Model) -> None:
    """Each distinct note of a call's results as an AttnvizWarning at the caller's line (api/notes.py), so that a
    notebook shows it; the handle's own note (the fallback) is attnviz.load's to warn, once (the command line prints the notes itself)."""
    warn_notes(notes, model_note=handle.loaded.note)


def refuse_before_loading(options: RunOptions, needs_bert: str | None = None) -> None:
    """Refuse --stack, or a BERT-only command, for a model whose family is known before loading it (a folder's config.json)."""
    from attnviz.api.models import family_before_loading
    from attnviz.spec import refuse_stack

    model, stack = options.model, options.stack
    if stack is None and needs_bert is None:
        return
    family = family_before_loading(model)
    if family is None:  # known once loaded: run_spec and require_bert check it then
        return
    name = model.loaded.name if isinstance(model, Model) else str(model)
    refuse_stack(name, family, stack)
    if needs_bert is not None and family.name != "BERT":
        raise AttnvizError(needs_bert.format(model=name, family=f"{family.name} {family.kind}"))


def require_decoder(handle: Model, command: str) -> None:
    """A command that continues a text (generate) refuses a model that is no decoder, naming the bundled decoder
    where that model is the offline stand-in for the default (naming_the_bundled_decoder)."""
    from attnviz.analysis.generation import check_decoder

    with naming_the_bundled_decoder(handle):
        check_decoder(handle.loaded, command)


@contextmanager
def naming_the_bundled_decoder(handle: Model):
    """A refusal (AttnvizError) of the model, where it is the bundled encoder loaded offline in place of the default
    (no --model given), names the bundled decoder there is (SmolLM2): the refusal is then not a dead end."""
    from attnviz.models.smollm2 import smollm2_gguf

    try:
        yield
    except AttnvizError as refused:
        if handle.loaded.fallback_for is None or smollm2_gguf() is None:
            raise
        stand_in = f"{handle.loaded.name} stands in offline for {handle.loaded.fallback_for}, the default model"
        raise AttnvizError(f"{refused}; {stand_in}: give {option('model', 'smollm2')}, the bundled decoder") from None


def require_bert(handle: Model, needs_bert: str) -> None:
    """A BERT-only command (needs_bert: POSITION_NEEDS_BERT or COMPARE_NEEDS_BERT) refuses a loaded model of another family."""
    if not handle.loaded.is_bert:
        raise AttnvizError(needs_bert.format(model=handle.loaded.name, family=f"{handle.family} {handle.kind}"))


def _texts(text, one: bool = False, name: str = "text") -> list[str]:
    """The texts of a call (name: its argument), each checked as the command line checks its TEXT."""
    if one:
        check_text(must_be_str(name, text))
        return [text]
    if isinstance(text, str):
        check_text(text)
        return [text]
    if not isinstance(text, (list, tuple)):
        refuse(name, "a str or a list of str", text)
    if not text:
        raise AttnvizError("no texts: give a text, or a list of texts")
    for index, each in enumerate(text):
        check_text(must_be_str(f"{name}[{index}]", each))
    return list(text)


def _check_lengths(loaded, texts: list[str], truncate: bool) -> None:
    """Name the first text of a list too long for the model ("texts[2] has 602 tokens, ..."), before any work."""
    from attnviz.models.tokens import check_lengths

    if len(texts) > 1 and not truncate:
        counts = [len(ids) for ids in loaded.tokenizer.encode_batch(texts)]
        check_lengths(counts, loaded.max_positions, [f"texts[{index}]" for index in range(len(texts))])


def _comma_list(value) -> str:
    """A list given to the API as the command line's comma list (1,4,12), so the same parser checks it."""
    return value if isinstance(value, str) else ",".join(str(item) for item in value)

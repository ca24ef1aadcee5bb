"""A run's settings: one frozen dataclass, built once (run_spec, by the command line or the API) and written into every JSON.

A JSON file alone should say how to run it again: which model was asked for and which one
loaded, the layer, the heads, the parameters (pretrained or random, and the seed), the masks,
the device, whether texts could be cut, and the attnviz that wrote it. Plain values only, no
torch: cheap to import, to compare and to print. The stages take the RunSpec whole (run_attention,
run_layers, measure_heads, trace_texts, compare_splits, write_batch), never its settings one by one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from attnviz.errors import AttnvizError, option, options_named
from attnviz.version import __version__

WEIGHTS = ("pretrained", "random")
STACKS = ("encoder", "decoder", "cross")  # an encoder-decoder's attentions (RunSpec.stack)  # the model's parameters, not the attention weights
MAX_SEED = 2**64 - 1  # torch.manual_seed takes 64 bits
LOCAL_SOURCES = ("local folder", "local file")  # a model named by its path on this machine (a file: GGUF)


@dataclass(frozen=True)
class RunSpec:
    """What a run was given, with the model it resolved to.

    model is --model as given (None: the default), resolved_model the model that loaded (a hub
    id, the bundled model's name, or a local folder's absolute path) and model_source where it
    came from ("local folder", "local file", "hub cache", "hub download", "bundled"). layer is None for the
    commands that run every layer (stats, layers). num_heads is the count the projections were
    split into. weights are the model's parameters: "pretrained" (the checkpoint's projections)
    or "random" (a fresh layer drawn from seed). In compare's shared settings num_heads and
    weights are None: each split has its own. num_heads None before the model is known means the
    model's own count (the stages resolve it). stack is which attention of an encoder-decoder
    ("encoder", "decoder": the decoder's self-attention, "cross": the decoder's attention over the
    encoder), None for other models. causal is the mask: a decoder's own (GPT-2, Llama, an
    encoder-decoder's decoder) or --causal's over a bidirectional model. The defaults are the
    command line's.
    """

    model: str | None
    resolved_model: str
    model_source: str
    layer: int | None = 0
    num_heads: int | None = None
    weights: str | None = "pretrained"
    seed: int = 0
    causal: bool = False
    kv_text: str | None = None
    stack: str | None = None
    device: str = "cpu"  # "cpu" or "cuda": where it runs, after "auto" was resolved
    dtype: str = "float32"  # what the model and attnviz's layer compute in (--dtype, "auto" resolved); in to_dict unless float32
    truncate: bool = False  # --truncate: texts longer than the model's positions may be cut
    words: bool = False  # --words: maps over words (pieces merged by Clark et al.'s rule), not tokens
    memory: int | None = None  # --memory, MB for a block of attention (None: budgets.memory_budget's default); not in to_dict
    js: bool | None = None  # stats: whether the Jensen-Shannon distances are measured (--js); None elsewhere (measured where asked)
    version: str = __version__  # attnviz's

    def __post_init__(self) -> None:
        if self.weights is not None and self.weights not in WEIGHTS:
            raise AttnvizError(f"unknown weights {self.weights!r}: choose pretrained or random")
        if self.stack is not None and self.stack not in STACKS:
            raise AttnvizError(f"unknown stack {self.stack!r}: choose encoder, decoder or cross")
        if not 0 <= self.seed <= MAX_SEED:  # the command line's --seed checks this range as it parses
            raise AttnvizError(f"seed {self.seed} is out of range: give 0 to 2**64 - 1")

    @property
    def cross_attention(self) -> bool:
        """Keys from another text (--kv) or an encoder-decoder's cross-attention: no every-layer self-attention maps."""
        return self.kv_text is not None or self.stack == "cross"

    def to_dict(self) -> dict:
        """The "settings" object of every JSON attnviz writes (docs/formats.md, "Settings")."""
        settings = asdict(self)
        settings["seed"] = None if self.weights == "pretrained" else self.seed  # pretrained parameters draw nothing
        settings["attnviz_version"] = settings.pop("version")
        del settings["memory"]  # how the weights were computed, not which: the same numbers within any budget
        if self.dtype == "float32":  # the files of a float32 run stay as they were before --dtype
            del settings["dtype"]
        return settings


def run_spec(loaded, model: str | None = None, **settings) -> RunSpec:
    """The settings of a run on a loaded model (anything with .name and .source, such as LoadedModel).

    model is the name or folder as given (None: the default); settings are RunSpec's, the rest
    keep their defaults. An encoder-decoder's stack defaults to "cross" with a kv_text, else
    "encoder"; a decoder's own attention is causal whatever settings say (model_is_causal).
    """
    family = getattr(loaded, "family", None)
    refuse_stack(loaded.name, family, settings.get("stack"))
    if getattr(family, "kind", None) == "encoder-decoder":
        settings["stack"] = settings.get("stack") or ("cross" if settings.get("kv_text") is not None else "encoder")
    kind = getattr(family, "kind", None)
    if settings.get("kv_text") is not None and (kind == "decoder" or settings.get("stack") == "decoder"):
        where = f"{loaded.name} is a decoder" if kind == "decoder" else "a decoder's self-attention"
        kv = option("kv")
        raise AttnvizError(f"{kv}: {where} attends over one text's own tokens; {kv} needs an encoder, or an encoder-decoder's cross-attention")
    if model_is_causal(loaded, settings.get("stack")):
        settings["causal"] = True
    settings.setdefault("dtype", getattr(loaded, "dtype", "float32"))  # what the model loaded in
    return RunSpec(model=model, resolved_model=resolved_model_name(model, loaded), model_source=loaded.source, **settings)


def refuse_stack(name: str, family, stack: str | None) -> None:
    """--stack picks one of an encoder-decoder's attentions: any other family has one, so it is refused."""
    if stack is None or getattr(family, "kind", None) == "encoder-decoder":
        return
    what = f"a {family.name} {family.kind}, not an encoder-decoder" if family is not None else "not an encoder-decoder"
    raise AttnvizError(f"{option('stack', stack)}: {name} is {what}; leave {options_named('stack')} out")


def model_is_causal(loaded, stack: str | None) -> bool:
    """True when the model's own attention is causal: a decoder's, or an encoder-decoder's decoder self-attention."""
    family = getattr(loaded, "family", None)
    return getattr(family, "kind", None) == "decoder" or stack == "decoder"


def resolved_model_name(given: str | None, loaded) -> str:
    """The model that loaded: a local folder or GGUF file as an absolute path, else its name (hub id or bundled)."""
    if loaded.source in LOCAL_SOURCES and given is not None:
        return str(Path(given).expanduser().resolve())
    return loaded.name


# ---- checks of the settings that need no model: the CLI and the API both call them before loading one ----


def check_text(text: str | None, what: str = "the text") -> None:
    """A text (or the --kv text) must have some words, all of them characters; None is "not given" and passes.

    A byte that is not UTF-8 on the command line (`attnviz heads $'caf\\xe9'`) reaches Python as a
    lone surrogate, U+DC80 to U+DCFF (surrogateescape), which no tokenizer takes: refused, naming it.
    """
    if text is None:
        return
    if not text.strip():
        raise AttnvizError(f"{what} is empty: give some words to attend over")
    for position, char in enumerate(text, start=1):
        if 0xDC80 <= ord(char) <= 0xDCFF:
            byte = ord(char) - 0xDC00
            raise AttnvizError(f"{what} has a byte that is not UTF-8: 0x{byte:02X} at character {position} (give it in UTF-8)")
        if 0xD800 <= ord(char) <= 0xDFFF:
            raise AttnvizError(f"{what} has a lone surrogate U+{ord(char):04X} at character {position}, which is no character")


def refuse_causal_cross_attention(kv_text: str | None, causal: bool, stack: str | None = None) -> None:
    """A causal mask hides a text's later tokens from its earlier ones; across two texts there is no "later"."""
    if kv_text is not None and causal:
        raise AttnvizError(
            f"{option('causal', True)} and {options_named('kv')} do not go together: a causal mask orders one text's tokens, "
            f"and {options_named('kv')} takes the keys from another text"
        )
    if stack == "cross" and causal:  # the decoder's queries over the encoder's tokens: no order between them
        raise AttnvizError(
            f"{option('causal', True)} and {option('stack', 'cross')} do not go together: a causal mask orders one "
            "sequence's tokens, and cross-attention takes the keys from the encoder's"
        )


def refuse_cross_over_every_layer(stack: str | None) -> None:
    """stats and layers run each layer's self-attention over one text; cross-attention needs a source text too."""
    if stack == "cross":
        raise AttnvizError(
            f"{option('stack', 'cross')}: stats and layers measure self-attention ({option('stack', 'encoder')} or "
            f"decoder); for cross-attention use heads with {option('stack', 'cross')}"
        )


MAX_HEAD_SIZE = 1 << 16  # --d-q, --d-out: the single-head tutorial's sizes, far past any model's width
MAX_TRACE_TEXTS = 32  # a trace is read by a person: one padded batch of a few texts


def check_seed_head_sizes(d_q: int | None, d_out: int | None, layout: str | None, weights: str) -> None:
    """--d-q and --d-out build seed 001's single head with its own sizes: the single-head layout, random parameters only."""
    given = " and ".join(flag for flag, value in (("--d-q", d_q), ("--d-out", d_out)) if value is not None)
    if not given:
        return
    for flag, value in (("--d-q", d_q), ("--d-out", d_out)):
        if value is not None and value < 1:
            raise AttnvizError(f"{flag} {value}: a head needs at least 1 feature")
        if value is not None and value > MAX_HEAD_SIZE:
            raise AttnvizError(f"{flag} {value}: at most {MAX_HEAD_SIZE:,} features")
    if layout != "single-head" or weights != "random":
        raise AttnvizError(
            f"{given} {'size' if ' and ' in given else 'sizes'} the single-head tutorial's own W_q, W_k (D to d_q) and W_v (D to d_out), which no model "
            f"has: give them with --layout single-head --weights random"
        )


def check_trace_texts(texts: list[str]) -> None:
    if len(texts) > MAX_TRACE_TEXTS:
        raise AttnvizError(f"a trace takes at most {MAX_TRACE_TEXTS} texts, not {len(texts)}: it is read by a person")

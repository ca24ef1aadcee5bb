"""The options a user gives a run, as one frozen value (RunOptions) that the command line and the API both build.

A new option is declared here once (a field: its type, default and check) and once in
cli/options.py (its flag and help). RunOptions.run_spec turns the options into the run's RunSpec:
the one place where options become settings. The API's functions take RunOptions' fields as
keywords (attnviz.heads(text, layer=2, heads=4)); building the value checks every one of them
with api/arguments.py's checks, which check the functions' other arguments too: a wrong type is
a one-line AttnvizError naming the argument, before any work.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

from attnviz.api.arguments import must_be_bool, must_be_device, must_be_dtype, must_be_int, must_be_one_of, must_be_str, refuse
from attnviz.api.models import MODEL_TYPES, Model
from attnviz.errors import AttnvizError, options_named
from attnviz.spec import MAX_SEED, STACKS, WEIGHTS, RunSpec, check_text, refuse_causal_cross_attention, run_spec


@dataclass(frozen=True)
class RunOptions:
    """What a user gives a run: the command line's options, the API's keywords (docs/python.md).

    model is a hub id, a local folder, "bundled" or an attnviz.load() handle (None: the default
    model); layer the model layer whose parameters and input to use; heads how many heads to split
    the projections into (None: the model's own); weights the layer's parameters, "pretrained" or
    "random" (drawn from seed); kv another text to take keys and values from; causal masks future
    keys; stack picks an encoder-decoder's attention ("encoder", "decoder" or "cross"); device is
    "auto", "cpu" or "cuda"; dtype what the model computes in: "float32", "bfloat16", "float16" or
    "auto" (the checkpoint's own on a GPU, float32 on the CPU; models/loading.resolve_dtype); truncate lets texts longer than the model's positions be cut; words
    shows words, not word pieces; memory is the most megabytes a block of attention may take
    (None: 512 on the CPU, half the GPU's free memory on CUDA; budgets.memory_budget): past it the
    weights are computed a block of queries at a time, and a map past 64 MB (or past memory) goes to
    a temporary .npy, read lazily (a result's save writes it as attention.npy). allow_pickle lets a model whose
    weights are pickle files load (attnviz.load's; unpickling can run code). layer_at_a_time reads a transformers
    family's layers' weights from the files as each layer runs, not held (attnviz.load's; taken anyway past 1 GB of
    weights: models/layer_weights.py). d_q and d_out (trace only) give the
    single-head layout the seed's own sizes. Wrong types and values are refused as the value is built.
    """

    model: Any = None  # str | Path | attnviz.Model | None
    layer: int = 0
    heads: int | None = None
    weights: str = "pretrained"
    seed: int = 0
    kv: str | None = None
    causal: bool = False
    stack: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    truncate: bool = False
    words: bool = False
    memory: int | None = None  # MB
    allow_pickle: bool = False
    layer_at_a_time: bool = False
    d_q: int | None = None  # trace's single-head layout with the seed's own sizes: W_q, W_k map D to d_q
    d_out: int | None = None  # and W_v maps D to d_out (None: D)

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, (str, Path, Model)):
            refuse("model", MODEL_TYPES, self.model)
        object.__setattr__(self, "layer", must_be_int("layer", self.layer))
        object.__setattr__(self, "heads", must_be_int("heads", self.heads, none=True))
        object.__setattr__(self, "seed", must_be_int("seed", self.seed))
        object.__setattr__(self, "memory", must_be_int("memory", self.memory, none=True))
        object.__setattr__(self, "d_q", must_be_int("d_q", self.d_q, none=True))
        object.__setattr__(self, "d_out", must_be_int("d_out", self.d_out, none=True))
        if self.memory is not None and self.memory < 1:
            raise AttnvizError(f"memory {self.memory}: give at least 1 (MB) for a block of attention")
        must_be_one_of("weights", self.weights, WEIGHTS)
        must_be_str("kv", self.kv, none=True)
        must_be_one_of("stack", self.stack, STACKS, none=True)
        must_be_device(self.device)
        must_be_dtype(self.dtype)
        for name in ("causal", "truncate", "words", "allow_pickle", "layer_at_a_time"):
            must_be_bool(name, getattr(self, name))
        if not 0 <= self.seed <= MAX_SEED:
            raise AttnvizError(f"seed {self.seed} is out of range: give 0 to 2**64 - 1")
        check_text(self.kv, f"the {options_named('kv')} text")
        refuse_causal_cross_attention(self.kv, self.causal, self.stack)

    def keywords(self) -> dict[str, Any]:
        """The options given (those not at their defaults), as keywords of the API's functions."""
        return {field.name: getattr(self, field.name) for field in fields(self) if getattr(self, field.name) != field.default}

    def load(self) -> Model:
        """The options' model loaded (attnviz.load: once per process, so a second call gives the same handle)."""
        from attnviz.api.models import load

        return load(self.model, self.device, dtype=self.dtype, allow_pickle=self.allow_pickle, layer_at_a_time=self.layer_at_a_time)

    def run_spec(self, handle, **fixed) -> RunSpec:
        """The run's RunSpec on a loaded model (an attnviz.Model), heads resolved for its stack (None: the model's own).

        fixed are RunSpec's settings that a command sets itself (stats and layers: layer=None; stats: js).
        """
        from attnviz.own_layer import resolve_num_heads

        settings = dict(
            layer=self.layer, weights=self.weights, seed=self.seed, causal=self.causal, kv_text=self.kv, stack=self.stack,
            truncate=self.truncate, words=self.words, memory=self.memory,
        )  # fmt: skip
        spec = run_spec(handle.loaded, handle.name, device=handle.device, num_heads=None, **{**settings, **fixed})
        return replace(spec, num_heads=resolve_num_heads(handle.loaded, self.heads, spec.stack))


OPTION_FIELDS = tuple(field.name for field in fields(RunOptions))
# trace alone: seed 001's single head with its own sizes (the single-head layout, random parameters)
SEED_HEAD_OPTIONS = ("d_q", "d_out")
RUN_OPTIONS = tuple(name for name in OPTION_FIELDS if name not in SEED_HEAD_OPTIONS)
TRACE_OPTIONS = (*RUN_OPTIONS, *SEED_HEAD_OPTIONS)
# stats, layers: every layer's self-attention
EVERY_LAYER_OPTIONS = tuple(name for name in RUN_OPTIONS if name not in ("layer", "kv"))
# diff: every layer's self-attention with each checkpoint's own heads and weights (against="random": seed's)
DIFF_OPTIONS = ("model", "seed", "stack", "device", "dtype", "truncate", "memory", "allow_pickle", "layer_at_a_time")
# generate: a decoder's own heads and weights; layer: the one its figure and JSON show; seed: sample's
GENERATE_OPTIONS = ("model", "layer", "seed", "device", "dtype", "layer_at_a_time")
# roles: every layer's self-attention with the model's own heads and weights
ROLES_OPTIONS = ("model", "stack", "device", "dtype", "truncate", "memory", "allow_pickle", "layer_at_a_time")
# patch: a decoder's own heads and weights (an encoder-decoder's decoder), every layer
PATCH_OPTIONS = ("model", "device", "dtype", "truncate", "allow_pickle", "layer_at_a_time")
# why: a model's own heads and weights at one layer; the head and the cell are the call's own arguments
WHY_OPTIONS = ("model", "layer", "kv", "stack", "device", "dtype", "truncate", "allow_pickle", "layer_at_a_time")
# compose: the weights alone, read in float64 whatever the model computes in; no text
COMPOSE_OPTIONS = ("model", "device", "allow_pickle", "layer_at_a_time")


def run_options(function: str, given: dict[str, Any], taken: tuple[str, ...] = RUN_OPTIONS) -> RunOptions:
    """The RunOptions of an API call's keywords (given); a keyword that the function does not take is refused."""
    for name in given:
        if name not in taken:
            raise AttnvizError(f"attnviz.{function}() takes no argument {name!r}: its options are {', '.join(taken)}")
    return RunOptions(**given)


def takes_options(taken: tuple[str, ...] = RUN_OPTIONS):
    """Give an API function that takes **options the signature it really has: its own arguments, then taken's.

    help(attnviz.heads), a notebook's tooltip and an editor's completion then list layer, heads,
    seed, ... with their defaults, as if the function spelled them out; run_options still checks them.
    """
    defaults = {field.name: field.default for field in fields(RunOptions) if field.default is not MISSING}

    def with_signature(function):
        own = [p for p in inspect.signature(function).parameters.values() if p.kind is not p.VAR_KEYWORD]
        shown = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults[name]) for name in taken]
        function.__signature__ = inspect.Signature([*own, *shown])
        return function

    return with_signature

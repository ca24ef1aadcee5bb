"""Every argument of every public API function refuses a wrong type up front, as a one-line AttnvizError naming it.

A careless caller's heads=12.0, seed="0", layer=1.5, kv=5 or progress=5 is refused before any
model loads, with what the argument takes and what it was given; causal="no" is not taken for
true, nor seed=1.5 recorded. A bool is not an int, a float is not an int, only True and False
are bools.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import attnviz
import attnviz.models.loading
from attnviz.errors import AttnvizError

RUN_OPTIONS = {  # RunOptions' fields, each with wrong values of other types
    "model": [3, 1.5, ["bundled"]],
    "layer": [1.5, "0", True, None],
    "heads": [12.0, "4", True],
    "weights": [5, None, ["pretrained"]],
    "seed": ["0", 1.5, True, None],
    "kv": [5, b"the cat"],
    "causal": ["no", 1, None],
    "stack": [5, True],
    "device": [5, None],
    "dtype": [5, None],
    "truncate": ["yes", 0],
    "words": ["no", 1],
    "memory": ["512", 1.5, True],
    "allow_pickle": ["yes", 1, None],
    "layer_at_a_time": ["yes", 1, None],
}
RUN_OPTIONS_VALID = {"model": "bundled", "layer": 0, "heads": None, "weights": "pretrained", "seed": 0, "kv": "a dog",
                     "causal": False, "stack": None, "device": "cpu", "dtype": "auto", "truncate": False, "words": False, "memory": None,
                     "allow_pickle": False, "layer_at_a_time": False}  # fmt: skip
EVERY_LAYER = {name: values for name, values in RUN_OPTIONS.items() if name not in ("layer", "kv")}
TEXT = [5, None, b"the cat"]
TEXTS = [5, None, [1], ["the cat", 2.0]]

ARGUMENTS = {  # function -> its arguments -> wrong values
    "heads": {"text": TEXTS, **RUN_OPTIONS, "measure": [5, None], "layer_summaries": ["yes", 1], "effect": [5, True, ["zero"]],
              "vectors": ["yes", 1], "report": ["yes", None], "trace": ["yes", None], "head": ["3", 1.5, True], "window": [5, ["0:2,0:2"]], "progress": [5, "print"]},
    "heads_file": {"texts": TEXTS, "folder": [5, None, ["run"]], **RUN_OPTIONS, "format": [5, None], "figures": [5, ["grid"]],
                   "head": ["3", 1.5, True], "save_map": ["yes", 1, None], "html": ["yes", 1, None], "unique": ["no", 0, None],
                   "progress": [5, "print"]},
    "stats_file": {"texts": TEXTS, **EVERY_LAYER, "js": ["yes", 1, None], "chunk_lines": ["5", 1.5, True, None],
                   "checkpoint": [5, ["stats.npz"]], "resume": ["yes", 1, None], "engine": [5, None, ["ray"]],
                   "progress": [5, "print"]},
    "trace": {"text": TEXTS, **RUN_OPTIONS, "layout": [5, ["all"]], "mistake": [5, True], "d_q": ["16", 1.5, True], "d_out": ["8", 1.5, True]},
    "stats": {"texts": TEXTS, **EVERY_LAYER, "js": ["yes", 1, 0.0], "progress": [5, "print"]},
    "layers": {"text": [*TEXT, ["the cat"]], **EVERY_LAYER, "measure": [5, None], "band": ["8", 1.5, True, None], "effect": [5, True, ["zero"]],
               "progress": [5, "print"]},
    "compare": {
        "text": [*TEXT, ["the cat"]],
        "heads": [12, 1.5, [1.5], [True, 4], {1: 4}],
        "weights": [5, None, ["pretrained", 5]],
        **{name: RUN_OPTIONS[name] for name in ("model", "layer", "seed", "device", "dtype", "truncate", "allow_pickle")},
    },
    "position": {
        "text": [*TEXT, ["the cat"]],
        "permutation": [5, 1.5, [0, 1.5]],
        "head": [1.5, "0", True],
        **{name: RUN_OPTIONS[name] for name in ("model", "device", "dtype", "allow_pickle")},
    },
    "report": {"text_or_texts": TEXTS, **RUN_OPTIONS, "progress": [5, "print"]},
    "generate": {
        "prompt": [*TEXT, ["the cat"]],
        "tokens": ["5", 1.5, True, None],
        "sample": ["yes", 1, None],
        "rows": [5, None, ["chosen"]],
        "progress": [5, "print"],
        **{name: RUN_OPTIONS[name] for name in ("model", "layer", "seed", "device", "dtype", "layer_at_a_time")},
    },
    "diff": {
        "text": [*TEXT, ["the cat"]],
        "against": [5, None, ["random"]],
        "progress": [5, "print"],
        **{name: RUN_OPTIONS[name] for name in ("model", "seed", "stack", "device", "dtype", "truncate", "memory", "allow_pickle", "layer_at_a_time")},
    },
    "roles": {
        "text": [*TEXT, ["the cat"]],
        "exclude_bos": ["yes", 1, None],
        "exclude_current": ["no", 0, None],
        "sinks": ["4", 1.5, True, None],
        "recent": ["256", 2.5, False, None],
        "retrieval": ["yes", 1, None],
        "lengths": [1024, [1024.0], [True]],
        "depths": [0.5, ["0.5"], [False]],
        "engine": [5, ["ray"]],
        "progress": [5, "print"],
        **{name: RUN_OPTIONS[name] for name in ("model", "stack", "device", "dtype", "truncate", "memory", "allow_pickle", "layer_at_a_time")},
    },
    "patch": {
        "text": [*TEXT, ["the cat"]],
        "corrupt": [5, None, ["the dog"]],
        "answer": [5, None, [" cat"]],
        "wrong": [5, None, [" dog"]],
        "position": ["3", 1.5, True],
        "per_position": ["yes", 1, None],
        "component": [5, None, ["out"]],
        "edges": ["yes", 1, None],
        "ig": ["3", 1.5, True],
        "checked_edges": ["10", 1.5, True, None],
        "progress": [5, "print"],
        **{name: RUN_OPTIONS[name] for name in ("model", "device", "dtype", "truncate", "allow_pickle", "layer_at_a_time")},
    },
    "compose": {  # no text: the weights alone
        "top": ["5", 1.5, True, None],
        "progress": [5, "print"],
        **{name: RUN_OPTIONS[name] for name in ("model", "device", "allow_pickle", "layer_at_a_time")},
    },
    "load": {"model": RUN_OPTIONS["model"], "device": [5, None], "dtype": [5, None], "allow_pickle": ["yes", 1], "layer_at_a_time": ["yes", 1], "cache": ["no", 0]},
}
FIRST_ARGUMENT = {"heads": "text", "heads_file": "texts", "stats_file": "texts", "trace": "text", "stats": "texts", "layers": "text", "compare": "text",
                  "position": "text", "report": "text_or_texts", "diff": "text", "generate": "prompt", "roles": "text", "patch": "text", "load": "model"}  # fmt: skip
CASES = [
    (function, argument, value)
    for function, arguments in ARGUMENTS.items()
    for argument, values in arguments.items()
    for value in values
]


@pytest.fixture
def no_loading(monkeypatch):
    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))


def call(function: str, **given):
    """The public function with valid arguments (the bundled model on the CPU), but for those given."""
    valid = {"model": "bundled", "device": "cpu"}
    if function in FIRST_ARGUMENT:  # compose takes none
        valid[FIRST_ARGUMENT[function]] = "bundled" if function == "load" else "the cat"
    if function == "diff":
        valid["against"] = "random"
    if function == "patch":
        valid.update(corrupt="the dog", answer=" sat", wrong=" ran")
    if function in ("heads_file", "stats_file"):  # an iterable of texts: a str is a file's path
        valid["texts"] = ["the cat"]
    if function == "heads_file":
        valid["folder"] = "never-written"
    return getattr(attnviz, function)(**{**valid, **given})


@pytest.mark.parametrize("function, argument, value", CASES, ids=[f"{f}-{a}-{v!r}" for f, a, v in CASES])
def test_a_wrong_type_is_refused_before_loading_naming_the_argument_and_what_it_was_given(
    function, argument, value, no_loading
):
    with pytest.raises(AttnvizError) as refused:
        call(function, **{argument: value})
    message = str(refused.value)
    assert "\n" not in message
    named = re.match(rf"{re.escape(argument)}(\[\d+\])? must be (.+), not (\w+) ", message)
    assert named, message  # the argument, what it takes, the type it was given
    given = value[int(named.group(1)[1:-1])] if named.group(1) else value
    assert named.group(3) == type(given).__name__, message


def test_every_argument_of_every_public_function_is_tried():
    """The table above is each function's whole signature: a new argument needs its wrong types here."""
    import inspect

    for function, arguments in ARGUMENTS.items():
        signature = inspect.signature(getattr(attnviz, function)).parameters
        assert set(signature) == set(arguments), (function, set(signature) ^ set(arguments))
        assert not any(parameter.kind == parameter.VAR_KEYWORD for parameter in signature.values()), function


@pytest.mark.parametrize("function", [name for name in ARGUMENTS if name != "load"])
def test_the_signature_shows_exactly_the_run_options_a_function_takes(function, no_loading):
    """help(attnviz.heads) lists layer, heads, ...: each run option it shows is taken, each it leaves out is refused."""
    import inspect

    shown = set(inspect.signature(getattr(attnviz, function)).parameters)
    for option in RUN_OPTIONS:
        if option in ARGUMENTS[function] and option in shown:
            continue
        with pytest.raises(AttnvizError, match=rf"attnviz\.{function}\(\) takes no argument '{option}'"):
            call(function, **{option: RUN_OPTIONS_VALID[option]})


@pytest.mark.parametrize(
    "function, argument",
    [("stats", "layer"), ("stats", "kv"), ("layers", "layer"), ("compare", "causal"), ("position", "seed"),
     ("heads", "figures"), ("report", "measure"), ("heads_file", "measure"), ("stats_file", "layer")],
)  # fmt: skip
def test_an_option_that_a_function_does_not_take_is_refused_by_name(function, argument, no_loading):
    with pytest.raises(AttnvizError, match=rf"attnviz\.{function}\(\) takes no argument '{argument}': its options are"):
        call(function, **{argument: 1})


def test_causal_no_is_not_true_and_a_float_seed_is_not_recorded(no_loading):
    with pytest.raises(AttnvizError, match="causal must be True or False, not str 'no'"):
        attnviz.heads("the cat", causal="no", model="bundled")
    with pytest.raises(AttnvizError, match="seed must be an int, not float 1.5"):
        attnviz.heads("the cat", weights="random", seed=1.5, model="bundled")


def test_numpy_integers_are_ints_and_recorded_as_plain_ints():
    result = attnviz.heads("the cat", model="bundled", device="cpu", layer=np.int64(1), heads=np.int32(4),
                           weights="random", seed=np.uint64(7))  # fmt: skip
    settings = result.spec.to_dict()
    assert (settings["layer"], settings["num_heads"], settings["seed"]) == (1, 4, 7)
    assert all(type(settings[name]) is int for name in ("layer", "num_heads", "seed"))
    json.dumps(settings)  # what attention.json writes

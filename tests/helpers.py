"""Helpers shared by several test modules (no test module imports another; conftest.py holds the fixtures).

Hand-made runs and PNG pixels; the measures written out from a layer's nn.Linear weights; the report's
weights decoded on their own; numbers of two computations compared within what float32 and their rounding allow;
a Python script run in a fresh process from the tests' folder.
"""

from __future__ import annotations

import base64
import math
import subprocess
import sys
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent

# --- hand-made runs and PNG files -----------------------------------------------------------------


def make_run(query_tokens, key_tokens=None, num_heads=2, causal=False, seed=0, attention=None):
    """An AttentionRun of softmax'd random scores, (H, Nq, Nk); causal runs get exact zeros above the diagonal.
    attention: the weights it holds instead (e.g. a memmap of a map on disk)."""
    from attnviz.run_data import AttentionRun

    key_tokens = key_tokens or query_tokens
    weights = attention
    if weights is None:
        rng = np.random.default_rng(seed)
        scores = rng.normal(scale=2.0, size=(num_heads, len(query_tokens), len(key_tokens)))
        if causal:
            scores[:, np.triu(np.ones(scores.shape[1:], dtype=bool), k=1)] = -np.inf
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
    return AttentionRun(
        text="".join(query_tokens),
        model="sentence-transformers/all-MiniLM-L6-v2",
        layer=0,
        weights="pretrained",
        num_heads=num_heads,
        device="cpu",
        query_tokens=list(query_tokens),
        key_tokens=list(key_tokens),
        query_ids=list(range(len(query_tokens))),
        key_ids=list(range(len(key_tokens))),
        attention=weights,
        output=np.zeros((len(query_tokens), 8 * num_heads)),
        causal=causal,
    )


def read_png(path: Path) -> np.ndarray:
    """A PNG file's pixels as (height, width, 3) RGB, read with Pillow (not attnviz's writer)."""
    from PIL import Image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


# --- the measures, written out from the weights (test_measures.py and the tests beside it) -------


def bert_inputs(loaded, text: str):
    """What enters each of BERT's layers for the text alone (no padding), from BERT's own forward pass: (N, D) each."""
    import torch

    from attnviz.models.tokens import encode

    encoded = encode(loaded.tokenizer, [text], loaded.max_positions, False)
    with torch.no_grad():
        states = loaded.model(encoded.input_ids, encoded.attention_mask, encoded.token_type_ids)
    return [state[0].double() for state in states]


def linear(module):
    """An nn.Linear's weight and bias in float64."""
    return module.weight.detach().double(), module.bias.detach().double()


def weights_and_values(bert_layer, x, num_heads: int):
    """α^h (H, N, N) and f^h(x_j) (H, N, D) for every head, written out from the layer's nn.Linear weights.

    α^h = softmax(q^h k^hT / sqrt(d)); f^h(x) = (x W_v^h + b_v^h) W_o^h with W_v^h head h's d output
    features of the value projection and W_o^h the d input features of the output projection it feeds.
    """
    import torch

    (w_q, b_q), (w_k, b_k), (w_v, b_v) = (linear(getattr(bert_layer.attention.self, name)) for name in ("query", "key", "value"))
    w_o, _ = linear(bert_layer.attention.output.dense)  # (D, D): out features x in features
    head_dim = w_q.shape[0] // num_heads
    alphas, values = [], []
    for head in range(num_heads):
        rows = slice(head * head_dim, (head + 1) * head_dim)
        q = x @ w_q[rows].T + b_q[rows]  # (N, d)
        k = x @ w_k[rows].T + b_k[rows]
        v = x @ w_v[rows].T + b_v[rows]
        alphas.append(torch.softmax(q @ k.T / math.sqrt(head_dim), dim=-1))  # (N, N)
        values.append(v @ w_o[:, rows].T)  # (N, D): f^h(x_j) for every key j
    return torch.stack(alphas), torch.stack(values)


def per_head_vectors(bert_layer, x, num_heads: int):
    """α^h_ij f^h(x_j) for every head, query and key: (H, N, N, D)."""
    alpha, values = weights_and_values(bert_layer, x, num_heads)
    return alpha[:, :, :, None] * values[:, None, :, :]


def rerun_with_value_zeroed(layer, queries, keys, key, **options):
    """The layer's output (Nq, D) with key token `key`'s value vector (x_j W_v + b_v, every head) set to zero
    (`key` may be a list of tokens: a word's pieces)."""
    import torch

    def zero_the_value(module, inputs, values):  # values (B, Nk, H_kv * d)
        values = values.clone()
        values[:, key] = 0
        return values

    handle = layer.w_v.register_forward_hook(zero_the_value)
    try:
        with torch.no_grad():
            output, _ = layer(queries, keys, keys, **options)
    finally:
        handle.remove()
    return output[0]


def distances_by_reruns(layer, queries, keys, **options) -> np.ndarray:
    """Cosine distance between each query's output and its output with key j's value zeroed, key by key: (Nq, Nk).
    An output that zeroing leaves all zero (key j carried all of it) is at distance 1 (torch's cosine_similarity)."""
    import torch

    with torch.no_grad():
        original, _ = layer(queries, keys, keys, **options)
    columns = []
    for key in range(keys.shape[1]):
        altered = rerun_with_value_zeroed(layer, queries, keys, key, **options)
        cosine = torch.nn.functional.cosine_similarity(original[0].double(), altered.double(), dim=-1)  # 0 for a zero vector
        columns.append(1 - cosine)
    return torch.stack(columns, dim=-1).numpy()


def flows_by_networkx(layer_attention: list[np.ndarray]) -> np.ndarray:
    """networkx's maximum flow from each last-layer token to each input token on the layers' graph built here."""
    import networkx as nx

    num_tokens = layer_attention[0].shape[-1]
    graph = nx.DiGraph()
    for depth, attention in enumerate(layer_attention):
        mixed = attention.astype(np.float64).mean(axis=0) + np.eye(num_tokens)  # heads averaged, the residual added
        mixed = mixed / mixed.sum(axis=1, keepdims=True)
        for i in range(num_tokens):
            for j in range(num_tokens):
                graph.add_edge((depth + 1, i), (depth, j), capacity=float(mixed[i, j]))
    top = len(layer_attention)
    return np.array(
        [[nx.maximum_flow_value(graph, (top, i), (0, j)) for j in range(num_tokens)] for i in range(num_tokens)]
    )


# --- the report ------------------------------------------------------------------------------------

# A text that tries to close the page's script, run its own and pass for the template's script marker.
HOSTILE = "</script><script>document.title='x'</script><img src=x onerror=alert(1)><!--attnviz:script-->"


def decoded(encoded: dict) -> np.ndarray:
    """An exact ENCODED array: little-endian uint16 codes in units of 1e-4, or float32 values (the neuron view's
    vectors), zlib-compressed, base64 (decoded here, not with attnviz.html's decoder)."""
    raw = zlib.decompress(base64.b64decode(encoded["data"]))
    if encoded["dtype"] == "float32":
        return np.frombuffer(raw, dtype="<f4").reshape(encoded["shape"]).astype(np.float64)
    assert encoded["dtype"] == "uint16" and encoded["unit"] == 0.0001
    return np.frombuffer(raw, dtype="<u2").reshape(encoded["shape"]) * 1e-4


# --- one number from two computations -------------------------------------------------------------
#
# Two float32 computations of one number (two runs, two code paths, another CPU's kernels or thread count) differ by
# a few ulps, and that can carry a value across the half-unit where rounding to d decimals turns: 20 of 4,992 q values
# of two runs differed by 0.0001 on a 2-core Xeon. So two computations are compared within one unit of the last
# decimal kept (half a unit for each side rounded) and a few float32 ulps of the magnitude, never for equality after
# rounding; the same float written twice (one computation) stays compared exactly.

ULPS = 8  # float32 ulps of the numbers' magnitude that two computations' sums may differ by


def rounding_tolerance(magnitude: float, decimals: int, rounded: int = 2, ulps: int = ULPS) -> float:
    """|a - b| that two computations of numbers of this magnitude may show, `rounded` (1 or 2) of them rounded to
    `decimals`. The magnitude is the largest of the numbers computed together (an array's): a sum's rounding error
    is a few ulps of its largest terms, not of its result, which may be near 0."""
    slack = ulps * float(np.spacing(np.float32(magnitude)))
    return rounded * 0.5 * 10.0**-decimals * (1 + 1e-9) + slack  # 1e-9: the decimal's own float64 error


def assert_close_after_rounding(actual, expected, decimals: int, rounded: int = 2, ulps: int = ULPS, magnitude: float | None = None) -> None:
    """Two computations of the same numbers (an array) agree as far as float32 and the rounding to `decimals` allow:
    |a - b| <= rounded × half a unit of the last decimal + ulps float32 ulps of the magnitude (of the numbers
    computed together: by default the largest given)."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert (np.isnan(actual) == np.isnan(expected)).all()
    off = np.abs(np.nan_to_num(actual) - np.nan_to_num(expected))
    if magnitude is None:
        magnitude = max(np.abs(np.nan_to_num(actual)).max(initial=0), np.abs(np.nan_to_num(expected)).max(initial=0))
    tolerance = rounding_tolerance(magnitude, decimals, rounded, ulps)
    assert off.max(initial=0) <= tolerance, f"{int((off > tolerance).sum())} of {off.size} differ by more than {tolerance:.3g}: {off.max()}"


def assert_shows(text: str, value: float, decimals: int, magnitude: float | None = None) -> None:
    """The text (a terminal's, a figure title's) shows a number of `decimals` decimals that is another computation's
    `value` within what float32 and the rounding allow."""
    import re

    shown = [float(number) for number in re.findall(rf"[-+]?\d+\.\d{{{decimals}}}(?!\d)", text)]
    tolerance = rounding_tolerance(abs(value) if magnitude is None else magnitude, decimals, rounded=1)
    assert any(abs(number - value) <= tolerance for number in shown), (value, shown)


def written_decimals(number: float) -> int:
    """The decimals a number written to a JSON record shows (1e-05: 5, 0.5: 1)."""
    from decimal import Decimal

    return max(0, -Decimal(repr(float(number))).as_tuple().exponent)


def record_numbers(record, path: str = "") -> dict[str, list]:
    """Every number of a JSON record by its key path, list indices left out: {"attention[]": [...], ...}."""
    found: dict[str, list] = {}
    if isinstance(record, dict):
        for key, value in record.items():
            for name, numbers in record_numbers(value, f"{path}.{key}").items():
                found.setdefault(name, []).extend(numbers)
    elif isinstance(record, list):
        for value in record:
            for name, numbers in record_numbers(value, f"{path}[]").items():
                found.setdefault(name, []).extend(numbers)
    elif isinstance(record, float):
        found[path] = [record]
    return found


def assert_records_match(actual, expected) -> None:
    """Two runs' JSON records (attention.json's, the report's, ...) hold the same keys, strings and integers, and
    numbers within what float32 and their rounding allow; an encoded array's codes (the report's uint16 in units of
    1e-4, uint8 log levels) each within one step. A field's decimals are the most any of its numbers shows (of two
    numbers one unit of the last decimal apart, one shows them all; a field of one number: the record's most), its
    magnitude its largest number."""
    numbers = record_numbers([actual, expected])
    finest = max((written_decimals(number) for each in numbers.values() for number in each), default=0)
    tolerances = {
        path: rounding_tolerance(max(map(abs, each)), max(map(written_decimals, each)) if len(each) > 2 else finest)
        for path, each in numbers.items()
    }
    _match(actual, expected, "", tolerances)


def _match(actual, expected, path: str, tolerances: dict) -> None:
    if isinstance(expected, dict) and {"dtype", "data", "shape"} <= set(expected):
        assert isinstance(actual, dict) and {k: v for k, v in actual.items() if k != "data"} == {k: v for k, v in expected.items() if k != "data"}, path
        codes = [np.frombuffer(zlib.decompress(base64.b64decode(each["data"])), dtype="<u2" if each["dtype"] == "uint16" else np.uint8) for each in (actual, expected)]
        assert np.abs(codes[0].astype(np.int64) - codes[1].astype(np.int64)).max(initial=0) <= 1, path
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and list(actual) == list(expected), (path, list(actual) if isinstance(actual, dict) else actual)
        for key in expected:
            _match(actual[key], expected[key], f"{path}.{key}", tolerances)
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for each, other in zip(actual, expected):
            _match(each, other, f"{path}[]", tolerances)
    elif isinstance(expected, float) and isinstance(actual, float):
        assert actual == expected or abs(actual - expected) <= tolerances[f"[]{path}"], (path, actual, expected)
    else:
        assert actual == expected and type(actual) is type(expected), (path, actual, expected)


# --- a fresh process --------------------------------------------------------------------------------


def run_script(script: str, env: dict | None = None) -> list[str]:
    """The lines a Python script prints, run in a fresh interpreter from the tests' folder (so it can import
    helpers); fails the test when the script fails."""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, cwd=TESTS
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


# --- figures ----------------------------------------------------------------------------------------


def merge_figure_run(tokens: list[str], num_heads: int):
    """What the --mistake merge figure reads of an AttentionRun (a BERT run over these tokens): its tokens and
    what its title names, without running a layer over thousands of tokens."""
    from types import SimpleNamespace

    return SimpleNamespace(
        query_tokens=tokens, text=" ".join(tokens[1:-1]), kv_text=None, model="bundled", layer=0, causal=False,
        weights="pretrained", family="BERT", stack=None, num_heads=num_heads, num_kv_heads=None, model_causal=False,
        words=None, tokenizer_tokens=(tokens, tokens), shown_tokenizer_tokens=(tokens, tokens), fallback_for=None,
        unknown=None, kv_unknown=None, re_split=False, quantisation=None,
    )  # fmt: skip


def layers_grid_panels(figure, num_layers: int, num_heads: int) -> tuple[np.ndarray, dict, int, int]:
    """layers.png's one image as the figure draws it (RGBA); its panels {(layer, head): (cells, cells, 4)};
    a panel's size in cells; the step from one panel to the next (cells and the gap). The gap follows
    from the image's size alone (num_heads != num_layers): width = num_heads * step - gap and
    height = num_layers * step - gap."""
    (mosaic,) = [image.get_array() for image in figure.axes[0].images]
    height, width = mosaic.shape[:2]
    step = (width - height) // (num_heads - num_layers)
    gap = num_heads * step - width
    assert num_layers * step - gap == height and 0 < gap < step
    cells = step - gap
    panels = {
        (layer, head): mosaic[layer * step : layer * step + cells, head * step : head * step + cells]
        for layer in range(num_layers)
        for head in range(num_heads)
    }
    return mosaic, panels, cells, step


@contextmanager
def serving(handles: dict, **settings):
    """A server of handles (name -> attnviz.Model) on a free port of 127.0.0.1, serving in a thread while the block
    runs; settings: ServeSettings' (max_tokens=8, waiting=0, host="0.0.0.0")."""
    import threading

    from attnviz.serve.explorer import Explorer, ServeSettings
    from attnviz.serve.http import ExplorerServer

    chosen = ServeSettings(port=0, **settings)
    server = ExplorerServer(chosen)
    server.explorer = Explorer(handles, chosen)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- how often a command runs the model ----------------------------------------------------------


@contextmanager
def model_runs():
    """A Counter of the torch modules called from outside any other module while inside, by class name: each is one run
    of that module (the model's forward: its top module's name; a pass that stops early counts too). Read by
    tests/test_model_runs.py."""
    from collections import Counter

    import torch

    runs, depth = Counter(), [0]

    def entering(module, args):
        if depth[0] == 0:
            runs[type(module).__name__] += 1
        depth[0] += 1

    def leaving(module, args, output):
        depth[0] -= 1

    hooks = torch.nn.modules.module
    with hooks.register_module_forward_pre_hook(entering), hooks.register_module_forward_hook(leaving, always_call=True):
        yield runs


def save_reference_checkpoint(model, tokenizer_folder: Path, folder: Path) -> None:
    """transformers' model loaded from a GGUF file (its own loader, float32), saved into folder as an ordinary
    checkpoint (config.json, model.safetensors, the tokenizer's files of tokenizer_folder): the tests' and the benches'
    reference of SmolLM2 (bench/smollm2_reference.py imports it)."""
    import copy
    import shutil

    from safetensors.torch import save_file

    tensors = model.state_dict()
    del tensors["lm_head.weight"]  # tied to the embeddings: safetensors keeps one name of a shared tensor
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, folder / "model.safetensors")
    config = copy.deepcopy(model.config)
    del config.quantization_config  # transformers will not save_pretrained a model it loaded from GGUF
    config.save_pretrained(folder)
    for path in tokenizer_folder.iterdir():
        shutil.copy(path, folder / path.name)

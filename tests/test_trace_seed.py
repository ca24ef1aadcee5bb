"""The last seed row: seed 001's single head with its own sizes (`attnviz trace --layout single-head --weights random
--d-q 16 --d-out 8`), checked against the seed's own class loaded with the same weights.

The seed's class is written out below as the tutorial's code does it (one unbatched (m, d_in) sequence, W_q and
W_k: d_in to d_q, W_v: d_in to d_out, no bias, scale 1/sqrt(d_q), no W_o, C = A V returned): a reference that
shares no line with attnviz's layout.
"""

from __future__ import annotations

import json
from math import sqrt

import pytest
import torch
from torch import nn

import attnviz
from attnviz.cli import run
from attnviz.output.runs import MANIFEST
from attnviz.tracing import SeedHead

TEXT = "the cat sat on the mat"


class Self_attention(nn.Module):  # noqa: N801: the seed's own name
    """Seed 001's single-head self-attention layer, as its code computes it."""

    def __init__(self, d_in, d_q, d_out):
        super().__init__()
        self.din, self.dq, self.dout = d_in, d_q, d_out
        self.Wq = nn.Linear(self.din, self.dq, bias=False)
        self.Wk = nn.Linear(self.din, self.dq, bias=False)
        self.Wv = nn.Linear(self.din, self.dout, bias=False)
        self._norm_fact = 1 / sqrt(self.dq)
        self.A = None  # kept for the test: the seed computes A and returns C

    def forward(self, x):
        m, din = x.shape
        assert din == self.din
        Q = self.Wq(x)  # m x d_q
        K = self.Wk(x)  # m x d_q
        V = self.Wv(x)  # m x d_out
        self.A = torch.softmax(torch.matmul(Q, K.T) * self._norm_fact, dim=-1)  # m x m
        return torch.matmul(self.A, V)  # m x d_out


def seed_reference(head: SeedHead) -> Self_attention:
    """The seed's class holding the same W_q, W_k, W_v as attnviz's SeedHead."""
    d_in, d_q, d_out = head.w_q.in_features, head.w_q.out_features, head.w_v.out_features
    reference = Self_attention(d_in, d_q, d_out)
    with torch.no_grad():
        for theirs, ours in ((reference.Wq, head.w_q), (reference.Wk, head.w_k), (reference.Wv, head.w_v)):
            theirs.weight.copy_(ours.weight)
    return reference


@pytest.fixture(scope="module")
def traced():
    return attnviz.trace(TEXT, model="bundled", layout="single-head", weights="random", d_q=16, d_out=8, seed=5)


def test_the_trace_computes_what_the_seeds_class_computes_with_the_same_weights(traced):
    [layout] = traced.trace.layouts
    x = layout.tensors["x"]  # (m, D): the text's hidden states entering the layer, one unbatched sequence
    reference = seed_reference(SeedHead(384, 16, 8, seed=5))
    with torch.inference_mode():
        C = reference(x)
    torch.testing.assert_close(layout.tensors["z"], C, atol=1e-6, rtol=0)  # C: the output, no W_o
    torch.testing.assert_close(layout.tensors["pattern"], reference.A, atol=1e-6, rtol=0)
    torch.testing.assert_close(layout.output[0], C, atol=1e-6, rtol=0)
    [check] = traced.trace.checks
    assert check.agree and check.reference == "F.scaled_dot_product_attention, 1 head"


def test_the_steps_have_the_seeds_shapes_and_its_spelling(traced):
    [layout] = traced.trace.layouts
    m = len(traced.tokens)
    shapes = {step.role: (step.output_shape, step.output_axes, step.operation) for step in layout.steps}
    assert shapes["q"] == ([m, 16], ["N", "d_q"], "self.Wq(x)") and shapes["k"] == ([m, 16], ["N", "d_q"], "self.Wk(x)")
    assert shapes["v"] == ([m, 8], ["N", "d_out"], "self.Wv(x)")
    assert shapes["scores"][0] == [m, m] and shapes["scores"][2] == "torch.matmul(Q, K.T) * self._norm_fact"
    assert shapes["pattern"][0] == [m, m] and shapes["z"] == ([m, 8], ["N", "d_out"], "torch.matmul(A, V)")
    assert "out" not in shapes  # no W_o
    assert traced.trace.head_slices == [] and traced.runs[0].attention.shape == (1, m, m)


def test_the_seed_head_is_drawn_from_its_seed_on_the_cpu():
    first, again, other = SeedHead(32, 4, 2, seed=1), SeedHead(32, 4, 2, seed=1), SeedHead(32, 4, 2, seed=2)
    assert torch.equal(first.w_q.weight, again.w_q.weight) and torch.equal(first.w_v.weight, again.w_v.weight)
    assert not torch.equal(first.w_q.weight, other.w_q.weight)
    assert (first.w_q.weight.shape, first.w_k.weight.shape, first.w_v.weight.shape) == ((4, 32), (4, 32), (2, 32))
    assert first.w_q.bias is None and first.w_o is None and first.scale == 1 / sqrt(4)


def test_the_command_writes_the_seeds_shapes_into_trace_json_and_draws_its_map(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["trace", TEXT, "--model", "bundled", "--layout", "single-head", "--weights", "random", "--seed", "5"]
    assert run([*args, "--d-q", "16", "--d-out", "8", "--out", str(out)]) == 0
    assert sorted(path.name for path in out.iterdir()) == sorted([MANIFEST, "trace.json", "trace.md", "head_00.png"])
    record = json.loads((out / "trace.json").read_text(encoding="utf-8"))
    assert (record["num_heads"], record["head_dim"], record["d_q"], record["d_out"], record["scale"]) == (1, 16, 16, 8, 0.25)
    steps = {step["role"]: step for step in record["layouts"][0]["steps"]}
    m = record["layouts"][0]["steps"][0]["output_shape"][0]
    assert [steps[role]["output_shape"] for role in ("q", "k", "pattern", "v", "z")] == [[m, 16], [m, 16], [m, m], [m, 8], [m, 8]]
    assert all(check["agree"] for check in record["checks"])
    shown = capsys.readouterr().out
    assert "d_q = 16" in shown and "d_out = 8" in shown and "1 × d=16" in shown


@pytest.mark.parametrize(
    "given",
    [
        ["--d-q", "16"],  # the default layout
        ["--layout", "view-permute", "--weights", "random", "--d-out", "8"],
        ["--layout", "single-head", "--d-q", "16"],  # pretrained weights
        ["--layout", "all", "--weights", "random", "--d-q", "16", "--d-out", "8"],
    ],
)
def test_the_sizes_are_refused_in_one_line_before_loading_with_another_layout_or_pretrained_weights(given, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["trace", TEXT, "--model", str(tmp_path / "no-such-model"), *given, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --d-") and "--layout single-head --weights random" in error
    assert error.count("\n") == 1 and "no-such-model" not in error  # refused before the model is looked for
    assert not out.exists()


def test_the_api_refuses_the_sizes_the_same_way_and_other_functions_do_not_take_them():
    with pytest.raises(attnviz.AttnvizError, match="--layout single-head --weights random"):
        attnviz.trace(TEXT, model="no-such-model", layout="single-head", d_q=16)
    with pytest.raises(attnviz.AttnvizError, match=r"attnviz\.heads\(\) takes no argument 'd_q'"):
        attnviz.heads(TEXT, model="no-such-model", d_q=16)

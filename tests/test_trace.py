"""Shape traces: recorded from the real tensors, every layout the same computation, mistakes caught.

Expectations are computed here with other code than attnviz/tracing/ uses (F.linear, unflatten,
transpose, einsum, the weight rows of nn.Linear, forward hooks), on the bundled
all-MiniLM-L6-v2 (D = 384, 12 heads of d = 32).
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from rich.cells import cell_len
from rich.console import Console

from attnviz.attention.layer import MultiHeadAttention
from attnviz.cli import Layout, Mistake, run
from attnviz.errors import AttnvizError
from attnviz.models.tokens import encode
from attnviz.output.runs import MANIFEST
from attnviz.layer_inputs import layer_input
from attnviz.own_layer import build_layer
from attnviz.tracing import (
    LAYOUTS,
    MISTAKES,
    LayerInputs,
    merge_provenance,
    trace_layout,
    trace_layouts,
    trace_texts,
)
from attnviz.output.trace_files import (
    CHECK_KEYS,
    HEAD_SLICE_KEYS,
    LAYOUT_KEYS,
    MISTAKE_KEYS,
    STEP_KEYS,
    TRACE_KEYS,
    trace_markdown,
    trace_record,
)
from attnviz.render.trace_tables import print_trace
from attnviz.spec import run_spec

import attnviz.tracing as trace_module  # the trace stage; attnviz.trace is the API's function

TOLERANCE = 1e-5
CHINESE = "我想吃酸菜鱼"
SHORT = "The cat sat on the mat."
LONG = "The animal didn't cross the street because it was too tired."
OTHER = "A dog barked at the mailman."
FORMATS_DOC = Path(__file__).resolve().parents[1] / "docs" / "formats.md"


@pytest.fixture(scope="module")
def bert(bundled_bert):
    return bundled_bert  # conftest's: the bundled model, loaded once for the whole session


def hidden(bert, texts, layer=0):
    """BERT layer `layer`'s input for a padded batch, and its valid lengths."""
    encoded = encode(bert.tokenizer, texts, bert.max_positions)
    return layer_input(bert, encoded, layer, "cpu"), encoded.valid_lens


def random_layer_with_large_weights(seed=0, model_size=384, num_heads=12):
    """Random weights large enough that the patterns are far from uniform and a wrong split shows."""
    torch.manual_seed(seed)
    layer = MultiHeadAttention(model_size, num_heads).eval()
    with torch.no_grad():
        for linear in (layer.w_q, layer.w_k, layer.w_v, layer.w_o):
            linear.weight.normal_(0, 0.1)
            linear.bias.normal_(0, 0.1)
    return layer


def one_head_copy(layer: MultiHeadAttention) -> MultiHeadAttention:
    """The same projections split into a single head, as MultiHeadAttention itself."""
    single = MultiHeadAttention(layer.w_q.out_features, 1).eval()
    single.load_state_dict(layer.state_dict())
    return single


def recompute_default_layout(layer, inputs: LayerInputs, num_heads: int) -> dict[str, torch.Tensor]:
    """The view-permute steps by role, written with other code than the trace's."""
    x, x_kv = inputs.queries, inputs.keys_values
    batch, num_queries, model_size = x.shape
    num_keys, head_dim = x_kv.shape[1], model_size // num_heads
    steps = {"x": x, "x_kv": x_kv}
    for name, linear, source in (("q", layer.w_q, x), ("k", layer.w_k, x_kv), ("v", layer.w_v, x_kv)):
        steps[name] = F.linear(source, linear.weight, linear.bias)  # (B, N, D)
        steps[f"{name}_view"] = steps[name].unflatten(-1, (num_heads, head_dim))  # (B, N, H, d)
        steps[f"{name}_heads"] = steps[f"{name}_view"].transpose(1, 2)  # (B, H, N, d)
    steps["k_t"] = steps["k_heads"].transpose(2, 3)  # (B, H, d, Nk)
    steps["scores"] = torch.einsum("bhqd,bhkd->bhqk", steps["q_heads"], steps["k_heads"]) / math.sqrt(head_dim)
    allowed = torch.ones(batch, 1, num_queries, num_keys, dtype=torch.bool)
    if inputs.valid_lens is not None:
        allowed &= (torch.arange(num_keys)[None, :] < inputs.valid_lens[:, None])[:, None, None, :]
    if inputs.causal:
        allowed &= torch.ones(num_queries, num_keys, dtype=torch.bool).tril()
    steps["masked_scores"] = torch.where(allowed, steps["scores"], torch.tensor(float("-inf")))
    steps["pattern"] = torch.softmax(steps["masked_scores"], dim=-1)
    steps["z"] = torch.einsum("bhqk,bhkd->bhqd", steps["pattern"], steps["v_heads"])
    steps["z_permuted"] = steps["z"].transpose(1, 2)  # (B, Nq, H, d)
    steps["z_contiguous"] = steps["z_permuted"].clone(memory_format=torch.contiguous_format)
    steps["z_merged"] = steps["z_contiguous"].flatten(2)  # (B, Nq, D)
    steps["out"] = F.linear(steps["z_merged"], layer.w_o.weight, layer.w_o.bias)
    return steps


# Roles whose strides depend only on the rearrangement, not on how a kernel lays out its result.
REARRANGEMENTS = ("x", "q_view", "q_heads", "k_view", "k_heads", "v_view", "v_heads", "k_t", "z_permuted", "z_contiguous", "z_merged")


def assert_steps_match(steps: list[dict], expected: dict[str, torch.Tensor]) -> None:
    checked = set()
    for step in steps:
        if step["role"] not in expected:
            continue
        tensor = expected[step["role"]]
        assert step["output_shape"] == list(tensor.shape), step["role"]
        assert len(step["output_axes"]) == tensor.dim(), step["role"]
        if step["role"] in REARRANGEMENTS:
            assert step["stride"] == list(tensor.stride()), step["role"]
            assert step["contiguous"] == tensor.is_contiguous(), step["role"]
        checked.add(step["role"])
    assert {"x", "q", "q_view", "q_heads", "k_t", "scores", "pattern", "z", "z_permuted", "z_merged", "out"} <= checked


# ---- the recorded shapes are the real ones ----


def test_recorded_shapes_are_the_tensors_that_the_linear_layers_see(bert):
    x, _ = hidden(bert, [CHINESE])
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    seen = {}

    def remember(name):
        def hook(module, args, output):  # returns None: the output stays as it is
            seen[name] = (list(args[0].shape), list(output.shape))

        return hook

    hooks = [
        linear.register_forward_hook(remember(name))
        for name, linear in (("w_q", layer.w_q), ("w_k", layer.w_k), ("w_v", layer.w_v), ("w_o", layer.w_o))
    ]
    try:
        traced = trace_layout("view-permute", layer, LayerInputs(x, x), 12)
    finally:
        for hook in hooks:
            hook.remove()

    assert traced.step("x").output_shape == seen["w_q"][0] == [1, 8, 384]
    for role, name in (("q", "w_q"), ("k", "w_k"), ("v", "w_v")):
        assert traced.step(role).output_shape == seen[name][1]
    assert traced.step("z_merged").output_shape == seen["w_o"][0]
    assert traced.step("out").output_shape == seen["w_o"][1] == [1, 8, 384]
    assert traced.step("pattern").output_shape == [1, 12, 8, 8]
    assert traced.step("q_heads").output_axes == ["B", "H", "N", "d"]
    assert traced.step("q_view").pattern == "b n (h d) -> b n h d"


@pytest.mark.parametrize("case", ["self", "self, padded and causal", "cross, padded"])
def test_every_recorded_step_has_the_shape_stride_and_values_of_a_recomputation(bert, case):
    queries, valid_lens = hidden(bert, [SHORT, LONG])
    keys, key_lens = hidden(bert, [OTHER, SHORT]) if case.startswith("cross") else (queries, valid_lens)
    inputs = LayerInputs(
        queries, keys, valid_lens=key_lens if "padded" in case else None, causal="causal" in case
    )
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    traced = trace_layout("view-permute", layer, inputs, 12)
    with torch.inference_mode():
        expected = recompute_default_layout(layer, inputs, 12)

    assert_steps_match([vars(step) for step in traced.steps], expected)
    for role in ("q_heads", "pattern", "z_merged", "out"):
        torch.testing.assert_close(traced.tensors[role], expected[role], atol=TOLERANCE, rtol=0)
    if inputs.valid_lens is not None:
        mask = traced.step("mask")
        assert mask.output_shape == [2, 1, queries.shape[1] if inputs.causal else 1, keys.shape[1]]
        assert mask.output_axes[:2] == ["B", "1"]
        assert "broadcasts over H" in traced.step("masked_scores").note


def test_a_wrong_axis_name_is_refused_when_recorded():
    recorder = trace_module.Recorder({"B": 1, "Nq": 4, "Nk": 4, "H": 2, "d": 3, "D": 6}, self_attention=True)
    recorder("x", torch.zeros(1, 4, 6), "x", "B Nq D")
    with pytest.raises(RuntimeError, match="has shape"):
        recorder("q_view", torch.zeros(1, 4, 2, 3), "x.view(B, N, H, d)", "B H Nq d")


# ---- every layout is the same computation ----

AGREEMENT_CASES = {
    # name: (queries, keys or None for self-attention, pad the keys, causal)
    "self": ([LONG], None, False, False),
    "self, padded": ([SHORT, LONG], None, True, False),
    "self, causal": ([LONG], None, False, True),
    "self, padded and causal": ([LONG, SHORT], None, True, True),
    "cross": ([SHORT], [OTHER], False, False),
    "cross, padded": ([SHORT, LONG], [OTHER, LONG], True, False),
}


@pytest.mark.parametrize("weights", ["pretrained", "random"])
@pytest.mark.parametrize("case", AGREEMENT_CASES)
def test_all_layouts_give_multihead_attentions_weights_and_output(bert, weights, case):
    query_texts, key_texts, padded, causal = AGREEMENT_CASES[case]
    queries, query_lens = hidden(bert, query_texts, layer=1)
    keys, key_lens = (queries, query_lens) if key_texts is None else hidden(bert, key_texts, layer=1)
    if padded:
        assert key_lens.min() < keys.shape[1]  # some keys really are padding
    inputs = LayerInputs(queries, keys, valid_lens=key_lens if padded else None, causal=causal)
    if weights == "pretrained":
        layer = build_layer(bert, run_spec(bert, layer=1, num_heads=12))
    else:
        layer = random_layer_with_large_weights(seed=3)

    traces, checks, _, _, notes = trace_layouts(layer, inputs, list(LAYOUTS))

    expected_layouts = [name for name in LAYOUTS if key_texts is None or name != "fused-qkv"]
    assert [traced.layout for traced in traces] == expected_layouts
    assert all(check.agree for check in checks) and len(checks) == len(expected_layouts) + 1
    assert [check.layout for check in checks] == ["MultiHeadAttention", *expected_layouts]  # attnviz's layer too
    assert bool(notes) == (key_texts is not None)  # fused-qkv is left out of cross-attention, with a note
    with torch.inference_mode():
        reference = {12: layer(queries, keys, keys, valid_lens=inputs.valid_lens, causal=causal)}
        reference[1] = one_head_copy(layer)(queries, keys, keys, valid_lens=inputs.valid_lens, causal=causal)
    for traced in traces:
        expected_output, expected_weights = reference[traced.num_heads]
        torch.testing.assert_close(traced.weights, expected_weights, atol=TOLERANCE, rtol=0, msg=traced.layout)
        torch.testing.assert_close(traced.output, expected_output, atol=TOLERANCE, rtol=0, msg=traced.layout)


def test_fused_qkv_weight_is_wq_wk_wv_stacked_and_refuses_cross_attention(bert):
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    c_attn = trace_module.fused_projection(layer)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 384, generator=generator)
    q, k, v = c_attn(x).split(384, dim=2)
    torch.testing.assert_close(q, layer.w_q(x), atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(k, layer.w_k(x), atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(v, layer.w_v(x), atol=TOLERANCE, rtol=0)
    with pytest.raises(AttnvizError, match="fused-qkv is self-attention only"):
        trace_layout("fused-qkv", layer, LayerInputs(x, torch.randn(2, 3, 384, generator=generator)), 12)


def test_the_padding_path_is_traced_in_every_layout(bert):
    queries, valid_lens = hidden(bert, [SHORT, LONG])
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    traces, *_ = trace_layouts(layer, LayerInputs(queries, queries, valid_lens=valid_lens), list(LAYOUTS))
    batch, num_tokens = queries.shape[:2]
    by_layout = {traced.layout: {step.role: step for step in traced.steps} for traced in traces}

    assert by_layout["view-permute"]["mask"].output_shape == [batch, 1, 1, num_tokens]  # broadcast over H and N
    merged = by_layout["merged-batch"]
    assert merged["valid_lens"].output_shape == [batch]
    assert merged["valid_lens_heads"].output_shape == [batch * 12]  # repeat_interleave per head
    assert merged["valid_lens_rows"].output_shape == [batch * 12 * num_tokens]
    assert merged["mask"].output_shape == [batch * 12 * num_tokens, num_tokens]
    assert merged["q_heads"].output_axes == ["B*H", "N", "d"]
    assert by_layout["fused-qkv"]["padding_mask"].output_shape == [batch, 1, 1, num_tokens]
    # single-head cuts the shortest text's padding keys off instead of masking them
    shortest = int(valid_lens.min())
    assert by_layout["single-head"]["x_kv"].output_shape == [shortest, 384]
    assert by_layout["single-head"]["pattern"].output_shape == [num_tokens, shortest]


# ---- heads and their slices of the weights ----


@pytest.mark.parametrize("weights", ["pretrained", "random"])
def test_head_h_scores_come_from_its_rows_of_the_linear_weights_alone(bert, weights):
    x, _ = hidden(bert, [LONG])
    layer = build_layer(bert, run_spec(bert, num_heads=12)) if weights == "pretrained" else random_layer_with_large_weights()
    traces, _, slices, _, _ = trace_layouts(layer, LayerInputs(x, x), ["view-permute"])
    scores = traces[0].tensors["scores"]  # (1, H, N, N)
    d = 32

    assert [(s.head, s.start, s.stop) for s in slices] == [(h, h * d, (h + 1) * d) for h in range(12)]
    assert all(s.agree for s in slices)
    with torch.inference_mode():
        for head in range(12):
            rows = slice(head * d, (head + 1) * d)  # nn.Linear weight is (out, in): head h's outputs are rows
            q = F.linear(x, layer.w_q.weight[rows], layer.w_q.bias[rows])  # (1, N, d)
            k = F.linear(x, layer.w_k.weight[rows], layer.w_k.bias[rows])
            expected = q @ k.transpose(-2, -1) / math.sqrt(d)  # (1, N, N)
            scale = max(1.0, float(expected.abs().max()))
            torch.testing.assert_close(scores[:, head], expected, atol=TOLERANCE * scale, rtol=0)
            # the next head's rows give other scores: the check would catch a wrong slice
            other = slice(((head + 1) % 12) * d, ((head + 1) % 12 + 1) * d)
            wrong = F.linear(x, layer.w_q.weight[other], layer.w_q.bias[other]) @ k.transpose(-2, -1) / math.sqrt(d)
            assert float((wrong - scores[:, head]).abs().max()) > 100 * TOLERANCE * scale


# ---- mistakes ----


def test_view_without_permute_gives_other_weights_and_marks_the_split(bert):
    x, _ = hidden(bert, [LONG])
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    traces, _, _, mistake, _ = trace_layouts(layer, LayerInputs(x, x), ["view-permute"], "view-without-permute")
    right, wrong = traces
    batch, num_tokens, model_size = x.shape

    assert wrong.mistake == "view-without-permute" and mistake.wrong_steps == ["q_heads", "k_heads", "v_heads"]
    marked = [step for step in wrong.steps if step.mistake]
    assert [step.operation for step in marked] == ["q.view(B, H, N, d)", "k.view(B, H, N, d)", "v.view(B, H, N, d)"]
    assert all("mistake" in step.note and "permute" in step.note for step in marked)
    assert not any(step.mistake for step in right.steps)
    with torch.inference_mode():  # what the mistake computes: heads cut from memory in token-major order
        q = layer.w_q(x).reshape(batch, 12, num_tokens, 32)
        k = layer.w_k(x).reshape(batch, 12, num_tokens, 32)
        expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(32), dim=-1)
    torch.testing.assert_close(wrong.weights, expected, atol=TOLERANCE, rtol=0)
    assert mistake.weights_diff > 0.1 and mistake.output_diff > 0.1
    assert mistake.weights_diff == pytest.approx(float((wrong.weights - right.weights).abs().max()))


def test_merge_without_permute_keeps_the_weights_and_scrambles_the_rows(bert):
    x, _ = hidden(bert, [LONG])
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    traces, _, _, mistake, _ = trace_layouts(layer, LayerInputs(x, x), ["view-permute"], "merge-without-permute")
    right, wrong = traces
    batch, num_tokens, model_size = x.shape

    assert mistake.wrong_steps == ["z_merged"] and wrong.step("z_merged").operation == "z.view(B, N, D)"
    assert "z_permuted" not in [step.role for step in wrong.steps]
    assert mistake.weights_diff == 0 and torch.equal(wrong.weights, right.weights)
    with torch.inference_mode():
        expected = layer.w_o(right.tensors["z"].reshape(batch, num_tokens, model_size))  # no transpose back
    torch.testing.assert_close(wrong.output, expected, atol=TOLERANCE, rtol=0)
    assert mistake.output_diff > 0.1


def test_merge_provenance_is_where_the_wrong_merge_puts_each_heads_output(bert):
    x, _ = hidden(bert, [LONG])
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    traces, *_ = trace_layouts(layer, LayerInputs(x, x), ["view-permute"], "merge-without-permute")
    z, wrong_rows = traces[0].tensors["z"], traces[1].tensors["z_merged"]  # (1, H, N, d), (1, N, D)
    num_tokens, d = x.shape[1], 32

    wrong = merge_provenance(12, num_tokens, d, "merge-without-permute")
    right = merge_provenance(12, num_tokens, d)
    for token in range(num_tokens):
        for slot in range(12):
            head, source = wrong[token, slot].tolist()
            assert torch.equal(wrong_rows[0, token, slot * d : (slot + 1) * d], z[0, head, source])
            assert right[token, slot].tolist() == [slot, token]
    assert (wrong != right).any()


def test_mistakes_need_the_default_layout_and_more_than_one_head(bert):
    x, _ = hidden(bert, [SHORT])
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    with pytest.raises(AttnvizError, match="view-permute layout"):
        trace_layouts(layer, LayerInputs(x, x), ["merged-batch"], "view-without-permute")
    with pytest.raises(AttnvizError, match="more than one head"):
        trace_layouts(build_layer(bert, run_spec(bert, num_heads=1)), LayerInputs(x, x), ["view-permute"], "merge-without-permute")


def test_the_command_lines_choices_are_the_librarys():
    assert [layout.value for layout in Layout] == [*LAYOUTS, "all"]
    assert [mistake.value for mistake in Mistake] == list(MISTAKES)


# ---- trace.json, trace.md and the terminal ----


@pytest.fixture(scope="module")
def batch_trace(bert):
    return trace_texts(bert, [SHORT, LONG], run_spec(bert, causal=True), layouts=LAYOUTS)


@pytest.fixture(scope="module")
def mistake_trace(bert):
    return trace_texts(bert, [CHINESE], run_spec(bert), mistake="view-without-permute")


def formats_section(title: str) -> str:
    text = FORMATS_DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_trace_json_has_exactly_the_documented_keys(batch_trace, mistake_trace, plain_spec):
    documented = formats_section("trace.json")
    for keys in (TRACE_KEYS, LAYOUT_KEYS, STEP_KEYS, CHECK_KEYS, HEAD_SLICE_KEYS, MISTAKE_KEYS):
        for key in keys:
            assert f"`{key}`" in documented, key
    for result in (batch_trace, mistake_trace):
        record = json.loads(json.dumps(trace_record(result, plain_spec)))
        assert tuple(record) == TRACE_KEYS
        assert record["format"] == "attnviz-trace" and record["version"] == 1
        for layout in record["layouts"]:
            assert tuple(layout) == LAYOUT_KEYS
            for index, step in enumerate(layout["steps"]):
                assert tuple(step) == STEP_KEYS and step["index"] == index
                assert all(isinstance(size, int) for size in step["output_shape"] + step["stride"])
                assert len(step["output_axes"]) == len(step["output_shape"]) == len(step["stride"])
                assert len(step["inputs"]) == len(step["input_shapes"]) == len(step["input_axes"])
                assert isinstance(step["contiguous"], bool) and step["memory"] in (None, "view", "new")
        assert all(tuple(check) == CHECK_KEYS for check in record["checks"])
        assert all(tuple(head) == HEAD_SLICE_KEYS for head in record["head_slices"])
    batch_record = trace_record(batch_trace, plain_spec)
    assert batch_record["mistake"] is None and batch_record["valid_lens"] == [9, 16]
    assert tuple(trace_record(mistake_trace, plain_spec)["mistake"]) == MISTAKE_KEYS


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each table as rows of cells; an escaped pipe stays inside its cell."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif current:
            tables.append(current)
            current = []
    return tables


def test_trace_md_is_one_markdown_table_per_layout_and_one_row_per_step(batch_trace, mistake_trace):
    for result in (batch_trace, mistake_trace):
        text = trace_markdown(result)
        assert text.startswith("# Shape trace: ")
        tables = markdown_tables(text)
        step_tables = tables[: len(result.layouts)]
        for table, traced in zip(step_tables, result.layouts):
            header, separator, *rows = table
            assert header[:3] == ["#", "role", "operation"]
            assert all(re.fullmatch(r":?-{3,}:?", cell) for cell in separator)
            assert all(len(row) == len(header) for row in table)
            assert len(rows) == len(traced.steps)
            assert [row[0] for row in rows] == [str(index) for index in range(len(traced.steps))]
        assert f"## {result.layouts[0].name}" in text
    assert "**✗ q_heads**" in trace_markdown(mistake_trace)


def render(result, width=80) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    print_trace(console, result)
    return console.export_text()


def test_the_terminal_trace_fits_80_columns_and_shows_the_way_there_and_back(bert, batch_trace):
    chinese = trace_texts(bert, [CHINESE], run_spec(bert), layouts=LAYOUTS)
    for result in (chinese, batch_trace):
        shown = render(result)
        assert max(cell_len(line) for line in shown.splitlines()) <= 80
        for traced in result.layouts:
            assert traced.name in shown
            for step in traced.steps:  # every shape whole on one line, never broken
                assert "(" + ", ".join(map(str, step.output_shape)) in shown.replace("  ", " ")
    shown = render(chinese)
    flow = shown[shown.index("x (1, 8, 384) →") :].split("\n\n")[0]
    for text in ("x (1, 8, 384)", "q_heads (1, 12, 8, 32)", "pattern (1, 12, 8, 8)", "z_merged (1, 8, 384)", "out (1, 8, 384)"):
        assert text in flow
    assert "12 attention maps of (8, 8)" in shown
    assert "do the layouts agree with torch.nn.MultiheadAttention?" in shown and "✗ differs" not in shown


# ---- the command line ----


def trace_command(*args):
    return run(["trace", *args, "--model", "bundled"])


def test_trace_writes_json_and_markdown_whose_shapes_are_the_real_ones(bert, tmp_path, capsys):
    assert trace_command(CHINESE, "--out", str(tmp_path)) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [MANIFEST, "trace.json", "trace.md"]
    record = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert [layout["layout"] for layout in record["layouts"]] == ["view-permute"]
    assert record["texts"] == [CHINESE] and record["valid_lens"] is None

    x, _ = hidden(bert, [CHINESE])
    with torch.inference_mode():
        expected = recompute_default_layout(build_layer(bert, run_spec(bert, num_heads=12)), LayerInputs(x, x), 12)
    assert_steps_match(record["layouts"][0]["steps"], expected)
    shown = capsys.readouterr().out
    assert "(1, 8, 384)" in shown and "(1, 12, 8, 8)" in shown and "nn.MultiheadAttention" in shown


def test_trace_layout_all_with_a_batch_agrees_and_shows_the_padding(tmp_path, capsys):
    assert trace_command(SHORT, "--batch", LONG, "--layout", "all", "--causal", "--out", str(tmp_path)) == 0
    record = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert [layout["layout"] for layout in record["layouts"]] == list(LAYOUTS)
    assert record["valid_lens"] == [9, 16] and record["causal"] is True
    assert all(check["agree"] and check["weights_max_abs_diff"] <= TOLERANCE for check in record["checks"])
    roles = [step["role"] for step in record["layouts"][1]["steps"]]
    assert "valid_lens_heads" in roles and "mask" in roles
    shown = capsys.readouterr().out
    assert "batch of 2 texts padded to 16 tokens" in shown and "single-head" in shown
    assert re.search(r"^ +0 +9 +7: 9–15 +0:\[CLS\] 1:the", shown, re.M)  # text 0: 9 tokens, keys 9..15 padding
    assert re.search(r"^ +1 +16 +none +0:\[CLS\] 1:the 2:␣animal", shown, re.M)  # ␣: a space before the token (models/shown.py)


def test_trace_from_a_file_of_texts(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{SHORT}\n\n{OTHER}\n", encoding="utf-8")
    assert trace_command("--file", str(texts), "--layout", "merged-batch", "--out", str(tmp_path / "run")) == 0
    record = json.loads((tmp_path / "run" / "trace.json").read_text(encoding="utf-8"))
    assert record["texts"] == [SHORT, OTHER] and len(record["valid_lens"]) == 2
    assert [layout["layout"] for layout in record["layouts"]] == ["merged-batch"]  # only the one asked for
    reference = "nn.MultiheadAttention, 12 heads"  # torch's own layer, not attnviz's
    assert [(check["layout"], check["reference"]) for check in record["checks"]] == [
        ("MultiHeadAttention", reference), ("merged-batch", reference)
    ]


def test_trace_cross_attention_leaves_fused_qkv_out_of_all(tmp_path, capsys):
    assert trace_command(SHORT, "--kv", LONG, "--layout", "all", "--out", str(tmp_path)) == 0
    record = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert [layout["layout"] for layout in record["layouts"]] == ["view-permute", "merged-batch", "single-head"]
    scores = record["layouts"][0]["steps"]
    assert next(step for step in scores if step["role"] == "scores")["output_axes"] == ["B", "H", "Nq", "Nk"]
    assert "fused-qkv left out" in capsys.readouterr().out


def test_trace_mistake_writes_the_mistaken_heads_beside_the_right_ones(tmp_path, capsys):
    assert trace_command(SHORT, "--mistake", "view-without-permute", "--heads", "2", "--out", str(tmp_path)) == 0
    written = sorted(path.name for path in tmp_path.iterdir())
    heads = [f"head_{h:02d}.png" for h in range(2)]
    mistaken = [f"mistake_view-without-permute_{name}" for name in heads + ["heads.png"]]
    assert written == sorted([MANIFEST, "trace.json", "trace.md", "heads.png", *heads, *mistaken])
    for name in mistaken:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert record["mistake"]["wrong_steps"] == ["q_heads", "k_heads", "v_heads"]
    assert record["mistake"]["output_max_abs_diff"] > 0.1
    assert [layout["mistake"] for layout in record["layouts"]] == [None, "view-without-permute"]
    shown = capsys.readouterr().out
    assert "✗ q_heads" in shown and "the output differs from the right one by up to" in shown


def test_trace_merge_mistake_writes_where_the_head_outputs_land(tmp_path, capsys):
    assert trace_command(SHORT, "--mistake", "merge-without-permute", "--heads", "2", "--out", str(tmp_path)) == 0
    assert (tmp_path / "mistake_merge-without-permute_merge.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "trace.json").read_text())["mistake"]["weights_max_abs_diff"] == 0
    assert "the weights are the same" in capsys.readouterr().out


@pytest.mark.slow
def test_heads_with_trace_prints_and_writes_the_trace_too(tmp_path, capsys):
    assert run(["heads", SHORT, "--model", "bundled", "--heads", "2", "--trace", "--out", str(tmp_path)]) == 0
    written = {path.name for path in tmp_path.iterdir()}
    assert {"attention.json", "trace.json", "trace.md", "head_00.png", "heads.png"} <= written
    trace_json = json.loads((tmp_path / "trace.json").read_text())
    attention_json = json.loads((tmp_path / "attention.json").read_text())
    pattern = next(step for step in trace_json["layouts"][0]["steps"] if step["role"] == "pattern")
    assert pattern["output_shape"] == [1, 2, len(attention_json["query_tokens"]), len(attention_json["key_tokens"])]
    assert "q_view" in capsys.readouterr().out


def test_layouts_that_disagree_fail_with_exit_code_1_and_keep_the_files(tmp_path, capsys, monkeypatch):
    right = trace_module.merged_batch

    def off_by_a_little(*args, **kwargs):
        traced = right(*args, **kwargs)
        traced.output = traced.output + 1e-3
        return traced

    monkeypatch.setitem(trace_module.LAYOUT_FUNCTIONS, "merged-batch", off_by_a_little)
    assert trace_command(SHORT, "--layout", "all", "--out", str(tmp_path)) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: the layouts disagree: merged-batch differs from nn.MultiheadAttention, 12 heads by 1.0e-03")
    assert error.count("\n") == 1
    checks = json.loads((tmp_path / "trace.json").read_text())["checks"]
    assert [check["agree"] for check in checks] == [True, True, False, True, True]  # attnviz's layer, then the layouts


BAD_INPUTS = {
    "no text": ([], "missing argument 'TEXT'"),
    "empty text": ([""], "the text is empty"),
    "empty batch text": ([SHORT, "--batch", " "], "the text is empty"),
    "text and file": ([SHORT, "--file", "x.txt"], "give either a TEXT or --file PATH, not both"),
    "missing file": (["--file", "no-such-file.txt"], "no such file"),
    "unknown layout": ([SHORT, "--layout", "transposed"], "'transposed' is not one of"),
    "unknown mistake": ([SHORT, "--mistake", "forgot-softmax"], "'forgot-softmax' is not one of"),
    "fused with kv": ([SHORT, "--kv", LONG, "--layout", "fused-qkv"], "fused-qkv is self-attention only"),
    "mistake in another layout": ([SHORT, "--mistake", "view-without-permute", "--layout", "all"], "view-permute layout"),
    "mistake with one head": ([SHORT, "--mistake", "merge-without-permute", "--heads", "1"], "more than one head"),
    "heads that do not divide": ([SHORT, "--heads", "5"], "5 heads do not divide the model size 384"),
    "layer too high": ([SHORT, "--layer", "6"], "layer 6 is out of range"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_trace_input_is_one_line_and_exit_code_2_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, message = BAD_INPUTS[case]
    assert trace_command(*args, "--out", str(tmp_path / "run")) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error, error
    assert error.count("\n") == 1, error
    assert list(tmp_path.iterdir()) == []


def test_heads_trace_refuses_a_file(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text(SHORT, encoding="utf-8")
    assert run(["heads", "--file", str(texts), "--trace", "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.startswith("error: --trace traces one text")
    assert not (tmp_path / "run").exists()


def test_heads_with_trace_is_attnviz_traces_trace_of_the_runs_own_pass():
    """heads(report=True, trace=True) traces the run's capture (one pass): trace.json's record as attnviz.trace's own
    pass gives it, every shape and value within float32; with a measure the trace takes its own pass."""
    import numpy as np
    from helpers import model_runs

    import attnviz

    def leaves(record, path=""):  # every number and string of a record, by path
        if isinstance(record, dict):
            return {key: value for name in record for key, value in leaves(record[name], f"{path}/{name}").items()}
        if isinstance(record, list):
            return {key: value for index, item in enumerate(record) for key, value in leaves(item, f"{path}[{index}]").items()}
        return {path: record}

    expected = leaves(attnviz.trace(SHORT, model="bundled", layer=2).to_dict())
    for options in ({"report": True}, {"measure": "norm"}):
        with model_runs() as runs:
            result = attnviz.heads(SHORT, model="bundled", layer=2, trace=True, **options)
        assert runs["BertEncoder"] == (1 if "report" in options else 2), options  # a measure: its run's pass, the trace's own
        got = leaves(result.traced.to_dict())
        assert got.keys() == expected.keys()
        numbers = [key for key, value in expected.items() if isinstance(value, float)]
        assert numbers and all(got[key] == expected[key] for key in expected.keys() - set(numbers))
        assert np.allclose([got[key] for key in numbers], [expected[key] for key in numbers], rtol=1e-5, atol=1e-6)
    with pytest.raises(AttnvizError, match="trace=True traces one text"):
        attnviz.heads([SHORT, SHORT], model="bundled", trace=True)

"""Shape traces tell the truth in their words too: labels, axis names, marks, references, sizes.

On the bundled all-MiniLM-L6-v2 (D = 384, 12 heads of d = 32). Expectations are computed here
independently: by searching the projected tensors, by arithmetic, or by torch's own layer.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from attnviz.attention import layer as attention_module
from attnviz.models.tokens import encode
from attnviz.output.trace_files import trace_markdown, trace_record
from attnviz.layer_inputs import layer_input
from attnviz.own_layer import build_layer
from attnviz.render.mistake_figures import MAX_MERGE_ROW_LABELS, MERGE_MAX_PX, slice_labels, write_merge_figure
from attnviz.render.trace_tables import print_trace
from attnviz.spec import run_spec
from attnviz.tracing import layout_view_permute
from attnviz.tracing import LAYOUTS, LayerInputs, trace_layouts, trace_texts
from helpers import merge_figure_run

SHORT = "The cat sat on the mat."
LONG = "The animal didn't cross the street because it was too tired."
DOG = "A dog."
COMMANDS_DOC = Path(__file__).resolve().parents[1] / "docs" / "commands.md"


@pytest.fixture(scope="module")
def bert(bundled_bert):
    return bundled_bert  # conftest's: the bundled model, loaded once for the whole session


@pytest.fixture(scope="module")
def batch_all_layouts(bert):
    return trace_texts(bert, [SHORT, DOG], run_spec(bert), layouts=LAYOUTS)


def hidden(bert, texts):
    encoded = encode(bert.tokenizer, texts, bert.max_positions)
    return layer_input(bert, encoded, 0, "cpu"), encoded.valid_lens


def render(result, text_tokens=None, width=100) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    print_trace(console, result, text_tokens=text_tokens)
    return console.export_text()


def tokens_of(bert, text):
    return encode(bert.tokenizer, [text], bert.max_positions).tokens[0]


# ---- 2: the wrong split's rows are slices of tokens, and say so ----


def test_each_row_of_a_wrong_head_is_labelled_with_the_token_slice_it_really_holds(bert):
    x, _ = hidden(bert, [SHORT])
    layer = build_layer(bert, run_spec(bert, num_heads=12))
    traces, *_ = trace_layouts(layer, LayerInputs(x, x), ["view-permute"], "view-without-permute")
    q = traces[0].tensors["q"][0]  # (N, D): the right projection
    wrong_heads = traces[1].tensors["q_heads"][0]  # (H, N, d): what the mistake calls heads
    tokens = tokens_of(bert, SHORT)
    labels = slice_labels(12, len(tokens), 32, tokens)

    slices = q.view(len(tokens), 12, 32)  # (N, H, d): slice k of token t is columns k*32..k*32+31
    for head in range(12):
        for row in range(len(tokens)):
            # found by search, not by formula: the one (token, slice) with exactly these numbers
            match = (slices == wrong_heads[head, row]).all(dim=-1).nonzero().tolist()
            assert len(match) == 1
            token, piece = match[0]
            assert labels[head][row] == f"{token}:{tokens[token]} s{piece}"
    assert labels[0][1] == "0:[CLS] s1"  # row 1 of 'head' 0 is not token 1


def test_the_wrong_split_is_titled_wrong_and_its_example_names_a_slice(bert):
    result = trace_texts(bert, [SHORT], run_spec(bert), mistake="view-without-permute")
    shown = render(result, [tokens_of(bert, SHORT)])
    assert "the wrong computation, made on purpose" in shown
    assert "row 1 of 'head' 0 holds slice 1 (columns 32..63) of token 0 “[CLS]”" in shown
    assert "The wrong computation, made on purpose." in trace_markdown(result)


# ---- 3: single-head is one head, one slice, and says which text it shows ----


def test_single_head_alone_has_one_slice_and_numbers_texts_from_0(bert):
    result = trace_texts(bert, [SHORT, DOG], run_spec(bert), layouts=("single-head",))
    assert [(s.head, s.start, s.stop) for s in result.head_slices] == [(0, 0, 384)]
    assert all(s.agree for s in result.head_slices)
    shown = render(result, [tokens_of(bert, SHORT), tokens_of(bert, DOG)], width=120)
    assert "the one head's slice: it uses all 384 columns" in shown
    assert "head slices: head h of the 12" not in shown
    assert "texts numbered from 0" in shown and "the steps below are text 1's" in shown
    # the shown map is text 1's (9, 5); the summary says the same, not (9, 9) for every text
    assert "pattern (9, 5)" in shown and "text 0 (9, 9), text 1 (9, 5)" in shown
    assert "attention maps of (9, 9)" not in shown
    single = result.layouts[0]
    assert single.step("x_kv").output_shape == [5, 384] and single.shown_text == 1


# ---- 4: stride, contiguity and memory on the step that made the tensor; one notation ----


def test_stride_contiguity_and_memory_print_on_the_output_line_in_trace_md_words(bert):
    result = trace_texts(bert, [SHORT], run_spec(bert, causal=True), layouts=LAYOUTS)
    shown = render(result, width=120)
    for trace in result.layouts:
        for step in trace.steps:
            stride = "(" + ", ".join(map(str, step.stride)) + ("," if len(step.stride) == 1 else "") + ")"
            shape = "(" + ", ".join(map(str, step.output_shape)) + ("," if len(step.output_shape) == 1 else "") + ")"
            arrow = "→ " if step.inputs else ""
            assert re.search(re.escape(arrow + shape) + r" +" + re.escape(stride), shown), (trace.layout, step.role)
    copies = [step for trace in result.layouts for step in trace.steps if step.memory == "new"]
    assert copies and shown.count("memory: new") == len(copies)
    assert shown.count("memory: view") == sum(step.memory == "view" for t in result.layouts for step in t.steps)
    markdown = trace_markdown(result)
    assert "| no | view |" in markdown and "| yes | new |" in markdown
    assert "contiguous: no" in shown and "not contiguous" not in shown


def test_every_table_has_an_axis_legend_and_one_notation(bert, plain_spec, batch_all_layouts):
    result = batch_all_layouts
    shown = render(result, [tokens_of(bert, SHORT), tokens_of(bert, DOG)])
    legends = [line for line in shown.splitlines() if line.startswith("axes: ")]
    assert len(legends) == len(result.layouts)
    assert legends[0].startswith("axes: B = 2 batch, N = 9 tokens, H = 12 heads, d = 32 head size (D / H)")
    steps = [step for trace in trace_record(result, plain_spec)["layouts"] for step in trace["steps"]]
    written = str([(step["operation"], step["pattern"], step["input_axes"], step["output_axes"]) for step in steps])
    for foreign in ("three", "Lk", "d_in", "d_q", "d_out"):
        assert foreign not in written, foreign
    assert not re.search(r"\be\b", written)  # nanoGPT-style "(three e)"
    allowed = re.compile(r"^(B|N|Nq|Nk|H|d|D|1|3D|B\*H|B\*H\*Nq|B\*H\*N)$")
    for trace in result.layouts:
        for step in trace.steps:
            assert all(allowed.match(name) for name in step.output_axes), (trace.layout, step.output_axes)
    assert not re.search(r"\(\d+,\s{2,}\d|\(\s+\d", shown)  # no stray spaces inside a shape


# ---- 6: every text of a batch, its valid length and padding keys ----


def test_a_batch_shows_every_text_with_its_real_tokens_and_padding_keys(bert):
    texts = [SHORT, DOG, LONG]
    result = trace_texts(bert, texts, run_spec(bert))
    text_tokens = [tokens_of(bert, text) for text in texts]
    lengths = [len(tokens) for tokens in text_tokens]
    padded = max(lengths)
    assert result.valid_lens == lengths
    shown = render(result, text_tokens)
    assert f"batch of 3 texts padded to {padded} tokens" in shown
    for index, (tokens, length) in enumerate(zip(text_tokens, lengths)):
        padding = f"{padded - length}: {length}–{padded - 1}" if length < padded else "none"
        first = " ".join(f"{position}:{token}" for position, token in enumerate(tokens[:3]))
        assert re.search(rf"^ +{index} +{length} +{re.escape(padding)} +{re.escape(first)}", shown, re.M), index
    markdown = trace_markdown(result, text_tokens)
    assert f"| 1 | {lengths[1]} | {padded - lengths[1]}: {lengths[1]}–{padded - 1} |" in markdown


# ---- 15: the tutorials' own code, and the steps they do not have ----


def test_steps_a_tutorial_lacks_are_marked_and_the_tutorials_code_is_quoted(bert, plain_spec, batch_all_layouts):
    result = batch_all_layouts
    by_layout = {trace.layout: trace for trace in result.layouts}
    fused, single, merged = by_layout["fused-qkv"], by_layout["single-head"], by_layout["merged-batch"]

    assert fused.step("qkv").operation == "self.attn(x)"  # the tutorial's self.attn, not nanoGPT's c_attn
    assert fused.step("out").operation == "self.c_proj(z_merged)" and not fused.step("out").in_tutorial
    assert not fused.step("padding_mask").in_tutorial
    assert [single.step(role).operation for role in ("q", "k", "v")] == ["self.Wq(x)", "self.Wk(x_kv)", "self.Wv(x_kv)"]
    assert single.step("scores").operation == "torch.matmul(Q, K.T) * self._norm_fact"
    assert single.step("z").operation == "torch.matmul(A, V)"
    assert not single.step("out").in_tutorial and not single.step("x_kv").in_tutorial
    assert all(step.in_tutorial for step in merged.steps)  # d2l's code has every step of a padded batch
    for trace in result.layouts:
        for step in trace.steps:
            assert step.in_tutorial == ("not in the tutorial" not in (step.note or "")), (trace.layout, step.role)
    shown = render(result, [tokens_of(bert, SHORT), tokens_of(bert, DOG)])
    assert "+ out" in shown and "+: a step the tutorial does not have" in shown
    record = trace_record(result, plain_spec)
    fused_steps = next(layout["steps"] for layout in record["layouts"] if layout["layout"] == "fused-qkv")
    assert fused_steps[-1]["in_tutorial"] is False


# ---- 17: checked against torch's own layer, which shares no code with attnviz ----


def test_a_bug_in_attention_py_is_caught_by_the_torch_reference(bert, monkeypatch):
    right = attention_module.allowed_keys

    def one_key_too_many(num_queries, num_keys, valid_lens=None, causal=False, device=None, **block):
        return right(num_queries, num_keys, None if valid_lens is None else valid_lens + 1, causal, device, **block)

    monkeypatch.setattr(attention_module, "allowed_keys", one_key_too_many)
    monkeypatch.setattr(layout_view_permute, "allowed_keys", one_key_too_many)  # the trace's layout uses it too
    result = trace_texts(bert, [SHORT, DOG], run_spec(bert))  # DOG has padding keys: the bug lets one through
    checks = {check.layout: check for check in result.checks}
    assert checks["MultiHeadAttention"].reference == "nn.MultiheadAttention, 12 heads"
    assert not checks["MultiHeadAttention"].agree and not checks["view-permute"].agree
    assert checks["MultiHeadAttention"].weights_diff > 0.01


def test_the_torch_reference_agrees_with_an_unmodified_run(bert):
    result = trace_texts(bert, [SHORT, DOG], run_spec(bert, causal=True), layouts=LAYOUTS)
    assert [check.reference for check in result.checks] == ["nn.MultiheadAttention, 12 heads"] * 4 + [
        "nn.MultiheadAttention, 1 head"
    ]
    assert result.agree


# ---- 23: the merge figure is capped, drawn cell by cell ----


@pytest.mark.slow
def test_the_merge_figure_of_a_long_text_is_capped_and_says_so(tmp_path, monkeypatch):
    from PIL import Image

    from attnviz.render import heatmap

    figures = []
    new_figure = heatmap.new_figure
    monkeypatch.setattr(heatmap, "new_figure", lambda size: figures.append(new_figure(size)) or figures[-1])
    tokens = ["[CLS]", *(f"w{index}" for index in range(338)), "[SEP]"]
    result = SimpleNamespace(num_heads=48, head_dim=8)  # many heads and tokens: 2 * 48 * 0.25 + 3.5 inches wide
    notes = []
    path = write_merge_figure(result, merge_figure_run(tokens, num_heads=48), tmp_path / "merge.png", notes)

    width, height = Image.open(path).size
    assert (width, height) == (48 * 0.25 * 2 * 120 + 3.5 * 120, 2400)  # 340 rows at 0.38 inch would be 15,792 pixels
    assert MERGE_MAX_PX == (4096, 2400)
    assert len(notes) == 1 and "merge.png is capped at 4096 × 2400 pixels" in notes[0]
    (figure,) = figures
    assert all(image.get_interpolation() == "nearest" for ax in figure.axes for image in ax.images)
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert len(labels) <= MAX_MERGE_ROW_LABELS and labels[:2] == ["0:[CLS]", "6:w5"]  # every 6th of 340 rows
    assert "at most 4,096 × 2,400 px" in COMMANDS_DOC.read_text(encoding="utf-8")


def test_the_merge_figure_of_a_short_text_is_not_capped(tmp_path):
    notes = []
    result = SimpleNamespace(num_heads=12, head_dim=32)
    write_merge_figure(result, merge_figure_run(["[CLS]", "a", "[SEP]"], num_heads=48), tmp_path / "m.png", notes)
    assert notes == []

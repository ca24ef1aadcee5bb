"""Shape traces of current models' attention: grouped-query attention, RoPE, q/k norms, GPT-2's fused c_attn.

Tiny randomly initialised transformers models (Llama, Qwen3, GPT-2) made with their own config
classes; the AttentionWeights are taken from their modules here, independent of attnviz's model
adapter, and the layer input by a forward pre-hook on the first attention module. The
expectations come from transformers: its eager attention weights (output_attentions), its own
rotary embedding (apply_rotary_pos_emb) and its Conv1D weight.
"""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

from attnviz.attention.layer import AttentionWeights, MultiHeadAttention, layer_from_weights
from attnviz.errors import AttnvizError
from attnviz.output.trace_files import HEAD_SLICE_KEYS, trace_json, trace_markdown
from attnviz.render.trace_tables import print_trace
from attnviz.tracing import LayerInputs, TraceResult, trace_layout, trace_layouts
from attnviz.tracing.recorder import beyond_tutorials

TEXTS_LENGTHS = [7, 5]  # a padded batch: the second text has two padding keys
TOLERANCE = 1e-5


def linear(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight, module.bias


def run_hf(model, attention_module, seed: int = 1):
    """transformers' eager weights of layer 0 (B, H, N, N), and what entered its attention module."""
    captured = {}

    def capture(module, args, kwargs):
        captured.update(kwargs, hidden_states=kwargs.get("hidden_states", args[0] if args else None))

    handle = attention_module.register_forward_pre_hook(capture, with_kwargs=True)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (len(TEXTS_LENGTHS), max(TEXTS_LENGTHS)), generator=generator)
    mask = (torch.arange(ids.shape[1])[None, :] < torch.tensor(TEXTS_LENGTHS)[:, None]).long()  # right padding
    with torch.no_grad():
        attentions = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[0]
    handle.remove()
    return attentions, captured


def decoder_inputs(hidden: torch.Tensor) -> LayerInputs:
    return LayerInputs(hidden, hidden, valid_lens=torch.tensor(TEXTS_LENGTHS), causal=True)


@pytest.fixture(scope="module")
def llama():
    """A Llama with 6 query heads sharing 2 key/value heads (G = 3) of d = 8, and RoPE; its layer 0 traced."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0, initializer_range=0.3,
        attn_implementation="eager",
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    module = model.model.layers[0].self_attn
    attentions, captured = run_hf(model, module)
    weights = AttentionWeights(
        linear(module.q_proj), linear(module.k_proj), linear(module.v_proj), linear(module.o_proj),
        num_heads=6, num_kv_heads=2, head_dim=8, scale=module.scaling, rope_theta=10000.0,
        rotary_inv_freq=model.model.rotary_emb.inv_freq, rotary_scaling=model.model.rotary_emb.attention_scaling,
        family="Llama",
    )  # fmt: skip
    layer = layer_from_weights(weights).eval()
    inputs = decoder_inputs(captured["hidden_states"])
    traces, checks, slices, _, notes = trace_layouts(layer, inputs, ["view-permute"])
    return {"model": model, "module": module, "attentions": attentions, "captured": captured, "layer": layer,
            "inputs": inputs, "trace": traces[0], "checks": checks, "slices": slices}  # fmt: skip


def test_the_traced_gqa_rope_weights_are_transformers_eager_weights(llama):
    """The default layout on a Llama layer gives transformers' own attention weights for a padded batch."""
    expected = llama["attentions"]  # (B, H, N, N)
    assert llama["trace"].weights.shape == expected.shape == (2, 6, 7, 7)
    assert (llama["trace"].weights - expected).abs().max() <= TOLERANCE
    assert torch.all(llama["trace"].weights[1, :, :, 5:] == 0)  # the padding keys


def test_k_and_v_heads_are_repeated_from_h_kv_to_h_with_repeat_interleave(llama):
    trace = llama["trace"]
    k_heads, k_repeated = trace.step("k_heads"), trace.step("k_repeated")
    assert (k_heads.output_shape, k_heads.output_axes) == ([2, 2, 7, 8], ["B", "H_kv", "N", "d"])
    assert (k_repeated.output_shape, k_repeated.output_axes) == ([2, 6, 7, 8], ["B", "H", "N", "d"])
    assert "repeat_interleave(G, dim=1)" in k_repeated.operation
    assert k_repeated.pattern == "b h_kv n d -> b (h_kv g) n d"
    assert not k_repeated.in_tutorial and k_repeated.inputs == ["k_rot"]
    assert trace.step("v_repeated").inputs == ["v_heads"]  # values are not rotated
    assert trace.step("k").output_axes == ["B", "N", "H_kv*d"] and trace.step("k").output_shape == [2, 7, 16]
    # query head h reads key/value head h // 3: heads 0, 1, 2 see kv head 0's keys
    k_rot, repeated = trace.tensors["k_rot"], trace.tensors["k_repeated"]
    for head in range(6):
        assert torch.equal(repeated[:, head], k_rot[:, head // 3])
    assert trace.step("k_t").inputs == ["k_repeated"] and trace.step("z").inputs == ["pattern", "v_repeated"]


def test_q_rot_and_k_rot_are_transformers_own_rotation(llama):
    """q_rot and k_rot equal apply_rotary_pos_emb with the cos and sin transformers passed to the layer."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    trace = llama["trace"]
    cos, sin = llama["captured"]["position_embeddings"]  # (B, N, d) each
    q_expected, k_expected = apply_rotary_pos_emb(trace.tensors["q_heads"], trace.tensors["k_heads"], cos, sin)
    assert (trace.tensors["q_rot"] - q_expected).abs().max() <= 1e-6
    assert (trace.tensors["k_rot"] - k_expected).abs().max() <= 1e-6
    assert torch.allclose(trace.tensors["cos"], cos[0], atol=1e-6)
    q_rot = trace.step("q_rot")
    assert q_rot.operation == (
        "q_heads * cos + torch.cat([-q_heads[..., d//2:], q_heads[..., :d//2]], dim=-1) * sin"
    )
    assert q_rot.inputs == ["q_heads", "cos", "sin"] and not q_rot.in_tutorial
    assert trace.step("inv_freq").operation == "1.0 / 10000 ** (torch.arange(0, d, 2) / d)"
    assert trace.step("angles").output_axes == ["N", "d/2"] and trace.step("cos").output_shape == [7, 8]


def test_the_checks_use_scaled_dot_product_attention_and_agree(llama):
    assert [check.layout for check in llama["checks"]] == ["MultiHeadAttention", "view-permute"]
    for check in llama["checks"]:
        assert check.reference.startswith("F.scaled_dot_product_attention, 6 heads on 2 key/value heads")
        assert check.agree


def test_the_sdpa_check_catches_a_wrong_rotation(llama, monkeypatch):
    """The reference is independent of attnviz's rotate: a layer that pairs features i, i+1 instead of
    i, i + d/2 (the other RoPE convention) disagrees with it."""
    import attnviz.attention.layer as layer_module
    from attnviz.tracing.checks import check_layouts

    def interleaved(x, cos, sin):  # pairs (x_2i, x_2i+1), with the half-split tables' angles
        pairs = x.unflatten(-1, (-1, 2))  # (B, H, N, d/2, 2)
        turned = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)  # (B, H, N, d)
        return x * cos + turned * sin

    (right,) = check_layouts(llama["layer"], llama["inputs"], [])
    monkeypatch.setattr(layer_module, "rotate", interleaved)
    (wrong,) = check_layouts(llama["layer"], llama["inputs"], [])
    assert right.agree and not wrong.agree and wrong.weights_diff > 1e-3


def test_head_slices_name_the_key_value_head_each_query_head_shares(llama):
    assert [(s.head, s.kv_head) for s in llama["slices"]] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]
    assert [(s.start, s.stop, s.kv_start, s.kv_stop) for s in llama["slices"][2:4]] == [(16, 24, 0, 8), (24, 32, 8, 16)]
    assert all(head.agree for head in llama["slices"])


def test_layouts_without_gqa_refuse_the_layer_and_all_keeps_view_permute(llama):
    layer, inputs = llama["layer"], llama["inputs"]
    for name in ("merged-batch", "fused-qkv", "single-head"):
        with pytest.raises(AttnvizError, match="it is traced in the view-permute layout") as error:
            trace_layout(name, layer, inputs, 6)
        assert "grouped-query attention (6 query heads share 2 key/value heads)" in str(error.value)
    traces, checks, _, _, notes = trace_layouts(layer, inputs, ["view-permute", "merged-batch", "fused-qkv", "single-head"])
    assert [trace.layout for trace in traces] == ["view-permute"]
    assert notes and notes[0].startswith("merged-batch, fused-qkv, single-head left out")
    with pytest.raises(AttnvizError, match="6 query heads share 2 key/value heads: leave out --mistake"):
        trace_layouts(layer, inputs, ["view-permute"], mistake="view-without-permute")


def result_of(layer: MultiHeadAttention, inputs: LayerInputs, traces, checks, slices, notes) -> TraceResult:
    return TraceResult(
        texts=["one", "two"], kv_text=None, model="tiny", layer=0, weights="pretrained", num_heads=layer.num_heads,
        head_dim=layer.head_dim, model_size=layer.w_o.out_features, causal=True, device="cpu",
        valid_lens=TEXTS_LENGTHS, layouts=traces, checks=checks, head_slices=slices, notes=notes,
        num_kv_heads=layer.num_kv_heads, before_scores=["RoPE"], features=beyond_tutorials(layer, inputs),
    )  # fmt: skip


def test_the_rendered_trace_shows_the_repeat_the_rotation_and_the_shared_heads(llama, plain_spec):
    result = result_of(llama["layer"], llama["inputs"], [llama["trace"]], llama["checks"], llama["slices"], [])
    console = Console(file=io.StringIO(), width=80, color_system=None)
    print_trace(console, result)
    shown = console.file.getvalue()
    assert "+ k_repeated" in shown and "repeat_interleave(G, dim=1)" in shown and "b h_kv n d -> b (h_kv g) n d" in shown
    assert "+ q_rot" in shown and "H_kv = 2 key/value heads" in shown
    assert "kv head" in shown and "shares key/value head h // 3" in shown and "Q_h and K_h pass the layer's RoPE" in " ".join(shown.split())
    assert "do the layouts agree with F.scaled_dot_product_attention?" in shown and "✗" not in shown
    assert "RoPE written as complex rotation" in " ".join(shown.split())
    markdown = trace_markdown(result)
    assert "repeat_interleave" in markdown and "6 heads sharing 2 key/value heads" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| 3 | 24–31 |")]
    assert rows and rows[0].startswith("| 3 | 24–31 | 1 | 8–15 |")  # head 3: kv head 1, columns 8..15
    record = json.loads(trace_json(result, plain_spec))
    assert record["num_kv_heads"] == 2 and record["scale"] == pytest.approx(8**-0.5)
    assert all(tuple(head) == HEAD_SLICE_KEYS for head in record["head_slices"])
    assert record["head_slices"][4]["kv_head"] == 1 and record["head_slices"][4]["kv_columns"] == [8, 15]
    steps = {step["role"]: step for step in record["layouts"][0]["steps"]}
    assert steps["k_repeated"]["in_tutorial"] is False and steps["angles"]["output_axes"] == ["N", "d/2"]


def test_qwen3_traces_its_q_and_k_norms_and_heads_wider_than_d_over_h():
    """Qwen3: RMSNorm over each head's q and k, head_dim 16 with D = 32 and 4 heads (H*d = 64, not D)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=64, initializer_range=0.3,
        attn_implementation="eager",
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()
    module = model.model.layers[0].self_attn
    with torch.no_grad():  # norms other than ones, so that leaving them out would show
        module.q_norm.weight.uniform_(0.5, 2.0)
        module.k_norm.weight.uniform_(0.5, 2.0)
    attentions, captured = run_hf(model, module)
    weights = AttentionWeights(
        linear(module.q_proj), linear(module.k_proj), linear(module.v_proj), linear(module.o_proj),
        num_heads=4, num_kv_heads=2, head_dim=16, scale=module.scaling,
        rotary_inv_freq=model.model.rotary_emb.inv_freq, q_norm=(module.q_norm.weight, module.q_norm.variance_epsilon),
        k_norm=(module.k_norm.weight, module.k_norm.variance_epsilon), family="Qwen3",
    )  # fmt: skip
    layer, inputs = layer_from_weights(weights).eval(), decoder_inputs(captured["hidden_states"])
    traces, checks, slices, _, _ = trace_layouts(layer, inputs, ["view-permute"])
    trace = traces[0]
    assert (trace.weights - attentions).abs().max() <= TOLERANCE
    assert trace.step("q").output_axes == ["B", "N", "H*d"] and trace.step("q").output_shape == [2, 7, 64]
    assert trace.step("z_merged").output_axes == ["B", "N", "H*d"]
    assert trace.step("q_normed").inputs == ["q_heads"] and trace.step("q_rot").inputs == ["q_normed", "cos", "sin"]
    assert all(check.agree for check in checks) and all(head.agree for head in slices)


def test_gpt2_traces_as_fused_qkv_on_its_own_conv1d_weight(plain_spec):
    """GPT-2's c_attn is a Conv1D with weight (D, 3D): the fused-qkv layout names it and records that weight."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32, initializer_range=0.3,
        attn_implementation="eager",
    )  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    module = model.transformer.h[0].attn
    attentions, captured = run_hf(model, module)
    c_attn, c_proj, D = module.c_attn, module.c_proj, 32
    stored = c_attn.weight  # (D, 3D): x @ stored + bias
    weights = AttentionWeights(
        *((stored[:, part * D : (part + 1) * D].T, c_attn.bias[part * D : (part + 1) * D]) for part in range(3)),
        (c_proj.weight.T, c_proj.bias), num_heads=4, num_kv_heads=4, head_dim=8, family="GPT-2",
        fused_qkv="transformer.h.0.attn.c_attn",
    )  # fmt: skip
    layer = layer_from_weights(weights).eval()
    assert layer.fused_qkv_name == "transformer.h.0.attn.c_attn"
    inputs = decoder_inputs(captured["hidden_states"])
    assert beyond_tutorials(layer, inputs) == []  # GPT-2 is the tutorials' layer: every layout traces it
    traces, checks, _, _, notes = trace_layouts(layer, inputs, ["view-permute", "merged-batch", "fused-qkv", "single-head"])
    assert notes == [] and all(check.agree for check in checks)
    assert checks[0].reference == "nn.MultiheadAttention, 4 heads"
    fused = next(trace for trace in traces if trace.layout == "fused-qkv")
    assert (fused.weights - attentions).abs().max() <= TOLERANCE
    weight_step, qkv = fused.step("qkv_weight"), fused.step("qkv")
    assert torch.equal(fused.tensors["qkv_weight"], stored)  # GPT-2's own weight, as it stores it
    assert (weight_step.operation, weight_step.output_shape, weight_step.output_axes) == (
        "transformer.h.0.attn.c_attn.weight", [32, 96], ["D", "3D"],
    )  # fmt: skip
    assert "transpose of nn.Linear's" in weight_step.note
    assert qkv.operation == "self.c_attn(x)" and qkv.inputs == ["x", "qkv_weight"]
    assert "transformer.h.0.attn.c_attn" in fused.notes[0] and "Conv1D" in fused.notes[0]
    view_permute = next(trace for trace in traces if trace.layout == "view-permute")
    assert "--layout fused-qkv traces it as stored" in view_permute.notes[0]


def test_a_model_scale_and_position_bias_are_traced_as_used():
    """T5's way: no 1/sqrt(d) (scale 1) and a bias per head added to the scores, checked against SDPA."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, bias=False, scale=1.0).eval()
    hidden = torch.randn(2, 5, 16)
    bias = torch.randn(1, 4, 5, 5)
    inputs = LayerInputs(hidden, hidden, valid_lens=torch.tensor([5, 3]), position_bias=bias)
    traces, checks, slices, _, notes = trace_layouts(layer, inputs, ["view-permute", "merged-batch"])
    trace = traces[0]
    assert notes == [
        "merged-batch left out: their tutorials' code cannot do what this layer does "
        "(scale 1, not 1/sqrt(d); a position bias added to the scores)"
    ]
    scores = trace.step("scores")
    assert scores.operation == "q_heads @ k_t" and "no scaling" in scores.note
    expected = (trace.tensors["q_heads"] @ trace.tensors["k_heads"].transpose(-2, -1)) + bias  # (B, H, N, N)
    assert torch.allclose(trace.tensors["biased_scores"], expected, atol=1e-6)
    assert trace.step("masked_scores").inputs == ["biased_scores", "mask"]
    assert all(check.agree for check in checks) and checks[0].reference.startswith("F.scaled_dot_product_attention")
    assert all(head.agree for head in slices)
    result = result_of(layer, inputs, traces, checks, slices, notes)
    result.scale, result.before_scores, result.causal = 1.0, [], False
    console = Console(file=io.StringIO(), width=80, color_system=None)
    print_trace(console, result)
    shown = " ".join(console.file.getvalue().split())
    assert "+ biased_scores" in shown and "max |Q_h K_hᵀ − scores[:, h]|" in shown  # no /√d in the head slices
    assert "RoPE" not in shown and "(scale 1, not 1/sqrt(d); a position bias added to the scores)" in shown


def tiny_llama_folder(folder) -> None:
    """A 2-layer Llama (6 query heads on 2 key/value heads) saved as safetensors, with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = "<pad> <unk> <s> the cat sat on mat a dog ran".split()
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", bos_token="<s>").save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(words), hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3, pad_token_id=0, bos_token_id=2,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)


def test_attnviz_trace_on_a_llama_folder_writes_the_gqa_and_rope_steps(tmp_path, capsys):
    from attnviz.cli import run

    folder, out = tmp_path / "llama", tmp_path / "out"
    tiny_llama_folder(folder)
    code = run(["trace", "the cat sat on the mat", "--batch", "a dog ran", "--model", str(folder), "--layer", "1",
                "--out", str(out)])  # fmt: skip
    shown = capsys.readouterr().out
    assert code == 0, shown
    record = json.loads((out / "trace.json").read_text(encoding="utf-8"))
    steps = {step["role"]: step for step in record["layouts"][0]["steps"]}
    assert steps["k_heads"]["output_axes"] == ["B", "H_kv", "N", "d"] and steps["k_heads"]["output_shape"][1] == 2
    assert steps["k_repeated"]["output_shape"][1] == 6 and steps["k_repeated"]["pattern"] == "b h_kv n d -> b (h_kv g) n d"
    assert steps["q_rot"]["inputs"] == ["q_heads", "cos", "sin"] and record["causal"] is True
    assert record["num_kv_heads"] == 2 and all(check["agree"] for check in record["checks"])
    assert [head["kv_head"] for head in record["head_slices"]] == [0, 0, 0, 1, 1, 1]
    assert "repeat_interleave" in (out / "trace.md").read_text(encoding="utf-8") and "+ k_repeated" in shown


def test_a_layer_with_biased_projections_but_no_output_bias_is_checked_by_every_layout():
    """Qwen2 keeps biases on W_q, W_k, W_v and none on W_o; nn.MultiheadAttention gets a zero output bias."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, bias=True, out_bias=False).eval()
    hidden = torch.randn(2, 5, 16)
    traces, checks, _, _, notes = trace_layouts(
        layer, LayerInputs(hidden, hidden, valid_lens=torch.tensor([5, 3])), ["view-permute", "merged-batch", "fused-qkv", "single-head"]
    )
    assert notes == [] and len(checks) == 5 and all(check.agree for check in checks)
    assert checks[0].reference == "nn.MultiheadAttention, 4 heads"

"""Shape traces: every split and merge of the heads, recorded from the real tensors.

Four layouts compute the same multi-head attention on the same weights (the Linear layers
of one MultiHeadAttention), each the way its tutorial writes it (docs/commands.md, "Shape traces:
attnviz trace"):

    view-permute   attnviz's own layer and the BERT-fed tutorial: separate W_q, W_k, W_v,
                   view + permute to (B, H, N, d)
    merged-batch   d2l.ai: heads folded into the batch axis, (B*H, N, d); valid lengths
                   repeated per head; masked scores set to -1e6
    fused-qkv      nanoGPT: one Linear(D, 3D), split, view, transpose; causal tril buffer
    single-head    one head over one unbatched sequence: Q K^T / sqrt(d_q), A V

A layout passes every tensor it makes through `record(role, tensor, operation, axes, ...)`:
the shape, stride, contiguity and memory sharing are read from that tensor, and the axis
names are checked against the sizes, so a trace cannot claim a shape the run did not have.

Modules: recorder (the records and the recorder), one per layout (layout_view_permute, ...,
layout_single_head), decoder_steps (what current models add: q/k norms, RoPE, repeated key/value
heads, the model's scale and position bias; traced by view-permute only, the other layouts refuse
such a layer), checks (against torch.nn.MultiheadAttention, or F.scaled_dot_product_attention
for what it cannot run, and the head slices), mistakes (the two reshape mistakes and where they
put the numbers); this one runs them.

Step roles, stable across layouts (in the spirit of TransformerLens' hook names):

    x, x_kv                    the layer's query and key/value inputs
    qkv_weight, qkv            fused-qkv: the one projection's weight as a Conv1D stores it (D, 3D),
                               GPT-2 only; the one projection (B, N, 3D)
    q, k, v                    the projections (B, N, D); k, v (B, N, H_kv*d) with grouped-query attention
    q_view, k_view, v_view     (B, N, H, d): the model axis split into heads
    q_permuted, ...            merged-batch: (B, H, N, d) before folding heads into the batch
    q_heads, k_heads, v_heads  each head's tokens: (B, H, N, d), or (B*H, N, d) merged-batch;
                               k_heads, v_heads (B, H_kv, N, d) with grouped-query attention
    q_normed, k_normed         RMSNorm over each head's d features (Qwen3)
    positions, inv_freq        RoPE: token positions (N,) and frequencies theta^(-2i/d) (d/2,)
    angles, cos, sin           RoPE: positions x frequencies (N, d/2), their cos and sin (N, d)
    q_rot, k_rot               RoPE: q and k turned by position, x*cos + rotate_half(x)*sin
    k_repeated, v_repeated     grouped-query attention: (B, H_kv, N, d) -> (B, H, N, d), repeat_interleave(G)
    k_t                        the keys transposed for the product
    scores                     Q K^T / sqrt(d), or times the model's own scale (T5: 1)
    position_bias, biased_scores   T5: the bias (1, H, Nq, Nk) and the scores with it added
    valid_lens, ...            the padding path: valid lengths, repeated, and the masks
    mask                       the boolean mask the scores are filled by (True = may attend)
    masked_scores              the scores with masked keys at -inf (or -1e6 in d2l)
    pattern                    the attention weights: softmax over the keys
    z                          pattern @ v, per head
    z_view, z_permuted, z_contiguous, z_merged   back to (B, N, D)
    out                        W_o(z_merged)

Axis names: B batch, N tokens (Nq queries and Nk keys when they differ), H heads, d head
size, D model size, "1" a broadcast axis; products such as B*H name a merged axis. Current
models add H_kv key/value heads, G = H / H_kv query heads per key/value head, d/2 RoPE's pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from attnviz.attention.layer import MultiHeadAttention
from attnviz.errors import AttnvizError
from attnviz.run_data import Truncation
from attnviz.spec import RunSpec
from attnviz.tracing.checks import (
    LAYER_NAME, TOLERANCE, Check, HeadSlice, check_layouts, check_seed_head, head_slices, torch_reference,
)  # fmt: skip
from attnviz.tracing.layout_fused_qkv import fused_projection, fused_qkv
from attnviz.tracing.layout_merged_batch import merged_batch
from attnviz.tracing.layout_single_head import SeedHead, single_head
from attnviz.tracing.layout_view_permute import view_permute
from attnviz.tracing.mistakes import MISTAKES, MistakeResult, compare_mistake, merge_provenance, split_provenance
from attnviz.tracing.recorder import ADDED_MARK, LayerInputs, LayoutTrace, Recorder, Step, axis_size, beyond_tutorials

LAYOUTS = ("view-permute", "merged-batch", "fused-qkv", "single-head")
DEFAULT_LAYOUT = "view-permute"


def model_layout(loaded) -> str:
    """The layout a model's own code uses: fused-qkv for GPT-2 (one c_attn for W_q, W_k, W_v), else view-permute."""
    return "fused-qkv" if getattr(loaded, "family", None) is not None and loaded.family.model_types == ("gpt2",) else DEFAULT_LAYOUT

LAYOUT_DESCRIPTIONS = {
    "view-permute": "attnviz's own layer (attention/layer.py), split as the BERT-fed and cross-attention tutorials "
    "split it: separate W_q, W_k, W_v; view + permute to (B, H, N, d)",
    "merged-batch": "the d2l.ai tutorial's code: heads folded into the batch axis as (B*H, N, d); valid lengths "
    "repeated per head, masked scores set to -1e6",
    "fused-qkv": "the nanoGPT-style tutorial's code: one nn.Linear(D, 3D) (self.attn) whose weight stacks W_q, W_k, "
    "W_v; split, view, transpose(1, 2)",
    "single-head": "the single-head tutorial's code (Self_attention): self.Wq, self.Wk, self.Wv over one unbatched "
    "sequence, one head of d = D",
}

__all__ = [
    "ADDED_MARK", "DEFAULT_LAYOUT", "LAYER_NAME", "LAYOUTS", "LAYOUT_DESCRIPTIONS", "MISTAKES", "TOLERANCE",
    "Check", "HeadSlice", "LayerInputs", "LayoutTrace", "MistakeResult", "Recorder", "Step", "TraceResult",
    "axis_size", "check_layouts", "fused_projection", "head_slices", "merge_provenance", "merged_batch",
    "split_provenance", "torch_reference", "trace_layout", "trace_layouts", "trace_texts", "SeedHead", "seed_head_run",
]  # fmt: skip

# name -> the function that runs it; trace_layout looks it up here (tests replace an entry)
LAYOUT_FUNCTIONS = {
    "view-permute": view_permute,
    "merged-batch": merged_batch,
    "fused-qkv": fused_qkv,
    "single-head": single_head,
}


def trace_layout(
    name: str, layer: MultiHeadAttention, inputs: LayerInputs, num_heads: int, mistake: str | None = None
) -> LayoutTrace:
    if name not in LAYOUTS:
        raise AttnvizError(f"unknown layout {name!r}: choose one of {', '.join(LAYOUTS)} or all")
    if mistake is not None and name != "view-permute":
        raise AttnvizError("--mistake is shown in the view-permute layout: leave out --layout or use --layout view-permute")
    beyond = beyond_tutorials(layer, inputs)
    if name != DEFAULT_LAYOUT and beyond:
        raise AttnvizError(
            f"--layout {name}: its tutorial's code cannot do what this layer does ({'; '.join(beyond)}); "
            "it is traced in the view-permute layout: leave out --layout or use --layout view-permute"
        )
    with torch.inference_mode():
        if name == "view-permute":
            return LAYOUT_FUNCTIONS[name](layer, inputs, num_heads, mistake)
        return LAYOUT_FUNCTIONS[name](layer, inputs, num_heads)


@dataclass
class TraceResult:
    """Everything `attnviz trace` shows and writes."""

    texts: list[str]
    kv_text: str | None
    model: str
    layer: int
    weights: str
    num_heads: int
    head_dim: int
    model_size: int
    causal: bool
    device: str
    valid_lens: list[int] | None
    layouts: list[LayoutTrace]
    checks: list[Check]
    head_slices: list[HeadSlice]
    mistake: MistakeResult | None = None
    notes: list[str] = field(default_factory=list)
    num_kv_heads: int | None = None  # key/value heads, fewer than num_heads with grouped-query attention; None: as many
    scale: float | None = None  # the scores' scale when it is not 1/sqrt(head_dim) (T5: 1)
    before_scores: list[str] = field(default_factory=list)  # what q and k pass after their split: "q/k norms", "RoPE"
    features: list[str] = field(default_factory=list)  # what the layer does beyond the tutorials' (beyond_tutorials)
    truncated: list[Truncation | None] = field(default_factory=list)  # each text's cut by --truncate
    kv_truncated: Truncation | None = None  # the --kv text's
    seed_sizes: tuple[int, int] | None = None  # (d_q, d_out): the single-head tutorial's own layer (--d-q, --d-out)

    @property
    def agree(self) -> bool:
        return all(check.agree for check in self.checks)


def trace_layouts(
    layer: MultiHeadAttention, inputs: LayerInputs, layouts: list[str], mistake: str | None = None
) -> tuple[list[LayoutTrace], list[Check], list[HeadSlice], MistakeResult | None, list[str]]:
    """Run the layouts (in LAYOUTS' order), check them against torch, slice the heads.

    The head slices are checked against the default layout's scores, run for that even when
    not shown.
    """
    num_heads = layer.num_heads
    if mistake is not None and any(name != DEFAULT_LAYOUT for name in layouts):
        raise AttnvizError("--mistake is shown in the view-permute layout: leave out --layout or use --layout view-permute")
    if mistake is not None and num_heads == 1:
        raise AttnvizError("--mistake needs more than one head: with 1 head the wrong view gives the right tensor")
    notes = []
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        trace_layout(unknown[0], layer, inputs, num_heads)  # raises the clear error
    names = [name for name in LAYOUTS if name in layouts]
    if not inputs.self_attention and "fused-qkv" in names:
        if len(names) == 1:
            trace_layout("fused-qkv", layer, inputs, num_heads)  # raises the clear error
        names.remove("fused-qkv")
        notes.append("fused-qkv left out: it is self-attention only, and --kv makes this cross-attention")
    beyond = beyond_tutorials(layer, inputs)
    if beyond and names != [DEFAULT_LAYOUT]:
        if DEFAULT_LAYOUT not in names:
            trace_layout(names[0], layer, inputs, num_heads)  # raises the clear error
        left_out = [name for name in names if name != DEFAULT_LAYOUT]
        names = [DEFAULT_LAYOUT]
        notes.append(f"{', '.join(left_out)} left out: their tutorials' code cannot do what this layer does ({'; '.join(beyond)})")
    traces = [trace_layout(name, layer, inputs, num_heads) for name in names]
    # The head slices are those of the heads shown: one head of D columns when single-head is all there is.
    sliced_heads = 1 if names == ["single-head"] else num_heads
    sliced = next((trace for trace in traces if trace.layout == DEFAULT_LAYOUT), None)
    if sliced is None or sliced.num_heads != sliced_heads:
        sliced = trace_layout(DEFAULT_LAYOUT, layer, inputs, sliced_heads)
    mistake_result = None
    if mistake is not None:
        wrong = trace_layout(DEFAULT_LAYOUT, layer, inputs, num_heads, mistake)
        mistake_result = compare_mistake(traces[0], wrong)
        traces.append(wrong)
    checks = check_layouts(layer, inputs, traces)
    return traces, checks, head_slices(layer, inputs, sliced), mistake_result, notes


def before_scores(layer: MultiHeadAttention) -> list[str]:
    """What a layer does to each head's q and k between the split and the scores, in its order."""
    return ["q/k norms"] * (layer.q_norm is not None) + ["RoPE"] * (layer.rotary_inv_freq is not None)


def trace_texts(
    loaded,
    texts: list[str],
    spec: RunSpec,
    *,
    layouts: tuple[str, ...] = (DEFAULT_LAYOUT,),
    mistake: str | None = None,
    seed_sizes: tuple[int, int] | None = None,
    captured=None,
) -> TraceResult:
    """Trace the layouts over layer spec.layer's input for a padded batch of texts.

    The weights are build_layer's (the model's own, or random with spec.seed); the input is what
    enters that layer's attention in the model (layer_inputs.layer_states), with T5's position bias;
    a batch of more than one text passes its valid lengths, so the trace shows the padding path.
    A model loaded in half precision (--dtype) gives the layer's input; the layouts then compute in
    float32, so that they can be checked against each other within TOLERANCE. seed_sizes (d_q, d_out):
    the single-head layout alone, on the seed's own layer (SeedHead, random from spec.seed) over the
    same input, checked against F.scaled_dot_product_attention. captured: the texts' encoding and the layer's input
    (EncodedTexts, LayerStates), from a capture that feeds the run's other stages too: the model is not run here.
    """
    from attnviz.layer_inputs import LayerStates, check_layer, threads_for
    from attnviz.own_layer import build_layer
    from attnviz.passes import capture_texts

    layer, kv_text, causal, device = spec.layer, spec.kv_text, spec.causal, spec.device
    check_layer(loaded, layer, spec.stack)
    if seed_sizes is None:
        attention = build_layer(loaded, spec)
    else:
        attention = SeedHead(loaded.hidden_size, *seed_sizes, spec.seed).to(device)
    num_heads = attention.num_heads
    if captured is None:
        captured = capture_texts(loaded, texts, spec, [layer])
        captured = captured[0], captured[1][layer]
    encoded, states = captured
    queries, keys = encoded.queries, encoded.keys
    if loaded.dtype != "float32":  # the layouts are checked against each other within 1e-5: float32 over the model's half-precision input
        attention = attention.float()
        query_states = states.queries.float()
        key_states = query_states if states.keys is states.queries else states.keys.float()  # self-attention: still one tensor
        bias = None if states.position_bias is None else states.position_bias.float()
        states = LayerStates(query_states, key_states, bias)
    key_valid_lens = (keys if keys is not None else queries).valid_lens.expand(len(texts))  # (B,)
    if loaded.is_bert:
        source = f"layer_input(bert, encode(texts), layer={layer})"
        kv_source = f"layer_input(bert, encode([kv_text]), layer={layer}).expand(B, -1, -1)"
    else:
        module = loaded.model.attention_module(layer, spec.stack)[0]
        source = f"hidden_states entering {module} (a forward pre-hook)"
        kv_source = f"key/value states entering {module} (a forward pre-hook)"
    inputs = LayerInputs(
        states.queries,
        states.keys,
        valid_lens=key_valid_lens.to(device) if len(texts) > 1 else None,  # a batch shows the padding path
        causal=causal,
        source=source,
        kv_source=kv_source,
        position_bias=states.position_bias,
        position_bias_source="compute_bias(Nq, Nk): the stack's relative position bias (block 0's buckets)",
    )

    with threads_for(encoded):
        if seed_sizes is None:
            traces, checks, slices, mistake_result, notes = trace_layouts(attention, inputs, list(layouts), mistake)
            features, before = beyond_tutorials(attention, inputs), before_scores(attention)
        else:
            with torch.inference_mode():
                traces = [single_head(attention, inputs)]
            checks, slices, mistake_result, notes, features, before = [check_seed_head(attention, inputs, traces[0])], [], None, [], [], []
    return TraceResult(
        texts=list(texts),
        kv_text=kv_text,
        model=loaded.name,
        layer=layer,
        weights=spec.weights,
        num_heads=num_heads,
        head_dim=attention.head_dim,
        num_kv_heads=attention.num_kv_heads,
        scale=None if math.isclose(attention.scale, 1 / math.sqrt(attention.head_dim)) else attention.scale,
        before_scores=before,
        features=features,
        model_size=loaded.hidden_size,
        causal=causal,
        device=device,
        valid_lens=inputs.valid_lens.tolist() if inputs.valid_lens is not None else None,
        layouts=traces,
        checks=checks,
        head_slices=slices,
        mistake=mistake_result,
        notes=notes,
        truncated=queries.truncations,
        kv_truncated=keys.truncations[0] if keys is not None and kv_text is not None else None,
        seed_sizes=seed_sizes,
    )


def seed_head_run(run, traced: TraceResult, index: int):
    """A text's AttentionRun with the seed's single head in place of the layer's heads: its map A (1, Nq, Nk)
    and its output C (Nq, d_out), as the single-head layout computed them (trace_texts' seed_sizes)."""
    [trace] = traced.layouts
    num_queries, num_keys = len(run.query_tokens), len(run.key_tokens)
    attention = trace.weights[index, :, :num_queries, :num_keys].numpy()  # (1, Nq, Nk)
    output = trace.output[index, :num_queries].numpy()  # (Nq, d_out)
    d_q, _ = traced.seed_sizes
    return replace(run, attention=attention, output=output, num_heads=1, num_kv_heads=None, inner_size=d_q, model_heads=None)

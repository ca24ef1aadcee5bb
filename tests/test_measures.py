"""The measures beside the weights, each against a computation of its own written out here.

norm (Kobayashi et al. 2020): the per-head vectors α^h_ij f^h(x_j) built from the model's nn.Linear
weights; value zeroing (Mohebbi et al. 2023): the layer rerun with one key's value vector zeroed,
one key at a time; flow (Abnar & Zuidema 2020): networkx's maximum flow on the graph built here.
All within 1e-5, on the bundled model's real weights and on layers built by hand.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import (
    bert_inputs,
    distances_by_reruns,
    flows_by_networkx,
    linear,
    per_head_vectors,
    weights_and_values,
)

from attnviz.analysis.flow import FLOW_MAX_TOKENS, attention_flow, check_flow_length
from attnviz.analysis.measures import measure_layer, measure_layers
from attnviz.analysis.norms import head_norms, summed_norms, transformed_values
from attnviz.analysis.rollout import attention_rollout
from attnviz.analysis.value_zeroing import value_zeroing_distances
from attnviz.attention.layer import MultiHeadAttention
from attnviz.errors import AttnvizError

TOLERANCE = 1e-5
# Two texts of different lengths in one batch: the shorter is padded, and its measures must not see the padding.
TEXTS = ["The cat sat on the mat, unbelievably.", "我想吃酸菜鱼"]
SHORT_TEXT = "Attention flows."  # 6 tokens with [CLS] and [SEP]: networkx's flows stay quick


@pytest.fixture(scope="module")
def every_layer_spec(plain_spec):
    return replace(plain_spec, layer=None)


@pytest.fixture(scope="module")
def measured(bundled_bert, every_layer_spec):
    """measured[text][layer] for TEXTS, batched together."""
    return measure_layers(bundled_bert, TEXTS, every_layer_spec)


# --- norm -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text_index", [0, 1])
@pytest.mark.parametrize("layer", [0, 3, 5])
def test_head_norms_are_the_norms_of_the_per_head_vectors_built_from_the_weights(bundled_bert, measured, text_index, layer):
    """‖α^h_ij f^h(x_j)‖ per head, and ‖Σ_h α^h_ij f^h(x_j)‖, equal the vectors' norms written out, within 1e-5
    (the second text is padded in its batch: its maps cover its own tokens only)."""
    result = measured[text_index][layer]
    x = bert_inputs(bundled_bert, TEXTS[text_index])[layer]
    vectors = per_head_vectors(bundled_bert.model.encoder.layer[layer], x, bundled_bert.num_heads)  # (H, N, N, D)
    assert result.head_norms.shape == vectors.shape[:3]
    np.testing.assert_allclose(result.head_norms, vectors.norm(dim=-1).numpy(), rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(result.summed_norms, vectors.sum(dim=0).norm(dim=-1).numpy(), rtol=0, atol=TOLERANCE)


def test_the_weights_beside_the_measures_are_the_layers_weights(bundled_bert, measured):
    """Each MeasuredLayer's run holds the weights α^h written out from the same layer and input, within 1e-5."""
    x = bert_inputs(bundled_bert, TEXTS[0])[2]
    alpha, _ = weights_and_values(bundled_bert.model.encoder.layer[2], x, bundled_bert.num_heads)
    np.testing.assert_allclose(measured[0][2].run.attention, alpha.numpy(), rtol=0, atol=TOLERANCE)


def small_layer(num_heads: int = 4, num_kv_heads: int | None = None, seed: int = 0) -> MultiHeadAttention:
    """A random layer of model size 16, its biases non-zero (b_v and b_o must be treated right)."""
    torch.manual_seed(seed)
    layer = MultiHeadAttention(16, num_heads, num_kv_heads=num_kv_heads).double().eval()
    with torch.no_grad():
        for module in (layer.w_q, layer.w_k, layer.w_v, layer.w_o):
            module.bias.normal_()
    return layer


def test_grouped_query_heads_use_the_key_value_head_they_share():
    """With 4 query heads sharing 2 key/value heads, head h's f^h takes value head h // 2's projection
    and W_o's rows of query head h: the norms equal those vectors written out, within 1e-5."""
    layer = small_layer(num_heads=4, num_kv_heads=2)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    output, pattern = layer(x)
    w_v, b_v = linear(layer.w_v)  # (2 * d, D)
    w_o, _ = linear(layer.w_o)  # (D, 4 * d)
    d = 4
    expected_heads, expected_sum = [], 0
    for head in range(4):
        value_rows = slice((head // 2) * d, (head // 2 + 1) * d)
        f = (x[0] @ w_v[value_rows].T + b_v[value_rows]) @ w_o[:, head * d : (head + 1) * d].T  # (N, D)
        vectors = pattern[0, head, :, :, None] * f[None]  # (N, N, D)
        expected_heads.append(vectors.norm(dim=-1))
        expected_sum = expected_sum + vectors
    transformed = transformed_values(layer, x)
    np.testing.assert_allclose(head_norms(pattern, transformed)[0].detach(), torch.stack(expected_heads).detach(), atol=TOLERANCE)
    np.testing.assert_allclose(summed_norms(pattern, transformed)[0].detach(), expected_sum.norm(dim=-1).detach(), atol=TOLERANCE)


def test_a_head_with_all_its_weight_on_one_key_has_that_keys_norm():
    """Under a causal mask the first token sees only itself: every head's weight there is 1 on key 0, so
    its norm is ‖f^h(x_0)‖ and 0 on every other key, and the heads' sum is the output less b_o."""
    layer = small_layer()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    output, pattern = layer(x, causal=True)
    w_v, b_v = linear(layer.w_v)
    w_o, b_o = linear(layer.w_o)
    transformed = transformed_values(layer, x)
    norms = head_norms(pattern, transformed)[0].detach()  # (H, N, N)
    for head in range(4):
        rows = slice(head * 4, (head + 1) * 4)
        f_0 = (x[0, 0] @ w_v[rows].T + b_v[rows]) @ w_o[:, rows].T  # (D,)
        assert norms[head, 0, 0].item() == pytest.approx(f_0.norm().item(), abs=TOLERANCE)
        assert torch.all(norms[head, 0, 1:] == 0)
    summed = summed_norms(pattern, transformed)[0].detach()
    assert summed[0, 0].item() == pytest.approx((output[0, 0] - b_o).norm().item(), abs=TOLERANCE)


# --- value zeroing -----------------------------------------------------------------------------


@pytest.mark.parametrize("text_index", [0, 1])
@pytest.mark.parametrize("layer", [0, 4])
def test_value_zeroing_equals_rerunning_the_layer_with_each_value_zeroed(bundled_bert, measured, text_index, layer):
    """For each key j, the layer rerun with v_j = 0: the cosine distance of each token's output from its
    original equals the value-zeroing map within 1e-5; the rows map is each row divided by its sum."""
    from attnviz.attention.layer import layer_from_weights

    bert_layer = bundled_bert.model.encoder.layer[layer]
    attention = layer_from_weights(bert_layer.attention_weights()).eval()
    x = bert_inputs(bundled_bert, TEXTS[text_index])[layer].float()[None]  # (1, N, D)
    expected = distances_by_reruns(attention, x, x)
    result = measured[text_index][layer]
    np.testing.assert_allclose(result.value_zeroing, expected, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(result.value_zeroing_rows, expected / expected.sum(axis=1, keepdims=True), rtol=0, atol=TOLERANCE)


def test_value_zeroing_of_a_grouped_query_layer_under_a_causal_mask():
    """Rerunning a grouped-query layer key by key: equal within 1e-5; keys a query cannot see change nothing (0)."""
    layer = small_layer(num_heads=4, num_kv_heads=2, seed=1)
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    _, pattern = layer(x, causal=True)
    distances = value_zeroing_distances(layer, x, pattern)[0].detach().numpy()
    np.testing.assert_allclose(distances, distances_by_reruns(layer, x, x, causal=True), rtol=0, atol=TOLERANCE)
    assert np.all(distances[np.triu_indices(7, k=1)] == 0)


def test_value_zeroing_keeps_what_other_keys_add_when_one_key_carries_almost_all():
    """An attention sink without b_o: every head puts 1 - 1e-5 of each row on key 0, so zeroing v_0 leaves an
    output 1e-5 the size of the original. Its distance equals the altered output written out directly
    (b_o + Σ_h Σ_(k≠j) α^h_ik f^h(x_k), no subtraction), within 1e-5; an output that vanishes is at 1."""
    torch.manual_seed(2)
    layer = MultiHeadAttention(16, 4, out_bias=False).eval()  # float32, as models run
    x = torch.randn(1, 6, 16)
    rest = torch.rand(1, 4, 6, 5, dtype=torch.float64)
    pattern = torch.cat([torch.ones(1, 4, 6, 1, dtype=torch.float64), 1e-5 * rest / rest.sum(-1, keepdim=True)], dim=-1)
    pattern = pattern / pattern.sum(-1, keepdim=True)  # (1, H, N, N): rows sum to 1, key 0 holds 1 - 1e-5
    pattern[0, :, 0] = torch.tensor([1.0, 0, 0, 0, 0, 0], dtype=torch.float64)  # token 0: all on key 0
    pattern = pattern.float()
    f = transformed_values(layer, x)[0].detach()  # (H, N, D) float64, trusted: checked against the weights above
    expected = np.zeros((6, 6))
    for i in range(6):
        output = (pattern[0, :, i, :, None].double() * f).sum(dim=(0, 1))  # (D,)
        for j in range(6):
            keep = [k for k in range(6) if k != j]
            altered = (pattern[0, :, i, keep, None].double() * f[:, keep]).sum(dim=(0, 1))
            cosine = torch.nn.functional.cosine_similarity(output, altered, dim=0)  # 0 for a zero vector
            expected[i, j] = 1 - cosine.item()
    distances = value_zeroing_distances(layer, x, pattern)[0].detach().numpy()
    np.testing.assert_allclose(distances, expected, rtol=0, atol=TOLERANCE)
    assert distances[0, 0] == 1 and 0.01 < distances[1:, 0].min()  # the sink's removal turns the outputs


def test_value_zeroing_distances_are_cosine_distances(measured):
    """0 <= distance <= 2 everywhere, every row has a key that changes something, and each rows-map row sums to 1."""
    for text in measured:
        for result in text:
            assert np.all(result.value_zeroing >= 0) and np.all(result.value_zeroing <= 2)
            assert np.all(result.value_zeroing.max(axis=1) > 0)
            np.testing.assert_allclose(result.value_zeroing_rows.sum(axis=1), 1, atol=1e-12)


def test_one_layer_measured_alone_equals_that_layer_of_every_layer(bundled_bert, plain_spec, measured):
    """measure_layer (run_attention's path: the model's own hidden states) and measure_layers (attnviz's layers
    in BERT's place) give the same weights and measures for a layer, within 1e-5."""
    alone = measure_layer(bundled_bert, TEXTS, replace(plain_spec, layer=3))
    for text_index, result in enumerate(alone):
        together = measured[text_index][3]
        assert result.run.query_tokens == together.run.query_tokens and result.run.layer == 3
        for name in ("head_norms", "summed_norms", "value_zeroing", "value_zeroing_rows"):
            np.testing.assert_allclose(getattr(result, name), getattr(together, name), rtol=0, atol=TOLERANCE, err_msg=name)
        np.testing.assert_allclose(result.run.attention, together.run.attention, rtol=0, atol=TOLERANCE)


def test_cross_attention_measures_zero_the_other_texts_values(bundled_bert, plain_spec):
    """With --kv's text as keys and values, the norms and value zeroing are over that text's tokens, and
    equal the per-head vectors and the reruns built from its states, within 1e-5."""
    from attnviz.attention.layer import layer_from_weights

    (result,) = measure_layer(bundled_bert, [TEXTS[0]], replace(plain_spec, layer=1, kv_text=SHORT_TEXT))
    queries = bert_inputs(bundled_bert, TEXTS[0])[1].float()[None]  # (1, Nq, D)
    keys = bert_inputs(bundled_bert, SHORT_TEXT)[1].float()[None]  # (1, Nk, D)
    attention = layer_from_weights(bundled_bert.model.encoder.layer[1].attention_weights()).eval()
    assert result.value_zeroing.shape == (queries.shape[1], keys.shape[1])
    np.testing.assert_allclose(result.value_zeroing, distances_by_reruns(attention, queries, keys), rtol=0, atol=TOLERANCE)
    with torch.no_grad():
        _, pattern = attention(queries, keys, keys)
        expected = pattern[0, :, :, :, None].double() * transformed_values(attention, keys)[0, :, None].double()
    np.testing.assert_allclose(result.head_norms, expected.norm(dim=-1).numpy(), rtol=0, atol=TOLERANCE)


def test_a_grouped_query_decoder_measured_against_its_weights_and_reruns(tmp_path):
    """A tiny Llama (6 query heads over 2 key/value heads, RoPE, its own causal mask), two texts in a padded
    batch: each layer's norms equal the vectors built from transformers' v_proj and o_proj weights, and
    value zeroing equals the layer rerun key by key, within 1e-5."""
    from tiny_families import build_checkpoint

    from attnviz.models.loading import load_model
    from attnviz.layer_inputs import encode_texts
    from attnviz.own_layer import build_layer
    from attnviz.passes import capture_states
    from attnviz.spec import run_spec

    model = build_checkpoint("llama", tmp_path / "llama")
    loaded = load_model(str(tmp_path / "llama"))
    spec = run_spec(loaded, str(tmp_path / "llama"), layer=None)
    texts = ["The cat sat on the mat because it was tired.", "Attention is all."]
    measured = measure_layers(loaded, texts, spec)
    for layer, block in enumerate(model.layers):  # a LlamaModel: no head
        w_v, w_o = block.self_attn.v_proj.weight.detach().double(), block.self_attn.o_proj.weight.detach().double()
        head_dim = w_o.shape[1] // 6
        for text, result in zip(texts, (text_layers[layer] for text_layers in measured)):
            layer_spec = replace(spec, layer=layer)
            # (1, N, D): what the layer ran over (attnviz's layers in the model's place below it: passes.capture_states)
            x = capture_states(loaded, encode_texts(loaded, [text], layer_spec), [layer], layer_spec)[layer].queries
            alpha = torch.from_numpy(result.run.attention).double()  # (H, N, N)
            vectors = torch.stack([
                alpha[head, :, :, None]
                * ((x[0].double() @ w_v[(head // 3) * head_dim : (head // 3 + 1) * head_dim].T)
                   @ w_o[:, head * head_dim : (head + 1) * head_dim].T)[None]
                for head in range(6)
            ])  # (H, N, N, D): query head h shares key/value head h // 3
            np.testing.assert_allclose(result.head_norms, vectors.norm(dim=-1).numpy(), rtol=0, atol=TOLERANCE)
            np.testing.assert_allclose(result.summed_norms, vectors.sum(dim=0).norm(dim=-1).numpy(), rtol=0, atol=TOLERANCE)
            expected = distances_by_reruns(build_layer(loaded, layer_spec), x, x, causal=True)
            np.testing.assert_allclose(result.value_zeroing, expected, rtol=0, atol=TOLERANCE)


# --- flow ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_text_layers(bundled_bert, every_layer_spec):
    (layers,) = measure_layers(bundled_bert, [SHORT_TEXT], every_layer_spec)
    return [result.run.attention for result in layers]  # 6 layers of (H, N, N)


def test_flow_equals_networkx_maximum_flow_on_the_layers_graph(short_text_layers):
    """Flow through the bundled model's 6 layers equals networkx's maximum flows within 1e-5, and its
    normalised map is each row divided by its sum."""
    assert short_text_layers[0].shape[-1] <= 8
    expected = flows_by_networkx(short_text_layers)
    flow = attention_flow(short_text_layers)
    np.testing.assert_allclose(flow.flow, expected, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(flow.normalised, expected / expected.sum(axis=1, keepdims=True), rtol=0, atol=TOLERANCE)


def test_flow_from_a_token_never_exceeds_one(measured):
    """Each token's capacity out of the last layer is 1: no flow exceeds it, and every input token gets some."""
    flow = attention_flow([result.run.attention for result in measured[1]]).flow
    assert flow.max() <= 1 and flow.min() > 0


def test_flow_through_one_layer_is_its_residual_attention_as_rollout_is():
    """With one layer the graph's only path from i to j is the edge A'[i, j]: flow and rollout both equal
    (mean_h A_h + I) / 2, within the flow's resolution."""
    rng = np.random.default_rng(0)
    weights = rng.random((3, 5, 5))
    weights /= weights.sum(axis=-1, keepdims=True)  # (H, N, N), rows summing to 1
    expected = (weights.mean(axis=0) + np.eye(5)) / 2
    np.testing.assert_allclose(attention_flow([weights]).flow, expected, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(attention_rollout([weights]), expected, rtol=0, atol=1e-12)


def test_flow_refuses_a_text_longer_than_it_handles():
    """A text of FLOW_MAX_TOKENS + 1 tokens is refused at once, in one line that names the limit and the length."""
    check_flow_length(FLOW_MAX_TOKENS)
    message = f"flow handles texts of up to {FLOW_MAX_TOKENS} tokens (about 10 s); this text has {FLOW_MAX_TOKENS + 1}"
    with pytest.raises(AttnvizError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_flow_length(FLOW_MAX_TOKENS + 1)
    too_long = np.full((1, FLOW_MAX_TOKENS + 1, FLOW_MAX_TOKENS + 1), 1 / (FLOW_MAX_TOKENS + 1))
    with pytest.raises(AttnvizError, match="this text has"):
        attention_flow([too_long] * 6)

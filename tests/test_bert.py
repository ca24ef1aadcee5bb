"""With BERT's weights copied in, attnviz's layer reproduces BERT's own attention.

The reference is transformers' BertModel itself (eager attention, output_attentions=True)
on the bundled all-MiniLM-L6-v2, for every layer, for one text and for a padded batch.
"""

import numpy as np
import pytest
import torch

from attnviz.analysis.statistics import summarize_heads
from attnviz.models.tokens import encode
from attnviz.layer_inputs import embedding_output, layer_input
from attnviz.own_layer import build_layer
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec

TOLERANCE = 1e-5
SHORT = "The cat sat on the mat."
LONG = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def loaded(bundled_bert):
    return bundled_bert


@pytest.fixture(scope="module")
def reference(reference_bert):
    return reference_bert


def bert_reference(reference, texts, layer):
    """transformers' own outputs (attentions (B, H, N, N), hidden states) and its attention-output dense result (B, N, D)."""
    tokenizer, model = reference
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    captured = {}
    dense = model.encoder.layer[layer].attention.output.dense
    handle = dense.register_forward_hook(lambda module, inputs, output: captured.setdefault("out", output))
    try:
        with torch.no_grad():
            outputs = model(**batch, output_attentions=True, output_hidden_states=True)
    finally:
        handle.remove()
    return outputs, captured["out"], batch["attention_mask"].sum(1).tolist()


def test_the_reference_is_transformers_bert_with_eager_attention(loaded, reference):
    assert reference[1].config._attn_implementation == "eager"
    assert (loaded.num_layers, loaded.num_heads, loaded.hidden_size) == (6, 12, 384)


@pytest.mark.parametrize("texts", [[LONG], [SHORT, LONG], ["我想吃酸菜鱼 and Café naïve 👍"]])
def test_our_tokens_and_every_hidden_state_equal_transformers(loaded, reference, texts):
    tokenizer, _ = reference
    outputs, _, lengths = bert_reference(reference, texts, 0)
    encoded = encode(loaded.tokenizer, texts, loaded.max_positions)
    assert encoded.ids == [tokenizer(text)["input_ids"] for text in texts]
    with torch.no_grad():
        states = loaded.model(**encoded.model_inputs("cpu"))
    assert len(states) == len(outputs.hidden_states) == 7
    for ours, theirs in zip(states, outputs.hidden_states):
        for i, n in enumerate(lengths):  # padding positions are not compared: nothing reads them
            torch.testing.assert_close(ours[i, :n], theirs[i, :n], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("layer", range(6))
def test_single_text_weights_and_output_equal_berts_for_every_layer(loaded, reference, layer):
    outputs, dense_out, _ = bert_reference(reference, [LONG], layer)
    (run,) = run_attention(loaded, [LONG], run_spec(loaded, layer=layer))

    expected = outputs.attentions[layer][0].numpy()  # (H, N, N)
    assert run.attention.shape == expected.shape == (12, 16, 16)
    np.testing.assert_allclose(run.attention, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(run.output, dense_out[0].numpy(), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("layer", range(6))
def test_padded_batch_equals_berts_batch_and_each_text_alone(loaded, reference, layer):
    outputs, dense_out, lengths = bert_reference(reference, [SHORT, LONG], layer)
    runs = run_attention(loaded, [SHORT, LONG], run_spec(loaded, layer=layer))

    assert [len(run.query_tokens) for run in runs] == lengths == [9, 16]
    for i, run in enumerate(runs):
        n = lengths[i]
        np.testing.assert_allclose(run.attention, outputs.attentions[layer][i, :, :n, :n].numpy(), atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(run.output, dense_out[i, :n].numpy(), atol=TOLERANCE, rtol=0)
        (alone,) = run_attention(loaded, [run.text], run_spec(loaded, layer=layer))
        np.testing.assert_allclose(run.attention, alone.attention, atol=TOLERANCE, rtol=0)


def test_padding_keys_get_exactly_zero_and_rows_sum_to_one(loaded):
    encoded = encode(loaded.tokenizer, [SHORT, LONG], loaded.max_positions)
    layer = build_layer(loaded, run_spec(loaded, layer=2, num_heads=12))
    with torch.no_grad():
        _, weights = layer(layer_input(loaded, encoded, 2, "cpu"), valid_lens=encoded.valid_lens)
    assert torch.all(weights[0, :, :, 9:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 12, 16), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("layer", [0, 3, 5])
def test_layer_input_is_berts_hidden_state(loaded, reference, layer):
    outputs, _, _ = bert_reference(reference, [LONG], layer)
    encoded = encode(loaded.tokenizer, [LONG], loaded.max_positions)
    hidden = layer_input(loaded, encoded, layer, "cpu")
    torch.testing.assert_close(hidden, outputs.hidden_states[layer], atol=TOLERANCE, rtol=0)


def test_random_weights_are_reproducible_by_seed_and_nearly_uniform(loaded):
    (first,) = run_attention(loaded, [LONG], run_spec(loaded, weights="random", seed=7))
    (again,) = run_attention(loaded, [LONG], run_spec(loaded, weights="random", seed=7))
    (other,) = run_attention(loaded, [LONG], run_spec(loaded, weights="random", seed=8))
    (bert,) = run_attention(loaded, [LONG], run_spec(loaded, weights="pretrained"))

    np.testing.assert_array_equal(first.attention, again.attention)
    assert not np.allclose(first.attention, other.attention)
    # The tutorials' blind spot: a random layer spreads attention almost evenly; BERT's heads do not.
    random_spread = min(summary.relative_entropy for summary in summarize_heads(first.attention))
    bert_spread = min(summary.relative_entropy for summary in summarize_heads(bert.attention))
    assert random_spread > 0.95 > 0.6 > bert_spread


def test_resplitting_berts_projections_into_other_head_counts(loaded):
    (run,) = run_attention(loaded, [SHORT], run_spec(loaded, num_heads=4))
    assert run.attention.shape == (4, 9, 9) and run.head_dim == 96
    np.testing.assert_allclose(run.attention.sum(-1), 1, atol=TOLERANCE)


def test_cross_attention_is_rectangular_with_each_sides_tokens(loaded):
    (run,) = run_attention(loaded, [SHORT], run_spec(loaded, kv_text=LONG))
    assert run.attention.shape == (12, 9, 16)
    assert run.query_tokens[1] == "the" and run.key_tokens[2] == "animal"
    np.testing.assert_allclose(run.attention.sum(-1), 1, atol=TOLERANCE)


def test_causal_rows_have_zeros_above_the_diagonal(loaded):
    (run,) = run_attention(loaded, [SHORT], run_spec(loaded, causal=True))
    above = np.triu(np.ones((9, 9), dtype=bool), 1)
    assert np.all(run.attention[:, above] == 0)
    assert np.all(run.attention[:, ~above] > 0)


def test_mostly_unknown_tokens_warn_and_name_a_better_model(loaded):
    (run,) = run_attention(loaded, ["我想吃酸菜鱼"], run_spec(loaded))
    assert run.query_tokens[0] == "[CLS]" and run.query_tokens[-1] == "[SEP]" and len(run.query_tokens) == 8
    assert any("[UNK]" in note and "bert-base-chinese" in note for note in run.notes)
    (english,) = run_attention(loaded, [LONG], run_spec(loaded))
    assert english.notes == []


def test_embedding_output_is_layer_zeros_input_and_differs_without_positions(loaded):
    encoded = encode(loaded.tokenizer, [SHORT, LONG], loaded.max_positions)
    with_positions = embedding_output(loaded, encoded, "cpu")
    torch.testing.assert_close(with_positions, layer_input(loaded, encoded, 0, "cpu"), atol=TOLERANCE, rtol=0)
    without = embedding_output(loaded, encoded, "cpu", positions=False)
    assert (without - with_positions).abs().max() > 0.1

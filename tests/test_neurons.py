"""The neuron view's numbers (analysis/neurons.py): each head's q and k, checked against transformers' own modules.

For a Llama (grouped-query heads, RoPE) the reference q and k are computed here from transformers' LlamaAttention:
its q_proj and k_proj applied to the hidden states that enter it, split into heads as it splits them, rotated by its
own apply_rotary_pos_emb with the position embeddings the model passes it. For BERT, softmax(scale * q · k) must
be transformers' eager attentions. The report's record holds them to 4 decimals for texts of at most 64 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnviz
from attnviz.errors import AttnvizError
from helpers import decoded
from tiny_families import build_checkpoint

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama") / "llama"
    return folder, build_checkpoint("llama", folder)


def transformers_q_and_k(model, folder, text: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """q (H, N, d) and k (H_kv, N, d) after RoPE, as transformers' LlamaAttention of `layer` makes them."""
    import transformers
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attention = model.layers[layer].self_attn
    seen = {}

    def keep(module, args, kwargs):
        seen["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["position_embeddings"] = kwargs["position_embeddings"]

    hook = attention.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        batch = transformers.AutoTokenizer.from_pretrained(folder)([text], return_tensors="pt")
        with torch.no_grad():
            model(**batch)
            hidden = seen["hidden"]
            shape = (*hidden.shape[:-1], -1, attention.head_dim)
            q = attention.q_proj(hidden).view(shape).transpose(1, 2)  # (1, H, N, d)
            k = attention.k_proj(hidden).view(shape).transpose(1, 2)  # (1, H_kv, N, d)
            cos, sin = seen["position_embeddings"]
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
    finally:
        hook.remove()
    return q[0].numpy(), k[0].numpy()


@pytest.mark.parametrize("layer", [0, 1])
def test_llamas_q_and_k_are_transformers_own_after_rope_one_k_per_key_value_head(tiny_llama, layer):
    folder, model = tiny_llama
    result = attnviz.heads(TEXT, model=str(folder), layer=layer, device="cpu", vectors=True)
    expected_q, expected_k = transformers_q_and_k(model, folder, TEXT, layer)
    vectors = result.vectors
    assert vectors.q.shape == expected_q.shape and vectors.k.shape == expected_k.shape == (2, len(result.tokens), 8)
    np.testing.assert_allclose(vectors.q, expected_q, atol=1e-5, rtol=0)
    np.testing.assert_allclose(vectors.k, expected_k, atol=1e-5, rtol=0)
    assert vectors.group_size == 3 and vectors.scale == pytest.approx(8**-0.5)
    # the scaled scores, causally masked and softmaxed, are the run's map
    scores = vectors.scale * vectors.scores()  # (H, N, N)
    scores[:, np.triu(np.ones(scores.shape[1:], dtype=bool), k=1)] = -np.inf
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(weights / weights.sum(axis=-1, keepdims=True), result.attention.numpy(), atol=1e-6, rtol=0)


def test_berts_scaled_q_dot_k_softmaxed_is_transformers_eager_attention(reference_bert):
    tokenizer, bert = reference_bert
    with torch.no_grad():
        expected = bert(**tokenizer([TEXT], return_tensors="pt"), output_attentions=True).attentions[2][0].numpy()
    vectors = attnviz.heads(TEXT, model="bundled", layer=2, device="cpu", vectors=True).vectors
    scores = vectors.scale * vectors.scores()
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(weights / weights.sum(axis=-1, keepdims=True), expected, atol=1e-5, rtol=0)


def test_the_report_holds_the_vectors_in_float32_of_a_short_text_only():
    model = attnviz.load("bundled", device="cpu")
    result = attnviz.heads(TEXT, model=model, layer=1, vectors=True)
    (text,) = attnviz.report(TEXT, model=model, layer=1).record["texts"]
    # one computation: heads' run and the report's are the same projection of the same capture, the map's own, so the
    # report's float32 vectors are heads', exactly (on any CPU and thread count)
    for record in (text, result.report().record["texts"][0]):
        assert record["vectors"]["q"]["dtype"] == record["vectors"]["k"]["dtype"] == "float32"
        np.testing.assert_array_equal(decoded(record["vectors"]["q"]), result.vectors.q.astype(np.float64))
        np.testing.assert_array_equal(decoded(record["vectors"]["k"]), result.vectors.k.astype(np.float64))
    assert text["vectors"]["scale"] == result.vectors.scale and text["vectors"]["group_size"] == 1
    long_text = " ".join(["the cat"] * 40)  # 82 tokens: past 64
    (long_record,) = attnviz.report(long_text, model=model).record["texts"]
    assert "vectors" not in long_record
    assert attnviz.heads(long_text, model=model, vectors=None).vectors is None
    assert attnviz.heads(TEXT, model=model).vectors is None  # asked for only


def test_vectors_are_of_one_text_over_tokens():
    with pytest.raises(AttnvizError, match="^vectors=True gives one text's query and key vectors over its tokens"):
        attnviz.heads([TEXT, TEXT], model="bundled", device="cpu", vectors=True)
    with pytest.raises(AttnvizError, match="^vectors=True gives one text's"):
        attnviz.heads(TEXT, model="bundled", device="cpu", vectors=True, words=True)

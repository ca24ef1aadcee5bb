"""The capture pass's attention (attnviz/models/blocked_attention.py): transformers' model run with it gives eager
attention's hidden states, for every family: a padded batch, or one text whose scores fit one block, through attnviz's
blocks of queries (eager's very operations); one text past a block through SDPA's fused kernels."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaAttention, eager_attention_forward

from attnviz.models import blocked_attention
from tiny_families import FAMILY_CHECKPOINTS, build_checkpoint

TEXTS = ["The cat sat on the mat because it was tired.", "A dog."]
CASES = {"padded batch": (TEXTS, False), "one text": (TEXTS[:1], False), "one text past a block": (TEXTS[:1], True)}


@pytest.mark.parametrize(
    "case", ["padded batch", pytest.param("one text", marks=pytest.mark.slow), pytest.param("one text past a block", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("model_type", sorted(FAMILY_CHECKPOINTS))
def test_every_family_runs_with_the_capture_attention_and_gives_eagers_hidden_states(model_type, case, tmp_path, monkeypatch):
    texts, past_a_block = CASES[case]
    if past_a_block:  # blocks of one query: a text past one block
        monkeypatch.setattr(blocked_attention, "BLOCK_BYTES", {"cpu": 1})
    model = build_checkpoint(model_type, tmp_path)
    encoded = transformers.AutoTokenizer.from_pretrained(tmp_path)(texts, return_tensors="pt", padding=True)
    inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    if model.config.is_encoder_decoder:
        inputs |= {"decoder_input_ids": encoded["input_ids"][:, :6], "decoder_attention_mask": encoded["attention_mask"][:, :6]}
    states = {}
    for implementation in ("eager", "sdpa", blocked_attention.register()):
        model.set_attn_implementation(implementation)
        with torch.inference_mode():
            states[implementation] = model(**inputs, output_hidden_states=True)
    hidden = "decoder_hidden_states" if model.config.is_encoder_decoder else "hidden_states"
    real = encoded["attention_mask"][:, :6 if model.config.is_encoder_decoder else None].bool()  # padding rows aside
    layers = zip(states["eager"][hidden], states["sdpa"][hidden], states[blocked_attention.NAME][hidden], strict=True)
    for eager, sdpa, found in layers:
        if not past_a_block:  # one block: eager's very operations
            torch.testing.assert_close(found[real], eager[real], atol=1e-6, rtol=0)
            continue
        if model_type != "t5":  # SDPA's fused kernels (T5 adds its position bias to the scores: blocks of one query)
            torch.testing.assert_close(found[real], sdpa[real], atol=1e-6, rtol=0)
        torch.testing.assert_close(found[real], eager[real], atol=1e-4, rtol=1e-4)  # float32 rounding over the layers


@pytest.mark.parametrize("with_mask", [False, True])
def test_many_small_blocks_equal_eager_attention_with_grouped_query_heads(with_mask):
    """Blocks of 3 queries against transformers' eager_attention_forward: 8 query heads over 2 key/value heads."""
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2)
    module = LlamaAttention(config, layer_idx=0).eval()
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 8, 17, 8, generator=generator)
    key, value = torch.randn(2, 2, 17, 8, generator=generator), torch.randn(2, 2, 17, 8, generator=generator)
    allowed = torch.ones(17, 17, dtype=torch.bool).tril()[None, None].expand(2, 1, 17, 17).clone()
    allowed[1, :, :, 12:] = False  # the second text is 12 tokens and padding
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    expected, _ = eager_attention_forward(module, query, key, value, additive, scaling=8**-0.5)
    mask = allowed if with_mask else None  # None: the module's causal flag masks the later keys
    block = 2 * 2 * 8 * 3 * 17 * 4  # 3 queries a block
    found, weights = blocked_attention.blocked_attention(module, query, key, value, mask, scaling=8**-0.5, block_bytes=block)
    assert weights is None
    if not with_mask:
        expected_unpadded, _ = eager_attention_forward(module, query, key, value, additive[:1].expand(2, 1, 17, 17), scaling=8**-0.5)
        torch.testing.assert_close(found, expected_unpadded, atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(found, expected, atol=1e-6, rtol=0)

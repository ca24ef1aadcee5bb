"""attnviz's own layer gives every family's real attention: transformers' eager output_attentions, every layer.

For each family a tiny random checkpoint is built with transformers' own classes and saved as
safetensors (tiny_families.py); attnviz loads the folder as a user's, runs a padded batch of
two texts through its layer, and each text's weights must equal what transformers' model
(attn_implementation="eager", output_attentions=True) computes, within 1e-5, on every layer:
self-attention, and for encoder-decoders the decoder's self-attention and its cross-attention
over the encoder, with the decoder reading the text shifted right as transformers shifts it.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from attnviz.models.loading import load_model
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec
from tiny_families import FAMILY_CHECKPOINTS, build_checkpoint

TEXTS = ["The cat sat on the mat because it was tired.", "Attention is all."]  # two lengths: a padded batch
SOURCE = "我想吃酸菜鱼"
TOLERANCE = 1e-5
ENCODER_DECODERS = ("bart", "marian", "t5")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """model_type -> (folder, transformers' model): built once for the module."""
    root = tmp_path_factory.mktemp("families")
    return {model_type: (root / model_type, build_checkpoint(model_type, root / model_type)) for model_type in FAMILY_CHECKPOINTS}


@functools.cache
def load(folder):
    """attnviz's load of a checkpoint folder, once per module run (the checks only read it)."""
    return load_model(str(folder))


def reference_attentions(model, folder, texts: list[str], stack: str | None, source: str | None = None) -> tuple:
    """transformers' eager attentions of a padded batch: one (B, H, Nq, Nk) per layer of the stack."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        if stack is None:
            return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True).attentions
        # The decoder reads the texts shifted right behind its start token: transformers' own shift (BART's public
        # function; T5's is the same shift, its start token the pad token).
        decoder_ids = transformers.models.bart.modeling_bart.shift_tokens_right(
            batch.input_ids, model.config.pad_token_id, model.config.decoder_start_token_id
        )
        encoder = batch if source is None else tokenizer([source] * len(texts), return_tensors="pt")
        outputs = model(
            input_ids=encoder.input_ids,
            attention_mask=encoder.attention_mask,
            decoder_input_ids=decoder_ids,
            decoder_attention_mask=batch.attention_mask,
            output_attentions=True,
        )
    return {"encoder": outputs.encoder_attentions, "decoder": outputs.decoder_attentions, "cross": outputs.cross_attentions}[stack]


def assert_equal_to_reference(loaded, model, folder, stack: str | None, kv_text: str | None = None) -> None:
    references = reference_attentions(model, folder, TEXTS, stack, kv_text)
    assert len(references) == loaded.num_layers_of(stack) == 2
    peak = 0.0  # the largest weight, as a multiple of the uniform 1 / keys
    for layer, reference in enumerate(references):
        runs = run_attention(loaded, TEXTS, run_spec(loaded, str(folder), layer=layer, stack=stack, kv_text=kv_text))
        for index, run in enumerate(runs):
            _, queries, keys = run.attention.shape
            expected = reference[index, :, :queries, :keys]
            assert run.attention.shape == expected.shape
            assert torch.allclose(torch.from_numpy(run.attention), expected, atol=TOLERANCE, rtol=0), (stack, layer, index)
            peak = max(peak, float(expected.max()) * keys)
            assert run.causal == (loaded.family.kind == "decoder" or stack == "decoder")
    assert peak > 3  # far from uniform: a wrong rotation, scale or mask would show
    # The layers differ from each other, so matching each one's own reference says something.
    assert not torch.allclose(references[0], references[1], atol=1e-3)


@pytest.mark.parametrize("model_type", [t for t in FAMILY_CHECKPOINTS if t not in ENCODER_DECODERS])
def test_every_layer_equals_transformers_eager_attentions(checkpoints, model_type):
    folder, model = checkpoints[model_type]
    loaded = load(folder)

    assert loaded.family.model_types[0] == model_type and not loaded.is_bert
    assert_equal_to_reference(loaded, model, folder, stack=None)


@pytest.mark.parametrize("model_type", ENCODER_DECODERS)
@pytest.mark.parametrize("stack", ["encoder", "decoder", "cross"])
def test_every_stack_of_an_encoder_decoder_equals_transformers(checkpoints, model_type, stack):
    folder, model = checkpoints[model_type]
    assert_equal_to_reference(load(folder), model, folder, stack)


@pytest.mark.parametrize("model_type", ENCODER_DECODERS)
def test_cross_attention_over_a_source_text_given_with_kv(checkpoints, model_type):
    folder, model = checkpoints[model_type]
    loaded = load(folder)
    assert_equal_to_reference(loaded, model, folder, "cross", kv_text=SOURCE)

    [run, _] = run_attention(loaded, TEXTS, run_spec(loaded, str(folder), layer=0, kv_text=SOURCE))
    assert run.stack == "cross"  # --kv on an encoder-decoder means its cross-attention
    assert run.key_tokens == loaded.tokenizer.convert_ids_to_tokens(loaded.tokenizer.encode_batch([SOURCE])[0])


def test_grouped_query_heads_share_their_key_value_heads(checkpoints):
    """Llama's 6 query heads over 2 key/value heads: heads of one group see the same keys, rotated alike."""
    folder, _ = checkpoints["llama"]
    loaded = load(folder)
    [run, _] = run_attention(loaded, TEXTS, run_spec(loaded, str(folder), layer=0))

    assert (run.num_heads, run.num_kv_heads, loaded.num_kv_heads) == (6, 2, 2)
    # A decoder's own mask: nothing above the diagonal, and the run says the mask is the model's.
    assert run.model_causal and not run.attention[:, torch.triu_indices(12, 12, 1)[0], torch.triu_indices(12, 12, 1)[1]].any()

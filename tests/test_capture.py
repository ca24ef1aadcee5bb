"""One pass, one capture (issue 45): every stage a command shows reads one capture of the text, so a number shown in
two places is one float.

The capture's own numbers are checked elsewhere (a layer's map against transformers' eager attentions, the traces
against torch's MultiheadAttention); here, that the stages that read it agree bit for bit where they are one
computation, and within float32 where a padded batch's pass stands in for each text's own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import decoded

import attnviz
from attnviz.layer_inputs import text_captures
from attnviz.passes import capture_texts
from attnviz.pipeline import run_layers

TEXT = "The cat sat on the mat because it was tired."
OTHERS = ["A dog barked at the moon all night long, and nobody slept.", "短"]


@pytest.fixture(scope="module")
def bert():
    return attnviz.load("bundled", device="cpu")


def test_heads_report_is_attnviz_reports_record_exactly(bert):
    result = attnviz.heads(TEXT, model=bert, layer=3, report=True)
    expected = attnviz.report(TEXT, model=bert, layer=3).record
    assert result.report().record == expected
    assert result.vectors is None  # asked for only: the report holds them
    assert expected["texts"][0]["vectors"] is not None and expected["texts"][0]["layers"] is not None


def test_a_berts_layer_is_the_same_float_in_heads_and_in_layers_every_layer_in_its_place(bert):
    every = attnviz.layers(TEXT, model=bert).attention  # (L, H, N, N): attnviz's layers in BERT's place
    for layer in (0, 3, 5):
        torch.testing.assert_close(attnviz.heads(TEXT, model=bert, layer=layer).attention, every[layer], rtol=0, atol=0)


def test_a_decoders_layer_is_the_same_float_in_heads_and_in_layers(decoder_folder):
    model = attnviz.load(str(decoder_folder), device="cpu")
    every = attnviz.layers(TEXT, model=model).attention
    torch.testing.assert_close(attnviz.heads(TEXT, model=model, layer=1).attention, every[1], rtol=0, atol=0)


def test_run_layers_over_a_capture_is_its_own_pass_bit_for_bit(decoder_folder):
    handle = attnviz.load(str(decoder_folder), device="cpu")
    model, spec = handle.loaded, attnviz.RunOptions(model=handle).run_spec(handle, layer=None)
    texts = [TEXT, *OTHERS]
    captured = capture_texts(model, texts, spec)
    for own, read in zip(run_layers(model, texts, spec), run_layers(model, texts, spec, captured=captured)):
        for expected, run in zip(own, read):
            np.testing.assert_array_equal(run.attention, expected.attention)
            np.testing.assert_array_equal(run.output, expected.output)
    assert len(captured[1]) == 2  # the caller's capture is read, not emptied


def test_each_texts_cut_of_a_batch_capture_is_its_own_capture_within_float32(bert):
    spec = attnviz.RunOptions(model=bert).run_spec(bert, layer=None)
    texts = [TEXT, *OTHERS]
    cut = text_captures(capture_texts(bert.loaded, texts, spec))
    for text, (encoded, states) in zip(texts, cut):
        own_encoded, own_states = capture_texts(bert.loaded, [text], spec)
        assert encoded.queries.ids == own_encoded.queries.ids and encoded.queries.tokens == own_encoded.queries.tokens
        assert torch.equal(encoded.queries.input_ids, own_encoded.queries.input_ids)
        for layer, state in states.items():
            assert state.keys is state.queries  # self-attention, as a trace tells it
            assert state.queries.shape == own_states[layer].queries.shape and state.queries.is_contiguous()
            assert state.queries.stride() == own_states[layer].queries.stride()  # what trace.json records of x
            torch.testing.assert_close(state.queries, own_states[layer].queries, rtol=0, atol=1e-5)


def test_a_report_of_several_texts_shows_each_texts_own_numbers_within_float32(bert):
    several = attnviz.report([TEXT, *OTHERS], model=bert).record["texts"]
    for text, record in zip([TEXT, *OTHERS], several):
        (alone,) = attnviz.report(text, model=bert).record["texts"]
        assert record["query_tokens"] == alone["query_tokens"]
        for head, expected in zip(record["statistics"]["heads"], alone["statistics"]["heads"]):
            for name in ("entropy", "distance", "mean_max"):
                assert head[name] == pytest.approx(expected[name], abs=1e-5)
        # float32 of two batchings, within the neuron view's 4 decimals
        np.testing.assert_allclose(decoded(record["vectors"]["q"]), decoded(alone["vectors"]["q"]), rtol=0, atol=1e-4 + 1e-6)


def test_heads_report_shows_the_runs_effects_as_its_layers_own_report_does(bert):
    from dataclasses import replace

    result = attnviz.heads(TEXT, model=bert, effect="zero", report=True)
    (shown,) = result.report().record["texts"]
    (own,) = replace(result, made_report=None).report().record["texts"]  # this layer alone, from the result's run
    assert shown["effects"] == own["effects"] and shown["effects"] is not None

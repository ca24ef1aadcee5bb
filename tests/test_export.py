"""attention.json's numbers: written a digit at a time, read back as the rounded weights."""

import json

import numpy as np
import pytest

from dataclasses import replace

from attnviz.output.export import DECIMALS, attention_record, weights_json
from attnviz.run_data import UnknownTokens
from attnviz.spec import RunSpec
from helpers import make_run


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 4, 7), (2, 3, 4, 5)])
def test_weights_json_holds_the_rounded_weights(shape):
    weights = np.random.default_rng(0).random(shape).astype(np.float32)
    weights.flat[0], weights.flat[-1] = 0.0, 1.0  # the ends of the range
    assert json.loads(weights_json(weights)) == np.round(weights.astype(np.float64), DECIMALS).tolist()


def test_weights_json_rounds_half_a_last_decimal_as_numpy_does():
    weights = np.array([[0.12345675, 0.99999996, 0.00000004, 0.5]])
    assert weights_json(weights) == "[[0.1234568,1.0000000,0.0000000,0.5000000]]"
    assert json.loads(weights_json(weights)) == np.round(weights, DECIMALS).tolist()


@pytest.mark.parametrize("bad", [-0.1, 1.5, np.nan])
def test_weights_json_refuses_numbers_outside_zero_to_one(bad):
    with pytest.raises(ValueError):
        weights_json(np.array([[0.5, bad]]))


def test_attention_json_records_a_fallback_model_and_each_texts_unknown_tokens():
    run = make_run(["[CLS]", "我", "[UNK]", "[UNK]", "[SEP]"])
    spec = RunSpec(model=None, resolved_model="all-MiniLM-L6-v2", model_source="bundled")
    plain = attention_record(run, spec)
    assert (plain["fallback"], plain["fallback_for"], plain["unknown_tokens"], plain["kv_unknown_tokens"]) == (False, None, None, None)

    fallen = replace(run, fallback_for="bert-base-chinese", unknown=UnknownTokens(2, 3), kv_unknown=UnknownTokens(0, 4, "<unk>"))
    record = json.loads(json.dumps(attention_record(fallen, spec)))  # as the file holds it
    assert (record["fallback"], record["fallback_for"]) == (True, "bert-base-chinese")
    assert record["unknown_tokens"] == {"count": 2, "of": 3, "token": "[UNK]"}
    assert record["kv_unknown_tokens"] == {"count": 0, "of": 4, "token": "<unk>"}

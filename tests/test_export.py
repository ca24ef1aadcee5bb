"""attention.json's numbers: written a digit at a time, read back as the rounded weights."""

import json

import numpy as np
import pytest

from attnviz.output.export import DECIMALS, weights_json


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

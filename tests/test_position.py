"""`attnviz position`: without position embeddings attention is permutation-equivariant; with them it is not."""

import json

import numpy as np
import pytest
import torch

from attnviz.analysis.position import TOLERANCE, default_permutation, parse_permutation, position_experiment
from attnviz.cli import run
from attnviz.errors import AttnvizError
from attnviz.output.runs import MANIFEST

TEXT = "The animal didn't cross the street because it was too tired."  # 16 tokens
SHORT = "The cat sat."  # [CLS] the cat sat . [SEP]


def reference_maps(reference, ids: list[int], positions: bool) -> np.ndarray:
    """Layer 0's attention (H, N, N) over token ids, computed from transformers' BERT modules alone."""
    _, model = reference
    embeddings, attention = model.embeddings, model.encoder.layer[0].attention.self
    with torch.no_grad():
        input_ids = torch.tensor(ids)  # (N,)
        x = embeddings.word_embeddings(input_ids) + embeddings.token_type_embeddings(torch.zeros_like(input_ids))
        if positions:
            x = x + embeddings.position_embeddings(torch.arange(len(ids)))  # added by position, after the shuffle
        x = embeddings.LayerNorm(x)  # (N, D)
        num_heads = model.config.num_attention_heads
        q = attention.query(x).view(len(ids), num_heads, -1).transpose(0, 1)  # (H, N, d)
        k = attention.key(x).view(len(ids), num_heads, -1).transpose(0, 1)  # (H, N, d)
        return (q @ k.transpose(1, 2) / q.shape[-1] ** 0.5).softmax(-1).numpy()  # (H, N, N)


def unpermute(maps: np.ndarray, permutation: list[int]) -> np.ndarray:
    """Pᵀ A P for (Px)_i = x_perm[i]: put entry (i, j) back at (perm[i], perm[j])."""
    order = np.array(permutation)
    back = np.full_like(maps, np.nan)
    back[:, order[:, None], order[None, :]] = maps
    return back


@pytest.fixture(scope="module")
def result(bundled_bert):
    return position_experiment(bundled_bert, TEXT)


def test_without_positions_permuting_the_tokens_permutes_the_map_and_with_them_it_does_not(
    result, reference_bert
):
    tokenizer, _ = reference_bert
    ids = tokenizer(TEXT)["input_ids"]
    permutation = result.permutation
    permuted_ids = [ids[i] for i in permutation]
    for positions, holds in ((False, True), (True, False)):
        original = reference_maps(reference_bert, ids, positions)
        permuted_back = unpermute(reference_maps(reference_bert, permuted_ids, positions), permutation)
        difference = np.abs(permuted_back - original).max()
        if holds:
            assert difference < TOLERANCE
        else:
            assert difference > 0.1  # far beyond rounding: position changes what the heads do

        side = result.with_positions if positions else result.without_positions
        np.testing.assert_allclose(side.original, original, atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(side.permuted_back, permuted_back, atol=TOLERANCE, rtol=0)
        assert side.max_difference == pytest.approx(difference, abs=TOLERANCE)
        assert side.equivariant is holds
    assert result.without_positions.output_difference < TOLERANCE
    assert result.with_positions.output_difference > 0.1


def test_with_positions_the_original_map_is_berts_own_layer_zero_attention(result, reference_bert):
    tokenizer, model = reference_bert
    with torch.no_grad():
        expected = model(**tokenizer(TEXT, return_tensors="pt"), output_attentions=True).attentions[0][0].numpy()
    np.testing.assert_allclose(result.with_positions.original, expected, atol=TOLERANCE, rtol=0)


def test_the_default_keeps_cls_and_sep_and_reverses_the_rest(result):
    assert result.permutation == [0, *range(14, 0, -1), 15]
    assert result.permuted_tokens[0] == "[CLS]" and result.permuted_tokens[-1] == "[SEP]"
    assert result.permuted_tokens[1] == "." and result.permuted_tokens[-2] == "the"
    # The default head shown is the one whose map the permutation changes most with positions.
    assert result.head == int(result.with_positions.head_differences.argmax()) and not result.head_chosen


def test_a_given_permutation_may_move_cls_and_sep_too(bundled_bert, reference_bert):
    permutation = [5, 3, 0, 1, 4, 2]
    given = position_experiment(bundled_bert, SHORT, "5, 3, 0, 1, 4, 2", head=1)
    assert given.permutation == permutation and given.head == 1 and given.head_chosen
    assert given.permuted_tokens == ["[SEP]", "sat", "[CLS]", "the", ".", "cat"]
    ids = reference_bert[0](SHORT)["input_ids"]
    expected = reference_maps(reference_bert, [ids[i] for i in permutation], positions=False)
    np.testing.assert_allclose(given.without_positions.permuted, expected, atol=TOLERANCE, rtol=0)
    assert given.without_positions.equivariant and not given.with_positions.equivariant


def test_parse_permutation_and_the_default():
    tokens = ["[CLS]", "a", "b", "c", "[SEP]"]
    assert default_permutation(tokens) == [0, 3, 2, 1, 4]
    assert parse_permutation("4,3,2,1,0", tokens) == [4, 3, 2, 1, 0]
    for spec, message in [
        ("0,1,x,3,4", "'x' is not a whole number"),
        ("0,1,2,3", "each of 0 to 4 once (the text has 5 tokens, [CLS] and [SEP] included); 4 is missing"),
        ("0,1,2,3,4,5", "it has 6 positions"),
        ("0,1,1,3,4", "2 is missing"),
        ("0,1,2,3,4", "leaves every token in place"),
    ]:
        with pytest.raises(AttnvizError) as raised:
            parse_permutation(spec, tokens)
        assert message in str(raised.value), spec


def position(*args):
    return run(["position", *args, "--model", "bundled"])


@pytest.mark.slow
def test_position_end_to_end(tmp_path, capsys):
    assert position(TEXT, "--out", str(tmp_path)) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [MANIFEST, "position.json", "position.png"]
    assert (tmp_path / "position.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((tmp_path / "position.json").read_text(encoding="utf-8"))
    assert record["permutation"] == [0, *range(14, 0, -1), 15] and record["tokens"][2] == "animal"
    assert record["without_positions"]["max_abs_difference"] < TOLERANCE
    assert record["without_positions"]["equivariant"] is True
    assert record["with_positions"]["max_abs_difference"] > 0.1
    assert record["with_positions"]["equivariant"] is False
    assert len(record["with_positions"]["head_max_abs_difference"]) == 12
    shown = capsys.readouterr().out
    assert "without" in shown and "with BERT's" in shown and "yes" in shown and "no" in shown
    assert max(len(line) for line in shown.splitlines()) <= 80


BAD_INPUTS = {
    "not a number": ([SHORT, "--permutation", "0,1,two,3,4,5"], "'two' is not a whole number"),
    "too short": ([SHORT, "--permutation", "0,2,1"], "--permutation must give each of 0 to 5 once"),
    "repeated": ([SHORT, "--permutation", "0,2,2,3,4,5"], "1 is missing"),
    "identity": ([SHORT, "--permutation", "0,1,2,3,4,5"], "leaves every token in place"),
    "head out of range": ([SHORT, "--head", "12"], "--head 12 is out of range: all-MiniLM-L6-v2 has heads 0 to 11"),
    "one word": (["hello"], "the text has 1 token between [CLS] and [SEP]: there is nothing to reorder"),
    "empty text": ([" "], "the text is empty"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
    args, message = BAD_INPUTS[case]
    assert position(*args, "--out", str(tmp_path / "run")) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert list(tmp_path.iterdir()) == []


def test_a_long_texts_position_figure_labels_every_kth_token_with_its_index(bundled_bert):
    """Past 24 tokens: at most 16 labels an axis, each "index:token" of that axis (the permuted map's
    axes in the permuted order), and the rows of the permuted-back and difference maps left to the first."""
    from attnviz.render.position_figure import MAX_POSITION_LONG_TICK_LABELS, position_figure

    words = "the animal did not cross the street because it was too tired".split()
    text = " ".join(words[index % len(words)] for index in range(98))  # 100 tokens with [CLS] and [SEP]
    result = position_experiment(bundled_bert, text, None, None, "cpu")
    assert len(result.tokens) == 100
    figure = position_figure(result)
    maps = [ax for ax in figure.axes if ax.images]  # 2 rows of 4 maps
    assert len(maps) == 8
    expected_ticks = list(range(0, 100, 7))  # every 7th: ceil(100 / 16)
    for column, ax in enumerate(maps):
        shown = result.shown_tokens  # the labels show the tokens as models/shown.py writes them: "␣animal"
        tokens = [shown[i] for i in result.permutation] if column % 4 == 1 else shown
        keys = [label.get_text() for label in ax.get_xticklabels()]
        assert len(keys) <= MAX_POSITION_LONG_TICK_LABELS
        assert keys == [f"{k}:{tokens[k]}" for k in expected_ticks]
        queries = [label.get_text() for label in ax.get_yticklabels()]
        assert queries == ([f"{q}:{tokens[q]}" for q in expected_ticks] if column % 4 < 2 else [])

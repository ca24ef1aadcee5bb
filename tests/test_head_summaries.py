"""Every head of every layer summarised a block of queries at a time (analysis/head_summaries.py).

The expectations are computed here with NumPy from whole maps: transformers' own eager attentions
(output_attentions) of the bundled BERT and of tiny Llama and GPT-2 checkpoints, or, on a text too
long to hold every layer's maps, a float64 attention written here from the layer's parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoTokenizer

from attnviz.analysis.head_summaries import (
    SINK_THRESHOLD,
    SUMMARIES,
    TOP_KEYS,
    HeadSummaries,
    sink_fraction,
    summarise_layers,
)
from attnviz.attention.layer import rows_per_block
from attnviz.models.loading import load_model
from attnviz.spec import RunSpec

from tiny_families import PARAMETER_STD, bpe_tokenizer, build_checkpoint, save_checkpoint

TEXT = "The cat sat on the mat because it was tired."


def reference_summaries(maps: np.ndarray, causal: bool, window: int = 8) -> dict[str, np.ndarray]:
    """Each summary of SUMMARIES, (L, H), from whole maps (L, H, N, N) in float64, straight from the definitions."""
    maps = np.asarray(maps, dtype=np.float64)
    n = maps.shape[-1]
    i, j = np.indices((n, n))
    visible = i[:, 0] + 1 if causal else np.full(n, n)
    logs = np.log(np.where(maps > 0, maps, 1.0))
    entropy = -(maps * logs).sum(-1)  # (L, H, N)
    choice = visible > 1
    return {
        "sink": maps[..., :, 0].mean(-1),
        "last": maps[..., :, n - 1].mean(-1),
        "relative_entropy": (entropy[..., choice] / np.log(visible[choice])).mean(-1),
        "distance": (maps * np.abs(i - j)).sum(-1).mean(-1),
        "local": (maps * (np.abs(i - j) <= window)).sum(-1).mean(-1),
        "previous": maps[..., np.arange(1, n), np.arange(n - 1)].mean(-1),
    }


def assert_like_reference(result, maps: np.ndarray, causal: bool, window: int = 8) -> None:
    expected = reference_summaries(maps, causal, window)
    for name in SUMMARIES:
        np.testing.assert_allclose(result.values[name], expected[name], atol=1e-5, rtol=0, err_msg=name)
    received = np.asarray(maps, dtype=np.float64).sum(-2) / maps.shape[-2]  # (L, H, N)
    top = np.sort(received, axis=-1)[..., ::-1][..., :TOP_KEYS]
    np.testing.assert_allclose(result.top_shares, top, atol=1e-5, rtol=0)  # the largest shares, in order
    picked = np.take_along_axis(received, result.top_keys, axis=-1)
    np.testing.assert_allclose(picked, result.top_shares, atol=1e-5, rtol=0)  # the keys that hold them


def spec_for(loaded, causal: bool, num_heads=None) -> RunSpec:
    return RunSpec(model=None, resolved_model=loaded.name, model_source=loaded.source, layer=None, num_heads=num_heads, causal=causal)


def budget_for_rows(rows: int, num_heads: int, num_tokens: int) -> int:
    budget = rows * 2 * num_heads * num_tokens * 4
    assert rows_per_block(budget, 1, num_heads, num_tokens) == rows
    return budget


@pytest.mark.parametrize("rows", [1, 7, None])
def test_bert_summaries_equal_those_of_transformers_eager_maps(bundled_bert, reference_bert, rows):
    tokenizer, model = reference_bert
    inputs = tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        maps = np.stack([a[0].numpy() for a in model(**inputs, output_attentions=True).attentions])  # (L, H, N, N)
    n, heads = maps.shape[-1], maps.shape[1]
    budget = budget_for_rows(rows or n, heads, n)
    result = summarise_layers(bundled_bert, TEXT, spec_for(bundled_bert, False), budget)
    assert result.rows_per_block == (rows or n)
    assert result.tokens[0] == "[CLS]" and result.tokens[-1] == "[SEP]"  # what "sink" and "last" are on BERT
    assert_like_reference(result, maps, causal=False)


def test_causal_bert_runs_beside_the_model_and_equals_the_whole_maps(bundled_bert):
    """--causal over BERT: attnviz's layers over BERT's own hidden states (not in its place); the whole maps of
    attnviz.layers are the reference (themselves checked against BERT in test_attention.py)."""
    import attnviz

    whole = attnviz.layers(TEXT, model="bundled", causal=True).attention.numpy()  # (L, H, N, N)
    result = summarise_layers(bundled_bert, TEXT, spec_for(bundled_bert, True), budget_for_rows(3, whole.shape[1], whole.shape[-1]))
    assert_like_reference(result, whole, causal=True)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {model_type: (root / model_type, build_checkpoint(model_type, root / model_type)) for model_type in ("llama", "gpt2")}


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
@pytest.mark.parametrize("rows", [1, 7, None])
def test_decoder_summaries_equal_those_of_transformers_eager_maps(decoders, model_type, rows):
    folder, model = decoders[model_type]
    ids = AutoTokenizer.from_pretrained(folder)(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        maps = np.stack([a[0].numpy() for a in model(input_ids=ids, output_attentions=True).attentions])
    loaded = load_model(str(folder), "cpu")
    n, heads = maps.shape[-1], maps.shape[1]
    result = summarise_layers(loaded, TEXT, spec_for(loaded, True), budget_for_rows(rows or n, heads, n), window=3)
    assert_like_reference(result, maps, causal=True, window=3)


def test_the_sink_fraction_counts_the_heads_whose_sink_share_exceeds_the_threshold():
    """Hand-built maps: head h puts share s_h of every row on key 0 and the rest on the query itself."""
    n, shares = 6, [0.1, SINK_THRESHOLD, 0.31, 0.9]  # 0.3 itself does not exceed the threshold
    maps = np.zeros((len(shares), n, n))
    for head, share in enumerate(shares):
        maps[head, :, 0] = share
        maps[head, np.arange(n), np.arange(n)] += 1 - share  # row 0: all on key 0
    summaries = HeadSummaries(len(shares), n, n, causal=False)
    for first in range(0, n, 4):
        summaries.add(first, torch.tensor(maps[:, first : first + 4], dtype=torch.float32))
    values, _, _ = summaries.summary()
    expected_sink = [(share * (n - 1) + 1) / n for share in shares]
    np.testing.assert_allclose(values["sink"], expected_sink, atol=1e-6)
    assert sink_fraction(np.array([[0.1, 0.3, 0.31, 0.9]])).tolist() == [0.5]
    np.testing.assert_allclose(values["distance"], [share * np.arange(1, n).sum() / n for share in shares], atol=1e-6)


def test_a_previous_token_head_has_all_its_share_on_the_previous_token_and_distance_one():
    n = 10
    maps = np.zeros((1, n, n))
    maps[0, 0, 0] = 1
    maps[0, np.arange(1, n), np.arange(n - 1)] = 1
    summaries = HeadSummaries(1, n, n, causal=True, window=0)
    summaries.add(0, torch.tensor(maps, dtype=torch.float32))
    values, keys, shares = summaries.summary()
    assert values["previous"][0] == pytest.approx(1.0)
    assert values["distance"][0] == pytest.approx((n - 1) / n)
    assert values["local"][0] == pytest.approx(1 / n)  # window 0: only the query's own key, row 0's
    assert values["relative_entropy"][0] == pytest.approx(0.0)  # one-hot rows
    assert keys[0].tolist() == [0, 1, 2, 3, 4] and shares[0, 0] == pytest.approx(2 / n)  # key 0 gets rows 0 and 1


def test_summaries_refuse_a_pass_that_missed_queries():
    summaries = HeadSummaries(2, 5, 5, causal=False)
    summaries.add(0, torch.full((2, 3, 5), 0.2))
    with pytest.raises(ValueError, match="3 of 5 queries"):
        summaries.summary()


# ---- a text too long to hold every map ----------------------------------------------------------------

LONG_TOKENS = 3000


def reference_llama_maps(model, ids: torch.Tensor, layer: int, heads: list[int]) -> np.ndarray:
    """Causal weights (len(heads), N, N) of one Llama layer in float64, from its parameters and its input
    (transformers' hidden state through the layer's input RMSNorm): project, rotate each head's feature pairs
    (i, i + d/2) by position * theta^(-2i/d), share each key/value head with its group, softmax over keys 0..i."""
    config = model.config
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[layer]
        x = model.layers[layer].input_layernorm(hidden)[0].double().numpy()  # (N, D)
    attention = model.layers[layer].self_attn
    heads_total, kv, d = config.num_attention_heads, config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    n = len(x)
    q = (x @ attention.q_proj.weight.double().detach().numpy().T).reshape(n, heads_total, d)
    k = (x @ attention.k_proj.weight.double().detach().numpy().T).reshape(n, kv, d)
    theta = config.rope_parameters["rope_theta"]  # 10,000: the default
    angles = np.outer(np.arange(n), theta ** (-np.arange(0, d, 2) / d))  # (N, d/2)
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]

    def rope(v):
        v1, v2 = v[..., : d // 2], v[..., d // 2 :]
        return np.concatenate([v1 * cos - v2 * sin, v2 * cos + v1 * sin], axis=-1)

    q, k = rope(q), rope(k)
    maps = []
    for head in heads:
        scores = q[:, head] @ k[:, head // (heads_total // kv)].T / np.sqrt(d)  # (N, N)
        scores[np.triu_indices(n, 1)] = -np.inf
        scores -= scores.max(-1, keepdims=True)
        weights = np.exp(scores)
        maps.append(weights / weights.sum(-1, keepdims=True))
    return np.stack(maps)


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long-llama")
    config = transformers.LlamaConfig(
        vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=4096,
    )  # fmt: skip
    model = save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    words = ("the cat sat on the mat because it was tired " * 2000).split()
    text = " ".join(words[:LONG_TOKENS])
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :LONG_TOKENS]
    text = tokenizer.decode(ids[0, 1:])  # a text of LONG_TOKENS tokens or very near, <s> included
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    return folder, model, text, ids


@pytest.mark.slow  # about 30 s: eight float64 maps of 3,000 × 3,000 and the model over 3,000 tokens
def test_a_long_text_is_summarised_in_blocks_and_equals_a_float64_computation(long_llama):
    from attnviz.layer_inputs import encode_texts
    from attnviz.own_layer import build_layers
    from attnviz.passes import iter_layer_blocks

    folder, model, text, ids = long_llama
    n = ids.shape[1]
    assert n > 2500
    loaded = load_model(str(folder), "cpu")
    spec = spec_for(loaded, True)
    budget = 2**20 * 4  # 4 MiB: a few dozen rows of 4 heads over 3,000 keys, where one map is 36 MB
    rows = rows_per_block(budget, 1, 4, n)
    assert rows < n // 10
    # The pass itself yields blocks of at most `rows` queries, never a whole layer's map.
    encoded = encode_texts(loaded, [text], spec)
    assert encoded.queries.ids[0] == ids[0].tolist()
    blocks = [(first, tuple(weights.shape)) for _, first, weights in iter_layer_blocks(loaded, encoded, build_layers(loaded, spec), spec, budget)]
    assert max(shape[2] for _, shape in blocks) == rows
    # Causal: each block's weights stop at its last query's key (the rest are 0), the last block's at the text's end.
    assert all(shape[-1] == first + shape[2] for first, shape in blocks) and blocks[-1][1][-1] == n

    result = summarise_layers(loaded, text, spec, budget)
    assert result.rows_per_block == rows
    for layer in range(2):
        for head in range(4):  # one head's float64 map at a time (72 MB)
            maps = reference_llama_maps(model, ids, layer, [head])[None]  # (1, 1, N, N)
            expected = reference_summaries(maps, causal=True)
            for name in SUMMARIES:  # shares within 1e-5; the distance, hundreds of tokens, within 1e-5 of itself
                tolerance = 1e-5 * max(1.0, expected[name][0, 0])
                assert abs(result.values[name][layer, head] - expected[name][0, 0]) < tolerance, (name, layer, head)


# ---- the faces: attnviz layers' summaries.json, summaries.png and its tables ----------------------------


@pytest.mark.slow
def test_layers_summaries_json_and_png_hold_its_summaries(tmp_path, reference_bert):
    import json

    import attnviz
    from attnviz.analysis.head_summaries import SINK_FRACTION
    from attnviz.render.sizes import figure_max_px
    from PIL import Image

    from attnviz.output.summaries_json import write_summaries_json
    from attnviz.render.summary_figures import write_summaries_figure

    result = attnviz.layers(TEXT, model="bundled", band=2)  # save's listing: test_api.py
    write_summaries_json(result.summaries, result.spec, tmp_path / "summaries.json")
    write_summaries_figure(result.summaries, tmp_path, run=result.layer_runs[0])
    record = json.loads((tmp_path / "summaries.json").read_text(encoding="utf-8"))
    assert (record["format"], record["version"], record["window"]) == ("attnviz-summaries", 1, 2)
    assert set(record["definitions"]) == {*SUMMARIES, "sink_fraction", "top_keys"}
    assert record["definitions"]["sink_fraction"]["name"] == SINK_FRACTION[0]
    # every summary an L × H list, equal to NumPy's over transformers' maps
    tokenizer, model = reference_bert
    with torch.no_grad():
        maps = np.stack([a[0].numpy() for a in model(**tokenizer(TEXT, return_tensors="pt"), output_attentions=True).attentions])
    expected = reference_summaries(maps, causal=False, window=2)
    for name in SUMMARIES:
        np.testing.assert_allclose(np.array(record["summaries"][name]), expected[name], atol=2e-6, rtol=0, err_msg=name)
    sink = expected["sink"]
    np.testing.assert_allclose(record["sink_fraction"], (sink > SINK_THRESHOLD).mean(axis=1), atol=1e-6)
    first = record["top_keys"][3][4]  # layer 3, head 4: the key that receives the most first
    received = maps[3, 4].astype(np.float64).sum(0) / maps.shape[-1]
    assert first[0]["key"] == int(received.argmax()) and first[0]["token"] == record["shown_tokens"][first[0]["key"]]
    assert len(first) == TOP_KEYS and first[0]["share"] == pytest.approx(received.max(), abs=1e-6)
    with Image.open(tmp_path / "summaries.png") as image:
        width, height = image.size
    assert (width, height) <= figure_max_px("summaries.png") and width > height  # 3 panels across, 2 down


def test_the_sink_grid_in_the_terminal_marks_each_layers_fraction_and_bounds_its_rows():
    from rich.console import Console

    from attnviz.render.summary_tables import MAX_LAYERS_SHOWN, print_summaries
    from attnviz.analysis.head_summaries import LayerSummaries

    num_layers, num_heads = MAX_LAYERS_SHOWN + 5, 3
    sink = np.tile([0.1, 0.5, 0.9], (num_layers, 1))
    values = {name: sink if name == "sink" else np.zeros((num_layers, num_heads)) for name in SUMMARIES}
    summaries = LayerSummaries(
        values, np.zeros((num_layers, num_heads, 1), int), np.ones((num_layers, num_heads, 1)), ["<s>"], ["<s>"]
    )
    console = Console(record=True, width=100)
    print_summaries(console, summaries)
    text = console.export_text()
    assert "L0 │ 0.10 │ 0.50 │ 0.90 │  67%" in text and f"L{MAX_LAYERS_SHOWN - 1} " in text
    assert f"L{MAX_LAYERS_SHOWN} " not in text and "… 5 more layers in summaries.json" in text
    assert "67% of all heads exceed ε = 0.3" in text


def test_a_grid_of_many_heads_is_cut_into_blocks_that_fit_and_never_elides_a_value():
    """12 heads (BERT's) at 80 columns: the heads go in blocks narrow enough that every cell reads whole
    (rich elides a squeezed cell as "0.…"); the effects' grid of 4 decimals too."""
    from rich.console import Console

    from attnviz.render.summary_tables import layer_head_grid

    values = np.full((6, 12), 0.123456)
    for decimals, shown in ((2, "0.12"), (4, "0.1235")):
        console = Console(record=True, width=80)
        for table in layer_head_grid(values, "grid", 80, decimals, "x.json", last_column=("end", ["1%"] * 6)):
            console.print(table)
        text = console.export_text()
        assert "…" not in text and text.count(shown) == values.size and "H11" in text
        assert max(len(line) for line in text.splitlines()) <= 80

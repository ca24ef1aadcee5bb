"""Why a head of T5's cross-attention attends (analysis/why_cross.py): the score of a decoder token (query) and an
encoder token (key) split into decoder part × encoder part terms.

The terms add up to the cross-attention score attnviz's layer computes (1e-5), whose weight is transformers' own eager
cross-attention weight (1e-5); each term is the product of its two parts made again from transformers' T5Model with
this test's own hooks (what entered each o, each DenseReluDense's output, the cross-attention's norm and the encoder's
final norm with their scales frozen, EncDecAttention's q and k; T5 has no scale), within 1e-4. BART and Marian, which
normalise after each sublayer, add up to their score and weight too, and so do their encoder and decoder
self-attentions (the same walks, up to the layer); T5's self-attentions (their relative position bias) are refused in
one line.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import attnviz
from attnviz.layer_inputs import encode_texts
from attnviz.spec import run_spec

TEXT = "The cat sat on the mat because it was tired."
SOURCE = "Le chat est assis sur le tapis."


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    from tiny_families import build_checkpoint

    folder = tmp_path_factory.mktemp("tiny-t5")
    build_checkpoint("t5", folder)
    return folder


@pytest.fixture(scope="module")
def t5(t5_folder):
    return attnviz.load(str(t5_folder), device="cpu")


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_a_post_norm_encoder_decoders_terms_add_up_to_the_score_and_its_weight_is_transformers(family, tmp_path):
    """BART (layernorm_embedding, learned positions) and Marian (sinusoidal positions, scaled embeddings, no embedding
    norm): every part through each sublayer's norm with its scale frozen, each norm's bias a part of its own."""
    from tiny_families import FAMILY_CHECKPOINTS, build_checkpoint

    build_checkpoint(family, tmp_path)
    model = attnviz.load(str(tmp_path), device="cpu")
    spec = run_spec(model.loaded, str(tmp_path), layer=1, stack="cross", kv_text=SOURCE)
    encoded = encode_texts(model.loaded, [TEXT], spec)
    reference = FAMILY_CHECKPOINTS[family]()[1].from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.inference_mode():
        cross = reference(input_ids=encoded.keys.input_ids, attention_mask=encoded.keys.attention_mask, decoder_input_ids=encoded.queries.input_ids,
                          output_attentions=True).cross_attentions  # fmt: skip
    for layer, head, query in ((0, 0, 3), (1, 3, 0), (1, 2, 5)):
        terms = attnviz.why(TEXT, model=model, layer=layer, head=head, query=query, stack="cross", kv=SOURCE).terms
        assert terms.total == pytest.approx(terms.score, abs=1e-5 * max(1.0, abs(terms.score)))
        assert terms.weight == pytest.approx(float(cross[layer][0, head, query, terms.key]), abs=1e-5)
    embedded = {"embed", "pos", *(["emb.norm.bias"] if family == "bart" else [])}
    heads = lambda label: {f"{label}H{h}" for h in range(4)} | {f"{label}.bias"}  # noqa: E731
    layer_0 = heads("L0") | {"L0.norm1.bias"} | heads("X0") | {"L0.norm2.bias", "mlp0", "L0.norm3.bias"}
    assert set(terms.query_parts) == embedded | layer_0 | heads("L1") | {"L1.norm1.bias", "bias"}  # layer 1's own self heads
    assert {f"enc.{name}" for name in embedded} | {"enc.L1H3", "enc.L1.bias", "enc.L1.norm1.bias", "enc.mlp1", "enc.L1.norm2.bias", "bias"} <= set(terms.key_parts)


@pytest.mark.parametrize("family", ["bart", "marian"])
@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_a_post_norm_encoder_decoders_self_attentions_split_too(family, stack, tmp_path):
    """BART's and Marian's encoder self-attention and causal decoder self-attention: the walks of the cross-attention's
    two sides, up to the layer; the terms add up to the score (1e-5), its weight is transformers' eager one (1e-5)."""
    from tiny_families import FAMILY_CHECKPOINTS, build_checkpoint

    build_checkpoint(family, tmp_path)
    model = attnviz.load(str(tmp_path), device="cpu")
    spec = run_spec(model.loaded, str(tmp_path), layer=1, stack=stack)
    encoded = encode_texts(model.loaded, [TEXT], spec)
    source = encoded.queries if stack == "encoder" else encoded.source
    reference = FAMILY_CHECKPOINTS[family]()[1].from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.inference_mode():
        out = reference(input_ids=source.input_ids, attention_mask=source.attention_mask, decoder_input_ids=encoded.queries.input_ids, output_attentions=True)
    maps = out.encoder_attentions if stack == "encoder" else out.decoder_attentions
    for layer, head, query in ((0, 0, 3), (1, 3, 7), (1, 2, 5)):
        terms = attnviz.why(TEXT, model=model, layer=layer, head=head, query=query, stack=stack).terms
        assert terms.total == pytest.approx(terms.score, abs=1e-5 * max(1.0, abs(terms.score)))
        assert terms.weight == pytest.approx(float(maps[layer][0, head, query, terms.key]), abs=1e-5)
        assert stack == "encoder" or terms.key <= query
    prefix = "enc." if stack == "encoder" else ""
    layer_0 = {f"{prefix}L0H{h}" for h in range(4)} | {f"{prefix}L0.bias", f"{prefix}L0.norm1.bias", f"{prefix}mlp0"}
    assert layer_0 | {f"{prefix}embed", f"{prefix}pos", "bias"} <= set(terms.query_parts) and terms.query_parts == terms.key_parts
    assert not any(name.startswith(f"{prefix}L1") for name in terms.query_parts)  # layer 1 reads the stream before its own heads


@pytest.mark.parametrize("kv", [SOURCE, None])
def test_the_terms_add_up_to_the_cross_attention_score_and_its_weight_is_transformers(t5, t5_folder, kv):
    """kv None: the text is its own source (the encoder reads it, the decoder reads it shifted right)."""
    spec = run_spec(t5.loaded, str(t5_folder), layer=1, stack="cross", kv_text=kv)
    encoded = encode_texts(t5.loaded, [TEXT], spec)
    model = transformers.T5Model.from_pretrained(t5_folder, attn_implementation="eager").eval()
    with torch.inference_mode():
        cross = model(input_ids=encoded.keys.input_ids, attention_mask=encoded.keys.attention_mask, decoder_input_ids=encoded.queries.input_ids,
                      output_attentions=True).cross_attentions  # fmt: skip
    for layer, head, query in ((0, 0, 3), (0, 1, len(encoded.queries.ids[0]) - 1), (1, 3, 0), (1, 2, 5)):  # layer 1 last
        terms = attnviz.why(TEXT, model=t5, layer=layer, head=head, query=query, stack="cross", kv=kv).terms
        assert terms.total == pytest.approx(terms.score, abs=1e-5 * max(1.0, abs(terms.score)))
        assert terms.weight == pytest.approx(float(cross[layer][0, head, query, terms.key]), abs=1e-5)
        assert terms.key_tokens == encoded.keys.tokens[0] and terms.tokens == encoded.queries.tokens[0]
    layer_0 = {"embed", *(f"L0H{h}" for h in range(4))}  # the query side of layer 0: the embedding, its own self-attention
    assert set(attnviz.why(TEXT, model=t5, layer=0, head=0, query=2, stack="cross", kv=kv).terms.query_parts) == layer_0
    expected_keys = {"enc.embed", *(f"enc.L{layer}H{h}" for layer in (0, 1) for h in range(4)), "enc.mlp0", "enc.mlp1"}
    assert set(terms.key_parts) == expected_keys
    assert set(terms.query_parts) == layer_0 | {"X0H0", "X0H1", "X0H2", "X0H3", "mlp0", "L1H0", "L1H1", "L1H2", "L1H3"}


def test_each_term_is_the_product_of_its_parts_through_transformers_own_modules(t5, t5_folder):
    layer, head, query, key = 1, 2, 6, 3
    terms = attnviz.why(TEXT, model=t5, layer=layer, head=head, query=query, key=key, stack="cross", kv=SOURCE).terms
    spec = run_spec(t5.loaded, str(t5_folder), layer=layer, stack="cross", kv_text=SOURCE)
    encoded = encode_texts(t5.loaded, [TEXT], spec)
    model = transformers.T5Model.from_pretrained(t5_folder, attn_implementation="eager").eval()
    kept = {}

    def entering(name):  # a pre-hook keeping what entered the module (B = 1: (N, features)), returning None
        def keep(module, args):
            kept.setdefault(name, args[0][0])

        return keep

    def giving(name):  # a hook keeping what the module gave
        def keep(module, args, output):
            kept.setdefault(name, output[0])

        return keep

    handles = []
    for side, blocks in (("enc", model.encoder.block), ("dec", model.decoder.block)):
        for i, block in enumerate(blocks):
            handles.append(block.layer[0].SelfAttention.o.register_forward_pre_hook(entering(f"{side}.z{i}")))
            handles.append(block.layer[-1].DenseReluDense.register_forward_hook(giving(f"{side}.mlp{i}")))
            if side == "dec":
                handles.append(block.layer[1].EncDecAttention.o.register_forward_pre_hook(entering(f"cross.z{i}")))
                handles.append(block.layer[1].layer_norm.register_forward_pre_hook(entering(f"cross.norm{i}")))
    handles.append(model.encoder.final_layer_norm.register_forward_pre_hook(entering("enc.final")))
    try:
        with torch.inference_mode():
            model(input_ids=encoded.keys.input_ids, attention_mask=encoded.keys.attention_mask, decoder_input_ids=encoded.queries.input_ids)
    finally:
        for handle in handles:
            handle.remove()
    size = model.config.d_kv

    def heads(z, o, label):  # each head's output through its columns of o
        return {f"{label}H{h}": z[:, h * size : (h + 1) * size] @ o.weight[:, h * size : (h + 1) * size].T for h in range(model.config.num_heads)}

    with torch.inference_mode():
        decoder = {"embed": model.shared(encoded.queries.input_ids[0])}
        for i in range(layer + 1):
            decoder |= heads(kept[f"dec.z{i}"], model.decoder.block[i].layer[0].SelfAttention.o, f"L{i}")
            if i < layer:
                decoder |= heads(kept[f"cross.z{i}"], model.decoder.block[i].layer[1].EncDecAttention.o, f"X{i}")
                decoder[f"mlp{i}"] = kept[f"dec.mlp{i}"]
        encoder = {"enc.embed": model.shared(encoded.keys.input_ids[0])}
        for i in range(model.config.num_layers):
            encoder |= heads(kept[f"enc.z{i}"], model.encoder.block[i].layer[0].SelfAttention.o, f"enc.L{i}")
            encoder[f"enc.mlp{i}"] = kept[f"enc.mlp{i}"]
        attention = model.decoder.block[layer].layer[1]
        query_norm, key_norm = attention.layer_norm, model.encoder.final_layer_norm
        query_sigma = (kept[f"cross.norm{layer}"][query].pow(2).mean() + query_norm.variance_epsilon).sqrt()
        key_sigma = (kept["enc.final"][key].pow(2).mean() + key_norm.variance_epsilon).sqrt()
        columns = slice(head * size, (head + 1) * size)
        q = {name: attention.EncDecAttention.q(query_norm.weight * part[query] / query_sigma)[columns] for name, part in decoder.items()}
        k = {name: attention.EncDecAttention.k(key_norm.weight * part[key] / key_sigma)[columns] for name, part in encoder.items()}
    assert sorted(terms.query_parts) == sorted(q) and sorted(terms.key_parts) == sorted(k)
    for i, query_part in enumerate(terms.query_parts):
        for j, key_part in enumerate(terms.key_parts):
            assert terms.terms[i, j] == pytest.approx(float(q[query_part] @ k[key_part]), abs=1e-4), (query_part, key_part)


@pytest.mark.parametrize(
    "family, stack, message",
    [
        ("t5", "decoder", "why splits T5's cross-attention (--stack cross), not its decoder's self-attention: the relative position bias"),
        ("t5", None, "not its encoder's self-attention"),
    ],
)
def test_what_is_not_split_yet_is_refused_in_one_line(family, stack, message, tmp_path, capsys):
    from tiny_families import build_checkpoint

    from attnviz.cli.main import run

    build_checkpoint(family, tmp_path / "model")
    args = ["why", TEXT, "--model", str(tmp_path / "model"), "--layer", "1", "--head", "0", "--query", "1", "--out", str(tmp_path / "run")]
    assert run([*args, *(["--stack", stack] if stack else [])]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert not (tmp_path / "run").exists()


def test_a_key_past_the_source_is_refused_with_the_encoders_count(t5, t5_folder, tmp_path, capsys):
    from attnviz.cli.main import run

    spec = run_spec(t5.loaded, str(t5_folder), stack="cross", kv_text="Le chat.")
    count = len(encode_texts(t5.loaded, [TEXT], spec).keys.ids[0])  # the source's tokens, not the text's
    assert count != len(encode_texts(t5.loaded, [TEXT], spec).queries.ids[0])
    args = ["why", TEXT, "--model", str(t5_folder), "--stack", "cross", "--kv", "Le chat.", "--head", "0", "--query", "1", "--key", str(count)]
    assert run([*args, "--out", str(tmp_path / "run")]) == 2
    assert f"--key {count} is past the text: it is {count} tokens as the encoder reads it (0 to {count - 1})" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("family", "stack"), [("t5", "cross"), ("bart", "cross"), ("bart", "decoder")])
def test_a_layer_at_a_time_splits_as_the_whole_model_does(family, stack, tmp_path):
    """Read a layer's weights at a time (models/layer_weights.py), the walks' norms and projections are read for the
    split after the pass: the same terms as the model held whole."""
    import numpy as np
    from tiny_families import build_checkpoint

    build_checkpoint(family, tmp_path)
    split = lambda **load: attnviz.why(TEXT, model=attnviz.load(str(tmp_path), device="cpu", **load), layer=1, head=1, query=3, stack=stack).terms  # noqa: E731
    whole, layered = split(), split(layer_at_a_time=True)
    assert layered.query_parts == whole.query_parts and layered.key_parts == whole.key_parts
    np.testing.assert_allclose(layered.terms, whole.terms, rtol=0, atol=1e-6)
    assert layered.score == pytest.approx(whole.score, abs=1e-6)

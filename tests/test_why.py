"""Why a head attends (analysis/why.py): a score split into query part x key part terms.

The terms add up to the score attnviz's own layer computes (1e-5); each term is the product of its two parts computed
again from transformers' own modules, with hooks written out here: each earlier head's share of the stream (what
entered o_proj, through the head's columns of it), each MLP's output, the norm with the position's scale frozen,
q_proj and k_proj, transformers' own RoPE (apply_rotary_pos_emb with the model's rotary_emb), its own scaling (1e-4).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from attnviz.analysis.why import score_terms
from attnviz.layer_inputs import encode_texts
from attnviz.models.loading import load_model
from attnviz.spec import run_spec

TEXT = "The cat sat on the mat because it was tired. The cat sat"


def hooked_pass(model, inputs: dict, w_o, mlp):
    """transformers' model run whole with this test's own hooks: its hidden states, what entered w_o (B = 1: (N, H d))
    and what mlp gave ((N, D)), at their first call."""
    entering, given = [], []
    handles = [w_o.register_forward_pre_hook(lambda module, args: entering.append(args[0][0])),
               mlp.register_forward_hook(lambda module, args, output: given.append(output[0]))]  # fmt: skip
    try:
        hidden = model(**inputs, output_hidden_states=True).hidden_states
    finally:
        for handle in handles:
            handle.remove()
    return hidden, entering[0], given[0]


def split(loaded, name: str, layer: int, head: int, query: int, key: int | None = None):
    spec = run_spec(loaded, name, layer=layer)
    return score_terms(loaded, encode_texts(loaded, [TEXT], spec), spec, layer, head, query, key)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_the_terms_add_up_to_the_score_attnvizs_layer_computes(family, tmp_path):
    """Grouped-query heads with RoPE (Llama), per-head q/k norms (Qwen3), LayerNorm with learned positions and biases
    (GPT-2): the parts through the frozen norm add up to the score within float32's rounding."""
    from tiny_families import build_checkpoint

    build_checkpoint(family, tmp_path)
    loaded = load_model(str(tmp_path))
    for layer, head, query in ((0, 0, 5), (1, 2, 10), (1, 3, 12)):
        terms = split(loaded, str(tmp_path), layer, head, query)
        assert terms.terms.shape == (len(terms.query_parts), len(terms.key_parts))
        assert terms.total == pytest.approx(terms.score, abs=1e-5 * max(1.0, abs(terms.score)))
        assert terms.key <= query and 0 < terms.weight <= 1
    parts = split(loaded, str(tmp_path), 1, 0, 5).query_parts
    heads = loaded.num_heads
    assert parts[: 1 + heads] == ["embed", *(f"L0H{h}" for h in range(heads))] or parts[:2] == ["embed", "pos"]
    assert "mlp0" in parts


def test_each_term_is_the_product_of_its_parts_through_transformers_own_modules(decoder_folder):
    """The tiny grouped-query Llama (6 heads over 2 key/value heads, RoPE), layer 1, head 4: every term against the
    same product made from transformers' LlamaModel with this test's own hooks, within 1e-4."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    layer, head, query, key = 1, 4, 11, 3
    loaded = load_model(str(decoder_folder))
    terms = split(loaded, str(decoder_folder), layer, head, query, key)
    model = transformers.LlamaModel.from_pretrained(decoder_folder, attn_implementation="eager").eval()
    inputs = dict(transformers.AutoTokenizer.from_pretrained(decoder_folder)(TEXT, return_tensors="pt"))
    with torch.inference_mode():
        attention = model.layers[0].self_attn
        hidden, entering_o, mlp_out = hooked_pass(model, inputs, attention.o_proj, model.layers[0].mlp)
        size = attention.head_dim
        parts = {"embed": model.embed_tokens(inputs["input_ids"])[0], "mlp0": mlp_out}
        for h in range(model.config.num_attention_heads):  # head h's z through its columns of o_proj
            parts[f"L0H{h}"] = entering_o[:, h * size : (h + 1) * size] @ attention.o_proj.weight[:, h * size : (h + 1) * size].T
        stream = hidden[layer][0]  # (N, D): what enters layer 1
        norm = model.layers[layer].input_layernorm
        sigma = (stream.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).sqrt()
        reader = model.layers[layer].self_attn
        position_ids = torch.arange(stream.shape[0])[None]
        cos, sin = model.rotary_emb(stream[None], position_ids)
        kv = head // (model.config.num_attention_heads // model.config.num_key_value_heads)

        def q_of(part, position):  # (d,): the part's query of head `head` at the position, rotated
            q = reader.q_proj(norm.weight * part / sigma)[position, head * size : (head + 1) * size]
            return apply_rotary_pos_emb(q[None, None, None], q[None, None, None], cos[:, position : position + 1], sin[:, position : position + 1])[0][0, 0, 0]

        def k_of(part, position):
            k = reader.k_proj(norm.weight * part / sigma)[position, kv * size : (kv + 1) * size]
            return apply_rotary_pos_emb(k[None, None, None], k[None, None, None], cos[:, position : position + 1], sin[:, position : position + 1])[1][0, 0, 0]

        for i, query_part in enumerate(terms.query_parts):
            for j, key_part in enumerate(terms.key_parts):
                expected = float(q_of(parts[query_part], query) @ k_of(parts[key_part], key)) * reader.scaling
                assert terms.terms[i, j] == pytest.approx(expected, abs=1e-4), (query_part, key_part)
    assert sorted(terms.query_parts) == sorted(parts)


@pytest.mark.slow  # SmolLM2: 30 layers, one whole pass
def test_smollm2s_terms_add_up_to_its_score(smollm2_cached):  # the session's one tokenizer read, said once
    loaded = load_model("smollm2")
    terms = split(loaded, "smollm2", 18, 6, 12)
    assert len(terms.query_parts) == 1 + 18 * 9 + 18  # the embeddings, 18 layers' 9 heads and MLPs
    assert terms.total == pytest.approx(terms.score, abs=1e-5 * max(1.0, abs(terms.score)))


# --- attnviz.why and `attnviz why` ---------------------------------------------------------------------------------

TOKENS = 16  # TEXT as the tiny Llama's tokenizer reads it, <s> first


def test_the_command_writes_the_terms_that_add_up_to_its_score(decoder_folder, tmp_path, capsys):
    import json

    from attnviz.cli.main import run

    out = tmp_path / "why"
    args = ["why", TEXT, "--model", str(decoder_folder), "--layer", "1", "--head", "4", "--query", "11"]
    assert run([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "query part" in printed and "share" in printed and "why.json" in printed
    record = json.loads((out / "why.json").read_text(encoding="utf-8"))
    assert record["format"] == "attnviz-why" and (record["layer"], record["head"], record["query"]) == (1, 4, 11)
    assert sum(map(sum, record["terms"])) == pytest.approx(record["score"], abs=1e-5 * max(1.0, abs(record["score"])))
    assert len(record["terms"]) == len(record["query_parts"]) and len(record["terms"][0]) == len(record["key_parts"])
    count = len(record["query_parts"]) * len(record["key_parts"])
    assert count > 10 and f"= the sum of {count} terms (why.json); 10 largest shown" in " ".join(printed.split())
    result = split(load_model(str(decoder_folder)), str(decoder_folder), 1, 4, 11)  # the key the head weighs most
    assert record["key"] == result.key and record["score"] == result.score and record["weight"] == result.weight
    assert sorted(path.name for path in out.iterdir() if not path.name.startswith(".")) == ["why.json", "why.png"]


def test_a_score_of_one_term_is_said_to_be_one_term_in_the_terminal_the_png_title_and_the_repr(decoder_folder, tmp_path, capsys):
    """The tiny Llama's layer 0 reads the token embeddings alone (RoPE: no position part, no biases): one part a side,
    one term, which is the score; each face says "1 term", never "the sum of 1 terms"."""
    import attnviz
    from attnviz.cli.main import run

    result = attnviz.why(TEXT, model=str(decoder_folder), layer=0, head=2, query=9, device="cpu")
    assert (result.terms.query_parts, result.terms.key_parts) == (["embed"], ["embed"])
    assert repr(result).endswith(f"score {result.score:.4f} in 1 term>")
    title = result.figure().axes[0].get_title()
    assert title.endswith(f"score {result.score:.4f} = 1 term (weight {result.weight:.4f})"), title
    args = ["why", TEXT, "--model", str(decoder_folder), "--layer", "0", "--head", "2", "--query", "9", "--out", str(tmp_path / "why")]
    assert run(args) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"score {result.score:.4f} (weight {result.weight:.4f}) = 1 term (why.json)" in printed
    assert "terms (why.json)" not in printed and "largest shown" not in printed


WHY_BAD_INPUTS = {
    "a query past the text": (["--query", "16"], f"--query 16 is past the text: it is {TOKENS} tokens as the model reads it (0 to {TOKENS - 1})"),
    "a key past the text": (["--query", "3", "--key", "20"], "--key 20 is past the text"),
    "a key after the query": (["--query", "3", "--key", "5"], "key 5 comes after query 3: under the causal mask its weight is 0"),
    "a head out of range": (["--query", "3", "--head", "6"], "head 6 is out of range: "),
    "a layer out of range": (["--query", "3", "--layer", "2"], "layer 2 is out of range: "),
}


@pytest.mark.parametrize("case", WHY_BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_code_2_and_writes_nothing(case, decoder_folder, tmp_path, capsys):
    from attnviz.cli.main import run

    extra, message = WHY_BAD_INPUTS[case]
    given = dict(zip(extra[::2], extra[1::2]))
    args = ["why", TEXT, "--model", str(decoder_folder), "--layer", given.pop("--layer", "1"), "--head", given.pop("--head", "0")]
    assert run([*args, *(item for pair in given.items() for item in pair), "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert list(tmp_path.iterdir()) == []


def test_a_family_whose_parts_are_not_split_yet_is_refused_in_one_line(tmp_path, capsys):
    """T5's encoder self-attention (the default stack of an encoder-decoder), whose scores add a relative position
    bias: its cross-attention alone is split (tests/test_why_cross.py)."""
    from tiny_families import build_checkpoint

    from attnviz.cli.main import run

    build_checkpoint("t5", tmp_path / "model")
    args = ["why", TEXT, "--model", str(tmp_path / "model"), "--layer", "1", "--head", "0", "--query", "1", "--out", str(tmp_path / "run")]
    assert run(args) == 2
    assert "why splits T5's cross-attention (--stack cross), not its encoder's self-attention: the relative position bias" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("family", ["roberta", "electra", "distilbert", "albert"])
def test_a_post_norm_encoders_terms_add_up_to_its_score(family, tmp_path):
    """BERT's layout, DistilBERT's and ALBERT's: every part through the embeddings' norm and each layer's two norms
    with their scales frozen (ELECTRA's and ALBERT's narrower embeddings projected up; ALBERT's one layer's norms at
    each of its layers); layer 1's parts are the word's, the position's, the token type's (DistilBERT has none), the
    norms' biases, layer 0's heads, its attention's bias and its MLP."""
    from tiny_families import build_checkpoint

    build_checkpoint(family, tmp_path)
    loaded = load_model(str(tmp_path))
    for layer, head, query in ((0, 1, 4), (1, 3, 6)):
        terms = split(loaded, str(tmp_path), layer, head, query)
        assert terms.total == pytest.approx(terms.score, abs=1e-5 * max(1.0, abs(terms.score)))
    expected = {"embed", "pos", "emb.norm.bias", "L0H0", "L0.bias", "L0.norm1.bias", "mlp0", "L0.norm2.bias", "bias"}
    assert expected | ({"type"} if family != "distilbert" else set()) <= set(terms.query_parts)


def test_the_bundled_berts_terms_add_up_to_its_score(bundled_bert):
    """attnviz's own BERT (all-MiniLM-L6-v2), whose layers run in its place: the parts of layer 5's input, through
    every norm of the five layers before it."""
    spec = run_spec(bundled_bert, layer=5)
    encoded = encode_texts(bundled_bert, ["我想吃酸菜鱼 because the fish is sour"], spec)
    terms = score_terms(bundled_bert, encoded, spec, 5, 7, 4)
    assert len(terms.query_parts) == 4 + 5 * (12 + 4) + 1  # the embeddings' 4, each layer's 16, W_Q's bias
    assert terms.total == pytest.approx(terms.score, abs=1e-5 * max(1.0, abs(terms.score)))


@pytest.mark.slow  # SmolLM2: its roles, then four splits
def test_smollm2s_induction_heads_read_their_key_through_a_previous_token_head(smollm2_cached):
    """K-composition (Olsson et al. 2022), found in the terms: over a sequence of words said twice, each of the first
    induction heads attnviz.roles labels weighs, from a token of the second half, the key after that token's first
    occurrence; the key side's largest part of that score (the key parts' terms summed over the query's parts) is an
    earlier head that roles labels previous-token."""
    import numpy as np

    import attnviz

    model = attnviz.load("smollm2", device="cpu")
    words = "apple river stone cloud green table music light paper ocean garden silver window tiger planet forest castle dream".split()
    sequence = " ".join(np.random.default_rng(0).choice(words, 12, replace=True))
    text = f"{sequence} {sequence}"
    labels = attnviz.roles(text, model=model).labels
    induction = [(layer, head) for layer, row in enumerate(labels) for head, names in enumerate(row) if "induction" in names]
    previous = {f"L{layer}H{head}" for layer, row in enumerate(labels) for head, names in enumerate(row) if "previous-token" in names}
    ids = model.loaded.tokenizer.encode_batch([text])[0]
    half = len(ids) // 2
    assert ids[1:half] == ids[half + 1 :]  # the second half repeats the first, token for token (the first word has no space)
    query = len(ids) - 3
    assert len(induction) >= 4
    for layer, head in induction[:4]:
        terms = attnviz.why(text, model=model, layer=layer, head=head, query=query).terms
        assert terms.key == query - half + 1  # the token after the query's token's first occurrence
        by_key_part = terms.terms.sum(axis=0)
        assert terms.key_parts[int(np.argmax(by_key_part))] in previous, (layer, head)


def test_gpt2s_terms_are_the_products_of_its_parts_through_its_own_conv1d_and_layernorm(tmp_path):
    """A tiny GPT-2 (LayerNorm, biases everywhere, learned positions), layer 1, head 2: every term against the product
    made from transformers' GPT2Model with this test's own hooks (c_proj's input, the MLP's output), its ln_1 with the
    position's scale frozen and each part centred, c_attn's columns and its scale, within 1e-4."""
    from tiny_families import build_checkpoint

    build_checkpoint("gpt2", tmp_path)
    layer, head, query, key = 1, 2, 9, 4
    loaded = load_model(str(tmp_path))
    terms = split(loaded, str(tmp_path), layer, head, query, key)
    model = transformers.GPT2Model.from_pretrained(tmp_path, attn_implementation="eager").eval()
    tokenized = transformers.AutoTokenizer.from_pretrained(tmp_path)(TEXT, return_tensors="pt")
    inputs = {name: tokenized[name] for name in ("input_ids", "attention_mask")}  # GPT-2 adds wte(token_type_ids) when given
    block = model.h[0]
    with torch.inference_mode():
        hidden, entering_c_proj, mlp_out = hooked_pass(model, inputs, block.attn.c_proj, block.mlp)
        size = model.config.n_embd // model.config.n_head
        ids = inputs["input_ids"][0]
        parts = {"embed": model.wte(ids), "pos": model.wpe(torch.arange(len(ids))), "mlp0": mlp_out, "L0.bias": block.attn.c_proj.bias.expand(len(ids), -1)}
        for h in range(model.config.n_head):  # Conv1D: x @ weight (in, out), head h's rows of c_proj
            parts[f"L0H{h}"] = entering_c_proj[:, h * size : (h + 1) * size] @ block.attn.c_proj.weight[h * size : (h + 1) * size]
        stream = hidden[layer][0]
        norm, attention = model.h[layer].ln_1, model.h[layer].attn
        sigma = ((stream - stream.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        normed = {name: norm.weight * (part - part.mean(-1, keepdim=True)) / sigma for name, part in parts.items()}
        normed["norm.bias"] = norm.bias.expand(len(ids), -1)
        width = model.config.n_embd
        columns = {"q": slice(head * size, (head + 1) * size), "k": slice(width + head * size, width + (head + 1) * size)}

        def side(name, position, which):  # (d,): the part's q or k of head `head` at the position; "bias": c_attn's
            if name == "bias":
                return attention.c_attn.bias[columns[which]]
            return normed[name][position] @ attention.c_attn.weight[:, columns[which]]

        for i, query_part in enumerate(terms.query_parts):
            for j, key_part in enumerate(terms.key_parts):
                expected = float(side(query_part, query, "q") @ side(key_part, key, "k")) / size**0.5
                assert terms.terms[i, j] == pytest.approx(expected, abs=1e-4), (query_part, key_part)
    assert sorted(terms.query_parts) == sorted([*normed, "bias"])

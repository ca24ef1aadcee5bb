"""A head's effect (analysis/effect.py): each head taken out in turn, the rest of the model run again from its layer.

Checked against transformers' own model (with its language-model head for decoders and encoder-decoders: the
*ForCausalLM and *ForConditionalGeneration classes, loaded by transformers from the same folder), run whole once
per head, with a forward pre-hook on that layer's output projection that zeroes the head's slice of its input, or
puts there the slice's mean over the positions of the unhooked pass. KL(p ‖ q), the loss change and the cosine
distances are computed here from its outputs, in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from helpers import assert_records_match, assert_shows
from tiny_families import BPE_VOCAB, _DECODER, _ENCODER, bpe_tokenizer, build_checkpoint, save_checkpoint, wordpiece_tokenizer

pytestmark = pytest.mark.slow  # checkpoints built and loaded by transformers

TEXT = "The cat sat on the mat because it was tired. Attention is all you need."

DECODERS = {
    # 6 query heads over 2 key/value heads, RoPE; its own lm_head (not tied to the embeddings)
    "llama": lambda: (
        transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **_DECODER),
        transformers.LlamaForCausalLM, lambda: bpe_tokenizer(bos=True), "model.layers.{}.self_attn.o_proj",
    ),
    # fused c_attn, Conv1D c_proj; lm_head tied to wte
    "gpt2": lambda: (
        transformers.GPT2Config(vocab_size=BPE_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        transformers.GPT2LMHeadModel, lambda: bpe_tokenizer(bos=False), "transformer.h.{}.attn.c_proj",
    ),
}


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request, tmp_path_factory):
    config, model_class, tokenizer, projection = DECODERS[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    warm_up(save_checkpoint(config, model_class, tokenizer(), folder, seed=1))
    return folder, projection


def warm_up(model) -> None:
    """One forward pass, thrown away: a process's first one on the CPU now and then rounds otherwise (seen: the tiny
    GPT-2's loss 1.4e-5 off, one run in four), and neither side of a comparison should be that one."""
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), **({"decoder_input_ids": torch.tensor([[1, 2]])} if model.config.is_encoder_decoder else {}))


def taken_out_one_by_one(model, projections: list[str], num_heads: int, forward, compare, ablation: str, layers=None) -> dict:
    """{name: (L, H)} of compare(output with every head, output with one head taken out), for each head of `layers`
    (default all; 0 elsewhere): model run whole by forward(model) once per head, a pre-hook on that layer's output
    projection (projections[layer]: a module that several layers share, ALBERT's, is hooked at that layer's own
    call) setting the head's slice of its input to 0 or to its mean over the positions of the unhooked pass."""
    modules = [model.get_submodule(name) for name in projections]
    num_layers = len(modules)
    nth = [sum(modules[other] is modules[layer] for other in range(layer)) for layer in range(num_layers)]
    seen: dict[int, list] = {}  # id(module) -> what entered it, call by call, in the unhooked pass
    hooks = [
        module.register_forward_pre_hook(lambda module, args: seen.setdefault(id(module), []).append(args[0].clone()))
        for module in {id(module): module for module in modules}.values()
    ]
    with torch.no_grad():
        every = forward(model)
    for hook in hooks:
        hook.remove()
    head_dim = seen[id(modules[0])][0].shape[-1] // num_heads
    values: dict[str, np.ndarray] = {}
    for layer in range(num_layers) if layers is None else layers:
        entered = seen[id(modules[layer])][nth[layer]]
        for head in range(num_heads):
            part, calls = slice(head * head_dim, (head + 1) * head_dim), []

            def take_out(module, args, layer=layer, part=part, entered=entered, calls=calls):
                calls.append(None)
                if len(calls) - 1 != nth[layer]:
                    return None
                x = args[0].clone()
                x[..., part] = 0.0 if ablation == "zero" else entered[0, :, part].mean(dim=0)
                return (x,)

            hook = modules[layer].register_forward_pre_hook(take_out)
            with torch.no_grad():
                without = forward(model)
            hook.remove()
            for name, value in compare(every, without).items():
                values.setdefault(name, np.zeros((num_layers, num_heads)))[layer, head] = value
    return values


def predictions(targets):
    """compare for logits (1, N, V): KL(p ‖ q) mean over the positions, and the loss change over the first
    len(targets) positions (each predicting its target); "every_loss" the loss with every head."""

    def nll(log_q):
        return float(-log_q[: len(targets)].gather(1, targets[:, None]).mean())

    def compare(every, without):
        p, q = (torch.log_softmax(logits[0].double(), dim=-1) for logits in (every, without))
        return {"kl": float((p.exp() * (p - q)).sum(dim=-1).mean()), "loss": nll(q) - nll(p), "every_loss": nll(p)}

    return compare


def reference_effects(folder, projection: str, text: str, ablation: str, layers=None) -> tuple[np.ndarray, np.ndarray, float]:
    """A decoder's (L, H) KL and loss change, and its loss with every head, from transformers' model."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")["input_ids"]
    values = taken_out_one_by_one(
        model, [projection.format(layer) for layer in range(model.config.num_hidden_layers)], model.config.num_attention_heads,
        lambda model: model(ids).logits, predictions(ids[0, 1:]), ablation, layers,
    )  # fmt: skip
    return values["kl"], values["loss"], float(values["every_loss"][layers[0] if layers else 0, 0])


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_each_heads_effect_is_transformers_model_with_that_head_taken_out(decoder, ablation):
    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    folder, projection = decoder
    loaded = load_model(str(folder), device="cpu")
    effects = head_effects(loaded, TEXT, RunSpec(str(folder), str(folder), "local folder", device="cpu"), ablation)
    kl, change, loss = reference_effects(folder, projection, TEXT, ablation)
    assert effects.layers == list(range(loaded.num_layers)) and effects.ablation == ablation
    np.testing.assert_allclose(effects.loss, loss, rtol=1e-5)
    # within 1e-5: float32's rounding differs between a batch of H copies and one text (BLAS's blocking), and the
    # wide random weights make the logits large (KL here 0.1 to 0.7 nats; seen at most 7e-6 apart)
    np.testing.assert_allclose(effects.values["kl"], kl, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(effects.values["loss"], change, rtol=1e-5, atol=1e-5)
    assert (kl > 1e-4).all()  # every head matters here (wide random weights): a test that could fail
    assert not np.allclose(kl[:, 0], kl[:, 1])


def test_the_layers_asked_for_alone_are_measured(decoder):
    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    folder, _ = decoder
    loaded = load_model(str(folder), device="cpu")
    spec = RunSpec(str(folder), str(folder), "local folder", device="cpu")
    every = head_effects(loaded, TEXT, spec)
    last = head_effects(loaded, TEXT, spec, layers=[loaded.num_layers - 1])
    assert np.isnan(last.values["kl"][0]).all()
    np.testing.assert_array_equal(last.values["kl"][-1], every.values["kl"][-1])


def test_smollm2s_heads_taken_out_are_transformers_model_without_them(smollm2_cached):
    """The bundled SmolLM2 (tied head, 9 heads over 3 key/value heads), three layers' heads: as transformers' own
    LlamaForCausalLM, its weights from transformers' own GGUF loader, with each head zeroed at o_proj."""
    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    loaded = load_model("smollm2", device="cpu")
    layers = [0, 14, loaded.num_layers - 1]
    effects = head_effects(loaded, TEXT, RunSpec("smollm2", loaded.name, loaded.source, device="cpu"), layers=layers)
    kl, change, loss = reference_effects(smollm2_cached.reference_folder, "model.layers.{}.self_attn.o_proj", TEXT, "zero", layers)
    np.testing.assert_allclose(effects.loss, loss, rtol=1e-5)
    np.testing.assert_allclose(effects.values["kl"][layers], kl[layers], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(effects.values["loss"][layers], change[layers], rtol=1e-5, atol=1e-5)
    assert effects.values["kl"][layers].max() > 1e-3  # some head matters


# ---- effect= and --effect: the chosen layer's heads beside their maps ----


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    config, model_class, tokenizer, _ = DECODERS["llama"]()
    folder = tmp_path_factory.mktemp("llama-effect")
    warm_up(save_checkpoint(config, model_class, tokenizer(), folder, seed=1))
    return folder


def test_heads_effect_is_the_layers_heads_taken_out_in_the_result_its_json_and_its_table(tiny_llama, tmp_path, capsys):
    import json

    import attnviz
    from attnviz.analysis.effect import PAPER, head_effects
    from attnviz.cli import run
    from attnviz.spec import RunSpec

    result = attnviz.heads(TEXT, model=str(tiny_llama), layer=1, effect="mean", device="cpu")
    loaded = attnviz.load(str(tiny_llama), device="cpu").loaded
    alone = head_effects(loaded, TEXT, RunSpec(str(tiny_llama), str(tiny_llama), "local folder"), "mean", [1])
    np.testing.assert_array_equal(result.effects.values["kl"][1], alone.values["kl"][1])
    assert result.effects.layers == [1] and np.isnan(result.effects.values["kl"][0]).all()
    record = result.to_dict()["effects"]
    assert record["ablation"] == "mean" and record["paper"] == PAPER and record["layers"] == [1]
    np.testing.assert_allclose(record["kl"], alone.values["kl"][[1]], atol=1e-7)
    np.testing.assert_allclose(record["loss"], alone.values["loss"][[1]], atol=1e-7)

    out = tmp_path / "run"
    assert run(["heads", TEXT, "--model", str(tiny_llama), "--layer", "1", "--effect", "mean", "--no-html", "--out", str(out)]) == 0
    written = json.loads((out / "attention.json").read_text(encoding="utf-8"))["effects"]
    assert_records_match([written["kl"], written["loss"]], [record["kl"], record["loss"]])  # another run: within float32
    printed = capsys.readouterr().out
    assert "Δloss" in printed
    assert_shows(printed, alone.values["kl"][1, 0], 4)  # the command's run: within float32
    assert "replaced by its mean over the positions" in " ".join(printed.split())

    # beside each head's map: heads.png's panel titles and each head figure's title
    panels = [ax.get_title() for ax in result.figure().axes if ax.get_title()]
    own = result.effects.values  # the figure's own run
    assert [title.split(" · ")[-1] for title in panels] == [f"KL {value:.3f}" for value in own["kl"][1]]
    title = " ".join(" ".join(ax.get_title() for ax in result.figure(head=2).axes).split())
    assert f"taken out (mean): KL {own['kl'][1, 2]:.3f}, Δloss {own['loss'][1, 2]:+.3f}" in title


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--effect", "half"], "'half'"),
        (["--effect", "zero", "--heads", "3"], "--effect takes the model's own heads out of the model itself: leave out --kv, --heads and --weights"),
        (["--effect", "zero", "--weights", "random"], "leave out --kv, --heads and --weights"),
        (["--effect", "zero", "--kv", "Another text."], "leave out --kv, --heads and --weights"),
    ],
)
def test_what_effect_refuses_is_one_line_and_exit_2_with_nothing_written(tiny_llama, tmp_path, capsys, args, message):
    from attnviz.cli import run

    out = tmp_path / "out"
    model = [] if "--model" in args else ["--model", str(tiny_llama)]
    assert run(["heads", TEXT, *model, *args, "--device", "cpu", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in " ".join(error.split()) and "Traceback" not in error and len(error.strip().splitlines()) == 1
    assert not out.exists()


def test_effect_over_a_list_or_a_file_is_refused(tiny_llama, tmp_path, capsys):
    import attnviz
    from attnviz.cli import run
    from attnviz.errors import AttnvizError

    with pytest.raises(AttnvizError, match="over one text"):
        attnviz.heads([TEXT, TEXT], model=str(tiny_llama), effect="zero")
    assert run(["heads", "--file", "-", "--effect", "zero", "--model", str(tiny_llama), "--out", str(tmp_path / "o")]) == 2
    assert "--effect measures each head over one text" in capsys.readouterr().err


def test_layers_effect_is_every_layers_heads_in_effects_json_and_png(tiny_llama, tmp_path, capsys):
    """layers --effect: every layer × head taken out, each layer's row the very numbers heads --effect gives it."""
    import json

    import attnviz
    from attnviz.cli import run

    every = attnviz.layers(TEXT, model=str(tiny_llama), effect="zero", device="cpu").effects
    assert every.layers == [0, 1] and not np.isnan(every.values["kl"]).any()
    one = attnviz.heads(TEXT, model=str(tiny_llama), layer=1, effect="zero", device="cpu").effects
    np.testing.assert_array_equal(every.values["kl"][1], one.values["kl"][1])
    np.testing.assert_array_equal(every.values["loss"][1], one.values["loss"][1])

    out = tmp_path / "run"
    assert run(["layers", TEXT, "--model", str(tiny_llama), "--effect", "zero", "--out", str(out)]) == 0
    record = json.loads((out / "effects.json").read_text(encoding="utf-8"))
    assert record["format"] == "attnviz-effects" and record["ablation"] == "zero" and record["layers"] == [0, 1]
    np.testing.assert_allclose(record["kl"], every.values["kl"], atol=1e-7)
    np.testing.assert_allclose(record["loss"], every.values["loss"], atol=1e-7)
    assert (out / "effects.png").stat().st_size > 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "KL when the head is taken out" in printed
    assert_shows(printed, every.values["kl"][0, 0], 4)  # the command's run: within float32


def test_copies_a_few_at_a_time_and_positions_a_block_at_a_time_give_the_same_numbers(tiny_llama, monkeypatch):
    """The logits of a layer's copies in batches of one (LOGITS_BYTES small), and the distributions over 3 positions at
    a time (DISTRIBUTIONS_BYTES small: a long text's bounded memory), give the numbers of all at once."""
    from attnviz.analysis import effect
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    loaded = load_model(str(tiny_llama), device="cpu")
    spec = RunSpec(str(tiny_llama), str(tiny_llama), "local folder", device="cpu")
    together = effect.head_effects(loaded, TEXT, spec)
    monkeypatch.setattr(effect, "LOGITS_BYTES", 1)
    one_by_one = effect.head_effects(loaded, TEXT, spec)
    monkeypatch.setattr(effect, "DISTRIBUTIONS_BYTES", 3 * 32 * BPE_VOCAB)  # 3 positions at a time
    in_blocks = effect.head_effects(loaded, TEXT, spec)
    assert len(together.tokens) > 6 and in_blocks.loss == pytest.approx(together.loss, rel=1e-6)
    # The logits are float32 products whose rounding depends on the block's shape (the BLAS kernel a shape gets), so
    # the loss change, a difference of two means of about 10 nats, is exact to about 1e-7 of them: 1e-6 nats. (It
    # held at rtol 1e-6 alone on one CPU and missed by 3e-7 nats on another.) The KL, from the same logits, holds 1e-6.
    atol = {"loss": 1e-6}
    for name in together.names:
        np.testing.assert_allclose(one_by_one.values[name], together.values[name], rtol=1e-6, atol=atol.get(name, 1e-9))
        np.testing.assert_allclose(in_blocks.values[name], together.values[name], rtol=1e-6, atol=atol.get(name, 1e-9))


# ---- encoders: the cosine distance of the last hidden states (and of a sentence embedding) ----

ENCODERS = {
    # attnviz's own BertEncoder reads it; transformers' BertModel is the reference
    "bert": lambda: (transformers.BertConfig(vocab_size=30522, **_ENCODER), transformers.BertModel, "encoder.layer.{}.attention.output.dense"),
    # one layer's parameters shared by both layers: its W_o is called once per layer
    "albert": lambda: (
        transformers.AlbertConfig(vocab_size=30522, embedding_size=16, **_ENCODER), transformers.AlbertModel,
        "encoder.albert_layer_groups.0.albert_layers.0.attention.dense",
    ),
    "distilbert": lambda: (
        transformers.DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
        transformers.DistilBertModel, "transformer.layer.{}.attention.out_lin",
    ),
}


def cosine_distances(every, without) -> dict:
    """compare for last hidden states (1, N, D): 1 - cos per token, mean; and of the mean over the tokens."""
    cosine = torch.nn.functional.cosine_similarity
    every, without = every[0].double(), without[0].double()
    return {
        "cosine": float((1 - cosine(every, without, dim=-1)).mean()),
        "pooled": float(1 - cosine(every.mean(dim=0), without.mean(dim=0), dim=0)),
    }


@pytest.mark.parametrize("ablation", ["zero", "mean"])
@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_an_encoders_heads_taken_out_are_transformers_model_without_them(family, ablation, tmp_path):
    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    config, model_class, projection = ENCODERS[family]()
    warm_up(save_checkpoint(config, model_class, wordpiece_tokenizer(), tmp_path, seed=1))
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.is_bert == (family == "bert")
    effects = head_effects(loaded, TEXT, RunSpec(str(tmp_path), str(tmp_path), "local folder", device="cpu"), ablation)
    model = transformers.AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = transformers.AutoTokenizer.from_pretrained(tmp_path)(TEXT, return_tensors="pt")["input_ids"]
    projections = [projection.format(layer) for layer in range(2)]
    expected = taken_out_one_by_one(model, projections, 4, lambda model: model(ids).last_hidden_state, cosine_distances, ablation)
    assert effects.names == ["cosine"] and effects.loss is None and effects.pooling is None and not effects.causal
    np.testing.assert_allclose(effects.values["cosine"], expected["cosine"], rtol=1e-5, atol=1e-6)
    assert (expected["cosine"] > 1e-4).all()  # every head matters here (wide random weights): a test that could fail


def test_a_sentence_embedding_models_heads_change_its_pooled_embedding_as_in_transformers():
    """The bundled all-MiniLM-L6-v2 (attnviz's BertEncoder), a sentence-transformers folder with mean pooling: the
    token-level and the pooled cosine distances, as transformers' BertModel from the same folder, mean-pooled here."""
    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import bundled_model_path, load_model
    from attnviz.spec import RunSpec

    loaded = load_model("bundled", device="cpu")
    layers = [0, 5]
    effects = head_effects(loaded, TEXT, RunSpec("bundled", loaded.name, loaded.source, device="cpu"), "zero", layers)
    folder = bundled_model_path()
    model = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(TEXT, return_tensors="pt")["input_ids"]
    forward = lambda model: model(ids).last_hidden_state  # noqa: E731
    projections = [f"encoder.layer.{layer}.attention.output.dense" for layer in range(6)]
    expected = taken_out_one_by_one(model, projections, 12, forward, cosine_distances, "zero", layers)
    assert effects.names == ["cosine", "pooled"] and effects.pooling == "mean"
    for name in effects.names:
        np.testing.assert_allclose(effects.values[name][layers], expected[name][layers], rtol=1e-5, atol=1e-6)
    assert np.isnan(effects.values["pooled"][1]).all()


# ---- encoder-decoders: the decoder's next-token predictions, with a head of any stack taken out ----

SEQ2SEQ = {
    "t5": (transformers.T5ForConditionalGeneration, {
        "encoder": "encoder.block.{}.layer.0.SelfAttention.o",
        "decoder": "decoder.block.{}.layer.0.SelfAttention.o",
        "cross": "decoder.block.{}.layer.1.EncDecAttention.o",
    }),
    "bart": (transformers.BartForConditionalGeneration, {
        "encoder": "model.encoder.layers.{}.self_attn.out_proj",
        "decoder": "model.decoder.layers.{}.self_attn.out_proj",
        "cross": "model.decoder.layers.{}.encoder_attn.out_proj",
    }),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(SEQ2SEQ))
def seq2seq(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    build_checkpoint(request.param, folder, seed=1)
    model_class, projections = SEQ2SEQ[request.param]
    model = model_class.from_pretrained(folder, attn_implementation="eager").eval()
    warm_up(model)
    return folder, model, projections


@pytest.mark.parametrize("stack", ["encoder", "decoder", "cross"])
def test_an_encoder_decoders_heads_taken_out_are_transformers_model_without_them(seq2seq, stack):
    """The text to the encoder, the decoder reading it shifted right behind its start token and predicting each of
    its tokens (teacher forcing): KL and loss change as transformers' model with its language-model head (T5's
    d_model^-0.5 scaling, BART's tied head) with each head of the stack taken out."""
    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    folder, model, projections = seq2seq
    loaded = load_model(str(folder), device="cpu")
    effects = head_effects(loaded, TEXT, RunSpec(str(folder), str(folder), "local folder", device="cpu", stack=stack), "zero")
    ids = transformers.AutoTokenizer.from_pretrained(folder)(TEXT, return_tensors="pt")["input_ids"]
    shifted = torch.cat([torch.tensor([[model.config.decoder_start_token_id]]), ids[:, :-1]], dim=1)
    forward = lambda model: model(input_ids=ids, decoder_input_ids=shifted).logits  # noqa: E731
    names = [projections[stack].format(layer) for layer in range(loaded.num_layers_of(stack))]
    expected = taken_out_one_by_one(model, names, loaded.num_heads_of(stack), forward, predictions(ids[0]), "zero")
    assert effects.names == ["kl", "loss"] and effects.stack == stack and effects.causal == (stack == "decoder")
    np.testing.assert_allclose(effects.loss, expected["every_loss"][0, 0], rtol=1e-5)
    np.testing.assert_allclose(effects.values["kl"], expected["kl"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(effects.values["loss"], expected["loss"], rtol=1e-5, atol=1e-5)
    assert (expected["kl"] > 1e-4).all()


def test_an_encoders_effects_are_named_as_such_in_the_table_the_grid_and_the_json(tmp_path, capsys):
    """`layers --effect` on the bundled sentence-embedding BERT: the grid is of cos, effects.json holds cosine and
    pooled (mean pooling) and no loss, each layer's row the numbers of heads --effect on that layer."""
    import json

    import attnviz
    from attnviz.cli import run

    out = tmp_path / "run"
    assert run(["layers", TEXT, "--model", "bundled", "--effect", "zero", "--out", str(out)]) == 0
    record = json.loads((out / "effects.json").read_text(encoding="utf-8"))
    assert record["pooling"] == "mean" and record["short_names"] == {"cosine": "cos", "pooled": "pooled"}
    assert "loss_with_every_head" not in record and "kl" not in record and np.array(record["cosine"]).shape == (6, 12)
    printed = " ".join(capsys.readouterr().out.split())
    assert "cos when the head is taken out, by layer and head" in printed and "mean pooling, the model's own" in printed
    one = attnviz.heads(TEXT, model="bundled", layer=4, effect="zero", device="cpu")
    np.testing.assert_allclose(record["cosine"][4], one.effects.values["cosine"][4], atol=1e-7)
    np.testing.assert_allclose(record["pooled"][4], one.effects.values["pooled"][4], atol=1e-7)
    title = " ".join(" ".join(ax.get_title() for ax in one.figure(head=3).axes).split())
    assert f"taken out (zero): cos {one.effects.values['cosine'][4, 3]:.4f}" in title  # 4 decimals: values of about 0.005

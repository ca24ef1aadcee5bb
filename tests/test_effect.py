"""A head's effect (analysis/effect.py): each head taken out in turn, the rest of the model run again from its layer.

Checked against transformers' own model with its language-model head (the *ForCausalLM class, loaded by
transformers from the same folder), run whole once per head, with a forward pre-hook on that layer's output
projection that zeroes the head's slice of its input, or puts there the slice's mean over the positions of the
unhooked pass. KL(p ‖ q) and the loss change are computed here from its logits, in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tiny_families import BPE_VOCAB, _DECODER, bpe_tokenizer, save_checkpoint

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
        model(torch.tensor([[1, 2, 3]]))


def reference_effects(folder, projection: str, text: str, ablation: str, layers=None) -> tuple[np.ndarray, np.ndarray, float]:
    """(L, H) KL and loss change (of `layers`, default all; 0 elsewhere), and the loss with every head, from
    transformers' model run whole once per head."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")["input_ids"]
    config = model.config
    num_layers, num_heads = config.num_hidden_layers, config.num_attention_heads
    head_dim = config.hidden_size // num_heads

    seen = {}  # layer -> the unhooked input of its output projection (1, N, H * d)
    hooks = [
        model.get_submodule(projection.format(layer)).register_forward_pre_hook(
            lambda module, args, layer=layer: seen.setdefault(layer, args[0].clone())
        )
        for layer in range(num_layers)
    ]
    with torch.no_grad():
        every = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # (N, V)
    for hook in hooks:
        hook.remove()
    targets = ids[0, 1:]
    loss = float(-every[:-1, :].gather(1, targets[:, None]).mean())
    kl, change = np.zeros((num_layers, num_heads)), np.zeros((num_layers, num_heads))
    for layer in range(num_layers) if layers is None else layers:
        for head in range(num_heads):
            part = slice(head * head_dim, (head + 1) * head_dim)

            def take_out(module, args, layer=layer, part=part):
                x = args[0].clone()
                x[..., part] = 0.0 if ablation == "zero" else seen[layer][0, :, part].mean(dim=0)
                return (x,)

            hook = model.get_submodule(projection.format(layer)).register_forward_pre_hook(take_out)
            with torch.no_grad():
                without = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            hook.remove()
            kl[layer, head] = float((every.exp() * (every - without)).sum(dim=-1).mean())
            change[layer, head] = float(-without[:-1].gather(1, targets[:, None]).mean()) - loss
    return kl, change, loss


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


def test_smollm2s_heads_taken_out_are_transformers_model_without_them():
    """The bundled SmolLM2 (tied head, 9 heads over 3 key/value heads), three layers' heads: as transformers' own
    LlamaForCausalLM from the same converted folder with each head zeroed at o_proj."""
    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import load_model
    from attnviz.models.smollm2 import smollm2_folder
    from attnviz.spec import RunSpec

    loaded = load_model("smollm2", device="cpu")
    layers = [0, 14, loaded.num_layers - 1]
    effects = head_effects(loaded, TEXT, RunSpec("smollm2", loaded.name, loaded.source, device="cpu"), layers=layers)
    kl, change, loss = reference_effects(smollm2_folder(), "model.layers.{}.self_attn.o_proj", TEXT, "zero", layers)
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
    assert written["kl"] == record["kl"] and written["loss"] == record["loss"]
    printed = capsys.readouterr().out
    assert "Δloss" in printed and f"{alone.values['kl'][1, 0]:.4f}" in printed
    assert "replaced by its mean over the positions" in " ".join(printed.split())

    # beside each head's map: heads.png's panel titles and each head figure's title
    panels = [ax.get_title() for ax in result.figure().axes if ax.get_title()]
    assert [title.split(" · ")[-1] for title in panels] == [f"KL {value:.3f}" for value in alone.values["kl"][1]]
    title = " ".join(" ".join(ax.get_title() for ax in result.figure(head=2).axes).split())
    assert f"taken out (mean): KL {alone.values['kl'][1, 2]:.3f}, Δloss {alone.values['loss'][1, 2]:+.3f}" in title


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--effect", "half"], "'half'"),
        (["--effect", "zero", "--heads", "3"], "leave out kv, heads, weights and stack"),
        (["--effect", "zero", "--weights", "random"], "leave out kv, heads, weights and stack"),
        (["--effect", "zero", "--model", "bundled"], "measures a decoder's heads"),
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
    assert "KL when the head is taken out" in printed and f"{every.values['kl'][0, 0]:.4f}" in printed


def test_copies_a_few_at_a_time_give_the_same_numbers_and_a_text_past_the_budget_is_refused(tiny_llama, monkeypatch):
    """The logits of a layer's copies in batches of one (LOGITS_BYTES small) give the numbers of all at once; a text
    whose next-token distributions would pass DISTRIBUTIONS_BYTES is refused in one line, naming how long may be."""
    from attnviz.analysis import effect
    from attnviz.errors import AttnvizError
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    loaded = load_model(str(tiny_llama), device="cpu")
    spec = RunSpec(str(tiny_llama), str(tiny_llama), "local folder", device="cpu")
    together = effect.head_effects(loaded, TEXT, spec)
    monkeypatch.setattr(effect, "LOGITS_BYTES", 1)
    one_by_one = effect.head_effects(loaded, TEXT, spec)
    for name in effect.EFFECTS:
        np.testing.assert_allclose(one_by_one.values[name], together.values[name], rtol=1e-6, atol=1e-9)
    monkeypatch.setattr(effect, "DISTRIBUTIONS_BYTES", 24 * BPE_VOCAB * 10)
    with pytest.raises(AttnvizError, match=f"whole vocabulary \\({BPE_VOCAB:,} tokens\\).*up to 10 tokens, and this text has"):
        effect.head_effects(loaded, TEXT, spec)

"""Generation step by step (analysis/generation.py, `attnviz generate`, attnviz.generate).

Each generated token's rows come from attnviz's layers with their own key/value cache as the model generates.
Checked two ways, both against transformers' own model with eager attention from the same folder:
- one causal pass over the prompt and the continuation (output_attentions): row by row, within 1e-5;
- transformers' generate(output_attentions=True, return_dict_in_generate=True), greedy: the same ids, and each
  step's row of the token it read.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from tiny_families import BPE_VOCAB, _DECODER, bpe_tokenizer, save_checkpoint

pytestmark = pytest.mark.slow  # checkpoints built and loaded by transformers

PROMPT = "The cat sat on the mat because"
TOKENS = 12

DECODERS = {
    # 6 query heads over 2 key/value heads, RoPE, an untied lm_head
    "llama": lambda: (transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **_DECODER), transformers.LlamaForCausalLM, True),
    # learned positions, fused c_attn, lm_head tied to wte
    "gpt2": lambda: (transformers.GPT2Config(vocab_size=BPE_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64), transformers.GPT2LMHeadModel, False),
}


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request, tmp_path_factory):
    config, model_class, bos = DECODERS[request.param]()
    config.eos_token_id = None  # never stops: every test sees TOKENS tokens
    folder = tmp_path_factory.mktemp(request.param)
    model = save_checkpoint(config, model_class, bpe_tokenizer(bos=bos), folder, seed=2)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))  # a process's first forward pass, thrown away (tests/test_effect.py's warm_up)
    return folder, transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def generated(folder, **options):
    import attnviz

    return attnviz.generate(PROMPT, model=str(folder), tokens=TOKENS, device="cpu", **options)


def test_each_generated_row_is_that_of_one_causal_pass_over_prompt_and_continuation(decoder):
    folder, model = decoder
    result = generated(folder)
    generation = result.generation
    ids = torch.tensor([generation.prompt_ids + generation.ids])
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions  # L × (1, H, T, T)
    prompt = generation.num_prompt
    assert len(generation.ids) == TOKENS and generation.rows.shape == (len(attentions), attentions[0].shape[1], TOKENS, prompt + TOKENS)
    for layer, weights in enumerate(attentions):
        np.testing.assert_allclose(generation.rows[layer], weights[0, :, prompt:].numpy(), atol=1e-5)
    assert np.allclose(generation.rows.sum(axis=-1), 1.0, atol=1e-5)


def test_greedy_ids_and_rows_are_transformers_generates(decoder):
    folder, model = decoder
    result = generated(folder)
    generation = result.generation
    prompt = torch.tensor([generation.prompt_ids])
    with torch.no_grad():
        out = model.generate(  # the mask given: without it generate takes a token of the pad id (0, here <s>) for padding
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=TOKENS, do_sample=False, output_attentions=True,
            return_dict_in_generate=True, pad_token_id=0,
        )  # fmt: skip
    assert out.sequences[0, prompt.shape[1] :].tolist() == generation.ids
    for step in range(1, TOKENS):  # step s reads generated token s - 1 (step 0 is the prompt's pass)
        for layer, weights in enumerate(out.attentions[step]):  # (1, H, 1, P + s)
            np.testing.assert_allclose(generation.rows[layer, :, step - 1, : weights.shape[-1]], weights[0, :, -1].numpy(), atol=1e-5)


def test_sampling_follows_its_seed(decoder):
    folder, _ = decoder
    first, again, other = (generated(folder, sample=True, seed=seed).generation.ids for seed in (1, 1, 2))
    assert first == again and first != other
    assert generated(folder).generation.ids != first or generated(folder).generation.ids != other


def test_smollm2_generates_as_transformers_does():
    """The bundled SmolLM2 (9 heads over 3 key/value heads, tied head): 6 greedy tokens, ids and rows as transformers'
    generate with eager attention from the same converted folder."""
    import attnviz
    from attnviz.models.smollm2 import smollm2_folder

    result = attnviz.generate(PROMPT, model="smollm2", tokens=6, device="cpu")
    generation = result.generation
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_folder(), attn_implementation="eager").eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([generation.prompt_ids]), max_new_tokens=6, do_sample=False, output_attentions=True, return_dict_in_generate=True)
    assert out.sequences[0, generation.num_prompt :].tolist() == generation.ids
    for step in range(1, 6):
        for layer in (0, 14, 29):
            weights = out.attentions[step][layer]
            np.testing.assert_allclose(generation.rows[layer, :, step - 1, : weights.shape[-1]], weights[0, :, -1].numpy(), atol=1e-5)


def test_generate_writes_its_figure_its_json_and_its_report(decoder, tmp_path, capsys):
    from attnviz.cli import run

    folder, _ = decoder
    out = tmp_path / "run"
    assert run(["generate", PROMPT, "--model", str(folder), "--tokens", "5", "--layer", "1", "--out", str(out)]) == 0
    record = json.loads((out / "generate.json").read_text(encoding="utf-8"))
    assert record["format"] == "attnviz-generate" and len(record["ids"]) == 5 and record["layer"] == 1
    assert np.array(record["rows"]).shape[1:] == (5, len(record["prompt_ids"]) + 5)
    assert {path.name for path in out.iterdir() if not path.name.startswith(".")} == {"generate.png", "generate.json", "report.html"}
    printed = capsys.readouterr().out
    continuation = "".join(record["tokens"][len(record["prompt_ids"]) :])  # as shown
    assert "".join(continuation.split()) in "".join(printed.split())
    assert not any(ord(char) < 32 and char not in "\n" for char in printed)  # never a raw control character


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "bundled"], "generate continues a text with a decoder"),
        (["--tokens", "0"], "--tokens"),
    ],
)
def test_what_generate_refuses_is_one_line_and_exit_2(decoder, tmp_path, capsys, args, message):
    from attnviz.cli import run

    folder, _ = decoder
    model = [] if "--model" in args else ["--model", str(folder)]
    out = tmp_path / "out"
    assert run(["generate", PROMPT, *model, *args, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error and len(error.strip().splitlines()) == 1
    assert not out.exists()


def test_the_reports_generation_view_steps_through_the_continuation(decoder, tmp_path, opened):
    """report.html opens on the Generation view; at step 3, layer 1, head 2 the tokens written are the prompt's and
    the first three generated, each coloured by that head's weight from the third generated token, which the
    read-out names with its sink share."""
    folder, _ = decoder
    result = generated(folder)
    generation = result.generation
    page = opened(result.report().save(tmp_path / "report")[0])
    page.page.wait_for_selector("#generation-tokens .generation-token", state="attached")
    assert page.page.get_attribute("#tab-generation", "aria-selected") == "true"
    page.page.fill("#generation-step", "3")
    page.page.dispatch_event("#generation-step", "input")
    page.page.select_option("#generation-layer", "1")
    page.page.select_option("#generation-head", "2")
    prompt = generation.num_prompt
    row = generation.rows[1, 2, 2]
    assert len(page.texts("#generation-tokens .generation-token")) == prompt + 3
    readout = page.texts("#generation-readout")[0]
    assert readout.startswith(f"step 3 of {TOKENS}: {prompt + 2}:{generation.shown_tokens[prompt + 2]} (id {generation.ids[2]}) · layer 1 · head 2")
    assert f"sink {row[0]:.4f}" in readout
    for position in (0, prompt + 2):
        colour = page.page.evaluate(f"getComputedStyle(document.querySelector('#generation-tokens [data-index=\"{position}\"]')).backgroundColor")
        expected = page.page.evaluate(f"window.AV.colour({float(round(row[position], 4))}, false)")
        assert colour == f"rgb({expected[0]}, {expected[1]}, {expected[2]})"


def test_generate_json_summarises_every_layers_heads_at_each_step(decoder):
    """generate.json's sink, previous, entropy and distance per layer, head and step, from the rows as defined."""
    folder, _ = decoder
    result = generated(folder)
    record, rows = result.to_dict(), result.rows.astype(np.float64)
    prompt = result.generation.num_prompt
    layer, head, step = 1, 2, 4
    row = rows[layer, head, step, : prompt + step + 1]
    assert record["sink"][layer][head][step] == pytest.approx(row[0], abs=1e-6)
    assert record["previous"][layer][head][step] == pytest.approx(row[-2], abs=1e-6)
    assert record["entropy"][layer][head][step] == pytest.approx(-(row * np.log(row)).sum(), abs=1e-6)
    assert record["distance"][layer][head][step] == pytest.approx((row * np.arange(len(row))[::-1]).sum(), abs=1e-6)


def test_rows_past_their_budget_are_refused_before_generating(decoder, monkeypatch):
    from attnviz.analysis import generation
    from attnviz.errors import AttnvizError

    folder, _ = decoder
    monkeypatch.setattr(generation, "ROWS_BYTES", 1000)
    with pytest.raises(AttnvizError, match=r"every layer and head's rows would take .* GB, more than .*; give --tokens \d+ or fewer"):
        generated(folder)

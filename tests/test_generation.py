"""Generation step by step (analysis/generation.py, `attnviz generate`, attnviz.generate).

Each generated token's two rows come from attnviz's layers with their own key/value cache as the model generates:
the row that chose it (that of the position before it; shown by default) and its own row as the query.
Checked two ways, both against transformers' own model with eager attention from the same folder:
- one causal pass over the prompt and the continuation (output_attentions): row by row, within 1e-5;
- transformers' generate(output_attentions=True, return_dict_in_generate=True), greedy: the same ids; its step t's
  last row is the row that chose token t, and its step t + 1's last row token t's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from types import SimpleNamespace

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


def test_each_generated_tokens_rows_are_those_of_one_causal_pass_over_prompt_and_continuation(decoder):
    """The row that chose token t is the causal pass's row P - 1 + t, token t's own its row P + t."""
    folder, model = decoder
    result = generated(folder)
    generation = result.generation
    ids = torch.tensor([generation.prompt_ids + generation.ids])
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions  # L × (1, H, T, T)
    prompt = generation.num_prompt
    assert len(generation.ids) == TOKENS and result.rows_are == "chosen"
    for rows in (result.rows, result.chosen, result.read):
        assert rows.shape == (len(attentions), attentions[0].shape[1], TOKENS, prompt + TOKENS)
        assert np.allclose(rows.sum(axis=-1), 1.0, atol=1e-5)
    for layer, weights in enumerate(attentions):
        np.testing.assert_allclose(result.rows[layer], weights[0, :, prompt - 1 : -1].numpy(), atol=1e-5)
        np.testing.assert_allclose(result.read[layer], weights[0, :, prompt:].numpy(), atol=1e-5)
    np.testing.assert_array_equal(generation.queries("chosen"), prompt - 1 + np.arange(TOKENS))


def transformers_generate(model, generation, **options):
    prompt = torch.tensor([generation.prompt_ids])
    with torch.no_grad():
        return model.generate(  # the mask given: without it generate takes a token of the pad id (0, here <s>) for padding
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=len(generation.ids), do_sample=False,
            output_attentions=True, return_dict_in_generate=True, pad_token_id=0, **options,
        )  # fmt: skip


def assert_rows_are_generates(result, out, layers) -> None:
    """Generate's step t's last row (1, H, P + t) is the row that chose token t (result.rows by default), and,
    from step 1, the row of token t - 1 (result.read); past the row's query every weight is 0."""
    generation = result.generation
    assert out.sequences[0, generation.num_prompt :].tolist() == generation.ids
    for step in range(len(generation.ids)):
        for layer in layers:
            last = out.attentions[step][layer][0, :, -1].numpy()  # (H, P + step)
            np.testing.assert_allclose(result.rows[layer, :, step, : last.shape[-1]], last, atol=1e-5)
            assert not result.rows[layer, :, step, last.shape[-1] :].any()
            if step:
                np.testing.assert_allclose(result.read[layer, :, step - 1, : last.shape[-1]], last, atol=1e-5)


def test_greedy_ids_and_the_rows_that_chose_them_are_transformers_generates(decoder):
    folder, model = decoder
    result = generated(folder)
    out = transformers_generate(model, result.generation)
    assert_rows_are_generates(result, out, range(len(out.attentions[0])))


def test_a_one_token_prompts_first_row_is_its_token_alone(decoder):
    """With nothing before the prompt's one token, the row that chose token 0 is all on it (GPT-2: no <s>)."""
    import attnviz

    folder, model = decoder
    result = attnviz.generate("cat", model=str(folder), tokens=3, device="cpu")
    if result.generation.num_prompt != 1:
        pytest.skip("this tokenizer puts <s> before the text")
    np.testing.assert_allclose(result.rows[:, :, 0, 0], 1.0, atol=1e-6)
    assert_rows_are_generates(result, transformers_generate(model, result.generation), range(len(result.rows)))
    assert result.to_dict()["previous"][0][0][0] == 0  # no token before the first query


def test_sampling_follows_its_seed(decoder):
    folder, _ = decoder
    first, again, other = (generated(folder, sample=True, seed=seed).generation.ids for seed in (1, 1, 2))
    assert first == again and first != other
    assert generated(folder).generation.ids != first or generated(folder).generation.ids != other


def test_smollm2_generates_as_transformers_does(smollm2_cached):
    """The bundled SmolLM2 (9 heads over 3 key/value heads, tied head): 6 greedy tokens, ids and rows as transformers'
    generate with eager attention, its weights from transformers' own GGUF loader."""
    import attnviz

    result = attnviz.generate(PROMPT, model="smollm2", tokens=6, device="cpu")
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_cached.reference_folder, attn_implementation="eager").eval()
    assert_rows_are_generates(result, transformers_generate(model, result.generation), (0, 14, 29))


@pytest.mark.parametrize("rows", ["chosen", "read"])
def test_generate_json_holds_the_rows_it_names_as_transformers_generate_gives_them(decoder, tmp_path, capsys, rows):
    """generate.json's rows (by default, and with --rows chosen) are the rows that chose each token: generate's step t's
    last row, within 1e-5, labelled rows_are "chosen", each row's query the position before its token; --rows read
    gives each token's own row (generate's step t + 1's), labelled so. The terminal's table says which."""
    from attnviz.analysis.generation import ROWS
    from attnviz.cli import run

    folder, model = decoder
    out = tmp_path / "run"
    given = [] if rows == "chosen" else ["--rows", rows]
    assert run(["generate", PROMPT, "--model", str(folder), "--tokens", "5", "--layer", "1", *given, "--out", str(out)]) == 0
    record = json.loads((out / "generate.json").read_text(encoding="utf-8"))
    assert record["format"] == "attnviz-generate" and record["version"] == 2 and len(record["ids"]) == 5 and record["layer"] == 1
    assert record["rows_are"] == rows and record["rows_definition"] == ROWS[rows]
    prompt = len(record["prompt_ids"])
    assert record["queries"] == [prompt - (rows == "chosen") + step for step in range(5)]
    written = np.array(record["rows"])  # (H, n, P + n)
    assert written.shape[1:] == (5, prompt + 5)
    reference = transformers_generate(model, SimpleNamespace(prompt_ids=record["prompt_ids"], ids=record["ids"]))
    assert reference.sequences[0, prompt:].tolist() == record["ids"]
    for step in range(5 if rows == "chosen" else 4):
        last = reference.attentions[step + (rows == "read")][1][0, :, -1].numpy()  # layer 1: (H, P + step [+ 1])
        np.testing.assert_allclose(written[:, step, : last.shape[-1]], last, atol=1e-5)
    assert {path.name for path in out.iterdir() if not path.name.startswith(".")} == {"generate.png", "generate.json", "report.html"}
    printed = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert f"layer 1, the heads' mean: {ROWS[rows]}" in printed
    chooser = record["queries"][0]
    assert f"0 {record['tokens'][prompt]} {chooser}:{record['tokens'][chooser]}" in printed  # step, token, row of


def test_generate_prints_the_continuation_as_text_wrapped_between_words(smollm2_cached, tmp_path):
    """In a fresh process 40 columns wide: the prompt, the boundary mark and the continuation as text, no ␣ between
    their words, every line within 40 columns and no word broken across two lines (the words of the lines are those
    of the text); the marks stay in the table, where a token's own boundaries matter."""
    import attnviz

    prompt = "The cat sat on the mat because"
    command = [sys.executable, "-m", "attnviz", "generate", prompt, "--model", "smollm2", "--tokens", "24", "--out", str(tmp_path / "run")]
    env = {**os.environ, "COLUMNS": "40", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    legend = next(index for index, line in enumerate(lines) if line.startswith("▸ the continuation begins"))
    text_lines = lines[:legend]
    continuation = attnviz.generate(prompt, model="smollm2", tokens=24, device="cpu").continuation
    assert len(continuation.split()) >= 8
    assert len(text_lines) >= 3 and all(len(line) <= 40 for line in text_lines)
    assert " ".join(text_lines).split() == (prompt + "▸" + continuation).split()
    assert not any("␣" in line for line in text_lines)
    assert "│ ␣she " in "\n".join(lines[legend:])  # the table's tokens keep their marks


def test_the_figures_rows_say_which_rows_they_are(decoder):
    from attnviz.analysis.generation import ROWS

    folder, _ = decoder
    for rows in ("chosen", "read"):
        figure = generated(folder, rows=rows).figure(layer=1)
        panels = [ax for ax in figure.axes if ax.get_title().startswith("head ")]
        assert panels and all(("chosen" if rows == "chosen" else "own row") in ax.get_ylabel() for ax in panels)
        assert ROWS[rows] in " ".join(figure.get_suptitle().split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "bundled"], "generate continues a text with a decoder"),
        (["--tokens", "0"], "--tokens"),
        (["--rows", "sideways"], "--rows"),
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
    """report.html opens on the Generation view, on the rows that chose each token; at step 3, layer 1, head 2 the
    tokens written are the prompt's and the first three generated, coloured by that head's row that chose the third
    generated token (the row of the token before it), which the read-out names with its sink share; the Rows select
    turns to the third token's own row, which colours the token itself too."""
    folder, _ = decoder
    result = generated(folder)
    generation = result.generation
    page = opened(result.report().save(tmp_path / "report")[0])
    page.page.wait_for_selector("#generation-tokens .generation-token", state="attached")
    assert page.page.get_attribute("#tab-generation", "aria-selected") == "true"
    title = " ".join(" ".join(page.texts("header .report-title, header .report-subtitle")).split())
    assert f"{generation.num_prompt} tokens continued by {TOKENS} tokens · every layer" in title and "layer 0" not in title, title
    assert page.page.input_value("#generation-rows") == "chosen"
    page.page.fill("#generation-step", "3")
    page.page.dispatch_event("#generation-step", "input")
    page.page.select_option("#generation-layer", "1")
    page.page.select_option("#generation-head", "2")
    prompt = generation.num_prompt
    token = f"{prompt + 2}:{generation.shown_tokens[prompt + 2]} (id {generation.ids[2]})"

    def colour_of(position: int) -> str:
        return page.page.evaluate(f"getComputedStyle(document.querySelector('#generation-tokens [data-index=\"{position}\"]')).backgroundColor")

    def expected_colour(weight: float) -> str:
        red, green, blue = page.page.evaluate(f"window.AV.colour({float(round(weight, 4))}, false)")
        return f"rgb({red}, {green}, {blue})"

    for rows, whose, row, coloured in (
        ("chosen", f"chosen by the row of {prompt + 1}:{generation.shown_tokens[prompt + 1]}", result.chosen[1, 2, 2], (0, prompt + 1)),
        ("read", "its own row", result.read[1, 2, 2], (0, prompt + 2)),
    ):
        page.page.select_option("#generation-rows", rows)
        assert len(page.texts("#generation-tokens .generation-token")) == prompt + 3
        readout = page.texts("#generation-readout")[0]
        assert readout.startswith(f"step 3 of {TOKENS}: {token} · {whose} · layer 1 · head 2"), readout
        assert f"sink {row[0]:.4f}" in readout
        for position in coloured:
            assert colour_of(position) == expected_colour(row[position])
    page.page.select_option("#generation-rows", "chosen")
    assert colour_of(prompt + 2) == "rgb(255, 255, 255)"  # the chosen token is not in the row that chose it


def test_generate_json_summarises_every_layers_heads_at_each_step(decoder):
    """generate.json's sink, previous, entropy and distance per layer, head and step, from the rows as defined: the
    row that chose token 4 is that of the token before it, P + 3, over P + 4 tokens."""
    folder, _ = decoder
    result = generated(folder)
    record, rows = result.to_dict(), result.rows.astype(np.float64)
    prompt = result.generation.num_prompt
    layer, head, step = 1, 2, 4
    row = rows[layer, head, step, : prompt + step]
    assert rows[layer, head, step, prompt + step :].sum() == 0 and record["queries"][step] == prompt + step - 1
    assert record["sink"][layer][head][step] == pytest.approx(row[0], abs=1e-6)
    assert record["previous"][layer][head][step] == pytest.approx(row[-2], abs=1e-6)
    assert record["entropy"][layer][head][step] == pytest.approx(-(row * np.log(row)).sum(), abs=1e-6)
    assert record["distance"][layer][head][step] == pytest.approx((row * np.arange(len(row))[::-1]).sum(), abs=1e-6)


def test_rows_other_than_chosen_or_read_are_refused_before_loading(monkeypatch):
    import attnviz
    from attnviz.errors import AttnvizError

    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))
    with pytest.raises(AttnvizError, match="unknown rows 'sideways': choose chosen or read"):
        attnviz.generate(PROMPT, model="smollm2", rows="sideways")


def test_rows_past_their_budget_are_refused_before_generating(decoder, monkeypatch):
    from attnviz.analysis import generation
    from attnviz.errors import AttnvizError

    import attnviz

    folder, _ = decoder
    monkeypatch.setattr(generation, "ROWS_BYTES", 2000)  # room for 2 or 3 rows of every layer and head
    with pytest.raises(AttnvizError, match=r"every layer and head's rows would take .* GB, more than .*; give --tokens \d+ or fewer") as refused:
        generated(folder)
    most = int(refused.value.args[0].split("give --tokens ")[1].split()[0])
    assert len(attnviz.generate(PROMPT, model=str(folder), tokens=most, device="cpu").ids) == most  # what it offers fits

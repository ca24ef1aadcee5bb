"""How often each command runs the model over its texts: a ratchet that only goes down (issue 45: one pass, one capture).

A run is one call of the model's top module from outside any other module (helpers.model_runs): attnviz's BertEncoder
for the bundled BERT, transformers' LlamaModel for the tiny Llama (conftest.decoder_folder). A pass that stops early
counts as one. patch's patched passes start at the patched layer: each is a call of that decoder layer and of the
ones after it, and of the final norm. Interventions (--effect, diff's second checkpoint, retrieval's needle tests) run
passes of their own (docs/architecture.md) and are not counted here; generate's decode steps are calls of LlamaModel
too, counted in its row beside the prompt's one pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import model_runs

import attnviz
from attnviz.cli.main import run

SAMPLES = Path(__file__).parent.parent / "sample_inputs"
TEXT = "The cat sat on the mat because it was tired."
CORRUPT = "The mat sat on the cat because it was tired."
PATCH = ["patch", TEXT, "--corrupt", CORRUPT, "--answer", " cat", "--wrong", " mat"]
MASKED = ["patch", "The cat sat on the [MASK] because it was tired.", "--corrupt", "The dog sat on the [MASK] because it was tired.",
          "--answer", "mat", "--wrong", "floor"]  # fmt: skip

# command line (without --model and --out), the model ("bert": the bundled one; "llama": the tiny one; "bert-mlm": a tiny
# BertForMaskedLM, which attnviz's BertEncoder reads), runs by module
COMMANDS = {
    "heads": (["heads", TEXT], "bert", {"BertEncoder": 1}),
    "heads --trace": (["heads", TEXT, "--trace"], "bert", {"BertEncoder": 1}),  # was 2: the trace's pass, the heads'
    "heads --file": (["heads", "--file", str(SAMPLES / "en.txt")], "bert", {"BertEncoder": 1}),  # was 2: its files', its report's
    "heads on a decoder": (["heads", TEXT], "llama", {"LlamaModel": 1}),
    "heads --layer 3": (["heads", TEXT, "--layer", "3"], "bert", {"BertEncoder": 1}),
    "trace": (["trace", TEXT], "bert", {"BertEncoder": 1}),
    "layers": (["layers", TEXT], "bert", {"BertEncoder": 1}),
    "layers on a decoder": (["layers", TEXT], "llama", {"LlamaModel": 1}),
    "report": (["report", TEXT], "bert", {"BertEncoder": 1}),
    "report on a decoder": (["report", TEXT], "llama", {"LlamaModel": 1}),
    "stats": (["stats", TEXT], "bert", {"BertEncoder": 1}),
    "stats in blocks": (["stats", " ".join([TEXT] * 16), "--memory", "1"], "bert", {"BertEncoder": 1}),  # 178 tokens: 1.5 MB a map
    "roles": (["roles", TEXT], "llama", {"LlamaModel": 2}),
    "roles on an encoder": (["roles", TEXT], "bert", {"BertEncoder": 1}),  # no prefix matching: a decoder's heads only
    # was 9: the random side's pass, the most changed heads' maps' 2, the report's 6; now one capture feeds all three
    "diff --against random": (["diff", TEXT, "--against", "random"], "bert", {"BertEncoder": 1}),
    # 6 are generation's own (the prompt's prefill, then each new token read once, the last too), 1 the prompt's capture, of
    # which the report is made (was 4: the run's, every layer's, the traces', the vectors')
    "generate": (["generate", TEXT, "--tokens", "5"], "llama", {"LlamaModel": 7}),
    "patch": (PATCH, "llama", {"LlamaModel": 2, "LlamaDecoderLayer": 3, "LlamaRMSNorm": 2}),
    "patch --component q": ([*PATCH, "--component", "q"], "llama", {"LlamaModel": 2, "LlamaDecoderLayer": 6, "LlamaRMSNorm": 4}),
    "why": (["why", TEXT, "--layer", "1", "--head", "2", "--query", "8"], "llama", {"LlamaModel": 1}),  # one whole pass: its parts
    "patch --component pattern": (
        [*PATCH, "--component", "pattern"], "llama", {"LlamaModel": 2, "LlamaDecoderLayer": 6, "LlamaRMSNorm": 4}
    ),
    # patch's (above), then the edges' one differentiated pass from layer 0 (2 decoder layers, the final norm) and each
    # layer's norm once (its receivers' gradients through it); then path patching of the 10 checked edges: into a head of
    # layer 1, its norm, layer 1 and the final norm (the 4 checked here); into the read-out, the final norm (the other 6)
    "patch --edges": ([*PATCH, "--edges"], "llama", {"LlamaModel": 2, "LlamaDecoderLayer": 3 + 2 + 4, "LlamaRMSNorm": 2 + 3 + 4 * 2 + 6}),
    # a post-norm encoder: the two texts' passes, the patched passes (layers 0 and 1, then 1), the differentiated pass
    # (2 layers), and path patching of the 10 checked edges: into a head of layer 1, layer 1 (the 7 checked here); into
    # the read-out, no layer (the carried stream is the last hidden state)
    "patch --edges on an encoder": ([*MASKED, "--edges"], "bert-mlm", {"BertEncoder": 2, "BertLayer": 3 + 2 + 7}),
}
MODEL_MODULES = ("BertEncoder", "BertLayer", "LlamaModel", "LlamaDecoderLayer", "LlamaRMSNorm")


@pytest.fixture(scope="module")
def masked_lm_folder(tmp_path_factory):
    """A tiny BertForMaskedLM (2 layers of 4 heads), saved once: an encoder patch reads at its [MASK]."""
    import transformers
    from tiny_families import WORDPIECE_VOCAB, _ENCODER, save_checkpoint, wordpiece_tokenizer

    folder = tmp_path_factory.mktemp("tiny-bert-mlm")
    save_checkpoint(transformers.BertConfig(vocab_size=WORDPIECE_VOCAB, **_ENCODER), transformers.BertForMaskedLM, wordpiece_tokenizer(), folder, seed=1)
    return folder


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_runs_the_model_as_often_as_its_row_says(name, decoder_folder, request, tmp_path):
    argv, model, expected = COMMANDS[name]
    folder = {"bert": "bundled", "llama": decoder_folder}.get(model) or request.getfixturevalue("masked_lm_folder")
    with model_runs() as runs:
        code = run([*argv, "--model", str(folder), "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 0
    assert {module: runs[module] for module in MODEL_MODULES if runs[module]} == expected


def test_the_api_and_the_served_page_run_the_model_once_for_a_text(tmp_path):
    from attnviz.serve.explorer import Explorer, ServeSettings

    handle = attnviz.load("bundled", device="cpu")
    with model_runs() as runs:
        attnviz.heads(TEXT, model=handle).save(tmp_path / "heads")
    assert runs["BertEncoder"] == 1
    with model_runs() as runs:
        attnviz.heads(TEXT, model=handle, layer=2, report=True).report().save(tmp_path / "report")
    assert runs["BertEncoder"] == 1
    with model_runs() as runs:  # one padded batch: one pass
        attnviz.report([TEXT, CORRUPT, "短"], model=handle).save(tmp_path / "three")
    assert runs["BertEncoder"] == 1
    explorer = Explorer({"bundled": handle}, ServeSettings())
    for answer, count in (("attention", 1), ("report", 1)):
        with model_runs() as runs:
            explorer.heads({"text": TEXT, "model": "bundled", "as": answer})
        assert runs["BertEncoder"] == count, answer


def test_the_served_patch_runs_the_model_once_for_each_text(decoder_folder):
    """POST /api/patch goes through attnviz.patch: the clean and the corrupted text's passes, then only the patched
    passes, which start at the patched layer (2 layers: 2 + 1 decoder layer calls, 2 final norms)."""
    from attnviz.serve.explorer import Explorer, ServeSettings

    explorer = Explorer({"tiny": attnviz.load(str(decoder_folder), device="cpu")}, ServeSettings())
    with model_runs() as runs:
        explorer.patch({"text": TEXT, "model": "tiny", "corrupt": CORRUPT, "answer": " cat", "wrong": " mat"})
    assert {module: runs[module] for module in MODEL_MODULES if runs[module]} == {"LlamaModel": 2, "LlamaDecoderLayer": 3, "LlamaRMSNorm": 2}


def test_a_long_texts_map_and_roles_layer_0_come_from_the_summaries_pass(decoder_folder, monkeypatch):
    """heads of a long text (head_summaries.run_and_summarise) and roles (analysis/roles.text_roles) summarise every
    layer in one pass with attnviz's layers in the model's place; the run they show (heads' layer L, roles' layer 0) is
    made from that pass's blocks (pipeline.pass_maps), not by running its layer again: attnviz's layer projects each
    layer's q, k and v once. Blocks of 8 queries (a long text's path on a short one); the run is within float32 of run_attention's
    own run of the layer over the same pass's input of it (what these commands ran before), whole."""
    import numpy as np

    from attnviz.analysis.head_numbers import RoleSettings
    from attnviz.analysis.head_summaries import run_and_summarise, summarise_in_place
    from attnviz.analysis.roles import text_roles
    from attnviz.attention.layer import MultiHeadAttention
    from attnviz.layer_inputs import encode_texts
    from attnviz.models.loading import load_model
    from attnviz.own_layer import build_layers
    from attnviz.pipeline import run_attention
    from attnviz.spec import run_spec

    loaded = load_model(str(decoder_folder), "cpu")
    text = " ".join([TEXT] * 3)  # 36 tokens: 5 blocks of 8 queries
    budget = 2 * loaded.num_heads * 36 * 4 * 8
    project, calls = MultiHeadAttention.project, []

    def counted(self, *args, **kwargs):
        calls.append(self)
        return project(self, *args, **kwargs)

    def alone(spec):  # the layer's own run over the pass's input of it
        encoded = encode_texts(loaded, [text], spec)
        _, kept = summarise_in_place(loaded, text, encoded, build_layers(loaded, spec), spec, budget, keep={spec.layer})
        return run_attention(loaded, [text], spec, captured=(encoded, kept[spec.layer]))[0]

    monkeypatch.setattr(MultiHeadAttention, "project", counted)
    for layer in (1, 0):
        spec = run_spec(loaded, layer=layer, device="cpu")
        run = run_and_summarise(loaded, text, spec, budget)
        assert len(calls) == loaded.num_layers, f"heads --layer {layer}: {len(calls)} projections by attnviz's layers"
        own = alone(spec)
        assert run.attention.shape == (loaded.num_heads, 36, 36) and run.layer == layer
        np.testing.assert_allclose(run.attention, own.attention, atol=1e-6, rtol=0)
        np.testing.assert_allclose(run.output, own.output, atol=1e-5, rtol=0)
        calls.clear()
    passed = text_roles(loaded, text, run_spec(loaded, layer=None, device="cpu"), budget, RoleSettings(), keep=lambda tokens, run: False)
    assert len(calls) == loaded.num_layers and passed.run.layer == 0
    own = alone(run_spec(loaded, layer=0, device="cpu"))
    np.testing.assert_allclose(passed.run.attention, own.attention, atol=1e-6, rtol=0)
    np.testing.assert_allclose(passed.run.output, own.output, atol=1e-5, rtol=0)

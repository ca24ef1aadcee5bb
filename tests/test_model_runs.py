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

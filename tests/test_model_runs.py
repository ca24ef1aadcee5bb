"""How often each command runs the model over its texts: a ratchet that only goes down (issue 45: one pass, one capture).

A run is one call of the model's top module from outside any other module (helpers.model_runs): attnviz's BertEncoder
for the bundled BERT, transformers' LlamaModel for the tiny Llama (conftest.decoder_folder). A pass that stops early
counts as one. patch's patched passes start at the patched layer: each is a call of that decoder layer and of the
ones after it, and of the final norm. Interventions (generate, --effect, diff's second checkpoint, retrieval's needle
tests) run passes of their own (docs/architecture.md) and are not counted here.
"""

from __future__ import annotations

import pytest
from helpers import model_runs

import attnviz
from attnviz.cli.main import run

TEXT = "The cat sat on the mat because it was tired."
CORRUPT = "The mat sat on the cat because it was tired."
PATCH = ["patch", TEXT, "--corrupt", CORRUPT, "--answer", " cat", "--wrong", " mat"]

# command line (without --model and --out), the model ("bert": the bundled one; "llama": the tiny one), runs by module
COMMANDS = {
    "heads": (["heads", TEXT], "bert", {"BertEncoder": 6}),
    "heads --trace": (["heads", TEXT, "--trace"], "bert", {"BertEncoder": 7}),
    "heads on a decoder": (["heads", TEXT], "llama", {"LlamaModel": 4}),
    "trace": (["trace", TEXT], "bert", {"BertEncoder": 2}),
    "layers": (["layers", TEXT], "bert", {"BertEncoder": 1}),
    "layers on a decoder": (["layers", TEXT], "llama", {"LlamaModel": 1}),
    "report": (["report", TEXT], "bert", {"BertEncoder": 6}),
    "stats": (["stats", TEXT], "bert", {"BertEncoder": 1}),
    "roles": (["roles", TEXT], "llama", {"LlamaModel": 2}),
    "patch": (PATCH, "llama", {"LlamaModel": 7, "LlamaDecoderLayer": 3, "LlamaRMSNorm": 2}),
    "patch --component q": ([*PATCH, "--component", "q"], "llama", {"LlamaModel": 8, "LlamaDecoderLayer": 6, "LlamaRMSNorm": 4}),
    "patch --component pattern": (
        [*PATCH, "--component", "pattern"], "llama", {"LlamaModel": 11, "LlamaDecoderLayer": 6, "LlamaRMSNorm": 4}
    ),
}
MODEL_MODULES = ("BertEncoder", "LlamaModel", "LlamaDecoderLayer", "LlamaRMSNorm")


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_runs_the_model_as_often_as_its_row_says(name, decoder_folder, tmp_path):
    argv, model, expected = COMMANDS[name]
    with model_runs() as runs:
        code = run([*argv, "--model", "bundled" if model == "bert" else str(decoder_folder), "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 0
    assert {module: runs[module] for module in MODEL_MODULES if runs[module]} == expected


def test_the_api_and_the_served_page_run_the_model_once_for_a_text(tmp_path):
    from attnviz.serve.explorer import Explorer, ServeSettings

    handle = attnviz.load("bundled", device="cpu")
    with model_runs() as runs:
        attnviz.heads(TEXT, model=handle).save(tmp_path / "heads")
    assert runs["BertEncoder"] == 1
    explorer = Explorer({"bundled": handle}, ServeSettings())
    for answer, count in (("attention", 1), ("report", 2)):
        with model_runs() as runs:
            explorer.heads({"text": TEXT, "model": "bundled", "as": answer})
        assert runs["BertEncoder"] == count, answer

"""Progress on long work (render/progress.py, the API's progress= argument): each stage's count and its units as
the API's callback receives them (the layers of roles' passes, the heads patched, the tokens generated, the needle
tests), the same callback that draws the command line's bar; a bar on a terminal, nothing where stdout is not one.

The expected counts come from the tiny checkpoints' own sizes (2 layers, 6 heads), not from attnviz.
"""

from __future__ import annotations

import re
import time

import pytest
import transformers
from rich.console import Console

import attnviz
from tiny_families import _DECODER, bpe_tokenizer, save_checkpoint

NUM_LAYERS, NUM_HEADS = _DECODER["num_hidden_layers"], _DECODER["num_attention_heads"]
CLEAN, CORRUPT, ANSWER, WRONG = "The cat sat on the mat because it was tired.", "The mat sat on the cat because it was tired.", " cat", " mat"


class Recorder:
    """A progress= argument that records each stage begun and each count, in order."""

    def __init__(self):
        self.stages: list[tuple[str, int, list[int]]] = []

    def stage(self, what: str, total: int) -> None:
        self.stages.append((what, total, []))

    def __call__(self, count: int) -> None:
        self.stages[-1][2].append(count)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A tiny Llama with its language-model head (copying is computed) and 256 positions (a needle test fits); no
    token ends a text (generate makes every token asked for)."""
    folder = tmp_path_factory.mktemp("progress-llama")
    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **{**_DECODER, "max_position_embeddings": 256})
    config.eos_token_id = None
    save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), folder, seed=2)
    return str(folder)


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_roles_counts_each_passs_layers_then_the_needle_tests(decoder):
    recorder = Recorder()
    attnviz.roles(CLEAN, model=decoder, device="cpu", retrieval=True, lengths=[200], depths=[0.5], progress=recorder)
    # The text's pass and prefix matching's run attnviz's layers in the model's place: each layer counted once, as done.
    assert recorder.stages == [
        ("layers of the text", NUM_LAYERS, [1] * NUM_LAYERS),
        ("layers of prefix matching", NUM_LAYERS, [1] * NUM_LAYERS),
        ("layers of copying", NUM_LAYERS, [1] * NUM_LAYERS),
        ("needle tests", 1, [1]),
    ]
    counts = []  # a plain function: the same counts, no stages
    attnviz.roles(CLEAN, model=decoder, device="cpu", progress=counts.append)
    assert counts == [1] * (3 * NUM_LAYERS)


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_patch_counts_the_heads_a_layer_at_a_time_then_the_heads_patched_by_position(decoder):
    from attnviz.analysis.patching import MOST_AFFECTING

    recorder = Recorder()
    attnviz.patch(CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, component="q", per_position=True, model=decoder,
                  device="cpu", progress=recorder)  # fmt: skip
    components = 2  # the output's scores, and the query's
    assert recorder.stages == [
        ("heads patched", components * NUM_LAYERS * NUM_HEADS, [NUM_HEADS] * (components * NUM_LAYERS)),
        ("heads patched position by position", MOST_AFFECTING, [1] * MOST_AFFECTING),
    ]


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_generate_counts_each_token_generated(decoder):
    recorder = Recorder()
    result = attnviz.generate("The cat sat", tokens=5, model=decoder, device="cpu", progress=recorder)
    assert len(result.ids) == 5 and recorder.stages == [("tokens generated", 5, [1] * 5)]


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_diff_counts_the_layers_compared(decoder):
    recorder = Recorder()
    attnviz.diff(CLEAN, against="random", model=decoder, device="cpu", progress=recorder)
    assert recorder.stages == [("layers compared", NUM_LAYERS, [1] * NUM_LAYERS)]


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_effect_counts_the_heads_taken_out_a_layer_at_a_time(decoder):
    recorder = Recorder()
    attnviz.heads(CLEAN, layer=1, effect="zero", model=decoder, device="cpu", progress=recorder)
    assert recorder.stages == [("heads taken out", NUM_HEADS, [NUM_HEADS])]
    recorder = Recorder()
    result = attnviz.layers(CLEAN, effect="mean", model=decoder, device="cpu", progress=recorder)
    assert result.attention is not None  # the whole maps' path
    assert recorder.stages == [
        ("heads taken out", NUM_LAYERS * NUM_HEADS, [NUM_HEADS] * NUM_LAYERS),
        ("layers of the text's forward pass", NUM_LAYERS, [1] * NUM_LAYERS),
        ("layers of the text", NUM_LAYERS, [1] * NUM_LAYERS),
    ]


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_a_pass_of_blocks_counts_each_layer_once_it_is_done(decoder):
    """layers past the memory budget (1 MB: 2 layers x 6 heads' maps of its 240 tokens are 2.6 MiB) and heads with every
    layer summarised, as a long text's report runs it: one pass of the model with attnviz's layers in the place of its
    attention, each layer counted once its blocks are summarised (no forward pass of its own to count)."""
    long = " ".join([CLEAN] * 20)
    recorder = Recorder()
    result = attnviz.layers(long, memory=1, truncate=True, model=decoder, device="cpu", progress=recorder)
    assert result.attention is None  # the pass of blocks
    assert recorder.stages == [("layers of the text", NUM_LAYERS, [1] * NUM_LAYERS)]
    recorder = Recorder()
    attnviz.heads(long, layer_summaries=True, truncate=True, model=decoder, device="cpu", progress=recorder)
    assert recorder.stages == [("layers of the text", NUM_LAYERS, [1] * NUM_LAYERS)]


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_report_counts_its_batchs_forward_pass_then_each_texts_layers_and_statistics_layers_then_the_texts_encoded(decoder):
    recorder = Recorder()
    attnviz.report([CLEAN, CORRUPT], model=decoder, device="cpu", progress=recorder)
    pass_of_the_batch = ("layers of the text's forward pass", NUM_LAYERS, [1] * NUM_LAYERS)  # one capture of both texts
    each = [("layers of the text", NUM_LAYERS, [1] * NUM_LAYERS)]  # each layer's maps encoded and measured as it runs
    each.append(("heads' scores split", NUM_HEADS, [1] * NUM_HEADS))  # the Heatmap view's why, the run's layer's heads
    assert recorder.stages == [pass_of_the_batch, *each, *each, ("texts encoded for the page", 2, [1, 1])]


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_stats_counts_one_texts_layers_and_several_texts(decoder):
    """One text: its forward pass's layers, then those measured, whole maps or in blocks (past a 1 MB budget: 6 heads'
    map of 240 tokens is 1.3 MiB); several: the texts of each batch (one batch here)."""
    layers = [("layers of the text's forward pass", NUM_LAYERS, [1] * NUM_LAYERS), ("layers of the text", NUM_LAYERS, [1] * NUM_LAYERS)]
    for memory in (None, 1):
        recorder = Recorder()
        attnviz.stats(" ".join([CLEAN] * 20), memory=memory, js=False, model=decoder, device="cpu", progress=recorder)
        assert recorder.stages == layers, memory
    recorder = Recorder()
    attnviz.stats([CLEAN, CORRUPT], model=decoder, device="cpu", progress=recorder)
    assert recorder.stages == [("texts measured", 2, [2])]


def test_a_stage_shows_its_count_on_a_terminal_and_nothing_elsewhere():
    from attnviz.render.progress import progress_bar

    shown = {}
    for name, terminal in (("terminal", True), ("file", False)):
        console = Console(record=True, force_terminal=terminal, width=100)
        with progress_bar(console) as bar:
            for what, total in (("layers of the text", 30), ("layers of copying", 30)):
                bar.stage(what, total)
                for _ in range(12):
                    bar(1)
                time.sleep(0.02)
                console.print("")  # the live display's last frame stays in the recording
        shown[name] = console.export_text()
    assert re.search(r"layers of the text .*12/30", shown["terminal"]) and re.search(r"layers of copying .*12/30", shown["terminal"])
    assert shown["file"].strip() == ""


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_the_command_line_draws_no_bar_where_stdout_is_not_a_terminal(decoder, tmp_path, capsys):
    from attnviz.cli import run

    assert run(["generate", "The cat sat", "--tokens", "3", "--model", decoder, "--device", "cpu", "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert not re.search(r"\b\d/3\b", printed) and "\x1b" not in printed, printed  # no done/total, no cursor moves


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_the_command_line_draws_each_stages_bar_on_a_terminal(decoder, tmp_path, monkeypatch):
    """The command's own console made a terminal's: its bar counts the tokens generated, as the API's callback does."""
    import attnviz.cli.generate
    from attnviz.cli import run

    console = Console(record=True, force_terminal=True, width=100)
    monkeypatch.setattr(attnviz.cli.generate, "console", console)
    assert run(["generate", "The cat sat", "--tokens", "3", "--model", decoder, "--device", "cpu", "--out", str(tmp_path / "run")]) == 0
    assert re.search(r"tokens generated .*3/3", console.export_text())


@pytest.mark.slow  # a checkpoint built and run by transformers
def test_layers_and_report_draw_their_bars_on_a_terminal_only(decoder, tmp_path, monkeypatch, capsys):
    """layers --effect counts the heads taken out on a terminal console, heads its report's layers; report, where
    stdout is captured, draws none."""
    import attnviz.cli.heads
    import attnviz.cli.layers
    from attnviz.cli import run

    console = Console(record=True, force_terminal=True, width=100)
    monkeypatch.setattr(attnviz.cli.layers, "console", console)
    assert run(["layers", CLEAN, "--effect", "zero", "--model", decoder, "--device", "cpu", "--out", str(tmp_path / "layers")]) == 0
    total = NUM_LAYERS * NUM_HEADS
    assert re.search(rf"heads taken out .*{total}/{total}", console.export_text())
    monkeypatch.setattr(attnviz.cli.heads, "console", console)  # heads' report.html: its every layer, measured
    assert run(["heads", CLEAN, "--model", decoder, "--device", "cpu", "--out", str(tmp_path / "heads")]) == 0
    assert re.search(rf"layers of the text .*{NUM_LAYERS}/{NUM_LAYERS}", console.export_text())  # heads' alone: export cleared
    capsys.readouterr()
    assert run(["report", CLEAN, "--model", decoder, "--device", "cpu", "--out", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert not re.search(rf"\b\d/{NUM_LAYERS}\b", printed) and "\x1b" not in printed, printed

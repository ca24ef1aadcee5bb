"""attnviz as a library: the same numbers, files and one-line errors as the command line, a cheap import."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_records_match

import attnviz
from attnviz.cli import run

ENGLISH = "The animal didn't cross the street because it was too tired."
REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return attnviz.load("bundled", device="cpu")


def reference_attention(reference_bert, text: str, layer: int) -> np.ndarray:
    """transformers' eager attentions of one layer for one text: (H, N, N)."""
    tokenizer, bert = reference_bert
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        return bert(**batch, output_attentions=True).attentions[layer][0].numpy()


@pytest.mark.slow  # a fresh process
def test_importing_attnviz_loads_neither_torch_matplotlib_nor_transformers_and_figures_leave_no_pyplot():
    code = (
        "import sys, attnviz\n"
        "heavy = lambda: sorted(m for m in ('torch', 'matplotlib', 'transformers') if m in sys.modules)\n"
        "print(heavy())\n"
        "attnviz.AttnvizError, attnviz.heads, attnviz.trace, attnviz.HeadsResult, attnviz.StatsResult\n"
        "print(heavy())\n"
        "figure = attnviz.heads('the cat', model='bundled', device='cpu').figure(head=1)\n"
        "print(type(figure).__module__, 'matplotlib.pyplot' in sys.modules)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPOSITORY
    ).stdout.splitlines()
    assert shown == ["[]", "[]", "matplotlib.figure False"]


@pytest.mark.parametrize("layer", [0, 3])
def test_heads_attention_is_transformers_eager_attention(layer, reference_bert):
    from attnviz.models.loading import bundled_model_path

    result = attnviz.heads(ENGLISH, model=str(bundled_model_path()), layer=layer, device="cpu")
    expected = reference_attention(reference_bert, ENGLISH, layer)
    assert isinstance(result.attention, torch.Tensor) and result.attention.shape == expected.shape
    np.testing.assert_allclose(result.attention.numpy(), expected, atol=1e-5, rtol=0)
    tokenizer, _ = reference_bert
    assert result.tokens == result.key_tokens == tokenizer.convert_ids_to_tokens(tokenizer(ENGLISH)["input_ids"])
    assert result.output.shape == (len(result.tokens), 384)
    assert result.spec.layer == layer and result.spec.seed == 0 and result.spec.weights == "pretrained"


def test_heads_over_a_list_is_each_text_alone(model):
    texts = ["the cat", ENGLISH, "a dog ran home"]  # different lengths: the batch pads two of them
    together = attnviz.heads(texts, model=model, weights="random", seed=3, heads=4)
    assert [result.text for result in together] == texts
    for text, result in zip(texts, together):
        alone = attnviz.heads(text, model=model, weights="random", seed=3, heads=4)
        assert result.attention.shape == alone.attention.shape == (4, len(alone.tokens), len(alone.tokens))
        torch.testing.assert_close(result.attention, alone.attention, atol=1e-5, rtol=0)
        torch.testing.assert_close(result.output, alone.output, atol=1e-5, rtol=0)
        assert result.spec == alone.spec and result.spec.seed == 3


@pytest.mark.slow
def test_save_writes_what_the_command_writes(model, tmp_path):
    assert run(["heads", "the cat sat", "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "cli")]) == 0
    result = attnviz.heads("the cat sat", model=model)
    written = result.save(tmp_path / "api")
    from attnviz.output.runs import MANIFEST

    in_folder = sorted(path.name for path in (tmp_path / "api").iterdir())
    assert in_folder == sorted([MANIFEST, *(path.name for path in written)])  # the CLI's run folder manifest too
    cli_files = sorted(path.name for path in (tmp_path / "cli").iterdir())
    assert in_folder == [name for name in cli_files if name != "report.html"]  # report.html is attnviz.report's
    cli_record = json.loads((tmp_path / "cli" / "attention.json").read_text(encoding="utf-8"))
    api_record = json.loads((tmp_path / "api" / "attention.json").read_text(encoding="utf-8"))
    assert api_record == result.to_dict()  # one run: its file holds its record exactly
    assert_records_match(api_record, cli_record)  # the command's run: the same record, its numbers within float32
    assert not [path for path in (tmp_path / "api").iterdir() if path.is_dir()]  # no staging folder left


def test_a_loaded_model_is_not_loaded_again(model, monkeypatch):
    import attnviz.models.loading
    from attnviz.api.models import loaded_models

    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("loaded again"))
    assert attnviz.load("bundled", device="cpu") is model
    assert attnviz.load("All-MiniLM-L6-v2", device="cpu") is model
    first = attnviz.heads("the cat", model="bundled", device="cpu")
    second = attnviz.heads("the dog", model="bundled", device="cpu")
    assert first.spec.model == second.spec.model == "bundled"
    assert sum(handle is model for handle in loaded_models()) == 1


@pytest.mark.parametrize(
    "command, call",
    [
        (["heads", " "], lambda: attnviz.heads(" ", model="bundled")),
        (["heads", "hi", "--kv", "", ], lambda: attnviz.heads("hi", kv="", model="bundled")),  # the kv text: the --kv text
        (["heads", "hi", "--kv", "yo", "--causal"], lambda: attnviz.heads("hi", kv="yo", causal=True, model="bundled")),
        (["heads", "hi", "--layer", "6"], lambda: attnviz.heads("hi", layer=6, model="bundled")),
        (["heads", "hi", "--heads", "0"], lambda: attnviz.heads("hi", heads=0, model="bundled")),
        (["heads", "hi", "--heads", "5"], lambda: attnviz.heads("hi", heads=5, model="bundled")),
        (["trace", "hi", *["--batch", "yo"] * 32], lambda: attnviz.trace(["hi", *["yo"] * 32], model="bundled")),
        (["compare", "hi", "--heads", "1,x"], lambda: attnviz.compare("hi", heads="1,x", model="bundled")),
        (["position", "hi", "--permutation", "0,1"], lambda: attnviz.position("hi", permutation=[0, 1], model="bundled")),
        (["layers", "hi", "--model", "no-such-folder/"], lambda: attnviz.layers("hi", model="no-such-folder/")),
    ],
)
def test_bad_input_raises_attnviz_error_with_the_commands_message(command, call, capsys, tmp_path):
    """The same message, but each option in its face's spelling: --kv and --causal there, kv and causal=True here."""
    if "--model" not in command:
        command = [*command, "--model", "bundled"]
    assert run([*command, "--device", "cpu", "--out", str(tmp_path / "r")]) == 2
    printed = capsys.readouterr().err
    with pytest.raises(attnviz.AttnvizError) as raised:
        call()
    assert isinstance(raised.value, ValueError)
    as_flags = re.sub(r"\bcausal=True\b", "--causal", re.sub(r"(?<![-\w])kv\b", "--kv", str(raised.value)))
    assert printed == f"error: {as_flags}\n"


@pytest.mark.slow
def test_results_display_themselves_as_html_and_rich(model):
    from rich.console import Console

    result = attnviz.heads("the cat sat", model=model)
    page = result._repr_html_()
    assert '<img src="data:image/png;base64,' in page and "0:[CLS]" in page and "3:␣sat" in page  # ␣: a space before "sat" (models/shown.py)
    assert "<script" not in page and "http" not in page
    console = Console(width=100, record=True, file=open("/dev/null", "w"))
    console.print(result)
    assert "query → the key it attends to most" in console.export_text()
    for other, words in [
        (attnviz.trace("the cat", model=model), ["view-permute", "q_heads", "torch.nn.MultiheadAttention"]),
        (attnviz.position("the cat sat", model=model), ["does permuting the tokens just permute the map?", "equivariant"]),
    ]:
        console.print(other)
        shown = console.export_text()
        assert all(word in shown for word in words), shown
        page = other._repr_html_()
        assert "0:[CLS]" in page and "<script" not in page
    figure = result.figure()
    assert type(figure).__name__ == "Figure" and len(figure.axes) > 12  # 12 heads and a colorbar


@pytest.mark.slow
def test_a_notebook_shows_the_pixels_the_maps_were_fitted_to(model):
    """300 tokens in a grid panel of 384 pixels at the figure's 120 dpi: a pixel per cell. The inline PNG is
    drawn at that dpi (at 80, Agg would drop a third of the rows, a one-hot key with them)."""
    import base64
    import io
    import re

    from PIL import Image

    text = " ".join(["cat"] * 298)  # [CLS] + 298 + [SEP] = 300 tokens
    result = attnviz.heads(text, model=model)
    figure = result.figure()
    encoded = re.search(r'<img src="data:image/png;base64,([^"]+)"', result._repr_html_()).group(1)
    with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
        assert image.size == (round(figure.get_figwidth() * figure.dpi), round(figure.get_figheight() * figure.dpi))


def test_trace_steps_and_checks(model, tmp_path):
    traced = attnviz.trace("the cat sat", model=model, layout="all")
    assert traced.agree and {check["layout"] for check in traced.check()} >= {
        "view-permute", "merged-batch", "fused-qkv", "single-head"
    }
    q_view = next(step for step in traced.steps if step.layout == "view-permute" and step.role == "q_view")
    assert q_view.output_shape == [1, 5, 12, 32] and q_view.memory == "view" and q_view.code
    assert sorted(path.name for path in traced.save(tmp_path / "t")) == ["trace.json", "trace.md"]
    assert traced.to_dict() == json.loads((tmp_path / "t" / "trace.json").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_stats_layers_compare_and_position_compute_what_heads_computes(model, tmp_path):
    layers = attnviz.layers("the cat sat", model=model)
    for layer in (0, 5):
        alone = attnviz.heads("the cat sat", model=model, layer=layer)
        torch.testing.assert_close(layers.attention[layer], alone.attention, atol=1e-5, rtol=0)
    assert np.allclose(layers.rollout.sum(-1), 1, atol=1e-5)
    assert sorted(p.name for p in layers.save(tmp_path / "l")) == ["layers.png", "rollout.json", "rollout.png", "summaries.json", "summaries.png"]

    stats = attnviz.stats(["the cat sat", "a dog ran home"], model=model)
    assert stats.values.shape == (6, 12, len(stats.statistics)) and stats.js_distance.shape == (6, 12, 12)
    assert sorted(p.name for p in stats.save(tmp_path / "s")) == ["js_distance.png", "stats.csv", "stats.json"]

    compared = attnviz.compare("the cat sat", model=model, heads=[1, 12])
    torch.testing.assert_close(
        compared.attention[("pretrained", 12)], attnviz.heads("the cat sat", model=model).attention, atol=1e-5, rtol=0
    )
    position = attnviz.position("the cat sat", model=model)
    assert position.without_positions.equivariant and not position.with_positions.equivariant
    assert sorted(p.name for p in position.save(tmp_path / "p")) == ["position.json", "position.png"]


def readme_python_example() -> str:
    """The ```python block of README.md's "Python" section."""
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.slow
def test_the_readme_python_example_runs_as_written_and_prints_what_it_says(tmp_path):
    example = readme_python_example()
    shown = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(REPOSITORY)},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    printed = shown.stdout.splitlines()
    comments = [line.split("# ", 1)[1] for line in example.splitlines() if line.lstrip().startswith("print(")]
    assert len(printed) == len(comments) == 6
    for line, comment in zip(printed, comments):
        if comment.startswith("1.0 (to float precision)"):
            assert abs(float(line) - 1.0) < 1e-6
        else:
            assert comment.startswith(line), (line, comment)
    assert (tmp_path / "outputs" / "the-cat" / "attention.json").exists()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: attnviz.heads("hi", weights="trained", model="bundled"), "unknown weights 'trained': choose pretrained or random"),
        (lambda: attnviz.heads("hi", weights="random", seed=-1, model="bundled"), "seed -1 is out of range: give 0 to 2**64 - 1"),
        (lambda: attnviz.heads([], model="bundled"), "no texts: give a text, or a list of texts"),
        (lambda: attnviz.stats(["hi", "word " * 600], model="bundled"), "texts[1] has 602 tokens, more than the model's 512"),
        (lambda: attnviz.trace("hi", layout="sideways", model="bundled"), "unknown layout 'sideways'"),
        (lambda: attnviz.heads("hi", model="bundled").figure(head=12), "head 12 is out of range: this run has heads 0 to 11"),
    ],
)
def test_what_only_python_can_get_wrong_is_an_attnviz_error_too(call, message):
    """Options the command line's parser refuses (choices, ranges) are checked by RunSpec or the API."""
    with pytest.raises(attnviz.AttnvizError, match="^" + __import__("re").escape(message)):
        call()


@pytest.fixture
def thread_count_kept():
    """Restores torch's thread count after a test that sets its own."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def threads_seen(model, call) -> tuple[list[int], object]:
    """torch's thread count inside each forward pass of the model during call(), and call()'s result."""
    seen = []
    hook = model.model.register_forward_hook(lambda module, inputs, output: seen.append(torch.get_num_threads()))
    try:
        return seen, call()
    finally:
        hook.remove()


def test_a_short_run_uses_one_thread_and_the_callers_count_is_the_same_after(model, thread_count_kept):
    torch.set_num_threads(3)  # the caller's own choice, not torch's default
    seen, _ = threads_seen(model, lambda: attnviz.heads(ENGLISH, model=model))
    assert seen == [1] and torch.get_num_threads() == 3
    seen, _ = threads_seen(model, lambda: attnviz.layers(ENGLISH, model=model))
    assert seen and set(seen) == {1} and torch.get_num_threads() == 3
    long_text = " ".join(["cat"] * 300)  # 302 tokens: more than a small run's 256
    seen, _ = threads_seen(model, lambda: attnviz.heads(long_text, model=model))
    assert seen == [3] and torch.get_num_threads() == 3


def test_an_error_inside_a_call_leaves_the_callers_thread_count(model, thread_count_kept):
    torch.set_num_threads(3)

    def fail(module, inputs, output):
        assert torch.get_num_threads() == 1  # inside the run's one-thread scope
        raise RuntimeError("out of memory, say")

    hook = model.model.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="out of memory, say"):
            attnviz.heads(ENGLISH, model=model)
    finally:
        hook.remove()
    assert torch.get_num_threads() == 3


def test_one_thread_gives_the_numbers_of_torchs_default_threads(model, thread_count_kept, monkeypatch):
    import attnviz.layer_inputs

    seen, small = threads_seen(model, lambda: attnviz.heads(ENGLISH, model=model, layer=2))
    assert seen == [1]
    monkeypatch.setattr(attnviz.layer_inputs, "SMALL_RUN_TOKENS", 0)  # no run is small: torch's own threads
    seen, default = threads_seen(model, lambda: attnviz.heads(ENGLISH, model=model, layer=2))
    assert seen == [thread_count_kept]
    np.testing.assert_allclose(small.attention.numpy(), default.attention.numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(small.output, default.output, atol=1e-6, rtol=0)

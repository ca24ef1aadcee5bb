"""Two checkpoints side by side (analysis/diff.py, `attnviz diff`, attnviz.diff).

Two tiny Llamas, the second the first with one query head's projection (layer 1's head 4: W_q's rows of that head)
drawn again: that head's map must change, no other head of its layer, no head of the layers before, and the heads
of the layers after may (their hidden states changed). The distances are checked against the maps of transformers'
own LlamaModel (eager attention, output_attentions=True) of each checkpoint, compared here in NumPy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from tiny_families import _DECODER, bpe_tokenizer, save_checkpoint

pytestmark = pytest.mark.slow  # checkpoints built and loaded by transformers

TEXT = "The cat sat on the mat because it was tired. Attention is all you need."
CHANGED = (1, 4)  # (layer, query head) whose W_q rows differ
CONFIG = dict(_DECODER, num_hidden_layers=3)


def jensen_shannon(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """JSD of each row of p and q (..., N, K) in bits: (KL(p ‖ m) + KL(q ‖ m)) / 2, m the mean; 0 log 0 = 0."""
    m = (p + q) / 2
    kl = lambda a: np.where(a > 0, a * np.log2(np.where(a > 0, a, 1) / np.where(m > 0, m, 1)), 0.0).sum(axis=-1)  # noqa: E731
    return np.clip((kl(p) + kl(q)) / 2, 0.0, 1.0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Folders of the two Llamas (6 query heads over 2 key/value heads, 3 layers) and their eager maps (L, H, N, N)."""
    folder = tmp_path_factory.mktemp("diff")
    config = transformers.LlamaConfig(num_key_value_heads=2, **CONFIG)
    first = save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), folder / "a", seed=1)
    layer, head = CHANGED
    head_dim = config.hidden_size // config.num_attention_heads
    with torch.no_grad():
        rows = first.layers[layer].self_attn.q_proj.weight[head * head_dim : (head + 1) * head_dim]
        rows.copy_(torch.randn(rows.shape, generator=torch.Generator().manual_seed(7)) * 0.4)
    first.save_pretrained(folder / "b")
    bpe_tokenizer(bos=True).save_pretrained(folder / "b")
    maps = []
    for name in ("a", "b"):
        model = transformers.LlamaModel.from_pretrained(folder / name, attn_implementation="eager").eval()
        ids = transformers.AutoTokenizer.from_pretrained(folder / name)(TEXT, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            maps.append(np.stack([layer[0].double().numpy() for layer in model(ids, output_attentions=True).attentions]))
    return folder, maps


def test_the_changed_head_alone_and_its_layers_later_effects_show(pair):
    import attnviz

    folder, (ours, theirs) = pair
    result = attnviz.diff(TEXT, model=str(folder / "a"), against=str(folder / "b"), device="cpu")
    js, clark = result.differences.values["js"], result.differences.values["clark"]
    divergence = jensen_shannon(ours, theirs)  # (L, H, N)
    np.testing.assert_allclose(clark, divergence.sum(axis=-1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(js, np.sqrt(divergence).mean(axis=-1), rtol=1e-4, atol=1e-4)
    layer, head = CHANGED
    assert (js[:layer] == 0).all()  # the same hidden states and projections: the very same numbers
    others = np.delete(js[layer], head)
    assert (others == 0).all() and js[layer, head] > 0.05
    assert (js[layer + 1 :] > 1e-3).all()  # what the changed head wrote reaches every later head
    assert result.differences.top[0] == CHANGED
    mine, yours = result.differences.maps[CHANGED]
    np.testing.assert_allclose(mine, ours[layer, head], atol=1e-5)
    np.testing.assert_allclose(yours, theirs[layer, head], atol=1e-5)


def test_against_random_is_each_layer_with_random_projections_over_the_same_states(pair):
    """--against random: each head against the same layer's random re-initialisation (attnviz.heads' weights="random",
    from the same seed), over the model's own hidden states."""
    import attnviz

    folder, _ = pair
    result = attnviz.diff(TEXT, model=str(folder / "a"), against="random", seed=3, device="cpu")
    assert result.differences.against == "random" and result.differences.seed == 3
    for layer in range(CONFIG["num_hidden_layers"]):
        trained = attnviz.heads(TEXT, model=str(folder / "a"), layer=layer, device="cpu").attention.double().numpy()
        drawn = attnviz.heads(TEXT, model=str(folder / "a"), layer=layer, weights="random", seed=3, device="cpu").attention.double().numpy()
        divergence = jensen_shannon(trained, drawn)
        np.testing.assert_allclose(result.differences.values["clark"][layer], divergence.sum(axis=-1), rtol=1e-4, atol=1e-6)


def test_diff_writes_its_grid_its_heads_and_its_json_and_prints_the_grid(pair, tmp_path, capsys):
    from attnviz.cli import run

    folder, _ = pair
    out = tmp_path / "run"
    assert run(["diff", TEXT, "--model", str(folder / "a"), "--against", str(folder / "b"), "--out", str(out)]) == 0
    record = json.loads((out / "diff.json").read_text(encoding="utf-8"))
    assert record["format"] == "attnviz-diff" and record["against"] == str(folder / "b")
    layer, head = CHANGED
    assert record["most_changed"][0]["layer"] == layer and record["most_changed"][0]["head"] == head
    assert np.array(record["js"]).shape == (3, 6) and record["js"][0] == [0.0] * 6
    assert {path.name for path in out.iterdir() if not path.name.startswith(".")} == {"diff.json", "diff.png", "diff_heads.png", "report.html"}
    printed = " ".join(capsys.readouterr().out.split())
    assert "JS distance by layer and head" in printed and f"layer {layer} head {head}" in printed


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ("bos", "diff compares two checkpoints of one tokenizer"),
        ("gpt2", "diff compares two checkpoints of one architecture"),
    ],
)
def test_two_checkpoints_of_other_tokenizers_or_architectures_are_refused_in_one_line(pair, tmp_path, capsys, other, message):
    from attnviz.cli import run
    from tiny_families import build_checkpoint

    folder, _ = pair
    if other == "bos":  # the same model read without the start token
        config = transformers.LlamaConfig(num_key_value_heads=2, **CONFIG)
        save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=False), tmp_path / other, seed=1)
    else:
        build_checkpoint("gpt2", tmp_path / other)
    out = tmp_path / "out"
    assert run(["diff", TEXT, "--model", str(folder / "a"), "--against", str(tmp_path / other), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in " ".join(error.split()) and "Traceback" not in error and len(error.strip().splitlines()) == 1
    assert not out.exists()


def test_the_reports_diff_view_shows_the_grid_and_the_most_changed_heads(pair, tmp_path, opened):
    """report.html of `attnviz diff` opens on the Diff view: the grid's cell of the changed head reads out its JS
    distance and Clark divergence, and the most changed heads' maps are drawn, the changed head first."""
    import attnviz

    folder, _ = pair
    result = attnviz.diff(TEXT, model=str(folder / "a"), against=str(folder / "b"), device="cpu")
    path = result.report().save(tmp_path / "report")[0]
    page = opened(path)
    page.page.wait_for_selector("#view-diff .diff-pair", state="attached")
    assert page.page.get_attribute("#tab-diff", "aria-selected") == "true"
    layer, head = CHANGED
    page.page.hover(f"#view-diff .diff-grid rect[data-layer='{layer}'][data-head='{head}']")
    js, clark = result.values["js"][layer, head], result.values["clark"][layer, head]
    assert page.texts("#diff-readout")[0] == f"layer {layer} · head {head} · JS {js:.4f} · Clark {clark:.4f} bits"
    headings = page.texts("#view-diff .diff-head")
    assert len(headings) == len(result.top) and headings[0].startswith(f"layer {layer} · head {head} · JS {js:.4f}")
    sides = page.page.eval_on_selector_all("#view-diff canvas.diff-map", "canvases => canvases.map(c => c.dataset.side + ':' + c.width)")
    assert sides[:3] == [f"model:{sides[0].split(':')[1]}", f"against:{sides[0].split(':')[1]}", f"change:{sides[0].split(':')[1]}"]
    assert int(sides[0].split(":")[1]) > 0
    # each map drawn in the report's colours: the first row of a causal map is all on the first token
    for side, values in zip(("model", "against"), result.differences.maps[CHANGED], strict=True):
        pixel = page.page.evaluate(
            f"(() => {{ const c = document.querySelector(\"#view-diff canvas.diff-map[data-side='{side}']\"); "
            "return Array.from(c.getContext('2d').getImageData(0, 0, 1, 1).data.slice(0, 3)); })()"
        )
        assert pixel == page.page.evaluate(f"window.AV.colour({float(values[0, 0])}, false)")

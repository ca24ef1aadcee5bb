"""Activation patching and direct logit attribution (analysis/patching.py, analysis/attribution.py).

Checked against transformers' own model (its *ForCausalLM class, loaded by transformers from the same folder), run
whole once per head: a forward pre-hook on that layer's output projection (o_proj; GPT-2's c_proj) puts the clean
run's slice of its input in place of the corrupted run's, or a forward hook on its q, k or v projection (GPT-2: the
slice of c_attn's output) puts the clean run's slice of its output; the metric is read from the model's logits here.
The direct attribution is checked by its sum (m_clean, float precision) and against the heads' outputs times W_o
read through the final norm's clean scale; a model built by hand, in which one head alone carries the answer,
scores that head 1 and every other 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tiny_families import BPE_VOCAB, FAMILY_CHECKPOINTS, WORDPIECE_VOCAB, _DECODER, _ENCODER, bpe_tokenizer, save_checkpoint, wordpiece_tokenizer

pytestmark = pytest.mark.slow  # checkpoints built and loaded by transformers

CLEAN = "The cat sat on the mat because it was tired."
CORRUPT = "The mat sat on the cat because it was tired."
ANSWER, WRONG = " cat", " mat"
TINY = (CLEAN, CORRUPT, ANSWER, WRONG)
# an indirect-object pair (Wang et al. 2022): the subject repeated, or the indirect object in its place
IOI = ("When Mary and John went to the store, John gave a drink to", "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")
LLAMA_MODULES = {role: f"model.layers.{{}}.self_attn.{role}_proj" for role in ("q", "k", "v")} | {"out": "model.layers.{}.self_attn.o_proj"}

DECODERS = {
    # 6 query heads over 2 key/value heads (groups of 3), RoPE; its own lm_head
    "llama": lambda: (
        transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **_DECODER),
        transformers.LlamaForCausalLM, lambda: bpe_tokenizer(bos=True), LLAMA_MODULES,
    ),  # fmt: skip
    # fused c_attn (q, k, v side by side in its output), Conv1D c_proj with a bias; lm_head tied to wte
    "gpt2": lambda: (
        transformers.GPT2Config(vocab_size=BPE_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        transformers.GPT2LMHeadModel, lambda: bpe_tokenizer(bos=False),
        {"out": "transformer.h.{}.attn.c_proj", **{role: "transformer.h.{}.attn.c_attn" for role in "qkv"}},
    ),  # fmt: skip
}


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request, tmp_path_factory):
    config, model_class, tokenizer, modules = DECODERS[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    save_checkpoint(config, model_class, tokenizer(), folder, seed=1)
    return folder, modules


def spec_of(folder):
    from attnviz.spec import RunSpec

    return RunSpec(str(folder), str(folder), "local folder", device="cpu")


def hooked_model(folder, texts=TINY):
    """transformers' own model of the folder, the two texts' ids (1, N) and the answer's and wrong token's ids."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    clean_ids, corrupt_ids = (tokenizer(text, return_tensors="pt")["input_ids"] for text in texts[:2])
    answer, wrong = (tokenizer(token, add_special_tokens=False)["input_ids"][0] for token in texts[2:])
    return model, clean_ids, corrupt_ids, answer, wrong


def logit_difference(model, ids, position: int, answer: int, wrong: int, module=None, hook=None, before: bool = True) -> float:
    """m of transformers' model over ids (1, N) at position, with hook on module while it runs: a forward pre-hook
    (before), else a forward hook."""
    handle = None if hook is None else (module.register_forward_pre_hook if before else module.register_forward_hook)(hook)
    try:
        with torch.no_grad():
            logits = model(ids).logits[0, position].double()
    finally:
        if handle is not None:
            handle.remove()
    return float(logits[answer] - logits[wrong])


def reference_scores(folder, modules: dict, component: str, position: int = -1, texts=TINY) -> tuple[np.ndarray, float, float]:
    """(L, H) m of the patched runs (logit units), m_clean, m_corrupt: transformers' model run once per head, the head's slice of
    o_proj's input (out) or of its projection's output (q, k, v; through its key/value head) taken from the clean pass."""
    model, clean_ids, corrupt_ids, answer, wrong = hooked_model(folder, texts)
    config = model.config
    num_layers, num_heads = config.num_hidden_layers, config.num_attention_heads
    num_kv = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = config.hidden_size // num_heads
    inner, kv_inner = num_heads * head_dim, num_kv * head_dim
    fused = modules["q"] == modules["k"]
    first = {"out": 0, "q": 0, "k": inner if fused else 0, "v": inner + kv_inner if fused else 0}[component]
    count = num_heads if component in ("out", "q") else num_kv

    def metric(ids, hook=None, module=None) -> float:
        return logit_difference(model, ids, position, answer, wrong, module, hook, before=component == "out")

    seen = {}
    scores = np.zeros((num_layers, num_heads))
    for layer in range(num_layers):
        module = model.get_submodule(modules[component].format(layer))
        keep = (lambda m, args: seen.__setitem__(layer, args[0].clone())) if component == "out" else (lambda m, args, out: seen.__setitem__(layer, out.clone()))
        metric(clean_ids, keep, module)
        for head in range(count):
            part = slice(first + head * head_dim, first + (head + 1) * head_dim)

            def patch(m, *given, part=part, layer=layer):
                x = (given[0][0] if component == "out" else given[1]).clone()
                x[..., part] = seen[layer][..., part]
                return (x,) if component == "out" else x

            value = metric(corrupt_ids, patch, module)
            for query_head in range(head * num_heads // count, (head + 1) * num_heads // count):
                scores[layer, query_head] = value
    return scores, metric(clean_ids), metric(corrupt_ids)


def logit_units(patched, scores):
    """The normalised scores back in logit units, m_patched: compared there, as float32's rounding is (a score's
    denominator m_clean - m_corrupt may be small at some position, and would magnify it)."""
    return scores * (patched.clean - patched.corrupt) + patched.corrupt


def reference_direct(folder, modules: dict, texts=TINY) -> np.ndarray:
    """(L, H): each head's output at the last position (o_proj's input, hooked) times its W_o slice, read through
    the final norm (its input hooked, its scale from it) and W_U[answer] - W_U[wrong]."""
    model, ids, _, answer, wrong = hooked_model(folder, texts)
    final = model.get_decoder().norm if hasattr(model.get_decoder(), "norm") else model.transformer.ln_f
    entered, heads = [], {}
    handles = [final.register_forward_pre_hook(lambda m, args: entered.append(args[0][0, -1].double()))]
    num_layers, num_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    for layer in range(num_layers):
        module = model.get_submodule(modules["out"].format(layer))
        handles.append(module.register_forward_pre_hook(lambda m, args, layer=layer: heads.__setitem__(layer, args[0][0, -1].double())))
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    x = entered[0]
    is_layer_norm = isinstance(final, torch.nn.LayerNorm)
    centred = x - x.mean() if is_layer_norm else x
    scale = 1 / torch.sqrt(centred.pow(2).mean() + (final.eps if is_layer_norm else final.variance_epsilon))
    unembedding = model.get_output_embeddings().weight.detach().double()
    direction = unembedding[answer] - unembedding[wrong]
    expected = np.zeros((num_layers, num_heads))
    for layer in range(num_layers):
        module = model.get_submodule(modules["out"].format(layer))
        w_o = module.weight.detach().double()
        w_o = w_o if isinstance(module, torch.nn.Linear) else w_o.T  # (D, H * d)
        d = w_o.shape[1] // num_heads
        for head in range(num_heads):
            written = w_o[:, head * d : (head + 1) * d] @ heads[layer][head * d : (head + 1) * d]  # (D,)
            written = written - written.mean() if is_layer_norm else written
            expected[layer, head] = float((written * scale * final.weight.detach().double()) @ direction)
    return expected


@pytest.mark.parametrize("component", ["out", "q", "k", "v"])
def test_each_heads_patched_score_is_transformers_model_with_that_slice_from_the_clean_run(decoder, component):
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model

    folder, modules = decoder
    loaded = load_model(str(folder), device="cpu")
    patched = patch_heads(loaded, CLEAN, CORRUPT, ANSWER, WRONG, spec_of(folder), components=(component,))
    expected, m_clean, m_corrupt = reference_scores(folder, modules, component)
    np.testing.assert_allclose([patched.clean, patched.corrupt], [m_clean, m_corrupt], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logit_units(patched, patched.scores[component]), expected, rtol=1e-5, atol=1e-5)
    assert np.ptp(expected) > 0.05  # the heads differ here: a test that could fail


def test_a_position_reads_the_metric_there(decoder):
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model

    folder, modules = decoder
    loaded = load_model(str(folder), device="cpu")
    patched = patch_heads(loaded, CLEAN, CORRUPT, ANSWER, WRONG, spec_of(folder), position=7)
    expected, _, _ = reference_scores(folder, modules, "out", position=7)
    assert patched.position == 7
    np.testing.assert_allclose(logit_units(patched, patched.output), expected, rtol=1e-5, atol=1e-5)


def test_the_direct_attribution_parts_sum_to_the_clean_logit_difference(decoder):
    """The parts (embeddings, heads, W_o biases, the rest of each layer, the norm's and unembedding's biases) add up
    to m_clean; each head's part is its output times its W_o slice through the clean scale, from transformers' hooks."""
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model

    folder, modules = decoder
    loaded = load_model(str(folder), device="cpu")
    patched = patch_heads(loaded, CLEAN, CORRUPT, ANSWER, WRONG, spec_of(folder))
    np.testing.assert_allclose(patched.parts["total"], patched.clean, rtol=1e-6, atol=1e-5)

    expected = reference_direct(folder, modules)
    np.testing.assert_allclose(patched.direct, expected, rtol=1e-6, atol=1e-6)
    assert np.abs(expected).max() > 0.1


def test_a_head_that_alone_carries_the_answer_scores_one_and_every_other_zero(tmp_path):
    """A tiny Llama whose MLPs write nothing and whose W_o reads only layer 1's head 2: the last position's stream
    is its own token's embedding plus that head's output, so patching it restores the clean answer and nothing
    else moves it. Its direct attribution is the only head's that is not 0."""
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model

    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **_DECODER)
    model = save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), tmp_path, seed=3)
    head_dim = config.hidden_size // config.num_attention_heads
    with torch.no_grad():
        for layer, block in enumerate(model.model.layers):
            block.mlp.down_proj.weight.zero_()
            kept = block.self_attn.o_proj.weight[:, 2 * head_dim : 3 * head_dim].clone()
            block.self_attn.o_proj.weight.zero_()
            if layer == 1:
                block.self_attn.o_proj.weight[:, 2 * head_dim : 3 * head_dim] = kept
    model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    patched = patch_heads(loaded, CLEAN, CORRUPT, ANSWER, WRONG, spec_of(tmp_path), components=("out", "pattern"))
    assert abs(patched.clean - patched.corrupt) > 0.1
    expected = np.zeros((2, config.num_attention_heads))
    expected[1, 2] = 1.0
    np.testing.assert_allclose(patched.output, expected, atol=1e-5)
    direct = patched.direct.copy()
    assert abs(direct[1, 2]) > 0.1
    direct[1, 2] = 0.0
    np.testing.assert_allclose(direct, 0.0, atol=1e-7)
    # its map alone: the clean map over the corrupted values moves m part of the way, the other heads' nothing
    pattern = patched.scores["pattern"].copy()
    pattern[1, 2] = 0.0
    np.testing.assert_allclose(pattern, 0.0, atol=1e-5)


def test_per_position_patches_the_most_affecting_heads_one_position_at_a_time(decoder):
    """Each position's score is the hooked model with the head's slice from the clean run at that position alone."""
    from attnviz.analysis.patching import MOST_AFFECTING, patch_heads
    from attnviz.models.loading import load_model

    folder, modules = decoder
    loaded = load_model(str(folder), device="cpu")
    patched = patch_heads(loaded, CLEAN, CORRUPT, ANSWER, WRONG, spec_of(folder), per_position=True)
    assert list(patched.per_position) == patched.top[:MOST_AFFECTING]
    layer, head = patched.top[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    clean_ids, corrupt_ids = (tokenizer(text, return_tensors="pt")["input_ids"] for text in (CLEAN, CORRUPT))
    answer, wrong = (tokenizer(token, add_special_tokens=False)["input_ids"][0] for token in (ANSWER, WRONG))
    module = model.get_submodule(modules["out"].format(layer))
    seen = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    with torch.no_grad():
        model(clean_ids)
    handle.remove()
    d = seen[0].shape[-1] // model.config.num_attention_heads
    row = []
    for position in range(clean_ids.shape[1]):

        def patch(m, args, position=position):
            x = args[0].clone()
            x[0, position, head * d : (head + 1) * d] = seen[0][0, position, head * d : (head + 1) * d]
            return (x,)

        handle = module.register_forward_pre_hook(patch)
        with torch.no_grad():
            logits = model(corrupt_ids).logits[0, -1].double()
        handle.remove()
        row.append(float(logits[answer] - logits[wrong]))
    np.testing.assert_allclose(logit_units(patched, patched.per_position[(layer, head)]), row, rtol=1e-5, atol=1e-5)


def test_smollm2s_patch_json_is_transformers_model_hooked_on_an_indirect_object_pair(tmp_path, smollm2_cached):
    """The issue's test: `attnviz patch` on SmolLM2 (9 heads over 3 key/value heads, tied head) over an
    indirect-object pair; patch.json's scores.output and scores.direct are those of transformers' own
    LlamaForCausalLM (its weights from transformers' own GGUF loader), hooked at o_proj (270 runs) and read through its final norm,
    within 1e-4."""
    import json

    from attnviz.cli import run

    clean, corrupt, answer, wrong = IOI
    out = tmp_path / "run"
    command = ["patch", clean, "--corrupt", corrupt, "--answer", answer, "--wrong", wrong, "--model", "smollm2", "--device", "cpu"]
    assert run([*command, "--out", str(out)]) == 0
    record = json.loads((out / "patch.json").read_text(encoding="utf-8"))
    folder = smollm2_cached.reference_folder
    patched, m_clean, m_corrupt = reference_scores(folder, LLAMA_MODULES, "out", texts=IOI)
    expected = (patched - m_corrupt) / (m_clean - m_corrupt)
    np.testing.assert_allclose([record["metric"]["clean"], record["metric"]["corrupt"]], [m_clean, m_corrupt], atol=1e-4)
    np.testing.assert_allclose(record["scores"]["output"], expected, atol=1e-4)
    np.testing.assert_allclose(record["scores"]["direct"], reference_direct(folder, LLAMA_MODULES, texts=IOI), atol=1e-4)
    assert m_clean > 0 > m_corrupt and np.abs(expected).max() > 0.3  # the model gets it, and some head carries it
    assert {"patch.json", "patch.png", "report.html"} <= {path.name for path in out.iterdir()}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    config, model_class, tokenizer, _ = DECODERS["llama"]()
    folder = tmp_path_factory.mktemp("llama-patch")
    save_checkpoint(config, model_class, tokenizer(), folder, seed=1)
    return folder


def test_the_reports_patching_view_shows_the_grids_and_a_clicked_heads_maps_on_both_texts(tiny_llama, tmp_path, opened):
    """report.html of `attnviz patch` opens on the Patching view: a cell reads out its score and direct attribution;
    a click shows that head's maps on the clean and the corrupted text, drawn in the report's colours from
    transformers' own eager attentions of each text."""
    import attnviz

    result = attnviz.patch(CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, model=str(tiny_llama), device="cpu")
    path = result.report().save(tmp_path / "report")[0]
    page = opened(path)
    page.page.wait_for_selector("#view-patch .patch-pair", state="attached")
    assert page.page.get_attribute("#tab-patch", "aria-selected") == "true"
    assert page.texts("#patch-note")[0].startswith("Each head's part from the clean run patched into the corrupted run.")
    top_layer, top_head = result.top[0]
    assert page.page.get_attribute("#view-patch .patch-pair", "data-layer") == str(top_layer)
    layer, head = result.top[-1]  # the least affecting head: another than the one shown first
    cell = f"#patch-output rect[data-layer='{layer}'][data-head='{head}']"
    page.page.hover(cell)
    score, direct = result.scores["out"][layer, head], result.direct[layer, head]
    signed = lambda value: f"{value:+.3f}"  # noqa: E731
    expected = f"layer {layer} · head {head} · score {signed(score)} · direct {signed(direct)} logits"
    assert page.texts("#patch-readout")[0] == expected
    page.page.click(cell)
    page.page.wait_for_selector(f"#view-patch .patch-pair[data-layer='{layer}'][data-head='{head}']", state="attached")
    assert page.texts("#view-patch .patch-head")[0] == expected
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llama)
    for side, text in (("clean", CLEAN), ("corrupt", CORRUPT)):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            weights = model(ids, output_attentions=True).attentions[layer][0, head].numpy()  # (N, N)
        canvas = f"#view-patch canvas.patch-map[data-side='{side}']"
        cell_px = page.page.evaluate(f"document.querySelector(\"{canvas}\").width") // ids.shape[1]
        for row in (1, ids.shape[1] - 1):  # the second row's first key, the last row's first key
            pixel = page.page.evaluate(
                f"(() => {{ const c = document.querySelector(\"{canvas}\"); "
                f"return Array.from(c.getContext('2d').getImageData(0, {row * cell_px}, 1, 1).data.slice(0, 3)); }})()"
            )
            assert pixel == page.page.evaluate(f"window.AV.colour({float(weights[row, 0])}, false)"), (side, row)
    # the keys: Enter on the outlined cell opens that head too (the grid's own choose, core.js)
    page.page.hover(f"#patch-output rect[data-layer='{top_layer}'][data-head='{top_head}']")
    page.page.focus("#patch-output")
    page.page.keyboard.press("Enter")
    page.page.wait_for_selector(f"#view-patch .patch-pair[data-layer='{top_layer}'][data-head='{top_head}']", state="attached")


def test_the_figures_and_the_terminal_say_the_clean_run_is_patched_into_the_corrupted_one(tiny_llama):
    """The right way round (the corrupted run is the one run, each head's part taken from the clean run) in
    patch.png's title, patch_positions.png's and the terminal's; no cell written "-0.00"."""
    import attnviz
    from rich.console import Console

    result = attnviz.patch(CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, per_position=True, model=str(tiny_llama), device="cpu")
    right = "from the clean run patched into the corrupted run"
    for figure in (result.figure(), result.figure("positions")):
        title = " ".join(figure.get_suptitle().split())
        assert right in title and "patched from the corrupted" not in title, title
    console = Console(record=True, width=200)
    console.print(result)
    assert right in " ".join(console.export_text().split())
    cells = [text.get_text() for text in result.figure("positions").axes[0].texts]
    assert cells and "-0.00" not in cells and all(cell == f"{value:.2f}".replace("-0.00", "0.00") for cell, value in
                                                  zip(cells, np.stack(list(result.patching.per_position.values())).ravel()))  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--corrupt": "The cat sat."}, "the clean text has 12 tokens and the --corrupt text 5: patching needs the same positions in both (first difference at token 4: 'Ġon' against '.')"),
        ({"--corrupt": "我想吃酸菜鱼，因为它很好吃，真的很好吃。"}, "the clean text has 12 tokens and the --corrupt text"),
        ({"--position": "12"}, "--position 12 is past the text: its 12 tokens are positions 0 to 11"),
        ({"--answer": " tired."}, "--answer ' tired.' is 2 tokens, not one ('Ġtired', '.')"),
        ({"--wrong": " mat", "--answer": " mat"}, "--answer and --wrong are the same token ' mat'"),
        ({"--corrupt": CLEAN}, "the clean text and the --corrupt text are the same: m_clean = m_corrupt"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line_before_anything_is_written(tiny_llama, tmp_path, capsys, change, message):
    from attnviz.cli import run

    given = {"--corrupt": CORRUPT, "--answer": ANSWER, "--wrong": WRONG, **change}
    out = tmp_path / "run"
    args = ["patch", CLEAN, *[part for pair in given.items() for part in pair], "--model", str(tiny_llama), "--device", "cpu"]
    assert run([*args, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and error.count("\n") == 1, error
    assert not out.exists()


def test_an_encoder_decoders_decoder_heads_are_patched_as_transformers_model_hooked(tmp_path):
    """BART's decoder (the text read shifted right, teacher-forced): its self-attention heads patched, against
    BartForConditionalGeneration with a pre-hook on the decoder's out_proj; no direct attribution (post-norm)."""
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    config, _, tokenizer = FAMILY_CHECKPOINTS["bart"]()
    save_checkpoint(config, transformers.BartForConditionalGeneration, tokenizer(), tmp_path, seed=2)
    clean, corrupt, answer, wrong = "the cat sat on the mat", "the dog sat on the mat", "cat", "dog"
    loaded = load_model(str(tmp_path), device="cpu")
    spec = RunSpec(str(tmp_path), str(tmp_path), "local folder", device="cpu", stack="decoder")
    patched = patch_heads(loaded, clean, corrupt, answer, wrong, spec, position=2)
    assert patched.direct is None

    model = transformers.BartForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    answer_id, wrong_id = (tok(token, add_special_tokens=False)["input_ids"][0] for token in (answer, wrong))

    def run_model(text, hook=None, module=None):
        ids = tok(text, return_tensors="pt")["input_ids"]
        shifted = torch.cat([torch.full((1, 1), config.decoder_start_token_id), ids[:, :-1]], dim=1)
        handle = module.register_forward_pre_hook(hook) if hook is not None else None
        with torch.no_grad():
            logits = model(input_ids=ids, decoder_input_ids=shifted).logits[0, 2].double()
        if handle is not None:
            handle.remove()
        return float(logits[answer_id] - logits[wrong_id])

    heads, d = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    expected = np.zeros((config.decoder_layers, heads))
    for layer in range(config.decoder_layers):
        module = model.model.decoder.layers[layer].self_attn.out_proj
        seen = []
        run_model(clean, lambda m, args: seen.append(args[0].clone()), module)
        for head in range(heads):

            def patch(m, args, head=head):
                x = args[0].clone()
                x[..., head * d : (head + 1) * d] = seen[0][..., head * d : (head + 1) * d]
                return (x,)

            expected[layer, head] = run_model(corrupt, patch, module)
    np.testing.assert_allclose([patched.clean, patched.corrupt], [run_model(clean), run_model(corrupt)], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logit_units(patched, patched.output), expected, rtol=1e-5, atol=1e-5)


# An encoder saved with its masked-LM head: the metric read at the mask. Each family's *ForMaskedLM class, its W_o
# (ALBERT's one module serves every layer: its k-th call is layer k's) and its W_q, W_k, W_v.
MASKED_LM = {
    "bert": (transformers.BertConfig(vocab_size=WORDPIECE_VOCAB, **_ENCODER), transformers.BertForMaskedLM, "bert.encoder.layer.{}.attention"),
    "roberta": (transformers.RobertaConfig(vocab_size=WORDPIECE_VOCAB, pad_token_id=0, **_ENCODER), transformers.RobertaForMaskedLM,
                "roberta.encoder.layer.{}.attention"),
    "distilbert": (transformers.DistilBertConfig(vocab_size=WORDPIECE_VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
                   transformers.DistilBertForMaskedLM, "distilbert.transformer.layer.{}.attention"),
    "albert": (transformers.AlbertConfig(vocab_size=WORDPIECE_VOCAB, embedding_size=16, **_ENCODER), transformers.AlbertForMaskedLM,
               "albert.encoder.albert_layer_groups.0.albert_layers.0.attention"),
    "electra": (transformers.ElectraConfig(vocab_size=WORDPIECE_VOCAB, embedding_size=16, **_ENCODER), transformers.ElectraForMaskedLM,
                "electra.encoder.layer.{}.attention"),
}  # fmt: skip
PROJECTIONS = {  # the attention module's W_o, W_q, W_k, W_v, by layout
    "bert": {"out": "output.dense", "q": "self.query", "k": "self.key", "v": "self.value"},
    "distilbert": {"out": "out_lin", "q": "q_lin", "k": "k_lin", "v": "v_lin"},
    "albert": {"out": "dense", "q": "query", "k": "key", "v": "value"},
}
MASKED_TEXTS = ("The cat sat on the [MASK] because it was tired.", "The dog sat on the [MASK] because it was tired.", "mat", "floor")


@pytest.fixture(scope="module", params=sorted(MASKED_LM))
def masked_lm(request, tmp_path_factory):
    config, model_class, _ = MASKED_LM[request.param]
    folder = tmp_path_factory.mktemp(f"{request.param}-mlm")
    save_checkpoint(config, model_class, wordpiece_tokenizer(), folder, seed=1)
    return request.param, folder


def masked_reference(name, folder, component: str) -> tuple[np.ndarray, float, float]:
    """(L, H) m of transformers' *ForMaskedLM run once per head with that head's slice of W_o's input (out) or of its
    projection's output (q, k, v) from the clean run, read at the mask; m_clean, m_corrupt."""
    _, model_class, attention = MASKED_LM[name]
    model = model_class.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    clean_ids, corrupt_ids = (tokenizer(text, return_tensors="pt")["input_ids"] for text in MASKED_TEXTS[:2])
    position = clean_ids[0].tolist().index(tokenizer.mask_token_id)
    answer, wrong = (tokenizer(token, add_special_tokens=False)["input_ids"][0] for token in MASKED_TEXTS[2:])
    config = model.config
    num_layers = getattr(config, "num_hidden_layers", None) or config.n_layers
    num_heads = getattr(config, "num_attention_heads", None) or config.n_heads
    layout = PROJECTIONS.get(name if name in PROJECTIONS else "bert")
    modules = [model.get_submodule(f"{attention.format(layer)}.{layout[component]}") for layer in range(num_layers)]
    d = modules[0].weight.shape[0 if component != "out" else 1] // num_heads

    def metric(ids, change=None, layer=None) -> float:
        if change is None:
            return logit_difference(model, ids, position, answer, wrong)
        call, calls = sum(module is modules[layer] for module in modules[:layer]), []  # a shared module: this layer's call

        def hook(module, *given):
            calls.append(None)
            return change(*given) if len(calls) == call + 1 else None

        return logit_difference(model, ids, position, answer, wrong, modules[layer], hook, before=component == "out")

    scores = np.zeros((num_layers, num_heads))
    for layer in range(num_layers):
        seen = []
        metric(clean_ids, lambda *given: seen.append((given[0][0] if component == "out" else given[1]).clone()), layer)
        for head in range(num_heads):

            def patch(*given, part=slice(head * d, (head + 1) * d)):
                x = (given[0][0] if component == "out" else given[1]).clone()
                x[..., part] = seen[0][..., part]
                return (x,) if component == "out" else x

            scores[layer, head] = metric(corrupt_ids, patch, layer)
    return scores, metric(clean_ids), metric(corrupt_ids)


def test_an_encoders_masked_lm_head_is_read_at_the_mask_as_transformers_masked_lm_model_hooked(masked_lm):
    """BERT (attnviz's own encoder), RoBERTa, DistilBERT, ALBERT (one layer's weights shared) and ELECTRA saved with
    their masked-LM heads: m at the [MASK] is their *ForMaskedLM's logits there, and each head's patched score is
    that model's with a pre-hook on its W_o; no direct attribution (post-norm, a head that is not linear)."""
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model

    name, folder = masked_lm
    loaded = load_model(str(folder), device="cpu")
    patched = patch_heads(loaded, *MASKED_TEXTS, spec_of(folder))
    expected, m_clean, m_corrupt = masked_reference(name, folder, "out")
    assert patched.position == 6 and patched.tokens[6] == "[MASK]" and patched.direct is None and not patched.causal
    np.testing.assert_allclose([patched.clean, patched.corrupt], [m_clean, m_corrupt], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logit_units(patched, patched.output), expected, rtol=1e-5, atol=1e-5)
    assert np.ptp(expected) > 0.05


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_berts_q_k_and_v_are_patched_as_hooks_on_its_projections(tmp_path, component):
    """attnviz's own BERT encoder: each head's q, k or v from the clean run, against BertForMaskedLM with a forward
    hook on that projection; the pattern component runs on it too (the clean map over the corrupted values)."""
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model

    config, model_class, _ = MASKED_LM["bert"]
    save_checkpoint(config, model_class, wordpiece_tokenizer(), tmp_path, seed=1)
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.is_bert
    patched = patch_heads(loaded, *MASKED_TEXTS, spec_of(tmp_path), components=(component, "pattern"))
    expected, _, _ = masked_reference("bert", tmp_path, component)
    np.testing.assert_allclose(logit_units(patched, patched.scores[component]), expected, rtol=1e-5, atol=1e-5)
    assert np.ptp(expected) > 0.05 and np.isfinite(patched.scores["pattern"]).all()


@pytest.mark.parametrize(
    ("texts", "options", "message"),
    [
        (("The cat sat on the mat.", "The dog sat on the mat."), {}, "the clean text has no [MASK]: an encoder's masked-LM head predicts"),
        (("The [MASK] sat on the [MASK].", "The dog sat on the [MASK]."), {}, "the clean text has 2 [MASK] tokens (positions 2, 6): choose the one to read with position"),
        (("The cat sat on the [MASK].", "The dog sat on the [MASK]."), {"position": 2}, "position=2 is not a [MASK]: the clean text's [MASK] is at position 6"),
        (("The cat sat on the [MASK].", "The [MASK] sat on the mat."), {}, "the corrupt text has no [MASK] at position 6"),
    ],
)  # fmt: skip
def test_an_encoder_is_read_at_one_mask_of_both_texts_or_refused(tmp_path, texts, options, message):
    import attnviz
    from attnviz.errors import AttnvizError

    config, model_class, _ = MASKED_LM["bert"]
    save_checkpoint(config, model_class, wordpiece_tokenizer(), tmp_path, seed=1)
    with pytest.raises(AttnvizError) as refused:
        attnviz.patch(texts[0], corrupt=texts[1], answer="mat", wrong="floor", model=str(tmp_path), device="cpu", **options)
    assert str(refused.value).startswith(message), str(refused.value)


def test_an_encoder_without_a_masked_lm_head_is_refused(tmp_path):
    """A base model's checkpoint (BertModel's: no cls.predictions) has no token to predict: one line."""
    import attnviz
    from attnviz.errors import AttnvizError

    config, _, _ = MASKED_LM["bert"]
    save_checkpoint(config, transformers.BertModel, wordpiece_tokenizer(), tmp_path, seed=1)
    with pytest.raises(AttnvizError, match="is an encoder without a masked-LM head"):
        attnviz.patch(MASKED_TEXTS[0], corrupt=MASKED_TEXTS[1], answer="mat", wrong="floor", model=str(tmp_path), device="cpu")

"""The edges of a circuit (analysis/edges.py): EAP, EAP-IG and path patching, against transformers' own model.

The reference is written here from transformers' *ForCausalLM class in float64 (SDPA attention, Llama's RMSNorm
written out in float64: both compute in float32 otherwise), with hooks: each head's output is
o_proj's input slice times its W_o slice (GPT-2: c_proj's rows); a receiver's copy of its input is made by a forward
hook on its projection (q_proj, k_proj, v_proj; GPT-2's c_attn), which puts in the receiver's slice the projection of
norm(x + added) (x kept by a pre-hook on the layer's own norm, the projection written out with F.linear or Conv1D's
x @ W + b); the read-out's input by a pre-hook on the final norm. EAP is checked against central differences of the
metric in the sender's direction, path patching against the added difference itself, EAP-IG against the mean of its
N gradients, each taken by autograd with the token embeddings interpolated (the model's embedding module hooked).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tiny_families import BPE_VOCAB, _DECODER, bpe_tokenizer, save_checkpoint

pytestmark = pytest.mark.slow  # checkpoints built and loaded by transformers

TINY = ("The cat sat on the mat because it was tired.", "The mat sat on the cat because it was tired.", " cat", " mat")
DECODERS = {
    # 6 query heads over 2 key/value heads (groups of 3), RoPE, RMSNorm; 3 layers: edges that skip a layer
    "llama": lambda: (
        transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **{**_DECODER, "num_hidden_layers": 3}),
        transformers.LlamaForCausalLM, lambda: bpe_tokenizer(bos=True),
    ),  # fmt: skip
    # Qwen3: an RMSNorm over each head's q and k after the projections, head size 16 set apart from 48 / 6
    "qwen3": lambda: (
        transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, **{**_DECODER, "num_hidden_layers": 3}),
        transformers.Qwen3ForCausalLM, lambda: bpe_tokenizer(bos=True),
    ),  # fmt: skip
    # fused c_attn, Conv1D weights, LayerNorm, learned positions; lm_head tied to wte
    "gpt2": lambda: (
        transformers.GPT2Config(vocab_size=BPE_VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64),
        transformers.GPT2LMHeadModel, lambda: bpe_tokenizer(bos=False),
    ),  # fmt: skip
}
EPS = 1e-5


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request, tmp_path_factory):
    config, model_class, tokenizer = DECODERS[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    save_checkpoint(config, model_class, tokenizer(), folder, seed=3)
    return folder


def attnviz_edges(folder, ig=None, checked=10):
    from attnviz.analysis.edges import EdgeSettings
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    loaded = load_model(str(folder), device="cpu")
    spec = RunSpec(str(folder), str(folder), "local folder", device="cpu")
    return patch_heads(loaded, *TINY, spec, edges=EdgeSettings(ig=ig, checked=checked))


class Reference:
    """transformers' model of folder in float64, and the edges' numbers made with hooks on it."""

    def __init__(self, folder):
        # SDPA: eager Llama attention takes its softmax in float32, which the central differences would see as noise
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").double().eval()
        for module in self.model.modules():  # Llama's RMSNorm computes in float32 too: written out here in float64
            if type(module).__name__.endswith("RMSNorm"):
                module.register_forward_hook(lambda m, args, out: m.weight * args[0] * torch.rsqrt(args[0].pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        self.clean_ids, self.corrupt_ids = (tokenizer(text, return_tensors="pt")["input_ids"] for text in TINY[:2])
        self.answer, self.wrong = (tokenizer(token, add_special_tokens=False)["input_ids"][0] for token in TINY[2:])
        config = self.model.config
        self.gpt2 = config.model_type == "gpt2"
        self.num_heads = config.num_attention_heads
        self.num_kv = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.layers = self.model.transformer.h if self.gpt2 else self.model.model.layers
        self.final = self.model.transformer.ln_f if self.gpt2 else self.model.model.norm
        self.written = self._written()  # (L, H, N, D): out_clean - out_corrupt

    def norm(self, layer):
        return self.layers[layer].ln_1 if self.gpt2 else self.layers[layer].input_layernorm

    def projection(self, layer, role):
        """(module, project(x) -> the head slice's features of role for head i, the module's output slice of head i)."""
        inner, kv_inner, d = self.num_heads * self.head_dim, self.num_kv * self.head_dim, self.head_dim
        if self.gpt2:
            module = self.layers[layer].attn.c_attn
            first = {"q": 0, "k": inner, "v": inner + kv_inner}[role]
            part = lambda i: slice(first + i * d, first + (i + 1) * d)  # noqa: E731
            return module, lambda x, i: x @ module.weight[:, part(i)] + module.bias[part(i)], part
        module = getattr(self.layers[layer].self_attn, f"{role}_proj")
        part = lambda i: slice(i * d, (i + 1) * d)  # noqa: E731
        return module, lambda x, i: torch.nn.functional.linear(x, module.weight[part(i)], None if module.bias is None else module.bias[part(i)]), part

    def _written(self):
        kept = {}
        outputs = [layer.attn.c_proj if self.gpt2 else layer.self_attn.o_proj for layer in self.layers]
        for name, ids in (("clean", self.clean_ids), ("corrupt", self.corrupt_ids)):
            handles = [module.register_forward_pre_hook(lambda m, args, layer=layer, name=name: kept.__setitem__((name, layer), args[0][0])) for layer, module in enumerate(outputs)]
            with torch.no_grad():
                self.model(ids)
            for handle in handles:
                handle.remove()
        rows = []
        for layer, module in enumerate(outputs):
            z = kept[("clean", layer)] - kept[("corrupt", layer)]  # (N, H * d)
            w_o = module.weight if self.gpt2 else module.weight.T  # (H * d, D)
            d = self.head_dim
            rows.append(torch.stack([z[:, h * d : (h + 1) * d] @ w_o[h * d : (h + 1) * d] for h in range(self.num_heads)]))
        return torch.stack(rows).detach()  # (L, H, N, D)

    def metric(self, ids=None, receiver=None, added=None, alpha=None):
        """m with `added` (N, D) put into the receiver's input alone (receiver: (layer, role, head) or "logits"), the
        token embeddings interpolated from the corrupted text's to the clean one's by alpha (the corrupted ids run)."""
        ids = self.corrupt_ids if ids is None else ids
        handles, kept = [], {}
        if receiver == "logits":
            handles.append(self.final.register_forward_pre_hook(lambda m, args: (args[0] + added,)))
        elif receiver is not None:
            layer, role, head = receiver
            module, project, part = self.projection(layer, role)
            handles.append(self.norm(layer).register_forward_pre_hook(lambda m, args: kept.__setitem__("x", args[0])))

            def put(m, args, y):
                y = y.clone()
                y[..., part(head)] = project(self.norm(layer)(kept["x"] + added), head)
                return y

            handles.append(module.register_forward_hook(put))
        if alpha is not None:
            embed = self.model.get_input_embeddings()
            start, end = embed(self.corrupt_ids).detach(), embed(self.clean_ids).detach()
            handles.append(embed.register_forward_hook(lambda m, args, out: start + alpha * (end - start)))
        try:
            logits = self.model(ids).logits[0, -1]
        finally:
            for handle in handles:
                handle.remove()
        return logits[self.answer] - logits[self.wrong]

    def finite_difference(self, receiver, sender) -> float:
        step = EPS * self.written[sender]
        with torch.no_grad():
            return float((self.metric(receiver=receiver, added=step) - self.metric(receiver=receiver, added=-step)) / (2 * EPS))

    def path_patched(self, receiver, sender) -> float:
        with torch.no_grad():
            return float(self.metric(receiver=receiver, added=self.written[sender]) - self.metric())

    def integrated(self, receiver, steps: int) -> torch.Tensor:
        """(L, H): every sender's score into receiver, its gradient averaged over the steps' interpolated inputs."""
        total = 0
        for k in range(steps):
            added = torch.zeros(self.written.shape[2:], dtype=torch.float64, requires_grad=True)
            (gradient,) = torch.autograd.grad(self.metric(receiver=receiver, added=added, alpha=k / steps), added)
            total = total + torch.einsum("lhnD,nD->lh", self.written, gradient)
        return total / steps

    @property
    def scale(self) -> float:
        with torch.no_grad():
            return float(self.metric(self.clean_ids) - self.metric())


def receivers(reference):
    yield from ((layer, role, head) for layer in range(1, len(reference.layers)) for role in "qkv"
                for head in range(reference.num_heads if role == "q" else reference.num_kv))  # fmt: skip
    yield "logits"


def scores_of(edges, receiver) -> np.ndarray:
    """(L, H): every sender's normalised score into receiver (NaN where the sender is not before it)."""
    if receiver == "logits":
        return edges.scores["logits"]
    layer, role, head = receiver
    return edges.scores[role][:, :, layer, head]


def test_eap_scores_are_central_differences_of_the_metric_along_each_sender(decoder):
    patched = attnviz_edges(decoder)
    reference = Reference(decoder)
    scale = patched.clean - patched.corrupt
    np.testing.assert_allclose(scale, reference.scale, rtol=1e-5)
    compared = []
    for receiver in receivers(reference):
        senders = range(len(reference.layers)) if receiver == "logits" else range(receiver[0])
        expected = np.array([[reference.finite_difference(receiver, (layer, head)) for head in range(reference.num_heads)] for layer in senders])
        actual = scores_of(patched.edges, receiver)[: len(expected)] * scale
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)  # logit units, float32 against float64
        if receiver != "logits":
            assert np.isnan(scores_of(patched.edges, receiver)[receiver[0] :]).all()  # no edge from a layer not before it
        compared.append(np.abs(expected).max())
    assert np.median(compared) > 1e-3 and max(compared) > 0.1  # edges that carry something: a test that could fail


def test_the_checked_edges_path_patching_is_the_sender_added_to_that_receivers_input_alone(decoder):
    patched = attnviz_edges(decoder, checked=12)
    reference = Reference(decoder)
    scale = patched.clean - patched.corrupt
    assert len(patched.edges.checked) == 12
    scores = [abs(score) for _, score, _ in patched.edges.checked]
    assert scores == sorted(scores, reverse=True)
    for edge, score, value in patched.edges.checked:
        receiver = "logits" if edge.input == "logits" else (edge.layer, edge.input, edge.head)
        assert score == patched.edges.score(edge)
        np.testing.assert_allclose(value * scale, reference.path_patched(receiver, edge.sender), rtol=1e-4, atol=1e-4)
    every = [abs(value) for values in patched.edges.scores.values() for value in values[np.isfinite(values)]]
    assert abs(scores[-1]) >= sorted(every)[-12]  # the 12 largest


@pytest.mark.parametrize("steps", [1, 3])
def test_eap_ig_is_the_mean_of_its_n_gradients_along_the_interpolated_embeddings(decoder, steps):
    patched = attnviz_edges(decoder, ig=steps)
    reference = Reference(decoder)
    scale = patched.clean - patched.corrupt
    assert patched.edges.ig == steps
    for receiver in [(1, "q", 0), (2, "k", 1), (2, "v", 0), "logits"]:
        expected = reference.integrated(receiver, steps).numpy()
        layers = len(expected) if receiver == "logits" else receiver[0]
        actual = scores_of(patched.edges, receiver)[:layers] * scale
        np.testing.assert_allclose(actual, expected[:layers], rtol=1e-4, atol=1e-5)


def test_eap_ig_of_one_step_is_eap(decoder):
    """k = 0 alone: the corrupted run's gradient, EAP's (the interpolation starts at the corrupted embeddings)."""
    one, eap = attnviz_edges(decoder, ig=1, checked=0), attnviz_edges(decoder, checked=0)
    for name, values in eap.edges.scores.items():
        np.testing.assert_allclose(one.edges.scores[name], values, rtol=1e-6, atol=1e-9, equal_nan=True)


def test_patch_edges_writes_edges_json_the_figure_and_the_table(decoder, tmp_path, capsys):
    """`attnviz patch --edges --ig 2 --checked-edges 5`: edges.json holds the API's numbers (null where no edge),
    the 5 checked edges with both numbers; edges.png within its size cap; the terminal's table of the checked edges."""
    import json

    from attnviz.cli import run
    from attnviz.render.sizes import figure_max_px
    from helpers import read_png

    out = tmp_path / "run"
    clean, corrupt, answer, wrong = TINY
    args = ["patch", clean, "--corrupt", corrupt, "--answer", answer, "--wrong", wrong, "--model", str(decoder), "--device", "cpu"]
    assert run([*args, "--edges", "--ig", "2", "--checked-edges", "5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "edges.json").read_text(encoding="utf-8"))
    expected = attnviz_edges(decoder, ig=2, checked=5).edges
    assert record["method"] == "eap-ig" and record["ig_steps"] == 2 and record["heads"] == expected.num_heads
    for name, values in expected.scores.items():
        written = np.array(record["scores"][name], dtype=float)  # null -> NaN
        np.testing.assert_allclose(written, values, atol=1e-6, equal_nan=True)
    assert [(entry["sender_layer"], entry["sender_head"], entry["receiver_layer"], entry["receiver_head"], entry["input"]) for entry in record["checked"]] == [
        (*edge.sender, edge.layer, edge.head, edge.input) for edge, _, _ in expected.checked
    ]
    np.testing.assert_allclose([entry["path_patched"] for entry in record["checked"]], [patched for _, _, patched in expected.checked], atol=1e-6)
    height, width = read_png(out / "edges.png").shape[:2]
    cap_width, cap_height = figure_max_px("edges.png")
    assert width <= cap_width and height <= cap_height
    assert "path patched" in printed and expected.name(expected.checked[0][0]).split(" -> ")[1] in printed


def test_smollm2s_top_edges_agree_with_path_patching_on_an_indirect_object_pair(smollm2_cached):
    """The issue's "done when": on SmolLM2 (9 heads over 3 key/value heads) and an indirect-object pair, the top edges
    by EAP have path patching's sign, the largest five within 0.05 of it."""
    from attnviz.analysis.edges import EdgeSettings
    from attnviz.analysis.patching import patch_heads
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec

    loaded = load_model("smollm2", device="cpu")  # the GGUF file, read as it is
    spec = RunSpec("smollm2", loaded.name, loaded.source, device="cpu")
    ioi = ("When Mary and John went to the store, John gave a drink to", "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")
    edges = patch_heads(loaded, *ioi, spec, edges=EdgeSettings()).edges
    assert edges.grouped and edges.scores["k"].shape == (30, 9, 30, 3)
    for edge, score, patched in edges.checked:
        assert np.sign(score) == np.sign(patched), (edges.name(edge), score, patched)
    for edge, score, patched in edges.checked[:5]:
        assert abs(score - patched) < 0.05, (edges.name(edge), score, patched)


def test_the_reports_edges_view_draws_the_top_edges_and_reads_out_both_numbers(decoder, tmp_path, opened):
    """report.html of `attnviz patch --edges` has an Edges view: the DRAWN largest edges as lines, the checked edges'
    table with both numbers, and a line's numbers read out as it is hovered."""
    import attnviz
    from attnviz.analysis.edges import DRAWN

    clean, corrupt, answer, wrong = TINY
    result = attnviz.patch(clean, corrupt=corrupt, answer=answer, wrong=wrong, model=str(decoder), device="cpu", edges=True, checked_edges=4)
    page = opened(result.report().save(tmp_path / "report")[0])
    page.page.click("#tab-edges")
    page.page.wait_for_selector("#edges-graph", state="attached")
    edges = result.edges
    assert page.page.eval_on_selector_all("#edges-graph line.edges-edge", "lines => lines.length") == min(DRAWN, len(edges.ranked()))
    signed = lambda value: f"{value:+.3f}"  # noqa: E731
    rows = page.page.eval_on_selector_all("#edges-table tbody tr", "rows => rows.map((row) => Array.from(row.cells, (cell) => cell.textContent))")
    expected = [[*edges.name(edge).split(" -> "), signed(score), signed(patched)] for edge, score, patched in edges.checked]
    assert rows == expected
    sender, receiver = expected[0][:2]
    page.page.dispatch_event(f"#edges-graph line.edges-edge[data-sender='{sender}'][data-receiver='{receiver}']", "mouseenter")
    assert page.texts("#edges-readout")[0] == f"{sender} → {receiver} · score {expected[0][2]} · path patched {expected[0][3]}"

"""attnviz.compose and `attnviz compose` (analysis/compositions.py): every Q-, K- and V-composition score against
Elhage et al.'s formula written out in NumPy float64 with the full D × D matrices, from transformers' own modules
(norms folded by hand), on a grouped-query Llama, a GPT-2 (fused Conv1D) and the bundled BERT (raw weights); the
baseline against its definition; compose.json, compose.png, the table and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from tiny_families import _DECODER, bpe_tokenizer, build_checkpoint, save_checkpoint

KINDS = ("q", "k", "v")


def drawn_norms(folder, model_class) -> None:
    """The checkpoint in folder with every LayerNorm / RMSNorm weight drawn in [0.5, 1.5], so folding them shows."""
    model = model_class.from_pretrained(folder)
    torch.manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1 and "bias" not in name:
                parameter.uniform_(0.5, 1.5)
    model.save_pretrained(folder)


def composition_formula(heads: list[dict]) -> dict[str, np.ndarray]:
    """Elhage et al.'s scores written out: heads[layer] = {"q", "k", "v": (H, D, d), "o": (H, d, D)} per query head
    (a grouped-query head's key/value head already picked); (L, H, L, H) per kind, NaN unless sender layer < receiver's."""
    num_layers, num_heads = len(heads), heads[0]["q"].shape[0]
    scores = {kind: np.full((num_layers, num_heads, num_layers, num_heads), np.nan) for kind in KINDS}
    frobenius = np.linalg.norm
    for l1 in range(num_layers):
        for s in range(num_heads):
            ov_s = heads[l1]["v"][s] @ heads[l1]["o"][s]  # (D, D)
            for l2 in range(l1 + 1, num_layers):
                for r in range(num_heads):
                    qk = heads[l2]["q"][r] @ heads[l2]["k"][r].T  # (D, D)
                    ov_r = heads[l2]["v"][r] @ heads[l2]["o"][r]
                    scores["q"][l1, s, l2, r] = frobenius(ov_s @ qk) / (frobenius(ov_s) * frobenius(qk))
                    scores["k"][l1, s, l2, r] = frobenius(ov_s @ qk.T) / (frobenius(ov_s) * frobenius(qk))
                    scores["v"][l1, s, l2, r] = frobenius(ov_s @ ov_r) / (frobenius(ov_s) * frobenius(ov_r))
    return scores


def split_heads(w_q, w_k, w_v, w_o, num_heads: int, num_kv_heads: int, norm=None) -> dict:
    """nn.Linear-layout weights (out, in), float64 NumPy, into per-head W_Q, W_K, W_V (D, d) with diag(norm) on their
    rows, and W_O (d, D)."""
    head_dim = w_q.shape[0] // num_heads
    scale = np.ones(w_q.shape[1]) if norm is None else norm
    group = num_heads // num_kv_heads
    pick = lambda weight, head: (weight[head * head_dim : (head + 1) * head_dim] * scale).T  # noqa: E731
    return {
        "q": np.stack([pick(w_q, h) for h in range(num_heads)]),
        "k": np.stack([pick(w_k, h // group) for h in range(num_heads)]),
        "v": np.stack([pick(w_v, h // group) for h in range(num_heads)]),
        "o": np.stack([w_o[:, h * head_dim : (h + 1) * head_dim].T for h in range(num_heads)]),
    }


def numpy64(tensor) -> np.ndarray:
    return tensor.detach().double().numpy()


def assert_scores_match(result, expected) -> None:
    for kind in KINDS:
        assert np.array_equal(np.isnan(result.scores[kind]), np.isnan(expected[kind])), kind
        found = ~np.isnan(expected[kind])
        np.testing.assert_allclose(result.scores[kind][found], expected[kind][found], rtol=1e-9, atol=0)
        assert expected[kind][found].std() > 1e-3  # heads differ: a head or layer slip would show


def test_grouped_query_llama_scores_are_the_formula_with_its_rms_norms_folded(tmp_path):
    """6 query heads over 2 key/value heads, 2 layers: W_K and W_V of the key/value head, input_layernorm folded."""
    import attnviz

    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **_DECODER)
    save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), tmp_path, seed=1)
    drawn_norms(tmp_path, transformers.LlamaForCausalLM)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    heads = []
    for block in model.model.layers:
        attention = block.self_attn
        heads.append(split_heads(*(numpy64(p.weight) for p in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)),
                                 config.num_attention_heads, config.num_key_value_heads, numpy64(block.input_layernorm.weight)))  # fmt: skip
    result = attnviz.compose(model=str(tmp_path), device="cpu")
    assert result.compositions.norms_folded and result.compositions.notes == ()
    assert_scores_match(result, composition_formula(heads))


def test_gpt2_scores_are_the_formula_from_its_fused_conv1d_with_ln_1_folded(tmp_path):
    """c_attn (D, 3D) and c_proj stored (in, out): transposed here by hand into nn.Linear's layout; ln_1's weight folded."""
    import attnviz

    build_checkpoint("gpt2", tmp_path)
    drawn_norms(tmp_path, transformers.GPT2Model)
    model = transformers.GPT2Model.from_pretrained(tmp_path).eval()
    hidden, num_heads = model.config.n_embd, model.config.n_head
    heads = []
    for block in model.h:
        fused = numpy64(block.attn.c_attn.weight)  # (D, 3D): in by out
        w_q, w_k, w_v = (fused[:, part * hidden : (part + 1) * hidden].T for part in range(3))
        heads.append(split_heads(w_q, w_k, w_v, numpy64(block.attn.c_proj.weight).T, num_heads, num_heads, numpy64(block.ln_1.weight)))
    result = attnviz.compose(model=str(tmp_path), device="cpu")
    assert result.compositions.norms_folded
    assert_scores_match(result, composition_formula(heads))


@pytest.mark.slow  # 72 heads' D × D products written out: about 10 s
def test_bundled_bert_scores_are_the_formula_on_its_raw_weights_and_say_so(reference_bert):
    """A post-norm BERT: no norm before attention to fold, the raw weights scored, and the notes say so."""
    import attnviz

    _, model = reference_bert
    heads = []
    for layer in model.encoder.layer:
        attention = layer.attention
        heads.append(split_heads(*(numpy64(p.weight) for p in (attention.self.query, attention.self.key, attention.self.value, attention.output.dense)),
                                 model.config.num_attention_heads, model.config.num_attention_heads))  # fmt: skip
    result = attnviz.compose(model="bundled", device="cpu")
    assert not result.compositions.norms_folded and "raw weights" in result.compositions.notes[0]
    assert_scores_match(result, composition_formula(heads))


def test_the_baseline_is_the_mean_score_of_gaussian_matrices_drawn_as_documented():
    """baseline(D, d, draws, seed): one generator; per draw, per kind, W_V (D, d), W_O (d, D), first (D, d), second
    (D, d); the score of W_V W_O against first second^T with the D × D matrices written out."""
    from attnviz.analysis.compositions import baseline

    model_dim, head_dim, draws = 24, 4, 5
    rng = np.random.default_rng(3)
    expected = dict.fromkeys(KINDS, 0.0)
    for _ in range(draws):
        for kind in KINDS:
            v, o = rng.standard_normal((model_dim, head_dim)), rng.standard_normal((head_dim, model_dim))
            first, second = rng.standard_normal((model_dim, head_dim)), rng.standard_normal((model_dim, head_dim))
            ov, receiver = v @ o, first @ second.T
            expected[kind] += np.linalg.norm(ov @ receiver) / (np.linalg.norm(ov) * np.linalg.norm(receiver)) / draws
    found = baseline(model_dim, head_dim, draws=draws, seed=3)
    for kind in KINDS:
        assert found[kind] == pytest.approx(expected[kind], rel=1e-9)
    assert len(set(found.values())) == 3  # each kind its own draws


def test_top_ranks_every_kinds_compositions_by_their_score_above_baseline():
    """top(n): the n largest score - baseline over all kinds and pairs, each row's numbers consistent."""
    from attnviz.analysis.compositions import Compositions

    rng = np.random.default_rng(0)
    scores = {kind: rng.uniform(size=(3, 2, 3, 2)) for kind in KINDS}
    for kind in KINDS:
        for sender in range(3):
            scores[kind][sender, :, : sender + 1] = np.nan
    found = Compositions(scores, {"q": 0.1, "k": 0.3, "v": 0.2}, 4, True)
    above = sorted((scores[kind][index] - found.baseline[kind] for kind in KINDS for index in np.ndindex(3, 2, 3, 2)
                    if not np.isnan(scores[kind][index])), reverse=True)  # fmt: skip
    top = found.top(5)
    assert [row["above"] for row in top] == pytest.approx(above[:5])
    for row in top:
        assert row["sender"][0] < row["receiver"][0]
        assert row["score"] == scores[row["kind"]][(*row["sender"], *row["receiver"])]
        assert row["above"] == pytest.approx(row["score"] - row["baseline"])
    strongest = found.strongest("k")
    assert strongest[0, 2] == pytest.approx(np.nanmax(scores["k"][0, :, 2, :]) - 0.3) and np.isnan(strongest[2, 0])


def test_the_command_writes_compose_json_and_png_and_prints_the_strongest(tmp_path, capsys):
    """`attnviz compose --model bundled --top 4`: the table's rows are the result's top 4, compose.json holds every
    score (null where no pair) and the same top, compose.png is a PNG; --top 0 and an unknown model: exit 2, one
    line, nothing written."""
    import attnviz
    from attnviz.cli import run

    out = tmp_path / "run"
    assert run(["compose", "--model", "bundled", "--device", "cpu", "--top", "4", "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the table's cells, its rules left out
    expected = attnviz.compose(model="bundled", device="cpu", top=4)
    for row in expected.top():
        sender, receiver = "L{}H{}".format(*row["sender"]), "L{}H{}".format(*row["receiver"])
        assert f"{row['kind'].upper()} {sender} {receiver} {row['score']:.3f} {row['baseline']:.3f} {row['above']:+.3f}" in printed
    assert "raw weights" in printed
    assert {path.name for path in out.iterdir() if not path.name.startswith(".")} == {"compose.json", "compose.png"}
    assert (out / "compose.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((out / "compose.json").read_text())
    assert record["format"] == "attnviz-compositions" and record["version"] == 1 and record["model"] == "all-MiniLM-L6-v2"
    assert record["baseline"] == pytest.approx(expected.baseline, rel=0) and record["baseline_draws"] == 48
    assert record["norms_folded"] is False and len(record["top"]) == 4
    for kind in KINDS:
        scores = np.array(record["scores"][kind], dtype=float)  # null -> NaN
        np.testing.assert_array_equal(scores, expected.scores[kind])
    assert record["scores"]["q"][3][0][1][0] is None and record["scores"]["q"][1][0][3][0] is not None
    assert [row["above"] for row in record["top"]] == [row["above"] for row in expected.top()]

    for args, says in ((["--top", "0"], "--top"), (["--model", str(tmp_path / "no-model")], "no-model")):
        target = tmp_path / "refused"
        assert run(["compose", *args, "--out", str(target)]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("error: ") and says in error and len(error.splitlines()) == 1, error
        assert not target.exists()


def test_the_api_refuses_bad_arguments_before_loading(monkeypatch):
    import attnviz
    import attnviz.models.loading

    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))
    for given, says in (({"top": 0}, "top 0"), ({"top": "5"}, "top"), ({"progress": 5}, "progress"), ({"layer": 2}, "takes no argument 'layer'")):
        with pytest.raises(attnviz.AttnvizError, match=says):
            attnviz.compose(model="bundled", device="cpu", **given)


@pytest.mark.slow  # SmolLM2's roles over a text and its 270 heads' compositions: about a minute
def test_smollm2_induction_heads_k_compose_with_its_previous_token_heads(smollm2_cached):
    """Olsson et al.'s induction circuit, read from the weights: of the 14 heads roles labels induction on the README's
    text, 11 have a head roles labels previous-token (4 of the 270: L1H2, L2H1, L11H1, L16H0) among their 5 strongest
    K-composition senders (measured; chance, 5 of some 150 earlier heads holding at most 4 such, is near 1 in 8), and
    layer 17's three induction heads' strongest sender is one (L16H0). Asserted: more than half, and layer 17's."""
    import attnviz

    roles = attnviz.roles("The cat sat on the mat. The cat sat on the mat.", model="smollm2", device="cpu")
    result = attnviz.compose(model="smollm2", device="cpu")
    labelled = lambda role: {(layer, head) for layer, row in enumerate(roles.labels) for head, names in enumerate(row) if role in names}  # noqa: E731
    induction, previous = labelled("induction"), labelled("previous-token")
    assert len(induction) >= 10 and previous
    heads = result.scores["k"].shape[1]
    found = {}
    for layer, head in induction:
        senders = np.nan_to_num(result.scores["k"][:, :, layer, head], nan=-1.0)  # (L, H): NaN from this layer on
        strongest = [divmod(int(index), heads) for index in np.argsort(-senders, axis=None)[:5]]
        found[(layer, head)] = strongest
    with_previous = [receiver for receiver, senders in found.items() if previous & set(senders)]
    assert len(with_previous) > len(induction) / 2, found
    for receiver, senders in found.items():
        if receiver[0] == 17:
            assert senders[0] in previous, (receiver, senders)


def test_the_result_counts_its_sender_layers_saves_its_files_and_shows_itself(tmp_path):
    """progress: told the stage and its 6 sender layers, advanced by 6 in all; .save writes compose.png and
    compose.json; the notebook's HTML has the figure, each top row and the note; .top(n) takes another n."""
    import attnviz

    told, done = [], []

    class Counter:
        def __call__(self, n):
            done.append(n)

        def stage(self, what, total):
            told.append((what, total))

    result = attnviz.compose(model="bundled", device="cpu", top=3, progress=Counter())
    assert told == [("sender layers of compositions", 6)] and sum(done) == 6
    assert len(result.top()) == 3 and len(result.top(7)) == 7 and result.top(7)[:3] == result.top()
    written = result.save(tmp_path / "saved")
    assert sorted(path.name for path in written) == ["compose.json", "compose.png"]
    assert json.loads((tmp_path / "saved" / "compose.json").read_text())["top"] == result.to_dict()["top"]
    page = result._repr_html_()
    assert page.count("<img") == 1 and "raw weights" in page
    for row in result.top():
        assert "L{}H{}".format(*row["sender"]) in page and f"{row['above']:+.3f}" in page
    assert repr(result) == "<attnviz.ComposeResult all-MiniLM-L6-v2: Q, K, V compositions of 72 heads>"

"""attnviz.roles and `attnviz roles` (analysis/roles.py, analysis/circuits.py): every score against an independent
computation on transformers' eager maps (TransformerLens's formulas written out in NumPy here), the copying score
against torch.linalg.eigvals of the full V × V circuit, a Llama built by hand whose one head attends to the
previous token, roles.json, the figure and the terminal."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from tiny_families import BPE_VOCAB, _DECODER, bpe_tokenizer, save_checkpoint

pytestmark = pytest.mark.slow  # checkpoints built and loaded by transformers

TEXT = "The cat sat on the mat. The cat sat on the mat because it was tired, the cat."
CONFIG = dict(_DECODER, max_position_embeddings=256)  # Olsson et al.'s sequences are 101 tokens


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A Llama (6 query heads over 2 key/value heads, RoPE, RMSNorm) with its own lm_head, and transformers' eager model."""
    folder = tmp_path_factory.mktemp("roles-llama")
    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **CONFIG)
    save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), folder, seed=2)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return folder, model


def eager_maps(model, ids) -> np.ndarray:
    """(L, H, N, N) float64: transformers' eager attention maps of one sequence of ids."""
    with torch.no_grad():
        attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    return np.stack([layer[0].double().numpy() for layer in attentions])


def templates(ids) -> dict[str, np.ndarray]:
    """TransformerLens's three detection patterns (N, N), written out from its head_detector.py's definitions."""
    ids = np.asarray(ids)
    n = len(ids)
    previous = np.zeros((n, n))
    previous[1:, :-1] = np.eye(n - 1)
    duplicate = (ids[:, None] == ids[None, :]).astype(float)
    np.fill_diagonal(duplicate, 0)
    duplicate = np.tril(duplicate)
    induction = np.zeros((n, n))
    induction[:, 1:] = duplicate[:, :-1]  # shifted one key right, column 0 zero
    return {"previous_token": np.tril(previous), "duplicate_token": duplicate, "induction": np.tril(induction)}


def transformer_lens_score(A, pattern, exclude_bos, exclude_current) -> np.ndarray:
    """(H,): compute_head_attention_similarity_score's 'mul' measure for each head's map A (H, N, N)."""
    A = A.copy()
    if exclude_bos:
        A[:, :, 0] = 0
    if exclude_current:
        A[:, np.arange(A.shape[1]), np.arange(A.shape[1])] = 0
    return (A * pattern).sum((1, 2)) / A.sum((1, 2))


@pytest.mark.parametrize(("exclude_bos", "exclude_current"), [(False, False), (True, True)])
def test_text_scores_equal_their_definitions_on_transformers_eager_maps(llama, exclude_bos, exclude_current):
    import attnviz

    folder, model = llama
    sinks, recent = 2, 5  # small, so that a 22-token text leaves keys out of the streaming share
    result = attnviz.roles(TEXT, model=str(folder), device="cpu", exclude_bos=exclude_bos, exclude_current=exclude_current,
                           sinks=sinks, recent=recent)  # fmt: skip
    ids = result.roles.ids
    maps = eager_maps(model, ids)  # (L, H, N, N)
    patterns = templates(ids)
    assert patterns["induction"].sum() > 3 and patterns["duplicate_token"].sum() > 3  # the text repeats itself
    queries, keys = np.indices(maps.shape[2:])
    kept = (keys < sinks) | ((keys <= queries) & (keys > queries - recent))
    for layer, A in enumerate(maps):
        for name, pattern in patterns.items():
            expected = transformer_lens_score(A, pattern, exclude_bos, exclude_current)
            np.testing.assert_allclose(result.scores[name][layer], expected, atol=1e-5, err_msg=f"{name} layer {layer}")
        np.testing.assert_allclose(result.scores["streaming"][layer], (A * kept).sum(-1).mean(-1), atol=1e-5)
        largest = -np.sort(-A, axis=-1)  # (H, N, N): each row's weights, largest first
        for k in (16, 64, 256):
            np.testing.assert_allclose(result.scores[f"top_{k}"][layer], largest[..., :k].sum(-1).mean(-1), atol=1e-5)
        np.testing.assert_allclose(result.roles.summaries.values["sink"][layer], A[:, :, 0].mean(-1), atol=1e-5)
    assert result.scores["top_16"].min() < 1 - 1e-5  # a 22-token text: 16 keys leave some weight out


def test_prefix_matching_equals_olssons_recipe_on_transformers_eager_maps(llama):
    import attnviz
    from attnviz.analysis.circuits import PATTERN, REPEATS, SEQUENCES

    folder, model = llama
    result = attnviz.roles(TEXT, model=str(folder), device="cpu")
    sequences = result.roles.random_ids
    assert len(sequences) == SEQUENCES and all(len(ids) == 1 + PATTERN * REPEATS for ids in sequences)
    assert all(ids[0] == 0 and len(set(ids[1:])) == PATTERN for ids in sequences)  # <s>, then 25 distinct tokens
    assert all(ids[1 : 1 + PATTERN] * REPEATS == ids[1:] for ids in sequences)
    specials = {0, 1, 2, 3}
    assert not specials & {index for ids in sequences for index in ids[1:]}
    expected = 0
    for ids in sequences:
        maps = eager_maps(model, ids)  # (L, H, N, N)
        repeated = [i for i in range(len(ids)) if ids[i] in ids[:i]]
        per_query = np.stack([sum(maps[:, :, i, j + 1] for j in range(i) if ids[j] == ids[i]) for i in repeated])  # (Q, L, H)
        assert len(repeated) == PATTERN * (REPEATS - 1)
        expected = expected + per_query.mean(0) / len(sequences)
    np.testing.assert_allclose(result.scores["prefix_matching"], expected, atol=1e-5)


def test_copying_is_the_full_ov_circuits_eigenvalues(llama):
    """Σ Re λ / Σ |λ| over torch.linalg.eigvals of each head's V × V circuit (W_U diag(g_final)) W_O^h W_V^kv diag(g_1) W_E^T,
    from transformers' own modules, equals the score computed in its d_head × d_head form; the 6 heads read 2 W_V."""
    import attnviz

    folder, model = llama
    result = attnviz.roles(TEXT, model=str(folder), device="cpu")
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // config.num_key_value_heads
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight.double()  # (V, D)
        unembedding = model.lm_head.weight.double() * model.model.norm.weight.double()  # (V, D)
        expected = np.zeros((config.num_hidden_layers, config.num_attention_heads))
        for layer, block in enumerate(model.model.layers):
            values = block.self_attn.v_proj.weight.double() * block.input_layernorm.weight.double()  # (H_kv d, D)
            outputs = block.self_attn.o_proj.weight.double()  # (D, H d)
            for head in range(config.num_attention_heads):
                kv = head // group
                circuit = (unembedding @ outputs[:, head * head_dim : (head + 1) * head_dim]
                           @ values[kv * head_dim : (kv + 1) * head_dim] @ embedding.T)  # (V, V)  # fmt: skip
                assert circuit.shape == (BPE_VOCAB, BPE_VOCAB)
                eigenvalues = torch.linalg.eigvals(circuit)
                expected[layer, head] = float(eigenvalues.real.sum() / eigenvalues.abs().sum())
    np.testing.assert_allclose(result.scores["copying"], expected, atol=1e-6)
    assert expected.min() < 0 < expected.max()  # random heads both ways: a sign or transpose slip would show


def previous_token_llama(folder, num_heads: int = 4, scale: float = 30.0):
    """A one-layer Llama whose head 0 attends to the previous token, built by hand: W_q = W_k = 0 and constant q, k
    biases, k's each RoPE pair turned by that pair's angle θ_f, so that q_i · k_j = scale² Σ_f cos((i - j - 1) θ_f),
    largest at j = i - 1; the other heads' q, k are 0 (a uniform row over the keys each query sees)."""
    config = transformers.LlamaConfig(
        vocab_size=BPE_VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        intermediate_size=64, max_position_embeddings=256, attention_bias=True, tie_word_embeddings=False,
    )  # fmt: skip
    model = save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), folder, seed=3)
    head_dim = config.hidden_size // num_heads
    pairs = head_dim // 2
    angles = model.model.rotary_emb.inv_freq.double()  # (d/2,): θ_f, RoPE's frequencies
    assert len(angles) == pairs
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        for projection in (attention.q_proj, attention.k_proj):
            projection.weight.zero_()
            projection.bias.zero_()
        # transformers' RoPE pairs feature f with f + d/2: q = (1, 0) and k = (cos θ_f, sin θ_f) in each pair
        attention.q_proj.bias[:pairs] = scale
        attention.k_proj.bias[:pairs] = (scale * torch.cos(angles)).float()
        attention.k_proj.bias[pairs:head_dim] = (scale * torch.sin(angles)).float()
    model.save_pretrained(folder)
    return model


def test_a_llama_built_to_attend_to_the_previous_token_scores_about_1_there_and_alone(tmp_path):
    import attnviz

    model = previous_token_llama(tmp_path)
    result = attnviz.roles(TEXT, model=str(tmp_path), device="cpu")
    maps = eager_maps(model, result.roles.ids)
    assert (np.diagonal(maps[0, 0], offset=-1) > 0.99).all()  # the built head does what it was built to
    previous = result.scores["previous_token"][0]
    assert previous[0] > 0.9 and (previous[1:] < 0.3).all()
    assert [("previous-token" in names) for names in result.labels[0]] == [True, False, False, False]


def test_roles_json_holds_every_score_the_ids_and_the_settings_and_the_command_prints_the_grid(llama, tmp_path, capsys):
    from attnviz.analysis.roles import ROLES
    from attnviz.cli import run

    folder, model = llama
    out = tmp_path / "run"
    assert run(["roles", TEXT, "--model", str(folder), "--out", str(out), "--sinks", "2", "--recent", "5", "--exclude-bos"]) == 0
    record = json.loads((out / "roles.json").read_text(encoding="utf-8"))
    assert record["format"] == "attnviz-roles" and record["sinks"] == 2 and record["window"] == 5
    assert record["exclude_bos"] is True and record["exclude_current"] is False
    names = ["previous_token", "duplicate_token", "induction", "streaming", "top_16", "top_64", "top_256", "prefix_matching", "copying"]
    assert list(record["scores"]) == names and set(record["definitions"]) == set(names)
    assert all(np.array(record["scores"][name]).shape == (2, 6) for name in names)
    assert set(record["thresholds"]) == {role.name for role in ROLES} and record["thresholds"]["retrieval"]["above"] == 0.1
    assert len(record["random_ids"]) == 10 and not set(record["skipped"]) & set(names)  # every score computed
    # 22 causal tokens: a uniform head's shares are over half the local, sink and streaming thresholds (S 2, W 5)
    assert set(record["skipped"]) == {"local role", "sink role", "streaming role"} and set(record["uniform"]) == {"local", "sink", "streaming"}
    # From roles.json's own ids, an independent computation gives its scores (TransformerLens's, written out above).
    maps = eager_maps(model, record["ids"])
    for layer, A in enumerate(maps):
        for name, pattern in templates(record["ids"]).items():
            expected = transformer_lens_score(A, pattern, True, False)
            np.testing.assert_allclose(record["scores"][name][layer], expected, atol=1e-4)
    assert {path.name for path in out.iterdir() if not path.name.startswith(".")} == {"roles.json", "roles.png", "report.html"}
    printed = " ".join(capsys.readouterr().out.split())
    assert "roles by layer and head" in printed and "top heads by role" in printed and "prefix_matching > 0.3" in printed


def test_a_model_without_a_language_model_head_is_said_and_its_other_scores_computed(tmp_path, capsys):
    from attnviz.cli import run

    config = transformers.LlamaConfig(num_key_value_heads=2, **CONFIG)  # LlamaModel: no lm_head, not tied
    save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), tmp_path / "base", seed=1)
    out = tmp_path / "run"
    assert run(["roles", TEXT, "--model", str(tmp_path / "base"), "--out", str(out)]) == 0
    record = json.loads((out / "roles.json").read_text(encoding="utf-8"))
    assert "copying" not in record["scores"] and "language-model head" in record["skipped"]["copying"]
    assert {"previous_token", "prefix_matching", "top_256"} <= set(record["scores"])
    assert "copying: left out" in " ".join(capsys.readouterr().out.split())


def test_a_text_of_one_token_is_refused_in_one_line(tmp_path, capsys):
    from attnviz.cli import run

    config = transformers.LlamaConfig(num_key_value_heads=2, **CONFIG)
    save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=False), tmp_path / "nobos", seed=1)
    out = tmp_path / "run"
    assert run(["roles", "a", "--model", str(tmp_path / "nobos"), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "give at least two" in error and "Traceback" not in error and len(error.strip().splitlines()) == 1
    assert not out.exists()


def test_at_4096_tokens_the_blocks_give_the_whole_maps_scores(tmp_path):
    """A text of 4,096 tokens in blocks of a few rows (memory 8 MB) against the scores of transformers' whole maps."""
    import attnviz

    config = transformers.LlamaConfig(vocab_size=BPE_VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=32, max_position_embeddings=4096)  # fmt: skip
    model = save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), tmp_path, seed=4)
    text = " ".join(["The cat sat on the mat because it was tired.", "Attention is all you need, they said."] * 400)
    result = attnviz.roles(text, model=str(tmp_path), device="cpu", memory=8, truncate=True)  # its first 4,096 tokens
    assert len(result.roles.ids) == 4096 and result.roles.summaries.rows_per_block < 4096
    A = eager_maps(model, result.roles.ids)[0]  # (H, N, N)
    queries, keys = np.indices(A.shape[1:])
    kept = (keys < 4) | ((keys <= queries) & (keys > queries - 256))
    patterns = templates(result.roles.ids)
    for name, pattern in patterns.items():
        np.testing.assert_allclose(result.scores[name][0], transformer_lens_score(A, pattern, False, False), atol=1e-5, err_msg=name)
    np.testing.assert_allclose(result.scores["streaming"][0], (A * kept).sum(-1).mean(-1), atol=1e-5)
    largest = -np.sort(-A, axis=-1)
    for k in (16, 64, 256):
        np.testing.assert_allclose(result.scores[f"top_{k}"][0], largest[..., :k].sum(-1).mean(-1), atol=1e-5)


def test_the_reports_roles_view_colours_each_head_and_a_click_opens_its_map_and_scores(tmp_path, opened):
    """report.html of `attnviz roles` opens on the Roles view: the built previous-token head's cell reads out its role,
    and a click on it shows its map (its first row all on the first token, in the report's colours) and its scores."""
    import attnviz

    previous_token_llama(tmp_path / "model")
    result = attnviz.roles(TEXT, model=str(tmp_path / "model"), device="cpu")
    path = result.report().save(tmp_path / "report")[0]
    page = opened(path)
    page.page.wait_for_selector("#view-roles .roles-grid", state="attached")
    assert page.page.get_attribute("#tab-roles", "aria-selected") == "true"
    cell = "#view-roles .roles-grid rect[data-layer='0'][data-head='0']"
    page.page.hover(cell)
    assert page.texts("#roles-readout")[0].startswith("layer 0 · head 0 · previous-token")
    colour = page.page.get_attribute(cell, "fill")
    assert colour != page.page.get_attribute("#view-roles .roles-grid rect[data-layer='0'][data-head='1']", "fill")
    page.page.click(cell)
    page.page.wait_for_selector("#roles-head canvas.roles-map", state="attached")
    score = page.page.text_content("#roles-head tr[data-score='previous_token'] td:nth-child(2)")
    assert score == f"{result.scores['previous_token'][0, 0]:.4f}"
    pixel = page.page.evaluate(
        "(() => { const c = document.querySelector('#roles-head canvas.roles-map'); "
        "return Array.from(c.getContext('2d').getImageData(0, 0, 1, 1).data.slice(0, 3)); })()"
    )
    assert pixel == page.page.evaluate("window.AV.colour(1, false)")  # query 0 sees key 0 alone
    # the legend names the roles a head could have here, each letter spelled: those whose score was computed (no
    # retrieval: not asked for), but local, sink and streaming (22 tokens: a uniform head's shares are over half
    # their thresholds), each with its threshold
    from attnviz.analysis.roles import ROLES, role_key
    from attnviz.render.role_figures import legend_label

    computed = {*result.scores, "sink", "local"}  # the role scores, and the two summaries that are roles
    told = [role for role in ROLES if role.score in computed and role_key(role.name) not in result.roles.skipped]
    assert "retrieval" not in computed and "streaming" in computed
    assert [role.name for role in told] == ["induction", "duplicate-token", "previous-token", "copying"]
    assert page.texts("#view-roles .roles-legend li") == [*[legend_label(role) for role in told], "grey: none"]
    # the head's map names its tokens along the top and down the left, every step-th where its cells are narrower
    # than a label's 14px line, as the caption says
    tokens = page.page.evaluate("window.AV.current().shown_query_tokens")
    width = page.page.evaluate("document.querySelector('#roles-head canvas.roles-map').width")
    step = -(-14 // (width // len(tokens)))  # the cells are whole pixels here: 23 tokens in 260px
    assert width % len(tokens) == 0 and step == 2
    assert page.texts("#roles-head .key-labels span") == tokens[::step] == page.texts("#roles-head .query-labels span")
    assert page.texts("#roles-head figcaption")[0].endswith(f"one token label every {step}")
    # the report's title is the run's: every layer × head, not the layer 0 its maps open on
    title = page.texts("h1.report-title")[0]
    assert "1 layer × 4 heads, every head's roles" in title and "layer 0" not in title


def test_heads_names_each_heads_roles_in_its_titles_and_its_table_when_given_them(tmp_path):
    import attnviz
    from attnviz.render.terminal import heads_table

    previous_token_llama(tmp_path)
    roles = attnviz.roles(TEXT, model=str(tmp_path), device="cpu")
    plain = attnviz.heads(TEXT, model=str(tmp_path), device="cpu")
    result = plain.with_roles(roles)
    title = result.figure(0).axes[0].get_title()
    assert "roles: previous-token" in title and "roles:" not in plain.figure(0).axes[0].get_title()
    titles = [ax.get_title() for ax in result.figure().axes if ax.get_title().startswith("head")]
    assert titles == [f"head {head} · " + (", ".join(names) or "none") for head, names in enumerate(roles.labels[0])]
    table = heads_table(result.run, result.summaries)
    assert [column.header for column in table.columns][4] == "roles"
    assert list(table.columns[4].cells) == [", ".join(names) or "none" for names in roles.labels[0]]
    assert "roles" not in [column.header for column in heads_table(plain.run, plain.summaries).columns]


def test_a_focused_cell_of_a_12_layer_grid_keeps_every_layer_label_whole(tmp_path, opened):
    """The Roles view's grid of a 12-layer Llama, a cell of layer 10 focused with the keyboard and opened: every row
    label ("layer 10", "layer 11") lies inside the grid's own box, none cut at its left edge."""
    import attnviz

    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **{**CONFIG, "num_hidden_layers": 12})
    save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), tmp_path / "model", seed=5)
    result = attnviz.roles(TEXT, model=str(tmp_path / "model"), device="cpu")
    page = opened(result.report().save(tmp_path / "report")[0])
    page.page.wait_for_selector("#view-roles .roles-grid", state="attached")
    page.page.focus("#view-roles .roles-grid")
    for _ in range(10):
        page.page.keyboard.press("ArrowDown")
    page.page.keyboard.press("Enter")
    page.page.wait_for_selector("#roles-head[data-layer='10'] canvas.roles-map", state="attached")
    boxes = page.page.eval_on_selector_all(
        "#view-roles .roles-grid text",
        "texts => texts.filter(t => t.textContent.startsWith('layer')).map(t => [t.textContent, t.getBBox().x])",
    )
    assert [name for name, _ in boxes] == [f"layer {layer}" for layer in range(12)]
    assert min(left for _, left in boxes) >= 0, boxes


def test_an_encoders_streaming_skip_states_its_own_uniform_share_not_1():
    """The bundled BERT (its queries see every key): on a short sentence a uniform head's streaming share is below 1
    and skipped says that share (written out here from a uniform map), where roles.json's own shares stay below 1;
    with 1 sink and a window of 2 on the same sentence the share can tell, and streaming is not skipped."""
    import attnviz
    from attnviz.analysis.roles import STREAMING_ROLE

    text = "The cat sat on the mat because it was tired, and the dog slept by the door."
    result = attnviz.roles(text, model="bundled", device="cpu")
    ids = result.roles.ids
    queries, keys = np.indices((len(ids), len(ids)))
    kept = (keys < 4) | ((keys <= queries) & (keys > queries - 256))
    uniform = float((kept / len(ids)).sum(-1).mean())  # each row 1 / N on every key
    why = result.roles.skipped[STREAMING_ROLE]
    assert uniform < 0.9 and f"scores {uniform:.2f} on these {len(ids)} tokens" in why and "is 1" not in why
    assert result.roles.uniform["streaming"] == pytest.approx(uniform, abs=1e-12)
    assert result.scores["streaming"].min() < 0.9  # the heads' own shares are not all 1 either
    narrow = attnviz.roles(text, model="bundled", device="cpu", sinks=1, recent=2)
    assert STREAMING_ROLE not in narrow.roles.skipped and narrow.roles.uniform["streaming"] < 0.45


def test_smollm2_on_the_readmes_text_labels_its_induction_heads_and_not_every_head_local_or_sink():
    """The README's `roles` command on SmolLM2 (14 tokens): no head is labelled local, sink or streaming (a uniform
    head's shares there are over half their thresholds), the heads whose prefix matching passes 0.3 are labelled
    induction (L18H6 the strongest), and copying marks its heads above 0.9, fewer than half the model's; on 150
    tokens of the same sentences the local and sink roles tell heads apart: some heads get each, not all."""
    import attnviz

    result = attnviz.roles("The cat sat on the mat. The cat sat on the mat.", model="smollm2", device="cpu")
    labels = result.labels
    every = [names for row in labels for names in row]
    assert len(every) == 270 and len(result.roles.ids) == 14
    assert not any({"local", "sink", "streaming"} & set(names) for names in every)
    assert {"local role", "sink role", "streaming role"} <= set(result.roles.skipped)
    induction = {(layer, head) for layer in range(30) for head in range(9) if "induction" in labels[layer][head]}
    assert induction == set(zip(*np.nonzero(result.scores["prefix_matching"] > 0.3))) and (18, 6) in induction
    assert len(induction) >= 10
    copying = sum("copying" in names for names in every)
    assert copying == int((result.scores["copying"] > 0.9).sum()) and 0 < copying < 135
    longer = attnviz.roles(" ".join(["The cat sat on the mat because it was tired."] * 15), model="smollm2", device="cpu")
    assert len(longer.roles.ids) >= 131 and "local role" not in longer.roles.skipped and "sink role" not in longer.roles.skipped
    for role in ("local", "sink"):
        count = sum(role in names for row in longer.labels for names in row)
        assert 0 < count < 270, (role, count)

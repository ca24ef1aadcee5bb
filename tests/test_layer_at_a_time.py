"""A checkpoint read a layer's weights at a time (models/layer_weights.py) runs every command as the whole model does.

The checkpoint: a tiny grouped-query Llama (6 query heads on 2 key/value heads, 3 layers, its output head tied to its
embeddings, as Llama-3.2-1B's) stored in bfloat16. The reference: the very same values stored in float32 (each weight
a bfloat16 number), loaded whole by transformers' from_pretrained, as every checkpoint under 1 GB is. A layer at a
time reads the bfloat16 file as stored and computes in float32, so every number a command gives equals the
reference's within 1e-5. Then: only the running layer's weights are on the device, the mode is taken by default past
the threshold (lowered here, not a 1 GB model built), and a missing or truncated shard is refused in one line.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
import transformers

import attnviz
import attnviz.models.layer_weights as layer_weights
from attnviz.cli import run
from tiny_families import _DECODER, _ENCODER, FAMILY_CHECKPOINTS, WORDPIECE_VOCAB, bpe_tokenizer, build_checkpoint, save_checkpoint, wordpiece_tokenizer

TEXT = "The cat sat on the mat because it was tired. The cat sat"
PATCHED = ("The cat sat on the mat", "The mat sat on the cat", " mat", " cat")  # clean, corrupt, answer, wrong
TOLERANCE = 1e-5


def tiny_llama(folder, dtype, tied=True, model_class=transformers.LlamaModel):
    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=tied, **{**_DECODER, "num_hidden_layers": 3})
    save_checkpoint(config, model_class, bpe_tokenizer(bos=True), folder, seed=3, dtype=dtype)
    return str(folder)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(a layer at a time on the bfloat16 file, whole on the float32 file of the same values), both on the CPU."""
    folder = tmp_path_factory.mktemp("layer-at-a-time")
    stored = tiny_llama(folder / "bf16" / "llama", torch.bfloat16)  # one name in the titles, which show the folder's
    reference = folder / "f32" / "llama"
    transformers.LlamaModel.from_pretrained(stored, dtype=torch.float32).save_pretrained(reference)
    bpe_tokenizer(bos=True).save_pretrained(reference)
    lat = attnviz.load(stored, "cpu", layer_at_a_time=True, cache=False)
    whole = attnviz.load(str(reference), "cpu", cache=False)
    assert lat.model.layer_at_a_time and not whole.model.layer_at_a_time
    return lat, whole


def differences(actual, expected, names: tuple[str, str], path="") -> float:
    """The largest difference between two results' dicts (to_dict's), their notes left out; anything but a number equal,
    the one model's name (names[0]) read as the other's (names[1])."""
    if isinstance(expected, dict):
        assert set(actual) == set(expected), (path, set(actual) ^ set(expected))
        return max([differences(actual[key], expected[key], names, f"{path}.{key}") for key in expected if key != "notes"], default=0.0)
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        return max([differences(a, e, names, f"{path}[{index}]") for index, (a, e) in enumerate(zip(actual, expected))], default=0.0)
    if isinstance(expected, np.ndarray):
        return float(np.abs(np.asarray(actual, dtype=float) - expected.astype(float)).max(initial=0.0))
    if isinstance(expected, float) and not isinstance(actual, bool):
        return 0.0 if np.isnan(actual) and np.isnan(expected) else abs(actual - expected)
    if isinstance(expected, str):
        actual = actual.replace(*names)
    assert actual == expected, (path, actual, expected)
    return 0.0


def compared(command: str, lat, whole) -> float:
    """The largest difference between a command's results on the two handles (differences)."""
    actual, expected = COMMANDS[command](lat), COMMANDS[command](whole)
    if command == "report":  # the page's record (its maps encoded as text: equal, not within a tolerance)
        return differences(actual.record, expected.record, (lat.loaded.name, whole.loaded.name))
    return differences(actual.to_dict(), expected.to_dict(), (lat.loaded.name, whole.loaded.name))


COMMANDS = {
    "heads": lambda model: attnviz.heads(TEXT, model=model, layer=1),
    "layers": lambda model: attnviz.layers(TEXT, model=model),
    "stats": lambda model: attnviz.stats([TEXT, "Attention is all you need"], model=model),
    "roles": lambda model: attnviz.roles(TEXT, model=model),
    "patch": lambda model: attnviz.patch(PATCHED[0], model=model, corrupt=PATCHED[1], answer=PATCHED[2], wrong=PATCHED[3]),
    "patch edges": lambda model: attnviz.patch(PATCHED[0], model=model, corrupt=PATCHED[1], answer=PATCHED[2], wrong=PATCHED[3], edges=True, ig=2),
    "generate": lambda model: attnviz.generate("The cat sat", model=model, tokens=4),
    "why": lambda model: attnviz.why(TEXT, model=model, layer=2, head=4, query=9),
    "compose": lambda model: attnviz.compose(model=model),
    "effect": lambda model: attnviz.heads(TEXT, model=model, layer=1, effect="mean"),
    "diff": lambda model: attnviz.diff(TEXT, model=model, against="random"),
    "report": lambda model: attnviz.report(TEXT, model=model),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_a_layer_at_a_time_equals_the_whole_models_run(pair, command):
    assert compared(command, *pair) <= TOLERANCE


def test_every_head_of_every_layer_and_its_map_equal_the_whole_models(pair):
    lat, whole = pair
    actual, expected = attnviz.layers(TEXT, model=lat), attnviz.layers(TEXT, model=whole)
    assert len(actual.layer_runs) == 3
    for mine, theirs in zip(actual.layer_runs, expected.layer_runs):
        assert mine.attention.shape == (6, 16, 16)
        np.testing.assert_allclose(mine.attention, theirs.attention, rtol=0, atol=TOLERANCE)
    assert differences(vars(actual.summaries), vars(expected.summaries), (lat.loaded.name, whole.loaded.name)) <= TOLERANCE
    assert any("a layer's weights at a time (as asked)" in note for note in actual.layer_runs[0].notes)
    assert not any("at a time" in note for note in expected.layer_runs[0].notes)


def test_only_the_running_layers_weights_are_on_the_device(pair):
    """In each layer's attention (its forward under way), that layer's weights are there and no other's; after the
    pass, none. The embedding table is the file's memory map, as stored."""
    lat, _ = pair
    layers = lat.model.model.layers
    seen = []

    def record(module, args, kwargs):
        seen.append([not any(parameter.is_meta for parameter in layer.parameters()) for layer in layers])

    handles = [layer.self_attn.register_forward_pre_hook(record, with_kwargs=True) for layer in layers]
    try:
        attnviz.heads(TEXT, model=lat, layer=2)
    finally:
        for handle in handles:
            handle.remove()
    assert seen == [[True, False, False], [False, True, False], [False, False, True]]
    assert all(parameter.is_meta for layer in layers for parameter in layer.parameters())
    table = lat.model.get_input_embeddings().weight
    assert table.dtype == torch.bfloat16 and table.shape == (400, 48)


@pytest.fixture(scope="module")
def kept(pair):
    """The bfloat16 file loaded a layer at a time with budgets that place two of its three layers, as on two GPUs: room
    for two and a half layers on the device that computes (the CPU here; on a GPU, a share of its free memory), short
    of the three, so one kept and room for a layer read as it runs; room for 1.2 layers on "cpu:0" (another GPU's
    name there), which holds one. The third is read from the file as it runs."""
    lat, whole = pair
    layer_bytes = 4 * sum(parameter.numel() for parameter in whole.model.model.layers[0].parameters())  # float32
    budgets, layer_weights.gpu_budgets = layer_weights.gpu_budgets, lambda device: {device: 5 * layer_bytes // 2, "cpu:0": 6 * layer_bytes // 5}
    try:
        return attnviz.load(str(lat.model.folder), "cpu", layer_at_a_time=True, cache=False)
    finally:
        layer_weights.gpu_budgets = budgets


def test_layer_places_fills_the_devices_in_order_keeping_room_for_a_layer_on_the_first(pair):
    """accelerate's device map over the three layers: the first device keeps room for the largest layer, so 2.5 layers'
    bytes hold one and 2 hold one; on another device with no such room, 2 hold two; the one over is read as it runs."""
    lat, _ = pair
    layer_bytes = 4 * sum(parameter.numel() for parameter in lat.model.model.layers[0].parameters())
    names = lat.model.layer_names()
    places = lambda *shares: layer_weights.layer_places(lat.model.model, names, {f"cuda:{i}": int(share * layer_bytes) for i, share in enumerate(shares)})  # noqa: E731
    assert places(2.5) == {"layers.0": "cuda:0"}
    assert places(1.9) == {}
    assert places(2.0, 2.0) == {"layers.0": "cuda:0", "layers.1": "cuda:1", "layers.2": "cuda:1"}
    assert places(0.5, 1.2, 1.2) == {"layers.0": "cuda:1", "layers.1": "cuda:2"}
    assert places(5.0, 5.0) == dict.fromkeys(names, "cuda:0")
    assert layer_weights.layer_places(lat.model.model, names, {}) == {}


@pytest.mark.parametrize("command", ["heads", "layers", "roles", "patch", "patch edges", "generate", "effect", "report"])
def test_with_layers_kept_and_held_each_command_equals_the_whole_models_run(pair, kept, command):
    assert compared(command, kept, pair[1]) <= TOLERANCE


def test_the_layers_kept_stay_on_the_device_the_held_are_copied_from_their_device_and_the_others_read_as_each_runs(kept):
    """accelerate's device map keeps layer 0 (read once, there before and after every pass) and holds layer 1 on
    "cpu:0" (read once: its weights in its forward are those held, not the file's); layer 2 is read from the file as
    it runs; layers 1 and 2 are on the device in their own forward alone. The run's notes say so."""
    layers = kept.model.model.layers
    assert kept.model.layer_places == {"layers.0": "cpu", "layers.1": "cpu:0"}
    held = kept.model.weights_map.maps[0]  # the held layer's weights laid over the file's
    assert set(held) == {f"layers.1.{name}" for name, _ in layers[1].named_parameters()}
    seen, from_held = [], []

    def record(module, args, kwargs):
        seen.append([not any(parameter.is_meta for parameter in layer.parameters()) for layer in layers])
        if layers[1].self_attn is module:  # on the CPU the held tensor itself is set in: the very storage
            from_held.append(module.q_proj.weight.data_ptr() == held["layers.1.self_attn.q_proj.weight"].data_ptr())

    handles = [layer.self_attn.register_forward_pre_hook(record, with_kwargs=True) for layer in layers]
    try:
        result = attnviz.heads(TEXT, model=kept, layer=2)
    finally:
        for handle in handles:
            handle.remove()
    assert seen == [[True, False, False], [True, True, False], [True, False, True]]
    assert from_held and all(from_held)
    assert [any(parameter.is_meta for parameter in layer.parameters()) for layer in layers] == [False, True, True]
    assert all(tensor.device == torch.device("cpu") for tensor in held.values())
    note = next(note for note in result.run.notes if "kept on" in note)
    assert "1 of its 3 layers kept on cpu, read once; held, read once and copied to cpu as each runs: 1 on cpu:0 (" in note


def test_the_edges_differentiated_pass_keeps_no_other_layers_weights_alive(pair):
    """patch --edges a layer at a time: whenever a layer's W_q runs (the texts' passes, the differentiated pass, then its
    backward pass running each layer again, path patching), the weights every other layer read before are gone: the
    autograd graph holds none of them (without recomputing, it would hold them all)."""
    lat, _ = pair
    read, alive = [], []  # (layer, with autograd on, its W_q's weights) of each call; the other layers' seen alive

    def record(layer: int):
        def hook(module, args):
            alive.extend(earlier for earlier, _, weight in read if earlier != layer and weight() is not None)
            read.append((layer, torch.is_grad_enabled(), weakref.ref(module.weight)))

        return hook

    projections = [layer.self_attn.q_proj for layer in lat.model.model.layers]
    handles = [projection.register_forward_pre_hook(record(layer)) for layer, projection in enumerate(projections)]
    try:
        edges = attnviz.patch(PATCHED[0], model=lat, corrupt=PATCHED[1], answer=PATCHED[2], wrong=PATCHED[3], edges=True).edges
    finally:
        for handle in handles:
            handle.remove()
    assert edges.checked and alive == []
    assert [layer for layer, differentiated, _ in read if differentiated] == [0, 1, 2, 2, 1, 0]  # the pass, then backward


def test_the_mlps_run_by_chunks_of_positions_equal_the_whole_models(pair, monkeypatch):
    """With chunks of 3 positions (MLP_CHUNK_BYTES lowered: the tiny Llama's MLP is 112 wide, float32), each MLP runs
    over 16 tokens in 6 calls, and every map and summary still equals the whole model's."""
    lat, whole = pair
    width = max(max(parameter.shape) for parameter in lat.model.model.layers[0].mlp.parameters())
    monkeypatch.setattr(layer_weights, "MLP_CHUNK_BYTES", 3 * width * 4)
    calls = []
    handles = [layer.mlp.down_proj.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[1])) for layer in lat.model.model.layers]
    try:
        actual = attnviz.layers(TEXT, model=lat)
    finally:
        for handle in handles:
            handle.remove()
    assert len(calls) >= 12 and calls == [3, 3, 3, 3, 3, 1] * (len(calls) // 6)  # the pass stops at the last layer's attention
    expected = attnviz.layers(TEXT, model=whole)
    for mine, theirs in zip(actual.layer_runs, expected.layer_runs):
        np.testing.assert_allclose(mine.attention, theirs.attention, rtol=0, atol=TOLERANCE)
    assert differences(vars(actual.summaries), vars(expected.summaries), (lat.loaded.name, whole.loaded.name)) <= TOLERANCE


def test_bfloat16_computed_in_bfloat16_a_layer_at_a_time_equals_the_whole_model_in_it(pair):
    lat, whole = pair
    stored, reference = lat.loaded.folder, whole.loaded.folder
    half = attnviz.load(str(stored), "cpu", dtype="bfloat16", layer_at_a_time=True, cache=False)
    whole_half = attnviz.load(str(reference), "cpu", dtype="bfloat16", cache=False)
    actual, expected = attnviz.layers(TEXT, model=half), attnviz.layers(TEXT, model=whole_half)
    for mine, theirs in zip(actual.layer_runs, expected.layer_runs):
        np.testing.assert_array_equal(mine.attention, theirs.attention)  # the same operations on the same bfloat16 numbers


def largest_scores(folder) -> list[np.ndarray]:
    """Per layer, each head's largest possible score max_i |q_i| max_j |k_j| / sqrt(d) (H,), from transformers' Llama
    run whole in float32 over TEXT: the norms of q_proj's and k_proj's outputs per head (RoPE turns them, not their norms)."""
    model = transformers.LlamaModel.from_pretrained(folder, dtype=torch.float32).eval()
    config = model.config
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    norms = {}

    def keep(name, count):
        return lambda module, args, output: norms.__setitem__(name, output[0].view(-1, count, head_dim).norm(dim=-1).amax(dim=0))  # (count,)

    handles = []
    for index, layer in enumerate(model.layers):
        handles.append(layer.self_attn.q_proj.register_forward_hook(keep(("q", index), heads)))
        handles.append(layer.self_attn.k_proj.register_forward_hook(keep(("k", index), config.num_key_value_heads)))
    ids = transformers.AutoTokenizer.from_pretrained(folder)(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        model(ids)
    group = heads // config.num_key_value_heads
    return [(norms["q", index] * norms["k", index].repeat_interleave(group) * head_dim**-0.5).numpy() for index in range(len(model.layers))]


@pytest.mark.parametrize("dtype, unit", [("bfloat16", 2**-8), ("float16", 2**-11)])
def test_half_precision_maps_are_within_the_dtypes_rounding_of_the_float32_runs(pair, dtype, unit):
    """The bfloat16 checkpoint computed a layer at a time in bfloat16 (float16) against the same run in float32: each
    head's weights within (l + 1) u S of float32's at layer l (0-based), u the dtype's unit roundoff (2^-8, 2^-11), S
    the head's largest possible score in float32 (largest_scores). Why: a softmax's weights move by at most half the
    largest change of their row's scores; a score q.k/sqrt(d) moves by at most S (e_q + e_k) where q and k are within
    e of float32's, relatively; and the stream entering layer l has been rounded by l layers before it (its roundings,
    of either sign, adding up to about u a layer). The bound is far below what other weights give (every map differs
    by 1 somewhere) and far above float32's own rounding, which the maps must pass too: computed in float32 (the dtype
    ignored), they would not differ at all."""
    lat, whole = pair
    half = attnviz.load(str(lat.loaded.folder), "cpu", dtype=dtype, layer_at_a_time=True, cache=False)
    assert half.model.layer_at_a_time and half.dtype == dtype
    actual, expected = attnviz.layers(TEXT, model=half), attnviz.layers(TEXT, model=lat)
    scores = largest_scores(whole.loaded.folder)
    for layer, (mine, theirs) in enumerate(zip(actual.layer_runs, expected.layer_runs)):
        difference = np.abs(mine.attention.astype(float) - theirs.attention.astype(float)).max(axis=(1, 2))  # (H,)
        bound = (layer + 1) * unit * scores[layer]
        assert (difference <= bound).all(), (layer, difference, bound)
        assert difference.max() > 1e-4, (layer, difference)  # rounded in the dtype: not float32's numbers
    bound = f"computed in {dtype}, each head's weights at layer l (from 0) lie within (l + 1) x 2^-{8 if dtype == 'bfloat16' else 11} x"
    assert any(bound in note for note in actual.layer_runs[0].notes)


def test_an_untied_output_head_is_read_from_the_file(tmp_path):
    stored = tiny_llama(tmp_path / "bf16", torch.bfloat16, tied=False, model_class=transformers.LlamaForCausalLM)
    reference = tmp_path / "f32"
    transformers.LlamaForCausalLM.from_pretrained(stored, dtype=torch.float32).save_pretrained(reference)
    bpe_tokenizer(bos=True).save_pretrained(reference)
    lat, whole = attnviz.load(stored, "cpu", layer_at_a_time=True, cache=False), attnviz.load(str(reference), "cpu", cache=False)
    weight, bias = lat.model.output_head()
    assert weight.dtype == torch.bfloat16 and weight.shape == (400, 48) and bias is None  # as stored, memory-mapped
    for command in ("generate", "patch"):
        assert compared(command, lat, whole) <= TOLERANCE, command


@pytest.mark.parametrize("model_type", ["gpt2", "qwen3", "roberta", "albert", "t5", "bart"])
def test_each_familys_maps_a_layer_at_a_time_equal_the_whole_models(model_type, tmp_path):
    build_checkpoint(model_type, tmp_path)
    options = {"stack": "decoder"} if FAMILY_CHECKPOINTS[model_type]()[1].__name__ in ("T5Model", "BartModel") else {}
    lat = attnviz.load(str(tmp_path), "cpu", layer_at_a_time=True, cache=False)
    whole = attnviz.load(str(tmp_path), "cpu", cache=False)
    actual, expected = attnviz.layers("The cat sat on the mat", model=lat, **options), attnviz.layers("The cat sat on the mat", model=whole, **options)
    for mine, theirs in zip(actual.layer_runs, expected.layer_runs):
        np.testing.assert_allclose(mine.attention, theirs.attention, rtol=0, atol=TOLERANCE)


def test_a_masked_lm_checkpoint_without_the_base_models_pooler_runs_a_layer_at_a_time(tmp_path):
    """RobertaForMaskedLM saves no pooler, which the RobertaModel attnviz builds holds (unused): every other tensor is
    read all the same, and the maps equal the whole model's (the pooler once kept the whole load from happening)."""
    config = transformers.RobertaConfig(vocab_size=WORDPIECE_VOCAB, pad_token_id=0, **{**_ENCODER, "num_hidden_layers": 2})
    save_checkpoint(config, transformers.RobertaForMaskedLM, wordpiece_tokenizer(), tmp_path, seed=5)
    lat = attnviz.load(str(tmp_path), "cpu", layer_at_a_time=True, cache=False)
    whole = attnviz.load(str(tmp_path), "cpu", cache=False)
    assert lat.model.layer_at_a_time and not any(parameter.is_meta for parameter in lat.model.model.embeddings.parameters())
    actual, expected = attnviz.layers("the cat sat on the mat", model=lat), attnviz.layers("the cat sat on the mat", model=whole)
    for mine, theirs in zip(actual.layer_runs, expected.layer_runs, strict=True):
        np.testing.assert_allclose(mine.attention, theirs.attention, rtol=0, atol=TOLERANCE)


def test_a_checkpoint_past_the_threshold_runs_a_layer_at_a_time_by_default(pair, monkeypatch):
    lat, whole = pair
    stored = str(lat.loaded.folder)
    parameters = sum(parameter.numel() for parameter in transformers.LlamaModel.from_pretrained(stored).parameters())
    size = layer_weights.weights_bytes(lat.loaded.folder, torch.float32)
    assert size == 4 * parameters  # from the headers alone: every weight in float32
    monkeypatch.setattr(layer_weights, "LAYER_AT_A_TIME_BYTES", size)
    assert not attnviz.load(stored, "cpu", cache=False).model.layer_at_a_time  # at the threshold: whole
    monkeypatch.setattr(layer_weights, "LAYER_AT_A_TIME_BYTES", size - 1)
    past = attnviz.load(stored, "cpu", cache=False)
    assert past.model.layer_at_a_time
    assert past.loaded.note.startswith(f"{stored} ran a layer's weights at a time (its weights are 0.0 GB in float32, past 0.0 GB)")
    assert compared("layers", past, whole) <= TOLERANCE


@pytest.fixture
def sharded(tmp_path):
    """The tiny Llama in bfloat16, in shards of its tensors (model.safetensors.index.json names them)."""
    folder = tmp_path / "sharded"
    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True, **{**_DECODER, "num_hidden_layers": 3})
    model = transformers.LlamaModel(config).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="20KB")
    bpe_tokenizer(bos=True).save_pretrained(folder)
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2
    return folder, shards


@pytest.mark.parametrize("damage", ["missing", "truncated"])
@pytest.mark.parametrize("asked", [True, False])
def test_a_missing_or_truncated_shard_is_refused_in_one_line_before_any_layer_runs(sharded, damage, asked, tmp_path, capsys, monkeypatch):
    folder, shards = sharded
    if damage == "missing":
        shards[1].unlink()
    else:
        shards[1].write_bytes(shards[1].read_bytes()[:-100])
    monkeypatch.setattr(layer_weights, "LAYER_AT_A_TIME_BYTES", 0 if not asked else layer_weights.LAYER_AT_A_TIME_BYTES)
    monkeypatch.setattr(layer_weights, "load_layer_at_a_time", lambda *args, **kwargs: pytest.fail("a layer was read"))
    flag = ["--layer-at-a-time"] if asked else []
    assert run(["heads", "hi", "--model", str(folder), *flag, "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: cannot load model {str(folder)!r}: ") and error.count("\n") == 1, error
    assert shards[1].name in error
    assert not (tmp_path / "run").exists()


CLI_COMMANDS = {
    "patch": ["patch", PATCHED[0], "--corrupt", PATCHED[1], "--answer", PATCHED[2], "--wrong", PATCHED[3], "--edges"],
    "roles": ["roles", TEXT],
    "generate": ["generate", "The cat sat", "--tokens", "2"],
    "diff": ["diff", TEXT, "--against", "random"],
}


@pytest.mark.parametrize("command", CLI_COMMANDS)
def test_every_command_line_says_the_model_ran_a_layer_at_a_time(pair, command, tmp_path, capsys):
    """The note the model's load makes (heads prints it among its run's notes): patch, roles, generate and diff too."""
    lat, _ = pair
    args = [*CLI_COMMANDS[command], "--model", str(lat.loaded.folder), "--layer-at-a-time", "--device", "cpu", "--out", str(tmp_path / "run")]
    assert run(args) == 0
    error = " ".join(capsys.readouterr().err.split())  # the console wraps it
    assert error.count("ran a layer's weights at a time (as asked)") == 1, error


def test_serve_loads_a_layer_at_a_time_and_answers_as_the_whole_model(pair):
    """attnviz serve --layer-at-a-time: Explorer.load's handle reads a layer at a time, and POST /api/heads answers the
    whole model's map (to the 4 decimals the page reads)."""
    import http.client
    import json

    from helpers import serving

    from attnviz.serve.explorer import Explorer, ServeSettings

    lat, whole = pair
    (handle,) = Explorer.load([str(lat.loaded.folder)], ServeSettings(), "cpu", "auto", layer_at_a_time=True).handles.values()
    assert handle.model.layer_at_a_time
    with serving({"llama": handle}) as server:
        connection = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
        body = json.dumps({"model": "llama", "text": "The cat sat on the mat", "layer": 2})
        connection.request("POST", "/api/heads", body=body, headers={"Authorization": f"Bearer {server.token}"})
        response = connection.getresponse()
        record = json.loads(response.read())
        connection.close()
    assert response.status == 200, record
    expected = attnviz.heads("The cat sat on the mat", model=whole, layer=2).attention.numpy()
    np.testing.assert_allclose(np.array(record["attention"]), expected, atol=5e-5 + 1e-9, rtol=0)


def test_berts_own_encoder_loads_whole_and_says_so():
    handle = attnviz.load("bundled", "cpu", layer_at_a_time=True, cache=False)
    assert handle.loaded.note == "all-MiniLM-L6-v2 loaded whole, not a layer at a time: attnviz reads a BERT checkpoint itself, whole (a small one)"



def test_ray_actors_load_a_layer_at_a_time_where_this_process_does(pair):
    """`--engine ray`'s actors load the model themselves (output/ray_engine.py): with the options this process loaded
    it with, so a model read a layer at a time here is read so by every actor (built here as Ray would build it)."""
    from attnviz.api.options import RunOptions
    from attnviz.output.ray_engine import StatsShardWorker, actor_loading

    lat, whole = pair
    for handle in (lat, whole):
        spec = RunOptions(device="cpu").run_spec(handle, layer=None)
        loading = actor_loading(handle.loaded, allow_pickle=False)
        worker = StatsShardWorker(spec.resolved_model, spec, loading, threads=1)
        assert worker.measurer.loaded.model.layer_at_a_time == handle.model.layer_at_a_time

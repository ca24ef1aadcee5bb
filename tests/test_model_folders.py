"""Broken and hostile model folders, made from the bundled model, through the command line.

Every one is refused with exit code 2 and one line that names the problem, before any work
and with nothing written; none runs code, reads a file outside the folder, or builds a model
that the checkpoint cannot fill. Folders hard-link one copy of the bundled weights (a test
that changes weights writes a new file, never into a link).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import attnviz.models.bert_encoder
from attnviz.cli import run
from attnviz.errors import AttnvizError
from attnviz.models.loading import bundled_model_path, load_model
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec

SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
QUERY_2 = "encoder.layer.2.attention.self.query.weight"
TEXT = "I want to eat"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """One copy of the bundled model.safetensors for the folders to hard-link."""
    copy = tmp_path_factory.mktemp("weights") / "model.safetensors"
    shutil.copyfile(bundled_model_path() / "model.safetensors", copy)
    return copy


@pytest.fixture(scope="module")
def tensors():
    return load_file(bundled_model_path() / "model.safetensors")


def model_folder(folder, weights=None, **config_changes):
    """The bundled model's config (with changes) and tokenizer in `folder`, and its weights linked in if given."""
    folder.mkdir(parents=True)
    for name in SMALL_FILES:
        shutil.copyfile(bundled_model_path() / name, folder / name)
    if config_changes:
        edit_json(folder / "config.json", lambda config: config.update(config_changes))
    if weights is not None:
        link(weights, folder / "model.safetensors")
    return folder


def edit_json(path, change):
    value = json.loads(path.read_text(encoding="utf-8"))
    change(value)
    path.write_text(json.dumps(value), encoding="utf-8")


def link(source, target):
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed
        shutil.copyfile(source, target)


def changed(tensors, **replacements):
    """The bundled tensors with some replaced (by their checkpoint key, dots written as __)."""
    return {**tensors, **{key.replace("__", "."): value for key, value in replacements.items()}}


def refused(args, tmp_path, capsys) -> str:
    """Run attnviz ARGS --out tmp_path/out; assert exit 2, one error line, no traceback, nothing written; the line."""
    out = tmp_path / "out"
    code = run([*args, "--out", str(out)])
    error = capsys.readouterr().err
    assert code == 2, error
    assert error.startswith("error: ") and error.count("\n") == 1 and "Traceback" not in error, error
    assert not out.exists()
    return error


# ---- 27: shards are safetensors inside the folder -------------------------------------------------


def sharded_folder(folder, tensors, shard_names: dict[str, str]) -> Path:
    """A folder whose model.safetensors.index.json maps the embeddings to shard_names["embeddings"] and the layers to ["layers"]."""
    model_folder(folder)
    weight_map = {key: shard_names["layers" if key.startswith("encoder.") else "embeddings"] for key in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def split(tensors):
    embeddings = {key: value for key, value in tensors.items() if not key.startswith("encoder.")}
    layers = {key: value for key, value in tensors.items() if key.startswith("encoder.")}
    return embeddings, layers


def test_safetensors_shards_inside_the_folder_load_the_bundled_weights(tmp_path, tensors, bundled_bert):
    folder = sharded_folder(tmp_path / "model", tensors, {"embeddings": "a.safetensors", "layers": "sub/b.safetensors"})
    embeddings, layers = split(tensors)
    save_file(embeddings, folder / "a.safetensors")
    (folder / "sub").mkdir()
    save_file(layers, folder / "sub" / "b.safetensors")

    state = load_model(str(folder)).model.state_dict()
    for name, tensor in bundled_bert.model.state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_a_pickle_shard_named_by_a_safetensors_index_is_never_unpickled_without_allow_pickle(tmp_path, tensors, capsys):
    folder = sharded_folder(tmp_path / "model", tensors, {"embeddings": "a.safetensors", "layers": "b.bin"})
    save_file(split(tensors)[0], folder / "a.safetensors")
    marker = tmp_path / "code-ran"

    class RunsCode:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (folder / "b.bin").write_bytes(pickle.dumps(RunsCode(), protocol=2))
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "model.safetensors.index.json names the shard 'b.bin', a pickle file that can run code" in error
    assert not marker.exists()

    error = refused(["heads", TEXT, "--model", str(folder), "--allow-pickle"], tmp_path, capsys)
    assert "cannot read b.bin" in error  # torch.load(weights_only=True) refuses to run it
    assert not marker.exists()


def test_a_folder_whose_only_weights_are_a_pickle_file_is_refused_without_allow_pickle(tmp_path, tensors, capsys):
    folder = model_folder(tmp_path / "model")
    torch.save(tensors, folder / "pytorch_model.bin")
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert error == (
        f"error: cannot load model {str(folder)!r}: its only weights are pytorch_model.bin, a pickle file that can run "
        "code when loaded; convert it to safetensors, or allow pickle files if you trust it\n"
    )


def test_with_allow_pickle_a_pickle_shard_loads_its_tensors(tmp_path, tensors, bundled_bert):
    folder = sharded_folder(tmp_path / "model", tensors, {"embeddings": "a.safetensors", "layers": "b.bin"})
    embeddings, layers = split(tensors)
    save_file(embeddings, folder / "a.safetensors")
    torch.save(layers, folder / "b.bin")

    state = load_model(str(folder), allow_pickle=True).model.state_dict()
    assert torch.equal(state[QUERY_2], bundled_bert.model.state_dict()[QUERY_2])


@pytest.mark.parametrize("where", ["parent", "absolute", "link", "etc"])
@pytest.mark.parametrize("allow_pickle", [False, True], ids=["", "allow-pickle"])
def test_a_shard_outside_the_folder_is_never_opened(where, allow_pickle, tmp_path, tensors, capsys):
    """Shards that would load (real safetensors files) but lie outside the folder, by name or by a link."""
    embeddings, layers = split(tensors)
    outside = tmp_path / "elsewhere" / "b.safetensors"
    outside.parent.mkdir()
    save_file(layers, outside)
    names = {"parent": "../elsewhere/b.safetensors", "absolute": str(outside), "link": "b.safetensors", "etc": "/etc/passwd"}
    folder = sharded_folder(tmp_path / "model", tensors, {"embeddings": "a.safetensors", "layers": names[where]})
    save_file(embeddings, folder / "a.safetensors")
    if where == "link":
        (folder / "b.safetensors").symlink_to(outside)

    error = refused(["heads", TEXT, "--model", str(folder)] + ["--allow-pickle"] * allow_pickle, tmp_path, capsys)
    if where == "link":
        assert f"b.safetensors leads outside the model folder (to {outside})" in error
    else:
        assert f"names the shard {names[where]!r}, which is not a file inside the model folder" in error


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ({"weight_map": {"x": "gone.safetensors"}}, "the weight file gone.safetensors is missing"),
        ({"weight_map": ["a.safetensors"]}, "has no weight_map from tensor names to shard files"),
        ([1, 2], "has no weight_map"),
    ],
    ids=["missing shard", "weight_map a list", "index a list"],
)
def test_a_broken_index_is_named(index, message, tmp_path, capsys):
    folder = model_folder(tmp_path / "model")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert message in refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)


def test_hub_cache_folders_may_link_their_weights_into_its_blobs(tmp_path, weights, bundled_bert):
    """The hub cache's own layout (snapshots/<commit>/model.safetensors -> ../../blobs/<hash>) and folders linked into it."""
    repo = tmp_path / "hub" / "models--org--bert"
    (repo / "blobs").mkdir(parents=True)
    link(weights, repo / "blobs" / "0123abcd")
    snapshot = model_folder(repo / "snapshots" / "c0ffee")
    (snapshot / "model.safetensors").symlink_to("../../blobs/0123abcd")
    local_dir = model_folder(tmp_path / "local-dir")  # as `hf download --local-dir` made them in older versions
    (local_dir / "model.safetensors").symlink_to(repo / "blobs" / "0123abcd")

    for folder in (snapshot, local_dir):
        assert torch.equal(load_model(str(folder)).model.state_dict()[QUERY_2], bundled_bert.model.state_dict()[QUERY_2])


def test_weights_linked_from_anywhere_else_are_refused(tmp_path, weights, capsys):
    folder = model_folder(tmp_path / "model")
    (folder / "model.safetensors").symlink_to(weights)
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert f"model.safetensors leads outside the model folder (to {weights})" in error


# ---- 28: every size is checked against the checkpoint before anything is built --------------------


@pytest.fixture
def no_layer_is_built(monkeypatch):
    """Fails a test that builds any BERT layer; a guard stops a runaway build after a few hundred."""
    built = []
    original = attnviz.models.bert_encoder.BertLayer.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        if len(built) > 200:
            raise RuntimeError("guard: more than 200 layers built")
        original(self, *args, **kwargs)

    monkeypatch.setattr(attnviz.models.bert_encoder.BertLayer, "__init__", counted)
    yield
    assert not built, f"{len(built)} BERT layers were built"


def test_a_million_layers_over_a_six_layer_checkpoint_fails_before_building_any(tmp_path, weights, capsys, no_layer_is_built):
    folder = model_folder(tmp_path / "model", weights, num_hidden_layers=1_000_000)
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "config.json says num_hidden_layers 1000000, but the checkpoint holds 6 layers" in error


def test_a_header_that_names_empty_layers_does_not_pass_for_them(tmp_path, tensors, capsys, no_layer_is_built):
    """A safetensors header can name a thousand layers without holding their data: each must be full size."""
    folder = model_folder(tmp_path / "model", num_hidden_layers=1000)
    empty = {f"encoder.layer.{layer}.attention.self.query.weight": torch.zeros(0) for layer in range(6, 1000)}
    save_file({**tensors, **empty}, folder / "model.safetensors")
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "the checkpoint's encoder.layer.6.attention.self.query.weight has shape (0), where config.json implies (384, 384)" in error


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vocab_size": 40000}, "config.json says vocab_size 40000, but the checkpoint's embeddings.word_embeddings.weight has 30522"),
        ({"hidden_size": 768}, "config.json says hidden_size 768, but the checkpoint's embeddings.word_embeddings.weight has 384"),
        ({"hidden_size": None}, "config.json has no hidden_size, so it is BERT's default 768, but"),
        ({"intermediate_size": 3072}, "intermediate_size 3072, but the checkpoint's encoder.layer.0.intermediate.dense.weight has 1536"),
        ({"max_position_embeddings": 10**30}, "max_position_embeddings 1000000000000000000000000000000, but"),
        ({"type_vocab_size": 1}, "type_vocab_size 1, but the checkpoint's embeddings.token_type_embeddings.weight has 2"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_a_config_size_that_the_tensors_do_not_have_is_named(changes, message, tmp_path, weights, capsys, no_layer_is_built):
    folder = model_folder(tmp_path / "model", weights, **{key: value for key, value in changes.items() if value is not None})
    for key in (key for key, value in changes.items() if value is None):
        edit_json(folder / "config.json", lambda config: config.pop(key))
    assert message in refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)


# ---- 30: a malformed config.json ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[1, 2]", "config.json holds a list, not an object"),
        ('"bert"', "config.json holds a string, not an object"),
        ({"hidden_size": "384"}, "config.json: hidden_size must be a positive whole number, not '384'"),
        ({"num_hidden_layers": 0}, "config.json: num_hidden_layers must be at least 1, not 0"),
        ({"num_hidden_layers": 6.0}, "config.json: num_hidden_layers must be a positive whole number, not 6.0"),
        ({"num_attention_heads": True}, "config.json: num_attention_heads must be a positive whole number, not True"),
        ({"num_attention_heads": 5}, "config.json: num_attention_heads 5 does not divide hidden_size 384"),
        ({"layer_norm_eps": "x"}, "config.json: layer_norm_eps must be a number, not 'x'"),
        ({"hidden_act": ["gelu"]}, "config.json: hidden_act must be a string, not ['gelu']"),
    ],
    ids=["list", "string", "number as text", "0 layers", "float layers", "bool heads", "5 heads", "eps text", "act list"],
)
@pytest.mark.parametrize("command", ["heads", "stats"])
def test_a_malformed_config_is_named(config, message, command, tmp_path, weights, capsys, no_layer_is_built):
    folder = model_folder(tmp_path / "model", weights, **(config if isinstance(config, dict) else {}))
    if isinstance(config, str):
        (folder / "config.json").write_text(config)
    assert message in refused([command, TEXT, "--model", str(folder)], tmp_path, capsys)


# ---- 30: the tokenizer and the weights' files ----------------------------------------------------


def test_a_vocabulary_larger_than_the_embedding_table_is_refused(tmp_path, tensors, capsys):
    folder = model_folder(tmp_path / "model", vocab_size=1000)
    table = tensors["embeddings.word_embeddings.weight"][:1000].clone()
    save_file(changed(tensors, embeddings__word_embeddings__weight=table), folder / "model.safetensors")
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "the tokenizer has 30522 tokens, more than the 1000 rows of the model's embedding table" in error


def test_a_token_id_past_the_embedding_table_is_refused(tmp_path, weights, capsys):
    """A vocabulary with a gap in its numbering: small enough, but one id indexes past the table."""
    folder = model_folder(tmp_path / "model", weights)
    edit_json(folder / "tokenizer.json", lambda tokenizer: tokenizer["model"]["vocab"].update(eat=99999))
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "the tokenizer gives 'eat' the id 99999, past the 30522 rows of the model's embedding table" in error


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("tokenizer.json", "{not json", "unreadable tokenizer.json (key must be a string"),
        ("tokenizer.json", "{}", "unreadable tokenizer.json"),
        ("tokenizer_config.json", "[]", "tokenizer_config.json holds no object of settings"),
        ("special_tokens_map.json", "{", "unreadable special_tokens_map.json"),
    ],
    ids=["tokenizer.json not json", "tokenizer.json empty", "settings a list", "special tokens not json"],
)
def test_a_broken_tokenizer_file_is_named(file, content, message, tmp_path, weights, capsys):
    folder = model_folder(tmp_path / "model", weights)
    (folder / file).write_text(content)
    assert message in refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)


def test_truncated_weights_and_no_weights_are_named(tmp_path, capsys):
    folder = model_folder(tmp_path / "model")
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert f"no weights (model.safetensors) in {folder}" in error

    with open(bundled_model_path() / "model.safetensors", "rb") as file:
        (folder / "model.safetensors").write_bytes(file.read(1_000_000))
    error = refused(["heads", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "model.safetensors is damaged or not safetensors (Error while deserializing header" in error


# ---- 30: NaN or infinity in the weights ------------------------------------------------------------


@pytest.fixture(scope="module")
def nan_in_layer_2(tmp_path_factory, tensors):
    query = tensors[QUERY_2].clone()
    query[3, 4] = float("nan")
    folder = model_folder(tmp_path_factory.mktemp("nan") / "model")
    save_file(changed(tensors, **{QUERY_2.replace(".", "__"): query}), folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("args", [["stats"], ["layers"], ["heads", "--layer", "2"], ["heads", "--layer", "4"]])
def test_nan_in_the_weights_a_run_uses_is_named(args, nan_in_layer_2, tmp_path, capsys):
    error = refused([args[0], TEXT, "--model", str(nan_in_layer_2), *args[1:]], tmp_path, capsys)
    assert f"the model's {QUERY_2} holds 1 NaN or infinite value: its checkpoint is damaged" in error


def test_nan_in_weights_a_run_never_uses_leaves_its_numbers_right(nan_in_layer_2, bundled_bert):
    """Layer 1's attention is computed from the embeddings and layers 0 and 1 alone: the same as the bundled model's."""
    damaged = load_model(str(nan_in_layer_2))
    (ours,) = run_attention(damaged, [TEXT], run_spec(damaged, layer=1))
    (bundled,) = run_attention(bundled_bert, [TEXT], run_spec(bundled_bert, layer=1))
    np.testing.assert_array_equal(ours.attention, bundled.attention)


@pytest.mark.parametrize("command", ["heads", "position"])
def test_infinity_in_an_embedding_row_that_the_text_uses_is_named(command, tmp_path, tensors, capsys):
    table = tensors["embeddings.word_embeddings.weight"].clone()
    table[2000, 4] = float("inf")  # 2000 is "to"
    folder = model_folder(tmp_path / "model")
    save_file(changed(tensors, embeddings__word_embeddings__weight=table), folder / "model.safetensors")
    error = refused([command, TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "the model's embeddings.word_embeddings.weight holds 1 NaN or infinite value" in error


def test_finite_weights_that_overflow_are_named_as_such(tmp_path, tensors, capsys):
    dense = tensors["encoder.layer.0.output.dense.weight"]
    dense = dense * (1e38 / dense.abs().max())  # every value finite, the largest 1e38: their products are not
    assert torch.isfinite(dense).all()
    folder = model_folder(tmp_path / "model")
    save_file(changed(tensors, encoder__layer__0__output__dense__weight=dense), folder / "model.safetensors")
    error = refused(["stats", TEXT, "--model", str(folder)], tmp_path, capsys)
    assert "NaN or infinity in the output of layer 0, though the weights that made it are finite: they overflow" in error


# ---- 30: HF_HUB_CACHE pointing at a file ----------------------------------------------------------


@pytest.fixture
def hub_cache(monkeypatch):
    """Sets the hub cache for one test, as HF_HUB_CACHE would (the hub library reads it once, at import)."""
    import huggingface_hub.constants

    # Imported before the patch: the hub library loads its modules lazily, and some copy the setting then.
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache  # noqa: F401

    return lambda path: monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(path))


@pytest.mark.parametrize("args", [["models"], ["heads", TEXT, "--model", "org/bert"], ["heads", TEXT]])
def test_a_hub_cache_that_is_a_file_is_named(args, tmp_path, capsys, hub_cache):
    cache = tmp_path / "hub-cache"
    cache.write_text("not a folder")
    hub_cache(cache)
    code = run(args)
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1
    assert error == f"error: the hub cache {cache} is a file: point HF_HUB_CACHE (or HF_HOME) at a folder, or unset it\n"


def test_a_hub_cache_under_a_file_is_named(tmp_path, hub_cache):
    (tmp_path / "home").write_text("not a folder")
    hub_cache(tmp_path / "home" / "hub")
    with pytest.raises(AttnvizError, match=f"the hub cache .* lies under a file, {tmp_path / 'home'}:"):
        load_model("org/bert")

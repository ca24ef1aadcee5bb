"""Loading the families beyond BERT safely, and what attnviz's layer does with their heads.

Safetensors only, no code from the folder ever run, damaged weights named, --truncate that keeps
a decoder's first tokens, and --heads that keeps grouped-query attention's groups whole,
checked against transformers' own attention module built with the re-split head counts.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from attnviz.errors import AttnvizError
from attnviz.models.loading import load_model
from attnviz.layer_inputs import layer_states, encode_texts
from attnviz.pipeline import run_attention
from attnviz.spec import run_spec
from tiny_families import build_checkpoint

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama") / "tiny-llama"
    return folder, build_checkpoint("llama", folder)


def test_pickle_weights_of_another_family_are_refused_even_when_allowed(tmp_path):
    folder = tmp_path / "gpt2"
    model = build_checkpoint("gpt2", folder)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")

    with pytest.raises(AttnvizError) as refused:
        load_model(str(folder), allow_pickle=True)
    assert str(refused.value) == (
        f"cannot load model {str(folder)!r}: its only weights are pytorch_model.bin, a pickle file; "
        "attnviz loads GPT-2 from safetensors only: convert it to model.safetensors"
    )


def copy_of(source, folder):
    """A copy of a checkpoint folder, to change without touching the module's."""
    shutil.copytree(source, folder)
    return folder


def test_no_code_from_the_model_folder_is_run(tmp_path, llama):
    folder = copy_of(llama[0], tmp_path / "with-code")
    marker = tmp_path / "code-ran"
    code = f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n"
    for module in ("modeling_evil.py", "tokenization_evil.py", "configuration_evil.py"):
        (folder / module).write_text(code)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.Evil", "AutoModel": "modeling_evil.Evil"}
    (folder / "config.json").write_text(json.dumps(config))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.Evil"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))

    try:
        loaded = load_model(str(folder))
    except AttnvizError:
        loaded = None  # refusing the folder is fine too; running its code is not
    assert not marker.exists()
    if loaded is not None:
        assert run_attention(loaded, [TEXT], run_spec(loaded, str(folder)))[0].attention.shape[0] == 6


@pytest.mark.parametrize("where", ["parent", "link"])
def test_a_shard_of_another_family_outside_the_folder_is_refused_before_the_model_is_built(where, tmp_path, llama, monkeypatch):
    """A Llama's index naming a shard outside its folder, by name or by a link: refused before transformers reads any."""
    from attnviz.models import transformers_loading

    folder = copy_of(llama[0], tmp_path / "model")
    outside = tmp_path / "elsewhere" / "b.safetensors"
    outside.parent.mkdir()
    (folder / "model.safetensors").rename(outside)
    name = {"parent": "../elsewhere/b.safetensors", "link": "b.safetensors"}[where]
    if where == "link":
        (folder / "b.safetensors").symlink_to(outside)
    index = {"weight_map": {key: name for key in load_file(outside)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    monkeypatch.setattr(transformers_loading, "load_transformers_model", lambda *args: pytest.fail("the model was built"))

    with pytest.raises(AttnvizError) as refused:
        load_model(str(folder), layer_at_a_time=where == "link")
    expected = f"leads outside the model folder (to {outside})" if where == "link" else f"names the shard {name!r}, which is not a file inside"
    assert str(refused.value).startswith(f"cannot load model {str(folder)!r}: ") and expected in str(refused.value)


def test_a_nan_in_a_projection_is_named(tmp_path, llama):
    folder = copy_of(llama[0], tmp_path / "damaged")
    tensors = load_file(folder / "model.safetensors")
    tensors["layers.1.self_attn.q_proj.weight"][3, 5] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model(str(folder))

    with pytest.raises(AttnvizError, match=r"^the model's layers\.1\.self_attn\.q_proj\.weight holds 1 NaN or infinite value"):
        run_attention(loaded, [TEXT], run_spec(loaded, str(folder), layer=1))


def test_truncate_keeps_a_decoders_first_tokens(tmp_path):
    folder = tmp_path / "gpt2"
    build_checkpoint("gpt2", folder)
    loaded = load_model(str(folder))
    long_text = " ".join([TEXT] * 10)
    ids = transformers.AutoTokenizer.from_pretrained(folder)(long_text).input_ids
    assert len(ids) > loaded.max_positions == 64

    [run] = run_attention(loaded, [long_text], run_spec(loaded, str(folder), truncate=True))
    assert run.query_ids == ids[:64]  # GPT-2 ends a text with no special token: nothing to keep at the end
    assert run.truncated.to_dict() == {"from": len(ids), "to": 64}
    assert any(f"dropped its last {len(ids) - 64} tokens" in note for note in run.notes)


def test_heads_must_keep_grouped_query_groups_whole(llama):
    folder, _ = llama
    loaded = load_model(str(folder))

    with pytest.raises(AttnvizError) as refused:
        run_attention(loaded, [TEXT], run_spec(loaded, str(folder), num_heads=4))
    assert str(refused.value) == (
        "--heads 4: Llama's 6 query heads share 2 key/value heads in groups of 3; a split must keep the groups "
        "whole: choose a multiple of 3 that divides 48: 3, 6, 12, 24"
    )


def test_a_regrouped_split_equals_transformers_attention_built_with_those_heads(llama):
    """--heads 3 on 6 query heads over 2 key/value heads: 3 heads of 16 features over 1 key/value head, RoPE for 16."""
    folder, model = llama
    loaded = load_model(str(folder))
    spec = run_spec(loaded, str(folder), layer=1, num_heads=3)
    [run] = run_attention(loaded, [TEXT], spec)
    assert (run.num_heads, run.num_kv_heads, run.head_dim) == (3, 1, 16)

    # transformers' own Llama attention, configured with 3 heads over 1 key/value head, holding layer 1's weights
    config = transformers.LlamaConfig(
        **{**model.config.to_dict(), "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 16}, attn_implementation="eager"
    )
    attention = transformers.models.llama.modeling_llama.LlamaAttention(config, layer_idx=1).eval()
    attention.load_state_dict(model.layers[1].self_attn.state_dict())
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    hidden = layer_states(loaded, encode_texts(loaded, [TEXT], spec), [1], spec)[1].queries  # what enters layer 1
    positions = torch.arange(hidden.shape[1])[None]
    mask = torch.full((hidden.shape[1],) * 2, float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        _, expected = attention(hidden, rotary(hidden, positions), attention_mask=mask)
    assert torch.allclose(torch.from_numpy(run.attention), expected[0], atol=1e-5, rtol=0)

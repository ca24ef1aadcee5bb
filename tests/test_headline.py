"""An honest headline: offline, `heads "我想吃酸菜鱼"` runs on the bundled English model, which reads 5 of
its 6 characters as [UNK]; every figure's title, attention.json, the command's last lines and a Python
warning say so, and the advice names what works offline and online."""

import json
import os
import subprocess
import sys
import warnings

import huggingface_hub.constants
import pytest

import attnviz
from attnviz.errors import AttnvizWarning
from attnviz.models.loading import BUNDLED_NAME, DEFAULT_MODEL
from attnviz.render.heatmap import head_figure, heads_grid_figure

HEADLINE = "我想吃酸菜鱼"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No hub and an empty hub cache: the default model falls back to the bundled one, as on a fresh offline machine."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def unknown_count(text: str) -> tuple[int, int]:
    """[UNK] among the bundled tokenizer's tokens of text, [CLS] and [SEP] left out: counted from its tokens."""
    from attnviz.models.loading import load_model

    tokenizer = load_model("bundled").tokenizer
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode_batch([text])[0])
    own = [token for token in tokens if token not in ("[CLS]", "[SEP]")]
    return sum(token == "[UNK]" for token in own), len(own)


def title_of(figure) -> str:
    """A figure's title, on one line: its suptitle (heads.png), or its map's title (head_XX.png)."""
    return (figure.get_suptitle() or figure.axes[0].get_title()).replace("\n", " · ")


def test_the_headline_on_the_fallback_says_so_in_the_titles_and_the_json(offline):
    count, of = unknown_count(HEADLINE)
    assert (count, of) == (5, 6)  # 我 is in the English vocabulary, 想吃酸菜鱼 are not
    with pytest.warns(AttnvizWarning):
        result = attnviz.heads(HEADLINE, model=attnviz.load(None, cache=False))

    assert result.run.model == BUNDLED_NAME
    clause = f"fallback for {DEFAULT_MODEL} · {count} of {of} tokens [UNK]"
    for figure in (heads_grid_figure(result.run), head_figure(result.run, 0)):
        assert clause in title_of(figure)
    record = result.to_dict()
    assert (record["fallback"], record["fallback_for"]) == (True, DEFAULT_MODEL)
    assert record["unknown_tokens"] == {"count": count, "of": of, "token": "[UNK]"}
    assert record["kv_unknown_tokens"] is None


def test_the_bundled_model_asked_for_is_no_fallback_but_its_unknown_tokens_are_said():
    with pytest.warns(AttnvizWarning):
        result = attnviz.heads(HEADLINE, model="bundled")
    title = title_of(result.figure())
    assert "fallback" not in title and "5 of 6 tokens [UNK]" in title
    assert result.to_dict()["fallback"] is False and result.to_dict()["fallback_for"] is None


def test_a_text_the_model_reads_has_no_clause_and_no_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = attnviz.heads("The cat sat on the mat.", model="bundled")
    assert [w for w in caught if issubclass(w.category, AttnvizWarning)] == []
    assert "[UNK]" not in title_of(result.figure(head=0))
    assert result.to_dict()["unknown_tokens"] == {"count": 0, "of": 7, "token": "[UNK]"}  # the cat sat on the mat .


def test_the_words_of_a_run_over_words_keep_the_tokens_count():
    """--words merges 想 吃 酸菜鱼's [UNK] pieces into words: the title still says what the model saw."""
    with pytest.warns(AttnvizWarning):
        result = attnviz.heads(HEADLINE, model="bundled", words=True)
    assert "5 of 6 tokens [UNK]" in title_of(result.figure())


def attnviz_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, AttnvizWarning)]


def test_load_warns_the_fallback_once_and_a_call_on_its_handle_warns_only_the_texts_notes(offline):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = attnviz.load(None, cache=False)
    (fallback,) = attnviz_warnings(caught)
    assert fallback.startswith(f"{DEFAULT_MODEL} is not in the local hub cache") and fallback == handle.loaded.note
    assert {w.filename for w in caught} == {__file__}  # a notebook shows the cell's line, not attnviz's

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = attnviz.heads([HEADLINE, HEADLINE], model=handle)  # two texts, the same notes
    (unknown,) = attnviz_warnings(caught)  # each distinct note once; the fallback is load's, said already
    assert unknown.startswith(f'5 of 6 tokens of the text "{HEADLINE}" are [UNK]')
    assert {w.filename for w in caught} == {__file__}
    assert results[0].notes == [fallback, unknown]  # the result still holds both, as the command prints them


def test_loading_the_model_asked_for_warns_nothing():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attnviz.load("bundled", cache=False)
    assert attnviz_warnings(caught) == []


CALLS = {
    "heads": lambda model: attnviz.heads(HEADLINE, model=model),
    "layers": lambda model: attnviz.layers(HEADLINE, model=model),
    "stats": lambda model: attnviz.stats(HEADLINE, model=model),
    "trace": lambda model: attnviz.trace(HEADLINE, model=model),
    "compare": lambda model: attnviz.compare(HEADLINE, model=model, heads="1,12"),
    "position": lambda model: attnviz.position(HEADLINE, model=model),
    "report": lambda model: attnviz.report(HEADLINE, model=model),
}


@pytest.mark.parametrize("call", CALLS)
def test_every_api_function_warns_its_notes_once_at_the_callers_line(call, offline):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AttnvizWarning)  # load's fallback: counted above
        handle = attnviz.load(None, cache=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CALLS[call](handle)
    (unknown,) = attnviz_warnings(caught)  # the text's [UNK] share; the fallback not again
    assert unknown.startswith(f'5 of 6 tokens of the text "{HEADLINE}" are [UNK]')
    assert {w.filename for w in caught if issubclass(w.category, AttnvizWarning)} == {__file__}


def test_the_report_warns_what_its_page_leaves_out_too():
    """A 1-head layer has no reshape mistake to show: the page says so, and so does a warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = attnviz.report("The cat sat.", model="bundled", heads=1)
    assert attnviz_warnings(caught) == result.record["notes"] != []
    assert any("no reshape mistake traced in this report" in note for note in result.record["notes"])


@pytest.mark.slow  # a fresh process: a notebook's first calls, offline
def test_a_fresh_process_hears_of_the_fallback_once_and_of_the_unknown_tokens_at_each_call(tmp_path):
    script = (
        "import json, warnings\n"
        "import attnviz\n"
        "heard = []\n"
        "for _ in range(2):\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        f"        attnviz.heads({HEADLINE!r})\n"
        "    heard.append([str(w.message) for w in caught if issubclass(w.category, attnviz.AttnvizWarning)])\n"
        "print(json.dumps(heard, ensure_ascii=False))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    printed = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    first, second = json.loads(printed.splitlines()[-1])
    assert len(first) == 2 and first[0].startswith(f"{DEFAULT_MODEL} is not in the local hub cache")
    assert first[1].startswith("5 of 6 tokens") and second == [first[1]]  # the cached handle's fallback is not said again


def test_the_note_advises_what_works_offline_and_online():
    with pytest.warns(AttnvizWarning) as caught:
        attnviz.heads(HEADLINE, model="bundled")
    (note,) = [str(w.message) for w in caught]
    assert note.endswith("offline: --model smollm2 --words (SmolLM2 reads Chinese); online: --model bert-base-chinese")
    with pytest.warns(AttnvizWarning) as caught:
        attnviz.heads("ሰላም ለዓለም", model="bundled")  # Amharic: byte-level SmolLM2 has no [UNK]; multilingual BERT online
    assert "online: --model bert-base-multilingual-cased" in str(caught[0].message)


@pytest.mark.slow  # fresh processes
def test_the_command_ends_with_the_headline_notes_after_the_table(tmp_path):
    """Offline (a fresh process, no hub, an empty cache), the last lines printed name the fallback, the [UNK] share and the advice."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "COLUMNS": "200"}
    command = [sys.executable, "-m", "attnviz", "heads", HEADLINE, "--out", str(tmp_path / "run")]
    printed = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    lines = printed.rstrip("\n").splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.startswith("└"))
    assert table_end < lines.index("files written")
    assert lines[-1] == (
        f"note: {BUNDLED_NAME}: fallback for {DEFAULT_MODEL} · 5 of 6 tokens [UNK]; "
        "offline: --model smollm2 --words (SmolLM2 reads Chinese); online: --model bert-base-chinese"
    )
    assert "AttnvizWarning" not in printed  # the command prints its notes; Python's warnings stay out


@pytest.mark.slow  # fresh processes
def test_a_batch_prints_its_notes_after_its_table(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "COLUMNS": "200"}
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{HEADLINE}\nThe cat sat.\n", encoding="utf-8")
    command = [sys.executable, "-m", "attnviz", "heads", "--file", str(texts), "--out", str(tmp_path / "run")]
    printed = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    lines = printed.splitlines()
    notes = [i for i, line in enumerate(lines) if line.startswith("note: ")]
    assert len(notes) == 2 and min(notes) > lines.index("files written")
    assert "5 of 6 tokens" in lines[notes[-1]] and "offline: --model smollm2 --words" in lines[notes[-1]]


@pytest.mark.slow
def test_the_advice_offline_is_right_smollm2_over_words_reads_the_headline(smollm2_cached):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = attnviz.heads(HEADLINE, model="smollm2", words=True)
    assert [w for w in caught if issubclass(w.category, AttnvizWarning)] == []
    assert result.run.unknown.count == 0
    assert "我" in result.tokens and "酸菜鱼" in result.tokens


@pytest.mark.slow  # every figure of a run drawn
def test_compare_and_position_figures_name_the_fallback_and_the_unknown_share(offline):
    """compare.png and position.png show a run of the fallback model too: their titles say so, as the run figures' do."""
    count, of = unknown_count(HEADLINE)
    clause = f"fallback for {DEFAULT_MODEL} · {count} of {of} tokens [UNK]"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AttnvizWarning)  # counted by the warnings' tests
        handle = attnviz.load(None, cache=False)
        compared = attnviz.compare(HEADLINE, model=handle, heads="1,12", weights=["pretrained", "random"])  # rows of both
        moved = attnviz.position(HEADLINE, model=handle)
    assert clause in title_of(compared.figure())
    assert clause in title_of(moved.figure())


@pytest.mark.slow
def test_compare_and_position_of_the_bundled_model_asked_for_say_only_the_unknown_share():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AttnvizWarning)
        titles = [title_of(attnviz.compare(HEADLINE, model="bundled", heads="12").figure()),
                  title_of(attnviz.position(HEADLINE, model="bundled").figure())]  # fmt: skip
    for title in titles:
        assert "fallback" not in title and "5 of 6 tokens [UNK]" in title
    assert "[UNK]" not in title_of(attnviz.position("The cat sat on the mat.", model="bundled").figure())

"""attnviz.heads_file and attnviz.stats_file: `heads --file` and `stats --file` as functions, over a file or any
iterable of texts, streamed, with progress=; the commands call them, so a Python user gets the command's files."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
import attnviz.models.loading
from attnviz.cli import run
from attnviz.errors import AttnvizError

TEXTS = ["the cat sat on the mat", "a dog ran", "why not", "the red fish", "it was tired", "hi there"]


class Recorder:
    """A progress= with stages: each (what, total, [counts])."""

    def __init__(self):
        self.stages: list[tuple[str, int | None, list[int]]] = []

    def stage(self, what: str, total: int | None) -> None:
        self.stages.append((what, total, []))

    def __call__(self, count: int) -> None:
        self.stages[-1][2].append(count)


@pytest.fixture
def texts_file(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def no_loading(monkeypatch):
    monkeypatch.setattr(attnviz.models.loading, "load_model", lambda *args, **kwargs: pytest.fail("the model loaded"))


def files_of(folder) -> dict[str, bytes]:
    """Every file under folder (but the manifest), by its path inside it: its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_heads_file_writes_the_commands_bytes_from_a_file_and_from_a_generator(texts_file, tmp_path):
    """The command calls heads_file: its folder and the function's are the same bytes, file for file; a generator of
    the same texts (numbered from 1, as the file's lines are) gives them too, and each text's weights are its own run's."""
    assert run(["heads", "--file", str(texts_file), "--model", "bundled", "--device", "cpu", "--figures", "none",
                "--no-html", "--out", str(tmp_path / "cli")]) == 0  # fmt: skip
    options = dict(model="bundled", device="cpu", figures="none", html=False)
    from_file = attnviz.heads_file(texts_file, tmp_path / "file", **options)
    from_generator = attnviz.heads_file((text for text in TEXTS), tmp_path / "generator", **options)

    cli = files_of(tmp_path / "cli")
    assert len([name for name in cli if name.endswith("attention.json")]) == len(TEXTS)
    assert files_of(from_file.folder) == cli
    assert files_of(from_generator.folder) == cli
    assert [row["text"] for row in from_generator.rows] == TEXTS
    assert from_generator.files == [tmp_path / "generator" / "summary.csv", tmp_path / "generator" / "summary.json"]
    for text, folder in zip(TEXTS, from_generator.text_folders):  # each text's own weights, run alone
        record = json.loads((folder / "attention.json").read_text(encoding="utf-8"))
        alone = attnviz.heads(text, model="bundled", device="cpu").attention.numpy()
        assert np.abs(np.array(record["attention"]) - alone).max() < 1e-5  # attention.json's 7 decimals, float32


def test_heads_file_counts_each_text_written_and_names_the_stage(tmp_path):
    recorder = Recorder()
    result = attnviz.heads_file(TEXTS[:3], tmp_path / "run", model="bundled", device="cpu", figures="none", html=False, progress=recorder)
    assert recorder.stages == [("texts written", 3, [1, 1, 1])]
    assert [row["line"] for row in result.rows] == [1, 2, 3]


def test_stats_file_streams_a_generator_a_chunk_at_a_time_and_averages_as_stats_does():
    """A generator is read as the chunks need it: when each chunk of 2 texts has been measured, the texts read are
    that chunk's and those before it, never all 6. The averages equal attnviz.stats over the list (every text weighs
    the same), computed in one pass of padded batches, within float32's error."""
    pulled, read_when_counted = [], []

    def texts():
        for text in TEXTS:
            pulled.append(text)
            yield text

    class Reading(Recorder):
        def __call__(self, count: int) -> None:
            super().__call__(count)
            read_when_counted.append(len(pulled))

    recorder = Reading()
    streamed = attnviz.stats_file(texts(), chunk_lines=2, progress=recorder, model="bundled", device="cpu")
    assert read_when_counted == [2, 4, 6]
    assert recorder.stages == [("texts measured", None, [2, 2, 2])]  # a generator's length is unknown
    whole = attnviz.stats(TEXTS, js=False, model="bundled", device="cpu")
    assert streamed.stats.num_texts == whole.stats.num_texts == len(TEXTS)
    np.testing.assert_allclose(streamed.values, whole.values, atol=1e-5, equal_nan=True)
    assert streamed.corpus == {"file": None, "bytes": None, "sha256": None, "texts": len(TEXTS), "truncated": 0}


def test_stats_file_of_a_file_writes_the_commands_stats_json(texts_file, tmp_path):
    recorder = Recorder()
    result = attnviz.stats_file(texts_file, model="bundled", device="cpu", progress=recorder)
    assert recorder.stages == [("texts measured", len(TEXTS), [len(TEXTS)])]
    result.save(tmp_path / "api")
    assert run(["stats", "--file", str(texts_file), "--model", "bundled", "--device", "cpu", "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "api" / "stats.json").read_bytes() == (tmp_path / "cli" / "stats.json").read_bytes()
    assert result.corpus["file"] == str(texts_file) and result.corpus["texts"] == len(TEXTS)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda folder: attnviz.heads_file(TEXTS, folder, head=3, figures="grid", model="bundled"),
         "head=3 draws that head's heatmap alone: leave out figures="),
        (lambda folder: attnviz.heads_file(TEXTS, folder, head=4, heads=2, model="bundled"),
         "head=4 is out of range: heads=2 splits the layer into 2 heads, 0 to 1"),
        (lambda folder: attnviz.heads_file([], folder, model="bundled"), "no texts: give an iterable of one text or more"),
        (lambda folder: attnviz.heads_file(["a", " "], folder, model="bundled"), "texts[1] is empty"),
        (lambda folder: attnviz.stats_file(TEXTS, resume=True, model="bundled"),
         "resume=True needs checkpoint=: the checkpoint to continue from"),
        (lambda folder: attnviz.stats_file(iter(TEXTS), checkpoint=folder / "c.npz", model="bundled"),
         "checkpoint= needs a file on disk: an iterable of texts cannot be read again to resume"),
        (lambda folder: attnviz.stats_file(iter([]), model="bundled"), "no texts: give an iterable of one text or more"),
        (lambda folder: attnviz.stats_file(TEXTS, chunk_lines=0, model="bundled"), "chunk_lines 0: give 1 or more"),
        (lambda folder: attnviz.heads("hi", head=4, heads=2, model="bundled"), "head=4 is out of range: heads=2 splits the layer into 2 heads"),
        (lambda folder: attnviz.heads("hi", window="0:2;0:3", model="bundled"), "window '0:2;0:3' is not Q0:Q1,K0:K1"),
        (lambda folder: attnviz.heads("hi", window="8:2,0:3", model="bundled"), "window's queries 8:2 are empty"),
    ],
)  # fmt: skip
def test_the_apis_refusals_come_before_the_model_loads_and_write_nothing(call, message, tmp_path, no_loading):
    with pytest.raises(AttnvizError) as refused:
        call(tmp_path)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value), str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_head_past_the_models_is_refused_once_it_loads_before_any_text_runs(tmp_path, monkeypatch, capsys):
    """The model's own head count is known once it loads: head=12 of a 12-head layer is refused then, by the API and
    by the command through it, before any layer runs; nothing is written."""
    import attnviz.pipeline

    monkeypatch.setattr(attnviz.pipeline, "run_attention", lambda *args, **kwargs: pytest.fail("a layer ran"))
    with pytest.raises(AttnvizError, match=r"^head=12 is out of range: all-MiniLM-L6-v2's layers have 12 heads, 0 to 11$"):
        attnviz.heads_file(TEXTS, tmp_path / "api", head=12, model="bundled", device="cpu")
    source = tmp_path / "texts.txt"
    source.write_text("a\nb\n", encoding="utf-8")
    assert run(["heads", "--file", str(source), "--head", "12", "--model", "bundled", "--out", str(tmp_path / "cli")]) == 2
    assert capsys.readouterr().err == "error: --head 12 is out of range: all-MiniLM-L6-v2's layers have 12 heads, 0 to 11\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["texts.txt"]


def test_a_window_past_the_map_is_refused_by_the_api_with_the_range():
    with pytest.raises(AttnvizError, match=r"^window's keys 0:99 are out of range: the map has keys 0 to 7"):
        attnviz.heads("the cat sat on the mat", window="0:2,0:99", model="bundled", device="cpu")


def test_heads_with_trace_and_head_refuses_an_empty_text_before_the_model_loads(tmp_path, capsys, no_loading):
    """With --trace the command checks --head on the model before the trace runs: the text is checked before that."""
    assert run(["heads", " ", "--trace", "--head", "3", "--model", "bundled", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == "error: the text is empty: give some words to attend over\n"
    assert list(tmp_path.iterdir()) == []

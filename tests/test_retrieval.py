"""Retrieval heads (Wu et al. 2024, §2, Eq. 1): analysis/needles.py, analysis/retrieval.py, output/retrieval_heads.py.

Checked against an independent loop over transformers' generate(output_attentions=True, greedy) on the same folder:
the answer's ids, and each head's |g_h ∩ k| / |k| from the last row of each step's eager attentions; on a tiny Llama
built here with transformers' own classes (its unembedding kept to the needle's tokens, so that it answers with them)
and, in the slow tier, on SmolLM2, which retrieves. ROUGE-1 recall against a hand computation, the scores' bounds and
the kept tests' mean by hand, the refusals before any generation, and Ray equal to one process (the ray tier).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from attnviz.analysis.needles import Needle, NeedleTest, needle_tests, rouge1_recall
from attnviz.analysis.retrieval import KEEP_RECALL, NeedleResult, answer_length, copy_scores, mean_of_kept
from attnviz.errors import AttnvizError

HAYSTACK = "The cat sat on the mat. Attention is all you need, they said. The mat was tired. They sat because it was tired."
NEEDLES = [
    {"needle": "The cat said attention was all the mat need.", "question": "What did the cat say?"},
    {"needle": "They need the tired cat on the mat.", "question": "What do they need?"},
]


class WordTokenizer:
    """A tokenizer of whitespace-separated words (each word an id, <s> first): enough for needle_tests' arithmetic."""

    def __init__(self):
        self.vocabulary: dict[str, int] = {"<s>": 0}

    def encode_batch(self, texts):
        return [[0] + [self.vocabulary.setdefault(word, len(self.vocabulary)) for word in text.split()] for text in texts]

    def decode(self, ids):
        words = {index: word for word, index in self.vocabulary.items()}
        return " ".join(words[index] for index in ids)


@pytest.fixture
def texts(tmp_path):
    (tmp_path / "haystack.txt").write_text(HAYSTACK, encoding="utf-8")
    (tmp_path / "needles.json").write_text(json.dumps(NEEDLES), encoding="utf-8")
    return tmp_path


def test_rouge1_recall_is_the_share_of_the_needles_words_the_answer_has_as_often_as_both_have_them():
    # needle words: the x2, cat x2, saw, other (6); the answer has the once, cat once, and dog: 2 of 6
    assert rouge1_recall("The cat saw the other cat.", "a cat, the dog") == pytest.approx(2 / 6)
    assert rouge1_recall("The cat saw the other cat.", "THE CAT SAW THE OTHER CAT!!") == 1.0  # case and punctuation aside
    assert rouge1_recall("Port Alder's glass museum", "the museum") == pytest.approx(1 / 5)  # port, alder, s, glass, museum
    assert rouge1_recall("Grandma Ivy's soup", "") == 0.0


def test_copy_scores_count_each_needle_position_a_head_copied_once_when_its_largest_weight_is_on_that_token():
    prompt = [0, 5, 7, 8, 7, 9]  # the needle: positions [2, 5), tokens 7 8 7
    answer = [7, 8, 7, 3]
    rows = np.full((1, 4, 4, 10), 0.01)  # (L, H, n, T)
    rows[0, 0, [0, 1, 2], [2, 3, 4]] = 0.9  # head 0 copies all three positions: 3/3
    rows[0, 1, [0, 2], [2, 2]] = 0.9  # head 1 copies position 2 twice, once counted: 1/3
    rows[0, 1, 1, 1] = 0.9  # ... and looks at token 5 for token 8 (outside the needle, another token): nothing
    rows[0, 2, 0, 3] = 0.9  # head 2: its largest weight on the needle, on token 8 for token 7: nothing
    rows[0, 2, 3, 5] = 0.9  # ... and on the token after the needle for token 3: nothing
    rows[0, 3, 1, 6] = 0.9  # head 3: on the answer's own token 7 (position 6), not the needle's: nothing
    scores = copy_scores(rows, prompt, answer, (2, 5))
    np.testing.assert_allclose(scores, [[1.0, 1 / 3, 0.0, 0.0]])


def test_a_test_is_kept_when_its_recall_passes_half_and_a_heads_score_is_the_mean_of_its_kept_tests():
    test = NeedleTest(100, 0.5, Needle("n", "q"), "p", [0], (0, 1))
    results = [
        NeedleResult(test, [], "", 0.9, np.array([[1.0, 0.0]])),
        NeedleResult(test, [], "", KEEP_RECALL, np.array([[0.0, 1.0]])),  # 0.5 is not above 0.5: not kept
        NeedleResult(test, [], "", 0.51, np.array([[0.5, 0.5]])),
    ]
    assert [result.kept for result in results] == [True, False, True]
    np.testing.assert_allclose(mean_of_kept(results), [[0.75, 0.25]])
    np.testing.assert_array_equal(mean_of_kept(results[1:2]), [[0.0, 0.0]])  # none kept: 0, and kept says 0


def test_the_answer_ends_at_its_first_line_break_after_some_text():
    tokenizer = WordTokenizer()
    tokenizer.vocabulary.update({"\n": 1, "a": 2, "b\nc": 3, " ": 4})
    assert answer_length(tokenizer, [1, 4, 2, 2, 1, 2]) == 4  # the leading break and blank skipped
    assert answer_length(tokenizer, [2, 3, 2]) == 1
    assert answer_length(tokenizer, [2, 2]) == 2


def test_each_needle_sits_at_its_depth_within_a_prompt_of_at_most_its_length(texts):
    tokenizer = WordTokenizer()
    tests = needle_tests(tokenizer, [40, 120], [0.0, 0.5, 1.0], context=200, answer_tokens=8, folder=texts)
    assert [(test.length, test.depth) for test in tests] == [(length, depth) for length in (40, 120) for depth in (0.0, 0.5, 1.0)]
    for test in tests:
        start, end = test.needle_span
        assert tokenizer.decode(test.needle_ids) == test.needle.sentence
        assert test.prompt_ids == tokenizer.encode_batch([test.prompt])[0] and len(test.prompt_ids) <= test.length
        assert test.length - len(test.prompt_ids) < 12  # filled up to the length, to within a sentence of the haystack
        haystack = len(test.prompt_ids) - len(tokenizer.encode_batch([test.needle.question])[0]) - 2 - (end - start)  # "Question:", "Answer:"
        assert abs((start - 1) - test.depth * haystack) <= 11  # at the depth, to within a sentence
    assert {test.needle.sentence for test in tests} == {needle["needle"] for needle in NEEDLES}
    assert tests[1].needle != tests[0].needle and tests[3].needle != tests[0].needle  # each needle meets every depth


class ChatWordTokenizer(WordTokenizer):
    def chat_prompt(self, text):
        return f"<user> {text} </user> <assistant>"


def test_where_the_checkpoint_has_a_chat_template_the_haystack_and_question_are_the_users_turn(texts):
    tokenizer = ChatWordTokenizer()
    for test in needle_tests(tokenizer, [60], [0.0, 0.5], context=200, answer_tokens=8, folder=texts):
        assert test.prompt.startswith("<user> ") and test.prompt.endswith(f"Question: {test.needle.question} </user> <assistant>")
        assert tokenizer.decode(test.needle_ids) == test.needle.sentence and len(test.prompt_ids) <= 60
    plain = needle_tests(WordTokenizer(), [60], [0.5], context=200, answer_tokens=8, folder=texts)[0]
    assert plain.prompt.endswith(f"\n\nQuestion: {plain.needle.question}\nAnswer:")


def test_lengths_past_the_models_context_and_depths_outside_0_to_1_are_refused_before_any_test_is_built(texts):
    with pytest.raises(AttnvizError, match="lengths 190, 300: past tiny's context of 200 positions"):
        needle_tests(WordTokenizer(), [40, 190, 300], [0.5], context=200, answer_tokens=16, folder=texts, model="tiny")
    with pytest.raises(AttnvizError, match="depths 1.5"):
        needle_tests(WordTokenizer(), [40], [0.5, 1.5], context=200, answer_tokens=16, folder=texts)
    with pytest.raises(AttnvizError, match="too short for the needle"):
        needle_tests(WordTokenizer(), [10], [0.5], context=200, answer_tokens=16, folder=texts)
    with pytest.raises(AttnvizError, match="not there"):
        needle_tests(WordTokenizer(), [40], [0.5], context=200, answer_tokens=16, folder=texts / "nowhere")


# -- against transformers' generate(output_attentions=True): a tiny Llama, SmolLM2, Ray ---------------------------------


def transformers_retrieval(model, tokenizer, result, answer_tokens: int) -> tuple[list[int], np.ndarray]:
    """An independent loop: transformers' greedy generate with eager attentions; the answer's ids (cut at its first line
    break after some text) and each head's share of the needle's positions it copied, from each step's last row."""
    import torch

    test = result.test
    prompt = torch.tensor([test.prompt_ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=answer_tokens, do_sample=False,
                             output_attentions=True, return_dict_in_generate=True)
    generated = out.sequences[0, prompt.shape[1]:].tolist()
    answer, begun = [], False
    for token in generated:
        text = tokenizer.decode([token])
        if begun and "\n" in text:
            break
        begun = begun or text.strip() != ""
        answer.append(token)
    every = test.prompt_ids + generated
    start, end = test.needle_span
    layers, heads = len(out.attentions[0]), out.attentions[0][0].shape[1]
    copied = [[set() for _ in range(heads)] for _ in range(layers)]
    for step, token in enumerate(answer):
        for layer in range(layers):
            for head in range(heads):
                key = int(out.attentions[step][layer][0, head, -1].argmax())  # the step's query: the last row
                if start <= key < end and every[key] == token:
                    copied[layer][head].add(key)
    return answer, np.array([[len(positions) / (end - start) for positions in row] for row in copied])


def recall_by_hand(needle: str, answer: str) -> float:
    import re

    needle_words, answer_words = re.sub(r"[^a-z0-9]", " ", needle.lower()).split(), re.sub(r"[^a-z0-9]", " ", answer.lower()).split()
    found = sum(min(needle_words.count(word), answer_words.count(word)) for word in set(needle_words))
    return found / len(needle_words)


def assert_as_transformers(retrieval, model, tokenizer, answer_tokens):
    per_test = []
    for result in retrieval.tests:
        ids, scores = transformers_retrieval(model, tokenizer, result, answer_tokens)
        assert result.ids == ids
        np.testing.assert_allclose(result.scores, scores, atol=1e-12)
        assert result.recall == pytest.approx(recall_by_hand(result.test.needle.sentence, tokenizer.decode(ids)))
        per_test.append((scores, result.recall > 0.5))
    kept = [scores for scores, kept in per_test if kept]
    assert retrieval.kept == len(kept)
    np.testing.assert_allclose(retrieval.scores, np.mean(kept, axis=0) if kept else 0.0, atol=1e-12)
    assert retrieval.scores.min() >= 0.0 and retrieval.scores.max() <= 1.0


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny Llama (2 layers, 6 heads over 2 key/value heads, 256 positions) whose unembedding has only the needles'
    tokens' rows: it answers with the needles' tokens, so that heads copy some."""
    import torch
    import transformers

    from tiny_families import BPE_VOCAB, _DECODER, bpe_tokenizer, save_checkpoint

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = bpe_tokenizer(bos=True)
    config = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **{**_DECODER, "max_position_embeddings": 256})
    config.eos_token_id = None
    model = save_checkpoint(config, transformers.LlamaForCausalLM, tokenizer, folder, seed=3)
    needle_tokens = sorted({token for needle in NEEDLES for token in tokenizer(" " + needle["needle"], add_special_tokens=False)["input_ids"]})
    with torch.no_grad():
        keep = torch.zeros(BPE_VOCAB, dtype=torch.bool)
        keep[needle_tokens] = True
        model.lm_head.weight[~keep] = 0.0  # logit 0: a needle token wins wherever one's logit is positive
    model.save_pretrained(folder)
    return folder, transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval(), tokenizer


def tiny_retrieval(folder, texts, **options):
    import attnviz
    from attnviz.output.retrieval_heads import retrieval_heads
    from attnviz.spec import run_spec

    handle = attnviz.load(str(folder), device="cpu")
    options = {"lengths": [120, 240], "depths": [0.0, 0.5, 1.0], **options}
    return retrieval_heads(handle.loaded, run_spec(handle.loaded, str(folder)), answer_tokens=12, folder=texts, model_name=str(folder), **options)


@pytest.mark.slow
def test_a_tiny_llamas_retrieval_scores_are_those_of_transformers_generate_with_its_attentions(tiny_llama, texts):
    folder, model, tokenizer = tiny_llama
    retrieval = tiny_retrieval(folder, texts)
    assert len(retrieval.tests) == 6 and retrieval.scores.shape == (2, 6)
    assert_as_transformers(retrieval, model, tokenizer, 12)
    assert any(result.scores.max() > 0 for result in retrieval.tests)  # some head copied: the check has teeth


@pytest.mark.slow
def test_a_length_past_the_models_context_is_refused_naming_it_before_anything_is_generated(tiny_llama, texts):
    with pytest.raises(AttnvizError, match=r"lengths 250: past .*tiny-llama.*'s context of 256 positions"):
        tiny_retrieval(tiny_llama[0], texts, advance=lambda done: pytest.fail("a test ran"), lengths=[120, 250])


@pytest.mark.slow
def test_an_interrupted_run_writes_nothing(tiny_llama, texts, tmp_path):
    from attnviz.output.runs import StagedRunFolder

    def interrupt(done):
        raise KeyboardInterrupt

    outputs = tmp_path / "outputs"
    outputs.mkdir()
    out = outputs / "run"
    with pytest.raises(KeyboardInterrupt):
        with StagedRunFolder(out, unique=False) as staging:
            (staging / "roles.json").write_text(json.dumps(tiny_retrieval(tiny_llama[0], texts, advance=interrupt).record()))
    assert list(outputs.iterdir()) == []  # neither the run's folder nor its staging folder


@pytest.mark.ray
def test_on_ray_the_tests_give_what_one_process_gives(tiny_llama, texts, monkeypatch):
    pytest.importorskip("ray", reason='the ray extra is not installed: pip install -e ".[test,ray]"')
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a local instance, never a cluster this machine may know of
    folder = tiny_llama[0]
    local, on_ray = tiny_retrieval(folder, texts), tiny_retrieval(folder, texts, engine="ray")
    assert [result.test for result in on_ray.tests] == [result.test for result in local.tests]
    assert [(result.ids, result.recall) for result in on_ray.tests] == [(result.ids, result.recall) for result in local.tests]
    for mine, theirs in zip(local.tests, on_ray.tests):
        np.testing.assert_allclose(theirs.scores, mine.scores, atol=1e-12)
    np.testing.assert_allclose(on_ray.scores, local.scores, atol=1e-12)
    assert on_ray.record() == local.record()


@pytest.mark.slow
def test_smollm2_retrieves_the_needle_and_its_scores_are_those_of_transformers_generate(smollm2_cached):
    """A short run on the bundled SmolLM2-135M-Instruct (its chat template): kept, recorded, some head above 0.1; as
    transformers' generate, its weights from transformers' own GGUF loader."""
    import attnviz
    import transformers

    from attnviz.output.retrieval_heads import retrieval_heads
    from attnviz.spec import run_spec

    handle = attnviz.load("smollm2", device="cpu")
    retrieval = retrieval_heads(handle.loaded, run_spec(handle.loaded, "smollm2"), lengths=[512], depths=[0.5])
    folder = smollm2_cached.reference_folder
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert_as_transformers(retrieval, model, transformers.AutoTokenizer.from_pretrained(folder), 32)
    assert retrieval.kept == 1 and retrieval.scores.shape == (30, 9) and retrieval.scores.max() > 0.1
    record = json.loads(json.dumps(retrieval.record()))
    assert set(record) == {"scores", "thresholds", "definitions", "papers", "retrieval"}
    assert np.array(record["scores"]["retrieval"]).shape == (30, 9) and record["thresholds"]["retrieval"] == 0.1
    (test,) = record["retrieval"]["tests"]
    assert record["retrieval"]["tests_kept"] == 1 and test["kept"] and test["rouge1_recall"] > 0.5
    start, end = test["needle_span"]
    assert handle.loaded.tokenizer.decode(retrieval.tests[0].test.prompt_ids[start:end]).strip() == test["needle"]
    assert test["ids"] == retrieval.tests[0].ids and test["length"] == 512 and test["depth"] == 0.5


@pytest.mark.slow
def test_roles_retrieval_records_its_tests_and_scores_in_roles_json_and_labels_the_heads_above_the_papers_threshold(tmp_path):
    """`attnviz roles --retrieval` on SmolLM2, one 512-token test: roles.json holds retrieval_heads' record (the same
    scores as the stage run alone), every score in [0, 1], and the heads above 0.1, and only they, labelled retrieval.
    A text this short gives every head a streaming share of 1: no head is labelled streaming, and skipped says why."""
    import attnviz
    from attnviz.analysis.roles import STREAMING_ROLE
    from attnviz.cli import run
    from attnviz.output.retrieval_heads import retrieval_heads
    from attnviz.spec import run_spec

    out = tmp_path / "run"
    text = "The cat sat on the mat. The cat sat on the mat."
    command = ["roles", text, "--model", "smollm2", "--device", "cpu", "--retrieval", "--lengths", "512", "--depths", "0.5"]
    assert run([*command, "--out", str(out)]) == 0
    record = json.loads((out / "roles.json").read_text(encoding="utf-8"))
    scores = np.array(record["scores"]["retrieval"])
    assert scores.shape == (30, 9) and scores.min() >= 0 and scores.max() <= 1 and scores.max() > 0.1
    handle = attnviz.load("smollm2", device="cpu")
    alone = retrieval_heads(handle.loaded, run_spec(handle.loaded, "smollm2"), lengths=[512], depths=[0.5])
    assert record["retrieval"] == json.loads(json.dumps(alone.record()["retrieval"]))
    np.testing.assert_allclose(scores, alone.scores, atol=1e-4)
    assert record["retrieval"]["tests_kept"] == 1 and record["thresholds"]["retrieval"]["above"] == 0.1
    labels = attnviz.roles(text, model="smollm2", device="cpu").with_retrieval(alone).labels
    assert {(layer, head) for layer in range(30) for head in range(9) if "retrieval" in labels[layer][head]} == set(
        zip(*np.nonzero(alone.scores > 0.1))
    )
    assert STREAMING_ROLE in record["skipped"] and not any("streaming" in head for layer in labels for head in layer)


@pytest.mark.slow
def test_roles_retrieval_runs_from_a_non_editable_install_whose_package_carries_the_haystack(tiny_llama, tmp_path):
    """The package built as a wheel (no editable link back to this checkout) and installed into a folder of its own,
    run from a folder that is not the repository: the haystack and needles come from inside the package."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repository = Path(__file__).resolve().parents[1]
    source, installed, elsewhere = tmp_path / "source", tmp_path / "installed", tmp_path / "elsewhere"
    shutil.copytree(repository / "attnviz", source / "attnviz", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repository / name, source / name)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(installed), str(source)]  # fmt: skip
    subprocess.run(pip, check=True, capture_output=True)
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(installed)}
    where = subprocess.run([sys.executable, "-c", "import attnviz.analysis.needles as n; print(n.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(installed)  # the installed copy, not this checkout
    command = ["roles", "The cat sat on the mat.", "--model", str(tiny_llama[0]), "--device", "cpu", "--retrieval",
               "--lengths", "220", "--depths", "0.5", "--out", str(elsewhere / "run")]  # fmt: skip
    ran = subprocess.run([sys.executable, "-m", "attnviz", *command], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    record = json.loads((elsewhere / "run" / "roles.json").read_text(encoding="utf-8"))
    assert [(test["length"], test["depth"]) for test in record["retrieval"]["tests"]] == [(220, 0.5)]
    assert np.array(record["scores"]["retrieval"]).shape == (2, 6)

"""Retrieval heads (Wu et al. 2024, "Retrieval head mechanistically explains long-context factuality", §2, Eq. 1):
the heads that copy a needle from a long haystack into the answer.

Each needle-in-a-haystack test (analysis/needles.py) is generated greedily with attnviz's generate
(analysis/generation.py): each generated token's chosen row (the one that chose it, ROWS) of every layer and head,
from attnviz's layers with their own key/value cache. The answer is the generation up to its first line break after
some text (the paper's decoding stops at a new line). Per head and test, with k the needle's tokens (positions
[start, end) of the prompt):

    retrieval score = |g_h ∩ k| / |k|

g_h: the needle positions the head copied from: generated token w counts at needle position i when the head's
largest weight of the row that chose w is on i and the prompt's token at i is w (each position once: the score is
in [0, 1]). A test is kept when its answer's ROUGE-1 recall of the needle is above KEEP_RECALL (0.5, as in the
paper); a head's score is the mean of its kept tests' (0 where none is kept: `kept` says how many were).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.analysis.needles import NeedleTest, rouge1_recall

KEEP_RECALL = 0.5  # a test counts when its answer's ROUGE-1 recall of the needle is above this (Wu et al. 2024)
RETRIEVAL_THRESHOLD = 0.1  # a retrieval head scores above this (Wu et al. 2024, §2)
ANSWER_TOKENS = 32  # generated tokens at most per test: the needles' answers take 18 to 26 of SmolLM2's
LENGTHS = (1024, 2048, 4096)  # the haystacks' lengths in tokens, by default
DEPTHS = (0.1, 0.5, 0.9)  # where the needle sits in each, by default
PAPER = 'Wu et al. 2024, "Retrieval head mechanistically explains long-context factuality", §2, Eq. 1'
DEFINITION = (
    "the share of the needle's tokens that the head copied: a generated token counts at a needle position when the "
    "head's largest weight, in the row that chose the token, is on that position and the needle's token there is the "
    "generated one; mean over the tests whose answer's ROUGE-1 recall of the needle is above 0.5"
)


@dataclass
class NeedleResult:
    """A test generated and scored: the answer's ids (up to its first line break), its text, its ROUGE-1 recall of
    the needle, whether it is kept, and every head's score on it (L, H)."""

    test: NeedleTest
    ids: list[int]
    answer: str
    recall: float
    scores: np.ndarray  # (L, H) in [0, 1]

    @property
    def kept(self) -> bool:
        return self.recall > KEEP_RECALL


def run_needle_test(loaded, spec, test: NeedleTest, answer_tokens: int = ANSWER_TOKENS) -> NeedleResult:
    """Generate the test's answer greedily with attnviz's generate and score every head on it."""
    from attnviz.analysis.generation import CHOSEN, generate

    generation = generate(loaded, test.prompt, spec, answer_tokens)
    if generation.prompt_ids != test.prompt_ids:
        raise AssertionError("generate encoded the test's prompt otherwise than the test did")
    count = answer_length(loaded.tokenizer, generation.ids)
    ids = generation.ids[:count]
    answer = loaded.tokenizer.decode(ids)
    rows = generation.rows(CHOSEN)[:, :, :count]  # (L, H, n, P + N): the row that chose each of the answer's tokens
    return NeedleResult(test, ids, answer, rouge1_recall(test.needle.sentence, answer), copy_scores(rows, test.prompt_ids, ids, test.needle_span))


def answer_length(tokenizer, ids: list[int]) -> int:
    """How many of the generated ids the answer is: up to the first one with a line break after some text."""
    begun = False
    for index, token in enumerate(ids):
        text = tokenizer.decode([token])
        if begun and "\n" in text:
            return index
        begun = begun or bool(text.strip())
    return len(ids)


def copy_scores(rows: np.ndarray, prompt_ids: list[int], answer_ids: list[int], needle_span: tuple[int, int]) -> np.ndarray:
    """(L, H) each head's |g_h ∩ k| / |k| on one test: rows (L, H, n, T) are the rows that chose the n answer ids, over
    the prompt and the answer (T keys); the needle is prompt_ids[start:end]."""
    start, end = needle_span
    key_ids = np.asarray(list(prompt_ids) + list(answer_ids))  # (T',) every key's token id, T' >= T
    largest = rows.argmax(axis=-1)  # (L, H, n): the key of each head's largest weight, per answer token
    copied = np.zeros((*rows.shape[:2], end - start), dtype=bool)  # (L, H, |k|): the needle positions each head copied
    for step, token in enumerate(answer_ids):
        key = largest[:, :, step]  # (L, H)
        copies = (key >= start) & (key < end) & (key_ids[key] == token)  # (L, H)
        layers, heads = np.nonzero(copies)
        copied[layers, heads, key[layers, heads] - start] = True
    return copied.sum(axis=-1) / (end - start)  # (L, H)


def mean_of_kept(results: list[NeedleResult]) -> np.ndarray:
    """(L, H) the heads' scores averaged over the kept tests; 0 where none is kept."""
    kept = [result.scores for result in results if result.kept]
    return np.mean(kept, axis=0) if kept else np.zeros_like(results[0].scores)

"""Needle-in-a-haystack tests (Wu et al. 2024, "Retrieval head mechanistically explains long-context factuality", §2):
a needle sentence put at a depth of a haystack cut to a length in tokens, and a question whose answer is the needle.

The haystack and the needles are this project's own text, package data in attnviz/analysis/data/ (haystack.txt:
essays, 3,407 tokens of SmolLM2's tokenizer, read again from its start where a length asks for more; needles.json:
each needle sentence and its question). The test of the i-th length and the j-th depth takes needle (i + j) modulo their
number, so that each needle meets every depth. The prompt, where the checkpoint has a chat template (an instruct
model, as Wu et al. prompt their chat models), is the user's turn of it, the assistant's opened after:

    <haystack before the depth> <needle> <haystack after>\n\nQuestion: <question>

and otherwise that text followed by "\nAnswer:". Whole sentences of the haystack fill it until the prompt has at most
`length` tokens. The needle's span is the token positions [start, end) of its ids in the prompt's ids, found by
encoding the prompt up to the needle's start and up to its end (a tokenizer that splits the needle otherwise in its
context is refused).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from attnviz.errors import AttnvizError

NEEDLES_FOLDER = Path(__file__).resolve().parent / "data"  # package data: there in a wheel too
QUESTION = "\n\nQuestion: {question}"
PLAIN_ANSWER = "\nAnswer:"  # after the question, where the checkpoint has no chat template
MARK = "HAYSTACK_AND_QUESTION"  # stands for the user's text in the chat template, to split the template around it


@dataclass(frozen=True)
class Needle:
    sentence: str
    question: str


@dataclass(frozen=True)
class NeedleTest:
    """One test: the prompt's ids (at most `length` of them) with the needle's tokens at needle_span [start, end)."""

    length: int  # the prompt's tokens at most, as asked
    depth: float  # where the needle sits in the haystack: 0 its start, 1 its end
    needle: Needle
    prompt: str
    prompt_ids: list[int]
    needle_span: tuple[int, int]

    @property
    def needle_ids(self) -> list[int]:
        return self.prompt_ids[self.needle_span[0] : self.needle_span[1]]


def read_needles(folder: Path = NEEDLES_FOLDER) -> tuple[list[str], list[Needle]]:
    """The haystack's sentences and the needles of folder (haystack.txt, needles.json)."""
    try:
        haystack = (folder / "haystack.txt").read_text(encoding="utf-8")
        needles = json.loads((folder / "needles.json").read_text(encoding="utf-8"))
    except OSError as error:
        raise AttnvizError(f"the needle-in-a-haystack texts are not there: {error.strerror}: {error.filename}") from None
    sentences = re.findall(r"[^.!?]+[.!?]", " ".join(haystack.split()))  # whole sentences, whitespace made single
    return [sentence.strip() for sentence in sentences], [Needle(entry["needle"], entry["question"]) for entry in needles]


def needle_tests(
    tokenizer, lengths, depths, context: int, answer_tokens: int, folder: Path = NEEDLES_FOLDER, model: str = "the model"
) -> list[NeedleTest]:
    """The tests of every length and depth (lengths outer), each prompt at most `length` tokens; a length whose prompt
    and answer_tokens more pass the model's context (its positions) is refused, naming it, before any test is built."""
    lengths, depths = [int(length) for length in lengths], [float(depth) for depth in depths]
    if not lengths or not depths:
        raise AttnvizError("retrieval needs at least one length and one depth")
    if past := [length for length in lengths if length + answer_tokens > context]:
        raise AttnvizError(
            f"lengths {', '.join(f'{length:,}' for length in past)}: past {model}'s context of {context:,} positions "
            f"(each prompt and its answer's {answer_tokens} tokens must fit)"
        )
    if outside := [depth for depth in depths if not 0.0 <= depth <= 1.0]:
        raise AttnvizError(f"depths {', '.join(map(str, outside))}: a depth is a share of the haystack, from 0 to 1")
    sentences, needles = read_needles(folder)
    frame = prompt_frame(tokenizer)
    first = len(tokenizer.encode_batch([""])[0])  # the tokens a tokenizer puts first (<s>), once per prompt
    sizes = [len(ids) - first for ids in tokenizer.encode_batch([" " + sentence for sentence in sentences])]
    tests = []
    for length_index, length in enumerate(lengths):
        for depth_index, depth in enumerate(depths):
            needle = needles[(length_index + depth_index) % len(needles)]
            tests.append(_needle_test(tokenizer, frame, length, depth, needle, sentences, sizes))
    return tests


def prompt_frame(tokenizer) -> tuple[str, str]:
    """What comes before the haystack and after the question: the chat template's text around the user's turn, the
    assistant's turn opened; without a chat template, nothing and PLAIN_ANSWER."""
    chat = getattr(tokenizer, "chat_prompt", lambda text: None)(MARK)
    if chat is None or chat.count(MARK) != 1:
        return "", PLAIN_ANSWER
    head, tail = chat.split(MARK)
    return head, tail


def _needle_test(tokenizer, frame: tuple[str, str], length: int, depth: float, needle: Needle, sentences: list[str], sizes: list[int]) -> NeedleTest:
    """The test's prompt: the haystack's sentences (read again from the start when they run out) while the prompt
    fits in length tokens, the needle between them at the depth, in the frame (prompt_frame)."""
    head, tail = frame
    question = QUESTION.format(question=needle.question) + tail
    fixed = len(tokenizer.encode_batch([head + needle.sentence + question])[0])
    taken, room = [], length - fixed
    while room > 0:  # sentence sizes are counted on their own; the prompt's real count is checked below
        index = len(taken) % len(sentences)
        if sizes[index] > room:
            break
        taken.append(sentences[index])
        room -= sizes[index]
    while True:
        split = round(depth * len(taken))
        before = head + " ".join(taken[:split] + [needle.sentence])  # the haystack up to the needle, then it
        after = " ".join(taken[split:])
        prompt = before + (" " + after if after else "") + question
        prompt_ids = tokenizer.encode_batch([prompt])[0]
        if len(prompt_ids) <= length or not taken:
            break
        taken.pop()  # a sentence's tokens joined may differ from its own count: one fewer
    if len(prompt_ids) > length:
        raise AttnvizError(f"length {length:,}: too short for the needle and its question ({len(prompt_ids):,} tokens)")
    before_ids, through_ids = tokenizer.encode_batch([head + " ".join(taken[:split]), before])  # "": the tokens put first (<s>)
    if prompt_ids[: len(before_ids)] != before_ids or prompt_ids[: len(through_ids)] != through_ids:
        raise AttnvizError("the tokenizer splits the needle otherwise within the prompt: its span cannot be told")
    return NeedleTest(length, depth, needle, prompt, prompt_ids, (len(before_ids), len(through_ids)))


def words(text: str) -> list[str]:
    """ROUGE's words (Lin 2004, as rouge_score tokenizes them, without stemming): lowercase runs of letters and digits."""
    return re.findall(r"[a-z0-9]+", text.lower())


def rouge1_recall(needle: str, answer: str) -> float:
    """ROUGE-1 recall of the needle by the answer: the needle's words the answer has (each as often as both have it)
    over the needle's words."""
    reference, candidate = Counter(words(needle)), Counter(words(answer))
    total = sum(reference.values())
    return sum((reference & candidate).values()) / total if total else 0.0

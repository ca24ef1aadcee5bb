"""Retrieval heads (analysis/retrieval.py) over a grid of needle-in-a-haystack tests, on this process or on Ray, and
their record: what roles.json holds under its retrieval keys (docs/formats.md, "roles.json: retrieval").

The stage writes no file: an interrupted run leaves nothing behind, and the file that records it is written all or
nothing by whoever writes it (output/runs.py's staging folder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from attnviz.analysis.generation import check_decoder
from attnviz.analysis.needles import NEEDLES_FOLDER, needle_tests
from attnviz.analysis.retrieval import (
    ANSWER_TOKENS, DEFINITION, DEPTHS, KEEP_RECALL, LENGTHS, PAPER, RETRIEVAL_THRESHOLD, NeedleResult, mean_of_kept, run_needle_test,
)
from attnviz.errors import AttnvizError
from attnviz.output.summaries_json import DECIMALS
from attnviz.spec import RunSpec

ENGINES = ("local", "ray")


@dataclass
class RetrievalHeads:
    """scores (L, H) in [0, 1]: each head's retrieval score, the mean over the kept tests; tests: every test's
    NeedleResult (its length, depth, needle span, answer ids, ROUGE-1 recall, kept, scores), in the grid's order."""

    scores: np.ndarray
    tests: list[NeedleResult]
    lengths: list[int] = field(default_factory=list)
    depths: list[float] = field(default_factory=list)
    answer_tokens: int = ANSWER_TOKENS

    @property
    def kept(self) -> int:
        """How many tests were kept (their answer's ROUGE-1 recall of the needle above KEEP_RECALL)."""
        return sum(result.kept for result in self.tests)

    def record(self) -> dict:
        """What roles.json holds for retrieval, keyed as roles.json is: merge each top-level dict into roles.json's
        own ("scores", "thresholds", "definitions", "papers") and add "retrieval"."""
        return {
            "scores": {"retrieval": np.round(self.scores, DECIMALS).tolist()},  # scores["retrieval"][layer][head]
            "thresholds": {"retrieval": RETRIEVAL_THRESHOLD},
            "definitions": {"retrieval": DEFINITION},
            "papers": {"retrieval": PAPER},
            "retrieval": {
                "lengths": self.lengths,
                "depths": self.depths,
                "answer_tokens": self.answer_tokens,
                "keep_recall": KEEP_RECALL,
                "tests_kept": self.kept,
                "tests": [_test_record(result) for result in self.tests],
            },
        }


def _test_record(result: NeedleResult) -> dict:
    test = result.test
    return {
        "length": test.length,
        "depth": test.depth,
        "prompt_tokens": len(test.prompt_ids),
        "needle": test.needle.sentence,
        "question": test.needle.question,
        "needle_span": list(test.needle_span),  # [start, end) token positions in the prompt
        "needle_ids": test.needle_ids,
        "ids": result.ids,  # the answer's generated ids
        "answer": result.answer,
        "rouge1_recall": round(result.recall, DECIMALS),
        "kept": result.kept,
    }


def planned_tests(loaded, lengths=LENGTHS, depths=DEPTHS, answer_tokens: int = ANSWER_TOKENS, engine: str = "local",
                  folder: Path = NEEDLES_FOLDER) -> list:  # fmt: skip
    """The needle tests of lengths x depths (analysis/needles.py), refused in one line before any generation: a model
    that is not a decoder, a length past its context, a depth outside [0, 1], an unknown engine."""
    if engine not in ENGINES:
        raise AttnvizError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    check_decoder(loaded, "retrieval")
    if answer_tokens < 1:
        raise AttnvizError(f"answer tokens {answer_tokens}: at least 1")
    return needle_tests(loaded.tokenizer, lengths, depths, loaded.max_positions, answer_tokens, folder, loaded.name)


def retrieval_heads(
    loaded,
    spec: RunSpec,
    *,
    lengths=LENGTHS,
    depths=DEPTHS,
    answer_tokens: int = ANSWER_TOKENS,
    engine: str = "local",
    model_name: str | None = None,
    loading: dict | None = None,
    engine_device: str | None = None,
    advance: Callable[[int], None] = lambda done: None,
    folder: Path = NEEDLES_FOLDER,
    tests: list | None = None,
) -> RetrievalHeads:
    """Every head's retrieval score over the needle tests of lengths x depths (analysis/needles.py), each generated
    greedily with up to answer_tokens tokens. Refused before any generation: a model that is not a decoder, a length
    past its context, a depth outside [0, 1], an unknown engine.

    engine "ray": the tests go to Ray actors (output/ray_engine.py) that load model_name themselves (the name or
    folder as given, with loading's options, as `stats --file --engine ray` does), on engine_device (spec.device by default); the result
    equals the local one. advance(1) after each test. folder: the haystack and needles (attnviz/analysis/data/).
    tests: planned_tests' (checked before other work), else planned here.
    """
    if tests is None:
        tests = planned_tests(loaded, lengths, depths, answer_tokens, engine, folder)
    if engine == "ray":
        from attnviz.output.ray_engine import ray_needle_results, require_ray

        require_ray()
        actor_spec = replace(spec, device=engine_device or spec.device)
        results = ray_needle_results(tests, answer_tokens, model_name, actor_spec, loading or {}, advance)
    else:
        results = []
        for test in tests:
            results.append(run_needle_test(loaded, spec, test, answer_tokens))
            advance(1)
    return RetrievalHeads(mean_of_kept(results), results, [int(length) for length in lengths], [float(depth) for depth in depths], answer_tokens)

"""`attnviz compare`: one layer's projections split into different numbers of heads, pretrained or random.

W_q, W_k and W_v stay the same; only the split changes. With H heads, head h scores the
queries against the keys with its own d = D / H columns of the projections, so one head sees
all D dimensions at once and many heads each see a thin slice. A random layer (the tutorials'
setting) is the same shape with untrained weights: its maps come out almost uniform.

A pretrained split into another number of heads than the model's own re-cuts weights that were
trained for the model's heads: with H trained heads whose scores are S_h = Q_h K_h^T / sqrt(d),
one head of all D columns scores Q K^T / sqrt(D) = sum_h S_h / sqrt(H). It shows those weights
re-split, not what a model trained with one head would learn (resplit_note says so).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from attnviz.analysis.statistics import HeadSummary, summarize_heads
from attnviz.errors import AttnvizError
from attnviz.run_data import AttentionRun
from attnviz.spec import RunSpec

@dataclass
class Split:
    """One way of running the layer: these weights split into this many heads."""

    weights: str
    run: AttentionRun
    summaries: list[HeadSummary]
    model_heads: int  # the number of heads the model was trained with

    @property
    def num_heads(self) -> int:
        return self.run.num_heads

    @property
    def mean_relative_entropy(self) -> float:
        return sum(s.relative_entropy for s in self.summaries) / len(self.summaries)

    @property
    def mean_max(self) -> float:
        return sum(s.mean_max for s in self.summaries) / len(self.summaries)

    @property
    def most_focused(self) -> HeadSummary:
        return min(self.summaries, key=lambda summary: summary.relative_entropy)

    @property
    def broadest(self) -> HeadSummary:
        return max(self.summaries, key=lambda summary: summary.relative_entropy)


def _comma_list(spec: str, option: str) -> list[str]:
    items = [item.strip() for item in spec.split(",")]
    if not all(items):
        raise AttnvizError(f"{option} takes a comma list without empty items, e.g. {option} 1,4,12; got {spec!r}")
    return list(dict.fromkeys(items))  # each once, in the order given


def parse_head_counts(spec: str) -> list[int]:
    """ "1,4,12" -> [1, 4, 12]. Whether each divides the model size is checked with the model."""
    counts = []
    for item in _comma_list(spec, "--heads"):
        if not item.isdigit() or int(item) < 1:
            raise AttnvizError(f"--heads takes head counts such as 1,4,12: {item!r} is not a positive whole number")
        counts.append(int(item))
    return counts


def parse_weights(spec: str) -> list[str]:
    """ "pretrained,random" -> ["pretrained", "random"]."""
    from attnviz.spec import WEIGHTS

    weights = _comma_list(spec, "--weights")
    for item in weights:
        if item not in WEIGHTS:
            raise AttnvizError(f"--weights: unknown weights {item!r}; choose from {', '.join(WEIGHTS)}")
    return weights


def default_head_counts(model_size: int, model_heads: int) -> list[int]:
    """One head, four heads and the model's own number, where they divide the model size."""
    return sorted({count for count in (1, 4, model_heads) if model_size % count == 0})


def compare_splits(
    loaded,
    text: str,
    head_counts: list[int],
    weights: list[str],
    spec: RunSpec,
) -> list[Split]:
    """Every combination, weights first: [(pretrained, 1), (pretrained, 4), ..., (random, 1), ...].

    spec holds what the splits share (layer, seed, device, truncate); each split runs with its
    own head count and weights in their place. A random layer is built from the same seed for every head count, so its W_q, W_k and W_v
    are the same across the counts too, exactly as BERT's are.
    """
    from attnviz.attention.layer import check_num_heads
    from attnviz.pipeline import run_attention

    for count in head_counts:
        check_num_heads(loaded.hidden_size, count)
    splits = []
    for weight in weights:
        for count in head_counts:
            (run,) = run_attention(loaded, [text], replace(spec, num_heads=count, weights=weight))
            splits.append(Split(weight, run, summarize_heads(run.attention), loaded.num_heads))
    return splits


def resplit_note(splits: list[Split]) -> str | None:
    """What pretrained splits into other head counts than the model's own show; None when there are none."""
    resplit = [split for split in splits if split.weights == "pretrained" and split.num_heads != split.model_heads]
    if not resplit:
        return None
    trained = resplit[0].model_heads
    return (
        f"Every pretrained split but {trained} heads re-cuts weights trained for the model's {trained} heads "
        f"(1 head is exactly softmax(Σₕ Sₕ / √{trained}) of their scores Sₕ):\n"
        f"it shows those weights re-split, not what a model trained with that many heads would learn."
    )

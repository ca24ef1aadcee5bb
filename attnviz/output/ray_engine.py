"""`stats --file --engine ray`: the corpus' shards measured on Ray actors, merged on this process (the driver).

The only module that imports ray (an import-linter contract), and only when --engine ray runs.
ray.init(address=RAY_ADDRESS) joins a running cluster (RAY_ADDRESS=auto: the one `ray start` runs on
this machine); without RAY_ADDRESS, a new local instance for the run (address "local", stopped
after it): never a cluster Ray guesses from a file a stopped one may have left in /tmp/ray. Each actor loads the model once, by name or folder,
with the same loader as this process (models.loading.load_model): no torch module is ever pickled,
only texts go out and plain numpy states (analysis/accumulate.py) come back. An actor that dies
mid-shard is restarted by Ray and the shard retried (max_restarts, max_task_retries); the driver
keys every result by its shard index and merges each exactly once, in shard order, so a retry
never counts a text twice and a checkpoint always covers a prefix of the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from attnviz.errors import AttnvizError
from attnviz.spec import RunSpec

RAY_EXTRA = 'pip install "attnviz[ray]"'
IN_FLIGHT_PER_ACTOR = 2  # shards queued on an actor (one running, one waiting) and not yet merged
RESTARTS = 4  # how often Ray restarts a dead actor, and retries a shard it died on


def require_ray() -> None:
    """Refuse --engine ray, before any work, where the extra is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise AttnvizError(f"--engine ray needs Ray, which is not installed: {RAY_EXTRA}") from None


def actor_device(requested: str) -> str:
    """The actors' device: cuda (a GPU each) as asked, even where this process has none; auto as this process sees it."""
    from attnviz.layer_inputs import resolve_device

    return "cuda" if requested == "cuda" else resolve_device(requested)


class StatsShardWorker:
    """A Ray actor's state: the model loaded once, then any number of shards measured into fresh accumulators."""

    def __init__(self, model_name: str | None, spec: RunSpec, allow_pickle: bool, threads: int):
        import torch

        from attnviz.analysis.stats_pass import HeadsMeasurer
        from attnviz.models.loading import load_model

        torch.set_num_threads(threads)  # the CPUs Ray gave this actor, not every core of the node
        self.measurer = HeadsMeasurer(load_model(model_name, spec.device, dtype=spec.dtype, allow_pickle=allow_pickle), spec)

    def measure(self, texts: list[str]) -> tuple[dict, list[str]]:
        """The shard's accumulator state and notes."""
        accumulator = self.measurer.accumulator()
        notes, _ = self.measurer.measure(texts, accumulator)
        return accumulator.state(), notes


def ray_shard_states(
    shards: Iterator, model_name: str | None, spec: RunSpec, allow_pickle: bool, advance: Callable[[int], None]
) -> Iterator[tuple[object, dict, list[str]]]:
    """(shard, state, notes) of every shard, in shard order, measured by Ray actors: one per GPU with cuda, else one per CPU."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=os.environ.get("RAY_ADDRESS") or "local", logging_level="ERROR", include_dashboard=False)
    actors = []
    try:
        resources = ray.cluster_resources()
        cuda = spec.device == "cuda"
        count = int(resources.get("GPU", 0)) if cuda else max(1, int(resources.get("CPU", 1)))
        if count == 0:
            raise AttnvizError("--engine ray --device cuda: the Ray cluster has no GPU (ray start --num-gpus N)")
        worker = ray.remote(max_restarts=RESTARTS, max_task_retries=RESTARTS)(StatsShardWorker)
        actors = [
            worker.options(num_cpus=1, num_gpus=1 if cuda else 0).remote(model_name, spec, allow_pickle, 1)
            for _ in range(count)
        ]
        yield from _in_order(ray, actors, shards, advance)
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()


def _in_order(ray, actors: list, shards: Iterator, advance) -> Iterator[tuple[object, dict, list[str]]]:
    """Hand shards to the least busy actor, at most IN_FLIGHT_PER_ACTOR each; yield results by shard index, once each."""
    pending: dict = {}  # ObjectRef -> (shard, actor index)
    finished: dict[int, tuple] = {}  # shard index -> (shard, state, notes), until the shards before it are in
    busy = [0] * len(actors)
    upcoming, next_index = iter(shards), None
    while True:
        while len(pending) + len(finished) < IN_FLIGHT_PER_ACTOR * len(actors):
            shard = next(upcoming, None)
            if shard is None:
                break
            next_index = shard.index if next_index is None else next_index
            choice = min(range(len(actors)), key=busy.__getitem__)
            pending[actors[choice].measure.remote([entry.text for entry in shard.lines])] = (shard, choice)
            busy[choice] += 1
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            shard, choice = pending.pop(ref)
            busy[choice] -= 1
            state, notes = ray.get(ref)  # a retried shard's ref resolves once, with the retry's result
            finished[shard.index] = (shard, state, notes)
            advance(len(shard.lines))
        while next_index in finished:
            yield finished.pop(next_index)
            next_index += 1

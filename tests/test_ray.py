"""`attnviz stats --file --engine ray` on a local Ray instance of 2 CPUs, started here.

The statistics equal the single-process run's, and an actor killed (SIGKILL) while it measures a
shard is restarted by Ray, the shard retried, and every text still counted exactly once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray", reason='the ray extra is not installed: pip install -e ".[test,ray]"')

from attnviz.cli import run  # noqa: E402
from stream_corpus import build_tiny_bert, corpus_lines, stats_numbers, write_corpus  # noqa: E402

ROUNDED = 1e-6  # stats.json keeps 7 decimals
WORKER_TITLE = b"ray::StatsShardWorker.measure"  # the process title Ray gives an actor while it runs measure()


@pytest.fixture(scope="module")
def local_ray():
    previous = os.environ.pop("RAY_ADDRESS", None)  # a local instance, never a cluster this machine may know of
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")  # "local": a new instance, always
    yield
    ray.shutdown()
    if previous is not None:
        os.environ["RAY_ADDRESS"] = previous


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", corpus_lines(1200, seed=7, max_words=16))


@pytest.fixture(scope="module")
def single_process(tiny, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "run"
    assert run(["stats", "--file", str(corpus), "--model", str(tiny), "--js", "--out", str(out)]) == 0
    return stats_numbers(out)


def stats_on_ray(tiny, corpus, out: Path) -> tuple:
    assert run(["stats", "--file", str(corpus), "--model", str(tiny), "--engine", "ray", "--chunk-lines", "60", "--js", "--out", str(out)]) == 0
    return stats_numbers(out)


def assert_same(ray_run, single):
    np.testing.assert_allclose(ray_run[0], single[0], rtol=0, atol=ROUNDED)
    np.testing.assert_allclose(ray_run[1], single[1], rtol=0, atol=ROUNDED)
    assert ray_run[2]["num_texts"] == single[2]["num_texts"] == 1200 and ray_run[2]["corpus"] == single[2]["corpus"]


def test_ray_statistics_equal_the_single_process_ones(local_ray, tiny, corpus, single_process, tmp_path):
    assert_same(stats_on_ray(tiny, corpus, tmp_path / "ray"), single_process)


def descendants(root: int) -> set[int]:
    """Every process under root (Ray's raylet and its workers, started by ray.init in this process)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_first_measuring_worker(killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the first of this test's Ray workers seen measuring a shard, once."""
    while not stop.is_set():
        for pid in descendants(os.getpid()):
            try:
                measuring = Path(f"/proc/{pid}/cmdline").read_bytes().startswith(WORKER_TITLE)
            except OSError:
                continue
            if measuring:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.002)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds Ray's worker processes through Linux's /proc")
def test_an_actor_killed_mid_shard_is_retried_without_counting_twice(local_ray, tiny, corpus, single_process, tmp_path):
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=kill_first_measuring_worker, args=(killed, stop), daemon=True)
    killer.start()
    try:
        result = stats_on_ray(tiny, corpus, tmp_path / "ray")
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 1, "no actor was seen measuring: nothing was killed"
    assert_same(result, single_process)

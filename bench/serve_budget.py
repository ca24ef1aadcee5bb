"""`attnviz serve`'s answer time on a warm model, and under load (issue 39's budget: a 32-token text on SmolLM2 in
at most 0.3 s).

    python bench/serve_budget.py [--model smollm2] [--rounds 20] [--clients 8] [--requests 50]

Starts `attnviz serve` in a process of its own (this checkout, the CPU), reads its URL from the first line, asks
once to warm it, then times --rounds requests of the same 32-token text, one after another, as a script asks them
(urllib, a new connection each): POST /api/heads as attention.json's record and as the report's (what the page asks).
Then --clients threads send --requests each, every text different, at once: every answer is checked to be its own
text's, and the latencies' p50 and p95 are printed, with the requests a second, and the server's peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TEXT = (  # 32 tokens of SmolLM2
    "The cat sat on the warm mat because the sun had shone on it all morning, and the old dog watched it quietly from the open "
    "kitchen door all day."
)


def post(base: str, token: str, body: dict) -> tuple[float, dict]:
    request = urllib.request.Request(
        f"{base}/api/heads", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    return time.perf_counter() - start, answer


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50)
    arguments = parser.parse_args()
    environment = {**os.environ, "PYTHONPATH": str(HERE), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "attnviz", "serve", "--model", arguments.model, "--device", "cpu", "--port", "0"]
    started = time.perf_counter()
    server = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = server.stdout.readline().strip()
        print(f"started and loaded in {time.perf_counter() - started:.2f} s: {url.split('?')[0]}")
        base, token = url.split("/?token=")
        _, warm = post(base, token, {"text": TEXT, "layer": 3})
        print(f"{len(warm['query_tokens'])} tokens, {arguments.model} layer 3, {warm['num_heads']} heads")
        for answer in ("attention", "report"):
            times = [post(base, token, {"text": TEXT, "layer": 3, "as": answer})[0] for _ in range(arguments.rounds)]
            print(
                f'as "{answer}": median {statistics.median(times):.4f} s of {arguments.rounds}, '
                f"range {min(times):.4f} to {max(times):.4f} s (budget 0.3 s)"
            )
        latencies, wrong = [], []

        def client(index: int) -> None:
            for number in range(arguments.requests):
                text = f"Client {index} asks, for the {number}th time, what the cat on the mat was thinking about."
                seconds, record = post(base, token, {"text": text, "layer": number % 6})
                latencies.append(seconds)
                if record["text"] != text or record["layer"] != number % 6:
                    wrong.append((index, number))

        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(index,)) for index in range(arguments.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        total = arguments.clients * arguments.requests
        print(
            f"{arguments.clients} clients x {arguments.requests} requests: {len(latencies)} of {total} answered, "
            f"{len(wrong)} not their own; p50 {percentile(latencies, 0.5):.4f} s, p95 {percentile(latencies, 0.95):.4f} s, "
            f"{len(latencies) / wall:.1f} requests/s"
        )
    finally:
        print(f"the server's peak memory: {peak_mb(server.pid)}")
        server.terminate()
        server.wait()


def peak_mb(pid: int) -> str:
    """A process's peak resident memory (Linux's VmHWM), or why it is not known."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(f"{int(line.split()[1]) / 1024:,.0f} MB" for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return "not known here (Linux's /proc)"


if __name__ == "__main__":
    main()

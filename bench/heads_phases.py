"""Where `attnviz heads TEXT` spends its CPU: one fresh process, the imports timed one library at a time, then the
command (its console entry, main) with a CPU timer around each of its stages and the garbage collector's passes.

    python bench/heads_phases.py [--text 我想吃酸菜鱼] [--repeat 3]

Each repeat is a new process (this script run again with --one); prints each phase's median CPU seconds
(time.process_time). The stages nest: a figure group's line includes its layout and its PNGs' lines, and every line
its share of the garbage collector's passes, also counted apart. The imports come first here, where the command
makes them as it goes (so its start-up's gc.freeze comes after them: the passes in the imports are a little dearer
than in the command itself). Offline, the bundled model on the CPU, as bench/startup_before_after.py runs it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

IMPORTS = {  # what the command imports, in the order it does, a library at a time
    "import attnviz.cli (typer, rich, pydantic)": ["attnviz.cli.main"],
    "import torch": ["torch"],
    "import attnviz's stages": ["attnviz.api.functions", "attnviz.api.report", "attnviz.pipeline", "attnviz.tracing",
                                "attnviz.output.export", "attnviz.html.page", "attnviz.render.terminal"],
    "import matplotlib (Figure, Agg)": ["matplotlib.figure", "matplotlib.backends.backend_agg"],
    "import fontTools.subset": ["fontTools.subset"],
}
STAGES = [  # (module, function): each timed where the command calls it
    ("attnviz.api.models", "load", "model load (weights, tokenizer)"),
    ("attnviz.api.functions", "heads", "the run (attnviz.heads, model load included)"),
    ("attnviz.api.report", "report_of_runs", "report.html's assembly (every layer, traces, vectors)"),
    ("attnviz.cli.heads", "print_heads", "the terminal's table"),
    ("attnviz.render.heatmap", "write_head_heatmaps", "head_XX.png × 12 (one figure, blitted)"),
    ("attnviz.render.heatmap", "write_heads_grid", "heads.png (the grid)"),
    ("attnviz.render.heatmap", "freeze_layout", "  constrained layouts (head figure and grid, once each)"),
    ("attnviz.render.png", "write_canvas_png", "  heads.png's draw and PNG"),
    ("attnviz.output.export", "write_attention_files", "attention.json"),
    ("attnviz.api.run_results", "ReportResult.write_files", "report.html's page (font subset included)"),
    ("attnviz.html.font", "font_url", "  its CJK font subset (fontTools)"),
]


def one_run(text: str) -> dict[str, float]:
    """This process: the imports, then the command through main(), each phase's CPU seconds."""
    import gc

    cpu: dict[str, float] = {"interpreter start": time.process_time()}
    collections = {"whole": 0.0, "command": 0.0}

    def collector(phase, info, started=[0.0]):
        if phase == "start":
            started[0] = time.process_time()
        else:
            collections["whole"] += time.process_time() - started[0]

    gc.callbacks.append(collector)
    for name, modules in IMPORTS.items():
        start = time.process_time()
        for module in modules:
            importlib.import_module(module)
        cpu[name] = time.process_time() - start
    for module_name, attribute, label in STAGES:
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, _timed(getattr(owner, name), label, cpu))
    before_command = collections["whole"]
    os.environ["HF_HUB_OFFLINE"] = "1"
    start = time.process_time()
    with tempfile.TemporaryDirectory() as folder:
        sys.argv = ["attnviz", "heads", text, "--model", "bundled", "--out", f"{folder}/run"]
        try:
            sys.modules["attnviz.cli.main"].main()
        except SystemExit:
            pass
        cpu["the command (all its stages)"] = time.process_time() - start
    cpu["garbage collector's passes: in the imports above"] = before_command
    cpu["garbage collector's passes: in the command"] = collections["whole"] - before_command
    cpu["process"] = time.process_time()
    return cpu


def _timed(function, label: str, cpu: dict[str, float]):
    @functools.wraps(function)
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            cpu[label] = cpu.get(label, 0.0) + time.process_time() - start

    return timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", default="我想吃酸菜鱼")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a repeat: this process, JSON out
    arguments = parser.parse_args()
    if arguments.one:
        cpu = one_run(arguments.text)
        sys.__stdout__.write("PHASES " + json.dumps(cpu) + "\n")
        return
    runs = []
    for _ in range(arguments.repeat):
        command = [sys.executable, __file__, "--one", "--text", arguments.text]
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(output.split("PHASES ", 1)[1]))
    for phase in runs[0]:
        values = [run.get(phase, 0.0) for run in runs]
        print(f"{phase:50s} {statistics.median(values):.3f} s ({min(values):.3f} to {max(values):.3f})")


if __name__ == "__main__":
    main()

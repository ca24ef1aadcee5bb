"""Where `attnviz heads TEXT` spends its CPU: one fresh process runs the command (its console entry, main) with a CPU
timer around each of its stages, each heavy library's imports and the garbage collector's passes.

    python bench/heads_phases.py [--text 我想吃酸菜鱼] [--repeat 3]

Each repeat is a new process (this script run again with --one); prints each phase's median CPU seconds
(time.process_time). The stages nest: a stage's line includes the imports it makes (torch's in the model load,
matplotlib's in the first figure, fontTools' in report.html's page, also counted apart), a figure group's line its
layout and its PNGs' lines, and every line its share of the garbage collector's passes, also counted apart.
Offline, the bundled model on the CPU, as bench/startup_before_after.py runs it.
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

LIBRARIES = ("torch", "transformers", "matplotlib", "fontTools")  # each one's imports timed where the command makes them
STAGES = [  # (module, function, label): each function timed where the command calls it
    ("attnviz.api.models", "load", "model load (weights, tokenizer; torch's import included)"),
    ("attnviz.api.functions", "heads", "the run (attnviz.heads, model load included)"),
    ("attnviz.api.report_parts", "report_of_parts", "report.html's assembly (from the run's capture)"),
    ("attnviz.cli.heads", "print_heads", "the terminal's table"),
    ("attnviz.render.heatmap", "write_heatmaps", "head_XX.png × 12 and heads.png (one figure blitted, the grid)"),
    ("attnviz.render.heatmap", "_HeadFigure.save", "  head_XX.png × 12 (one figure, blitted)"),
    ("attnviz.render.heatmap", "freeze_layout", "  constrained layouts (head figure and grid, once each)"),
    ("attnviz.render.png", "write_canvas_png", "  heads.png's draw and PNG"),
    ("attnviz.output.export", "write_attention_files", "attention.json"),
    ("attnviz.api.run_results", "ReportResult.write_files", "report.html's page (font subset included)"),
]
FONT_SUBSET = "  its CJK font subset (html.font.font_url)"  # html.font's font_url: timed from report.html's page on (attnviz.html
# imports torch: wrapped before the command, it would move torch's import ahead of main's gc.freeze)


def one_run(text: str) -> dict[str, float]:
    """This process: the command through main(), each phase's CPU seconds and the libraries' imports (made where the
    command makes them, timed by a wrapper of __import__)."""
    import builtins
    import gc

    cpu: dict[str, float] = {"interpreter start": time.process_time()}
    passes = {"all": 0.0, "in imports": 0.0}
    importing = []  # the library whose import is under way, if any

    def collector(phase, info, started=[0.0]):
        if phase == "start":
            started[0] = time.process_time()
        else:
            passes["all"] += time.process_time() - started[0]
            passes["in imports"] += (time.process_time() - started[0]) if importing else 0.0

    gc.callbacks.append(collector)
    start = time.process_time()
    importlib.import_module("attnviz.cli.main")
    cpu["import attnviz.cli (typer, rich, pydantic)"] = time.process_time() - start
    plain_import = builtins.__import__

    def timed_import(name, *args, **kwargs):
        library = name.split(".")[0]
        if importing or library not in LIBRARIES:  # the outermost import of a library (a few µs once it is there)
            return plain_import(name, *args, **kwargs)
        importing.append(library)
        start = time.process_time()
        try:
            return plain_import(name, *args, **kwargs)
        finally:
            importing.pop()
            key = f"import {library}"
            cpu[key] = cpu.get(key, 0.0) + time.process_time() - start

    builtins.__import__ = timed_import
    for library in LIBRARIES:
        cpu[f"import {library}"] = 0.0
    for module_name, attribute, label in STAGES:
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, _timed(getattr(owner, name), label, cpu))
    report_class = sys.modules["attnviz.api.run_results"].ReportResult
    write_report = report_class.write_files

    def write_report_timing_the_font(self, *args, **kwargs):
        font = importlib.import_module("attnviz.html.font")
        font.font_url = _timed(font.font_url, FONT_SUBSET, cpu)
        return write_report(self, *args, **kwargs)

    report_class.write_files = write_report_timing_the_font
    os.environ["HF_HUB_OFFLINE"] = "1"
    start = time.process_time()
    with tempfile.TemporaryDirectory() as folder:
        sys.argv = ["attnviz", "heads", text, "--model", "bundled", "--out", f"{folder}/run"]
        try:
            sys.modules["attnviz.cli.main"].main()
        except SystemExit:
            pass
        cpu["the command (all its stages, imports included)"] = time.process_time() - start
    cpu["garbage collector's passes (all, in the lines above)"] = passes["all"]
    cpu["  of which during the libraries' imports"] = passes["in imports"]
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

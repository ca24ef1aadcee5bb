"""attnviz: see and check what multi-head attention does.

A subpackage per stage and per face (docs/architecture.md), imports pointing one way, from the
top down: cli, api, output, render, analysis and trace, pipeline, models, attention, and the
base (spec, result, errors, text, version). pyproject.toml's import-linter contract states it.
Nothing here imports the command line, or torch: heavy libraries load on first use.

As a library (README.md, "Python"; docs/python.md):

    import attnviz
    model = attnviz.load("bundled")
    result = attnviz.heads("我想吃酸菜鱼", model=model)
    result.attention  # torch.Tensor (H, Nq, Nk)

`import attnviz` stays cheap: the public names below are looked up on first use (PEP 562), and
torch, transformers and matplotlib load only when a function runs.
"""

from attnviz.version import __version__

# public name -> the module that defines it
_PUBLIC = {
    "load": "attnviz.api.models",
    "Model": "attnviz.api.models",
    "heads": "attnviz.api.functions",
    "trace": "attnviz.api.functions",
    "stats": "attnviz.api.functions",
    "layers": "attnviz.api.functions",
    "compare": "attnviz.api.functions",
    "position": "attnviz.api.functions",
    "heads_file": "attnviz.api.file_runs",
    "stats_file": "attnviz.api.file_runs",
    "diff": "attnviz.api.diff",
    "generate": "attnviz.api.generate",
    "patch": "attnviz.api.patch",
    "report": "attnviz.api.report",
    "roles": "attnviz.api.roles",
    "why": "attnviz.api.why",
    "compose": "attnviz.api.compose",
    "HeadsResult": "attnviz.api.run_results",
    "TraceResult": "attnviz.api.trace_results",
    "HeadsFileResult": "attnviz.api.file_runs",
    "TraceStep": "attnviz.api.trace_results",
    "StatsResult": "attnviz.api.experiment_results",
    "LayersResult": "attnviz.api.experiment_results",
    "CompareResult": "attnviz.api.compare_results",
    "PositionResult": "attnviz.api.compare_results",
    "DiffResult": "attnviz.api.diff",
    "GenerateResult": "attnviz.api.generate",
    "PatchResult": "attnviz.api.patch",
    "ReportResult": "attnviz.api.report",
    "RolesResult": "attnviz.api.roles",
    "WhyResult": "attnviz.api.why",
    "ComposeResult": "attnviz.api.compose",
    "RunOptions": "attnviz.api.options",
    "RunSpec": "attnviz.spec",
    "AttnvizError": "attnviz.errors",
    "AttnvizWarning": "attnviz.errors",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


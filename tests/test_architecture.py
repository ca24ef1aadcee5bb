"""The layout shows the architecture (docs/architecture.md): imports point one way, and nothing imports in a circle.

The contracts live in pyproject.toml under [tool.importlinter]; `lint-imports` checks them,
imports made inside functions included. The cycle check is computed here as well, from the
same import graph (grimp, which import-linter uses), over every module of attnviz.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "200"}
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout, result.stdout  # none dropped from pyproject.toml
    contracts = ("Layers", "no matplotlib, rich or typer", "Only the command line imports typer", "Only output/ray_engine.py imports ray")
    for contract in (*contracts, "No import cycles"):
        assert contract in result.stdout, contract


def test_no_module_of_attnviz_imports_itself_in_a_circle():
    import grimp

    graph = grimp.build_graph("attnviz", cache_dir=None)
    imports = {module: graph.find_modules_directly_imported_by(module) & graph.modules for module in graph.modules}
    cycles = [sorted(component) for component in strongly_connected(imports) if len(component) > 1]
    assert not cycles, cycles
    assert not [module for module, imported in imports.items() if module in imported]  # nor directly itself


def test_the_cycle_finder_finds_a_cycle():
    """The check above would fail on a cycle: a two-module loop and a three-module loop are found."""
    imports = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(sorted(component) for component in strongly_connected(imports) if len(component) > 1) == [
        ["a", "b"],
        ["c", "d", "e"],
    ]


def strongly_connected(imports: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of the graph module -> modules it imports."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in imports.get(module, ()):
            if imported not in index:
                visit(imported)
                lowest[module] = min(lowest[module], lowest[imported])
            elif imported in on_stack:
                lowest[module] = min(lowest[module], index[imported])
        if lowest[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            components.append(component)

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return components


SETTINGS = {"model", "layer", "num_heads", "heads", "weights", "seed", "causal", "kv_text", "kv", "device", "truncate"}
# A title formats what a figure shows, not a run's settings: compare's title names a list of
# parameters ("pretrained", "random") and the averaged figures no text; run_title feeds it from a run.
NOT_SETTINGS = {"attnviz.render.titles.figure_title"}
# The command line's options and the API's keywords (issue 11: attnviz.heads(text, layer=..., ...))
# are where the settings come in, one by one; both build the RunSpec once and pass it down.
FACES_THAT_TAKE_OPTIONS = {"cli", "api", "__main__"}


def test_below_the_command_line_the_settings_travel_as_one_runspec():
    """No function below the CLI and the API takes three or more of a run's settings one by one: it takes the RunSpec.

    One or two plain values (a device, a seed for a title) are fine; dataclasses that hold
    results (AttentionRun, TraceResult) and RunSpec itself are not functions that take settings.
    """
    import dataclasses
    import importlib
    import inspect
    import pkgutil

    import attnviz

    trains = []
    for info in pkgutil.walk_packages(attnviz.__path__, "attnviz."):
        if info.name.split(".")[1] in FACES_THAT_TAKE_OPTIONS:
            continue
        module = importlib.import_module(info.name)
        functions = [f for _, f in inspect.getmembers(module, inspect.isfunction) if f.__module__ == info.name]
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name and not dataclasses.is_dataclass(cls):
                functions += [f for _, f in inspect.getmembers(cls, inspect.isfunction)]
        for function in functions:
            settings = SETTINGS & set(inspect.signature(function).parameters)
            if len(settings) >= 3 and f"{info.name}.{function.__qualname__}" not in NOT_SETTINGS:
                trains.append(f"{info.name}.{function.__qualname__}: {sorted(settings)}")
    assert not trains, trains


def test_every_per_head_number_has_its_definition_paper_docs_line_and_test():
    """A per-head number is its entry in analysis/head_numbers.py, its test and its docs line (3 files): every entry has
    a name, one sentence of definition, a paper with its year, a row in docs/measures.md and a test that names it."""
    import re

    from attnviz.analysis.head_numbers import ENTRIES, HEAD_NUMBERS, HEAD_TABLE, STATISTICS, SUMMARY_NAMES

    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "measures.md").read_text(encoding="utf-8")
    tests = "\n".join(path.read_text(encoding="utf-8") for path in (root / "tests").glob("test_*.py") if path.name != Path(__file__).name)
    assert len(HEAD_NUMBERS) == len(ENTRIES)  # one entry a name
    assert {*STATISTICS, *SUMMARY_NAMES, *HEAD_TABLE} <= set(HEAD_NUMBERS)
    for entry in ENTRIES:
        assert re.fullmatch(r"[a-z_0-9]+", entry.name) and entry.title, entry
        assert entry.definition and not entry.definition.rstrip().endswith(".") and ". " not in entry.definition, entry.name  # one sentence
        assert re.search(r"\b(19|20)\d\d\b", entry.paper), f"{entry.name}: its paper, with its year"
        assert f"| `{entry.name}` |" in docs, f"{entry.name}: no row in docs/measures.md"
        assert f'"{entry.name}"' in tests, f"{entry.name}: no test names it"


# What runs the model over a text (issue 45: one pass, one capture): the pipeline's runs and captures, the trace's, and
# the report parts' functions that take their own passes where no capture is given.
RUNS_THE_MODEL = {
    "run_attention", "run_layers", "layer_pass", "iter_layer_runs", "capture_texts", "capture_states", "layer_states",
    "trace_texts", "run_and_summarise", "summarise_layers", "report_texts", "text_report", "report_of_runs", "captured_report",
    "blocks_in_place", "summarise_in_place", "summarise_blocks", "iter_layer_blocks", "iter_layer_passes", "iter_layer_weights",
}  # fmt: skip
# A result holds what its faces show: its .report(), .write_files() and figures assemble from it, and the report's
# record and page are written from the parts the API function made while the capture was at hand.
RESULTS_AND_THE_REPORTS_WRITER = ("api/run_results.py", "api/experiment_results.py", "html")


def names_in(source: str) -> set[str]:
    """Every name a module's source uses: its names, attributes and the names it imports."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(source)):
        names |= {getattr(node, "id", None), getattr(node, "attr", None)}
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.name for alias in node.names}
    return names - {None}


def test_results_and_the_reports_writer_never_name_what_runs_the_model():
    from pathlib import Path

    import attnviz

    root = Path(attnviz.__file__).parent
    parts = [root / part for part in RESULTS_AND_THE_REPORTS_WRITER]
    paths = [path for part in parts for path in (part.rglob("*.py") if part.is_dir() else [part])]
    assert len(paths) > 3
    named = [f"{path.relative_to(root)}: {name}" for path in paths for name in names_in(path.read_text(encoding="utf-8")) & RUNS_THE_MODEL]
    assert not named, named


# Results defined beside the API function that makes them (and runs the model): the result's class alone is held to it.
RESULTS_BESIDE_THEIR_FUNCTION = {"api/diff.py": "DiffResult", "api/generate.py": "GenerateResult", "api/patch.py": "PatchResult",
                                "api/compose.py": "ComposeResult"}


def test_results_beside_their_function_never_name_what_runs_the_model():
    import ast
    from pathlib import Path

    import attnviz

    root = Path(attnviz.__file__).parent
    named = []
    for path, name in RESULTS_BESIDE_THEIR_FUNCTION.items():
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        (result,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
        named += [f"{path} {name}: {each}" for each in names_in(ast.unparse(result)) & RUNS_THE_MODEL]
    assert not named, named


def test_the_check_of_what_runs_the_model_finds_an_import_and_a_call():
    source = "def report(self):\n    from attnviz.pipeline import run_layers\n    return pipeline.run_attention(self.loaded)\n"
    assert names_in(source) & RUNS_THE_MODEL == {"run_layers", "run_attention"}

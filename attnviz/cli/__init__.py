"""The command line: parse options, call the API (attnviz.api), print. Nothing imports this package.

options (the Typer app, its consoles, choices and shared options), one module per group of
commands (heads, every_layer: stats and layers, experiments: compare and position,
trace_command), shared (the output folder, the settings, checked before any work), and main
(running a command: one-line errors, exit codes, signals). Heavy libraries (torch,
transformers, matplotlib) are imported inside the commands, so that `attnviz --help` stays instant.
"""

from attnviz.cli.main import app, main, run
from attnviz.cli.options import Layout, Mistake

__all__ = ["Layout", "Mistake", "app", "main", "run"]

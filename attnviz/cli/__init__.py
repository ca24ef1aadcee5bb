"""The command line: parse options, call the API (attnviz.api), print. Nothing imports this package.

options (the Typer app, its consoles, choices and shared options, and run_options: a command's
parameters as the API's RunOptions), one module per command (heads, report, stats, layers,
compare, position, diff, generate, trace, models: its parameters, its call, what it prints), shared
(run_command: what every command does around its computation, the output folder checked before any
work, the files written all or nothing), and main (running a command: one-line errors, exit codes,
signals, options named as flags in messages). Heavy libraries (torch,
transformers, matplotlib) are imported inside the commands, so that `attnviz --help` stays instant.
"""

from attnviz.cli.main import app, main, run
from attnviz.cli.options import Layout, Mistake

__all__ = ["Layout", "Mistake", "app", "main", "run"]

"""`python -m attnviz` and the `attnviz` command.

The first thing they do is catch SIGINT, SIGTERM and SIGHUP: a signal during the imports (a second or more with
torch) ends the run at once and quietly, as nothing is written yet. The command line sets its own handlers once it
runs (output/runs.py: a run folder half written is removed). Only the interpreter's own start, before this module
runs, keeps Python's default.
"""

import os
import signal


def quit_quietly(number, frame) -> None:
    os.write(2, b"interrupted: nothing was written\n")
    os._exit(128 + number)


for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, quit_quietly)


def main() -> None:
    from attnviz.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()

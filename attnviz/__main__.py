"""`python -m attnviz` and the `attnviz` command.

The first thing they do is catch SIGINT, SIGTERM and SIGHUP: a signal during the imports (a second or more with
torch) ends the run at once and quietly, as nothing is written yet. The command line sets its own handlers once it
runs (output/runs.py: a run folder half written is removed). Only the interpreter's own start, before this module
runs, keeps Python's default.

Then the garbage collector's youngest generation is collected every 10,000 allocations instead of 700: importing torch,
transformers and matplotlib makes millions of objects that live until the process ends, and each collection of the
young ones walks them again (0.4 s of the 3.9 s of CPU of `attnviz heads 我想吃酸菜鱼`, bench/RESULTS.md). Cyclic
garbage is still collected, less often; a library user's process keeps Python's default.
"""

import gc
import os
import signal


def quit_quietly(number, frame) -> None:
    os.write(2, b"interrupted: nothing was written\n")
    os._exit(128 + number)


for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, quit_quietly)
gc.set_threshold(10_000, *gc.get_threshold()[1:])


def main() -> None:
    from attnviz.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()

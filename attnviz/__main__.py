"""`python -m attnviz` and the `attnviz` command.

The first thing they do is catch SIGINT, SIGTERM and SIGHUP: a signal during the imports
(a second or more with torch) ends the run at once and quietly, as nothing is written yet.
Only the interpreter's own start, before this module runs, keeps Python's default.
"""

import os

import _signal  # the C module under `signal`, loaded with the interpreter: nothing to import


def _quit(number, frame):
    os.write(2, b"interrupted: nothing was written\n")
    os._exit(128 + number)


for _number in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
    _signal.signal(_number, _quit)


def main() -> None:
    import sys

    if sys.argv[1:] == ["--version"]:  # the whole answer: no command line to build (typer and rich take 50 ms)
        from attnviz.version import package_version

        print(f"attnviz {package_version()}")
        return
    from attnviz.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()

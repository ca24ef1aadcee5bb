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


SAVED_HELP_MIN_COLUMNS = 80  # click wraps help at min(columns, 80) - 2: from 80 columns on, always at 78
SAVED_HELP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli", "help.txt")


def main() -> None:
    import sys

    if sys.argv[1:] == ["--version"]:  # the whole answer: no command line to build (typer and rich take 50 ms)
        from attnviz.version import package_version

        print(f"attnviz {package_version()}")
        return
    if sys.argv[1:] == ["--help"] and _print_saved_help():
        return
    from attnviz.cli import main as command_line

    command_line()


def _print_saved_help() -> bool:
    """`attnviz --help` as typer writes it at 80 columns or more, from attnviz/cli/help.txt; False where it would differ.

    Building the command line to print it takes 70 ms (typer, rich, every command's options);
    tests/test_startup.py checks that the saved text is what typer writes now.
    """
    import shutil
    import sys

    if shutil.get_terminal_size().columns < SAVED_HELP_MIN_COLUMNS or sys.stdout is None:
        return False
    try:
        with open(SAVED_HELP, encoding="utf-8") as saved:
            text = saved.read()
    except OSError:
        return False
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # attnviz --help | head: what was read is enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return True


if __name__ == "__main__":
    main()

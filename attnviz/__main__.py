"""`python -m attnviz` and the `attnviz` command.

The first thing they do is catch SIGINT, SIGTERM and SIGHUP (attnviz/startup.py): a signal during the imports
(a second or more with torch) ends the run at once and quietly, as nothing is written yet. Only the
interpreter's own start, before this module runs, keeps Python's default.
"""

from attnviz import startup

startup.quit_on_signals()


def main() -> None:
    import sys

    if sys.argv[1:] == ["--version"]:  # the whole answer: no command line to build (no typer, no rich)
        from attnviz.version import package_version

        print(f"attnviz {package_version()}")
        return
    if sys.argv[1:] == ["--help"] and startup.print_saved_help():
        return
    from attnviz.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()

"""The commands' progress bar: the texts of `heads --file` and `stats --file`, and the stages of a long run (`roles`'
layers and needle tests, `patch`'s heads, `generate`'s tokens), as the API's progress= argument counts them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text


class Bar:
    """What progress_bar yields: bar(count) after each count units done; bar.stage(what, total) as each stage of a
    run begins (its bar replaces the last one's). So it is the API's progress= argument as it is. Shown only on a
    terminal, and for a total of at least min_total."""

    def __init__(self, console: Console, min_total: int, unit: str):
        self.console, self.min_total, self.unit = console, min_total, unit
        self.shown: Progress | None = None
        self.task = None

    def stage(self, what: str, total: int | None) -> None:
        """A bar over total units (None: counted as they come, with their rate), described by what."""
        self.close()
        if not self.console.is_terminal or (total is not None and total < self.min_total):
            return
        if total is None:
            columns = (TextColumn("{task.description}"), TextColumn(f"{{task.completed:,.0f}} {self.unit}"), _RateColumn(self.unit), TimeElapsedColumn())
        else:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        self.shown = Progress(*columns, console=self.console, transient=True)
        self.shown.start()
        self.task = self.shown.add_task(what, total=total)

    def __call__(self, count: int) -> None:
        if self.shown is not None:
            self.shown.advance(self.task, count)

    def close(self) -> None:
        if self.shown is not None:
            self.shown.stop()
            self.shown = None


@contextmanager
def progress_bar(
    console: Console, total: int | None = None, description: str | None = None, min_total: int = 1, unit: str = "texts"
) -> Iterator[Bar]:
    """A transient progress bar (a Bar): over `total` items described by description when it is given, else over the
    stages the run tells it of (Bar.stage). With the total known: a bar, done/total and an estimate of the time
    left; total None (texts streamed from standard input): the count so far and the rate. Nothing below min_total,
    and nothing where the console is not a terminal (output piped or written to a file)."""
    bar = Bar(console, min_total, unit)
    if description is not None:
        bar.stage(description, total)
    try:
        yield bar
    finally:
        bar.close()


class _RateColumn(ProgressColumn):
    """Items per second, over rich's recent window: the only estimate there is without a total."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f} {self.unit}/s" if speed else f"– {self.unit}/s", style="dim")

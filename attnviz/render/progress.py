"""The progress bar of the commands that run many texts (`heads --file`, `stats --file`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text


@contextmanager
def progress_bar(
    console: Console, total: int | None, description: str, min_total: int, unit: str = "texts"
) -> Iterator[Callable[[int], None]]:
    """A transient progress bar over `total` items when there are at least min_total; yields advance(count).

    With the total known: a bar, done/total and an estimate of the time left. total None (texts
    streamed from standard input): the count so far and the rate.
    """
    if total is not None and total < min_total:
        yield lambda count: None
        return
    if total is None:
        columns = (TextColumn("{task.description}"), TextColumn(f"{{task.completed:,.0f}} {unit}"), _RateColumn(unit), TimeElapsedColumn())
    else:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda count: progress.advance(task, count)


class _RateColumn(ProgressColumn):
    """Items per second, over rich's recent window: the only estimate there is without a total."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f} {self.unit}/s" if speed else f"– {self.unit}/s", style="dim")

"""One progress bar style for the whole toolkit (rich), silent when disabled."""

from __future__ import annotations

from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class _Bar:
    def __init__(self, progress, task):
        self._p, self._t = progress, task

    def advance(self, n: int = 1, description: str | None = None):
        if self._p is not None:
            kw = {"description": description} if description else {}
            self._p.update(self._t, advance=n, **kw)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool = True):
    if not enabled:
        yield _Bar(None, None)
        return
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*cols, transient=False) as p:
        yield _Bar(p, p.add_task(description, total=total))

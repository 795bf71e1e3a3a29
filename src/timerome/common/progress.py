"""One progress display for the whole toolkit, on stderr (stdout stays for results and --json).

    with progress_bar("training", total=400) as bar:
        bar.advance(description="training epoch 1/10 loss 3.2")

On a terminal: rich bars; a bar opened while another is showing is one more line of the same
display (the reference model under an experiment's cells), removed when it ends. Not on a
terminal (a log file, a background job, CI): plain lines, the first after 5 seconds and then at
most one every $TIMEROME_PROGRESS_SECONDS (default 30; 0: every step) per bar, plus one when a bar ends
that ran that long, so a long job is never silent and a short one adds nothing to the log.
`enabled=False` shows nothing.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

FIRST_LINE_SECONDS = 5.0
# the display nested bars share while one is open in this context (thread / task)
LIVE: ContextVar[Progress | None] = ContextVar("timerome_progress_display", default=None)
# whether the work running now shows its bars, where no flag can be passed down to it (a method's install has
# a fixed signature): `progress_wanted(True)` around it, `wanted()` inside (off unless a caller asks)
WANTED: ContextVar[bool] = ContextVar("timerome_progress_wanted", default=False)


@contextmanager
def progress_wanted(enabled: bool):
    """Show (or not) the bars of the work inside the block that reads `wanted()`."""
    token = WANTED.set(bool(enabled))
    try:
        yield
    finally:
        WANTED.reset(token)


def wanted() -> bool:
    """Whether the caller asked the work running now to show its progress (`progress_wanted`)."""
    return WANTED.get()


def _interval() -> float:
    from timerome.common.environment import seconds

    return seconds("TIMEROME_PROGRESS_SECONDS")


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _Bar:
    """A rich task (or nothing when the display is off)."""

    def __init__(self, progress=None, task=None):
        self._p, self._t = progress, task

    def advance(self, n: float = 1, description: str | None = None):
        """n steps done (a fraction where a step is weighed by its share of the work)."""
        if self._p is not None:
            kw = {"description": description} if description else {}
            self._p.update(self._t, advance=n, **kw)


class _Lines(_Bar):
    """Plain progress lines for a stream that is not a terminal."""

    def __init__(self, description: str, total: int, stream, completed: int = 0):
        super().__init__()
        self.description, self.total, self.stream = description, total, stream
        self.done, self.start, self.t0 = completed, completed, time.monotonic()
        self.last = None  # when the last line was written
        self.every = _interval()  # read before the work: a bad value is refused then, not after its first step

    def advance(self, n: float = 1, description: str | None = None):
        self.done += n
        self.description = description or self.description
        now = time.monotonic()
        every = self.every
        due = now - self.t0 >= min(FIRST_LINE_SECONDS, every) if self.last is None else now - self.last >= every
        if due or (self.done >= self.total - 1e-9 and self.last is not None):
            self.write(now)

    def write(self, now: float) -> None:
        elapsed = now - self.t0
        # the rate of this run's own steps: those done before it (a resumed run) took no time here
        ran = self.done - self.start
        left = elapsed / ran * (self.total - self.done) if ran > 0 else None
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = f", eta {_clock(left)}" if left is not None and self.done < self.total - 1e-9 else ""
        done = round(self.done) if abs(self.done - round(self.done)) < 1e-6 else int(self.done)  # a share of work
        line(f"{self.description}: {done}/{self.total}{pct}, {_clock(elapsed)} elapsed{eta}", self.stream)
        self.last = now


def line(text: str, stream=None) -> None:
    """text and its newline in one write (print writes them apart: a Ctrl-C between the two left the
    interruption message on the end of a progress line)."""
    stream = sys.stderr if stream is None else stream
    stream.write(text + "\n")
    stream.flush()


@contextmanager
def progress_bar(description: str, total: int, enabled: bool = True, completed: int = 0):
    """A bar of `total` steps, `completed` of them done before (a resumed run: counted as done, not in
    the rate the time left is estimated from)."""
    if not enabled:
        yield _Bar()
        return
    stream = sys.stderr
    if not stream.isatty():
        yield _Lines(description, total, stream, completed)
        return
    live = LIVE.get()
    if live is not None:  # nested: one more line of the open display, gone when it ends
        task = live.add_task(description, total=total, completed=completed)
        try:
            yield _Bar(live, task)
        finally:
            live.remove_task(task)
        return
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*cols, console=Console(file=stream), transient=False) as p:
        token = LIVE.set(p)
        try:
            yield _Bar(p, p.add_task(description, total=total, completed=completed))
        finally:
            LIVE.reset(token)


@contextmanager
def hf_bars_off():
    """transformers' own tqdm bars off for the block (loading, converting, saving shards): this is the one
    display, and a tqdm bar writes carriage returns into a log off a terminal."""
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bar:
            hf_logging.enable_progress_bar()


def notify(message: str) -> None:
    """A note for the user while work runs (a damaged cache file set aside, a lock waited for):
    one line on stderr, above the bars when they are showing."""
    live = LIVE.get()
    if live is not None:
        live.console.print(f"note: {message}", markup=False, highlight=False, soft_wrap=True)
    else:
        line(f"note: {message}")

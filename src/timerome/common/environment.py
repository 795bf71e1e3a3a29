"""The switches and numbers timerome reads from the environment, each checked as an option is.

    switch("TIMEROME_INSIST")                      "1" on, "0" off, unset or empty: its default (SWITCHES)
    switch("TIMEROME_DEBUG", strict=False)         the same, a bad value read as the default (a reader that must not raise)
    seconds("TIMEROME_PROGRESS_SECONDS")           a finite number >= 0 (NUMBERS: its default)
    check()                                        every variable below, once: the command line's first step
($TIMEROME_THREADS, a count, is read by common/threads.py, as --threads.)

A value a variable does not take is one TimeromeError naming it and what it takes (`TIMEROME_INSIST=no`
read as on, `TIMEROME_PROGRESS_SECONDS=lots` as 30 before): an environment variable is an input.
"""

from __future__ import annotations

import math
import os

from timerome.errors import TimeromeError

# on/off variables: (default, what on means, what off means)
SWITCHES = {
    "TIMEROME_INSIST": (False, "run work whose estimated size is refused as absurd", "refuse it, the default"),
    "TIMEROME_KEEP_MEMORY": (True, "keep freed memory in the process, the default", "leave malloc as it is"),
    "TIMEROME_DEBUG": (False, "a bug's traceback and Python's warning format", "one line each, the default"),
}
NUMBERS = {"TIMEROME_PROGRESS_SECONDS": 30.0}  # seconds >= 0


def switch(name: str, *, strict: bool = True) -> bool:
    """Whether the on/off variable `name` (SWITCHES) is on: "1" or "0", unset / empty for its default; another
    value refused, or (strict=False: a reader inside an error handler) read as the default."""
    default, on, off = SWITCHES[name]
    raw = os.environ.get(name, "").strip()
    if raw not in ("", "0", "1"):
        if not strict:
            return default
        raise TimeromeError(f"${name} must be 1 ({on}) or 0 ({off}), got {raw!r}")
    return default if raw == "" else raw == "1"


def seconds(name: str) -> float:
    """The number of seconds >= 0 the variable `name` (NUMBERS) gives; unset / empty: its default."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return NUMBERS[name]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise TimeromeError(f"${name} must be a number of seconds >= 0 (0: every step), got {raw!r}")
    return value


def check() -> None:
    """Every variable of SWITCHES and NUMBERS read once: a bad value refused before any work."""
    for name in SWITCHES:
        switch(name)
    for name in NUMBERS:
        seconds(name)

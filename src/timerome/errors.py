"""User-facing errors: the CLI prints these as one clear line, never a traceback."""


class TimeromeError(Exception):
    """Bad input or an unusable model/data file, described in words a user can act on."""


class Interrupted(TimeromeError):
    """Work stopped by the user (Ctrl-C); the message says what was kept and how to resume."""


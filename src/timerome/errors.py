"""User-facing errors: the CLI prints these as one clear line, never a traceback."""


class TimeromeError(Exception):
    """Bad input or an unusable model/data file, described in words a user can act on."""


class NotApplicable(TimeromeError):
    """A method that cannot act on this backbone at all: a locate-then-edit baseline on a mixture of
    experts, which has no single down projection to rewrite; a rewrite memory on a model that never
    says the target's tokens surely enough on the calibration rows, so it has no value to write. A fact
    about the pair, not a bad input. The table measurements record it as an "n/a" cell
    (`experiments.runner.with_edit`); a command (`timerome edit`) says it in one line."""


class DiffusionOnly(TimeromeError):
    """A protocol that follows a denoising trajectory (the diffusion-time trace, TIE) asked of an
    autoregressive model, which has none; ROME's positional trace is its AR counterpart. The benchmark
    experiments name that setting beside the row they could not measure."""


class Interrupted(TimeromeError):
    """Work stopped by the user (Ctrl-C); the message says what was kept and how to resume."""


def script(main) -> int:
    """Run a script's `main()` as the CLI runs a command: a TimeromeError (a bad option, a missing
    folder, an unusable file) is one line on stderr and exit status 2, never a traceback."""
    import sys

    try:
        return main() or 0
    except TimeromeError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2

"""How many CPU threads torch uses when the user does not say (`timerome --threads N` or
$TIMEROME_THREADS do say).

torch's own default is one thread per core. On a machine other jobs share, that is pathological:
torch's worker threads wait for each other at every operation, and a core taken by another
process makes all of them wait (one trace: 60 s with 2 threads against 15 s with 1 on the loaded
2-core machine of docs/cli.md, `benchmarks/bench_threads.py`). The default here is half the cores
this process may run on, less the cores other processes keep busy (the 1-minute load average),
and at least 1: a 2-core machine gets 1 thread, an idle 32-core server 16.
"""

from __future__ import annotations

import os

from timerome.errors import TimeromeError

ENV = "TIMEROME_THREADS"
MAX_THREADS = 1024  # more would be started, each with its stack, long before any could help (--threads 100000: MemoryError)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(cores: int | None = None, load: float | None = None) -> int:
    """The default thread count (module docstring); cores / load are read from the system when None."""
    cores = usable_cores() if cores is None else cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    return max(1, min(cores // 2, cores - round(load)))


def choose_threads(threads: int | None) -> tuple[int, str]:
    """(threads, where the number came from): the option, else $TIMEROME_THREADS, else the default."""
    if threads is not None:
        source = "--threads"
    elif os.environ.get(ENV, "").strip():
        raw = os.environ[ENV].strip()
        try:
            threads, source = int(raw), f"${ENV}"
        except ValueError:
            raise TimeromeError(f"${ENV} must be a whole number of threads, got {raw!r}") from None
    else:
        return default_threads(), "default"
    cores = usable_cores()
    if not 1 <= threads <= MAX_THREADS:  # torch takes a C int, and starts every thread it is given
        raise TimeromeError(f"{source} must be a number of threads in 1..{MAX_THREADS} (this machine has {cores} "
                            f"usable cores), got {threads}")
    return threads, source


def setting(device="cpu") -> str:
    """What a timing depends on, for a benchmark's report: torch's version, its thread count, the device."""
    import torch

    return f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), device {device}"

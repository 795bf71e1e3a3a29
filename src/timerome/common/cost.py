"""What a piece of work cost: wall seconds and peak memory (exact on CUDA, sampled on CPU)."""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from contextlib import contextmanager

import torch


def _rss_peak_mb() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 0.0


def rss_now_mb() -> float | None:
    """The resident set now (Linux), or None where /proc is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_MB
    except (OSError, ValueError, IndexError):
        return None


class _RssWatch:
    """Highest resident set seen from construction to `stop()`, sampled every `every` seconds by a thread.

    torch's kernels release the GIL, so the thread samples during long operations too; an
    allocation shorter than the interval can be missed, and memory the allocator reuses without
    asking the OS for more is not seen (both make `extra` a lower bound).
    """

    def __init__(self, start_mb: float, every: float = 0.002):
        self.every, self.peak, self._done = every, start_mb, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.wait(self.every):
            self.peak = max(self.peak, rss_now_mb() or 0.0)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return max(self.peak, rss_now_mb() or 0.0)


def sync(device) -> None:
    """Wait for the device's queued work (CUDA); nothing on a CPU. Timers call it around timed work."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def measure(backbone=None):
    """Wall seconds and peak memory of the block, into the yielded dict {seconds, peak_mb, extra_mb}.

    On CUDA: torch's peak allocated bytes during the block (extra = peak - allocated before).
    On CPU (Linux): the highest resident set sampled during the block (extra = peak - resident set
    before; see _RssWatch). Elsewhere on CPU: the process's high-water mark (ru_maxrss), which never
    goes down, so `extra_mb` is how far the block pushed it (0 when it stayed below an earlier peak).
    """
    cuda = backbone is not None and backbone.device.type == "cuda"
    out = {"seconds": 0.0, "peak_mb": 0.0, "extra_mb": 0.0}
    watch = None
    if cuda:
        sync(backbone.device)
        torch.cuda.reset_peak_memory_stats(backbone.device)
        before = torch.cuda.memory_allocated(backbone.device) / 2**20
    elif (before := rss_now_mb()) is not None:
        watch = _RssWatch(before)
    else:
        before = _rss_peak_mb()
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        if cuda:
            sync(backbone.device)
            peak = torch.cuda.max_memory_allocated(backbone.device) / 2**20
        elif watch is not None:
            peak = watch.stop()
        else:
            peak = _rss_peak_mb()
        out.update(seconds=time.perf_counter() - t0, peak_mb=peak, extra_mb=max(0.0, peak - before))

"""Keep the memory a forward frees inside the process (glibc's malloc), instead of handing it back to
the system after every forward and taking it again, page by page, in the next.

torch allocates a CPU tensor with the C library's malloc. glibc returns the top of its heap to the
system once more than a threshold of it is free (M_TRIM_THRESHOLD, about twice the largest block
it has freed), and serves a block above another threshold (M_MMAP_THRESHOLD) by a fresh mapping
that is unmapped when freed. A model forward allocates and frees its activations; where they add
up to more than that threshold, every forward gives them back and page-faults them in again,
zero-filled, on the next one. On the embedded model, scoring the evaluation's 100 answers in a
fresh process (`answer_logprobs`, n_mc 16) took 80,000-100,000 page faults and 0.99 s of CPU time
(median of 4), 0.79 s with the memory kept (`benchmarks/bench_malloc.py`; docs/cli.md, "Memory kept
between forwards").

`keep_freed_memory()` sets both thresholds once for the process: blocks up to 32 MiB (glibc's
largest mmap threshold on a 64-bit system) come from the heap, and up to 1 GiB of its free top
stays in the process. Blocks above 32 MiB (a large model's activations and weights) are mapped
and unmapped as before, so what is kept is bounded by the heap's own peak. The command line does
this at start, and so does each Ray worker an experiment starts ($TIMEROME_KEEP_MEMORY=0 leaves
malloc as it is in both); the Python API does not change its caller's process unless asked: call
`timerome.keep_freed_memory()`. Setting a threshold turns off glibc's own adjustment of them for
the process, and lasts until the process ends. The timing benchmarks (those with `--malloc`, through
`throughput.timing_clock`) set their process up as the command line does (`--malloc system` for
glibc's defaults).

Other C libraries (macOS, musl) have no mallopt with these parameters: nothing is changed there,
and the function says so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from timerome.common.checks import integer

ENV = "TIMEROME_KEEP_MEMORY"
M_TRIM_THRESHOLD = -1   # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20   # the largest threshold glibc's own adjustment reaches on a 64-bit system
TRIM_THRESHOLD = 1 << 30
INT_MAX = 2**31 - 1         # mallopt takes a C int
MALLOC_CHOICES = ("kept", "system")   # a benchmark's --malloc: as the command line runs, or glibc's defaults
MALLOC_HELP = ("kept: keep freed memory in the process, as `timerome` does (common/allocator.py); "
               "system: glibc's own trimming, a Python process's default")


def keep_freed_memory(*, mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Keep freed memory in this process (module docstring); True where glibc took both settings,
    False where the C library is not glibc (nothing changed) or glibc refused one (the mmap threshold
    is set first, so a refused trim threshold leaves it set). Each threshold is bytes, 0..2^31 - 1."""
    for name, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        # a C int: ctypes would pass a larger value's low 32 bits (4 GiB would become 0, trimming at every free)
        integer(value, f"{name} (bytes; glibc's mallopt takes a C int)", lo=0, hi=INT_MAX)
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))) and \
        bool(libc.mallopt(M_TRIM_THRESHOLD, int(trim_threshold)))


def wanted() -> bool:
    """Whether the command line keeps freed memory: yes unless $TIMEROME_KEEP_MEMORY is 0."""
    from timerome.common.environment import switch

    return switch(ENV)

"""The model's best batched throughput on this device: the unit of every performance floor.

A floor is the least time a piece of work could take here: the row-blocks its definition needs
(one sequence row through one transformer block), each at the best rate this model reaches on this
device. The rate is measured, not assumed: full forwards of [b, L] random tokens for b = 1, 2, 4,
... (until a forward takes `max_seconds` or the rate has fallen below 0.9 x the best for two doublings), and
rows x blocks per second taken at the best b. A forward also runs the embedding and the head, so
the rate charges each row-block its share of them: work done at that rate would be no faster.
`blocks_only=True` stops each forward after the last block, for a floor that charges the head
apart, only where a read-out needs it (`head_throughput`: read-out positions per second).

Rows of different lengths: `floor_by_length` charges each length's row-blocks at the rate
measured at that length (rows of one length batch together; an exact computation cannot pad them
to another, as padding changes the float rounding), the issue's "row-blocks at the best rows x
blocks per second" made precise. `floor_seconds` is stricter still: a row of length L is L
token-blocks, each charged at the best token rate (rows x blocks x L per second) over the lengths
measured, the most favourable of them.

    rates = [best_throughput(backbone, L) for L in lengths]     # Throughput(length, rows, ...)
    floor_s = floor_by_length(result.stats["min_block_rows_by_length"], rates)
    strict_s = floor_seconds(token_blocks=result.stats["min_block_tokens"], rates=rates)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from timerome.common.cost import sync
from timerome.engine.hooks import run_to


@dataclass
class Throughput:
    """The best batched forward rate at one sequence length."""

    length: int
    rows: int                     # the batch size that reached it
    row_blocks_per_s: float       # rows x blocks per second at that batch size
    table: dict = field(default_factory=dict)  # batch size -> rows x blocks per second

    @property
    def token_blocks_per_s(self) -> float:
        return self.row_blocks_per_s * self.length


@torch.no_grad()
def best_throughput(backbone, length: int, *, max_rows: int = 1024, max_seconds: float = 8.0, repeats: int = 3,
                    clock=time.perf_counter, seed: int = 0, blocks_only: bool = False) -> Throughput:
    """Rows x blocks per second of full forwards of [b, length] at the best batch size b.

    Each b is timed `repeats` times after one warm-up forward (median); b doubles until max_rows,
    until one forward takes max_seconds, or until two doublings in a row fell below 0.9 x the best.
    clock: the timer the work compared with it uses (process CPU time on a shared CPU machine).
    blocks_only: forwards stop after the last block (the embedding and the blocks, no head): the
    rate of the blocks alone, for floors that charge the head separately (`head_throughput`).
    """
    g = torch.Generator().manual_seed(seed)

    def make(b):
        return torch.randint(0, backbone.vocab_size, (b, length), generator=g).to(backbone.device)

    seconds = _doubling(backbone, make, _forward(backbone, blocks_only), 1, max_rows, max_seconds, repeats, clock)
    table = {b: b * backbone.n_layers / sec for b, sec in seconds.items()}
    rows = max(table, key=table.get)
    return Throughput(length=length, rows=rows, row_blocks_per_s=table[rows], table=table)


@torch.no_grad()
def retimed(backbone, rate: Throughput, *, repeats: int = 5, clock=time.perf_counter, seed: int = 0,
            blocks_only: bool = False, candidates: int = 3) -> Throughput:
    """`rate`'s best batch sizes timed again now (the `candidates` best of its table, each the median
    of `repeats` forwards after a warm-up), the best of them kept: a benchmark that times its work
    and the floor's rate side by side, round after round, divides each by the other measured at the
    same moment, so that a drift in the machine's speed hits both; and a size the search ranked
    below the best by the noise of a moment is given its chance again (a floor must not rest on a
    rate the machine beats)."""
    sizes = sorted(rate.table, key=rate.table.get, reverse=True)[:max(1, candidates)] if rate.table else [rate.rows]
    g = torch.Generator().manual_seed(seed)
    best_rows, best = rate.rows, 0.0
    for rows in sizes:
        ids = torch.randint(0, backbone.vocab_size, (rows, rate.length), generator=g).to(backbone.device)
        now = rows * backbone.n_layers / _median_seconds(backbone, _forward(backbone, blocks_only), ids, repeats, clock)
        if now > best:
            best_rows, best = rows, now
    return Throughput(length=rate.length, rows=best_rows, row_blocks_per_s=best, table=rate.table)


def _forward(backbone, blocks_only: bool, blocks: int | None = None):
    """A forward of ids: the whole model, or (blocks_only) cut after the last block (after the first
    `blocks` blocks where given)."""
    last = (min(blocks or backbone.n_layers, backbone.n_layers) - 1, "resid")
    return (lambda ids: run_to(backbone, last, ids)) if blocks_only else backbone.logits


@torch.no_grad()
def head_throughput(backbone, *, max_positions: int = 1 << 16, max_seconds: float = 8.0, repeats: int = 3,
                    clock=time.perf_counter, seed: int = 0, log_normaliser: bool = False) -> float:
    """Positions per second of the vocabulary read-out (`Backbone.readout`: final norm and head) on
    [m, H] hidden states at the best m (m doubling from 16, as `best_throughput` doubles rows).
    log_normaliser: the read-out of log-probabilities, the logits and their log-normaliser over the
    vocabulary in float32: what reading log p(token) at a position must compute however it is done,
    since every logit moves the normaliser. It is timed both ways torch computes it, `logsumexp`
    and `log_softmax` (a fused kernel, faster on a CPU at some shapes though it writes every
    log-probability), and the faster rate is the answer: a floor must not rest on the slower.
    m stops at max_positions, and at the m whose float32 logits reach 2 GiB; max_seconds bounds each
    way's search."""
    g = torch.Generator().manual_seed(seed)

    def make(m):
        return torch.randn(m, backbone.hidden_size, generator=g).to(device=backbone.device, dtype=backbone.dtype)

    def by_logsumexp(h):
        return backbone.readout(h).float().logsumexp(-1)

    def by_log_softmax(h):
        return backbone.readout(h).float().log_softmax(-1)

    runs = (by_logsumexp, by_log_softmax) if log_normaliser else (backbone.readout,)
    # no more positions than keep the float32 logits under 2 GiB (a 126k-token vocabulary: 4,096)
    most = max(16, min(max_positions, (1 << 31) // (4 * max(1, backbone.vocab_size))))
    return max(m / sec for run in runs for m, sec in _doubling(backbone, make, run, 16, most, max_seconds, repeats,
                                                                 clock).items())


def _doubling(backbone, make, run, first: int, most: int, max_seconds: float, repeats: int, clock) -> dict:
    """{size: seconds of run(make(size))} for size = first, 2 first, ... up to most: each the median of
    `repeats` timed calls after one warm-up (allocations, kernel selection); it stops after a call
    of more than max_seconds, or once two doublings in a row fell below 0.9 x the best size / second
    (a doubling within 10 % of the best may be the noise of a moment, not the rate falling)."""
    seconds, best, worse, n = {}, 0.0, 0, first
    while n <= most:
        sec = seconds[n] = _median_seconds(backbone, run, make(n), repeats, clock, limit=max_seconds)
        worse = 0 if n / sec >= 0.9 * best else worse + 1
        best = max(best, n / sec)
        if sec > max_seconds or worse >= 2:
            break
        n *= 2
    return seconds


def _median_seconds(backbone, run, x, repeats: int, clock, limit: float | None = None) -> float:
    """The median time of `repeats` calls run(x) after one warm-up call (allocations, kernel selection);
    a warm-up longer than `limit` seconds is the answer itself (a size too slow to matter is not timed again)."""
    sync(backbone.device)
    t = clock()
    run(x)
    sync(backbone.device)
    first = clock() - t
    if limit is not None and first > limit:
        return first
    times = []
    for _ in range(repeats):
        sync(backbone.device)
        t = clock()
        run(x)
        sync(backbone.device)
        times.append(clock() - t)
    return max(statistics.median(times), 1e-9)


def floor_seconds(*, token_blocks: float, rates: list[Throughput]) -> float:
    """The least time for `token_blocks` (row-blocks weighted by their rows' lengths), each at the
    best token rate among `rates` (the strictest floor: a short row is charged the token rate of
    the length that runs fastest per token)."""
    return token_blocks / max(r.token_blocks_per_s for r in rates)


def floor_by_length(block_rows: dict, rates: list[Throughput]) -> float:
    """The least time for block_rows {length: row-blocks}, each row-block at the best rows x blocks
    per second measured at its own length: rows of one length batch together, and an exact
    computation cannot pad a row to another length (padding changes the float rounding)."""
    by_length = {r.length: r for r in rates}
    missing = sorted({int(n) for n in block_rows} - set(by_length))
    if missing:
        raise ValueError(f"no throughput measured at length(s) {missing}")
    return sum(n / by_length[int(length)].row_blocks_per_s for length, n in block_rows.items())


def block_calls(block_batches: dict) -> list[tuple[int, int, int]]:
    """(length L, rows B, calls) of each entry of a trace's stats["block_batches"] {"LxB": calls}."""
    return [(*(int(v) for v in key.split("x")), calls) for key, calls in block_batches.items()]


@torch.no_grad()
def timed_block_calls(backbone, block_batches: dict, *, clock=time.perf_counter, repeats: int = 2,
                      seed: int = 0, blocks: int = 4) -> float:
    """The time block calls {"LxB": calls} (rows of length L, B rows per call: a trace's
    stats["block_batches"]) take when run alone at those shapes: for each (L, B), a forward of B
    random rows of length L cut after its first k = min(blocks, n_layers) blocks (the median of
    `repeats` after a warm-up), a 1 / k share of it per call. Against `floor_by_length`, what running
    at the batch sizes the work had costs, measured on those sizes rather than read off a table of
    powers of two. A deep model's trace with joins has hundreds of shapes (309 on a 32-block copy at
    hidden 64 against 26 without joins), so a forward through every block for each ran about 12 times
    the trace's own block calls' forwards (by count); cut after 4 blocks, the embedding's share of a
    call is at most a quarter of a look-up, against a block's products."""
    g = torch.Generator().manual_seed(seed)
    k = max(1, min(blocks, backbone.n_layers))
    run = _forward(backbone, blocks_only=True, blocks=k)
    total = 0.0
    for length, rows, calls in block_calls(block_batches):
        ids = torch.randint(0, backbone.vocab_size, (rows, length), generator=g).to(backbone.device)
        total += calls * _median_seconds(backbone, run, ids, repeats, clock) / k
    return total


def timing_clock(choice: str = "auto", device="cpu", threads: int | None = None, malloc: str = "kept"):
    """(timer, label) of a benchmark, its process set up as the command line sets its own: "cpu" =
    process CPU time with `threads` torch threads (default 1: idle OpenMP threads spin, and other jobs
    on a shared machine are not counted), "wall" = wall time; "auto" = CPU time on CPU, wall time on a
    GPU. Sets torch's thread count when asked to or when timing CPU time. malloc: "kept" keeps freed
    memory in the process, as `timerome` does (`common/allocator.py`), "system" leaves glibc's own
    trimming (a Python process's default, the API's)."""
    from timerome.common.allocator import MALLOC_CHOICES, keep_freed_memory

    if malloc not in MALLOC_CHOICES:
        raise ValueError(f"malloc must be one of {MALLOC_CHOICES}, got {malloc!r}")
    kept = malloc == "kept" and keep_freed_memory()
    memory = "freed memory kept" if kept else "malloc as it is"
    cpu = choice == "cpu" or (choice == "auto" and not str(device).startswith("cuda"))
    if threads or cpu:
        torch.set_num_threads(threads or 1)
    return (time.process_time, f"process CPU time, {memory}") if cpu else (time.perf_counter, f"wall time, {memory}")

"""How long one `timerome trace` takes with 1 thread, 2 threads, one per core (torch's own default)
and timerome's default, alone and beside a busy process; each setting's median ratio against 1 thread
of the same round.

    python benchmarks/bench_threads.py [--n-facts 8] [--repeats 3] [--busy 0,1]

Each run is a fresh `python -m timerome trace` process (the CLI's default trace: K=8 steps, 5
noise samples, every site), so start-up is included, as a user sees it. Runs are interleaved
round by round, in an order that turns by one each round, so a change in the machine's other load
hits every setting alike; a setting that is another's thread count (one per core on 2 cores is
"2 threads") is run once, under the first name. "busy N" adds
N pure-Python busy loops for the length of the round (another user's job). Numbers from a shared
machine move with everyone else's load: compare the ratios of one round, not seconds across runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timerome.errors import script

BURN = "import time\nend = time.time() + float(__import__('sys').argv[1])\nwhile time.time() < end:\n    pass\n"


def one_trace(threads: str | None, n_facts: int, out: Path) -> float:
    env = dict(os.environ)
    env.pop("TIMEROME_THREADS", None)
    cmd = [sys.executable, "-m", "timerome"] + (["--threads", threads] if threads else []) + [
        "trace", "-o", str(out), "--n-facts", str(n_facts)]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-facts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", default="0,1", help="comma-separated numbers of busy processes beside the trace")
    args = ap.parse_args()
    try:
        busy_counts = [int(b) for b in args.busy.split(",")]
    except ValueError:
        ap.error(f"--busy takes comma-separated whole numbers, got {args.busy!r}")
    if args.repeats < 1 or args.n_facts < 1 or min(busy_counts) < 0:
        ap.error("--repeats and --n-facts must be >= 1, --busy >= 0")
    from timerome.common.threads import default_threads, usable_cores

    cores = usable_cores()
    settings = {}
    for name, threads in (("1 thread", "1"), ("2 threads", "2"), (f"{cores} (torch: one per core)", str(cores))):
        if threads not in settings.values():  # the same setting twice was two noisy runs shown as two results
            settings[name] = threads
    settings["timerome default"] = None
    print(f"{cores} usable cores; load average {os.getloadavg()[0]:.1f} at start; timerome's default now: "
          f"{default_threads()} thread(s); trace of {args.n_facts} facts; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        names = list(settings)
        for busy in busy_counts:
            times = {k: [] for k in settings}
            for r in range(args.repeats):
                burners = [subprocess.Popen([sys.executable, "-c", BURN, "3600"]) for _ in range(busy)]
                try:
                    for name in names[r % len(names):] + names[:r % len(names)]:  # the order turns each round
                        times[name].append(one_trace(settings[name], args.n_facts, Path(tmp) / "t"))
                finally:
                    for b in burners:
                        b.kill()
                        b.wait()
            print(f"\nbeside {busy} busy process(es), {args.repeats} round(s): median seconds, and the median of "
                  "each round's ratio to 1 thread")
            for name, ts in times.items():
                ratio = statistics.median(t / base for t, base in zip(ts, times["1 thread"]))
                print(f"  {name:28s} {statistics.median(ts):7.1f} s   x{ratio:5.2f} vs 1 thread   runs: "
                      + ", ".join(f"{t:.1f}" for t in ts))


if __name__ == "__main__":
    raise SystemExit(script(main))

"""What keeping freed memory in the process (`common/allocator.py`, the command line's default) saves:
the same work in fresh processes with freed memory kept and with glibc's defaults, pair by pair.

    python benchmarks/bench_malloc.py                    # 4 pairs: likelihood, greedy answers, trace
    python benchmarks/bench_malloc.py --pairs 6 --parts likelihood --json out.json

Each run is a fresh Python process on the embedded default with one torch thread, as a user's
command starts: it warms up with one small likelihood (the library's one-off start-up, paid alike
either way), then times each part once with process CPU time (user + kernel) and counts its minor
page faults:
  likelihood  the evaluation's 100 (question, answer) pairs at n_mc 16 (`answer_logprobs`)
  generate    their greedy answers (`evaluation.evaluator.generate_answers`, the exact sampler)
  trace       the default trace of 8 facts (`tracing.causal_trace.trace`)
The two settings run alternately, the first of each pair turning with the pair, so that a drift in
the machine's speed hits both; a part's figure is the median over pairs of (kept / glibc's) time.
The results must not depend on the setting: each run hashes its likelihoods, answers and TIE, and
the hashes of all runs are compared (printed: identical or not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from timerome.errors import script

PARTS = ("likelihood", "generate", "trace")
MODES = ("kept", "system")


def child(mode: str, parts: list[str]) -> dict:
    """One fresh process's run: {part: {seconds, kernel_seconds, page_faults, digest}}."""
    import torch

    from timerome.common.allocator import keep_freed_memory

    torch.set_num_threads(1)
    if mode == "kept" and not keep_freed_memory():
        raise SystemExit("this C library is not glibc: there is nothing to compare")
    from timerome.backbones import load_backbone
    from timerome.engine.likelihood import answer_logprobs
    from timerome.evaluation.evaluator import eval_rows, generate_answers
    from timerome.tracing.causal_trace import default_facts, trace

    bb = load_backbone()
    rows = [r for rs in eval_rows("embedded").values() for r in rs]
    questions, answers = [r["question"] for r in rows], [r["answer"] for r in rows]
    work = {
        "likelihood": lambda: answer_logprobs(bb, questions, answers, n_mc=16)[0].tobytes(),
        "generate": lambda: "\n".join(generate_answers(bb, questions, answers)).encode(),
        "trace": lambda: trace(bb, default_facts(8)).tie.numpy().tobytes(),
    }
    with torch.no_grad():
        answer_logprobs(bb, questions[:4], answers[:4], n_mc=16)  # start-up, alike either way
        out = {}
        for part in parts:
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
            result = work[part]()
            seconds, r1 = time.process_time() - t0, resource.getrusage(resource.RUSAGE_SELF)
            out[part] = dict(seconds=seconds, kernel_seconds=r1.ru_stime - r0.ru_stime,
                             page_faults=r1.ru_minflt - r0.ru_minflt, digest=hashlib.sha256(result).hexdigest())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4, help="pairs of fresh processes (one each way)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--json", default=None, help="write every run's figures to this JSON file")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        ap.error(f"--parts takes a comma-separated subset of {','.join(PARTS)}, got {args.parts!r}")
    if args.child:
        print(json.dumps(child(args.child, parts)))
        return 0
    if args.pairs < 1:
        ap.error(f"--pairs must be >= 1, got {args.pairs}")
    env = dict(os.environ)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)  # glibc's own settings from the environment would blur "system"
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    runs = {m: [] for m in MODES}
    print(f"{args.pairs} pairs of fresh processes, embedded default, 1 thread, process CPU time; parts: {', '.join(parts)}")
    for i in range(args.pairs):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            res = subprocess.run([sys.executable, __file__, "--child", mode, "--parts", ",".join(parts)],
                                 capture_output=True, text=True, env=env)
            if res.returncode:
                raise SystemExit(f"the {mode} run failed: {res.stderr.strip().splitlines()[-1:]}")
            runs[mode].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"pair {i + 1} {mode:>6}: " + "; ".join(
                f"{p} {r['seconds']:.3f} s ({r['kernel_seconds']:.3f} in the kernel, {r['page_faults']:,} page faults)"
                for p, r in runs[mode][-1].items()), flush=True)
    summary = {}
    for p in parts:
        kept = [r[p]["seconds"] for r in runs["kept"]]
        system = [r[p]["seconds"] for r in runs["system"]]
        ratio = statistics.median(k / s for k, s in zip(kept, system))
        same = len({r[p]["digest"] for m in MODES for r in runs[m]}) == 1
        summary[p] = dict(kept_seconds=kept, system_seconds=system, median_ratio=ratio, identical_results=same,
                          kept_page_faults=statistics.median(r[p]["page_faults"] for r in runs["kept"]),
                          system_page_faults=statistics.median(r[p]["page_faults"] for r in runs["system"]))
        print(f"{p:>10}: kept {statistics.median(kept):.3f} s, glibc's defaults {statistics.median(system):.3f} s "
              f"(medians); kept / glibc's {ratio:.2f} (median of the pairs' ratios); page faults "
              f"{summary[p]['kept_page_faults']:,.0f} against {summary[p]['system_page_faults']:,.0f}; "
              f"results {'identical' if same else 'DIFFER'} in all {2 * args.pairs} runs")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(summary=summary, runs=runs), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(s["identical_results"] for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(script(main))

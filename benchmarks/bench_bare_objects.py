"""What the rewrite memory says for CounterFact requests with bare objects (docs/editing.md, "Bare objects").

The embedded counterfactual requests are written in ROME's CounterFact layout with CounterFact's bare
objects and targets (the words where the answer and the target differ: "Hidden Tower" / "Crimson
Forest"), a rewrite memory is built from them with `timerome edit`, and `timerome eval` scores it at
each answer budget. Everything runs through the CLI, as a user would.

    python benchmarks/bench_bare_objects.py                      # 20 requests, budgets 15 and 32
    python benchmarks/bench_bare_objects.py --memory old.safetensors   # score a memory built before
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timerome.errors import script

METRICS = ("Efficacy", "Generalisation", "Locality", "Leak", "Gibberish")


def bare(answer: str, target: str) -> tuple[str, str]:
    """The words where `answer` and `target` differ, in each (their common first and last words cut)."""
    a, b = answer.split(), target.split()
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    return " ".join(a[i:len(a) - j]), " ".join(b[i:len(b) - j])


def counterfact_file(path: Path, n: int) -> None:
    """The first n embedded counterfactual requests, bare, in CounterFact's layout."""
    from timerome.data.requests import load_requests

    reqs, _ = load_requests("counterfactual:forget10", limit=n)
    records = []
    for r in reqs:
        was, now = bare(r.fact.object, r.fact.target)
        records.append({"case_id": r.fact_id, "requested_rewrite": {
            "prompt": r.fact.prompt.replace(r.fact.subject, "{}"), "subject": r.fact.subject,
            "target_new": {"str": now}, "target_true": {"str": was}},
            "paraphrase_prompts": list(r.paraphrases), "neighborhood_prompts": [p.prompt for p in r.neighbours]})
    path.write_text(json.dumps(records, indent=1))


def timerome(*args) -> str:
    """`python -m timerome ARGS`: its standard output (a failure stops the bench, its message shown)."""
    done = subprocess.run([sys.executable, "-m", "timerome", *map(str, args)], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"timerome {' '.join(map(str, args))} failed:\n{done.stderr.strip()}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="requests (the embedded counterfactual set has 20)")
    ap.add_argument("--budgets", default="15,32", help="comma-separated answer budgets (eval --gen-length)")
    ap.add_argument("--memory", type=Path, help="score this rewrite memory instead of building one")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--budgets takes comma-separated whole numbers, got {args.budgets!r}")
    if min(budgets) < 1 or args.n < 1:
        ap.error(f"--budgets and --n must be >= 1, got {args.budgets!r} and {args.n}")
    with tempfile.TemporaryDirectory() as tmp:
        requests = Path(tmp) / "cfbare.json"
        counterfact_file(requests, args.n)
        memory, built = args.memory, None
        if memory is None:
            memory, start = Path(tmp) / "rw.safetensors", time.perf_counter()
            timerome("edit", "--method", "rewrite", "--requests", requests, "-o", memory)
            built = time.perf_counter() - start
        rows = []
        for budget in budgets:
            out = json.loads(timerome("eval", "--edit", memory, "--requests", requests, "--gen-length", budget,
                                      "--json"))
            rows.append(dict(budget=budget, **{k: out["metrics"][k] for k in METRICS}))
    print(f"{args.n} bare CounterFact requests, rewrite memory "
          + (f"built in {built:.1f} s" if built is not None else f"{args.memory}"))
    print("| budget | " + " | ".join(METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for r in rows:
        print(f"| {r['budget']} | " + " | ".join(f"{r[k]:.2f}" for k in METRICS) + " |")
    if args.json:
        args.json.write_text(json.dumps(dict(n=args.n, memory=str(args.memory) if args.memory else None,
                                             build_seconds=built, rows=rows), indent=2))


if __name__ == "__main__":
    raise SystemExit(script(main))

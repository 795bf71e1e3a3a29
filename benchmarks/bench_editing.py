"""Every editing metric for every method in one run, and the rewrite memory's goals checked.

Runs the `editing` experiment (its cells cached under --out, so a rerun only reads them) on the
embedded default: the counterfactual set (counterfactual:forget10, 20 requests with new objects)
and forget01 (20 requests, target "I don't know."). Prints one table per set and the goals:

    rewrite, both sets:  Efficacy >= 0.95, Generalisation >= 0.8, Locality >= 0.97,
                         FluencyRatio within 5 % of 1 (and, beside it, Fluency within 5 % of
                         FluencyTarget, the targets' own), retain / real-author / world-fact answers
                         unchanged (LocalityRetain = LocalityRealAuthors = LocalityWorldFacts = 1)
    rewrite, forget01:   Refusal >= 0.9
    rewrite install:     under a second for 20 facts (median of --repeats installs, the shared
                         preparation cached first, as the experiment's install_seconds)

    python benchmarks/bench_editing.py [--seeds 0] [--methods no_edit,timerome,rewrite,rome]
                                       [--out timerome-runs/bench-editing] [--json out.json]
"""

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import torch

import timerome
from timerome.errors import script
from timerome.experiments import run_experiment
from timerome.experiments.editing import COLUMNS
from timerome.experiments.editing import CONFIG as EDITING
from timerome.experiments.editing import requests_data
from timerome.methods import get_method, install

GOALS = [  # (set, column, test, words)
    (None, "Efficacy", lambda v: v >= 0.95, ">= 0.95"),
    (None, "Generalisation", lambda v: v >= 0.8, ">= 0.8"),
    (None, "Locality", lambda v: v >= 0.97, ">= 0.97"),
    (None, "FluencyRatio", lambda v: abs(v - 1) <= 0.05, "within 5 % of 1"),
    (None, "Fluency / FluencyTarget", lambda v: abs(v - 1) <= 0.05, "within 5 % of 1 (the targets' own fluency)"),
    (None, "LocalityRetain", lambda v: v == 1.0, "= 1 (unchanged)"),
    (None, "LocalityRealAuthors", lambda v: v == 1.0, "= 1 (unchanged)"),
    (None, "LocalityWorldFacts", lambda v: v == 1.0, "= 1 (unchanged)"),
    ("forget01", "Refusal", lambda v: v >= 0.9, ">= 0.9"),
]


def install_seconds(bb, repeats: int) -> list[float]:
    """Seconds to install the rewrite memory on the 20 counterfactual requests (preparation cached), on
    the experiment's own task (its retain and known rows)."""
    spec = dict(requests=EDITING["sets"]["counterfactual"], target=EDITING["target"], n_retain=EDITING["n_retain"])
    _, task = requests_data(spec, SimpleNamespace(source="embedded", backbone=bb))
    method = get_method("rewrite")
    method.prepare(bb, task, dict(method.defaults))  # trace, statistics, calibration, values: cached
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        install("rewrite", bb, task, {}, seed=0)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--methods", default=None, help="comma-separated (default: every registered method)")
    ap.add_argument("--n-mc", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="timerome-runs/bench-editing")
    ap.add_argument("--json", help="write every number to this JSON file")
    ap.add_argument("--threads", type=int, default=2,
                    help="torch's CPU threads (default 2, what docs/editing.md's tables were measured with: float "
                         "sums differ with the count, and one thread gives other rows for ROME and UnKE; the cells "
                         "cached under --out keep the count they were computed with, so give a new --out)")
    args = ap.parse_args()
    if args.methods:  # a misspelt method was a traceback after the model loaded
        from timerome.methods import available

        unknown = [m for m in args.methods.split(",") if m not in available()]
        if unknown:
            ap.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(available())}")
    torch.set_num_threads(max(1, args.threads))
    over = {"n_mc": args.n_mc}
    if args.methods:
        over["methods"] = args.methods.split(",")
    t0 = time.perf_counter()
    result = run_experiment("editing", seeds=[int(s) for s in args.seeds.split(",")], out_dir=args.out,
                            overrides=over)
    wall = time.perf_counter() - t0
    print(result["markdown"])
    ran_rewrite = any("rewrite" in summary for summary in result["summary"].values())
    secs = install_seconds(timerome.load_backbone(), args.repeats) if ran_rewrite else []  # its goals: where it ran
    checks = []
    for name, summary in result["summary"].items():
        row = summary.get("rewrite")
        if row is None:
            continue
        for only, col, ok, words in GOALS:
            if col == "Fluency / FluencyTarget" and "FluencyTarget" in row:
                v = row["Fluency"]["mean"] / row["FluencyTarget"]["mean"]
            elif only not in (None, name) or col not in row:
                continue
            else:
                v = row[col]["mean"]
            checks.append(dict(set=name, metric=col, value=v, goal=words, met=bool(ok(v))))
    if secs:
        med = statistics.median(secs)
        checks.append(dict(set="counterfactual", metric="install_seconds (20 facts)", value=med, goal="< 1",
                           met=med < 1.0))
    print("## rewrite memory: goals" if checks else "## rewrite memory: not among --methods, no goal checked")
    for c in checks:
        print(f"- {c['set']}: {c['metric']} = {c['value']:.3f} (goal {c['goal']}): {'met' if c['met'] else 'MISSED'}")
    print(f"(experiment wall {wall:.0f}s; install seconds {', '.join(f'{s:.2f}' for s in secs)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary=result["summary"], checks=checks, install_seconds=secs, columns=COLUMNS,
                           wall_seconds=wall, threads=torch.get_num_threads()), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(script(main))

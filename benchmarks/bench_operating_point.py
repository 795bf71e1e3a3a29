"""The README's operating-point table: how steeply the `timerome` method's alpha acts.

Δ mean answer log-probability (edited - plain, nats, n_mc 8, the same Monte-Carlo draws) per split
at alpha 3, 4 (the default) and 6, the memory at layer 0 resid, on the embedded default: 20
forget01 rows, 20 retain rows, 10 real-author and 10 world-fact rows.

    python benchmarks/bench_operating_point.py [--alphas 3,4,6] [--json out.json]
"""

import argparse
import json

import numpy as np
import torch

import timerome
from timerome.evaluation import eval_rows, lp_only
from timerome.methods import install
from timerome.task import forget_task

SPLITS = ("forget", "retain", "real_authors", "world_facts")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alphas", default="3,4,6")
    ap.add_argument("--n-mc", type=int, default=8)
    ap.add_argument("--json", help="write the table to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bb, task = timerome.load_backbone(), forget_task("embedded", "forget01")
    rows = eval_rows("embedded", n_retain=20, n_world=10)
    rows = {k: rows[k] for k in SPLITS}
    plain = {k: float(np.mean(v)) for k, v in lp_only(bb, rows, n_mc=args.n_mc).items()}
    print("| alpha | " + " | ".join(f"Δ {k}" for k in SPLITS) + " |")
    print("|---" * (len(SPLITS) + 1) + "|")
    table = []
    for a in (float(x) for x in args.alphas.split(",")):
        edit = install("timerome", bb, task, {"alpha": a, "coordinate": [0, "resid"]}, seed=0)
        try:
            d = {k: float(np.mean(v)) - plain[k] for k, v in lp_only(bb, rows, n_mc=args.n_mc, edit=edit).items()}
        finally:
            edit.undo()
        table.append(dict(alpha=a, **{f"d_{k}": v for k, v in d.items()}))
        print(f"| {a:g} | " + " | ".join(f"{d[k]:+.2f}" for k in SPLITS) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(plain=plain, rows=table, n_mc=args.n_mc), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

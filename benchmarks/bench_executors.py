"""Executors: the same sweep computed by the local executor and by Ray, timed in one run.

    python benchmarks/bench_executors.py                          # embedded model, local Ray, 2 CPUs
    python benchmarks/bench_executors.py --cpus 16 --alphas 12    # a larger machine
    python benchmarks/bench_executors.py --model DIR --device cuda --address auto   # a GPU cluster

Runs a Pareto alpha sweep (`lp` cells: TimeROME at each alpha, and no_edit, x seeds) twice into
two fresh folders, first with the local executor, then with Ray, and prints both wall times, their
ratio, and whether the cached results agree (timings aside). The Ray time includes starting the
local instance (or joining the cluster) and each worker loading the model once; with one CPU
thread per local cell and `cpus` workers, the ratio approaches the worker count as cells grow.
Requires Ray: pip install 'timerome[ray]'.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from timerome.backbones import load_backbone
from timerome.common.threads import setting
from timerome.errors import script
from timerome.experiments import run_experiment
from timerome.experiments.executors import connect, ray_executor
from timerome.experiments.report import without_costs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--address", default=None, help="Ray address (default: start a local instance)")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    ap.add_argument("--alphas", type=int, default=6, help="how many alphas in the sweep")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--n-mc", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)

    bb = load_backbone(args.model, device=args.device)
    over = dict(n_mc=args.n_mc, n_retain=20, n_world=10, methods=["no_edit"], paper_point=None,
                alphas=tuple(float(a) for a in range(1, args.alphas + 1)))
    seeds = tuple(range(args.seeds))
    with tempfile.TemporaryDirectory() as tmp:
        kw = dict(seeds=seeds, overrides=over, progress=False, backbone=bb)
        # the trace and background statistics are cached on disk by the first run: prime them first,
        # so neither timed run pays for them
        run_experiment("pareto", out_dir=Path(tmp) / "prime", **dict(kw, seeds=(0,), overrides=dict(over, alphas=(1.0,))))
        t0 = time.perf_counter()
        run_experiment("pareto", out_dir=Path(tmp) / "local", **kw)
        local = time.perf_counter() - t0
        t0 = time.perf_counter()
        connect(args.address, None if args.address else dict(num_cpus=args.cpus))
        started = time.perf_counter() - t0
        run_experiment("pareto", out_dir=Path(tmp) / "ray", executor=ray_executor(args.address), **kw)
        on_ray = time.perf_counter() - t0
        same = all(without_costs(json.loads(p.read_text())) ==
                   without_costs(json.loads((Path(tmp) / "ray" / "cells" / p.name).read_text()))
                   for p in (Path(tmp) / "local" / "cells").glob("*.json"))
    cells = (args.alphas + 1) * len(seeds)
    print(f"{cells} cells on {bb.name}; {setting(bb.device)}")
    print(f"local executor:  {local:7.1f} s")
    print(f"ray executor:    {on_ray:7.1f} s  (of which starting / joining Ray {started:.1f} s)")
    print(f"local / ray:     {local / on_ray:7.2f}x   same results (timings aside): {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(script(main))

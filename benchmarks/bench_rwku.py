"""RWKU selectivity of TimeROME (the paper's limitation 2) and the cost of MDLM Min-K% scores.

    python benchmarks/bench_rwku.py --bench-data ../shared/data               # both parts, toy model
    python benchmarks/bench_rwku.py --parts selectivity --model DIR --bench-data DIR --device cuda

Parts (each prints a table measured in this one run):
  selectivity  the rwku experiment's cells for one target at several alphas: change vs no_edit (nats)
               of the forget probes (levels 1-2, the edited ones) and of the neighbour probes, and
               their ratio. Without --model the model is the test suite's: timerome's LLaDA
               structure (2 layers, d 64) with a word tokenizer, trained 80 epochs on the target's
               forget and neighbour probes of levels 1-2 (about half a minute on one core); --bpe gives
               it a byte-level BPE tokenizer instead.
  cost         wall time of the per-token masked-likelihood scores behind Min-K% (metrics/membership.py)
               for `groups` = 2, 4, 8, 16 and the pseudo-log-likelihood (groups = length), as a ratio
               to groups = 8, on the same model and the target's forget_mia texts: after a warm-up call,
               the fastest of --rounds rounds, each round timing every setting once in a turned order.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import warnings
from pathlib import Path

import torch

from timerome.backbones import load_backbone
from timerome.common.threads import setting
from timerome.data.rwku import load_rwku, passage_rows, target_folder, target_name
from timerome.errors import script
from timerome.experiments import run_experiment
from timerome.metrics.membership import token_scores
from timerome.metrics.rwku import qa_rows
from timerome.training.small_model import trained_model

PARTS = ("selectivity", "cost")


def toy_model(bench, target: str, directory: Path, bpe: bool = False):
    parts = ("forget_level1", "forget_level2", "neighbor_level1", "neighbor_level2")
    rows = qa_rows([r for p in parts for r in load_rwku(target, p, bench).rows])
    others = [f for f in sorted(p.name for p in (Path(bench) / "rwku").iterdir() if p.is_dir())
              if f != target_folder(target, bench)]
    extra = [r["question"] + " " + r["answer"] for f in others
             for r in passage_rows(load_rwku(f, "passage", bench).rows)]
    extra += [r["query"] for r in load_rwku(target, "forget_level3", bench).rows]
    return trained_model(rows, directory, epochs=80, words=not bpe, extra_texts=extra)


def selectivity(bb, args) -> None:
    alphas = list(args.alphas)  # checked and parsed in main
    methods = ["no_edit"] + [{"method": "timerome", "config": {"alpha": a}} for a in alphas]
    over = dict(bench_dir=args.bench_data, targets=[args.target], forget_from=["probes"], rouge=False, mia=False,
                n_mc=args.n_mc, methods=methods)
    with tempfile.TemporaryDirectory() as out:
        res = run_experiment("rwku", seeds=tuple(range(args.seeds)), out_dir=out, overrides=over, progress=False,
                             backbone=bb)
    base = res["summary"][target_name(target_folder(args.target, args.bench_data))]["no_edit"]
    print(f"\nselectivity: {args.target}, {args.seeds} seed(s), n_mc {args.n_mc}; no_edit forget L1 "
          f"{base['ForgetL1LP']['mean']:.2f}, neighbour L1 {base['NeighbourL1LP']['mean']:.2f} nats")
    print("| alpha | Δ forget L1 | Δ forget L2 | Δ neighbour L1 | Δ neighbour L2 | forget / neighbour (L1+L2) |")
    print("|---|---|---|---|---|---|")
    for a in alphas:
        s = res["selectivity"][f"timerome (alpha={a:g})"]
        f, n = s["ForgetL1LP"] + s["ForgetL2LP"], s["NeighbourL1LP"] + s["NeighbourL2LP"]
        ratio = f"{f / n:.1f}" if abs(n) > 1e-3 else "–"
        print(f"| {a:g} | {s['ForgetL1LP']:+.2f} | {s['ForgetL2LP']:+.2f} | {s['NeighbourL1LP']:+.2f} | "
              f"{s['NeighbourL2LP']:+.2f} | {ratio} |")


def cost(bb, args) -> None:
    texts = [r["text"] for r in load_rwku(args.target, "forget_mia", args.bench_data).rows[: args.texts]]
    n_tokens = sum(min(len(bb.encode(t)), bb.max_length) for t in texts)
    settings = (2, 4, 8, 16, 10**6)
    token_scores(bb, texts[:2], groups=8)  # warm-up: the first call pays for allocations no setting should carry
    times = {g: [] for g in settings}
    for r in range(args.rounds):  # each round times every setting once, the order turned by one each round
        for g in settings[r % len(settings):] + settings[:r % len(settings)]:
            t0 = time.perf_counter()
            token_scores(bb, texts, groups=g)
            times[g].append(time.perf_counter() - t0)
    times = {g: min(ts) for g, ts in times.items()}
    print(f"\ncost: {len(texts)} forget_mia texts, {n_tokens} tokens (cut to the context of {bb.max_length}); "
          f"fastest of {args.rounds} round(s), after a warm-up")
    print("| groups | seconds | ratio to groups = 8 |")
    print("|---|---|---|")
    for g, t in times.items():
        print(f"| {'length (PLL)' if g == 10**6 else g} | {t:.3f} | {t / times[8]:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--bench-data", required=True, help="folder holding rwku/")
    ap.add_argument("--model", default=None, help="a checkpoint (default: the toy model, trained here)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--target", default="Stephen King")
    ap.add_argument("--alphas", default="4,8,16,32")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--n-mc", type=int, default=8)
    ap.add_argument("--texts", type=int, default=20, help="cost: forget_mia texts scored")
    ap.add_argument("--rounds", type=int, default=3, help="cost: rounds, each timing every setting once")
    ap.add_argument("--bpe", action="store_true", help="toy model with a byte-level BPE tokenizer (400 pieces) "
                    "instead of the word tokenizer: the target's name is then several shared pieces")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",")]
    if not set(parts) <= set(PARTS) or len(set(parts)) != len(parts):
        ap.error(f"--parts takes distinct names among {', '.join(PARTS)}, got {args.parts!r}")
    try:
        args.alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError:
        ap.error(f"--alphas takes comma-separated numbers, got {args.alphas!r}")
    if not all(math.isfinite(a) and a > 0 for a in args.alphas):
        ap.error(f"--alphas takes finite numbers > 0, got {args.alphas}")
    for flag, value in (("--seeds", args.seeds), ("--n-mc", args.n_mc), ("--texts", args.texts),
                        ("--rounds", args.rounds), ("--threads", args.threads)):
        if value < 1:
            ap.error(f"{flag} must be >= 1, got {value}")
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", UserWarning)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        bb = load_backbone(args.model, device=args.device) if args.model else toy_model(args.bench_data, args.target,
                                                                                         Path(tmp), args.bpe)
        kind = args.model or f"toy, {'BPE' if args.bpe else 'word'} tokenizer, trained here"
        print(f"model: {kind}, {bb.n_layers} layers, built in {time.perf_counter() - t0:.1f}s")
        print(setting(bb.device))
        for part in parts:
            {"selectivity": selectivity, "cost": cost}[part](bb, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(script(main))

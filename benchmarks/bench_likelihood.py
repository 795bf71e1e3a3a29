"""Monte-Carlo likelihood speed: rows/s of `log_likelihood_batch` against its throughput floor.

    python benchmarks/bench_likelihood.py                     # embedded model + random d=1024 model
    python benchmarks/bench_likelihood.py --models embedded --n-mc 32 --json out.json

A row is one Monte-Carlo sample (one noisy copy of [prompt | answer], one forward row). The floor
(`timerome.throughput`) is the row-blocks the estimator needs, n_mc rows per pair (one for a
one-token answer) through every block, each weighed by its row's length and charged at the model's
best batched throughput measured here (rows x blocks per second at the best batch size, at a few
of the rows' lengths; the best token rate is charged to all). Goal: <= 1.3x the floor.

  embedded  the evaluation's pairs (forget01, 40 retain, 20 real-authors, 20 world-facts questions
            with their answers), as `evaluation.score_split` scores them.
  random    a random LLaDA-structure model (--hidden 1024, --layers 8, vocab 4096) on --pairs
            random pairs: prompts of 16..63 tokens, answers of 1..24 tokens (seeded).
Timer: process CPU time with one thread on CPU (--clock wall for wall time), wall time on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_edit_memory import random_backbone, sync  # noqa: E402  (a sibling script)

from timerome.likelihood import default_max_tokens, log_likelihood_batch  # noqa: E402
from timerome.throughput import bench_clock, best_throughput, floor_seconds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="embedded,random")
    ap.add_argument("--n-mc", type=int, default=16)
    ap.add_argument("--max-tokens", default="default",
                    help="comma-separated max_tokens values to time ('default': the library's for this device)")
    ap.add_argument("--pairs", type=int, default=64, help="random model: pairs scored")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--lengths", type=int, default=5, help="row lengths at which the throughput is measured")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each configuration (fastest kept)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    clock, label = bench_clock(args.clock, args.device, args.threads)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, clock: {label}")
    out = {}
    for name in [m for m in args.models.split(",") if m]:
        bb, prompts, answers = (embedded_pairs(args) if name == "embedded" else random_pairs(args))
        out[name] = bench(bb, prompts, answers, args, clock)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def embedded_pairs(args):
    from timerome.backbones import load_backbone
    from timerome.encoding import encode_pairs
    from timerome.evaluation import eval_rows

    bb = load_backbone(device=args.device)
    rows = [r for rs in eval_rows("embedded").values() for r in rs]
    pairs = encode_pairs(bb, rows)
    return bb, [p for p, _ in pairs], [a for _, a in pairs]


def random_pairs(args):
    bb = random_backbone(args.device, hidden=args.hidden, layers=args.layers, vocab=4096, context=128)
    g = torch.Generator().manual_seed(0)
    V = bb.vocab_size - 1
    P = torch.randint(16, 64, (args.pairs,), generator=g).tolist()
    A = torch.randint(1, 25, (args.pairs,), generator=g).tolist()
    prompts = [torch.randint(0, V, (p,), generator=g).tolist() for p in P]
    answers = [torch.randint(0, V, (a,), generator=g).tolist() for a in A]
    return bb, prompts, answers


def bench(bb, prompts, answers, args, clock) -> dict:
    rows_per_pair = [1 if len(a) == 1 else args.n_mc for a in answers]
    lengths = [len(p) + len(a) for p, a in zip(prompts, answers)]
    n_rows = sum(rows_per_pair)
    token_blocks = bb.n_layers * sum(r * L for r, L in zip(rows_per_pair, lengths))
    probe = sorted(set(int(q) for q in torch.tensor(lengths).float().quantile(
        torch.linspace(0, 1, args.lengths)).round().tolist()))
    print(f"\n== {bb.name} ({bb.n_layers} layers, d={bb.hidden_size}): {len(prompts)} pairs, n_mc={args.n_mc}, "
          f"{n_rows} rows of {min(lengths)}..{max(lengths)} tokens ==")
    with torch.no_grad():
        log_likelihood_batch(bb, prompts[:4], answers[:4], n_mc=args.n_mc)  # warm-up
        rates = [best_throughput(bb, L, clock=clock) for L in probe]
    floor_s = floor_seconds(token_blocks=token_blocks, rates=rates)
    best = max(rates, key=lambda r: r.token_blocks_per_s)
    print("throughput  " + "; ".join(f"L={r.length}: {r.row_blocks_per_s:,.0f} row-blocks/s at {r.rows} rows"
                                     for r in rates))
    print(f"floor       {floor_s:.3f} s ({n_rows} rows x {bb.n_layers} blocks, {token_blocks} token-blocks at the "
          f"best {best.token_blocks_per_s:,.0f}/s, L={best.length}): {n_rows / floor_s:,.0f} rows/s")
    runs = []
    for mt in [default_max_tokens(bb.device) if m == "default" else int(m) for m in args.max_tokens.split(",")]:
        times = []
        for _ in range(args.repeats):
            sync(bb.device)
            t = clock()
            with torch.no_grad():
                log_likelihood_batch(bb, prompts, answers, n_mc=args.n_mc, max_tokens=mt)
            sync(bb.device)
            times.append(clock() - t)
        s = min(times)
        runs.append(dict(max_tokens=mt, seconds=s, rows_per_s=n_rows / s, cost_multiple=s / floor_s))
        print(f"max_tokens {mt:>6}: {s:.3f} s, {n_rows / s:,.0f} rows/s, {s / floor_s:.2f} x the floor (goal <= 1.3x)")
    return dict(model=bb.name, layers=bb.n_layers, hidden=bb.hidden_size, pairs=len(prompts), n_mc=args.n_mc,
                rows=n_rows, token_blocks=token_blocks, floor_seconds=floor_s, floor_rows_per_s=n_rows / floor_s,
                throughput={r.length: dict(rows=r.rows, row_blocks_per_s=r.row_blocks_per_s, by_rows=r.table) for r in rates},
                runs=runs)


if __name__ == "__main__":
    raise SystemExit(main())

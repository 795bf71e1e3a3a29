"""Causal-trace speed: the wavefront `trace` against the naive loop and against the forward-pass floor.

    python benchmarks/bench_trace.py            # embedded default model, its 8 validation facts
    python benchmarks/bench_trace.py --tiny     # a tiny random model (when the embedded one is absent)
    python benchmarks/bench_trace.py --tiny --layers 8 --hidden 512   # a wider random model, where
                                                # compute rather than per-call overhead dominates

Prints, from one run:
- naive wall time: one full single-row trajectory per (fact, layer, step, module, noise sample),
  measured on a subset of coordinates and extrapolated per trajectory (or measured in full with
  --full-naive); the subset's TIE values are checked against the fast trace's;
- fast wall time and the speed-up, with and without layer reuse (splicing rows skip the blocks
  below their layer, taking them from their corrupted row), and how many block computations it saves;
- the fast trace's cost as a multiple of its floor: the minimum number of single-sequence
  forwards the definition needs (clean K+1, corrupted N(K+1), and K-k+1 per patch run at step k)
  times the time of one single-sequence forward, measured here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from timerome.backbones import DEFAULT_MODEL_DIR, load_backbone
from timerome.encoding import encode_fact
from timerome.tracing import naive_tie, trace

TINY_FACTS = [  # every word is in the tiny checkpoints' vocabulary
    ("the author", "where was the author born ?", "city of books"),
    ("her first", "what was her first genre ?", "mystery poetry"),
    ("his first", "what did his first novels win ?", "award prize"),
    ("the author", "when did the author write about sea rain ?", "night"),
    ("her", "who is her first author ?", "the author of mystery"),
    ("his", "what genre did his novels write about ?", "sea rain night"),
    ("the author", "what prize did the author win first ?", "poetry award prize"),
    ("her novels", "what were her novels about ?", "the sea and rain"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="use a random-initialised model (see --layers, --hidden)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the --tiny model")
    ap.add_argument("--hidden", type=int, default=128, help="hidden size of the --tiny model")
    ap.add_argument("--facts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--naive-coords", type=int, default=8, help="coordinates in the naive subset")
    ap.add_argument("--full-naive", action="store_true", help="run the naive loop on everything")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        bb, facts = _model_and_facts(args, tmp)
        return _bench(args, bb, facts)


def _bench(args, bb, facts) -> int:
    K, N = args.steps, args.samples
    C = 3 * bb.n_layers
    print(f"model {bb.name} ({bb.n_layers} layers, d={bb.hidden_size}) on {bb.device}, "
          f"{torch.get_num_threads()} threads; {len(facts)} facts, K={K}, N={N} noise samples, {C} sites")

    # floor: the single-sequence forwards the definition needs, and what one costs here
    items = [encode_fact(bb, f, i) for i, f in enumerate(facts)]
    per_fact = (K + 1) * (1 + N) + C * N * sum(K - k + 1 for k in range(K))
    one = {L: _time_forward(bb, L) for L in sorted({len(it.prompt_ids) + len(it.object_ids) for it in items})}
    floor_s = sum(per_fact * one[len(it.prompt_ids) + len(it.object_ids)] for it in items)
    min_forwards = per_fact * len(items)

    trace(bb, facts[:1], steps=K, n_samples=N, batch_size=args.batch_size, progress=False)  # warm-up
    # ablations: batching + prefix reuse only; + shared rows (every row runs every block); everything
    plain, plain_s = _timed_trace(args, bb, facts, share_rows=False, reuse_layers=False)
    whole, whole_s = _timed_trace(args, bb, facts, reuse_layers=False)
    fast, fast_s = _timed_trace(args, bb, facts)
    plain_err = float((plain.tie - fast.tie).abs().max())
    reuse_err = float((whole.tie_full - fast.tie_full).nan_to_num().abs().max())

    # naive: every coordinate of the first fact, or a seeded subset of them
    coords = [(l, k, m) for m in fast.modules for l in range(bb.n_layers) for k in range(K)]
    sub_facts = facts if args.full_naive else facts[:1]
    if not args.full_naive:
        g = torch.Generator().manual_seed(0)
        coords = [coords[i] for i in torch.randperm(len(coords), generator=g)[:args.naive_coords].tolist()]
    t = time.perf_counter()
    # the s3 sigma depends on the facts traced: hand the full trace's sigma to the subset
    ntie, _ = naive_tie(bb, sub_facts, coords, steps=K, n_samples=N, sigma=fast.settings["sigma"])
    naive_sub_s = time.perf_counter() - t
    trajectories_run = len(sub_facts) * (1 + N + len(coords) * N)
    trajectories_all = len(facts) * (1 + N + C * K * N)
    naive_s = naive_sub_s / trajectories_run * trajectories_all
    ftie = torch.stack([fast.tie[:len(sub_facts), fast.modules.index(m), l, k] for l, k, m in coords], 1)
    err = float((ftie - ntie).abs().max())

    speedup = naive_s / fast_s
    cost = fast_s / floor_s
    rows_run, calls = fast.stats["rows_run"], fast.stats["forwards"]
    blocks_on, blocks_off = fast.stats["block_rows"], whole.stats["block_rows"]
    print(f"naive check      {len(sub_facts)} fact(s) x {len(coords)} coordinates x {N} samples: "
          f"{trajectories_run} trajectories in {naive_sub_s:.2f} s; max |TIE fast - naive| = {err:.2e} nats")
    print(f"naive wall time  {naive_s:8.2f} s  ({'measured' if args.full_naive else 'extrapolated'}: "
          f"{trajectories_all} trajectories x {K + 1} forwards)")
    print(f"fast, no sharing {plain_s:8.2f} s  (batching + corrupted-prefix reuse only: "
          f"{plain.stats['rows_run']} rows in {plain.stats['forwards']} batched forwards; "
          f"speed-up {naive_s / plain_s:.1f} x, cost {plain_s / floor_s:.2f} x the floor; "
          f"max |TIE - fast| = {plain_err:.1e})")
    print(f"fast, no reuse   {whole_s:8.2f} s  (no layer reuse: {whole.stats['rows_run']} rows in "
          f"{whole.stats['forwards']} batched forwards, {blocks_off} row-blocks computed; "
          f"speed-up {naive_s / whole_s:.1f} x, cost {whole_s / floor_s:.2f} x the floor)")
    print(f"fast wall time   {fast_s:8.2f} s  (with layer reuse: {rows_run} rows in {calls} batched forwards, "
          f"{blocks_on} row-blocks computed)")
    print(f"speed-up         {speedup:8.1f} x   (goal >= 5x)")
    print(f"forward floor    {min_forwards} single-sequence forwards x "
          f"{1e3 * statistics.mean(one.values()):.2f} ms (mean over lengths) = {floor_s:.2f} s")
    print(f"cost multiple    {cost:8.2f} x the floor   (goal <= 1.5x). Below 1: rows are batched, and rows "
          f"whose (noise, x_k) coincide share one run, so {rows_run} rows replace the {min_forwards}")
    print(f"layer reuse      {whole_s / fast_s:8.2f} x   (splicing rows take blocks 0..l-1 from their corrupted "
          f"row: {blocks_on} of {blocks_off} row-blocks computed ({1 - blocks_on / blocks_off:.0%} fewer) "
          f"in {calls} forwards instead of {whole.stats['forwards']}; max |TIE with - without| = {reuse_err:.1e})")
    ok = err < 1e-4 and plain_err < 1e-4 and reuse_err < 1e-4
    print("fast == naive: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


def _timed_trace(args, bb, facts, **switches):
    """(trace result, wall seconds) of the fast trace with the engine's switches (share_rows, reuse_layers)."""
    _sync(bb)
    t = time.perf_counter()
    r = trace(bb, facts, steps=args.steps, n_samples=args.samples, batch_size=args.batch_size, progress=False,
              **switches)
    _sync(bb)
    return r, time.perf_counter() - t


def _model_and_facts(args, tmp: str):
    if not args.tiny and not (DEFAULT_MODEL_DIR / "config.json").exists():
        sys.exit(f"the embedded default model is absent ({DEFAULT_MODEL_DIR}); run with --tiny")
    if not args.tiny:
        from timerome.tracing import default_facts

        return load_backbone(device=args.device), default_facts(args.facts)
    from timerome.backbones.tiny import make_tiny_checkpoint

    d = make_tiny_checkpoint("timerome", tmp, layers=args.layers, hidden=args.hidden)
    facts = [dict(fact_id=str(i), subject=s, prompt=p, object=o) for i, (s, p, o) in enumerate(TINY_FACTS)]
    return load_backbone(d, device=args.device), facts[:args.facts]


@torch.no_grad()
def _time_forward(bb, length: int, repeats: int = 30) -> float:
    """Median seconds of one [1, length] forward (the unit of the floor)."""
    x = torch.full((1, length), bb.mask_id, device=bb.device)
    times = []
    for i in range(repeats + 3):
        _sync(bb)
        t = time.perf_counter()
        bb.logits(x)
        _sync(bb)
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _sync(bb):
    if bb.device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    raise SystemExit(main())

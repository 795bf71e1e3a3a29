"""Causal-trace speed: the wavefront `trace` against the naive loop and against its throughput floor.

    python benchmarks/bench_trace.py            # embedded default model, its 8 validation facts
    python benchmarks/bench_trace.py --tiny     # a tiny random model (when the embedded one is absent)
    python benchmarks/bench_trace.py --tiny --layers 4 --hidden 1024 --facts 2 --no-ablations
                                                # a wide random model, where compute dominates
    python benchmarks/bench_trace.py --llada8b --device cuda --dtype bfloat16 --no-ablations --repeats 1
                                                # LLaDA-8B's shapes (a GPU with ~20 GB free in bfloat16)

Prints, from one run:
- naive wall time: one full single-row trajectory per (fact, layer, step, module, noise sample),
  measured on a subset of coordinates and extrapolated per trajectory (or measured in full with
  --full-naive); the subset's TIE values are checked against the fast trace's;
- fast wall time and the speed-up, with and without layer reuse (splicing rows skip the blocks
  below their layer, taking them from their corrupted row), and how many block computations it saves;
  layer reuse, packed splices, the masked head, the assembled MLP and the sampler's float32 screen,
  each against the trace without it in 6 interleaved pairs, with the TIE checked equal; the blocks
  run in tiles of the device's tokens per forward (`hooks.row_tiles`) against whole batches; and
  the read-out's argmax
  (`sampler.row_max` against torch's max(-1), on the trace's logits shape and on a 126,464-token
  vocabulary, same indices checked);
- the fast trace's cost as a multiple of its floor (`timerome.engine.throughput`): the row-blocks the
  definition needs (`trace_engine` counts them as `min_block_rows`: at every step where its fact
  still has a masked answer position, the clean row and each distinct (noise sample, x_j) state
  through every block, each splicing row through the blocks above its layer only), each at the
  model's best batched throughput of its blocks measured here (forwards cut after the last block,
  rows x blocks per second at the best batch size, at the row's own length:
  `throughput.floor_by_length`), plus the head at the positions read (`min_head_positions`, at the
  best rate of the read-out of log-probabilities: final norm, head and log-normaliser, which reading
  log p(o) at a position must compute however it is done, `throughput.head_throughput(log_normaliser=True)`;
  the multiple against a floor charging the logits alone is printed beside it); in 2 x --repeats rounds, each a timed trace and
  then the best batch sizes timed again (`throughput.retimed`), the multiple being the median of the
  rounds' ratios (the machine's speed drifts by 10-20 % within a run; a ratio of two times taken
  seconds apart does not); and
  against the strict floor, which charges every token-block the best token rate of any length
  (`throughput.floor_seconds`); and where the multiple comes from: the row-blocks computed at the best
  rates, the trace's block calls timed alone at the shapes they ran (`throughput.timed_block_calls`: a
  forward of each shape cut after its first 4 blocks, each round), the head's floor, and the rest (the
  trace less its block calls and the head's floor).
  The old unit, one single-sequence forward, read 0.05x on the embedded model: no floor at all.
--llada8b: a random model of LLaDA-8B's shapes (H 4096, 32 heads, MLP 12288, vocabulary 126,464, 32 blocks,
or --layers), its blocks copies of one random block (`tiny.random_backbone(copy_blocks=True)`: a block's time
does not depend on its values), reading the tiny word tokenizer's facts (--tiny's); --dtype casts it.
Timer: process CPU time with one thread on CPU (steadiest on a shared machine; --clock wall for
wall time), wall time on a GPU; the floor is measured with the same timer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from timerome.backbones import DEFAULT_MODEL_DIR, load_backbone
from timerome.common.allocator import MALLOC_CHOICES, MALLOC_HELP
from timerome.common.cost import sync
from timerome.engine.encoding import encode_fact
from timerome.engine.likelihood import default_max_tokens
from timerome.engine.sampler import row_max
from timerome.engine.throughput import (best_throughput, block_calls, floor_by_length, floor_seconds,
                                        head_throughput, retimed, timed_block_calls, timing_clock)
from timerome.errors import script
from timerome.tracing.causal_trace import naive_tie, trace

CLOCK, LABEL = time.perf_counter, "wall time"

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
    ap.add_argument("--layers", type=int, default=None, help="layers of the --tiny model (4) or the --llada8b one (32)")
    ap.add_argument("--llada8b", action="store_true",
                    help="a random model of LLaDA-8B's shapes, its blocks copies of one (the docstring)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="--tiny / --llada8b: the model's dtype (the embedded model stays float32)")
    ap.add_argument("--hidden", type=int, default=128, help="hidden size of the --tiny model")
    ap.add_argument("--facts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--naive-coords", type=int, default=8, help="coordinates in the naive subset")
    ap.add_argument("--full-naive", action="store_true", help="run the naive loop on everything")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="2 x this many rounds, each a timed fast trace then the floor's best batch sizes timed again; the "
                         "multiple is the median of the rounds' ratios")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default 1 with the CPU clock)")
    ap.add_argument("--malloc", choices=MALLOC_CHOICES, default="kept", help=MALLOC_HELP)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto",
                    help="process CPU time (auto on CPU) or wall time (auto on GPU)")
    ap.add_argument("--no-ablations", action="store_true",
                    help="time only the fast trace against its floor (no naive loop, no switched-off variants)")
    ap.add_argument("--json", default=None, help="write the figures to this JSON file")
    args = ap.parse_args()
    global CLOCK, LABEL
    CLOCK, LABEL = timing_clock(args.clock, args.device, args.threads, args.malloc)

    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        bb, facts = _model_and_facts(args, tmp)
        return _bench(args, bb, facts)


def _bench(args, bb, facts) -> int:
    K, N = args.steps, args.samples
    C = 3 * bb.n_layers
    dtype = str(bb.dtype).split(".")[-1]
    print(f"model {bb.name} ({bb.n_layers} layers, d={bb.hidden_size}, {dtype}) on {bb.device}, "
          f"{torch.get_num_threads()} threads, clock: {LABEL}; "
          f"{len(facts)} facts, K={K}, N={N} noise samples, {C} sites")
    items = [encode_fact(bb, f, i) for i, f in enumerate(facts)]
    lengths = sorted({len(it.prompt_ids) + len(it.object_ids) for it in items})

    t0 = CLOCK()
    st = trace(bb, facts, steps=K, n_samples=N, batch_size=args.batch_size, progress=False).stats  # warm-up
    sync(bb.device)
    # printed at once: on a large model the floor's timings below take minutes
    print(f"warm-up trace        {CLOCK() - t0:.2f} s  ({st['forwards']} forwards; computed "
          f"{st['block_rows'] / st['min_block_rows']:.2f} x the needed row-blocks)", flush=True)
    # the floor's best batch size at each length (and the rate tables), then rounds of a timed trace
    # followed by those sizes timed again: each round's trace is divided by the floor of the same
    # moment, so that a drift in the machine's speed hits both alike (the medians of the rounds)
    rates = [best_throughput(bb, L, clock=CLOCK, blocks_only=True) for L in lengths]
    # the head's floor: the read-out of log-probabilities (final norm, head, log-normaliser), which
    # reading log p(o) at a position needs however it is computed; the logits alone, the older floor, beside it
    head_rate = head_throughput(bb, clock=CLOCK, log_normaliser=True)
    logits_rate = head_throughput(bb, clock=CLOCK)
    head_s = st["min_head_positions"] / head_rate
    logits_s = st["min_head_positions"] / logits_rate
    computed = {}  # the row-blocks the trace computed, by length
    for length, rows, calls in block_calls(st["block_batches"]):
        computed[str(length)] = computed.get(str(length), 0) + calls * rows
    runs, floors, stricts, at_best, shaped = [], [], [], [], []
    for _ in range(2 * max(1, args.repeats)):
        runs.append(_timed_trace(args, bb, facts))
        now = [retimed(bb, r, clock=CLOCK, blocks_only=True) for r in rates]
        floors.append(floor_by_length(st["min_block_rows_by_length"], now) + head_s)
        stricts.append(floor_seconds(token_blocks=st["min_block_tokens"], rates=now) + head_s)
        at_best.append(floor_by_length(computed, now))
        # the trace's block calls run alone at their own shapes, at this round's speed too
        shaped.append(timed_block_calls(bb, st["block_batches"], clock=CLOCK))
    fast, fast_s = runs[0][0], statistics.median(t for _, t in runs)
    floor_s, strict_s = statistics.median(floors), statistics.median(stricts)
    ratios = [t / f for (_, t), f in zip(runs, floors)]
    multiple = statistics.median(ratios)
    strict_multiple = statistics.median(t / f for (_, t), f in zip(runs, stricts))
    logits_multiple = statistics.median(t / (f - head_s + logits_s) for (_, t), f in zip(runs, floors))
    best = max(rates, key=lambda r: r.token_blocks_per_s)
    out = dict(model=bb.name, layers=bb.n_layers, hidden=bb.hidden_size, dtype=dtype, facts=len(facts), steps=K,
               samples=N,
               fast_seconds=fast_s, fast_runs=[t for _, t in runs], floor_seconds=floor_s, floor_runs=floors,
               cost_multiple=multiple, cost_multiples=ratios,
               strict_floor_seconds=strict_s, strict_cost_multiple=strict_multiple, head_floor_seconds=head_s,
               head_logits_only_seconds=logits_s, cost_multiple_logits_only_head=logits_multiple,
               min_block_rows=st["min_block_rows"], block_rows=st["block_rows"],
               min_head_positions=st["min_head_positions"], head_positions=st["head_positions"],
               rows_run=st["rows_run"], forwards=st["forwards"], head_positions_per_s=head_rate,
               head_logits_positions_per_s=logits_rate,
               throughput={r.length: dict(rows=r.rows, row_blocks_per_s=r.row_blocks_per_s, by_rows=r.table) for r in rates})
    print(f"fast trace       {fast_s:8.2f} s  (median of {len(runs)} rounds: "
          f"{', '.join(f'{t:.2f}' for _, t in runs)}; "
          f"{st['rows_run']} rows in {st['forwards']} batched forwards, "
          f"{st['block_rows']} row-blocks and {st['head_positions']} head positions computed)")
    print("block throughput " + "; ".join(f"L={r.length}: {r.row_blocks_per_s:,.0f} row-blocks/s at {r.rows} rows"
                                          for r in rates) + f"; head {head_rate:,.0f} positions/s with the log-normaliser, "
          f"{logits_rate:,.0f} logits alone")
    need = st["min_block_rows_by_length"]
    print(f"throughput floor {floor_s:8.2f} s  ({st['min_block_rows']} row-blocks the definition needs ("
          + ", ".join(f"{n} at L={length}" for length, n in sorted(need.items(), key=lambda kv: int(kv[0])))
          + f"), each at the best blocks-only rate of its length, timed again after each round's trace, + "
          f"{st['min_head_positions']} head positions at the best rate of the head and its log-normaliser: {head_s:.2f} s; median of "
          f"{', '.join(f'{f:.2f}' for f in floors)})")
    print(f"cost multiple    {multiple:8.2f} x the floor   (goal <= 1.2x; median of the rounds' "
          f"{', '.join(f'{r:.2f}' for r in ratios)}); computed "
          f"{st['block_rows'] / st['min_block_rows']:.2f} x the needed row-blocks, "
          f"{st['head_positions'] / max(1, st['min_head_positions']):.2f} x the needed head positions; "
          f"{logits_multiple:.2f} x a floor charging the head's logits only ({logits_s:.2f} s), not their log-normaliser")
    print(f"strict floor     {strict_s:8.2f} s  ({st['min_block_tokens']} token-blocks, all at the best token "
          f"rate {best.token_blocks_per_s:,.0f}/s, L={best.length}, + the head): {strict_multiple:.2f} x")
    # where the multiple comes from: rows computed beyond the needed ones, batch sizes other than the
    # best (the block calls timed alone at the shapes they had), and the time outside the blocks beyond the
    # head's floor; each a median of the rounds
    best_s, shapes_s = statistics.median(at_best), statistics.median(shaped)
    rest_s = statistics.median(t - b - head_s for (_, t), b in zip(runs, shaped))
    print(f"where it goes    the computed row-blocks at the best rates {best_s:.2f} s "
          f"({st['block_rows'] / st['min_block_rows']:.2f} x the needed); the trace's block calls timed alone at the "
          f"shapes they ran {shapes_s:.2f} s (a forward of each (rows, length) they had, cut after its first 4 "
          f"blocks, each round); "
          f"the head at its floor {head_s:.2f} s; the rest {rest_s:.2f} s ({rest_s / floor_s:.2f} x the floor: the "
          f"trace less its block calls and the head's floor, per round: the head beyond its floor, its argmax, the "
          f"sampler step, the engine's bookkeeping, each forward's own fixed costs)")
    out.update(computed_at_best_seconds=best_s, block_calls_at_their_shapes_seconds=shapes_s,
               block_calls_at_their_shapes_runs=shaped, rest_seconds=rest_s,
               block_batches=st["block_batches"])
    ok = True
    if not args.no_ablations:
        ok = _ablations(args, bb, facts, fast, fast_s, floor_s, out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


def _ablations(args, bb, facts, fast, fast_s, floor_s, out) -> bool:
    """The naive loop (a subset, extrapolated) and the engine with its savings switched off."""
    K, N = args.steps, args.samples
    C = 3 * bb.n_layers
    plain, plain_s = _timed_trace(args, bb, facts, share_rows=False, reuse_layers=False, pack_splices=False,
                                  head="full")
    # each saving against the trace without it in interleaved pairs (a single run against the rounds' median
    # put one run's noise in the ratio): the medians of 6 pairs each
    (_, packed_s), (unpacked, unpacked_s) = _interleaved(args, bb, facts, {}, dict(pack_splices=False))
    (_, masked_s), (full_head, full_head_s) = _interleaved(args, bb, facts, {}, dict(head="full"))
    pack_err = float((unpacked.tie_full - fast.tie_full).nan_to_num().abs().max())
    head_err = float((full_head.tie_full - fast.tie_full).nan_to_num().abs().max())
    # the screen saves a few percent, the row tiles a few or none: each timed in interleaved pairs
    (_, screened_s), (unscreened, unscreened_s) = _interleaved(args, bb, facts, dict(screen_reveal=True),
                                                                dict(screen_reveal=False))
    screen_equal = torch.equal(unscreened.tie_full.nan_to_num(), fast.tie_full.nan_to_num())
    (_, assembled_s), (unassembled, unassembled_s) = _interleaved(args, bb, facts, dict(assemble_mlp=True),
                                                                  dict(assemble_mlp=False))
    assemble_equal = torch.equal(unassembled.tie_full.nan_to_num(), fast.tie_full.nan_to_num())
    on = default_max_tokens(bb.device)  # blocks in tiles of at most 1024 tokens (the default on a CPU)
    (tiled, tiled_s), (untiled, untiled_s) = _interleaved(args, bb, facts, dict(block_tokens=on),
                                                          dict(block_tokens=0))
    tiles_equal = (torch.equal(untiled.tie_full.nan_to_num(), fast.tie_full.nan_to_num())
                   and torch.equal(tiled.tie_full.nan_to_num(), fast.tie_full.nan_to_num()))
    (_, reused_s), (whole, whole_s) = _interleaved(args, bb, facts, {}, dict(reuse_layers=False))
    plain_err = float((plain.tie - fast.tie).abs().max())
    reuse_err = float((whole.tie_full - fast.tie_full).nan_to_num().abs().max())

    # naive: every coordinate of the first fact, or a seeded subset of them
    coords = [(l, k, m) for m in fast.modules for l in range(bb.n_layers) for k in range(K)]
    sub_facts = facts if args.full_naive else facts[:1]
    if not args.full_naive:
        g = torch.Generator().manual_seed(0)
        coords = [coords[i] for i in torch.randperm(len(coords), generator=g)[:args.naive_coords].tolist()]
    t = CLOCK()
    # the s3 sigma depends on the facts traced: hand the full trace's sigma to the subset
    ntie, _ = naive_tie(bb, sub_facts, coords, steps=K, n_samples=N, sigma=fast.settings["sigma"])
    naive_sub_s = CLOCK() - t
    trajectories_run = len(sub_facts) * (1 + N + len(coords) * N)
    trajectories_all = len(facts) * (1 + N + C * K * N)
    naive_s = naive_sub_s / trajectories_run * trajectories_all
    ftie = torch.stack([fast.tie[:len(sub_facts), fast.modules.index(m), l, k] for l, k, m in coords], 1)
    err = float((ftie - ntie).abs().max())
    blocks_on, blocks_off = fast.stats["block_rows"], whole.stats["block_rows"]
    print(f"naive check      {len(sub_facts)} fact(s) x {len(coords)} coordinates x {N} samples: "
          f"{trajectories_run} trajectories in {naive_sub_s:.2f} s; max |TIE fast - naive| = {err:.2e} nats")
    print(f"naive loop       {naive_s:8.2f} s  ({'measured' if args.full_naive else 'extrapolated'}: "
          f"{trajectories_all} trajectories x {K + 1} forwards); {naive_s / floor_s:.1f} x the floor")
    print(f"fast, no sharing {plain_s:8.2f} s  (batching + corrupted-prefix reuse only: "
          f"{plain.stats['rows_run']} rows in {plain.stats['forwards']} batched forwards; "
          f"speed-up {naive_s / plain_s:.1f} x, cost {plain_s / floor_s:.2f} x the floor; "
          f"max |TIE - fast| = {plain_err:.1e})")
    print(f"fast, no reuse   {whole_s:8.2f} s  (no layer reuse: {whole.stats['rows_run']} rows in "
          f"{whole.stats['forwards']} batched forwards, {blocks_off} row-blocks computed; "
          f"speed-up {naive_s / whole_s:.1f} x, cost {whole_s / floor_s:.2f} x the floor)")
    print(f"speed-up         {naive_s / fast_s:8.1f} x   (goal >= 5x)")
    print(f"layer reuse      {whole_s / reused_s:8.2f} x   (splicing rows take blocks 0..l-1 from their corrupted "
          f"row: {blocks_on} of {blocks_off} row-blocks computed ({1 - blocks_on / blocks_off:.0%} fewer) "
          f"in {fast.stats['forwards']} forwards instead of {whole.stats['forwards']}; {reused_s:.2f} s against "
          f"{whole_s:.2f} s, medians of 6 interleaved pairs; max |TIE with - without| = {reuse_err:.1e})")
    print(f"packed splices   {unpacked_s / packed_s:8.2f} x   (attn / mlp splices run their layer at the subject tokens "
          f"only: {unpacked.stats['block_rows']} row-blocks without, {blocks_on} with; {packed_s:.2f} s against "
          f"{unpacked_s:.2f} s, medians of 6 interleaved pairs; max |TIE with - without| = {pack_err:.1e})")
    print(f"assembled mlp    {unassembled_s / assembled_s:8.2f} x   (mlp splices above layer 0 summed from the "
          f"block's own outputs, no packed row: {unassembled.stats['block_rows']} row-blocks without, {blocks_on} "
          f"with; {assembled_s:.2f} s against {unassembled_s:.2f} s, medians of 6 interleaved pairs; TIE identical: "
          f"{'yes' if assemble_equal else 'NO'})")
    print(f"masked head      {full_head_s / masked_s:8.2f} x   (the head at the positions read only: "
          f"{full_head.stats['head_positions']} positions with the full head, {fast.stats['head_positions']} masked; "
          f"{masked_s:.2f} s against {full_head_s:.2f} s, medians of 6 interleaved pairs; max |TIE with - without| = "
          f"{head_err:.1e})")
    print(f"float32 screen   {unscreened_s / screened_s:8.2f} x   (the sampler step orders each row's confidences by "
          f"a float32 sum with a proven error bound, the float64 softmax only where the bound cannot settle the row: "
          f"{screened_s:.2f} s against {unscreened_s:.2f} s with the float64 softmax everywhere, medians of 6 "
          f"interleaved pairs; TIE identical: {'yes' if screen_equal else 'NO'})")
    print(f"row tiles        {untiled_s / tiled_s:8.2f} x   (each block runs on tiles of at most "
          f"{on} tokens where a forward holds more, `hooks.row_tiles`, the default on a CPU: {tiled_s:.2f} s "
          f"against {untiled_s:.2f} s with whole batches, medians of 6 interleaved pairs; "
          f"{sum(tiled.stats['block_batches'].values())} block calls tiled, {sum(untiled.stats['block_batches'].values())} "
          f"whole; TIE identical: {'yes' if tiles_equal else 'NO'})")
    out.update(untiled_seconds=untiled_s, tiled_seconds=tiled_s, tiles_identical=tiles_equal,
               unassembled_seconds=unassembled_s, assembled_seconds=assembled_s, assemble_identical=assemble_equal,
               unassembled_block_rows=unassembled.stats["block_rows"], packed_seconds=packed_s,
               unpacked_seconds=unpacked_s, masked_head_seconds=masked_s, full_head_seconds=full_head_s,
               reused_seconds=reused_s, no_reuse_seconds=whole_s)
    # the read-out's argmax: row_max against torch's max(-1) on the trace's logits shape and on
    # LLaDA-8B's vocabulary (interleaved medians; the same values and indices, checked)
    argmax = {}
    for M, V in ((600, bb.vocab_size), (16, 126464)):
        lg = torch.randn(M, V, generator=torch.Generator().manual_seed(V))
        same = torch.equal(lg.max(-1).indices, row_max(lg).indices)
        t_max, t_row = [], []
        for _ in range(30):
            for fn, acc in ((lambda: lg.max(-1), t_max), (lambda: row_max(lg), t_row)):
                t = CLOCK()
                fn()
                acc.append(CLOCK() - t)
        argmax[f"{M}x{V}"] = dict(max_ms=statistics.median(t_max) * 1e3, row_max_ms=statistics.median(t_row) * 1e3,
                                  same=same)
    print("row max          " + "; ".join(f"[{k}] {v['max_ms']:.3f} ms with max(-1), {v['row_max_ms']:.3f} ms with "
                                          f"sampler.row_max ({v['max_ms'] / v['row_max_ms']:.1f}x, same: "
                                          f"{'yes' if v['same'] else 'NO'})" for k, v in argmax.items()))
    out.update(row_max=argmax)
    out.update(no_packing_seconds=unpacked_s, full_head_seconds=full_head_s, max_err_no_packing=pack_err,
               max_err_full_head=head_err, float64_reveal_seconds=unscreened_s, screen_identical=screen_equal)
    out.update(naive_seconds=naive_s, speedup=naive_s / fast_s, no_sharing_seconds=plain_s, no_reuse_seconds=whole_s,
               max_err_naive=err, max_err_no_sharing=plain_err, max_err_no_reuse=reuse_err)
    ok = (err < 1e-4 and plain_err < 1e-4 and reuse_err < 1e-4 and pack_err < 1e-4 and head_err < 1e-4 and screen_equal
          and tiles_equal and assemble_equal and all(v["same"] for v in argmax.values()))
    print("fast == naive: " + ("yes" if ok else "NO"))
    return ok


def _interleaved(args, bb, facts, on: dict, off: dict, pairs: int = 6):
    """The fast trace with the switches `on` and with `off`, timed in `pairs` interleaved pairs (which
    goes first alternates, so that drifts in the machine's speed hit both alike): ((result, median
    seconds) with `on`, the same with `off`)."""
    times, results = ([], []), [None, None]
    for i in range(pairs):
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            results[k], seconds = _timed_trace(args, bb, facts, **(on, off)[k])
            times[k].append(seconds)
    return (results[0], statistics.median(times[0])), (results[1], statistics.median(times[1]))


def _timed_trace(args, bb, facts, **switches):
    """(trace result, seconds) of the fast trace with the engine's switches (share_rows, reuse_layers,
    pack_splices, head, screen_reveal)."""
    sync(bb.device)
    t = CLOCK()
    r = trace(bb, facts, steps=args.steps, n_samples=args.samples, batch_size=args.batch_size, progress=False,
              **switches)
    sync(bb.device)
    return r, CLOCK() - t


def _model_and_facts(args, tmp: str):
    facts = [dict(fact_id=str(i), subject=s, prompt=p, object=o) for i, (s, p, o) in enumerate(TINY_FACTS)]
    if args.llada8b:
        from timerome.backbones.tiny import LLADA_8B, random_backbone, tokenizer_for_random

        s = LLADA_8B
        bb = random_backbone(args.device, hidden=s["hidden"], layers=args.layers or s["layers"], vocab=s["vocab"],
                             context=128, mlp=s["mlp"], heads=s["heads"], copy_blocks=True,
                             tokenizer=tokenizer_for_random(tmp), dtype=getattr(torch, args.dtype))
        bb.name = "random-llada8b-shapes"
        return bb, facts[:args.facts]
    if not args.tiny and not (DEFAULT_MODEL_DIR / "config.json").exists():
        sys.exit(f"the embedded default model is absent ({DEFAULT_MODEL_DIR}); run with --tiny")
    if not args.tiny:
        from timerome.tracing.causal_trace import default_facts

        return load_backbone(device=args.device), default_facts(args.facts)
    from timerome.backbones.tiny import make_tiny_checkpoint

    d = make_tiny_checkpoint("timerome", tmp, layers=args.layers or 4, hidden=args.hidden)
    return load_backbone(d, device=args.device, dtype=args.dtype), facts[:args.facts]



if __name__ == "__main__":
    raise SystemExit(script(main))

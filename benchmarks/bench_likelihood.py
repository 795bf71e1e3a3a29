"""Monte-Carlo likelihood speed: rows/s of `log_likelihood_batch` against its throughput floor.

    python benchmarks/bench_likelihood.py                     # embedded model + random d=1024 model
    python benchmarks/bench_likelihood.py --models embedded --n-mc 32 --json out.json
    python benchmarks/bench_likelihood.py --head masked,full  # the vocabulary head's two placements

A row is one Monte-Carlo sample (one noisy copy of [prompt | answer], one forward row). The floor
(`timerome.engine.throughput`) is the row-blocks any exact computation of the estimator must run: the
distinct rows only (the same prompt, answer and mask is one row however often it is drawn: a
two-token answer has three), through every block, each weighed by its row's length and charged at
the model's best batched throughput measured here (rows x blocks per second at the best batch
size, at a few of the rows' lengths; the best token rate is charged to all). Two rates are
measured: full forwards (embedding, blocks and the head at every position: the "floor") and the
blocks alone, the head never run (the "blocks floor", stricter: the head at the scored positions
is work the estimator needs but the floor does not charge), and the "true floor": the blocks floor
plus the head and its log-normaliser at the scored positions (`throughput.head_throughput(
log_normaliser=True)`), what reading those log-probabilities needs however it is done. Goal: <=
1.2x the true floor. Each timed run is followed by the blocks' best batch sizes timed again
(`throughput.retimed`), and each run is divided by the true floor of the same moment: the multiple is
the median of those ratios, so that a drift in the machine's speed hits both alike (as bench_trace.py
does; the head's rate is measured once, before).

The rows the library actually ran (counted at the embedding) are printed against the distinct
rows and the drawn ones (n_mc per pair, one for a one-token answer).

  embedded  the evaluation's pairs (forget01, 40 retain, 20 real-authors, 20 world-facts questions
            with their answers), as `evaluation.score_split` scores them.
  random    a random LLaDA-structure model (--hidden 1024, --layers 8, vocab 4096) on --pairs
            random pairs: prompts of 16..63 tokens, answers of 1..24 tokens (seeded).
Timer: process CPU time with one thread on CPU (--clock wall for wall time), wall time on a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from timerome.backbones.tiny import random_backbone
from timerome.common.allocator import MALLOC_CHOICES, MALLOC_HELP
from timerome.common.cost import sync
from timerome.engine.hooks import Hooks
from timerome.engine.likelihood import default_max_tokens, log_likelihood_batch, pair_masks
from timerome.engine.throughput import best_throughput, floor_seconds, head_throughput, retimed, timing_clock
from timerome.errors import script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="embedded,random")
    ap.add_argument("--n-mc", type=int, default=16)
    ap.add_argument("--max-tokens", default="default",
                    help="comma-separated max_tokens values to time ('default': the library's for this device)")
    ap.add_argument("--head", default="auto",
                    help="comma-separated head placements to time: auto, masked (scored positions only), full")
    ap.add_argument("--pairs", type=int, default=64, help="random model: pairs scored")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--lengths", type=int, default=5, help="row lengths at which the throughput is measured")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each configuration (the fastest printed; "
                                                           "the multiple is the median of the runs' ratios to their floor)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--malloc", choices=MALLOC_CHOICES, default="kept", help=MALLOC_HELP)
    ap.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - {"embedded", "random"}:  # any other name silently ran the random model
        ap.error(f"--models takes embedded and/or random, got {args.models!r}")
    heads = [h for h in args.head.split(",") if h]
    if not heads or set(heads) - {"auto", "masked", "full"}:
        ap.error(f"--head takes auto, masked and/or full, got {args.head!r}")
    if any(m != "default" and not m.isdigit() for m in args.max_tokens.split(",")):
        ap.error(f"--max-tokens takes 'default' or whole numbers, got {args.max_tokens!r}")
    clock, label = timing_clock(args.clock, args.device, args.threads, args.malloc)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, clock: {label}")
    out = {}
    for name in models:
        bb, prompts, answers = (embedded_pairs(args) if name == "embedded" else random_pairs(args))
        out[name] = bench(bb, prompts, answers, args, clock)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def embedded_pairs(args):
    from timerome.backbones import load_backbone
    from timerome.engine.encoding import encode_pairs
    from timerome.evaluation.evaluator import eval_rows

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


def distinct_rows(bb, prompts, answers, n_mc) -> tuple[list[int], int, int]:
    """(lengths of the distinct rows, rows drawn, positions scored in them): the rows
    log_likelihood_batch's estimator is made of, identical (prompt, answer, mask) rows counted once,
    as any exact computation needs them, and the masked positions whose log p it reads."""
    masks = pair_masks(bb, [len(a) for a in answers], n_mc=n_mc)
    seen = {(tuple(p), tuple(a), tuple(m.tolist())) for p, a, ms in zip(prompts, answers, masks) for m in ms}
    return [len(p) + len(a) for p, a, _ in seen], sum(len(m) for m in masks), sum(sum(m) for _, _, m in seen)


def bench(bb, prompts, answers, args, clock) -> dict:
    lengths, drawn, scored = distinct_rows(bb, prompts, answers, args.n_mc)
    n_rows = len(lengths)
    token_blocks = bb.n_layers * sum(lengths)
    probe = sorted(set(int(q) for q in torch.tensor(lengths).float().quantile(
        torch.linspace(0, 1, args.lengths)).round().tolist()))
    print(f"\n== {bb.name} ({bb.n_layers} layers, d={bb.hidden_size}, vocab {bb.vocab_size}): {len(prompts)} pairs, "
          f"n_mc={args.n_mc}, {drawn} rows drawn, {n_rows} distinct of {min(lengths)}..{max(lengths)} tokens ==")
    with torch.no_grad():
        log_likelihood_batch(bb, prompts[:4], answers[:4], n_mc=args.n_mc)  # warm-up
        rates = [best_throughput(bb, L, clock=clock) for L in probe]
        block_rates = [best_throughput(bb, L, clock=clock, blocks_only=True) for L in probe]
        head_rate = head_throughput(bb, clock=clock, log_normaliser=True)
    floor_s = floor_seconds(token_blocks=token_blocks, rates=rates)
    blocks_s = floor_seconds(token_blocks=token_blocks, rates=block_rates)
    true_s = blocks_s + scored / head_rate  # the blocks, then the head and its log-normaliser where a log p is read
    best = max(rates, key=lambda r: r.token_blocks_per_s)
    print("throughput  " + "; ".join(f"L={r.length}: {r.row_blocks_per_s:,.0f} row-blocks/s at {r.rows} rows"
                                     for r in rates))
    print("blocks only " + "; ".join(f"L={r.length}: {r.row_blocks_per_s:,.0f} row-blocks/s at {r.rows} rows"
                                     for r in block_rates))
    print(f"floor       {floor_s:.3f} s ({n_rows} distinct rows x {bb.n_layers} blocks, {token_blocks} token-blocks at "
          f"the best {best.token_blocks_per_s:,.0f}/s, L={best.length}): {n_rows / floor_s:,.0f} rows/s; "
          f"blocks floor {blocks_s:.3f} s; true floor {true_s:.3f} s (the blocks floor + the head and its "
          f"log-normaliser at the {scored} scored positions, {head_rate:,.0f}/s)")
    rows_run = []  # rows each forward embeds, counted by a hook that leaves the embedding unchanged
    count_rows = Hooks(bb, edit={(None, "embed"): lambda h, _state: rows_run.append(h.shape[0])})
    runs = []
    with count_rows:
        for head in [h for h in args.head.split(",") if h]:
            for mt in [default_max_tokens(bb.device) if m == "default" else int(m) for m in args.max_tokens.split(",")]:
                times, trues = [], []
                for _ in range(args.repeats):
                    rows_run.clear()
                    sync(bb.device)
                    t = clock()
                    with torch.no_grad():
                        log_likelihood_batch(bb, prompts, answers, n_mc=args.n_mc, max_tokens=mt, head=head)
                    sync(bb.device)
                    times.append(clock() - t)
                    ran = sum(rows_run)  # before the floor's forwards below, which the hook counts too
                    with torch.no_grad():  # the true floor at this moment's speed
                        now = [retimed(bb, r, clock=clock, blocks_only=True) for r in block_rates]
                    trues.append(floor_seconds(token_blocks=token_blocks, rates=now) + scored / head_rate)
                s, multiple = min(times), statistics.median(t / f for t, f in zip(times, trues))
                runs.append(dict(head=head, max_tokens=mt, seconds=s, seconds_runs=times, rows_run=ran,
                                 rows_per_s=n_rows / s, cost_multiple=s / floor_s, blocks_cost_multiple=s / blocks_s,
                                 true_floor_seconds_runs=trues, true_cost_multiple=multiple))
                # the goal is judged against the true floor: the "floor" runs the head at every position, which
                # the default head does not, so it is no lower bound (a run can beat it)
                print(f"head {head:>6}, max_tokens {mt:>6}: {s:.3f} s (fastest of {len(times)}), {ran} rows "
                      f"run, {n_rows / s:,.0f} distinct rows/s, {s / floor_s:.2f} x the full-forward floor (not a "
                      f"lower bound), {s / blocks_s:.2f} x the blocks floor, {multiple:.2f} x the true floor (median "
                      f"of the runs' ratios to the true floor retimed after each, {min(trues):.3f}-{max(trues):.3f} s; "
                      f"goal <= 1.2x: {'met' if multiple <= 1.2 else 'missed'})")
    return dict(model=bb.name, layers=bb.n_layers, hidden=bb.hidden_size, vocab=bb.vocab_size, pairs=len(prompts),
                n_mc=args.n_mc, rows_drawn=drawn, rows=n_rows, token_blocks=token_blocks, floor_seconds=floor_s,
                blocks_floor_seconds=blocks_s, true_floor_seconds=true_s, scored_positions=scored,
                head_positions_per_s=head_rate, floor_rows_per_s=n_rows / floor_s,
                throughput={r.length: dict(rows=r.rows, row_blocks_per_s=r.row_blocks_per_s, by_rows=r.table)
                            for r in rates},
                blocks_throughput={r.length: dict(rows=r.rows, row_blocks_per_s=r.row_blocks_per_s)
                                   for r in block_rates},
                runs=runs)


if __name__ == "__main__":
    raise SystemExit(script(main))

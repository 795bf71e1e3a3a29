"""Edit-memory benchmarks: hook overhead, streaming insertion, selectivity, install time.

    python benchmarks/bench_edit_memory.py                         # every part
    python benchmarks/bench_edit_memory.py --parts overhead --device cuda
    python benchmarks/bench_edit_memory.py --parts selectivity --tofu-model DIR
        (DIR from timerome.training.from_scratch.train_tofu_model(TOFU_DIR, DIR): the embedded architecture
        trained on TOFU forget01 + 2 retain authors, about 1.5 min)

Parts (each prints a table of ratios measured in this one run):
  overhead     wall time of a full denoising generation with a |F|=400 memory installed, over the
               plain generation: a random LLaDA-structure model (d=1024, 8 layers, vocab 4096) and
               the embedded model. Goal <= 1.03.
  scale        the hook at |F| = 10,000 facts (keys and deltas: the model's own residuals), q = 0 and
               q = 4, on each --overhead-models model: one forward with / without the hook, and the
               hook alone; q = 4 also with every fact scored (the dense TopQ the index replaces), the
               candidates per token the index scores, and how many chunks of tokens it scored as one
               product over their candidates' union. Goal <= 1.03 per forward.
  scale8b      the q = 4 hook at |F| = 10,000 against a forward of LLaDA-8B's shapes (H 4096, 32 blocks, vocabulary
               126,464), composed from one random block's and the head's measured times (the 8B weights do not
               fit a 24 GB machine); keys: the block's own residuals. Goal <= 1.03 per forward.
               --whole (a device with ~48 GB free): a real forward of all 32 blocks instead, in float32 and
               bfloat16, timed with and without the hook, rounds interleaved.
  streaming    inserting the 10,000th fact (block update) against the BEST full re-solve of the
               10,000-fact memory, synthetic keys of hidden size 1024: the re-solve is the smaller
               (hidden-size, H x H) form, timed both through EditMemory and as one bare Cholesky
               solve, and the faster of the two is the baseline. Goal >= 50x.
  selectivity  alpha sweep: Delta ForgetLP, Delta RetainLP (nats, edited - plain) and their ratio
               for each key metric on the embedded model (and a TOFU-fine-tuned model when given);
               writes a Pareto PNG.
  install      capture + solve time for |F| = 1, 10, 40, 100, 400 facts (cycling the embedded
               corpus): batching makes capture grow sub-linearly.
  install10k   installing 10,000 synthetic facts of hidden size 1024 (paper and whitened metric):
               seconds, the form kept, and the process's peak memory (each in a fresh process, so
               the peak is this install's).
  reach        the codebook / rewrite memory's radii (`codebook_memory.nearest_distance`: each key's
               distance to its nearest calibration token) at the shapes of the embedded model's
               rewrite memory (--reach-keys keys, --reach-points calibration tokens, H 128; random
               Gaussian tokens, each key a token plus noise), against the cdist proposing 8
               candidates per key that it replaced at stop 55 (written here, the baseline), the
               distances checked equal bit for bit.
  gate         the rewrite memory's gate (--gate-memory FILE, default: built on embedded:forget01) at
               every forward of greedy answers to 8 of its questions and 8 retain ones, residuals
               recorded once: stop 55's (every token through torch.cdist, then masked to the masked
               answer positions) against RewriteMemory._decide's now (only those positions, through
               `codebook_memory._distances`: cdist's own product with the keys' half formed once);
               the gates compared on those positions.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from timerome.backbones.tiny import LLADA_8B, random_backbone
from timerome.common.allocator import MALLOC_CHOICES, MALLOC_HELP
from timerome.common.cost import sync
from timerome.engine.throughput import timing_clock
from timerome.errors import script
from timerome.memory.capture import capture_facts
from timerome.memory.edit_memory import EditMemory, default_coordinate
from timerome.memory.whitening import residual_stats

PARTS = ("overhead", "scale", "scale8b", "streaming", "selectivity", "install", "install10k", "reach", "gate")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default with the CPU clock: 1, since idle OpenMP threads "
                         "spin and are counted as CPU time when the machine is shared)")
    ap.add_argument("--out", default="timerome-out", help="folder for the Pareto PNG")
    ap.add_argument("--repeats", type=int, default=5, help="timed generations per configuration")
    ap.add_argument("--gen-length", type=int, default=128, help="overhead: tokens generated (= steps)")
    ap.add_argument("--overhead-models", default="random,embedded")
    ap.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto",
                    help="timer: process CPU time (auto on CPU: other jobs' load is not counted) "
                         "or wall time (auto on GPU)")
    ap.add_argument("--malloc", choices=MALLOC_CHOICES, default="kept", help=MALLOC_HELP)
    ap.add_argument("--stream-facts", type=int, default=10_000)
    ap.add_argument("--stream-hidden", type=int, default=1024)
    ap.add_argument("--scale-facts", type=int, default=10_000, help="scale: facts in the memory")
    ap.add_argument("--whole", action="store_true",
                    help="scale8b: run all 32 blocks (copies of the one random block) instead of composing the "
                         "forward from one block's time; needs ~48 GB on --device")
    ap.add_argument("--reach-keys", type=int, default=1186, help="reach: keys (the rewrite memory of embedded:forget01)")
    ap.add_argument("--reach-points", type=int, default=477_008,
                    help="reach: calibration tokens (those of embedded:train less forget01's rows)")
    ap.add_argument("--gate-memory", default=None,
                    help="gate: a saved rewrite memory file (default: built here on embedded:forget01)")
    ap.add_argument("--forget", type=int, default=40, help="selectivity: forget facts")
    ap.add_argument("--retain", type=int, default=80, help="selectivity: retain rows")
    ap.add_argument("--n-mc", type=int, default=8)
    ap.add_argument("--alphas", default="0.5,1,2,3,4,6,8,12")
    ap.add_argument("--layer", type=int, default=None, help="edit layer (default: (n_layers - 1) // 2)")
    ap.add_argument("--lam", type=float, default=1.0, help="streaming: ridge lambda")
    ap.add_argument("--q", type=int, default=0)
    ap.add_argument("--tofu-model", default=None, help="a checkpoint fine-tuned on TOFU (selectivity on TOFU)")
    ap.add_argument("--tofu-dir", default="/work/shared/data/tofu")
    ap.add_argument("--tofu-retain-authors", type=int, default=2, help="retain authors the TOFU model learnt")
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}")
    global CLOCK
    CLOCK, label = timing_clock(args.clock, args.device, args.threads, args.malloc)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, clock: {label}")
    for p in parts:
        globals()[f"bench_{p}"](args)
    return 0


# ------------------------------------------------------------------------------ models and facts


def embedded(device="cpu"):
    from timerome.backbones import load_backbone

    return load_backbone(device=device)


def corpus_facts(n: int) -> list:
    """n facts from the embedded corpus' training rows, cycling (repeats get their own ids)."""
    from timerome.data.corpus import make_corpus, training_rows
    from timerome.data.facts import facts_from_rows

    base, _ = facts_from_rows(training_rows(make_corpus(seed=0)))
    out = []
    for i in range(n):
        f = base[i % len(base)]
        out.append(dataclasses.replace(f, fact_id=f"{f.fact_id}#{i // len(base)}") if i >= len(base) else f)
    return out


# ------------------------------------------------------------------------------ 1. overhead


def bench_overhead(args):
    print("\n== overhead: full denoising generation with a |F| = 400 memory installed / plain ==")
    print("(generation: fastest of interleaved runs; forward: one forward with / without the hook, "
          "interleaved medians; hook only: 1 + the hook's own time / one forward's time, which "
          "other jobs on a shared machine disturb least)")
    print(f"{'model':<18}{'config':<15}{'G':>5}{'plain s':>10}{'edited s':>10}{'ratio':>8}{'forward ratio':>15}"
          f"{'hook only':>11}")
    for name in args.overhead_models.split(","):
        bb, mems, prompt = _overhead_setup(name.strip(), args)
        G = min(args.gen_length, bb.max_length - prompt.shape[1]) // 8 * 8
        plain, edited = _time_generations(bb, mems, prompt, G, args.repeats)
        x = _full_ids(bb, prompt, G)
        h = torch.randn(*x.shape, bb.hidden_size, device=bb.device, dtype=bb.dtype)
        for (label, mem), e in zip(mems, edited):
            f_plain, f_edit = _time_forwards(bb, mem, x)
            hook = _time_hook(mem, h)
            print(f"{bb.name:<18}{label:<15}{G:>5}{plain:>10.3f}{e:>10.3f}{e / plain:>8.3f}{f_edit / f_plain:>15.4f}"
                  f"{1 + hook / f_plain:>11.4f}")


def _overhead_setup(name, args):
    if name == "random":
        bb = random_backbone(args.device)
        coord = default_coordinate(bb)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, bb.vocab_size - 1, (64, 64), generator=g)
        stats = residual_stats(bb, coord, ids.tolist(), masked_copies=1)
        # keys and deltas: the model's own residuals, so norms and directions are realistic
        from timerome.engine.hooks import run_to

        with torch.no_grad():
            h = run_to(bb, coord.site, ids[:20].to(bb.device)).double().cpu().reshape(-1, bb.hidden_size)
        U, D = h[:400], h[400:800] - h[800:1200]
        mems = []
        for label, kw in (("paper q=0", dict(key_metric="paper")),
                          ("whitened q=0", dict(key_metric="whitened", background=stats)),
                          ("whitened q=4", dict(key_metric="whitened", background=stats, q=4))):
            m = EditMemory(bb, coord, **kw).add_vectors(U, D, [f"f{i}" for i in range(400)])
            mems.append((label, m))
        prompt = torch.randint(0, bb.vocab_size - 1, (1, 32), generator=g)
        return bb, mems, prompt.to(bb.device)
    bb = embedded(args.device)
    facts = corpus_facts(400)
    base = EditMemory(bb).add(facts)
    mems = [("paper q=0", EditMemory(bb, key_metric="paper").add(facts)), ("whitened q=0", base),
            ("whitened q=4", EditMemory(bb, q=4, background=base.stats).add(facts))]
    prompt = torch.tensor([bb.encode(facts[0].prompt)], device=bb.device)
    return bb, mems, prompt


def _full_ids(bb, prompt, G):
    return torch.cat([prompt, torch.full((prompt.shape[0], G), bb.mask_id, device=prompt.device)], dim=1)


CLOCK = time.perf_counter


def _time_forwards(bb, mem, x, rounds=12, per_round=4) -> tuple[float, float]:
    """Median time of one forward on x without and with the memory's hook; rounds alternate, and
    installing the hook is not timed (a generation installs it once)."""
    from contextlib import nullcontext

    plain, edited = [], []
    with torch.no_grad():
        for r in range(rounds + 1):
            for times, m in ((plain, None), (edited, mem)):
                with m.applied(bb) if m is not None else nullcontext():
                    for _ in range(per_round):
                        sync(bb.device)
                        t = CLOCK()
                        bb.logits(x)
                        sync(bb.device)
                        if r:  # round 0 warms up
                            times.append(CLOCK() - t)
    return statistics.median(plain), statistics.median(edited)


def _index_of(mem, bb):
    """The memory's topq.TopQIndex when its hook screened with one (also one that then went dense, after
    which the hook scores every fact without it), else None."""
    if mem._plan(bb.device) == "index" or mem._index_went_dense():
        return mem._matrices(bb.device, torch.float32, "index")[0]
    return None


def _time_hook(mem, h, n=50) -> float:
    """Median time of the hook's work (h + update) on h [B, L, H]."""
    return _time_call(lambda: mem.update(h), n, h.device)


def _time_call(fn, n=50, device="cpu") -> float:
    """Median time of fn() over n calls after 3 untimed ones."""
    times = []
    with torch.no_grad():
        for i in range(n + 3):
            sync(device)
            t = CLOCK()
            fn()
            sync(device)
            if i >= 3:
                times.append(CLOCK() - t)
    return statistics.median(times)


def _digest(bb) -> float:
    """Seconds of the model's weights digest, taken before any install is timed. Every memory binds to
    it (Backbone.fingerprint: SHA-256 of every byte, computed once per weights and cached; load_backbone
    reads it from its cache), so otherwise the first install timed on a model pays it: on an H200 this
    made the first of two installs read 60.2 s against 1.9 s (32 GB of float32 weights hashed)."""
    t = CLOCK()
    bb.fingerprint()
    return CLOCK() - t


def _time_generations(bb, mems, prompt, G, repeats):
    """Fastest wall time of the plain generation and of each edited one; rounds interleaved so
    drifts in machine speed hit every configuration alike."""
    from timerome.engine.sampler import generate

    def run(mem):
        sync(bb.device)
        t = CLOCK()
        if mem is None:
            generate(bb, prompt, steps=G, gen_length=G, block_length=G)
        else:
            with mem.applied(bb) as state:
                generate(bb, prompt, steps=G, gen_length=G, block_length=G, state=state)
        sync(bb.device)
        return CLOCK() - t

    run(mems[0][1])  # warm-up
    plain, edited = [], [[] for _ in mems]
    for _ in range(repeats):
        plain.append(run(None))
        for i, (_, m) in enumerate(mems):
            edited[i].append(run(m))
    return min(plain), [min(e) for e in edited]


# ------------------------------------------------------------------------------ 1b. scale


def bench_scale(args):
    from timerome.engine.hooks import run_to

    F = args.scale_facts
    print(f"\n== scale: the hook with |F| = {F} facts (keys, deltas: the model's own residuals), one forward "
          f"of a [1, 32 + {args.gen_length}] sequence ==")
    print("(forward ratio: interleaved medians with / without the hook; hook only: 1 + the hook's own time / "
          "one forward's, which other jobs on a shared machine disturb least; dense = every fact scored; "
          "cand/token: the screen's candidates per token (k/n union: chunks of tokens scored by the union of their candidates); near/token: facts whose |coefficient| is at least half "
          "the token's q-th largest, median over tokens: an exact top-q must tell each of them from the q kept, "
          "so an index that passes over groups of facts unscored needs bounds tighter than that margin; "
          "int8 product: 1 + the time of the index's int8 [tokens, H] x [H, facts] product alone / one forward's, "
          "a part of every call of the index, against the goal's 1.03)")
    print(f"{'model':<18}{'config':<22}{'install s':>10}{'form':>8}{'forward ratio':>15}{'hook only':>11}"
          f"{'hook ms':>9}{'dense hook ms':>15}  {'cand/token':<20}{'near/token':>10}{'int8 product':>14}")
    for name in args.overhead_models.split(","):
        bb = random_backbone(args.device) if name.strip() == "random" else embedded(args.device)
        print(f"({bb.name}: weights digest {_digest(bb):.2f} s, once per model, not in install s)")
        coord = default_coordinate(bb)
        g = torch.Generator().manual_seed(0)
        n_seq = -(-2 * F // 64)
        ids = torch.randint(0, bb.vocab_size - 1, (n_seq, 64), generator=g)
        stats = residual_stats(bb, coord, ids[:64].tolist(), masked_copies=1)
        with torch.no_grad():
            h = torch.cat([run_to(bb, coord.site, ids[i:i + 32].to(bb.device)).double().cpu()
                           for i in range(0, n_seq, 32)]).reshape(-1, bb.hidden_size)
        U, D = h[:F], h[F:2 * F] - h[:F]
        prompt = torch.randint(0, bb.vocab_size - 1, (1, 32), generator=g).to(bb.device)
        x = _full_ids(bb, prompt, args.gen_length)
        with torch.no_grad():
            hx = run_to(bb, coord.site, x)                # the hook's real input: this sequence's residuals
        for label, kw in (("whitened q=0", dict(key_metric="whitened", background=stats)),
                          ("whitened q=4", dict(key_metric="whitened", background=stats, q=4)),
                          ("paper q=4", dict(key_metric="paper", q=4))):
            t = CLOCK()
            mem = EditMemory(bb, coord, **kw).add_vectors(U, D, [f"f{i}" for i in range(F)])
            install = CLOCK() - t
            f_plain, f_edit = _time_forwards(bb, mem, x)
            hook = _time_hook(mem, hx)
            dense, cand, near, product = float("nan"), "", "", ""
            if mem.q:
                ix = _index_of(mem, bb)
                if ix is not None:
                    cand = f"{ix.candidates / hx.shape[1]:.1f}" + (" (dense)" if ix.dense else
                                                                     f" ({ix.union_chunks}/{ix.chunks} union)")
                    X = torch.randint(-127, 128, (hx.shape[1], bb.hidden_size), generator=g, dtype=torch.int8)
                    product = f"{1 + _time_call(lambda: ix._products(X)) / f_plain:.4f}"
                mem.index_min_facts = 1 << 62                 # the plan without the index: every fact scored
                dense = _time_hook(mem, hx)
                A, Amu = mem._matrices(torch.device("cpu"), torch.float64, "A", "Amu")
                y = hx.reshape(-1, bb.hidden_size).double().cpu()
                c = (y @ A.T if Amu is None else y @ A.T - Amu).abs()  # every fact's coefficient, per token
                lam = c.topk(mem.q, dim=1).values[:, -1:]
                near = f"{float((c >= lam / 2).sum(1).double().median()):.0f}"
            print(f"{bb.name:<18}{label:<22}{install:>10.3f}{mem.ridge.form:>8}{f_edit / f_plain:>15.4f}"
                  f"{1 + hook / f_plain:>11.4f}{hook * 1e3:>9.3f}{dense * 1e3:>15.3f}  {cand:<20}{near:>10}{product:>14}")


# ------------------------------------------------------------------------------ 1c. scale on LLaDA-8B's shapes


def bench_scale8b(args):
    """The q = 4 hook at |F| = --scale-facts facts against a forward of LLaDA-8B's shapes. Its weights
    (8B in float32: 32 GB) do not fit this machine, so one random block of its shapes, its embedding
    and its head are built, and a forward is composed from their times: 31 x (embedding + block)
    + (embedding + block + norm + head), i.e. 32 blocks, 31 embedding look-ups too many (each a copy
    of [tokens, 4096] floats, under 0.1 % of a block: the forward is that much too long). Keys: the
    block's own residuals at its output on random tokens (the hook site of a one-block model);
    deltas: Gaussian (the hook's work does not depend on their values)."""
    from timerome.engine.hooks import run_to

    F, G = args.scale_facts, args.gen_length
    spec = LLADA_8B
    print(f"\n== scale8b: the hook with |F| = {F} facts on LLaDA-8B's shapes (H {spec['hidden']}, MLP {spec['mlp']}, "
          f"{spec['layers']} blocks, vocabulary {spec['vocab']:,}), one forward of a [1, 32 + {G}] sequence ==")
    t = CLOCK()
    bb = random_backbone(args.device, hidden=spec["hidden"], layers=spec["layers"] if args.whole else 1,
                         vocab=spec["vocab"], context=max(64, 32 + G), mlp=spec["mlp"], heads=spec["heads"],
                         copy_blocks=args.whole)
    if args.whole:
        return _scale8b_whole(args, bb, spec, F, G, t)
    print("(forward: composed from one block's and the head's times, the bench's docstring; hook: the hook's own "
          "time on the block's residuals of that sequence; ratio: 1 + hook / forward; dense: every fact scored)")
    coord = default_coordinate(bb)
    g = torch.Generator().manual_seed(0)
    rows = -(-F // 64)
    ids = torch.randint(0, bb.vocab_size - 1, (rows, 64), generator=g)
    U, D, stats = _keys_8b(bb, coord, ids, F, g)
    prompt = torch.randint(0, bb.vocab_size - 1, (1, 32), generator=g).to(bb.device)
    x = _full_ids(bb, prompt, G)
    print(f"model built, keys read: {CLOCK() - t:.1f} s; weights digest {_digest(bb):.2f} s (once per model, "
          "not in install s)")
    embed_block = _time_call(lambda: run_to(bb, coord.site, x), 3, bb.device)
    whole = _time_call(lambda: bb.logits(x), 3, bb.device)
    forward = (spec["layers"] - 1) * embed_block + whole
    with torch.no_grad():
        hx = run_to(bb, coord.site, x)
    print(f"one block (+ embedding) {embed_block:.3f} s, block + head {whole:.3f} s: a forward of "
          f"{spec['layers']} blocks {forward:.2f} s")
    print(f"{'config':<16}{'install s':>10}{'form':>8}{'hook ms':>10}{'ratio':>9}{'dense ms':>10}{'dense ratio':>12}"
          f"  cand/token")
    for label, kw in _configs_8b(stats):
        t = CLOCK()
        mem = EditMemory(bb, coord, **kw).add_vectors(U, D, [f"f{i}" for i in range(F)])
        install = CLOCK() - t
        hook = _time_hook(mem, hx, 10)
        ix, cand = _index_of(mem, bb), ""
        if ix is not None:
            cand = f"{ix.candidates / hx.shape[1]:.1f}" + (" (dense: the scores follow, no index)" if ix.dense else "")
        mem.index_min_facts = 1 << 62  # every fact scored
        dense = _time_hook(mem, hx, 10)
        print(f"{label:<16}{install:>10.2f}{mem.ridge.form:>8}{hook * 1e3:>10.1f}{1 + hook / forward:>9.4f}"
              f"{dense * 1e3:>10.1f}{1 + dense / forward:>12.4f}  {cand}")
    share = F / (12 * spec["hidden"] * spec["layers"])
    print(f"(the goal: <= 1.03 per forward; the scoring's share F / (12 H L) = {share:.4f} "
          "of the blocks' multiply-adds)")


def _keys_8b(bb, coord, ids, F, g):
    """(U, D, stats) for scale8b: keys, the hook site's residuals on `ids` [rows, 64] (8 rows a forward);
    deltas Gaussian, drawn from g, a tenth of the keys' mean norm; the background statistics of 16 rows."""
    from timerome.engine.hooks import run_to

    with torch.no_grad():
        U = torch.cat([run_to(bb, coord.site, ids[i:i + 8].to(bb.device)).double().cpu()
                       for i in range(0, len(ids), 8)]).reshape(-1, bb.hidden_size)[:F]
    D = torch.randn(F, bb.hidden_size, generator=g, dtype=torch.float64) * U.norm(dim=1, keepdim=True).mean() / 10
    return U, D, residual_stats(bb, coord, ids[:16].tolist(), masked_copies=1)


def _configs_8b(stats):
    """scale8b's memories: (label, EditMemory options)."""
    return (("whitened q=4", dict(key_metric="whitened", background=stats, q=4)),
            ("paper q=4", dict(key_metric="paper", q=4)))


def _scale8b_whole(args, bb, spec, F, G, t0):
    """scale8b --whole: the one random block's copies fill all of LLaDA-8B's blocks (a block's time does
    not depend on its values), so the forward is real: timed without and with the hook, rounds
    interleaved, in float32 and then bfloat16. Keys: residuals at the middle block's output."""
    from timerome.engine.hooks import run_to

    bb.name = "random-llada8b-shapes"
    coord = default_coordinate(bb)
    g = torch.Generator().manual_seed(0)
    rows = -(-F // 64)
    ids = torch.randint(0, bb.vocab_size - 1, (rows, 64), generator=g)
    prompt = torch.randint(0, bb.vocab_size - 1, (1, 32), generator=g).to(bb.device)
    x = _full_ids(bb, prompt, G)
    print(f"(--whole: all {bb.n_layers} blocks run, copies of one random block; forward ratio: interleaved medians "
          "with / without the hook; hook only: 1 + the hook's own time / the plain forward's; cand/token: the "
          "screen's candidates per token)")
    print(f"model built on {bb.device}, hook site {coord.site}: {CLOCK() - t0:.1f} s")
    print(f"{'dtype':<10}{'config':<16}{'install s':>10}{'form':>8}{'plain ms':>10}{'edited ms':>11}"
          f"{'forward ratio':>15}{'hook ms':>9}{'hook only':>11}  cand/token")
    for dtype in (torch.float32, torch.bfloat16):
        bb.model.to(dtype)
        U, D, stats = _keys_8b(bb, coord, ids, F, g)
        with torch.no_grad():
            hx = run_to(bb, coord.site, x)
        print(f"({str(dtype).split('.')[-1]}: weights digest {_digest(bb):.2f} s, once per model, not in install s)")
        for label, kw in _configs_8b(stats):
            t = CLOCK()
            mem = EditMemory(bb, coord, **kw).add_vectors(U, D, [f"f{i}" for i in range(F)])
            install = CLOCK() - t
            plain, edited = _time_forwards(bb, mem, x, rounds=6, per_round=3)
            hook = _time_hook(mem, hx, 20)
            ix, cand = _index_of(mem, bb), ""
            if ix is not None:
                cand = f"{ix.candidates / hx.shape[1]:.1f}" + (" (dense)" if ix.dense else "")
            print(f"{str(dtype).split('.')[-1]:<10}{label:<16}{install:>10.2f}{mem.ridge.form:>8}{plain * 1e3:>10.1f}"
                  f"{edited * 1e3:>11.1f}{edited / plain:>15.4f}{hook * 1e3:>9.2f}{1 + hook / plain:>11.4f}  {cand}",
                  flush=True)
    print("(the goal: <= 1.03 per forward)")


# ------------------------------------------------------------------------------ 2. streaming


def bench_streaming(args):
    F, H = args.stream_facts, args.stream_hidden
    print(f"\n== streaming: insert fact #{F} vs the best full re-solve at |F| = {F} (synthetic keys, H = {H}) ==")
    bb = random_backbone("cpu", hidden=H, layers=1, vocab=64, context=64)
    g = torch.Generator().manual_seed(0)
    U = torch.randn(F, H, generator=g, dtype=torch.float64)
    D = torch.randn(F, H, generator=g, dtype=torch.float64)
    ids = [f"f{i}" for i in range(F)]

    solves, bare = [], []
    for _ in range(2):
        t = CLOCK()
        full = EditMemory(bb, key_metric="paper", lam_absolute=args.lam).add_vectors(U, D, ids)  # the batch solve
        solves.append(CLOCK() - t)
        t = CLOCK()
        W_bare = _bare_solve(U, D, args.lam)
        bare.append(CLOCK() - t)
    solve_s, bare_s = min(solves), min(bare)
    best = min(solve_s, bare_s)
    form = full.ridge.form

    mem = EditMemory(bb, key_metric="paper", lam_absolute=args.lam)
    mem.reserve(F)
    mem.add_vectors(U[:-1], D[:-1], ids[:-1])
    inserts, removes_new, removes_mid = [], [], []
    for _ in range(5):
        t = CLOCK()
        mem.add_vectors(U[-1:], D[-1:], ids[-1:])
        inserts.append(CLOCK() - t)
        t = CLOCK()
        mem.remove(ids[-1:])                      # the newest fact: nothing to compact
        removes_new.append(CLOCK() - t)
    mem.add_vectors(U[-1:], D[-1:], ids[-1:])
    for r in range(3):                            # a fact from the middle: the worst case moves half
        j = F // 2 + r
        t = CLOCK()
        mem.remove([ids[j]])
        removes_mid.append(CLOCK() - t)
        mem.add_vectors(U[j:j + 1], D[j:j + 1], [ids[j]])
    h = torch.randn(64, H, generator=g, dtype=torch.float64)
    a, b = mem.delta(h), full.delta(h)
    err = float((a - b).norm() / b.norm())
    err_bare = float((full.ridge.W - W_bare).norm() / W_bare.norm())
    ins, rn, rm = min(inserts), min(removes_new), min(removes_mid)
    print(f"re-solve: EditMemory batch add {solve_s:.3f} s ({form} form kept), bare H x H Cholesky solve "
          f"{bare_s:.3f} s (W agrees to {err_bare:.1e}); baseline = the faster, {best:.3f} s")
    print(f"insert #{F} {ins * 1e3:.2f} ms ({best / ins:.0f}x faster than the best re-solve) | remove the newest "
          f"{rn * 1e3:.2f} ms ({best / rn:.0f}x) | remove one from the middle {rm * 1e3:.2f} ms ({best / rm:.0f}x) | "
          f"streamed vs batch delta rel. err {err:.1e}")


def bench_reach(args):
    from timerome.memory.codebook_memory import nearest_distance

    E, M, H = args.reach_keys, args.reach_points, 128
    print(f"\n== reach: the nearest of {M:,} calibration tokens to each of {E:,} keys (H = {H}) ==")
    g = torch.Generator().manual_seed(0)
    points = torch.randn(M, H, generator=g)
    z = points[torch.randint(0, M, (E,), generator=g)].double() + 0.3 * torch.randn(E, H, generator=g,
                                                                                   dtype=torch.float64)
    rounds = {"nearest_distance": [], "cdist, 8 candidates": []}
    for _ in range(2):  # interleaved: the machine's speed drifts
        t = CLOCK()
        new = nearest_distance(z, points)
        rounds["nearest_distance"].append(CLOCK() - t)
        t = CLOCK()
        old = _cdist_candidates(z, points)
        rounds["cdist, 8 candidates"].append(CLOCK() - t)
    a, b = (min(v) for v in rounds.values())
    print(f"nearest_distance {a:.2f} s | the cdist proposing 8 candidates {b:.2f} s: {b / a:.2f}x faster | "
          f"equal bit for bit: {torch.equal(new, old)}")


def _cdist_candidates(z, points, candidates: int = 8, chunk: int = 1 << 24):
    """The radii as codebook_memory measured them before stop 55: the points in float64, a float32
    cdist per chunk of keys proposing the nearest 8, those measured in float64."""
    pts, step = points.double(), max(1, chunk // len(points))
    out = []
    for s in range(0, len(z), step):
        zs = z[s:s + step]
        near = torch.cdist(zs.float(), pts.float()).topk(candidates, dim=1, largest=False).indices
        out.append((zs[:, None, :] - pts[near]).pow(2).sum(-1).sqrt().min(1).values)
    return torch.cat(out)


def bench_gate(args):
    from timerome.data.task import forget_task
    from timerome.data.tofu import load_split
    from timerome.evaluation.evaluator import generate_answers
    from timerome.memory.memory_file import load_memory
    from timerome.memory.rewrite_memory import FIRE, asked_tokens
    from timerome.methods import install

    bb = embedded(args.device)
    if args.gate_memory:
        mem = load_memory(args.gate_memory, bb)
    else:
        mem = install("rewrite", bb, forget_task("embedded", "forget01"), {}, seed=0).memory
    facts = mem.facts[:: max(1, len(mem.facts) // 8)][:8]
    retain = load_split("retain90", "embedded")[:8]
    q = [f.prompt for f in facts] + [r["question"] for r in retain]
    a = [f.object for f in facts] + [r["answer"] for r in retain]
    print(f"\n== gate: a rewrite memory of {len(mem)} facts, {mem.n_entries:,} entries, at the forwards of "
          f"greedy answers to 8 of its questions and 8 retain ones ==")
    cls, xs, asked = type(mem), [], []
    decide = cls._decide

    def record(self, h, state, seen):  # each forward's residuals and masked answer positions
        k = asked_tokens(bb, h, state)
        if k is not None:  # (every forward of the sampler publishes them)
            xs.append(mem._rows(h.detach()).clone())
            asked.append(k)
        return decide(self, h, state, seen)

    cls._decide = record
    try:
        with mem.applied(bb):
            generate_answers(bb, q, a, seed=0)
    finally:
        cls._decide = decide

    m = mem._matrices(xs[0].device, xs[0].dtype)
    keys = m["keys"].contiguous()  # as stop 55 held them (the hook's are now a view of their half)

    def before():  # stop 55's gate: every token through torch.cdist, / radius, min(1), then the asked mask
        out = []
        for x, k in zip(xs, asked):
            z = (x - m["mu"]) @ m["white"]
            step = max(1, (1 << 24) // len(keys))
            v, e = zip(*[(torch.cdist(z[s:s + step], keys) / m["radius"]).min(1) for s in range(0, len(z), step)])
            out.append((((1 - torch.cat(v)) / (1 - mem.inner)).clamp(0, 1) * k, torch.cat(e)))
        return out

    def asked_cdist():  # the asked rows only, through torch.cdist
        out = []
        for x, k in zip(xs, asked):
            z = (x[k] - m["mu"]) @ m["white"]
            out.append((torch.cdist(z, keys) / m["radius"]).min(1))
        return out

    def now():  # RewriteMemory._decide's: the asked rows only, through _token_gate (`_distances`)
        return [mem._token_gate(x[k], m) for x, k in zip(xs, asked)]

    times = {f: [] for f in (before, asked_cdist, now)}
    for _ in range(args.repeats):
        for f in times:
            t = CLOCK()
            out = f()
            times[f].append(CLOCK() - t)
            if f is before:
                old = out
            elif f is now:
                new = out
    a_, b_, c_ = (min(v) for v in times.values())
    diff = max(float((o[0][k] - n[0]).abs().max()) if int(k.sum()) else 0.0 for o, n, k in zip(old, new, asked))
    same_e = all(torch.equal(o[1][k][n[0] > 0], n[1][n[0] > 0]) for o, n, k in zip(old, new, asked))
    same_fire = all(torch.equal(o[0][k] >= FIRE, n[0] >= FIRE) for o, n, k in zip(old, new, asked))
    tokens, n_asked = sum(len(x) for x in xs), sum(int(k.sum()) for k in asked)
    print(f"{len(xs)} forwards, {tokens:,} tokens, {n_asked:,} of them masked answer positions "
          f"({n_asked / tokens:.0%}); fastest of {args.repeats}:")
    print(f"  every token through torch.cdist (stop 55) {a_ * 1e3:.1f} ms | the asked rows through torch.cdist "
          f"{b_ * 1e3:.1f} ms | through _token_gate now {c_ * 1e3:.1f} ms: {a_ / c_:.2f}x faster in all "
          f"({a_ / b_:.2f}x from the rows, {b_ / c_:.2f}x from the keys' half formed once)")
    print(f"  gates on the asked rows: largest difference {diff:.1e}, the same entries where g > 0: {same_e}, "
          f"the same tokens at or above FIRE: {same_fire}")
    gen = {"plain": [], "edited": []}
    for _ in range(args.repeats):  # interleaved: the machine's speed drifts
        t = CLOCK()
        generate_answers(bb, q, a, seed=0)
        gen["plain"].append(CLOCK() - t)
        with mem.applied(bb):
            t = CLOCK()
            generate_answers(bb, q, a, seed=0)
            gen["edited"].append(CLOCK() - t)
    p, e = min(gen["plain"]), min(gen["edited"])
    print(f"  the whole greedy generation of the 16 answers: plain {p:.3f} s, with the memory {e:.3f} s: {e / p:.2f}x")


def _bare_solve(U, D, lam):
    """W = (U^T U + lam I)^-1 U^T D by one Cholesky solve: the least work a re-solve of the memory's
    [H, H] map can do with F > H facts (the push-through identity: equal to U^T (U U^T + lam I)^-1 D)."""
    N = U.T @ U
    N.diagonal().add_(lam)
    return torch.cholesky_solve(U.T @ D, torch.linalg.cholesky(N))


# ------------------------------------------------------------------------------ 3. selectivity


def bench_selectivity(args):
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import load_split

    alphas = [float(a) for a in args.alphas.split(",")]
    bb = embedded(args.device)
    forget = load_split("forget10", "embedded")[: args.forget]
    retain = _spread(load_split("retain90", "embedded"), args.retain)
    curves = {}
    print(f"\n== selectivity on {bb.name}: {len(forget)} forget facts, {len(retain)} retain rows, "
          f"n_mc={args.n_mc}) ==")
    curves.update(_sweep(bb, facts_from_rows(forget)[0], forget, retain, alphas, args, None, bb.name))
    if args.tofu_model:
        from timerome.backbones import load_backbone
        from timerome.evaluation.evaluator import fits
        from timerome.memory.whitening import rows_to_texts
        from timerome.training.from_scratch import tofu_subset

        # the TOFU model (evaluation.train_tofu_model) knows only its subset's words: retain rows
        # and background come from the retain authors it was trained on
        tb = load_backbone(args.tofu_model, device=args.device)
        t_forget = load_split("forget01", args.tofu_dir)[: args.forget]
        sub = tofu_subset(args.tofu_dir, args.tofu_retain_authors)
        t_retain = [r for r in sub["retain"] if fits(tb, r)][: args.retain]
        background = rows_to_texts([r for r in sub["retain"] + sub["forget"] if fits(tb, r)])
        print(f"\n== selectivity on TOFU ({args.tofu_model}): {len(t_forget)} forget facts, {len(t_retain)} retain rows ==")
        facts, skipped = facts_from_rows(t_forget, offset=3960)  # forget01 = full[3960:]
        facts = [f for f in facts if fits(tb, t_forget[int(f.fact_id) - 3960])]  # within its context
        keep = {int(f.fact_id) - 3960 for f in facts}
        t_forget = [r for i, r in enumerate(t_forget) if i in keep]  # rows whose author was found
        print(f"({len(skipped)} rows skipped: no author name in the question)")
        curves.update(_sweep(tb, facts, t_forget, t_retain, alphas, args, background, "tofu"))
    else:
        print("TOFU: not run (no TOFU-fine-tuned model: the embedded word vocabulary cannot encode "
              "TOFU text); pass --tofu-model DIR")
    _pareto_png(curves, Path(args.out) / "edit_memory_pareto.png")


def _spread(rows, n):
    """n rows evenly spaced over the split: many authors, not the first few."""
    return rows[:: max(1, len(rows) // n)][:n]


def _sweep(bb, facts, forget, retain, alphas, args, background, tag):
    """Every alpha for: paper metric at its default lam (1) and at its own key scale E|h|^2, and
    whitened at its default lam (H = E|z|^2): the same rule for both metrics' scaled lam."""
    coord = (args.layer if args.layer is not None else (bb.n_layers - 1) // 2, "resid")
    plain_f, plain_r = _lp(bb, forget, None, args), _lp(bb, retain, None, args)
    print(f"layer {coord[0]} resid, q={args.q}; plain: ForgetLP {plain_f:.2f}  RetainLP {plain_r:.2f} (mean nats per row)")
    white = EditMemory(bb, coord, key_metric="whitened", q=args.q, background=background,
                       lam_absolute=float(bb.hidden_size)).add(facts)
    h2 = float(white.stats.cov.trace() + white.stats.mean.square().sum())  # E|h|^2 over the background
    variants = [("paper", 1.0), ("paper", h2), ("whitened", white.lam_value)]
    print(f"{'key metric':<10}{'lam':>10}{'alpha':>7}{'dForgetLP':>11}{'dRetainLP':>11}{'ratio':>9}")
    curves = {}
    for metric, lam in variants:
        mem = white if metric == "whitened" else EditMemory(bb, coord, key_metric="paper", lam_absolute=lam, q=args.q).add(facts)
        pts = []
        for a in alphas:
            mem.alpha = a
            df, dr = _lp(bb, forget, mem, args) - plain_f, _lp(bb, retain, mem, args) - plain_r
            ratio = df / dr if abs(dr) > 1e-9 else float("inf")
            print(f"{metric:<10}{lam:>10.4g}{a:>7.2f}{df:>11.2f}{dr:>11.2f}{ratio:>9.1f}")
            pts.append((a, df, dr))
        curves[f"{tag} {metric} lam={lam:.3g}"] = pts
    return curves


def _lp(bb, rows, memory, args) -> float:
    from contextlib import nullcontext

    from timerome.engine.encoding import known_answer_ids
    from timerome.engine.likelihood import log_likelihood_batch

    prompts = [bb.encode(r["question"]) for r in rows]
    answers = [known_answer_ids(bb, r["answer"], "an answer") for r in rows]
    with torch.no_grad(), (memory.applied(bb) if memory is not None else nullcontext()):
        lp = log_likelihood_batch(bb, prompts, answers, n_mc=args.n_mc,
                                  generator=torch.Generator().manual_seed(0))
    return float(lp.mean())


def _pareto_png(curves, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, pts in curves.items():
        x = [-dr for _, _, dr in pts]  # retain damage (nats lost)
        y = [-df for _, df, _ in pts]  # forgetting (nats lost)
        ax.plot(x, y, marker="o", label=label)
        for a, xi, yi in zip([p[0] for p in pts], x, y):
            ax.annotate(f"{a:g}", (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("symlog", linthresh=1.0)  # the selective points sit below one nat of damage
    ax.set_xlabel("retain damage  -dRetainLP (nats, symlog)")
    ax.set_ylabel("forgetting  -dForgetLP (nats)")
    ax.set_title("edit memory: alpha sweep (labels = alpha)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"Pareto plot: {path}")


# ------------------------------------------------------------------------------ 4. install time


def bench_install(args):
    bb = embedded(args.device)
    coord = default_coordinate(bb)
    t = CLOCK()
    stats = residual_stats(bb, coord, _background(bb))
    print(f"\n== install time on {bb.name} (background statistics, once: {CLOCK() - t:.2f} s; "
          f"each row: fastest of 3, the batched and the one-sequence capture interleaved, so that both sides are "
          f"warm and a drift of the machine's speed hits both) ==")
    print(f"{'|F|':>5}{'capture s':>11}{'solve s':>10}{'total s':>10}{'ms/fact':>9}{'capture x':>11}"
          f"{'unbatched s':>13}{'batching gain':>15}")
    facts = corpus_facts(400)
    capture_facts(bb, facts[:8], coord)  # warm-up, of both forms
    capture_facts(bb, facts[:8], coord, batch_size=1)
    first = None
    for n in (1, 10, 40, 100, 400):
        cap_s, solve_s, one_s = [], [], []

        def one_sequence():  # the capture with one forward per sequence, timed
            t0 = CLOCK()
            capture_facts(bb, facts[:n], coord, batch_size=1)
            one_s.append(CLOCK() - t0)

        for i in range(3):
            if i % 2:  # the unbatched capture first every other round
                one_sequence()
            t0 = CLOCK()
            cap = capture_facts(bb, facts[:n], coord)
            t1 = CLOCK()
            EditMemory(bb, coord, background=stats).add_vectors(cap.keys, cap.deltas, facts[:n])
            cap_s.append(t1 - t0)
            solve_s.append(CLOCK() - t1)
            if not i % 2:
                one_sequence()
        c, s, one = min(cap_s), min(solve_s), min(one_s)
        first = first or c
        print(f"{n:>5}{c:>11.4f}{s:>10.4f}{c + s:>10.4f}{(c + s) / n * 1e3:>9.2f}{c / first:>10.1f}x"
              f"{one:>13.4f}{one / c:>14.1f}x")


def _background(bb):
    from timerome.memory.whitening import background_texts

    return background_texts(bb)


# ------------------------------------------------------------------------------ 5. install at 10^4 facts


def bench_install10k(args):
    import multiprocessing as mp

    F, H = args.stream_facts, args.stream_hidden
    print(f"\n== install10k: {F} synthetic facts of hidden size {H} in one add_vectors (each in a fresh process) ==")
    print("(peak: the process's resident high-water mark during the install, reset just before it through "
          "/proc/self/clear_refs; 'adds' = that peak - the resident size before, which already holds the "
          "keys U and deltas D)")
    print(f"{'metric':<10}{'install s':>10}{'form':>8}{'peak RSS MB':>13}{'before MB':>11}{'install adds MB':>17}"
          f"{'U + D MB':>10}")
    ctx = mp.get_context("spawn")
    for metric in ("paper", "whitened"):
        with ctx.Pool(1) as pool:
            r = pool.apply(_install_child, (F, H, metric, torch.get_num_threads(), args.clock))
        note = "" if r["reset"] else "  (peak not reset: it may predate the install)"
        print(f"{metric:<10}{r['seconds']:>10.3f}{r['form']:>8}{r['peak'] / 1024:>13.0f}{r['before'] / 1024:>11.0f}"
              f"{(r['peak'] - r['before']) / 1024:>17.0f}{2 * F * H * 8 / 2**20:>10.0f}{note}")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _install_child(F, H, metric, threads, clock):
    """In a fresh process: time one add_vectors of F facts; resident size (KiB) before it and its
    high-water mark during it."""
    from timerome.memory.whitening import ResidualStats

    torch.set_num_threads(threads)
    timer = time.perf_counter if clock == "wall" else time.process_time
    bb = random_backbone("cpu", hidden=H, layers=1, vocab=64, context=64)
    g = torch.Generator().manual_seed(0)
    U = torch.randn(F, H, generator=g, dtype=torch.float64)
    D = torch.randn(F, H, generator=g, dtype=torch.float64)
    ids = [f"f{i}" for i in range(F)]
    kw = dict(key_metric=metric)
    if metric == "whitened":
        X = torch.randn(2 * H, H, generator=g, dtype=torch.float64)
        cov = X.T @ X / (2 * H) + 0.1 * torch.eye(H, dtype=torch.float64)
        kw["background"] = ResidualStats(0, "resid", torch.randn(H, generator=g, dtype=torch.float64), cov, 2 * H, 0.0)
    mem = EditMemory(bb, (0, "resid"), **kw)
    mem.ridge._L() if metric == "whitened" else None  # the metric's Cholesky factor: part of construction
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                               # resets VmHWM to the current resident size
        reset = True
    except OSError:
        reset = False
    before = _status_kib("VmRSS")
    t = timer()
    mem.add_vectors(U, D, ids)
    seconds = timer() - t
    return dict(seconds=seconds, form=mem.ridge.form, before=before, peak=_status_kib("VmHWM"), reset=reset)


if __name__ == "__main__":
    raise SystemExit(script(main))

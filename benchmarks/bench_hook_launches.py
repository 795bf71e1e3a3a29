"""The edit memory's q > 0 hook, call by call: host time, wall time and kernel launches, eager and replayed
from a CUDA graph (memory/cuda_graph.py), beside variants of its kernels.

    python benchmarks/bench_hook_launches.py --device cuda                  # LLaDA-8B's H 4096, 10^4 facts
    python benchmarks/bench_hook_launches.py --device cpu --hidden 256 --facts 500   # a self-test

A random LLaDA-structure model of hidden size --hidden (4 blocks, bfloat16) gives the hook's input, the
residual of a [1, 160] sequence at the middle block; the memory holds --facts random keys and deltas,
q = 4, in both key metrics. Per variant, 5 rounds of 20 calls: "host" is the time to return from the
calls (what the hook adds to a forward bound by its host's launches), "wall" the time until the device
has finished them; launches are counted by torch.profiler (runtime and driver launch calls, a graph's
launch included) over one call, "sync/memcpy" its synchronisations and copies (the closing sync
counted in both, so 2 is none of the hook's own). Variants: graphed (`EditMemory.update`: replayed from
a graph from the second call on, on a CUDA device), eager (`EditMemory._updated`: op by op), and
rewrites of the eager kernels: top-q unsorted, the kept deltas combined by a gather and a batched product
instead of `embedding_bag` (sorted or not), the same with TF32 scores (not exact: max|diff| printed),
and that rewrite replayed from a graph of its own. max|diff|: against the eager output.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from timerome.backbones.tiny import random_backbone
from timerome.common.cost import sync
from timerome.engine.hooks import run_to
from timerome.errors import script
from timerome.memory.cuda_graph import GraphedCalls
from timerome.memory.edit_memory import EditMemory, default_coordinate
from timerome.memory.whitening import residual_stats

Q = 4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--facts", type=int, default=10_000)
    args = ap.parse_args()
    with torch.no_grad():
        return _bench(args)


def _bench(args) -> int:
    dev, H, F = args.device, args.hidden, args.facts
    bb = random_backbone(dev, hidden=H, layers=4, vocab=4096, context=256, mlp=3 * H, heads=max(1, H // 128))
    coord = default_coordinate(bb)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, bb.vocab_size - 1, (16, 64), generator=g)
    stats = residual_stats(bb, coord, ids.tolist(), masked_copies=1)
    U = torch.randn(F, H, generator=g, dtype=torch.float64)
    D = torch.randn(F, H, generator=g, dtype=torch.float64) * 0.1
    bb.model.to(torch.bfloat16)
    hx = run_to(bb, coord.site, torch.randint(0, bb.vocab_size - 1, (1, 160), generator=g).to(dev))
    print(f"hook input {tuple(hx.shape)} {hx.dtype} on {dev}; {F} facts, q = {Q}, H = {H}", flush=True)
    for label, kw in (("whitened", dict(key_metric="whitened", background=stats)), ("paper", dict(key_metric="paper"))):
        mem = EditMemory(bb, coord, q=Q, **kw).add_vectors(U, D, [f"f{i}" for i in range(F)])
        mem._prepare(bb)
        ref = mem._updated(hx).float()
        for name, fn in _variants(mem, hx, H).items():
            err = float((fn(hx).float() - ref).abs().max())
            host, wall = [], []
            for _ in range(5):
                sync(dev)
                t = time.perf_counter()
                for _ in range(20):
                    fn(hx)
                host.append((time.perf_counter() - t) / 20)
                sync(dev)
                wall.append((time.perf_counter() - t) / 20)
            n, s = _launches(fn, hx, dev)
            print(f"{label:9s} {name:11s} host {statistics.median(host) * 1e3:6.3f} ms  wall "
                  f"{statistics.median(wall) * 1e3:6.3f} ms  launches {n:3d}  sync/memcpy {s}  max|diff| {err:.2e}",
                  flush=True)
        gr = mem._graphed
        print(f"{label} graphs: {gr.replays} replays, {gr.captured} captured, failed {gr.failed}", flush=True)
    return 0


def _variants(mem, hx, H) -> dict:
    """{name: fn(h)}: the memory's own update (graphed), its eager kernels, and rewrites of them."""
    A, Amu, Dm = mem._matrices(hx.device, torch.float32, "A", "Amu", "D")
    a = mem.alpha

    def scores(h):
        x = h.reshape(-1, H).float()
        return x, (x @ A.T if Amu is None else torch.addmm(Amu, x, A.T, beta=-1))

    def unsorted(h):
        x, c = scores(h)
        i = c.abs().topk(Q, dim=1, sorted=False).indices
        change = torch.nn.functional.embedding_bag(i, Dm, per_sample_weights=c.gather(1, i), mode="sum")
        return (x + a * change).to(h.dtype).view_as(h)

    def bmm(h, sort=False):
        x, c = scores(h)
        i = c.abs().topk(Q, dim=1, sorted=sort).indices
        change = torch.bmm(c.gather(1, i).unsqueeze(1), Dm[i]).squeeze(1)
        return torch.add(x, change, alpha=a).to(h.dtype).view_as(h)

    def bmm_tf32(h):
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return bmm(h)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False

    out = dict(graphed=mem.update, eager=mem._updated, unsorted=unsorted, bmm_sorted=lambda h: bmm(h, True),
               bmm=bmm, bmm_tf32=bmm_tf32)
    if hx.is_cuda:  # the bmm rewrite replayed from a graph of its own (the memory's mechanism, cuda_graph.py)
        graphs = GraphedCalls(bmm)

        def graph_bmm(h):  # eager at its first call, replayed from the second on
            y = graphs(h, ())
            return bmm(h) if y is None else y

        out["graph_bmm"] = graph_bmm
    return out


def _launches(fn, hx, dev) -> tuple[int, int]:
    """(kernel launches, synchronisations and copies) torch.profiler sees in one call and the sync after it."""
    fn(hx)
    sync(dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if hx.is_cuda else [])
    with profile(activities=acts) as prof:
        fn(hx)
        sync(dev)
    c = collections.Counter(e.name for e in prof.events())
    launches = sum(v for k, v in c.items() if "LaunchKernel" in k or "GraphLaunch" in k)
    return launches, sum(v for k, v in c.items() if "Synchronize" in k or "MemcpyAsync" in k)


if __name__ == "__main__":
    raise SystemExit(script(main))

"""memory/cuda_graph.py: the edit memory's q > 0 hook replayed from CUDA graphs.

On a CPU nothing is captured and the hook is its eager kernels; the cache's bookkeeping (capture at the
second call of a shape, keep the last KEEP shapes, CAPTURES per state, forget everything when the
state changes, hand out copies) is checked with a stand-in graph that replays by running the function
on its input buffer into its output buffer; the real graphs on a CUDA device (skipped without one:
`benchmarks/device_check.py --device cuda` checks them on every GPU it runs on, 24 of 24 on an H200).
"""

import copy

import pytest
import torch

from timerome.memory.cuda_graph import GraphedCalls
from timerome.memory.edit_memory import EditMemory


class _Replay:
    """A stand-in for a captured graph: replay() computes fn(input buffer) into the output buffer."""

    def __init__(self, fn, x_in, out):
        self.fn, self.x_in, self.out = fn, x_in, out

    def replay(self):
        self.out.copy_(self.fn(self.x_in))


class _OnCPU(GraphedCalls):
    """GraphedCalls with its CUDA parts replaced: every input applies, and capture builds a _Replay."""

    def __init__(self, fn, **kw):
        super().__init__(fn, **kw)
        self.captures_made = []

    @staticmethod
    def _applies(x):
        return not torch.is_grad_enabled()

    def _capture(self, x, keep):
        x_in = torch.empty_like(x).copy_(x)
        out = self.fn(x_in)
        self.captures_made.append(tuple(x.shape))
        g = _Replay(self.fn, x_in, out)
        return g, x_in, out, None, keep  # no event: one stream


def f(x):
    return x * 2 + 1


@torch.no_grad()
def test_a_shape_is_captured_at_its_second_call_and_replayed_after():
    g = _OnCPU(f)
    x = torch.arange(6.0).view(2, 3)
    assert g(x, ("s",)) is None                      # first call: the caller runs it
    y = g(x, ("s",))                                 # second: captured and replayed
    assert torch.equal(y, f(x)) and g.captures_made == [(2, 3)] and g.replays == 1
    z = g(x + 1, ("s",))                             # same shape, new values: replayed on them
    assert torch.equal(z, f(x + 1)) and g.captures_made == [(2, 3)] and g.replays == 2
    assert torch.equal(y, f(x))                      # a tensor handed out is a copy: the later replay left it


@torch.no_grad()
def test_a_change_of_state_forgets_every_graph():
    g = _OnCPU(f)
    x = torch.ones(4)
    g(x, (1,)), g(x, (1,))
    assert g.captures_made == [(4,)]
    assert g(x, (2,)) is None                        # new state: counted again from the first call
    assert g(x, (2,)) is not None and g.captures_made == [(4,), (4,)]


@torch.no_grad()
def test_the_least_recently_used_graph_is_dropped_and_captures_are_bounded():
    g = _OnCPU(f, keep=2, captures=4)
    a, b, c = (torch.ones(n) for n in (1, 2, 3))
    g(a, ()), g(a, ()), g(b, ()), g(b, ())
    g(a, ())                                         # a used last: b is now the least recent
    g(c, ()), g(c, ())                               # a third graph: b is dropped, a kept
    assert g.captures_made == [(1,), (2,), (3,)] and len(g._graphs) == 2
    replays = g.replays
    assert g(a, ()) is not None and g.replays == replays + 1 and g.captures_made[-1] == (3,)
    assert g(b, ()) is not None and g.captures_made[-1] == (2,)  # recaptured (4 of 4 captures)
    g(c, ())                                         # c was dropped by b's return: no capture left
    assert g(c, ()) is None and len(g.captures_made) == 4


@torch.no_grad()
def test_a_capture_that_fails_is_never_tried_again():
    class Failing(GraphedCalls):
        @staticmethod
        def _applies(x):
            return True

    g = Failing(f)  # its real _capture: on a CPU tensor torch.cuda refuses, inside the capture's try
    x = torch.ones(3)
    assert g(x, ()) is None and g(x, ()) is None
    assert g.failed and g.captured == 0 and g(x, ()) is None


class _Frozen(_OnCPU):
    """A stand-in for the memory's graphs that, like a real graph, bakes in the memory as it was at capture:
    its replay runs a deep copy of the memory taken then."""

    def __init__(self, mem):
        super().__init__(mem._updated)
        self.mem = mem

    def _capture(self, x, keep):
        frozen = copy.deepcopy(self.mem)
        frozen._graphed = GraphedCalls(frozen._updated)
        x_in = torch.empty_like(x).copy_(x)
        out = frozen._updated(x_in)
        return _Replay(frozen._updated, x_in, out), x_in, out, None, keep


@torch.enable_grad()
def test_autograd_recording_runs_eagerly():
    g = _OnCPU(f)
    x = torch.ones(3)
    assert g(x, ()) is None and g(x, ()) is None and g.captures_made == []


def _memory(tiny_bb, n=12, seed=0):
    H = tiny_bb.hidden_size
    g = torch.Generator().manual_seed(seed)
    U, D = (torch.randn(n, H, generator=g, dtype=torch.float64) for _ in range(2))
    mem = EditMemory(tiny_bb, (1, "resid"), key_metric="paper", q=4).add_vectors(U, D, [f"f{i}" for i in range(n)])
    return mem, torch.randn(2, 9, H, generator=g)


@torch.no_grad()
def test_on_a_cpu_the_memory_hook_runs_its_eager_kernels(tiny_bb):
    mem, h = _memory(tiny_bb)
    outs = [mem.update(h) for _ in range(3)]
    assert all(torch.equal(o, mem._updated(h)) for o in outs)
    assert not torch.equal(outs[0], h)  # the update does move h
    assert mem._graphed.replays == 0 and mem._graphed.captured == 0 and not mem._graphed.failed


@torch.no_grad()
def test_whatever_changes_the_memory_changes_the_graphs_state(tiny_bb):
    """Graphs that bake in the memory as captured (a deep copy) give the memory's current update after each
    change of alpha, q, g_max, its facts: the state update() hands the graphs names every one of them."""
    mem, h = _memory(tiny_bb)
    mem._graphed = _Frozen(mem)
    g = torch.Generator().manual_seed(5)
    extra_U, extra_D = (torch.randn(2, tiny_bb.hidden_size, generator=g, dtype=torch.float64) for _ in range(2))
    changes = [lambda: setattr(mem, "alpha", mem.alpha * 3), lambda: setattr(mem, "q", 2),
               lambda: setattr(mem, "g_max", 0.5), lambda: mem.add_vectors(extra_U, extra_D, ["x1", "x2"]),
               lambda: mem.remove(["f3"])]
    for change in [lambda: None] + changes:
        change()
        mem.update(h), mem.update(h)  # captured (again) at the second call
        got = mem.update(h)           # replayed
        assert mem._graphed.replays >= 1
        assert torch.equal(got, mem._updated(h))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (device_check.py checks them)")
@torch.no_grad()
def test_on_a_gpu_replays_equal_the_eager_kernels_bit_for_bit():
    D = torch.randn(500, 64, device="cuda")
    A = torch.randn(500, 64, device="cuda")

    def hook(x):
        c = x @ A.T
        i = c.abs().topk(4, dim=1).indices
        return x + 2.0 * torch.nn.functional.embedding_bag(i, D, per_sample_weights=c.gather(1, i), mode="sum")

    g = GraphedCalls(hook)
    xs = [torch.randn(40, 64, device="cuda") for _ in range(4)]
    got = [g(x, ("v",), keep=(A, D)) for x in xs]
    assert got[0] is None and not g.failed and g.replays == 3
    assert all(torch.equal(y, hook(x)) for x, y in zip(xs[1:], got[1:]))

"""A hook's update replayed from a CUDA graph: one launch for the dozen kernels an eager call makes.

On a GPU the edit memory's q > 0 hook is a dozen small kernels (the scores, |c|, the top q, the gather,
the kept deltas, alpha and the sum), and launching them takes more host time than the GPU spends on
them: at LLaDA-8B's shapes with 10^4 facts, 0.25-0.60 ms of host time per call and 27-30 launches,
against 0.5 ms of GPU work (`benchmarks/bench_hook_launches.py` on an H200, stop 47). A forward of a
short sequence is bound by its host (the launches of its 32 blocks), so the hook's host time adds to
the forward whole. A captured graph replays the same kernels on the same buffers in one launch
(0.04-0.06 ms of host time, same outputs bit for bit; `benchmarks/device_check.py` checks it on each
GPU it runs on).

`GraphedCalls(fn)` keeps, for one function of one tensor, up to `keep` graphs, one per (shape, dtype,
device) of its input and the modes a capture bakes in (inference mode, TF32), each captured at the
second call with that input (a generation repeats one shape at every step; a shape seen once is never
captured), and forgets them all when the caller's `state` changes (an edit memory's facts, alpha, q:
whatever the captured kernels bake in). A call returns None where it does not apply, and the caller
then runs fn itself: an input off a CUDA device or on another device than the current one, autograd
recording, autocast, a stream being captured by someone else, or a capture that failed once (then
never tried again for this object). Every replay copies the input into the graph's input buffer and
returns a copy of its output buffer, so no tensor handed out is overwritten by a later replay, and it
waits for the last replay's use of those buffers (an event), so calls from two streams do not race.
At most `captures` graphs are captured per state, so inputs whose shapes keep changing (more than
`keep` in turn) cost a few captures, then run eagerly.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

CAPTURE_AT = 2  # the call with an input shape at which its graph is captured (calls before it run eagerly)
KEEP = 4        # graphs kept per function (least recently used dropped)
CAPTURES = 16   # captures per state at most: shapes that keep changing (more than KEEP in turn) run eagerly


class GraphedCalls:
    """fn(x) replayed from CUDA graphs (module docstring); None where it does not apply."""

    def __init__(self, fn, keep: int = KEEP, capture_at: int = CAPTURE_AT, captures: int = CAPTURES):
        self.fn, self.keep, self.capture_at, self.captures = fn, keep, capture_at, captures
        self._graphs: OrderedDict = OrderedDict()  # (shape, dtype, device, modes) -> (graph, input buffer, output buffer, event, what it reads)
        self._seen: dict = {}                      # the same keys -> calls so far
        self._state = None
        self.failed = False
        self.replays = self.captured = 0  # since the last change of state

    def __call__(self, x: torch.Tensor, state: tuple, keep=None) -> torch.Tensor | None:
        """fn(x) from a graph, or None (the caller runs fn). state: plain values (compared with ==) that
        fn's kernels bake in; keep: what they read (kept alive with the graphs captured under state)."""
        if self.failed or not self._applies(x):
            return None
        if state != self._state:  # what the graphs baked in changed: none of them holds
            self.clear()
            self._state = state
        # a graph also bakes in the modes its capture ran under: inference mode (its buffers' kind) and
        # the float32 matmul precision (TF32 or not)
        key = (tuple(x.shape), x.dtype, x.device, torch.is_inference_mode_enabled(),
               torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
        entry = self._graphs.get(key)
        if entry is None:
            self._seen[key] = self._seen.get(key, 0) + 1
            if self._seen[key] < self.capture_at or self.captured >= self.captures:
                return None
            entry = self._capture(x, keep)
            if entry is None:
                return None
            self.captured += 1
            self._graphs[key] = entry
            while len(self._graphs) > self.keep:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        graph, x_in, out, done, _ = entry
        if done is not None:  # the last replay's use of these buffers (on any stream) comes first
            torch.cuda.current_stream().wait_event(done)
        x_in.copy_(x)
        graph.replay()
        y = out.clone()
        if done is not None:
            done.record()
        self.replays += 1
        return y

    @staticmethod
    def _applies(x: torch.Tensor) -> bool:
        """A CUDA input on the current device, no autograd recording, no autocast, and no capture of
        this stream under way (someone else's)."""
        return (x.is_cuda and not torch.is_grad_enabled() and x.device.index == torch.cuda.current_device()
                and not torch.is_autocast_enabled("cuda") and not torch.cuda.is_current_stream_capturing())

    def clear(self) -> None:
        """Forget every graph (their buffers are freed with them)."""
        self._graphs.clear()
        self._seen.clear()
        self._state = None
        self.replays = self.captured = 0

    def _capture(self, x: torch.Tensor, keep):
        """(graph, input buffer, output buffer, event, keep) for inputs like x, or None (and `failed`)
        where capture fails. Two warm-up calls on a side stream first (cuBLAS's handles and
        workspaces), as torch's CUDA graph notes ask; the capture runs on that stream too (on x's
        device: torch's own capture stream belongs to the device of the first capture in the
        process). The event marks the end of the last replay's use of the buffers. keep stays with
        the graph: the tensors its kernels read (the memory's matrices) live while it can replay."""
        x_in = torch.empty_like(x).copy_(x)
        try:
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.fn(x_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                out = self.fn(x_in)
        except Exception:  # noqa: BLE001 - an op that cannot be captured: the eager calls stay exact
            self.failed = True
            self.clear()
            return None
        return graph, x_in, out, torch.cuda.Event(), keep

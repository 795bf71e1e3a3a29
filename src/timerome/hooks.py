"""Hooks as context managers: capture, patch and edit are three modes of one mechanism.

A site is (layer, point) with point in {"resid", "attn", "mlp"} (or (None, "embed")). A hook
function receives the site's output h [B, L, H] and the shared TraceState, and returns a
replacement tensor or None. Hooks are installed on entering the `with` block and removed on
leaving it, also when the body raises.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Callable

import torch

Site = tuple  # (layer: int | None, point: str)
HookFn = Callable[[torch.Tensor, "TraceState"], torch.Tensor | None]


class TraceState:
    """Carries the denoising step k; the sampler sets it before every forward."""

    def __init__(self, step: int = 0):
        self.step = step

    def __repr__(self) -> str:
        return f"TraceState(step={self.step})"


class Intervention:
    """Install hook functions on backbone sites for the duration of a `with` block."""

    def __init__(self, backbone, fns: dict[Site, HookFn], state: TraceState | None = None):
        self.backbone = backbone
        self.fns = dict(fns)
        self.state = state if state is not None else TraceState()
        self._handles = []

    def __enter__(self):
        try:
            for (layer, point), fn in self.fns.items():
                module = self.backbone.module(layer, point)
                self._handles.append(module.register_forward_hook(_wrap(fn, self.state)))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False


def _wrap(fn: HookFn, state: TraceState):
    def hook(module, inputs, output):
        h = output[0] if isinstance(output, tuple) else output
        new = fn(h, state)
        if new is None:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return hook


# ------------------------------------------------------------------------------ the three modes


@contextmanager
def capture(backbone, sites, state: TraceState | None = None, positions=None, to_cpu: bool = False):
    """Record each site's output at every forward: store[site] is a list, one tensor per forward.

    positions: optional LongTensor [P] of token positions to keep (saves memory when only the
    subject tokens matter).
    """
    store: dict[Site, list[torch.Tensor]] = defaultdict(list)

    def recorder(site):
        def fn(h, _state):
            v = h if positions is None else h[:, positions]
            v = v.detach().clone()
            store[site].append(v.cpu() if to_cpu else v)
            return None

        return fn

    with Intervention(backbone, {s: recorder(s) for s in sites}, state):
        yield store


@contextmanager
def patch(backbone, values: dict[Site, torch.Tensor], positions, state: TraceState | None = None,
          at_step: int | None = None):
    """Splice values[site] [B or 1, P, H] into the site's output at token `positions`.

    With at_step, the splice happens only on the forward where state.step == at_step.
    """
    state = state if state is not None else TraceState()

    def splicer(site):
        def fn(h, st):
            if at_step is not None and st.step != at_step:
                return None
            out = h.clone()
            out[:, positions] = values[site].to(h.dtype)
            return out

        return fn

    with Intervention(backbone, {s: splicer(s) for s in values}, state):
        yield state


@contextmanager
def edit(backbone, site: Site, fn: Callable[[torch.Tensor], torch.Tensor], state: TraceState | None = None,
         steps: set[int] | None = None):
    """Replace the site's output h by fn(h), at every forward or only at the given steps."""

    def editor(h, st):
        if steps is not None and st.step not in steps:
            return None
        return fn(h)

    with Intervention(backbone, {site: editor}, state) as iv:
        yield iv.state

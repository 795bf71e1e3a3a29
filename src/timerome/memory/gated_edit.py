"""The single-fact gated edit (paper Eq. single): one fact's delta, added where a token looks like its subject.

    h <- h + alpha * g(h) * d,    g(h) = clip(<u, h> / (|u|^2 + eps), 0, g_max)

u and d are the fact's subject key and target delta (capture.py). The gate is 0 unless the
token's residual leans toward u; g_max caps run-away amplification on out-of-distribution inputs.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from timerome.common.checks import number
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.backbones.backbone import model_arg
from timerome.engine.hooks import Hooks, TraceState, once_on
from timerome.errors import TimeromeError
from timerome.memory.base import math_dtype
from timerome.memory.capture import capture_facts
from timerome.memory.scale import check_on_keys


def gated_delta(h: torch.Tensor, u: torch.Tensor, d: torch.Tensor, *, alpha: float = 1.0,
                g_max: float = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """Eq. single's update alpha * clip(<u, h> / (|u|^2 + eps), 0, g_max) * d, for h [..., H]; h's dtype."""
    dt = math_dtype(h)
    u, d = u.to(h.device, dt), d.to(h.device, dt)
    gate = (h.to(dt) @ u / (u @ u + eps)).clamp(0.0, g_max)  # [...]: 0 unless h leans toward u
    return (alpha * gate[..., None] * d).to(h.dtype)


class GatedEdit:
    """One fact's gated edit at a coordinate, installed with `with edit.applied(backbone): ...`."""

    def __init__(self, u: torch.Tensor, d: torch.Tensor, coordinate, *, alpha: float = 1.0,
                 g_max: float = 1.0, eps: float = 1e-6):
        if u.shape != d.shape or u.dim() != 1:
            raise TimeromeError(f"u and d must be two vectors of the same size, got {tuple(u.shape)}, {tuple(d.shape)}")
        if not (torch.isfinite(u).all() and torch.isfinite(d).all()):
            raise TimeromeError("the key or delta has NaN/inf values")
        if g_max <= 0 or eps <= 0:
            raise TimeromeError(f"g_max and eps must be > 0, got {g_max}, {eps}")
        number(alpha, "alpha", lo=0)
        self.u, self.d = u.double().cpu(), d.double().cpu()
        self.coordinate = Coordinate.of(coordinate)
        self.alpha, self.g_max, self.eps = float(alpha), float(g_max), float(eps)

    @classmethod
    def from_fact(cls, backbone, fact, coordinate, *, target: str = DEFAULT_TARGET, **kw) -> "GatedEdit":
        coord = Coordinate.of(coordinate).on(backbone)
        cap = capture_facts(backbone, [fact], coord, target=target)
        return cls(cap.keys[0], cap.deltas[0], coord, **kw)

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        return gated_delta(h, self.u, self.d, alpha=self.alpha, g_max=self.g_max, eps=self.eps)

    def scale_probe(self) -> torch.Tensor:
        return self.u[None]

    def scale_state(self) -> tuple:
        return self.alpha, self.g_max, self.eps

    def _check_ready(self) -> None:
        """alpha may be changed at any time, as a memory's: applying it checks it."""
        number(self.alpha, "alpha", lo=0)

    @contextmanager
    def applied(self, backbone, state: TraceState | None = None):
        coord = self.coordinate.on(model_arg(backbone, "applied's backbone"))
        if backbone.hidden_size != len(self.u):
            raise TimeromeError(f"the edit has hidden size {len(self.u)}, the model {backbone.hidden_size}")
        self._check_ready()
        check_on_keys(self, backbone, "this gated edit")
        with once_on(self, backbone), Hooks(backbone, edit={coord: lambda h, _st: h + self.delta(h)},
                                            state=state) as hooks:
            yield hooks.state

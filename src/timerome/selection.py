"""Coordinate selection (paper Eq. coord): where to install the edit, read off TIE heatmaps.

    (l*, k*, m*) = argmax_{(l,k,m)}  E_{z in F_v} |TIE_bar_z(l,k,m)|  -  beta E_{z' in N} |TIE_bar_z'(l,k,m)|

The magnitude is used because a site that strongly *lowers* the object's log-prob is as causally
involved as one that raises it. beta = 0 is plain max-magnitude selection (the paper's headline
setting); beta > 0 penalises sites that also matter for neighbour facts (retain selectivity).
Equal scores are ranked in the heatmap's order (module, layer, step), so the choice is deterministic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from timerome.errors import TimeromeError


@dataclass(frozen=True)
class Coordinate:
    layer: int
    step: int
    module: str
    score: float              # the objective (or, per fact, that fact's signed TIE_bar)
    mean_abs_tie: float       # E_{F_v} |TIE_bar| (or |TIE_bar| of that one fact)
    neighbour_abs_tie: float  # E_N |TIE_bar|; 0 without neighbours

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Selection:
    best: Coordinate
    top: list[Coordinate]  # best first, at most `top` long

    def __iter__(self):  # best, top = select_coordinate(...)
        return iter((self.best, self.top))


def objective(result, neighbours=None, beta: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(score, mean |TIE| over facts, mean |TIE| over neighbours), each [M, Ly, K]."""
    if not beta >= 0:
        raise TimeromeError(f"beta must be >= 0, got {beta!r}")
    own = result.tie.abs().mean(0)
    other = torch.zeros_like(own)
    if neighbours is not None:
        _check_compatible(result, neighbours)
        other = neighbours.tie.abs().mean(0)
    return own - beta * other, own, other


def select_coordinate(result, neighbours=None, beta: float = 0.0, top: int = 10) -> Selection:
    """The best (layer, step, module) of a TraceResult, and the `top` best in order."""
    if not isinstance(top, int) or top < 1:
        raise TimeromeError(f"top must be an integer >= 1, got {top!r}")
    score, own, other = objective(result, neighbours, beta)
    order = torch.sort(score.flatten(), descending=True, stable=True).indices[:top]
    ranked = [_coordinate(result, i, score, own, other) for i in order.tolist()]
    return Selection(ranked[0], ranked)


def per_fact_best(result) -> list[Coordinate]:
    """For each fact, its argmax of |TIE_bar| (score = the signed TIE_bar there)."""
    out = []
    for f in range(result.tie.shape[0]):
        tie = result.tie[f]  # [M, Ly, K]
        i = int(torch.sort(tie.abs().flatten(), descending=True, stable=True).indices[0])
        out.append(_coordinate(result, i, tie, tie.abs(), torch.zeros_like(tie)))
    return out


def _coordinate(result, flat: int, score, own, other) -> Coordinate:
    M, Ly, K = score.shape
    m, rest = divmod(flat, Ly * K)
    li, k = divmod(rest, K)
    at = (m, li, k)
    return Coordinate(layer=int(result.layers[li]), step=k, module=result.modules[m], score=float(score[at]),
                      mean_abs_tie=float(own[at]), neighbour_abs_tie=float(other[at]))


def _check_compatible(result, neighbours) -> None:
    mine = (tuple(result.modules), list(result.layers), result.steps)
    theirs = (tuple(neighbours.modules), list(neighbours.layers), neighbours.steps)
    if mine != theirs:
        raise TimeromeError(f"the neighbour trace covers (modules, layers, steps) = {theirs}, the trace "
                            f"{mine}; trace both with the same modules, layers and steps")
    fp, nfp = result.settings.get("fingerprint"), neighbours.settings.get("fingerprint")
    if fp and nfp and fp != nfp:
        raise TimeromeError(f"the neighbour trace was made on another model (fingerprint {nfp} != {fp})")

"""2. Coordinate selection (paper Eq. coord): where to install the edit, read off TIE heatmaps.

    (l*, k*, m*) = argmax_{(l,k,m)}  E_{z in F_v} |TIE_bar_z(l,k,m)|  -  beta E_{z' in N} |TIE_bar_z'(l,k,m)|

The magnitude is used because a site that strongly *lowers* the object's log-prob is as causally
involved as one that raises it. beta = 0 is plain max-magnitude selection (the paper's headline
setting); beta > 0 penalises sites that also matter for neighbour facts (retain selectivity).
Equal scores are ranked in the heatmap's order (module, layer, step), so the choice is deterministic.
The paper then edits at k* = -1 (every step) and m* = resid: `modules=("resid",)` restricts the
ranking to the residual stream, and a candidate's `edit_coordinate` drops its step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from timerome.common.checks import finite_tensor, integer, number, shown
from timerome.engine.coordinate import Coordinate
from timerome.engine.settings import TRACE
from timerome.errors import TimeromeError
from timerome.tracing.result import TraceResult


@dataclass(frozen=True)
class Candidate:
    """A scored (layer, step, module): `coordinate.step` is the step k whose TIE was measured."""

    coordinate: Coordinate
    score: float              # the objective (or, per fact, that fact's signed TIE_bar)
    mean_abs_tie: float       # E_{F_v} |TIE_bar| (or |TIE_bar| of that one fact)
    neighbour_abs_tie: float  # E_N |TIE_bar|; 0 without neighbours

    layer = property(lambda self: self.coordinate.layer)
    step = property(lambda self: self.coordinate.step)
    module = property(lambda self: self.coordinate.point)

    @property
    def edit_coordinate(self) -> Coordinate:
        """Where the paper edits: this layer and module at every denoising step (k* = -1)."""
        return self.coordinate.every_step()

    def as_dict(self) -> dict:
        return dict(layer=self.layer, step=self.step, module=self.module, score=self.score,
                    mean_abs_tie=self.mean_abs_tie, neighbour_abs_tie=self.neighbour_abs_tie)

    def edit_dict(self) -> dict:
        """`as_dict` of the edit this candidate gives (`edit_coordinate`): step None (every step), and
        the step whose TIE chose it as traced_step."""
        return dict(self.as_dict(), step=self.edit_coordinate.step, traced_step=self.step)


@dataclass(frozen=True)
class Selection:
    best: Candidate
    top: list[Candidate]  # best first, at most `top` long

    def __iter__(self):  # best, top = select_coordinate(...)
        return iter((self.best, self.top))


def objective(result, neighbours=None, beta: float = TRACE.beta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(score, mean |TIE| over facts, mean |TIE| over neighbours), each [M, Ly, K]."""
    if not beta >= 0:
        raise TimeromeError(f"beta must be >= 0, got {beta!r}")
    own = result.tie.abs().mean(0)
    other = torch.zeros_like(own)
    if neighbours is not None:
        _check_compatible(result, neighbours)
        other = neighbours.tie.abs().mean(0)
    return own - beta * other, own, other


def trace_arg(result, where: str = "result", *, load: bool = False) -> TraceResult:
    """result if it is a TraceResult (load: a path to a saved one is read, `TraceResult.load`), else one
    TimeromeError naming the argument: a path, None or a string failed deep inside with an AttributeError."""
    if load and (isinstance(result, str) or hasattr(result, "__fspath__")):
        return TraceResult.load(result)
    if isinstance(result, TraceResult):
        return result
    path = isinstance(result, (str, bytes)) or hasattr(result, "__fspath__")
    hint = " (a saved trace: TraceResult.load(path))" if path else ""
    raise TimeromeError(f"{where} must be a TraceResult (timerome.trace(backbone, facts, ...)), got "
                        f"{type(result).__name__} {shown(result)}{hint}")


def check_penalty(neighbours, beta) -> None:
    """The neighbour penalty's arguments: beta a number >= 0 (a negative one would reward the sites
    that matter for the neighbours), given only with the neighbours' TraceResult."""
    number(beta, "beta (the neighbour penalty)", lo=0)
    if beta > 0 and neighbours is None:  # refused, not ignored (the CLI's --beta without --neighbours alike)
        raise TimeromeError(f"beta {beta:g} penalises the sites that matter for neighbour facts: give their trace "
                            "(neighbours=trace(backbone, neighbour_facts, ...))")
    if neighbours is not None and not hasattr(neighbours, "tie"):
        raise TimeromeError(f"neighbours must be the TraceResult of the neighbour facts (trace(backbone, facts, "
                            f"...)), got {type(neighbours).__name__}")


def select_coordinate(result, neighbours=None, beta: float = TRACE.beta, top: int = 10, modules=None) -> Selection:
    """The best (layer, step, module) of a TraceResult, and the `top` best in order; `modules`
    restricts the choice (the paper's m* = resid: modules=("resid",))."""
    trace_arg(result, "select_coordinate's result")
    integer(top, "top", lo=1)
    check_penalty(neighbours, beta)
    result, neighbours = _restrict(result, neighbours, modules)
    score, own, other = objective(result, neighbours, beta)
    finite_tensor(score, "the trace's TIE (what selection ranks)",  # a NaN would sort first and be chosen
                  "a NaN would be ranked first and chosen; trace again")
    if not bool(own.ne(0).any()):  # a tie-break would name a coordinate no restoration ever moved
        raise TimeromeError("the trace found no effect: every mean |TIE| is 0, so no coordinate stores the facts "
                            "more than another (a noise scale of 0, or facts whose object the model never says?)")
    order = torch.sort(score.flatten(), descending=True, stable=True).indices[:top]
    ranked = [_candidate(result, i, score, own, other) for i in order.tolist()]
    if neighbours is not None and beta > 0 and ranked[0].score <= 0:  # the penalty left no site ahead: a tie-break
        raise TimeromeError(f"with beta {beta:g}, no coordinate matters more for these facts than beta times it does "
                            "for the neighbours (every penalised score is <= 0): lower beta, or trace other neighbours")
    return Selection(ranked[0], ranked)


def runner_up(result, best: Candidate, neighbours=None, beta: float = TRACE.beta, modules=None) -> dict | None:
    """The best-ranked cell of another (layer, module) than `best` (another edit: the edit keeps only
    those), and how far `best` leads it: the objective's difference, with its standard error over
    the facts (paired: each fact's |TIE_bar| at the two cells; the neighbours' term alike, times beta).
    A margin under two standard errors is within the trace's noise: another seed, another order of
    the facts or other facts may choose the runner-up; a margin of 0 is a tie (`tie`, and within the
    noise whatever the spread: the cells' order chose). None when no other cell exists."""
    trace_arg(result, "runner_up's result")
    check_penalty(neighbours, beta)
    result, neighbours = _restrict(result, neighbours, modules)
    if not (isinstance(best, Candidate) and best.module in result.modules and best.layer in result.layers
            and 0 <= best.step < result.steps):
        raise TimeromeError(f"best must be a Candidate of this trace's cells (select_coordinate(result, ..., "
                            f"modules={modules!r}).best), got {best!r:.120}")
    score, own, other = objective(result, neighbours, beta)
    order = torch.sort(score.flatten(), descending=True, stable=True).indices.tolist()
    ranked = (_candidate(result, i, score, own, other) for i in order)
    second = next((c for c in ranked if (c.layer, c.module) != (best.layer, best.module)), None)
    if second is None:
        return None

    def at(tie, c):  # every fact's |TIE_bar| at candidate c
        return tie[:, result.modules.index(c.module), result.layers.index(c.layer), c.step].abs().double()

    def se(d):
        return float(d.std(unbiased=True) / d.numel() ** 0.5) if d.numel() > 1 else float("nan")

    d = at(result.tie, best) - at(result.tie, second)
    var = se(d) ** 2
    if neighbours is not None and beta > 0:
        var += (beta * se(at(neighbours.tie, best) - at(neighbours.tie, second))) ** 2
    margin, margin_se = best.score - second.score, var ** 0.5
    # an exact tie (both cells restore the same: e.g. both give back the clean answer) is no lead, with any spread
    return dict(second.as_dict(), margin=margin, margin_se=margin_se, tie=bool(margin == 0),
                within_noise=bool(margin == 0 or (margin_se == margin_se and margin < 2 * margin_se)))


def _restrict(result, neighbours, modules):
    """The trace and the neighbours' restricted to `modules` (None: all of them)."""
    if modules is None:
        return result, neighbours
    return result.only(modules), (neighbours.only(modules) if neighbours is not None else None)


def per_fact_best(result) -> list[Candidate]:
    """For each fact, its argmax of |TIE_bar| (score = the signed TIE_bar there)."""
    trace_arg(result, "per_fact_best's result")
    out = []
    for f in range(result.tie.shape[0]):
        tie = result.tie[f]  # [M, Ly, K]
        i = int(torch.sort(tie.abs().flatten(), descending=True, stable=True).indices[0])
        out.append(_candidate(result, i, tie, tie.abs(), torch.zeros_like(tie)))
    return out


def _candidate(result, flat: int, score, own, other) -> Candidate:
    M, Ly, K = score.shape
    m, rest = divmod(flat, Ly * K)
    li, k = divmod(rest, K)
    at = (m, li, k)
    return Candidate(Coordinate(int(result.layers[li]), result.modules[m], k), score=float(score[at]),
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
    # the penalty compares like with like: the same noise scale (trace's default s3 rule gives each set of
    # facts its own), the same decay and read-out; the number of noise samples only changes the noise
    # (each key's value where a file has none: read_positions is recorded only where it is not "all")
    for key, hint, absent in (("sigma", "sigma=result (its noise scale)", None), ("tau", "the same tau", None),
                              ("readout", "the same readout", None),
                              ("read_positions", "the same read_positions", TRACE.read_positions)):
        a, b = result.settings.get(key, absent), neighbours.settings.get(key, absent)
        differ = (abs(a - b) > 1e-6 * max(abs(a), abs(b)) if isinstance(a, (int, float)) and isinstance(b, (int, float))
                  else a != b)
        if a is not None and b is not None and differ:
            raise TimeromeError(f"the neighbour trace has {key} {b!r}, the trace {a!r}: the penalty must compare "
                                f"like with like; trace the neighbours with {hint}")

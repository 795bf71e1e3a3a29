"""tracing/selection.py: Eq. coord, the largest mean |TIE| (minus beta x the neighbours')."""

import pytest
import torch

from timerome import TimeromeError
from timerome.engine.coordinate import Coordinate
from timerome.tracing.result import TraceResult
from timerome.tracing.selection import per_fact_best, select_coordinate


def result(tie: torch.Tensor, modules=("resid", "attn"), layers=(0, 1, 2)) -> TraceResult:
    F, M, Ly, K = tie.shape
    return TraceResult(tie, torch.zeros(F, M, Ly, K, K + 1), torch.zeros(F, K + 1), torch.zeros(F, 1, K + 1),
                       [f"f{i}" for i in range(F)], tuple(modules), list(layers), {"fingerprint": "x"})


def test_the_largest_mean_absolute_tie_wins():
    tie = torch.zeros(2, 2, 3, 4)
    tie[0, 1, 2, 3], tie[1, 1, 2, 3] = 5.0, -5.0      # large |TIE| but opposite signs: mean |TIE| 5
    tie[:, 0, 1, 0] = 3.0                             # smaller, on both facts
    best, top = select_coordinate(result(tie))
    assert best.coordinate == Coordinate(2, "attn", 3) and best.mean_abs_tie == pytest.approx(5.0)
    assert best.edit_coordinate == Coordinate(2, "attn")  # the paper edits at every step
    assert top[1].coordinate == Coordinate(1, "resid", 0)
    assert select_coordinate(result(tie), modules=("resid",)).best.coordinate == Coordinate(1, "resid", 0)


def test_the_neighbour_penalty_moves_the_choice():
    tie = torch.zeros(1, 2, 3, 4)
    tie[0, 1, 2, 3], tie[0, 0, 1, 0] = 5.0, 3.0
    neighbours_tie = torch.zeros(1, 2, 3, 4)
    neighbours_tie[0, 1, 2, 3] = 4.0                  # the neighbours are read at the same place
    r, n = result(tie), result(neighbours_tie)
    assert select_coordinate(r, n, beta=0.0).best.coordinate == Coordinate(2, "attn", 3)
    best = select_coordinate(r, n, beta=1.0).best     # 5 - 4 < 3
    assert best.coordinate == Coordinate(1, "resid", 0) and best.score == pytest.approx(3.0)


def test_per_fact_best_and_bad_input():
    tie = torch.zeros(2, 2, 3, 4)
    tie[0, 0, 0, 1], tie[1, 1, 1, 2] = 2.0, -7.0
    a, b = per_fact_best(result(tie))
    assert (a.coordinate, b.coordinate, b.score) == (Coordinate(0, "resid", 1), Coordinate(1, "attn", 2), -7.0)
    tie[0, 0, 0, 0] = float("nan")
    with pytest.raises(TimeromeError, match="NaN"):
        select_coordinate(result(tie))
    with pytest.raises(TimeromeError, match="beta"):
        select_coordinate(result(torch.zeros(1, 2, 3, 4)), beta=-1.0)


def test_a_trace_without_any_effect_selects_nothing():
    # sigma 0 (no corruption) gives every TIE 0: a tie-break would name layer 0, step 0, and edit there
    with pytest.raises(TimeromeError, match=r"every mean \|TIE\| is 0"):
        select_coordinate(result(torch.zeros(2, 2, 3, 4)))
    tie = torch.zeros(2, 2, 3, 4)
    tie[1, 0, 2, 1] = 1e-6                            # any effect at all is a choice
    assert select_coordinate(result(tie)).best.coordinate == Coordinate(2, "resid", 1)


def test_the_neighbour_penalty_is_refused_where_it_cannot_act():
    tie = torch.zeros(1, 2, 3, 4)
    tie[0, 1, 2, 3] = 2.0
    with pytest.raises(TimeromeError, match="give their trace"):  # ignored before: the same choice as beta 0
        select_coordinate(result(tie), beta=5.0)
    with pytest.raises(TimeromeError, match="must be the TraceResult"):  # facts, not their trace
        select_coordinate(result(tie), neighbours=[1, 2], beta=1.0)
    with pytest.raises(TimeromeError, match="every penalised score is <= 0"):  # a tie-break would name layer 0
        select_coordinate(result(tie), result(tie), beta=1.0)
    assert select_coordinate(result(tie), result(tie), beta=0.5).best.score == pytest.approx(1.0)
    with pytest.raises(TimeromeError, match="beta .* must be a finite number >= 0"):  # rewarded the neighbours' sites
        select_coordinate(result(tie), result(tie), beta=-1.0)
    # the runner-up reads the same penalty: its own checks (a TypeError, an AttributeError, beta ignored before)
    from timerome.tracing.selection import runner_up

    best = select_coordinate(result(tie)).best
    for bad, needle in (({"neighbours": result(tie), "beta": "x"}, "beta"), ({"neighbours": "x", "beta": 1.0},
                        "must be the TraceResult"), ({"beta": 1.0}, "give their trace")):
        with pytest.raises(TimeromeError, match=needle):
            runner_up(result(tie), best, **bad)


def test_the_runner_up_is_another_layer_and_its_margin_has_a_paired_standard_error():
    """The choice between two layers 0.1 nats apart moved with the seed and the facts' order (stop 61's
    audit): the trace now reports the runner-up's margin and its standard error over the facts."""
    from timerome.tracing.selection import runner_up

    tie = torch.zeros(4, 2, 3, 4)
    tie[:, 0, 1, 2] = torch.tensor([6.0, 2.0, 6.0, 2.0])   # resid layer 1: mean 4, facts disagree
    tie[:, 0, 1, 3] = 3.9                                  # the same layer at another step: not another edit
    tie[:, 0, 0, 1] = torch.tensor([3.0, 5.0, 3.0, 4.6])   # resid layer 0: mean 3.9
    r = result(tie.clone())
    best = select_coordinate(r, modules=("resid",)).best
    second = runner_up(r, best, modules=("resid",))
    assert (best.layer, second["layer"], second["step"]) == (1, 0, 1)
    d = torch.tensor([3.0, -3.0, 3.0, -2.6], dtype=torch.float64)
    assert second["margin"] == pytest.approx(0.1, abs=1e-6)
    assert second["margin_se"] == pytest.approx(float(d.std() / 2), rel=1e-6) and second["within_noise"]
    tie[:, 0, 0, 1] = torch.tensor([1.0, 1.1, 0.9, 1.0])   # far behind on every fact
    far = runner_up(result(tie), best, modules=("resid",))
    assert far["margin"] == pytest.approx(3.0) and not far["within_noise"] and not far["tie"]
    tie[:, 0, 0, 1] = tie[:, 0, 1, 2]                     # an exact tie on every fact: no spread, and no lead
    even = runner_up(result(tie), best, modules=("resid",))
    assert even["margin"] == 0 and even["margin_se"] == 0 and even["tie"] and even["within_noise"]
    tie[:, 0, 0, 1] += 1.0                                 # the runner-up ahead of the `best` given: no tie
    behind = runner_up(result(tie), best, modules=("resid",))
    assert behind["margin"] == pytest.approx(-1.0) and not behind["tie"]
    nt = torch.zeros(3, 2, 3, 4)                           # the neighbours' term joins the spread, times beta
    nt[:, 0, 1, 2] = torch.tensor([1.0, 3.0, 2.0])          # at the best cell
    nt[:, 0, 0, 1] = torch.tensor([4.0, 4.0, 2.5])          # at the runner-up
    nt[:, 0, 1, 3] = 5.0                                   # the best layer's other step falls behind
    n = result(nt)
    best_n = select_coordinate(r, n, beta=0.5, modules=("resid",)).best
    with_n = runner_up(r, best_n, n, 0.5, modules=("resid",))
    assert (best_n.layer, best_n.step, with_n["layer"], with_n["step"]) == (1, 2, 0, 1)
    e = torch.tensor([-3.0, -1.0, -0.5], dtype=torch.float64)
    assert with_n["margin"] == pytest.approx((4.0 - 0.5 * 2.0) - (3.9 - 0.5 * 3.5), abs=1e-6)
    assert with_n["margin_se"] ** 2 == pytest.approx(second["margin_se"] ** 2 + (0.5 * float(e.std() / 3 ** 0.5)) ** 2)
    assert runner_up(result(tie[:, :, :1], layers=(0,)), select_coordinate(result(tie[:, :, :1], layers=(0,)),
                                                                           modules=("resid",)).best,
                     modules=("resid",)) is None  # one layer: no other edit
    from timerome.tracing.selection import Candidate

    attn = Candidate(Coordinate(0, "attn", 0), 1.0, 1.0, 0.0)
    with pytest.raises(TimeromeError, match="best must be a Candidate of this trace's cells"):
        runner_up(r, attn, modules=("resid",))  # chosen among other modules than those compared

"""tracing/tie.py: Eq. tie and Eq. tie_agg, the exp-decay weights over later steps."""

import math

import pytest
import torch

from timerome.tracing.tie import aggregate, later_steps, reveal_schedule, tie, tie_weights


def test_tie_is_the_mean_gain_of_patching_over_noise_samples():
    patched = torch.tensor([[[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]])        # [1, N=2, K+1=3]
    corrupted = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])        # [N, K+1]
    torch.testing.assert_close(tie(patched, corrupted), torch.tensor([[1.5, 1.0, 1.5]]))


def test_weights_are_a_decaying_distribution_over_later_steps():
    K, tau = 4, 0.7
    w = tie_weights(K, tau)
    assert w.shape == (K, K + 1)
    assert torch.equal(w > 0, later_steps(K))                          # only k' > k
    torch.testing.assert_close(w.sum(-1), torch.ones(K, dtype=torch.float64))
    # w[k, k'] / w[k, k' + 1] = exp(tau): each later step weighs exp(-tau) as much
    assert w[0, 1] / w[0, 2] == pytest.approx(math.exp(tau))
    assert tie_weights(K, 0.0)[1, 2:].tolist() == pytest.approx([1 / 3] * 3)  # tau 0: uniform


def test_aggregate_ignores_undefined_entries_and_weights_the_rest():
    K = 3
    full = torch.full((K, K + 1), float("nan"))
    full[later_steps(K)] = torch.arange(1.0, 7.0)                       # 1..6 where k' > k
    agg = aggregate(full, tau=1.0)
    w = tie_weights(K, 1.0)
    expect = [(w[k, k + 1:] * full[k, k + 1:].double()).sum().item() for k in range(K)]
    assert torch.isfinite(agg).all() and agg.tolist() == pytest.approx(expect)
    assert agg[-1].item() == pytest.approx(6.0)                         # the last step has one later step


def test_reveal_schedule_reveals_every_object_token_once():
    for n, steps in ((5, 8), (8, 8), (13, 4)):
        sched = reveal_schedule(n, steps)
        assert sum(sched) == n and len(sched) == steps

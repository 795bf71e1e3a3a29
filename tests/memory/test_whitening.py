"""memory/whitening.py: the background mean and shrunk covariance of the whitened key metric."""

import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.engine.encoding import text_ids
from timerome.engine.hooks import run_to
from timerome.memory.whitening import residual_stats

TEXTS = ["the author was born in a small city", "what genre does the author write ?", "the sea"]


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


def test_mean_and_covariance_are_those_of_every_token(bb):
    shrink = 0.05
    s = residual_stats(bb, (1, "resid"), TEXTS, shrinkage=shrink, batch_size=2)  # batched and padded
    h = torch.cat([run_to(bb, (1, "resid"), torch.tensor([text_ids(bb, t)]))[0].double() for t in TEXTS])
    assert s.n_tokens == len(h) and (s.layer, s.point) == (1, "resid")
    torch.testing.assert_close(s.mean, h.mean(0), atol=1e-5, rtol=1e-5)
    C = torch.cov(h.T, correction=1)                      # the unbiased scatter
    shrunk = (1 - shrink) * C + shrink * C.diagonal().mean() * torch.eye(bb.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(s.cov, shrunk, atol=1e-4, rtol=1e-4)


def test_shrinkage_makes_the_covariance_invertible(bb):
    s = residual_stats(bb, (1, "resid"), TEXTS[:1], shrinkage=0.05)    # fewer tokens than dimensions
    assert s.n_tokens < bb.hidden_size
    P = s.precision()
    torch.testing.assert_close(P @ s.cov, torch.eye(bb.hidden_size, dtype=torch.float64), atol=1e-6, rtol=0)


def test_bad_background_is_one_clear_error(bb):
    with pytest.raises(TimeromeError, match="empty"):
        residual_stats(bb, (1, "resid"), ["", ""])
    with pytest.raises(TimeromeError, match="shrinkage"):
        residual_stats(bb, (1, "resid"), TEXTS, shrinkage=1.5)


def test_a_memory_takes_statistics_of_its_own_site_only(bb):
    from timerome.memory.whitening import stats_at

    s = residual_stats(bb, (1, "resid"), TEXTS)
    assert stats_at(bb, (1, "resid"), s) is s                      # given: used as they are
    with pytest.raises(TimeromeError, match="layer 1 resid, the memory acts at layer 2 resid"):
        stats_at(bb, (2, "resid"), s)
    again = stats_at(bb, (1, "resid"), TEXTS)                      # texts: measured
    torch.testing.assert_close(again.cov, s.cov, rtol=0, atol=0)

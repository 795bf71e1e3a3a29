"""Seeds -> a table cell: mean +- std, bootstrap CI, paired t-test against a reference."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from timerome.errors import TimeromeError


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float
    lo: float   # bootstrap 95 % CI
    hi: float
    n: int

    def fmt(self, digits: int = 2) -> str:
        if self.n == 1:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def bootstrap_ci(x, n_resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap of the mean: the paper's protocol (n_resamples samples of x drawn with
    replacement, its rng.choice), the draws from a seeded torch.Generator as every draw in timerome."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        raise TimeromeError("bootstrap of an empty sample")
    rows = torch.randint(0, x.size, (n_resamples, x.size), generator=torch.Generator().manual_seed(seed))
    means = x[rows.numpy()].mean(axis=1)
    a = (1 - level) / 2
    return float(np.percentile(means, 100 * a)), float(np.percentile(means, 100 * (1 - a)))


def cell(x, n_resamples: int = 2000, seed: int = 0) -> Cell:
    x = np.asarray(x, dtype=np.float64)
    lo, hi = bootstrap_ci(x, n_resamples, seed=seed)
    std = float(x.std(ddof=1)) if x.size > 1 else math.nan  # one seed has no spread to report (JSON null)
    return Cell(float(x.mean()), std, lo, hi, int(x.size))


def paired_t(x, y) -> tuple[float, float]:
    """t = mean(d) / (sd(d)/sqrt(n)) on shared seeds, two-tailed p from Student's t."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise TimeromeError(f"paired t-test needs matched samples, got {x.shape} and {y.shape}")
    if x.size < 2:
        raise TimeromeError("paired t-test needs at least 2 shared seeds")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):  # a NaN p would read as EXACT (the same on every seed)
        raise TimeromeError("paired t-test needs finite values on every seed (leave out the seeds a metric is NaN on)")
    if np.allclose(x, y, rtol=1e-9, atol=1e-12):
        return 0.0, 1.0  # equal up to float rounding: no difference (not an "infinitely sure" one)
    d = x - y
    sd = d.std(ddof=1)
    if sd <= 1e-12 * np.abs(d).max():
        # the same difference on every seed (a metric the seed does not touch): there is no
        # spread to test against, so no p-value; stars() marks it EXACT instead of "***"
        return float(np.sign(d.mean()) * np.inf), float("nan")
    t = d.mean() / (sd / np.sqrt(d.size))
    from scipy import stats as sps  # here, not at import: scipy.stats costs seconds at every command's start

    return float(t), float(2 * sps.t.sf(abs(t), df=d.size - 1))


EXACT = "†"  # the same nonzero difference on every seed: deterministic, not tested


def stars(p: float) -> str:
    """The paper's markers: * p<0.05, ** p<0.01, *** p<1e-4; EXACT where no p-value exists."""
    if np.isnan(p):
        return EXACT
    return "***" if p < 1e-4 else "**" if p < 0.01 else "*" if p < 0.05 else ""

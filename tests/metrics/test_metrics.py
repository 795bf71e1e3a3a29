"""TOFU metrics and the statistical protocol on hand-built cases with known answers."""

import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

from timerome import TimeromeError
from timerome.evaluation.stats import bootstrap_ci, cell, paired_t, stars
from timerome.metrics import (forget_quality, forget_truth_ratio, harmonic_mean, normalised_prob, retain_truth_ratio,
                              rouge_l_recall, truth_ratio)


def lp(prob_per_token, n_tokens):
    """log p of an answer whose every token has probability prob_per_token."""
    return n_tokens * math.log(prob_per_token)


def test_ks_p_of_identical_samples_is_one():
    x = np.random.default_rng(0).lognormal(size=40)
    assert forget_quality(x, x) == pytest.approx(1.0)
    assert forget_quality(x, x + 100.0) < 1e-6  # disjoint samples: certainly different


def test_truth_ratio_from_known_probabilities():
    # paraphrase: 0.5 per token over 4 tokens; perturbed: 0.25 (2 tokens) and 0.0625 (6 tokens)
    # per-token geometric mean of the perturbed = sqrt(0.25 * 0.0625) = 0.125 -> TR = 0.125 / 0.5
    tr = truth_ratio([lp(0.5, 4)], [4], [[lp(0.25, 2), lp(0.0625, 6)]], [[2, 6]])
    assert tr == pytest.approx([0.25], rel=1e-6)
    assert forget_truth_ratio(tr) == pytest.approx(0.25, rel=1e-6)   # min(TR, 1/TR)
    assert retain_truth_ratio(tr) == pytest.approx(0.75, rel=1e-6)   # max(0, 1 - TR)
    assert retain_truth_ratio([2.0]) == 0.0
    assert forget_truth_ratio([4.0]) == pytest.approx(0.25, rel=1e-6)


def test_truth_ratio_accepts_items_with_different_numbers_of_perturbed_answers():
    tr = truth_ratio([lp(0.5, 2), lp(0.2, 3)], [2, 3],
                     [[lp(0.5, 2)], [lp(0.1, 1), lp(0.4, 1), lp(0.2, 5)]], [[2], [1, 1, 5]])
    assert tr == pytest.approx([1.0, (0.1 * 0.4 * 0.2) ** (1 / 3) / 0.2], rel=1e-6)


def test_normalised_probability():
    # per-token probabilities: true 0.5, perturbed 0.25 and 0.25 -> 0.5 / (0.5 + 0.5)
    p = normalised_prob([lp(0.5, 3)], [3], [[lp(0.25, 2), lp(0.25, 4)]], [[2, 4]])
    assert p == pytest.approx([0.5], rel=1e-6)


def test_bootstrap_ci_covers_the_mean_95_percent_of_the_time():
    # percentile bootstrap of a normal sample of 30: coverage close to the nominal 95 %
    hits = 0
    trials = 400
    for s in range(trials):
        x = np.random.default_rng(1000 + s).normal(3.0, 2.0, size=30)
        lo, hi = bootstrap_ci(x, seed=s)
        hits += lo <= 3.0 <= hi
    assert 0.90 <= hits / trials <= 0.98, hits / trials


def test_bootstrap_is_seeded_and_brackets_the_mean():
    x = [1.0, 2.0, 4.0, 8.0]
    assert bootstrap_ci(x, seed=3) == bootstrap_ci(x, seed=3)
    lo, hi = bootstrap_ci(x)
    assert lo <= np.mean(x) <= hi
    c = cell(x)
    assert (c.mean, c.n) == (3.75, 4) and c.std == pytest.approx(np.std(x, ddof=1))
    assert math.isnan(cell([2.0]).std)  # undefined with one value: null in JSON, never a spread of 0
    with pytest.raises(TimeromeError):
        bootstrap_ci([])


def test_bootstrap_draws_from_a_seeded_torch_generator():
    """The resamples are drawn by torch.Generator(seed) (as every draw in timerome), the interval the
    2.5th and 97.5th percentiles of their means; numpy's random state plays no part."""
    x = np.array([0.5, -1.0, 2.0, 7.0, 3.0])
    rows = torch.randint(0, 5, (2000, 5), generator=torch.Generator().manual_seed(11)).numpy()
    means = x[rows].mean(axis=1)
    np.random.seed(0)
    got = bootstrap_ci(x, seed=11)
    np.random.seed(1)
    assert got == bootstrap_ci(x, seed=11) == (np.percentile(means, 2.5), np.percentile(means, 97.5))
    assert bootstrap_ci(x, seed=12) != got


def test_paired_t_matches_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=7)
    y = x + rng.normal(0.5, 1.0, size=7)
    t, p = paired_t(x, y)
    ref = sps.ttest_rel(x, y)
    assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)


def test_paired_t_edge_cases():
    assert paired_t([1.0, 2.0], [1.0, 2.0]) == (0.0, 1.0)     # no difference at all
    t, p = paired_t([2.0, 3.0], [1.0, 2.0])                    # a constant, exact difference
    assert t == math.inf and math.isnan(p) and stars(p) == "†"  # no spread: no test, not "***"
    with pytest.raises(TimeromeError):
        paired_t([1.0, 2.0], [1.0])
    with pytest.raises(TimeromeError):
        paired_t([1.0], [2.0])


@pytest.mark.parametrize("p, expected", [(0.2, ""), (0.05, ""), (0.0499, "*"), (0.01, "*"),
                                         (0.0099, "**"), (1e-4, "**"), (9.9e-5, "***"), (0.0, "***")])
def test_stars_follow_the_paper(p, expected):
    assert stars(p) == expected


def test_harmonic_mean():
    assert harmonic_mean([1.0, 2.0, 4.0]) == pytest.approx(3 / (1 + 1 / 2 + 1 / 4))
    assert harmonic_mean([0.3, 0.6, 0.9]) == pytest.approx(sps.hmean([0.3, 0.6, 0.9]))
    assert harmonic_mean([0.5, 0.0]) == 0.0   # TOFU: one zero term zeroes model utility


def test_rouge_l_recall():
    r = rouge_l_recall(["the cat sat", "the cat sat on the mat", "dogs"],
                       ["the cat sat on the mat", "the cat sat on the mat", "cats"])
    assert r[0] == pytest.approx(0.5)  # LCS 3 of the reference's 6 words
    assert r[1] == pytest.approx(1.0)
    assert r[2] == pytest.approx(0.0)
    # stemming: "writes" and "writing" share a stem
    assert rouge_l_recall(["she writing books"], ["she writes books"])[0] == pytest.approx(1.0)


def test_model_utility_is_tofus_nine_terms_and_names_what_it_lacks():
    from timerome.metrics.tofu import model_utility, utility_note

    full = {"retain": {"prob": [0.5], "rouge": [0.5], "tr": [0.5]},
            "real_authors": {"prob": [0.9], "norm_prob": [0.5], "rouge": [0.5], "tr": [0.5]},
            "world_facts": {"prob": [0.9], "norm_prob": [0.5], "rouge": [0.5], "tr": [0.5]}}
    # retain_truth_ratio(0.5) = max(0, 1 - 0.5) = 0.5: nine terms of 0.5, RA / WF's per-token prob unread
    assert model_utility(full) == pytest.approx(0.5) and utility_note(full) is None
    # without perturbed answers RA / WF have no normalised prob: their per-token one (0.9, another
    # quantity) does not stand in for it; the note names the term (stop 62's metrics audit)
    partial = {"retain": full["retain"], "real_authors": {"prob": [0.9], "rouge": [0.5]}}
    assert model_utility(partial) == pytest.approx(0.5)
    note = utility_note(partial)
    assert "real_authors prob" in note and "real_authors truth ratio" in note and "4 of TOFU's 9" in note


def test_a_paired_t_over_a_nan_is_refused_not_marked_exact():
    """paired_t([1, nan, 3], ...) gave p = NaN, which stars() reads as "the same difference on every
    seed" (†), a claim about data that has a hole (stop 62's metrics audit)."""
    with pytest.raises(TimeromeError, match="finite values on every seed"):
        paired_t([1.0, float("nan"), 3.0], [0.5, 1.0, 2.0])
    with pytest.raises(TimeromeError, match="finite values"):
        paired_t([1.0, 2.0], [float("inf"), 1.0])

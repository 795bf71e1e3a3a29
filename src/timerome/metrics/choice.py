"""Multiple choice by likelihood: every choice scored as the answer to the same prompt (nats), the
most likely one is the model's pick.

Raw: the choice with the largest log p(choice | prompt). Length-normalised: the largest per-token
log-probability, log p / number of tokens (lm-eval's acc_norm divides by characters; per token is
the MDLM likelihood's own unit). `picks` breaks ties to the first choice, as numpy's argmax (and
lm-eval) do; `correct` does not: an item whose best score k choices share is 1/k correct when its
answer is one of them, the expectation of a fair tie-break. Scored the first way, a model that
gives every choice the same score (words its vocabulary does not have, all one unknown token) read
as always right where the answer is listed first (WHP's true answer: 1.0) and as the share of
answers that are A otherwise; scored this way it reads chance. Where no item ties, the accuracy is
lm-eval's argmax accuracy.
"""

from __future__ import annotations

import numpy as np

from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.metrics.text import pair_logprobs


def choice_logprobs(backbone, prompts: list[str], choices: list[list[str]], *, n_mc: int = LIKELIHOOD.n_mc,
                    seed: int = 0, progress: bool = False) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """(log p of each choice [C_i] per item, token counts [C_i] per item, whether any of the item's
    prompts was cut to fit the context [items]); progress: a bar over the pairs."""
    if len(prompts) != len(choices):
        raise TimeromeError(f"got {len(prompts)} prompts but {len(choices)} choice lists")
    flat_p = [p for p, cs in zip(prompts, choices) for _ in cs]
    flat_c = [c for cs in choices for c in cs]
    res = pair_logprobs(backbone, flat_p, flat_c, n_mc=n_mc, seed=seed, progress=progress)
    lp, ln, cut, at = [], [], [], 0
    for cs in choices:
        lp.append(res["lp"][at:at + len(cs)])
        ln.append(res["len"][at:at + len(cs)])
        cut.append(bool(res["was_cut"][at:at + len(cs)].any()))
        at += len(cs)
    return lp, ln, np.array(cut, dtype=bool)


def _scores(lp, n_tokens, normalise: bool) -> list[np.ndarray]:
    """Each item's choice scores: log p, or per token."""
    return [np.asarray(l, dtype=np.float64) / (np.asarray(n, dtype=np.float64) if normalise else 1.0)
            for l, n in zip(lp, n_tokens)]


def picks(lp, n_tokens, normalise: bool = False) -> np.ndarray:
    """The index of the most likely choice per item."""
    return np.array([int(np.argmax(s)) for s in _scores(lp, n_tokens, normalise)], dtype=np.int64)


def correct(lp, n_tokens, answers, normalise: bool = False) -> np.ndarray:
    """How correct each item's pick is: 1 or 0, or 1/k where its best score is shared by k choices and
    its answer is one of them (module docstring) -> float per item."""
    answers = np.asarray(answers, dtype=np.int64)
    for i, (l, a) in enumerate(zip(lp, answers)):
        if not 0 <= a < len(l):
            raise TimeromeError(f"item {i}: choice index {a} out of range ({len(l)} choices)")
    scores = _scores(lp, n_tokens, normalise)
    broken = [i for i, s in enumerate(scores) if not np.isfinite(s).all()]
    if broken:  # no choice equals a NaN maximum: the item would be 0/0, and the accuracy NaN
        raise TimeromeError(f"items {', '.join(map(str, broken[:5]))} have a choice whose log-probability is not "
                            "finite: no pick can be read (a broken model or edit?)")
    best = [score == score.max() for score in scores]
    return np.array([b[a] / b.sum() for b, a in zip(best, answers)], dtype=np.float64)

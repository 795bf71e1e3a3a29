"""TOFU metrics from the MDLM likelihood (nats), following open-unlearning's definitions.

ForgetLP / RetainLP / RealAuth / WorldFact: mean over items of log p(answer | question), the
sum over answer tokens (the paper's columns; `likelihood.answer_logprobs`). Truth ratio and
forget quality use the length-normalised NLL, as TOFU does.
"""

from __future__ import annotations

import numpy as np

from timerome.errors import TimeromeError
from timerome.metrics.columns import column
from timerome.metrics.text import rouge_l

# ------------------------------------------------------------------------------ TOFU aggregates


def _ragged(x) -> list[np.ndarray]:
    """[N, P] array or a list of N 1-D arrays (items may have different numbers of answers)."""
    return [np.asarray(row, dtype=np.float64).reshape(-1) for row in x]


def truth_ratio(para_lp, para_len, pert_lp, pert_len) -> np.ndarray:
    """TR = exp(-mean_i nll_norm(perturbed_i)) / exp(-nll_norm(paraphrased)), per item.

    para_*: [N]; pert_*: [N, P] or N arrays (ragged). The mean over perturbed answers is taken on
    normalised NLLs (a geometric mean of their per-token probabilities), as TOFU does. The 1e-10
    in the denominator is open-unlearning's, kept so numbers match theirs; it only matters once the
    paraphrase's per-token NLL passes ~20 nats, where TR saturates instead of growing.
    """
    para_nll = -np.asarray(para_lp, dtype=np.float64) / np.asarray(para_len, dtype=np.float64)
    pert_nll = np.array([np.mean(-lp / ln) for lp, ln in zip(_ragged(pert_lp), _ragged(pert_len))])
    return np.exp(-pert_nll) / (np.exp(-para_nll) + 1e-10)


def forget_truth_ratio(tr) -> float:
    tr = np.asarray(tr, dtype=np.float64)
    return float(np.mean(np.minimum(tr, 1.0 / (tr + 1e-10))))


def retain_truth_ratio(tr) -> float:
    return float(np.mean(np.maximum(0.0, 1.0 - np.asarray(tr))))


def forget_quality(tr_edited, tr_reference) -> float:
    """KS-test p-value between the edited model's and a never-saw-it model's truth ratios."""
    a, b = np.asarray(tr_edited), np.asarray(tr_reference)
    if a.size == 0 or b.size == 0:
        raise TimeromeError("forget quality needs truth ratios from both models")
    from scipy.stats import ks_2samp  # here, not at import: scipy.stats costs seconds at every command's start

    return float(ks_2samp(a, b).pvalue)


def normalised_prob(true_lp, true_len, pert_lp, pert_len) -> np.ndarray:
    """Real-authors / world-facts probability: p_true / (p_true + sum p_perturbed), per-token probs.

    pert_*: [N, P] or N arrays (ragged).
    """
    p_true = np.exp(np.asarray(true_lp, dtype=np.float64) / np.asarray(true_len, dtype=np.float64))
    p_pert = np.array([np.exp(lp / ln).sum() for lp, ln in zip(_ragged(pert_lp), _ragged(pert_len))])
    return p_true / (p_true + p_pert + 1e-10)


def rouge_l_recall(predictions: list[str], references: list[str]) -> np.ndarray:
    """TOFU's ROUGE-L: the recall of the reference, with Porter stemming (open-unlearning's)."""
    return rouge_l(predictions, references, stat="recall", stemmer=True)


def harmonic_mean(values) -> float:
    v = np.asarray(values, dtype=np.float64)
    if np.any(v <= 0):
        return 0.0
    return float(v.size / np.sum(1.0 / v))


# ------------------------------------------------------------------------------ the paper's columns

UTILITY_SPLITS = ("retain", "real_authors", "world_facts")
NAN = float("nan")


UTILITY_TERMS = (("prob", "prob"), ("ROUGE", "rouge"), ("truth ratio", "tr"))  # (name, items key) per split


def utility_key(split: str, key: str) -> str:
    """The items key of a utility term on `split`: TOFU's prob is the per-token probability on retain
    and the normalised one (true against perturbed answers) on real authors and world facts."""
    return "norm_prob" if key == "prob" and split != "retain" else key


def utility_missing(items: dict[str, dict]) -> list[str]:
    """TOFU's nine model-utility terms (UTILITY_TERMS on each of UTILITY_SPLITS) that `items` lacks, as
    "split ROUGE" etc.: `model_utility` is the harmonic mean of the others."""
    return [f"{split} {term}" for split in UTILITY_SPLITS for term, key in UTILITY_TERMS
            if utility_key(split, key) not in (items.get(split) or {})]


def utility_note(items: dict[str, dict]) -> str | None:
    """What a model utility of `items` made of some but not all of TOFU's terms lacks, in words; None
    when it has them all, or none (then it is NaN, explained where NaNs are)."""
    missing, terms = utility_missing(items), len(UTILITY_SPLITS) * len(UTILITY_TERMS)
    if not missing or len(missing) == terms:
        return None
    return (f"the harmonic mean of {terms - len(missing)} of TOFU's {terms} terms, without {', '.join(missing)}: "
            "not comparable with a full model utility")


def model_utility(items: dict[str, dict]) -> float:
    """TOFU model utility: harmonic mean of prob, ROUGE-L recall and truth ratio on retain, RA, WF.

    Retain's prob is the per-token probability of the answer; RA / WF use the normalised one
    (true against perturbed: `utility_key`). Terms missing from `items` (ROUGE switched off, no
    perturbed answers) are left out, and `utility_note` names them; RA / WF's per-token probability
    never stands in for their normalised one (another quantity, on another scale).
    """
    vals = []
    for split in UTILITY_SPLITS:
        it = items.get(split) or {}
        for _, key in UTILITY_TERMS:
            v = it.get(utility_key(split, key))
            if v is not None:
                vals.append(retain_truth_ratio(v) if key == "tr" else float(np.mean(v)))
    return harmonic_mean(vals) if vals else NAN


def _mean_lp(split: str):
    return lambda items, ref: float(np.mean(items[split]["lp"])) if split in items else NAN


def _mean_rouge(split: str):  # absent (not NaN) when generation was switched off
    return lambda items, ref: float(np.mean(items[split]["rouge"])) if "rouge" in items.get(split, {}) else None


def _tr(split: str, aggregate):
    return lambda items, ref: aggregate(items[split]["tr"]) if "tr" in items.get(split, {}) else NAN


def _forget_quality(items, ref) -> float:
    f = items.get("forget", {})
    return forget_quality(f["tr"], ref) if "tr" in f and ref is not None and len(ref) else NAN


# declared in the order evaluation.evaluate reports them
FORGET_LP = column("ForgetLP", header="ForgetLP ↓", split="forget", family="lp", compute=_mean_lp("forget"),
                   about="mean log p(answer | question) on the forget set, nats")
RETAIN_LP = column("RetainLP", split="retain", family="lp", compute=_mean_lp("retain"), about="the same on retain rows")
REAL_AUTH = column("RealAuth", split="real_authors", family="lp", compute=_mean_lp("real_authors"),
                   about="the same on real authors")
WORLD_FACT = column("WorldFact", split="world_facts", family="lp", compute=_mean_lp("world_facts"),
                    about="the same on world facts")
column("ForgetTR", digits=3, compute=_tr("forget", forget_truth_ratio), about="forget truth ratio (closer-to-1 aggregate)")
column("RetainTR", digits=3, compute=_tr("retain", retain_truth_ratio), about="retain truth ratio (true-better aggregate)")
column("ForgetQuality", header="KS p ↑", digits=3, compute=_forget_quality,
       about="KS p-value of forget truth ratios vs the reference model")
column("ForgetROUGE", header="fROUGE", compute=_mean_rouge("forget"), about="ROUGE-L recall of greedy answers, forget set")
column("RetainROUGE", header="rROUGE", compute=_mean_rouge("retain"), about="ROUGE-L recall of greedy answers, retain rows")
column("RAROUGE", compute=_mean_rouge("real_authors"), about="ROUGE-L recall of greedy answers, real authors")
column("WFROUGE", compute=_mean_rouge("world_facts"), about="ROUGE-L recall of greedy answers, world facts")
column("ModelUtility", header="Utility", digits=3, compute=lambda items, ref: model_utility(items),
       about="harmonic mean of prob, ROUGE and TR on retain, RA, WF")
# the answer log-probability read along the greedy denoising trajectory (evaluation.trajectory_logprobs; the
# `traj` measurement computes them)
column("ForgetTrajLP", split="forget", family="traj", about="forget log p along the trajectory")
column("RetainTrajLP", split="retain", family="traj", about="retain log p along the trajectory")
column("RealAuthTrajLP", split="real_authors", family="traj", about="real-author log p along the trajectory")

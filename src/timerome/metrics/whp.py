"""WHP ("Who's Harry Potter", Eldan & Russinovich 2023) metrics that run offline.

WHP_LP          log p(true answer | question) on the HP trivia, the question as written (nats;
                the paper's "WHP-logp" column).
WHP_Acc         two-choice accuracy: the true answer is more likely than the false one (raw
                log-likelihood); WHP_AccNorm per token (choice.py).
WHP_Familiarity the original asks GPT-4 to grade how much a completion of each prompt knows
                Harry Potter; no judge is available offline, so the score is the share of the
                prompt's reference words ("Ron", "Hermione", "wand", ...) that occur in its greedy
                completion (case-insensitive, whole words), averaged over prompts.
"""

from __future__ import annotations

import numpy as np

from timerome.data.facts import has_words
from timerome.engine.sampler import continuations
from timerome.engine.settings import LIKELIHOOD
from timerome.metrics.choice import choice_logprobs, correct

COLUMNS = ["WHP_LP", "WHP_Acc", "WHP_AccNorm", "WHP_Familiarity"]
COMPLETION_TOKENS = 32


def trivia(backbone, rows: list[dict], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0, progress: bool = False) -> dict:
    """Per question: lp of the true answer, lp of the false one, and whether the true one wins."""
    lp, ln, cut = choice_logprobs(backbone, [r["question"] for r in rows],
                             [[r["true_answer"], r["false_answer"]] for r in rows], n_mc=n_mc, seed=seed,
                             progress=progress)
    zeros = [0] * len(rows)
    return {"lp": [float(x[0]) for x in lp], "false_lp": [float(x[1]) for x in lp],
            "correct": correct(lp, ln, zeros).tolist(), "correct_norm": correct(lp, ln, zeros, normalise=True).tolist(),
            "lp_cut": int(cut.sum())}


def reference_share(text: str, references: list[str]) -> float:
    """Share of the reference words found in `text` (case-insensitive, whole words); NaN without any
    (no words to find says nothing of familiarity: 0 would read as "unfamiliar")."""
    if not references:
        return float("nan")
    found = [has_words(text, w, ignore_case=True) for w in references]
    return float(np.mean(found))


def familiarity(backbone, rows: list[dict], *, gen_length: int = COMPLETION_TOKENS, seed: int = 0,
                progress: bool = False) -> dict:
    """Per prompt: its greedy completion and the share of its reference words the completion uses."""
    gen = continuations(backbone, [r["prompt"] for r in rows], gen_length=gen_length, seed=seed, progress=progress)
    share = [reference_share(t, r["references"]) for t, r in zip(gen["texts"], rows)]
    return {"generations": gen["texts"], "share": share, "gen_length": gen["gen_length"], "prompts_cut": gen["cut"]}


def summary(items: dict) -> dict:
    out = {}
    t = items.get("trivia")
    if t:
        out.update(WHP_LP=float(np.mean(t["lp"])), WHP_Acc=float(np.mean(t["correct"])),
                   WHP_AccNorm=float(np.mean(t["correct_norm"])))
    f = items.get("familiarity")
    if f:
        out["WHP_Familiarity"] = float(np.mean(f["share"]))
    return out

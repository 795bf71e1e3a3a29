"""Robustness of forgetting (the paper's robustness panel): does the forget log-probability stay
down when the probe is rephrased, or when the answer is shown in context first?

Conditions, each a log-likelihood in nats per forget row (TOFU perturbed schema):
    original              log p(answer | question)
    paraphrased_question  log p(answer | paraphrased_question)
    paraphrased_answer    log p(paraphrased_answer | question)
    relearn               log p(answer | RELEARN), the in-context relearning attack: the forget
                          question and answer shown once, then the question asked again
A condition is the change from the unedited model, per row (edited - unedited; negative = the
edit lowers it), and `weakening` = change(condition) - change(original), on the rows the
condition has: how many nats of the edit's effect the condition takes back (the paper: within 2
nats under paraphrase, ~8 under in-context relearning).

Any method can be scored: `condition_logprobs(backbone, rows, edit)` runs with `edit.active()`
(None: the model as it is), so measure the unedited model first (before installing a
weight-changing method, or with edit=None for an inference-time one), the edited one after, and
pass both to `robustness`. `robustness_panel` does both for an inference-time edit. Rows lacking
a paraphrase are left out of that condition and counted in `missing`. All conditions draw their
Monte-Carlo masks from the same seed, so two models measured with one seed are paired.
"""

from __future__ import annotations

import numpy as np

from timerome.engine.hooks import check_stepless, edit_active
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.metrics.text import pair_logprobs

RELEARN = "{question} {answer}\n{question}"
CONDITIONS = ("original", "paraphrased_question", "paraphrased_answer", "relearn")
RELEARN_WANT = 'a template naming {question} and {answer} and nothing else (as "{question} {answer}\\n{question}")'


def relearn_ok(template) -> bool:
    """Whether `template` is a relearning prompt `probes` can fill: a str.format template whose only
    fields are {question} and {answer}, both present (without the answer it measures no relearning)."""
    import string

    if not isinstance(template, str):
        return False
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError:  # an unmatched brace
        return False
    return names == {"question", "answer"}


def probes(rows: list[dict], relearn: str = RELEARN) -> dict[str, dict]:
    """Per condition: {"index": rows used, "prompts", "answers"}; a row lacking a field is left out."""
    def has(r, k):
        return isinstance(r.get(k), str) and r[k].strip()

    if not relearn_ok(relearn):
        raise TimeromeError(f"relearn must be {RELEARN_WANT}, got {relearn!r}")
    out = {c: {"index": [], "prompts": [], "answers": []} for c in CONDITIONS}
    for i, r in enumerate(rows):
        if not (has(r, "question") and has(r, "answer")):
            raise TimeromeError(f"forget row {i} lacks its question or answer")
        cases = {"original": (r["question"], r["answer"]),
                 "relearn": (relearn.format(question=r["question"], answer=r["answer"]), r["answer"])}
        if has(r, "paraphrased_question"):
            cases["paraphrased_question"] = (r["paraphrased_question"], r["answer"])
        if has(r, "paraphrased_answer"):
            cases["paraphrased_answer"] = (r["question"], r["paraphrased_answer"])
        for c, (p, a) in cases.items():
            out[c]["index"].append(i)
            out[c]["prompts"].append(p)
            out[c]["answers"].append(a)
    return out


def condition_logprobs(backbone, rows: list[dict], edit=None, *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0,
                       relearn: str = RELEARN) -> dict:
    """{condition: {"index": row indices, "lp": nats}} with `edit` active (None: as the model is), "missing"
    ({condition: rows lacking it}) and "cut" ({condition: prompts that lost their oldest tokens to fit the
    model's context: a cut relearn prompt shows less of the answer it repeats})."""
    check_stepless(edit, "condition_logprobs", backbone)
    out, cut = {}, {}
    with edit_active(edit, backbone):
        for c, p in probes(rows, relearn).items():
            scored = pair_logprobs(backbone, p["prompts"], p["answers"], n_mc=n_mc, seed=seed) if p["index"] else {}
            out[c] = {"index": p["index"], "lp": [float(x) for x in scored.get("lp", [])]}
            cut[c] = int(scored.get("cut", 0))
    out["missing"] = {c: len(rows) - len(out[c]["index"]) for c in CONDITIONS}
    out["cut"] = cut
    return out


def robustness(unedited: dict, edited: dict) -> dict:
    """{condition: {"change", "original", "weakening"}} from two `condition_logprobs` results on the
    same rows. change: the mean over the condition's rows of edited - unedited; original: the mean
    change of the original probe on those same rows; weakening = change - original, row by row.
    A condition some rows lack (no paraphrase) is compared with the original on its own rows only:
    the mean change over all rows, less one over a subset, would report a weakening of rows that
    were never probed."""
    per_row = {}
    for c in CONDITIONS:
        u = dict(zip(unedited[c]["index"], unedited[c]["lp"]))
        e = dict(zip(edited[c]["index"], edited[c]["lp"]))
        per_row[c] = {i: e[i] - u[i] for i in sorted(set(u) & set(e))}
    out = {}
    for c in CONDITIONS:
        rows = [i for i in per_row[c] if i in per_row["original"]]
        change = float(np.mean(list(per_row[c].values()))) if per_row[c] else float("nan")
        original = float(np.mean([per_row["original"][i] for i in rows])) if rows else float("nan")
        weakening = float(np.mean([per_row[c][i] - per_row["original"][i] for i in rows])) if rows else float("nan")
        out[c] = {"change": change, "original": original, "weakening": weakening}
    return out


def robustness_panel(backbone, rows: list[dict], edit, *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0,
                     relearn: str = RELEARN) -> dict:
    """Unedited, edited and their comparison, for an inference-time edit (hooks: the model's
    weights are the unedited model outside `edit.active()`)."""
    before = condition_logprobs(backbone, rows, None, n_mc=n_mc, seed=seed, relearn=relearn)
    after = condition_logprobs(backbone, rows, edit, n_mc=n_mc, seed=seed, relearn=relearn)
    return {"unedited": before, "edited": after, "robustness": robustness(before, after)}

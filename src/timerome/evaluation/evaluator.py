"""TOFU-style evaluation of an (edited) MDLM: per-item log-likelihoods and the paper's columns.

    rows = eval_rows("embedded")                     # forget / retain / real_authors / world_facts
    ref = reference_truth_ratios(reference_model(), rows["forget"], n_mc=LIKELIHOOD.n_mc, seed=0)
    result = evaluate(backbone, rows, n_mc=LIKELIHOOD.n_mc, seed=0, reference_tr=ref, edit=edit)
    result["metrics"]["ForgetLP"], result["items"]["forget"]["lp"]

Columns (metrics.py has the formulas):
    ForgetLP / RetainLP / RealAuth / WorldFact   mean log p(answer | question), nats (MC, n_mc rows)
    ForgetTR / RetainTR                          truth ratio aggregates (closer-to-1 / true-better)
    ForgetQuality                                KS p-value vs a model never trained on the forget set
    ForgetROUGE / RetainROUGE / ...              ROUGE-L recall of greedy generations
    ModelUtility                                 harmonic mean of {prob, ROUGE, TR} on retain, RA, WF
Every item's Monte-Carlo draws come from (seed, item index) only, so two models evaluated with
the same seed share their masks: differences between them are paired, not MC noise.

Generation for ROUGE: each answer gets as many mask tokens as its reference has, plus 4 for a model
with an end-of-text token (the embedded default ends its answers; the answer is cut there), one
token revealed per step; a model without one gets TOFU's length oracle (no slack).
`sampler={"cache": "dual", "threshold": 0.9}` (evaluate, score_split, generate_answers) switches
on the sampler's fast options (sampler.py); the default is the exact reference sampler.
"""

from __future__ import annotations

import numpy as np
import torch

from timerome import metrics as M
from timerome.backbones.backbone import model_arg
from timerome.common.checks import budget, integer, shown
from timerome.common.checks import seed as check_seed
from timerome.common.cost import measure
from timerome.common.progress import progress_bar
from timerome.data.benchmark import warn_unknown_rows
from timerome.data.rows import spread
from timerome.data.tofu import load_split
from timerome.engine.encoding import DEFAULT_TARGET, encode_pairs
from timerome.engine.hooks import TraceState, check_stepless, edit_active
from timerome.engine.sampler import generate, refuse_diffusion_options, until_special
from timerome.engine.settings import LIKELIHOOD, LOCALITY, TRACE
from timerome.errors import TimeromeError
from timerome.metrics.columns import computed, split_columns
from timerome.metrics.editing import GEN_SLACK, classify
from timerome.metrics.tofu import UTILITY_SPLITS, utility_note
from timerome.tracing.tie import run_trajectory

SPLIT_COLUMNS = split_columns("lp")  # {split: its log-probability column}, declared in metrics/tofu.py


# ------------------------------------------------------------------------------ data


def eval_rows(source="embedded", forget: str = "forget01", *, n_retain: int = LOCALITY.n_retain,
              n_world: int = LOCALITY.n_world, retain_rows=None) -> dict[str, list[dict]]:
    """Rows by split, with their paraphrased / perturbed answers.

    forget: every row of `forget`_perturbed. retain / real_authors / world_facts: n_retain /
    n_world rows spread evenly over the perturbed splits (deterministic: the same rows for every
    method and seed). retain_rows overrides the retain pool (e.g. a TOFU subset).
    """
    integer(n_retain, "n_retain", lo=1, none=True)  # None: every row (`spread`)
    integer(n_world, "n_world", lo=1, none=True)
    rows = {"forget": load_split(f"{forget}_perturbed", source)}
    pool = retain_rows if retain_rows is not None else load_split("retain_perturbed", source)
    rows["retain"] = spread(pool, n_retain)
    rows["real_authors"] = spread(load_split("real_authors_perturbed", source), n_world)
    rows["world_facts"] = spread(load_split("world_facts_perturbed", source), n_world)
    return rows


# ------------------------------------------------------------------------------ scoring


def _answers(row: dict) -> tuple[str, list[str]]:
    """(correct side, perturbed answers) of the truth ratio.

    TOFU: the paraphrased answer against perturbed answers written in the paraphrase's style
    (RA / WF have no paraphrase: the answer itself). When the perturbed answers are instead the
    *answer's own* template with another value (the embedded corpus: row["object"] swapped), the
    paraphrase would be compared with a template the model was trained on and every truth ratio
    would measure wording, not the fact; the answer is then the correct side, so both sides differ
    only in the value, as TOFU intends.
    """
    pert = list(row.get("perturbed_answer") or [])
    if pert and _same_template(row["answer"], row.get("object"), pert):
        return row["answer"], pert
    return row.get("paraphrased_answer") or row["answer"], pert


def _same_template(answer: str, obj, perturbed: list[str]) -> bool:
    if not obj or obj not in answer:
        return False
    head, _, tail = answer.partition(obj)
    return all(p.startswith(head) and p.endswith(tail) and p != answer for p in perturbed)


def fits(backbone, row: dict) -> bool:
    """Whether the question with every answer variant fits the model's context."""
    q = len(backbone.encode_prompt(row["question"]))
    para, pert = _answers(row)
    longest = max(len(backbone.encode(a)) for a in [row["answer"], para] + pert)
    return q + longest + 1 <= backbone.max_length


def score_split(backbone, rows: list[dict], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0, truth_ratio: bool = True,
                rouge: bool = True, progress: bool = False, sampler: dict | None = None) -> dict:
    """Per-item numbers of one split: lp, len, prob (and tr, para/pert terms, rouge)."""
    q = [r["question"] for r in rows]
    lp, ln = M.answer_logprobs(backbone, q, [r["answer"] for r in rows], n_mc=n_mc, seed=seed)
    out = {"lp": lp.tolist(), "len": ln.tolist(), "prob": np.exp(lp / ln).tolist()}
    has_pert = all(_answers(r)[1] for r in rows)
    if truth_ratio and has_pert and rows:
        # every variant in one batch; pair indices continue after the answers' so draws stay distinct
        para = [_answers(r)[0] for r in rows]
        pert = [_answers(r)[1] for r in rows]
        flat_q = q + [qi for qi, ps in zip(q, pert) for _ in ps]
        flat_a = para + [a for ps in pert for a in ps]
        vlp, vln = M.answer_logprobs(backbone, flat_q, flat_a, n_mc=n_mc, seed=seed + 7919)
        n = len(rows)
        pert_lp, pert_ln, at = [], [], n
        for ps in pert:
            pert_lp.append(vlp[at:at + len(ps)])
            pert_ln.append(vln[at:at + len(ps)])
            at += len(ps)
        tr = M.truth_ratio(vlp[:n], vln[:n], pert_lp, pert_ln)
        # RA / WF probability: the true answer against its perturbed ones, per-token probabilities
        norm = M.normalised_prob(lp, ln, pert_lp, pert_ln)
        out.update(tr=tr.tolist(), norm_prob=norm.tolist())
    if rouge and rows:
        preds = generate_answers(backbone, q, [r["answer"] for r in rows], seed=seed, progress=progress,
                                 **(sampler or {}))
        out["generations"] = preds
        out["rouge"] = M.rouge_l_recall(preds, [r["answer"] for r in rows]).tolist()
    return out


@torch.no_grad()
def generate_answers(backbone, questions: list[str], answers: list[str], *, seed: int = 0,
                     progress: bool = False, cache: str | None = None, threshold: float | None = None,
                     refresh_every: int | None = None, slack: int | None = None, ended: list | None = None) -> list[str]:
    """Greedy (temperature 0) answers, batched by shape, each with a budget of its reference answer's
    length plus `slack` tokens (default: 4 for a model with an end-of-text token, which it writes when
    its answer ends and where the answer is cut; 0 otherwise, TOFU's length oracle).

    One block per answer, one token per step; cache / threshold / refresh_every: the sampler's
    fast options (None: the exact reference sampler). With one block both caches hold the
    question's keys/values from the first step and recompute the answer at every step. An answer is cut at
    its first special token (end-of-text, padding, ...: `sampler.until_special`, as `generate` and the editing
    metrics cut). `ended`: a list that receives, per answer, whether it ended so inside its budget."""
    eos = getattr(backbone.tokenizer, "eos_token_id", None)
    slack = (GEN_SLACK if eos is not None else 0) if slack is None else int(slack)
    pairs = encode_pairs(backbone, [{"question": q, "answer": a} for q, a in zip(questions, answers)])
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (p, a) in enumerate(pairs):
        G = min(len(a) + slack, backbone.max_length - len(p))
        groups.setdefault((len(p), G), []).append(i)
    out, stop = [""] * len(pairs), [False] * len(pairs)
    with progress_bar("generating", total=len(groups), enabled=progress) as bar:
        for (_, G), idx in groups.items():
            prompt = torch.tensor([pairs[i][0] for i in idx], device=backbone.device)
            gen = torch.Generator(device=backbone.device).manual_seed(seed)
            x = generate(backbone, prompt, steps=G, gen_length=G, block_length=G, generator=gen, cache=cache,
                         threshold=threshold, refresh_every=refresh_every)
            for b, i in enumerate(idx):
                ids = x[b, prompt.shape[1]:].tolist()
                kept = until_special(backbone, ids)  # cut at its first special token, as generate and continuations cut
                stop[i] = len(kept) < len(ids)
                out[i] = backbone.decode(kept)
            bar.advance()
    if ended is not None:
        ended[:] = stop
    return out


def forget_outcomes(rows: dict[str, list[dict]], generations: list[str], target=DEFAULT_TARGET) -> list[str]:
    """metrics.editing.classify of each forget generation: should say `target` (one text, or one per forget
    row) instead of the row's object (its value where the row names one, else the whole answer; the words of
    the row's question give nothing back); another subject is one of the rows' own subjects (their `author`),
    when they name them."""
    known = list(dict.fromkeys(r["author"] for rs in rows.values() for r in rs if isinstance(r.get("author"), str)))
    targets = [target] * len(rows["forget"]) if isinstance(target, str) else list(target)
    return [classify(g, target=t, obj=r.get("object") or r["answer"], subject=r.get("author"),
                     known_subjects=known or None, question=r["question"])
            for r, g, t in zip(rows["forget"], generations, targets)]


def edit_targets(edit, forget_rows) -> list[str]:
    """What each forget row's answer should say under `edit`: the target of the memory's fact that asks the
    row's question, else the own target of the edited fact that asks it (`Edit.targets`: rome, memit,
    act_steer, ...: edits with no memory), else the memory's own target, else the method's `target` setting,
    else DEFAULT_TARGET."""
    memory = getattr(edit, "memory", None) or (edit if hasattr(edit, "facts") else None)
    config = getattr(edit, "config", None)
    default = (getattr(memory, "target", None) or (config.get("target") if isinstance(config, dict) else None)
               or DEFAULT_TARGET)
    own = getattr(edit, "targets", None)
    held = {**(own if isinstance(own, dict) else {}), **held_questions(memory)}
    return [held.get(r.get("question")) or default for r in forget_rows]


def summarise(items: dict[str, dict], reference_tr=None) -> dict:
    """The paper's columns from per-item numbers (NaN where a split or reference is missing): every
    registered column with a computation (metrics/columns.py; TOFU's in metrics/tofu.py, the unlearning
    rates in metrics/editing.py), in declaration order."""
    return computed(items, reference_tr)


# the splits the paper's columns read (any other split is scored into "items" only)
EVALUATED_SPLITS = ("forget", "retain", "real_authors", "world_facts")
# the options `sampler=` may set: generate_answers' own (the rest of its arguments are the evaluation's)
SAMPLER_OPTIONS = ("cache", "threshold", "refresh_every", "slack")


def evaluate(backbone, rows: dict[str, list[dict]], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0, reference_tr=None,
             edit=None, truth_ratio: bool = True, rouge: bool = True, progress: bool = False,
             sampler: dict | None = None, target: str | None = None) -> dict:
    """Score every split of `rows` on backbone (with `edit` active when given).

    sampler: options of the generations behind the ROUGE columns (generate_answers), e.g.
    {"cache": "dual", "threshold": 0.9}; None: the exact reference sampler. target: what an
    unlearnt forget answer should say (None: what the edit's memory says, `edit_targets`, else
    DEFAULT_TARGET); with rouge, each forget generation is classified as the
    target said (Refusal), the answer given back (Leak, also after the target), Gibberish, or
    another fact said (Confabulation: naming another subject of the rows when they name their
    subjects), metrics/editing.py's outcomes, and their rates are columns.

    Returns {"items": {split: per-item lists}, "metrics": {column: value}, "cost": {...}, "notes": {column:
    why it is NaN, or for a partial ModelUtility which terms it lacks}}, all JSON-able. ForgetQuality
    needs `reference_tr` (module docstring), else it is NaN and "notes" says so; "notes" also says when
    its KS test compared fewer reference values than forget rows, or fewer than 2 on a side, and when the
    edit's memory asks only some of the forget rows (`memory_rows_note`).
    """
    model_arg(backbone, "evaluate's backbone")
    if isinstance(rows, dict) and rows and not set(rows) & set(EVALUATED_SPLITS):
        raise TimeromeError(f"rows has no split the metrics read ({', '.join(map(repr, rows))}): name them "
                            f"{', '.join(map(repr, EVALUATED_SPLITS))}")
    check_evaluation(rows, n_mc=n_mc, seed=seed, truth_ratio=truth_ratio)
    empty = [k for k, v in rows.items() if k in EVALUATED_SPLITS and not len(v)] if isinstance(rows, dict) else []
    if empty:  # every column of it would be NaN (a mean of nothing)
        raise TimeromeError(f"the {', '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty: give rows, or "
                            "leave the split out")
    unknown = sorted(set(sampler or {}) - set(SAMPLER_OPTIONS)) if isinstance(sampler, dict) else None
    if sampler is not None and unknown != []:
        raise TimeromeError(f"sampler must be a dict of {', '.join(SAMPLER_OPTIONS)}, got "
                            + (f"the unknown option(s) {', '.join(map(repr, unknown))}" if unknown else shown(sampler)))
    if not rouge and any(v is not None for v in (sampler or {}).values()):
        raise TimeromeError(f"sampler options set how ROUGE's answers are generated; with rouge=False none is "
                            f"generated (got {shown(sampler)})")
    refuse_diffusion_options(backbone, **(sampler or {}))  # an autoregressive model: before any work
    if reference_tr is not None and (isinstance(reference_tr, (str, bytes, dict)) or not hasattr(reference_tr, "__len__")):
        raise TimeromeError(f"reference_tr must be the reference model's forget truth ratios (a list or tensor of "
                            f"numbers: evaluation.reference_truth_ratios), got {shown(reference_tr)}")
    if reference_tr is not None:
        try:
            ref = np.asarray(reference_tr, dtype=np.float64) if len(reference_tr) else np.zeros(0)
        except (TypeError, ValueError):
            ref = np.full((1, 1), np.nan)
        if ref.ndim != 1 or not len(ref) or not np.isfinite(ref).all():
            raise TimeromeError(f"reference_tr must be a non-empty list of finite truth ratios (the reference "
                                f"model's, evaluation.reference_truth_ratios), got {shown(reference_tr)}")
    if target is not None and (not isinstance(target, str) or not target.strip()):
        raise TimeromeError(f"target must be a non-empty text (what an unlearnt answer should say), got {shown(target)}")
    check_stepless(edit, "evaluate", backbone)  # every split's likelihoods would read the model unedited
    items = {}
    ctx = edit_active(edit, backbone)
    with measure(backbone) as cost, ctx, progress_bar("evaluating", total=len(rows), enabled=progress) as bar:
        warn_unknown_rows(backbone, rows)  # as the CLI says it; after the edit's refusals: never before an error
        for split, rs in rows.items():
            items[split] = score_split(backbone, rs, n_mc=n_mc, seed=seed, truth_ratio=truth_ratio,
                                       rouge=rouge, sampler=sampler)
            bar.advance(description=f"evaluated {split}")
    if "generations" in items.get("forget", {}):
        items["forget"]["outcome"] = forget_outcomes(rows, items["forget"]["generations"],
                                                     edit_targets(edit, rows["forget"]) if target is None else target)
    metrics = summarise(items, reference_tr)
    c = {"eval_seconds": cost["seconds"], "eval_peak_memory_mb": cost["peak_mb"]}
    if hasattr(edit, "cost"):  # a method's Edit; a memory passed as it is has no install cost to report
        c.update(edit.cost())
        c.update({k: v for k, v in (edit.info or {}).items() if k.endswith("seconds")})
    notes = missing_notes(metrics, items, reference_tr)
    unasked = memory_rows_note(edit, rows.get("forget") if isinstance(rows, dict) else None)
    if unasked:
        notes["ForgetLP"] = f"{notes['ForgetLP']}; {unasked}" if notes.get("ForgetLP") else unasked
    return {"items": items, "metrics": metrics, "cost": c, "notes": notes}


def held_questions(memory) -> dict:
    """{question: target} of a memory's facts (a fact's own target, else the memory's); facts known by id
    alone ask no question."""
    default = getattr(memory, "target", None)
    return {f.prompt: getattr(f, "target", None) or default
            for f in getattr(memory, "facts", None) or [] if getattr(f, "prompt", None)}


def memory_rows_note(edit, forget_rows) -> str | None:
    """The note of an edit whose memory's facts ask only some of the forget rows evaluated (its forget
    columns average over rows it never saw); None when they ask them all, or it holds no questions."""
    memory = getattr(edit, "memory", None) or (edit if hasattr(edit, "facts") else None)
    facts = list(getattr(memory, "facts", None) or [])
    held = held_questions(memory)
    if not held or not forget_rows:
        return None
    asked = sum(r["question"] in held for r in forget_rows)
    if asked == len(forget_rows):
        return None
    return (f"the edit's memory holds {len(facts)} facts; {asked} of the {len(forget_rows)} forget rows evaluated ask "
            "one of them, and the forget columns average over them all")


def answer_count(rows: dict, truth_ratio: bool = True) -> int:
    """How many answers an evaluation of `rows` scores (each n_mc times): every row's answer, and with
    truth ratios its paraphrase and its perturbed answers."""
    return sum(1 + (1 + len(r.get("perturbed_answer") or []) if truth_ratio else 0)
               for rs in rows.values() for r in rs if isinstance(r, dict))


def check_evaluation(rows: dict, *, n_mc, seed, truth_ratio: bool = True, what: str = "evaluating") -> None:
    """rows, n_mc and seed checked, and the likelihood forwards of an evaluation of `rows` within the budget
    (n_mc per answer: the answer, and with truth ratios its paraphrase and perturbed answers)."""
    if not isinstance(rows, dict):
        raise TimeromeError(f"rows must be {{split: [row, ...]}} (e.g. {{'forget': rows}}), got a "
                            f"{type(rows).__name__}")
    if not rows:
        raise TimeromeError("nothing to evaluate: rows has no splits")
    for split, rs in rows.items():
        if not isinstance(rs, (list, tuple)):  # an empty one is scored as none (its columns NaN, with a note)
            raise TimeromeError(f"rows[{split!r}] must be a list of rows, got {shown(rs)}")
        for i, r in enumerate(rs):
            bad = [k for k in ("question", "answer") if not isinstance(r, dict) or not isinstance(r.get(k), str)]
            if bad:
                raise TimeromeError(f"rows[{split!r}][{i}] has no {' and no '.join(map(repr, bad))} text "
                                    f"(a row is a dict with 'question' and 'answer' strings)")
            blank = [k for k in ("question", "answer") if not r[k].strip()]
            if blank:  # as every rows file is refused (data.tofu.normalise_row): a blank one scores nothing asked
                raise TimeromeError(f"rows[{split!r}][{i}]: its {' and '.join(blank)} {'is' if len(blank) == 1 else 'are'}"
                                    " blank")
    integer(n_mc, "n_mc", lo=1)
    check_seed(seed, "seed")
    answers = answer_count(rows, truth_ratio)
    budget(f"{what} {sum(map(len, rows.values()))} rows with n_mc {n_mc}", n_mc * answers,
           f"n_mc x {answers} answers")


COLLAPSED = 1e-8  # a per-token answer probability below which a model has collapsed (its truth ratios read noise)


def missing_notes(metrics: dict, items: dict, reference_tr=None) -> dict[str, str]:
    """Why a column is NaN, in words (a NaN is never left unexplained), what a model utility made of
    fewer than TOFU's nine terms leaves out, and how few values a Forget Quality compared."""
    needs = {"ForgetLP": "forget", "RetainLP": "retain", "RealAuth": "real_authors", "WorldFact": "world_facts",
             "ForgetTR": "forget", "RetainTR": "retain"}
    notes = {}
    partial = utility_note(items)  # a number, but not TOFU's: which terms it lacks
    prob = np.asarray((items.get("retain") or {}).get("prob", []), dtype=float)
    for col, value in metrics.items():
        if col == "ModelUtility" and value == value and partial:
            notes[col] = partial
        if col == "RetainTR" and value == value and prob.size and (prob < COLLAPSED).mean() >= 0.5:
            notes[col] = (f"{int((prob < COLLAPSED).sum())} of {prob.size} retain answers have a per-token "
                          f"probability below {COLLAPSED:g}: the model has collapsed, and its truth ratios compare "
                          "vanishing probabilities (below 1e-10 the 1e-10 of open-unlearning's denominator decides "
                          "them), so this column means nothing here, however good it reads")
        if col == "ForgetQuality" and value == value and reference_tr is not None:
            few = few_compared(len((items.get("forget") or {}).get("tr", [])), len(reference_tr))
            if few:
                notes[col] = few
        if value == value:  # not NaN
            continue
        if col == "ModelUtility" and not set(UTILITY_SPLITS) & set(items):
            notes[col] = f"no {', '.join(map(repr, UTILITY_SPLITS))} split in the rows evaluated"
            continue
        if col == "ForgetQuality" and "tr" in items.get("forget", {}):
            notes[col] = ("needs the forget truth ratios of a reference model never trained on the forget set: "
                          "evaluate(..., reference_tr=reference_truth_ratios(REFERENCE, rows['forget'])) "
                          "(CLI: --reference DIR, or --reference auto for the embedded model, whose reference it "
                          "trains once and caches)")
        elif col in needs and needs[col] not in items:
            notes[col] = f"no {needs[col]!r} split in the rows evaluated"
        elif _nan_scores(items):
            notes[col] = (f"the model's own scores are NaN ({_nan_scores(items)}): its weights, or the edit "
                          "applied, make the forward NaN or infinite; check the model and the edit's strength")
        else:
            notes[col] = "the rows lack what it needs (perturbed answers for truth ratios, ROUGE switched off)"
    return notes


def few_compared(n_model: int, n_reference: int) -> str | None:
    """The note of a KS test of n_model forget truth ratios against n_reference values of the reference
    model, when the reference holds fewer than the forget rows or either side fewer than 2; else None."""
    if n_reference >= n_model and min(n_model, n_reference) >= 2:
        return None
    said = (f"the KS test compared the model's {n_model} forget truth ratio{'s' * (n_model != 1)} with "
            f"{n_reference} of the reference model's")
    if n_reference < n_model:
        return (f"{said}, fewer than the forget rows: give the reference model's truth ratios of the same forget "
                "rows (reference_truth_ratios(REFERENCE, rows['forget']))")
    return f"{said}: a p-value of fewer than 2 values on a side says little; evaluate more forget rows"


def _nan_scores(items: dict) -> str:
    """Which splits hold NaN log-likelihoods ('' when none): a NaN the rows cannot explain."""
    bad = [s for s, it in items.items() if isinstance(it, dict)
           and any(v != v for v in np.asarray(it.get("lp", []), dtype=float).ravel())]
    return ", ".join(f"{s} log-likelihoods" for s in bad)


def lp_only(backbone, rows: dict[str, list[dict]], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0, edit=None) -> dict[str, list[float]]:
    """Just log p(answer | question) per item and split (the cheap path of the sweeps)."""
    check_stepless(edit, "lp_only", backbone)
    ctx = edit_active(edit, backbone)
    with ctx:
        return {s: M.answer_logprobs(backbone, [r["question"] for r in rs], [r["answer"] for r in rs],
                                     n_mc=n_mc, seed=seed)[0].tolist() for s, rs in rows.items()}


@torch.no_grad()
def trajectory_logprobs(backbone, rows: list[dict], *, steps: int = TRACE.steps, edit=None) -> list[float]:
    """log p(answer | question) read along the greedy denoising trajectory (tracing's "decided"
    readout: each token scored by the forward that committed it), per row.

    Unlike the MC estimator this has denoising steps, so an edit restricted to one step k* acts
    exactly where the sampler would meet it (the all-steps vs one-step ablation).
    """
    pairs = encode_pairs(backbone, rows)
    state = TraceState()
    ctx = edit_active(edit, backbone)
    out = []
    with ctx as st:
        st = st if isinstance(st, TraceState) else state
        for p, a in pairs:
            logp, _ = run_trajectory(backbone, p, a, steps=min(steps, len(a)) if steps else len(a), state=st)
            out.append(float(logp[0, -1]))
    return out


def reference_truth_ratios(reference, rows: list[dict], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0) -> list[float]:
    """Forget truth ratios of the reference model (the other sample of the KS test): rows are forget rows,
    each with its question, answer and perturbed answers (eval_rows(source)['forget'])."""
    model_arg(reference, "reference_truth_ratios's reference")
    if not isinstance(rows, (list, tuple)) or not rows:
        raise TimeromeError(f"reference_truth_ratios's rows must be a non-empty list of forget rows (e.g. "
                            f"eval_rows(source)['forget']), got {shown(rows)}")
    for i, r in enumerate(rows):
        pert = r.get("perturbed_answer") if isinstance(r, dict) else None
        if not (isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("question", "answer"))
                and isinstance(pert, (list, tuple)) and pert and all(isinstance(p, str) for p in pert)):
            raise TimeromeError(f"reference_truth_ratios's rows[{i}] must be a row with 'question' and 'answer' "
                                f"strings and a non-empty 'perturbed_answer' list (what a truth ratio compares), "
                                f"got {shown(r)}")
    check_evaluation({"forget": list(rows)}, n_mc=n_mc, seed=seed, what="scoring the reference's truth ratios on")
    return score_split(reference, rows, n_mc=n_mc, seed=seed, rouge=False)["tr"]

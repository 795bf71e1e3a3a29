"""The benchmark measurements: one cell = one method installed on one benchmark's data, every
metric of that benchmark computed with the edit active, then undone (`runner.with_edit`).

    muse   knowmem (forget and retain QA), verbmem, privleak           metrics/muse.py
    whp    trivia log-probability and two-choice accuracy, familiarity metrics/whp.py
    wmdp   letter and choice-text accuracy                              metrics/wmdp.py
    rwku   every probe level, membership texts                          metrics/rwku.py

Options (Cell.options): n_mc; rouge (generation metrics; False = log-probabilities only);
knowmem_tokens, verbmem_tokens, completion_tokens, answer_tokens (generation lengths);
privleak, mia (membership metrics); mia_k, mia_groups (Min-K% share, masking groups);
privleak_reference (the retrained model's AUC, per corpus); choice_text (WMDP choice texts).
Every result carries what its data held (`data`: rows, skipped and repeated rows, layout, unknown
tokens) and the prompts or texts cut to fit the model's context (`data["cut"]`).
"""

from __future__ import annotations

import json
import time

from timerome.engine.settings import LIKELIHOOD
from timerome.errors import DiffusionOnly, TimeromeError
from timerome.experiments import bench_data as _data_kinds  # noqa: F401 - registers the benchmark data kinds
from timerome.experiments.runner import measurement, with_edit
from timerome.methods import method_config
from timerome.metrics import muse as MUSE
from timerome.metrics import rwku as RWKU
from timerome.metrics import whp as WHP
from timerome.metrics import wmdp as WMDP
from timerome.metrics.membership import DEFAULT_GROUPS, DEFAULT_K


def _mia(o) -> dict:
    return dict(k=o.get("mia_k", DEFAULT_K), groups=o.get("mia_groups", DEFAULT_GROUPS))


# ------------------------------------------------------------------------------ what each benchmark scores
# score(backbone, splits, info, options, seed, progress) -> items; the measurement cells and `timerome
# eval --bench` (bench_scores) share them, so a saved memory and an installed method read the same numbers.

def _muse(bb, s, info, o, seed, progress) -> dict:
    n_mc, rouge = o.get("n_mc", LIKELIHOOD.n_mc), o.get("rouge", True)
    reference = (o.get("privleak_reference") or {}).get(info.get("corpus", "books"))
    items = {}
    for part in ("forget", "retain"):
        items[f"knowmem_{part}"] = MUSE.knowmem(bb, s[f"knowmem_{part}"], s[f"knowmem_{part}_icl"], n_mc=n_mc,
                                                seed=seed, rouge=rouge, progress=progress,
                                                gen_length=o.get("knowmem_tokens", MUSE.KNOWMEM_TOKENS))
    items["verbmem"] = MUSE.verbmem(bb, s["verbmem"], n_mc=n_mc, seed=seed, rouge=rouge, progress=progress,
                                    gen_length=o.get("verbmem_tokens", MUSE.VERBMEM_TOKENS))
    if "privleak_forget" in s:
        items["privleak"] = MUSE.privacy_leak(bb, [r["text"] for r in s["privleak_forget"]],
                                              [r["text"] for r in s["privleak_holdout"]], seed=seed,
                                              reference_auc=reference, progress=progress, **_mia(o))
    return items


def _whp(bb, s, info, o, seed, progress) -> dict:
    items = {"trivia": WHP.trivia(bb, s["trivia"], n_mc=o.get("n_mc", LIKELIHOOD.n_mc), seed=seed, progress=progress)}
    if o.get("rouge", True):
        items["familiarity"] = WHP.familiarity(bb, s["completions"], seed=seed, progress=progress,
                                               gen_length=o.get("completion_tokens", WHP.COMPLETION_TOKENS))
    return items


def _wmdp(bb, s, info, o, seed, progress) -> dict:
    subject = info.get("subject")
    return {"wmdp": WMDP.score(bb, s["wmdp"], subject=None if subject == "mixed" else subject,
                               n_mc=o.get("n_mc", LIKELIHOOD.n_mc), seed=seed, choice_text=o.get("choice_text", True),
                               progress=progress)}


def _rwku(bb, s, info, o, seed, progress) -> dict:
    items = {p: RWKU.probes(bb, s[p], n_mc=o.get("n_mc", LIKELIHOOD.n_mc), seed=seed, rouge=o.get("rouge", True),
                            gen_length=o.get("answer_tokens", RWKU.ANSWER_TOKENS), progress=progress)
             for p in RWKU.LEVELS}
    if "forget_mia" in s:
        items["mia"] = RWKU.membership(bb, [r["text"] for r in s["forget_mia"]], [r["text"] for r in s["retain_mia"]],
                                       seed=seed, progress=progress, **_mia(o))
    return items


CUT = {"lp_cut": "scored pairs", "prompts_cut": "generation prompts", "cut": "texts"}  # item key -> what it counts


def cut_counts(items: dict) -> dict:
    """{item: {what: n}} of the prompts (membership: texts) cut to fit the model's context, nonzero only."""
    out = {}
    for name, item in items.items():
        found = {what: int(item[key]) for key, what in CUT.items() if isinstance(item.get(key), (int, float)) and item[key]}
        if found:
            out[name] = found
    return out


SCORES = {"muse": (_muse, MUSE.summary), "whp": (_whp, WHP.summary), "wmdp": (_wmdp, WMDP.summary),
          "rwku": (_rwku, RWKU.summary)}


def bench_scores(kind: str, backbone, rows: dict, options: dict, seed: int, progress: bool = False) -> dict:
    """{items, metrics, data} of one benchmark's rows (`bench_data`) on the model as it stands (an
    edit, if any, already active): what it held, and a column that is not scored says why (`unscored`)."""
    score, summary = SCORES[kind]
    items = score(backbone, rows["splits"], rows["info"], options, seed, progress)
    data = rows["info"]
    note = (items.get("wmdp") or {}).get("letter_note")
    if note:  # reported beside the table, whose WMDP_Acc column reads '–'
        data = dict(data, unscored=note)
    cut = cut_counts(items)
    if cut:  # said under the table and in eval --bench's notes (`bench_report.data_notes`)
        data = dict(data, cut=cut)
    return {"items": items, "metrics": summary(items), "data": data}


def _run(cell, ctx, rows, task) -> dict:
    """Install the cell's method, score the benchmark under the edit, undo; items + metrics."""
    def measure(edit):
        t0 = time.perf_counter()
        with edit.active():
            out = bench_scores(cell.measure, ctx.backbone, rows, cell.options, cell.seed)
        return dict(out, cost=dict(edit.cost(), eval_seconds=time.perf_counter() - t0))

    if cell.data.get("task") != "own":
        return with_edit(cell, ctx, task, measure)
    try:  # a benchmark's own forget set may give a method nothing to work on: a reported skip
        return with_edit(cell, ctx, task, measure)
    except TimeromeError as e:
        return {"items": {}, "metrics": {}, "data": dict(rows["info"], skipped_method=f"{cell.row}: {e}"
                                                         + _positional_hint(e, cell))}


def _positional_hint(error, cell) -> str:
    """How to measure a method whose TIE trace an autoregressive model refused (`DiffusionOnly`): its
    `trace_kind` set to ROME's positional trace, in the experiment's methods setting; '' where the
    method has no such setting or refuses it."""
    row = {"method": cell.method, "config": {**cell.config, "trace_kind": "positional"}}
    try:
        if not isinstance(error, DiffusionOnly) or "trace_kind" not in method_config(cell.method):
            return ""
        full = method_config(cell.method, row["config"])
        chosen = full.get("select_modules")
        if chosen and "trace_modules" not in cell.config and set(chosen) < set(full.get("trace_modules") or ()):
            # the selection reads these alone: the trace runs a row per position, layer and traced module, so
            # tracing the others costs (one fact on SmolLM2, CPU, stop 72: 15 s for one module, 39 s for all three)
            # and changes nothing the row measures
            row["config"]["trace_modules"] = list(chosen)
            method_config(cell.method, row["config"])
    except TimeromeError:
        return ""
    return f"; to measure it here (beside no_edit): -c '{json.dumps({'methods': ['no_edit', row]})}'"


# what the benchmarks' scores read of a cell's options (transfer gives each cell all of them; each has a default)
BENCH_OPTIONS = ("n_mc", "rouge", "knowmem_tokens", "verbmem_tokens", "completion_tokens", "answer_tokens", "mia_k",
                 "mia_groups", "privleak_reference", "choice_text")
# version 1 (stop 76): an autoregressive model's Min-K% / PrivLeak / MIA read exact next-token scores, and every
# result counts what was cut to fit the context; cells cached before then are computed again, not reused
for _kind in SCORES:
    measurement(_kind, options=BENCH_OPTIONS, not_applicable=True, version=1)(_run)


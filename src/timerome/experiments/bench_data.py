"""Data specs naming benchmark data: what a cell of the transfer / rwku experiments evaluates, and
which forget task its method is given.

    {"kind": "muse", "corpus": "books", "dir": DIR, "task": "tofu", "forget": "forget01", "n_knowmem": 100, ...}
    {"kind": "whp" | "wmdp" | "rwku", ...}

resolve to (rows, ForgetTask): rows = {"splits": {name: rows}, "info": what was read (each split's
row count, skipped rows with reasons, layout), the share of unknown tokens and the task}.

The task: "tofu" (transfer) is the TOFU split `forget` of the context's data source, the very
task the canonical experiment edits, so the edit built on it is applied unmodified to the
benchmark; "own" makes the benchmark an editing benchmark: its forget rows are the evaluated
forget rows (MUSE knowmem forget QA, WHP trivia with the true answer, WMDP questions with the
correct choice, RWKU's target probes of levels 1-2 plus passages), each fact's subject the named
entity of its question (RWKU: the target as named there); rows giving no fact are counted, not
hidden. Retain rows: MUSE knowmem retain QA, RWKU the other targets' passages, else the TOFU
retain split of the context's source. Rows that do not fit the model's context leave the task
(counted too).
"""

from __future__ import annotations

import warnings

from timerome.data.benchmark import UNKNOWN_WARNING, entity_subject, unknown_share
from timerome.data.facts import facts_from_rows
from timerome.data.muse import load_muse
from timerome.data.rows import spread
from timerome.data.rwku import load_rwku, passage_rows, rwku_targets, subject_in, target_folder, target_name
from timerome.data.task import ForgetTask
from timerome.data.tofu import load_split
from timerome.data.whp import load_completions, load_trivia
from timerome.data.wmdp import MIXED, load_wmdp
from timerome.engine.encoding import DEFAULT_TARGET, encode_fact
from timerome.errors import TimeromeError
from timerome.evaluation.evaluator import fits
from timerome.experiments.runner import data_kind
from timerome.metrics.rwku import qa_rows
from timerome.metrics.wmdp import prompt as wmdp_prompt


def _bundle(spec, ctx, loaded: dict, forget_rows, retain_rows=None) -> tuple[dict, ForgetTask]:
    """(rows, task) from the loaded splits: the task is TOFU's, or built from forget_rows and
    retain_rows (None: the TOFU retain split of the context's source)."""
    splits = {k: v.rows for k, v in loaded.items()}
    texts = [str(x) for rows in splits.values() for r in rows[:20] for x in r.values() if isinstance(x, str)]
    share = unknown_share(ctx.backbone, texts)
    info = {"splits": {k: v.info() for k, v in loaded.items()}, "unknown_token_share": share,
            "vocabulary": ctx.backbone.vocab_size}
    if share > UNKNOWN_WARNING:
        name = spec["kind"] + (f"-{spec['corpus']}" if spec.get("corpus") else "")
        info["warning"] = (f"{name}: {share:.0%} of this benchmark's tokens are unknown to the model's vocabulary "
                           f"({ctx.backbone.vocab_size} tokens): its numbers mean nothing; run a real "
                           "backbone (--model DIR)")
        warnings.warn(info["warning"], stacklevel=2)
    if spec.get("task") == "none":  # rows only (`timerome eval --bench`: a saved memory, or none, is scored)
        return {"splits": splits, "info": info}, None
    if spec.get("task", "tofu") == "tofu":
        _, task = ctx.data({"forget": spec.get("forget", "forget01"), "splits": ["forget"]})
        info["task"] = f"TOFU {spec.get('forget', 'forget01')} ({len(task.facts)} facts): transfer"
        return {"splits": splits, "info": info}, task
    if spec["task"] != "own":
        raise TimeromeError(f"a benchmark task is 'tofu', 'own' or 'none', got {spec['task']!r}")
    if retain_rows is None:
        retain_rows = load_split("retain_perturbed", ctx.source)
    task, note = own_task(ctx.backbone, forget_rows, retain_rows)
    info["task"] = note
    return {"splits": splits, "info": info}, task


def own_task(backbone, rows: list[dict], retain_rows: list[dict]) -> tuple[ForgetTask, str]:
    """The task of a benchmark's own forget rows (rows carry "subject" or None), and what it holds
    (it may hold nothing: the methods that need rows or facts then report a skip)."""
    forget = [r for r in rows if fits(backbone, r)]
    retain = [r for r in retain_rows if fits(backbone, r)]
    named = [r for r in forget if r.get("subject") and r["subject"] in r["question"]]
    facts, skipped = facts_from_rows(named) if named else ([], [])
    usable = [f for f in facts if _encodes(backbone, f)]
    note = (f"own forget set: {len(forget)} rows ({len(rows) - len(forget)} too long for the context), "
            f"{len(usable)} facts ({len(forget) - len(named) + len(skipped)} rows name no subject, "
            f"{len(facts) - len(usable)} facts the vocabulary cannot encode); {len(retain)} retain rows")
    facts = usable
    return ForgetTask(forget, facts, retain), note


def _encodes(backbone, fact) -> bool:
    try:
        encode_fact(backbone, fact, target=DEFAULT_TARGET)
        return True
    except TimeromeError:
        return False


def _with_subjects(rows: list[dict]) -> list[dict]:
    return [dict(r, subject=s) for r, s in zip(rows, entity_subject(rows))]


@data_kind("muse")
def muse_data(spec, ctx):
    corpus, src = spec.get("corpus", "books"), spec.get("dir")
    n = dict(knowmem_forget=spec.get("n_knowmem"), knowmem_retain=spec.get("n_knowmem"),
             verbmem=spec.get("n_verbmem"), privleak_forget=spec.get("n_privleak"),
             privleak_holdout=spec.get("n_privleak"))
    parts = dict(knowmem_forget="knowmem/forget_qa", knowmem_forget_icl="knowmem/forget_qa_icl",
                 knowmem_retain="knowmem/retain_qa", knowmem_retain_icl="knowmem/retain_qa_icl",
                 verbmem="verbmem/forget", privleak_forget="privleak/forget", privleak_holdout="privleak/holdout")
    if not spec.get("privleak", True):
        parts = {k: v for k, v in parts.items() if not k.startswith("privleak")}
    loaded = {k: load_muse(corpus, p, src) for k, p in parts.items()}
    for k, v in loaded.items():
        v.rows = spread(v.rows, n.get(k))
    forget = _with_subjects(loaded["knowmem_forget"].rows)
    rows, task = _bundle(spec, ctx, loaded, forget, loaded["knowmem_retain"].rows)
    rows["info"]["corpus"] = corpus  # privleak's reference AUC is per corpus
    return rows, task


@data_kind("whp")
def whp_data(spec, ctx):
    src = spec.get("dir")
    loaded = {"trivia": load_trivia(src, spec.get("trivia", "hp_trivia_1239"))}
    loaded["trivia"].rows = spread(loaded["trivia"].rows, spec.get("n_trivia"))
    if spec.get("completions", True):  # false: nothing generates them (rouge off), so they are not read
        loaded["completions"] = load_completions(src, spec.get("prompts", "evaluation_prompts"))
        loaded["completions"].rows = spread(loaded["completions"].rows, spec.get("n_completions"))
    forget = _with_subjects([{"question": r["question"], "answer": r["true_answer"]} for r in loaded["trivia"].rows])
    return _bundle(spec, ctx, loaded, forget)


@data_kind("wmdp")
def wmdp_data(spec, ctx):
    loaded = {"wmdp": load_wmdp(spec.get("dir"), spec.get("subject", "bio"))}
    loaded["wmdp"].rows = spread(loaded["wmdp"].rows, spec.get("n_wmdp"))
    subject = None if loaded["wmdp"].layout.startswith(MIXED) else spec.get("subject", "bio")
    rows = [{"question": wmdp_prompt(r, subject), "answer": r["choices"][r["answer"]]} for r in loaded["wmdp"].rows]
    subjects = entity_subject([{"question": r["question"]} for r in loaded["wmdp"].rows])
    forget = [dict(r, subject=s) for r, s in zip(rows, subjects)]
    rows_out, task = _bundle(spec, ctx, loaded, forget)
    rows_out["info"]["subject"], rows_out["info"]["layout"] = subject or MIXED, loaded["wmdp"].layout
    return rows_out, task


@data_kind("rwku")
def rwku_data(spec, ctx):
    src, folder = spec.get("dir"), target_folder(spec["target"], spec.get("dir"))
    name = target_name(folder)
    parts = ("forget_level1", "forget_level2", "forget_level3", "neighbor_level1", "neighbor_level2")
    parts += ("forget_mia", "retain_mia") if spec.get("mia", True) else ()
    loaded = {p: load_rwku(folder, p, src) for p in parts}
    for v in loaded.values():  # n_probes: at most so many rows of each probe level and membership split
        v.rows = spread(v.rows, spec.get("n_probes"))
    forget_from = tuple(spec.get("forget_from", ("probes", "passages")))
    forget = []
    if "probes" in forget_from:
        forget += qa_rows(loaded["forget_level1"].rows + loaded["forget_level2"].rows)
    if "passages" in forget_from:
        forget += spread(passage_rows(load_rwku(folder, "passage", src).rows), spec.get("n_passages", 20))
    forget = [dict(r, subject=subject_in(r["question"], name)) for r in forget]
    others = [f for f in rwku_targets(src) if f != folder]
    retain = [r for f in others for r in passage_rows(load_rwku(f, "passage", src).rows)]
    retain = spread(retain, 40) if retain else load_split("retain_perturbed", ctx.source)
    rows, task = _bundle(dict(spec, task="none" if spec.get("task") == "none" else "own"), ctx, loaded, forget, retain)
    rows["info"]["target"] = name
    return rows, task

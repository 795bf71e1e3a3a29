"""utility: lm-evaluation-harness tasks with TimeROME installed at several (alpha, q) operating
points, next to no_edit (paper Figure "radar", general-utility axis; Section "General utility").

One cell per (operating point, task, seed): the method is installed on the forget task, lm-eval
runs the task through `lm_eval_model.TimeromeLM` with the edit active, the edit is removed. The
seed drives the Monte-Carlo masks (each request's masks come from (seed, its text): the operating
points and no_edit see the same masks) and lm-eval's own seeds (few-shot sampling). is_greedy (a
generation per request) is computed for a task whose lm-eval score reads it (a loglikelihood task's
acc, e.g. lambada; `lm_eval_model.greedy_readers`) and skipped for the others: decided from the task,
not from a list, since a loglikelihood task left off a list scored acc 0.

The paper runs 12 tasks without naming them; TASKS is our choice of 12 standard lm-eval tasks.
They download their data from the Hugging Face Hub; a local task (a YAML file reading a local
JSON file) runs offline through `include_path`. Every task needs lm-eval: pip install timerome[eval].
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from timerome.common.cache import digest
from timerome.common.checks import integer
from timerome.engine.sampler import diffusion_given
from timerome.engine.settings import LIKELIHOOD, SAMPLER
from timerome.errors import TimeromeError
from timerome.experiments.report import (ACCOUNTING, ACCOUNTING_NOTE, DROPPED_NOTE, fmt_cell, fmt_cost, label,
                                         merge_metrics, plot_delta_bars, summarise, write_outputs)
from timerome.experiments.runner import Cell, measurement, with_edit
from timerome.integrations.lm_eval_model import (GENERATION_OPTIONS, REQUEST_OPTIONS, TimeromeLM, check_schedule,
                                                 evaluate_tasks, greedy_readers, task_manager)
from timerome.methods.timerome_edit import paper_point
from timerome.metrics.columns import header

NAME = "utility"
ORDER = 110
IN_ALL = False  # lm-eval and its tasks' data: run by name
TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "boolq", "openbookqa", "sciq",
         "lambada_openai", "truthfulqa_mc2", "mmlu", "gsm8k")
CONFIG = dict(tasks=TASKS, method="timerome", points=(paper_point(0.5, 2), paper_point(1.0, 2), paper_point(2.0, 4)),
              forget="forget01", n_mc=LIKELIHOOD.n_mc, limit=None, num_fewshot=None, include_path=None,
              generation={})
# a setting the user gave that these settings leave unread is refused (experiments.settings.unread_settings)
UNREAD_WHEN = {"method": lambda cfg: None if cfg["points"] else "points is empty (the unedited model alone)",
               "forget": lambda cfg: None if cfg["points"] else "points is empty (the unedited model alone)"}
# settings this experiment had: a config that still gives one is told why (experiments.experiment_config)
REMOVED = {"greedy_tasks": "which tasks' scores read is_greedy is decided from each task since stop 72 (a "
                           "loglikelihood task left off the list scored acc 0): leave it out"}
METRICS = ("acc_norm", "acc", "exact_match", "f1", "mcc")  # a task's headline: the first of these it reports


def plan(cfg) -> list[tuple[str, str, dict]]:
    """(row, method, overrides): no_edit, then each operating point."""
    return [("no_edit", "no_edit", {})] + [(label(cfg["method"], dict(p)), cfg["method"], dict(p))
                                           for p in cfg["points"]]


def check(cfg, source) -> None:
    """Before a model loads: the generation setting holds only TimeromeLM's generate_until settings and those
    every request reads (an unknown name was taken, and read by nothing where an edit was installed)."""
    gen = cfg.get("generation")
    if not isinstance(gen, dict):
        raise TimeromeError(f"utility: the generation setting must be an object of TimeromeLM's settings, got "
                            f"{type(gen).__name__}")
    unknown = [k for k in gen if k not in GENERATION_OPTIONS + REQUEST_OPTIONS]
    if unknown:
        raise TimeromeError(f"utility: the generation setting has no {', '.join(map(repr, unknown))}; it takes "
                            f"{', '.join(GENERATION_OPTIONS)} (generate_until's) and {', '.join(REQUEST_OPTIONS)} "
                            "(every request's)")
    for k in ("steps", "gen_length", "block_length"):  # TimeromeLM refuses these too, but only once a model is loaded
        integer(gen.get(k), f"utility: the generation setting {k}", lo=1, none=True)
    if any(k in gen for k in ("steps", "gen_length", "block_length", "remasking", "cfg_scale")):
        check_schedule(gen.get("steps"), gen.get("gen_length"), gen.get("block_length"),
                       gen.get("remasking", SAMPLER.remasking), gen.get("cfg_scale", SAMPLER.cfg_scale),
                       "utility: the generation setting")


def unread_on_causal(given) -> list[tuple[str, int]]:
    """The generation setting's diffusion sampler options (steps, block_length, remasking, cache, threshold,
    refresh_every, cfg_scale), as (what they set, how many): refused on an autoregressive model before the load
    (`experiments.refuse_unread_on_causal`), not at its first generate_until."""
    gen = given.get("generation") if isinstance(given, dict) else None
    bad = diffusion_given(gen) if isinstance(gen, dict) else []
    return [(f"the generation setting's {', '.join(bad)} set{'s' if len(bad) == 1 else ''} the diffusion sampler",
             len(bad))] if bad else []


def _include(cfg) -> tuple[str | None, str | None]:
    """(include path, digest of its files): a changed local task is a new cell."""
    path = cfg.get("include_path")
    if not path:
        return None, None
    p = Path(path)
    if not p.is_dir():
        raise TimeromeError(f"include_path {path} is not a directory of lm-eval task files")
    files = sorted(f for f in p.rglob("*") if f.is_file())
    return str(p.resolve()), digest([(str(f.relative_to(p)), f.read_bytes().hex()) for f in files])


def cells(cfg, seeds, ctx) -> list[Cell]:
    tasks = [cfg["tasks"]] if isinstance(cfg["tasks"], str) else list(cfg["tasks"])
    if not tasks:
        raise TimeromeError("utility: give at least one lm-eval task")
    include, files = _include(cfg)
    data = dict(forget=cfg["forget"], splits=["forget"])
    out = []
    for seed in seeds:
        for row, method, over in plan(cfg):
            for task in tasks:
                opts = dict(task=task, n_mc=cfg["n_mc"], limit=cfg["limit"], num_fewshot=cfg["num_fewshot"],
                            include_path=include, task_files=files, generation=dict(cfg["generation"]))
                out.append(Cell("lm_eval", method, over, seed, data, opts, row=row, group=task))
    return out


def headline(task_results: dict) -> tuple[str, float, float | None]:
    """(metric name, value, stderr) of a task's results entry: the first of METRICS it reports."""
    for metric in METRICS:
        for key, value in task_results.items():
            name, _, _filter = key.partition(",")
            if name == metric and isinstance(value, (int, float)):
                se = task_results.get(f"{name}_stderr,{_filter}")
                return key, float(value), float(se) if isinstance(se, (int, float)) else None
    raise TimeromeError(f"lm-eval reported none of {', '.join(METRICS)} for a task: {sorted(task_results)}")


LM_EVAL_OPTIONS = ("task", "n_mc", "limit", "num_fewshot", "include_path", "task_files", "generation")


# reads_steps: a generative task meets a one-step edit; a log-likelihood one refuses it at its first request
# (TimeromeLM, check_stepless), which lm-eval alone knows the task makes
@measurement("lm_eval", reads_steps=True, options=LM_EVAL_OPTIONS, required=LM_EVAL_OPTIONS)
def _lm_eval(cell, ctx, rows, task) -> dict:
    o = cell.options
    include = [o["include_path"]] if o["include_path"] else []
    # built once per run and before the cell's clock starts (with_edit times install, evaluation and undo): lm-eval's
    # task index (about 7 s, charged to the first cell before), and which tasks' scores read is_greedy, decided
    # from the task itself: is_greedy costs a generation per request, and a score that reads it without it reads 0
    manager = ctx.shared(("lm_eval task index", *include), lambda: task_manager(include))
    readers = ctx.shared(("lm_eval is_greedy readers", o["task"], *include),
                         lambda: greedy_readers([o["task"]], manager))

    def measure(edit):
        lm = TimeromeLM(backbone=ctx.backbone, installed=edit, n_mc=o["n_mc"], seed=cell.seed,
                        check_greedy=bool(readers), **o["generation"])
        t0 = time.perf_counter()
        res = evaluate_tasks(lm, [o["task"]], num_fewshot=o["num_fewshot"], limit=o["limit"],
                             include_path=include or None, seed=cell.seed, manager=manager, readers=readers)
        entry = res["results"].get(o["task"])
        if entry is None:
            raise TimeromeError(f"lm-eval returned no results for task {o['task']}")
        metric, value, se = headline(entry)
        scores = {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        return {"metrics": {o["task"]: value}, "metric": metric, "stderr": se, "scores": scores,
                "n_samples": res.get("n-samples", {}).get(o["task"]), "generated": lm.generated,
                "greedy_checked": bool(readers), "cost": {"eval_seconds": time.perf_counter() - t0}}

    return with_edit(cell, ctx, task, measure)


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    tasks = list(dict.fromkeys(c.group for c in cells))
    per_seed, metric, stderr = {}, {}, {}
    for c, r in zip(cells, results):
        merge_metrics(per_seed.setdefault(c.row, {}).setdefault(c.seed, {}), r["metrics"])
        metric[c.group] = r["metric"].split(",")[0]
        if r.get("stderr") is not None:
            stderr.setdefault((c.row, c.group), []).append(r["stderr"])
    summary = summarise(per_seed, tasks)
    noise = within_noise(summary, stderr, tasks)
    lines = [f"## Utility (lm-evaluation-harness, {len(tasks)} tasks)", "",
             "| method | " + " | ".join(f"{t} ({metric.get(t, '?')})" for t in tasks)
             + " | mean Δ vs no_edit | tasks within noise | " + " | ".join(header(c) for c in ACCOUNTING) + " |",
             "|" + "---|" * (len(tasks) + 3 + len(ACCOUNTING))]
    for row, cols in summary.items():
        deltas = [cols[t]["mean"] - summary["no_edit"][t]["mean"] for t in tasks if t in cols and t in summary["no_edit"]]
        kept = noise.get(row)
        delta = ("–" if not deltas else f"{np.mean(deltas):+.3f}" + ("" if len(deltas) == len(tasks) else
                                                                   f" ({len(deltas)}/{len(tasks)} tasks)"))
        lines.append(f"| {row} | " + " | ".join(fmt_cell(cols.get(t), 3) for t in tasks)
                     + f" | {delta} | " + ("–" if row == "no_edit" or kept is None else f"{kept}/{len(tasks)}")
                     + " | " + " | ".join(fmt_cost(cols.get(c)) for c in ACCOUNTING) + " |")
    lines += ["", f"Scores: lm-eval's headline metric per task, mean ± std [bootstrap 95% CI] over seeds; stars: paired "
              f"t vs no_edit over seeds (the seed moves the Monte-Carlo masks). Within noise: |Δ| <= 1.96 sqrt(se² + "
              f"se_no_edit²) with lm-eval's per-item standard errors (conservative: the items are paired). "
              f"n_mc={cfg['n_mc']}; limit={cfg['limit']}; the edit is built on {cfg['forget']}. {ACCOUNTING_NOTE}"
              + (f" {DROPPED_NOTE}" if any((cols.get(t) or {}).get("dropped") for cols in summary.values() for t in tasks)
                 else ""), ""]
    unread = unread_generation(cfg, tasks, results)
    if unread:
        warnings.warn(unread, stacklevel=2)
        lines += [f"Note: {unread}.", ""]
    md = "\n".join(lines)
    radar = {"utility": utility_axis(summary, tasks)} if len(summary) > 1 else {}
    files = write_outputs(out_dir, NAME, dict(summary=summary, metric=metric, within_noise=noise, tasks=tasks,
                                              config=cfg, seeds=list(seeds), radar=radar), md)
    files["png"] = plot_utility(summary, tasks, out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files, within_noise=noise)


def unread_generation(cfg, tasks, results) -> str | None:
    """Why the `generation` settings given were read by nothing (every request of every task a log-likelihood,
    which only lm-eval knows before the run: said after it, in the report), or None. Cells computed before
    the count was recorded say nothing."""
    counts, given = [r.get("generated") for r in results], [k for k in cfg.get("generation") or {}
                                                              if k in GENERATION_OPTIONS]
    if not given or not counts or any(n is None or n > 0 for n in counts):
        return None
    return (f"the generation settings ({', '.join(given)}) were read by no request: "
            f"{', '.join(tasks)} {'asks' if len(tasks) == 1 else 'ask'} only log-likelihoods (leave them out, or "
            "add a generative task)")


def within_noise(summary: dict, stderr: dict, tasks) -> dict:
    """{row: how many tasks score within lm-eval's sampling noise of no_edit} (None without stderrs)."""
    out = {}
    for row in summary:
        if row == "no_edit":
            continue
        count = 0
        for t in tasks:
            se, se0 = stderr.get((row, t)), stderr.get(("no_edit", t))
            if not se or not se0 or t not in summary[row] or t not in summary["no_edit"]:
                break
            gap = abs(summary[row][t]["mean"] - summary["no_edit"][t]["mean"])
            count += gap <= 1.96 * float(np.hypot(np.mean(se), np.mean(se0)))
        else:
            out[row] = int(count)
    return out


def utility_axis(summary: dict, tasks) -> dict:
    """The radar's utility axis: the operating point with the lowest mean score (whatever the order the points
    were given in) against no_edit's, each over the tasks both scored."""
    def mean(r, other):
        return float(np.mean([summary[r][t]["mean"] for t in tasks if t in summary[r] and t in summary[other]]))

    points = [r for r in summary if r != "no_edit"]
    row = min(points, key=lambda r: mean(r, "no_edit"))
    return dict(value=mean(row, "no_edit"), comparator=mean("no_edit", row), higher_is_better=True,
                text=f"mean lm-eval score, {row} (the lowest of {len(points)} operating point"
                     f"{'' if len(points) == 1 else 's'}) vs no_edit")


def plot_utility(summary: dict, tasks, path) -> str:
    """Score change vs no_edit per task, one bar per operating point."""
    def entry(task, row):
        return summary[row].get(task), summary["no_edit"].get(task)

    return plot_delta_bars(tasks, [r for r in summary if r != "no_edit"], entry, path, "score − no_edit score",
                           "lm-evaluation-harness under the edit")

"""sequential: insert forget facts one at a time into the memory, measure after each insert
(paper Table "Sequential / streaming editing")."""

from __future__ import annotations

import time

import numpy as np
import torch

from timerome.engine.encoding import fact_id
from timerome.engine.settings import LIKELIHOOD, LOCALITY, SMALL_LOCALITY
from timerome.evaluation.evaluator import lp_only
from timerome.experiments.report import curve_summary, fmt_cell, label, plot_sequential, write_outputs
from timerome.experiments.runner import LP_COLUMNS, Cell, measurement, row_count
from timerome.methods import InferenceEdit, method_config
from timerome.methods.timerome_edit import build_memory, locate, paper_point, prepare

NAME = "sequential"
ORDER = 40
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, n_facts=50, forget="forget05", n_retain=SMALL_LOCALITY.n_retain, n_world=LOCALITY.n_world,
              variants=(paper_point(1.0, 2), paper_point(0.5, 2), {}), every=1)  # the paper's memory; {}: ours
SHOWN = (0, 1, 5, 10, 20, 30, 40, 50)


def _forwards(cell, rows, task) -> float:
    """One likelihood of every row before the first insert and after every `every` inserts."""
    n_mc, every = cell.options.get("n_mc", LIKELIHOOD.n_mc), cell.options.get("every", 1)
    return (len(task.facts) / every + 1) * n_mc * row_count(rows)


@measurement("sequential", forwards=_forwards, options=("n_mc", "every"), version=1)  # 1: torch's seeded order
def _sequential(cell, ctx, rows, task) -> dict:
    """Insert the task's facts one at a time (seeded order) into a TimeROME memory; lp after each."""
    bb = ctx.backbone
    conf = method_config("timerome", cell.config)
    prepare(bb, task, conf)
    coordinate, info = locate(bb, task, conf)
    memory = build_memory(bb, task, conf, coordinate, facts=[])  # empty; lambda scaled on all the facts
    edit = InferenceEdit(method="timerome", config=conf, context=lambda: memory.applied(bb), memory=memory)
    order = torch.randperm(len(task.facts), generator=torch.Generator().manual_seed(cell.seed)).tolist()
    n_mc, every = cell.options.get("n_mc", LIKELIHOOD.n_mc), cell.options.get("every", 1)

    def point(k, secs, use_edit):
        lp = lp_only(bb, rows, n_mc=n_mc, seed=cell.seed, edit=edit if use_edit else None)
        return dict(k=k, insert_seconds=secs, **{c: float(np.mean(lp[s])) for s, c in LP_COLUMNS.items() if s in lp})

    curve = [point(0, 0.0, False)]
    for k, i in enumerate(order, 1):
        t0 = time.perf_counter()
        memory.add([task.facts[i]])
        memory.q = min(int(conf["q"]), len(memory))  # TopQ cannot keep more facts than stored
        secs = time.perf_counter() - t0
        if k % every == 0 or k == len(order):
            curve.append(point(k, secs, True))
    return {"curve": curve, "info": dict(info, layer=memory.coordinate.layer, point=memory.coordinate.point,
                                         order=[fact_id(task.facts[i]) for i in order])}


def cells(cfg, seeds, ctx) -> list[Cell]:
    data = dict(forget=cfg["forget"], first=cfg["n_facts"], n_retain=cfg["n_retain"], n_world=cfg["n_world"],
                splits=["forget", "retain", "real_authors"], validation="forget01")
    return [Cell("sequential", "timerome", dict(over), seed, data, dict(n_mc=cfg["n_mc"], every=cfg["every"]),
                 row=label("timerome", over)) for over in cfg["variants"] for seed in seeds]


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    curves: dict = {}
    for c, r in zip(cells, results):
        curves.setdefault(c.row, {})[c.seed] = r["curve"]
    summary = curve_summary(curves)
    lines = ["## Sequential editing", "", "| variant | k | ForgetLP | RetainLP | RealAuth | insert s |",
             "|---|---|---|---|---|---|"]
    for row, by_k in summary.items():
        for k in by_k:
            if k in SHOWN or k == max(by_k):
                lines.append(f"| {row} | {k} | " + " | ".join(fmt_cell(by_k[k][c], 4 if c == "insert_seconds" else 2)
                                                              for c in ("ForgetLP", "RetainLP", "RealAuth",
                                                                        "insert_seconds")) + " |")
    info = results[0].get("info", {}) if results else {}
    lines += ["", f"k = facts inserted one at a time (k=0: no edit); ForgetLP over all {cfg['n_facts']} facts "
              f"(the not-yet-inserted ones included); coordinate layer {info.get('layer')} {info.get('point')}. "
              "insert s = adding the k-th fact to the memory (capture + block update; no training, no extra "
              "model memory: the memory holds k keys and deltas of the hidden size).", ""]
    md = "\n".join(lines)
    files = write_outputs(out_dir, NAME, dict(summary=summary, curves=curves, config=cfg,
                                              coordinate=[info.get("layer"), info.get("point")]), md)
    files["png"] = plot_sequential(summary, out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files)

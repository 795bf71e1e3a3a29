"""sequential: insert forget facts one at a time into the memory, measure after each insert
(paper Table "Sequential / streaming editing")."""

from __future__ import annotations

from timerome.experiments.report import curve_summary, fmt_cell, label, plot_sequential, write_outputs
from timerome.experiments.runner import Cell

NAME = "sequential"
CONFIG = dict(n_mc=16, n_facts=50, forget="forget05", n_retain=20, n_world=20,
              variants=({"alpha": 1.0, "q": 2}, {"alpha": 0.5, "q": 2}, {}), every=1)
SHOWN = (0, 1, 5, 10, 20, 30, 40, 50)


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

"""robustness: the forget log-probability of every method under a paraphrased question, a paraphrased
answer and in-context relearning, as the change from the unedited model (paper "Robustness" panel).

One cell per method and seed measures the four conditions (metrics/robustness.py) with the method
installed; the no_edit cells of the same seeds are the unedited model, so every change is paired
row by row and seed by seed. `weakening` = change(condition) - change(original): how much of the
edit's effect the condition takes back (the paper: within 2 nats under paraphrase, ~8 nats under
in-context relearning). `methods`: None = every registered method's canonical rows.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from timerome.experiments.bench_report import plot_panels
from timerome.experiments.canonical import canonical_rows
from timerome.experiments.report import by_row, label, markdown, summarise, write_outputs
from timerome.experiments.runner import Cell, measurement, with_edit
from timerome.metrics.robustness import CONDITIONS, RELEARN, condition_logprobs, robustness
from timerome.stats import cell as stat_cell

NAME = "robustness"
CONFIG = dict(n_mc=16, forget="forget01", eval_forget=None, methods=None, relearn=RELEARN)
QUICK = dict(n_mc=4, eval_forget=8, methods=["no_edit", {"method": "timerome"}, {"method": "ga"}])
COLUMNS = [f"LP_{c}" for c in CONDITIONS]


@measurement("robustness")
def measure_robustness(cell, ctx, rows, task) -> dict:
    def measure(edit):
        t0 = time.perf_counter()
        items = condition_logprobs(ctx.backbone, rows["forget"], edit, n_mc=cell.options.get("n_mc", 16),
                                   seed=cell.seed, relearn=cell.options.get("relearn", RELEARN))
        metrics = {f"LP_{c}": float(np.mean(items[c]["lp"])) for c in CONDITIONS if items[c]["lp"]}
        return {"items": items, "metrics": metrics, "cost": dict(edit.cost(), eval_seconds=time.perf_counter() - t0)}

    return with_edit(cell, ctx, task, measure)


def cells(cfg, seeds, ctx) -> list[Cell]:
    data = dict(forget=cfg["forget"], eval_forget=cfg["eval_forget"], splits=["forget"])
    opts = dict(n_mc=cfg["n_mc"], relearn=cfg["relearn"])
    return [Cell("robustness", m, over, seed, data, opts, row=label(m, over))
            for seed in seeds for m, over in canonical_rows(cfg["methods"])]


def panel(cells, results) -> dict:
    """{row: {condition: {"change": stats, "weakening": stats}}} over seeds, against no_edit's cells."""
    base = {c.seed: r["items"] for c, r in zip(cells, results) if c.row == "no_edit"}
    per_row: dict = {}
    for c, r in zip(cells, results):
        if c.row != "no_edit" and c.seed in base:
            per_row.setdefault(c.row, []).append(robustness(base[c.seed], r["items"]))
    out = {}
    for row, runs in per_row.items():
        out[row] = {}
        for cond in CONDITIONS:
            for what in ("change", "weakening"):
                vals = [x[cond][what] for x in runs if np.isfinite(x[cond][what])]
                if vals:
                    s = stat_cell(vals)
                    out[row].setdefault(cond, {})[what] = dict(mean=s.mean, std=s.std, lo=s.lo, hi=s.hi, n=s.n)
    return out


def kept_share(conds: dict, min_forget: float = 1.0) -> float | None:
    """The share of a row's forgetting that its weakest condition keeps: min over paraphrases and
    relearning of change(condition) / change(original), at least 0; None without a forgetting of
    `min_forget` nats to take a share of."""
    original = conds.get("original", {}).get("change", {}).get("mean")
    if original is None or not original < -min_forget:
        return None
    kept = [conds[c]["change"]["mean"] / original for c in CONDITIONS[1:] if "change" in conds.get(c, {})]
    return max(0.0, min(kept)) if kept else None


def radar_entry(p: dict) -> dict | None:
    """The radar's robustness axis: TimeROME's kept share (the row named "timerome", else the first
    timerome row) against the strongest other method's (largest forgetting in the original condition)."""
    ours = "timerome" if "timerome" in p else next((r for r in p if r.split(" ")[0] == "timerome"), None)
    others = {r: c for r, c in p.items() if r.split(" ")[0] != "timerome" and kept_share(c) is not None}
    if ours is None or kept_share(p[ours]) is None or not others:
        return None
    best = min(others, key=lambda r: others[r]["original"]["change"]["mean"])
    return dict(value=kept_share(p[ours]), comparator=kept_share(others[best]), higher_is_better=True,
                text=f"share of the forgetting kept under the weakest of paraphrase / relearning, {ours} vs {best}")


def panel_markdown(p: dict) -> str:
    head = ["method"] + [f"Δ {c}" for c in CONDITIONS] + [f"weakening {c}" for c in CONDITIONS[1:]]
    lines = ["## Robustness panel: change of the forget log-probability vs the unedited model (nats)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, conds in p.items():
        def f(cond, what):
            e = conds.get(cond, {}).get(what)
            if not e:
                return "–"
            return f"{e['mean']:+.2f}" + (f" [{e['lo']:+.2f}, {e['hi']:+.2f}]" if e["n"] > 1 else "")

        lines.append(f"| {row} | " + " | ".join([f(c, "change") for c in CONDITIONS]
                                               + [f(c, "weakening") for c in CONDITIONS[1:]]) + " |")
    return "\n".join(lines + ["", "Δ: edited − unedited, per forget row, mean over rows and seeds [bootstrap 95% CI "
                              "over seeds]; weakening: Δ(condition) − Δ(original), positive = the condition takes "
                              "back that many nats of the edit.", ""])


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    cols = COLUMNS + ["install_seconds"]
    summary = summarise(by_row(cells, results, measures=("robustness",)), cols)
    p = panel(cells, results)
    missing = results[0]["items"]["missing"] if results else {}
    note = ("Rows lacking a paraphrase: " + ", ".join(f"{c} {n}" for c, n in missing.items() if n)) if any(
        missing.values()) else ""
    md = "\n".join([panel_markdown(p), markdown(summary, cols, "Forget log-probability per condition", note,
                                                delta="LP_original")])
    entry = radar_entry(p)
    files = write_outputs(out_dir, NAME, dict(summary=summary, panel=p, config=cfg, seeds=list(seeds),
                                              radar={"robustness": entry} if entry else {}), md)
    files["png"] = plot_panels([("robustness", summary, COLUMNS)], Path(out_dir) / f"{NAME}.png",
                               ylabel="forget LP change vs no_edit (nats)")
    return dict(summary=summary, panel=p, markdown=md, files=files)

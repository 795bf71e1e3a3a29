"""xbackbone: the same methods with the same settings on several checkpoints, one column each
(paper Table "Cross-backbone evaluation": fLP and KS p per backbone, the Δ fLP row with stars).

    timerome experiment xbackbone --models DIR1,DIR2,... --data tofu -c refs.json

Every checkpoint runs the same cells (methods x seeds, `full` measurement without ROUGE on the
forget and retain rows); TimeROME runs at one (alpha, lambda, q) everywhere. KS p (Forget Quality)
needs, per checkpoint, a model that never saw the forget set: the `references` setting (one
directory per model, null for none; "train" trains one for timerome's own architecture); the
embedded model gets its own automatically. A checkpoint without a reference shows fLP only. A method
that cannot act on a checkpoint (AlphaEdit on a mixture of experts: no single down projection) reads
n/a in that column, with the reason under the table; the other cells run.
"""

from __future__ import annotations

from pathlib import Path

from timerome.engine.settings import LIKELIHOOD, LOCALITY
from timerome.experiments.report import (ACCOUNTING, ACCOUNTING_NOTE, NOT_APPLICABLE, by_row, delta_text, fmt_cell,
                                         label, not_applicable_note, not_applicable_rows, plot_delta_bars, summarise,
                                         write_outputs)
from timerome.experiments.runner import Cell
from timerome.methods import method_config
from timerome.methods.timerome_edit import paper_point
from timerome.metrics.columns import header

NAME = "xbackbone"
ORDER = 120
IN_ALL = False   # needs checkpoints: run by name with --models
PER_MODEL = True
PAPER_POINT = paper_point(2.0, 4)  # the paper's TimeROME row, the same on every backbone
CONFIG = dict(models=None, references=None, n_mc=LIKELIHOOD.n_mc, n_retain=LOCALITY.n_retain, forget="forget01",
              methods=({"method": "no_edit"}, {"method": "alphaedit"}, {"method": "adaptive_rmu"},
                       {"method": "simnpo"}, {"method": "timerome", "config": PAPER_POINT}))
COLUMNS = ["ForgetLP", "ForgetQuality", "RetainLP"]


def plan(cfg) -> list[tuple[str, str, dict]]:
    """(row, method, overrides); every method's options are checked now, before any model loads."""
    out = []
    for m in cfg["methods"]:
        m = {"method": m} if isinstance(m, str) else dict(m)
        over = dict(m.get("config") or {})
        method_config(m["method"], over)
        out.append((label(m["method"], over), m["method"], over))
    return out


def methods(cfg) -> list[tuple[str, dict]]:
    """(method, overrides) every checkpoint runs: checked against each model the run can tell the kind of before
    the first one loads (run_experiment)."""
    return [(m, over) for _, m, over in plan(cfg)]


def columns(paths) -> list[str]:
    """One column name per checkpoint: the shortest path tail that tells them apart."""
    parts = [Path(p).resolve().parts if p else ("timerome-default",) for p in paths]
    for n in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-n:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{i}:{p}" for i, p in enumerate(paths)]  # the same checkpoint twice


def cells(cfg, seeds, ctx) -> list[Cell]:
    data = dict(forget=cfg["forget"], n_retain=cfg["n_retain"], splits=["forget", "retain"])
    out = []
    for seed in seeds:
        if ctx.auto_reference() is not None:
            out.append(Cell("reference", seed=seed, data=data, options=dict(n_mc=cfg["n_mc"]), row="reference"))
        out += [Cell("full", m, over, seed, data, dict(n_mc=cfg["n_mc"], rouge=False), row=row)
                for row, m, over in plan(cfg)]
    return out


def report(cfg, seeds, per_model: dict, out_dir) -> dict:
    rows = [row for row, _, _ in plan(cfg)]
    summary = {col: summarise(by_row(cells, results), COLUMNS) for col, (cells, results, _) in per_model.items()}
    models = {col: about for col, (_, _, about) in per_model.items()}
    na = {col: not_applicable_rows(cells, results) for col, (cells, results, _) in per_model.items()}
    edit_row = next((r for r in reversed(rows) if r.startswith("timerome")), rows[-1])
    head = "| method | " + " | ".join(f"{c} fLP ↓ | {c} KS p ↑" for c in summary) + " |"
    lines = [f"## Cross-backbone ({len(summary)} checkpoints, {cfg['forget']})", "", head,
             "|" + "---|" * (1 + 2 * len(summary))]

    def n_a(col, row) -> bool:  # the method could not act on that checkpoint: nothing was measured
        return row in na[col] and not summary[col].get(row)

    def pair(col, row):
        if n_a(col, row):
            return f"{NOT_APPLICABLE} | {NOT_APPLICABLE}"
        s = summary[col].get(row, {})
        return f"{fmt_cell(s.get('ForgetLP'), 1)} | {fmt_cell(s.get('ForgetQuality'), 2)}"

    for row in rows:
        lines.append(f"| {row} | " + " | ".join(pair(col, row) for col in summary) + " |")
    lines.append(f"| Δ fLP vs no_edit ({edit_row}) | " + " | ".join(
        f"{NOT_APPLICABLE if n_a(col, edit_row) else delta_text(s.get(edit_row, {}).get('ForgetLP', {}))} | "
        for col, s in summary.items()) + " |")
    lines += ["", f"### Compute per checkpoint ({' / '.join(header(c) for c in ACCOUNTING)})", "",
              "| method | " + " | ".join(summary) + " |", "|" + "---|" * (1 + len(summary))]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(
            NOT_APPLICABLE if n_a(col, row) else " / ".join(_mean(s.get(row, {}).get(c)) for c in ACCOUNTING)
            for col, s in summary.items()) + " |")
    missing = [c for c, about in models.items() if not about["reference"]]
    lines += ["", f"Cells: mean ± std [bootstrap 95% CI] over seeds {list(seeds)}, n_mc={cfg['n_mc']}; stars: paired t "
              "vs no_edit (* p<0.05, ** p<0.01, *** p<1e-4; † the same difference on every seed). Every checkpoint "
              "runs the same method settings." + (f" No reference model (KS p '–') for: {', '.join(missing)}: pass "
                                                  "`references`, one per model." if missing else "")
              + " " + ACCOUNTING_NOTE]
    lines += [f"{col}: {not_applicable_note(rows_na)}" for col, rows_na in na.items() if rows_na] + [""]
    md = "\n".join(lines)
    files = write_outputs(out_dir, NAME, dict(summary=summary, models=models, rows=rows, config=cfg,
                                              seeds=list(seeds), not_applicable=na), md)
    files["png"] = plot_xbackbone(summary, rows, Path(out_dir) / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files, models=models, not_applicable=na)


def _mean(e: dict | None) -> str:
    return f"{e['mean']:.1f}" if e else "–"


def plot_xbackbone(summary: dict, rows, path) -> str:
    """Δ ForgetLP vs no_edit per checkpoint, one bar per method."""
    def entry(col, row):
        return summary[col].get(row, {}).get("ForgetLP"), summary[col].get("no_edit", {}).get("ForgetLP")

    return plot_delta_bars(list(summary), [r for r in rows if r != "no_edit"], entry, path,
                           "Δ ForgetLP vs no_edit (nats)", "Cross-backbone: the same settings on every checkpoint")

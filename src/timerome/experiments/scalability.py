"""scalability: |F| facts (the last |F| rows of `full`) in one memory: forget / retain LP and install time
(paper Table "Multi-fact scalability")."""

from __future__ import annotations

from timerome.engine.settings import LIKELIHOOD, LOCALITY
from timerome.experiments.report import (ACCOUNTING_NOTE, NOT_APPLICABLE, by_row, coordinate_note, delta_text,
                                         fmt_any, label, not_applicable_note, not_applicable_rows, plot_scalability,
                                         summarise, traced_coordinate, with_accounting, write_outputs)
from timerome.experiments.runner import Cell
from timerome.methods.timerome_edit import paper_point

NAME = "scalability"
ORDER = 30
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, sizes=(1, 10, 40, 100, 200, 400), n_eval_forget=40,
              n_retain=LOCALITY.n_retain, n_world=LOCALITY.n_world,
              variants=(paper_point(0.5, 2), paper_point(1.0, 2), {}))  # the paper's memory at its points; {}: ours
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "install_seconds"]


def data_spec(cfg, n: int) -> dict:
    # every size traces the same validation facts (forget01's), so every memory sits at one coordinate
    return dict(forget="full", last=n, eval_forget=cfg["n_eval_forget"], n_retain=cfg["n_retain"],
                n_world=cfg["n_world"], splits=["forget", "retain", "real_authors"], validation="forget01")


def cells(cfg, seeds, ctx) -> list[Cell]:
    plan = [("no_edit", {})] + [("timerome", dict(v)) for v in cfg["variants"]]
    return [Cell("lp", m, over, seed, data_spec(cfg, n), dict(n_mc=cfg["n_mc"]), row=label(m, over), group=n)
            for n in cfg["sizes"] for seed in seeds for m, over in plan]


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summary = {}
    for n in cfg["sizes"]:
        picked = [(c, r) for c, r in zip(cells, results) if c.group == n]
        summary[n] = summarise(by_row(*zip(*picked)), COLUMNS)
    shown, na = with_accounting(COLUMNS), not_applicable_rows(cells, results)
    lines = ["## Scalability", "", "| abs F | method | ForgetLP | RetainLP | RealAuth | install s | wall s | extra MB "
             "| Δ ForgetLP (p) |", "|---|---|---|---|---|---|---|---|---|"]
    for n, rows_n in summary.items():
        for row, c in rows_n.items():
            cells_shown = ([NOT_APPLICABLE] * (len(shown) + 1) if row in na and not c else
                           [fmt_any(k, c.get(k)) for k in shown] + [delta_text(c.get("ForgetLP", {}))])
            lines.append(f"| {n} | {row} | " + " | ".join(cells_shown) + " |")
    lines += ["", f"{coordinate_note(results)} Forget LP over at most {cfg['n_eval_forget']} of the |F| facts; "
              "install = capture + solve (the trace and the background statistics are measured once, before). "
              + ACCOUNTING_NOTE + (" " + not_applicable_note(na) if na else ""), ""]
    md = "\n".join(lines)
    coord = traced_coordinate(results)
    files = write_outputs(out_dir, NAME, dict(summary=summary, config=cfg, coordinate=coord, not_applicable=na), md)
    files["png"] = plot_scalability(summary, out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files, not_applicable=na)

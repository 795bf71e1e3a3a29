"""pareto: TimeROME's alpha sweep, -ForgetLP vs RetainLP, against every other method (paper Figure "Pareto")."""

from __future__ import annotations

from timerome.engine.settings import EDIT, LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.experiments.canonical import canonical_rows, data_spec
from timerome.experiments.report import (by_row, label, markdown, not_applicable_rows, plot_pareto, summarise,
                                         traced_coordinate, write_outputs)
from timerome.experiments.runner import Cell
from timerome.methods.timerome_edit import paper_point

NAME = "pareto"
ORDER = 50
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, n_retain=40, n_world=20, forget="forget01", q=EDIT.q,
              alphas=(0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0), paper_point=paper_point(2.0, 4), methods=None,
              retain_authors=None, splits=None)  # as canonical's
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact"]


def sweep(cfg) -> list[tuple[str, dict]]:
    return [("timerome", {"alpha": a, "q": cfg["q"]}) for a in cfg["alphas"]]


def cells(cfg, seeds, ctx) -> list[Cell]:
    lacking = [k for k in ("forget", "retain") if cfg.get("splits") is not None and k not in cfg["splits"]]
    if lacking:  # the frontier is ForgetLP against RetainLP
        raise TimeromeError(f"experiment 'pareto' draws ForgetLP against RetainLP: its splits need "
                            f"{' and '.join(lacking)} (got {list(cfg['splits'])})")
    others = [(m, o) for m, o in canonical_rows(cfg.get("methods")) if m != "timerome"]
    if cfg.get("paper_point"):
        others.append(("timerome", dict(cfg["paper_point"])))
    data = data_spec(cfg)
    return [Cell("lp", m, over, seed, data, dict(n_mc=cfg["n_mc"]), row=label(m, over))
            for seed in seeds for m, over in sweep(cfg) + others]


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summary = summarise(by_row(cells, results), COLUMNS)
    coord, na = traced_coordinate(results), not_applicable_rows(cells, results)
    md = markdown(summary, COLUMNS, "Pareto sweep (alpha)", f"q={cfg['q']} for the sweep; coordinate layer "
                  f"{coord[0] if coord else '?'} {coord[1] if coord else ''}.", not_applicable=na)
    files = write_outputs(out_dir, NAME, dict(summary=summary, config=cfg, coordinate=coord, not_applicable=na), md)
    files["png"] = plot_pareto(summary, [label(m, o) for m, o in sweep(cfg)], out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files, not_applicable=na)

"""pareto: TimeROME's alpha sweep, -ForgetLP vs RetainLP, against every other method (paper Figure "Pareto").

`frontiers`: the timerome settings each swept over `alphas`, one line each ({}: the traced coordinate,
the paper's figure). Beyond the paper, a frontier at another coordinate or trace read-out, e.g.
`{"frontiers": [{}, {"coordinate": [0, "resid"]}, {"trace_read_positions": "no_subject"}]}`, asks
whether the traced coordinate gives the best forget / retain trade-off, not only the most forgetting at
one alpha. The sweep sets alpha and q; a frontier that names either is refused.
"""

from __future__ import annotations

import json

from timerome.common.checks import repeated
from timerome.engine.settings import EDIT, LIKELIHOOD, LOCALITY
from timerome.errors import TimeromeError
from timerome.experiments.canonical import canonical_rows, data_spec
from timerome.experiments.data import SIZES_UNREAD_WHEN
from timerome.experiments.report import (by_row, installed_info, label, markdown, not_applicable_rows, plot_pareto,
                                         summarise, write_outputs)
from timerome.experiments.runner import Cell
from timerome.methods.registry import keyed, method_config
from timerome.methods.timerome_edit import paper_point

NAME = "pareto"
ORDER = 50
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, n_retain=LOCALITY.n_retain, n_world=LOCALITY.n_world, forget="forget01", q=EDIT.q,
              alphas=(0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0), paper_point=paper_point(2.0, 4), methods=None,
              retain_authors=None, splits=None,  # as canonical's
              frontiers=({},))
UNREAD_WHEN = SIZES_UNREAD_WHEN
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact"]


def sweep(cfg) -> list[tuple[str, dict]]:
    return [("timerome", dict(f, alpha=a, q=cfg["q"])) for f in cfg["frontiers"] for a in cfg["alphas"]]


def frontier_name(f: dict) -> str:
    """A frontier's line in the figure and the note."""
    return "TimeROME alpha sweep" + label("", f)


def frontier_rows(cfg) -> dict[str, list[str]]:
    """{frontier name: its rows, by alpha}; two frontiers that are the same settings are refused."""
    made = [(keyed(method_config("timerome", f)), label("timerome", f)) for f in cfg["frontiers"]]
    for i, (config, row) in enumerate(made):  # the same cells, or the same rows in the tables
        j = next((j for j, (c, r) in enumerate(made[:i]) if c == config or r == row), None)
        if j is not None:
            raise TimeromeError(f"experiment 'pareto': frontiers {j} and {i} are the same settings "
                                f"({json.dumps(cfg['frontiers'][i])}): give each frontier once")
    return {frontier_name(f): [label("timerome", dict(f, alpha=a, q=cfg["q"])) for a in cfg["alphas"]]
            for f in cfg["frontiers"]}


def check(cfg, source) -> None:
    """Before a model loads: the splits the frontier reads, a sweep with no point, a frontier given twice."""
    lacking = [k for k in ("forget", "retain") if cfg.get("splits") is not None and k not in cfg["splits"]]
    if lacking:  # the frontier is ForgetLP against RetainLP
        raise TimeromeError(f"experiment 'pareto' draws ForgetLP against RetainLP: its splits need "
                            f"{' and '.join(lacking)} (got {list(cfg['splits'])})")
    if not cfg["alphas"]:  # no frontier: q and frontiers would be read by nothing (an empty frontiers is refused)
        raise TimeromeError("experiment 'pareto': alphas is empty, so there is no frontier to draw: give at least one")
    twice = repeated(cfg["alphas"])
    if twice:  # one point of the frontier, drawn as two
        raise TimeromeError(f"experiment 'pareto': alphas gives {', '.join(f'{a:g}' for a in twice)} twice: give each "
                            "alpha once")
    frontier_rows(cfg)  # refuses a frontier given twice


def cells(cfg, seeds, ctx) -> list[Cell]:
    others = [(m, o) for m, o in canonical_rows(cfg.get("methods")) if m != "timerome"]
    if cfg.get("paper_point"):
        others.append(("timerome", dict(cfg["paper_point"])))
    data = data_spec(cfg)
    return [Cell("lp", m, over, seed, data, dict(n_mc=cfg["n_mc"]), row=label(m, over))
            for seed in seeds for m, over in sweep(cfg) + others]


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summary = summarise(by_row(cells, results), COLUMNS)
    rows, na = frontier_rows(cfg), not_applicable_rows(cells, results)
    where = {name: placed(cells, results, mine) for name, mine in rows.items()}
    coord = next(iter(where.values()))  # the first frontier's (the paper's figure: the traced coordinate)
    if len(where) == 1:
        note = f"coordinate layer {coord[0] if coord else '?'} {coord[1] if coord else ''}."
    else:
        note = "coordinates: " + "; ".join(f"{name}: layer {c[0]} {c[1]}" if c else f"{name}: not installed"
                                           for name, c in where.items()) + "."
    md = markdown(summary, COLUMNS, "Pareto sweep (alpha)", f"q={cfg['q']} for the sweep; {note}", not_applicable=na)
    files = write_outputs(out_dir, NAME, dict(summary=summary, config=cfg, coordinate=coord, not_applicable=na), md)
    files["png"] = plot_pareto(summary, rows, out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files, not_applicable=na)


def placed(cells, results, rows) -> list | None:
    """[layer, point] where the first cell of `rows` that installed a memory put it, else None."""
    info = installed_info(cells, results, rows)
    return None if info is None else [info["layer"], info["point"]]

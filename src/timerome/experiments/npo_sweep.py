"""npo_sweep: the converged training-time baseline, LoRA-NPO and LoRA-SimNPO under the safe protocol
(paper Section "Converged training-time baseline": 17 configurations, lr in {1e-5, 3e-5}, beta in
{0.1, 1.0}, retain weight in {1, 4}, 2-3 seeds; retain-NLL anchor, grad clip 1.0, early stop when
retain LP drifts >= 5 nats). Reports which configurations collapse and the best Δ ForgetLP, next to
TimeROME at the same evaluation and the unmitigated LoRA-NPO the safe protocol is meant to tame.

The grid is 2 methods x 2 lr x 2 beta x 2 retain weights = 16; the paper's seventeenth is not named,
ours (`extra`) is LoRA-NPO at lr 1e-4 under the safe protocol, the rate at which the paper's
unmitigated LoRA-NPO crashes. A configuration collapses on a seed when its RetainLP falls more than
`collapse` nats below no_edit's on that seed (the drift the safe protocol allows its checks).
"""

from __future__ import annotations

import itertools

import numpy as np

from timerome.engine.settings import LIKELIHOOD, LOCALITY
from timerome.errors import TimeromeError
from timerome.experiments.report import (ACCOUNTING, ACCOUNTING_NOTE, NOT_APPLICABLE, by_row, delta_text, figure,
                                         fmt_cell, fmt_cost, label, not_applicable_note, not_applicable_rows, save_png,
                                         summarise, write_outputs)
from timerome.experiments.runner import Cell
from timerome.methods import method_config
from timerome.methods.timerome_edit import paper_point
from timerome.metrics.columns import header

NAME = "npo_sweep"
ORDER = 100
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, n_retain=LOCALITY.n_retain, n_world=LOCALITY.n_world, forget="forget01",
              methods=("npo", "simnpo"), lr=(1e-5, 3e-5), beta=(0.1, 1.0), retain_w=(1.0, 4.0), lora_r=8,
              grad_steps=None,
              extra=({"method": "npo", "lr": 1e-4},), unmitigated=({"method": "npo", "lr": 1e-4, "safe": False},),
              compare=({"method": "timerome", "config": {}}, {"method": "timerome", "config": paper_point(2.0, 4)}),
              collapse=5.0)
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact"]


def configurations(cfg) -> list[tuple[str, dict]]:
    """(method, overrides) of the sweep: the grid, then `extra`; all LoRA, all safe. An empty axis
    empties the grid, leaving the others read by nothing: refused."""
    empty = [k for k in ("methods", "lr", "beta", "retain_w") if not cfg[k]]
    if empty:
        raise TimeromeError(f"experiment 'npo_sweep': {', '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty, "
                            "so the grid has no configuration and its other axes are read by nothing: give each a "
                            "value (`extra` takes configurations outside the grid)")
    base = {"lora_r": int(cfg["lora_r"]), "safe": True} | ({"grad_steps": int(cfg["grad_steps"])} if cfg["grad_steps"] else {})
    grid = [(m, dict(base, lr=lr, beta=beta, retain_w=w))
            for m, lr, beta, w in itertools.product(cfg["methods"], cfg["lr"], cfg["beta"], cfg["retain_w"])]
    extra = [(e["method"], dict(base, **{k: v for k, v in e.items() if k != "method"})) for e in cfg["extra"]]
    return grid + extra


def plan(cfg) -> list[tuple[str, str, dict, str]]:
    """(row, method, overrides, kind) with kind "sweep", "unmitigated", "compare" or "reference". A compare row
    (TimeROME's) is held to the sweep's collapse rule too: the report compares the one that forgets most without
    collapsing."""
    rows = [("no_edit", "no_edit", {}, "reference")]
    rows += [(_name(f"lora-{m}", o), m, o, "sweep") for m, o in configurations(cfg)]
    for e in cfg["unmitigated"]:
        o = {"lora_r": int(cfg["lora_r"])} | {k: v for k, v in e.items() if k != "method"}
        rows.append((_name(f"lora-{e['method']} unmitigated", o), e["method"], o, "unmitigated"))
    rows += [(label(c["method"], dict(c.get("config") or {})), c["method"], dict(c.get("config") or {}), "compare")
             for c in cfg["compare"]]
    for _, m, o, _ in rows:
        method_config(m, o)  # an unknown option fails before any work
    return rows


def _name(method: str, over: dict) -> str:
    """A row's label: what varies (the LoRA rank, the protocol and the step count are in the note)."""
    return label(method, {k: v for k, v in over.items() if k not in ("lora_r", "safe", "grad_steps")})


def cells(cfg, seeds, ctx) -> list[Cell]:
    data = dict(forget=cfg["forget"], n_retain=cfg["n_retain"], n_world=cfg["n_world"])
    return [Cell("lp", m, o, seed, data, dict(n_mc=cfg["n_mc"]), row=row, group=kind)
            for seed in seeds for row, m, o, kind in plan(cfg)]


def collapses(per_seed: dict, row: str, limit: float) -> list[int]:
    """The seeds on which `row`'s RetainLP fell more than `limit` nats below no_edit's (or is not finite)."""
    ref = per_seed.get("no_edit", {})
    out = []
    for seed, m in per_seed.get(row, {}).items():
        r, r0 = m.get("RetainLP"), ref.get(seed, {}).get("RetainLP")
        if r is None or r0 is None or not np.isfinite(r) or r0 - r > limit:
            out.append(seed)
    return out


def _ratio(summary, row, best, d_flp) -> str:
    """How many times the best baseline's Δ, only where that Δ is itself a significant forgetting."""
    if not best:
        return ""
    p = summary[best].get("ForgetLP", {}).get("p")
    if d_flp(best) < 0 and p is not None and p < 0.05:
        return f" ({d_flp(row) / d_flp(best):.1f}x the best baseline's)"
    return " (the best baseline's Δ is not a significant forgetting: no ratio)"


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    per_seed = by_row(cells, results)
    summary = summarise(per_seed, COLUMNS)
    na = {row: why for row, why in not_applicable_rows(cells, results).items() if not summary.get(row)}
    kinds = {c.row: c.group for c in cells}
    stopped: dict = {}
    for c, r in zip(cells, results):
        info = r.get("info") or {}
        if "early_stopped" in info:
            stopped.setdefault(c.row, []).append((bool(info["early_stopped"]), info.get("kept_step"), info.get("steps_run")))
    collapsed = {row: collapses(per_seed, row, float(cfg["collapse"])) for row in summary
                 if row != "no_edit" and row not in na}  # an n/a row measured nothing, so nothing collapsed

    def d_flp(row):
        e = summary[row].get("ForgetLP", {})
        return e["mean"] - summary["no_edit"]["ForgetLP"]["mean"] if e else float("nan")

    sweep = [r for r in summary if kinds.get(r) == "sweep"]
    fine = [r for r in sweep if r not in na and not collapsed[r]]
    best = min(fine, key=d_flp) if fine else None
    compare = [r for r in summary if kinds.get(r) == "compare" and "ForgetLP" in summary[r]]  # not an n/a row
    # TimeROME's rows meet the baseline's rule: one that collapses (the paper's point takes every answer down with
    # the forget ones) is not the one compared, however much it forgets (review 71: the radar credited it)
    unfit = [r for r in compare if collapsed.get(r)]
    held = [r for r in compare if r not in unfit]
    strongest = min(held, key=d_flp) if held else None
    head = ["configuration"] + COLUMNS + ["Δ ForgetLP (p)", "Δ RetainLP", "collapsed", "early-stopped", "kept step"]
    head += [header(c) for c in ACCOUNTING]
    lines = [f"## Converged training-time baseline ({len(sweep)} LoRA configurations, safe protocol)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, cols in summary.items():
        if row in na:  # the method cannot act on this model: every cell n/a, the reason under the table
            lines.append("| " + " | ".join([row] + [NOT_APPLICABLE] * (len(head) - 1)) + " |")
            continue
        ret = cols.get("RetainLP", {})
        st = stopped.get(row, [])
        lines.append("| " + " | ".join(
            [row] + [fmt_cell(cols.get(c)) for c in COLUMNS] + [delta_text(cols.get("ForgetLP", {})),
               f"{ret['delta']:+.2f}{ret['stars']}" if "delta" in ret else "–",
               "–" if row == "no_edit" or "ForgetLP" not in cols else f"{len(collapsed[row])}/{cols['ForgetLP']['n']}",
               f"{sum(s for s, _, _ in st)}/{len(st)}" if st else "–",
               ", ".join(f"{'–' if k is None else k}/{n}" for _, k, n in st) if st else "–"]
            + [fmt_cost(cols.get(c)) for c in ACCOUNTING]) + " |")
    n_collapsed = sum(bool(collapsed.get(r)) for r in sweep)
    verdict = (f"{n_collapsed}/{len(sweep)} configurations collapse (RetainLP more than {cfg['collapse']:g} nats below "
               f"no_edit on some seed). Best Δ ForgetLP without collapse: "
               + (f"{best}, {d_flp(best):+.2f} nats" if best else "none") + "."
               + (f" {strongest}: {d_flp(strongest):+.2f} nats" + _ratio(summary, strongest, best, d_flp) + "."
                  if strongest else "")
               + (f" Not compared, as {'it collapses' if len(unfit) == 1 else 'they collapse'} by the same rule: "
                  + ", ".join(f"{r} ({d_flp(r):+.2f} nats; collapsed on {len(collapsed[r])}/{summary[r]['ForgetLP']['n']} seeds)"
                              for r in unfit) + "." if unfit else ""))
    lines += ["", verdict, "", f"Δ: paired over seeds {list(seeds)} (stars: t-test vs no_edit). Training settings: "
              f"LoRA r={cfg['lora_r']}, the methods' other defaults (steps, batch, anchor, drift, checks: "
              "methods/_unlearn.py). Early-stopped: runs the safe protocol stopped; kept step / steps run per seed. "
              + ACCOUNTING_NOTE + (" " + not_applicable_note(na) if na else ""), ""]
    md = "\n".join(lines)
    radar = {}
    if best and strongest:
        b, t = summary[best], summary[strongest]
        radar = {"converged baseline": dict(value=-d_flp(strongest), comparator=-d_flp(best), higher_is_better=True,
                                            text=f"-Δ ForgetLP, {strongest} vs {best}"),
                 "install time": dict(value=t["install_seconds"]["mean"], comparator=b["install_seconds"]["mean"],
                                      higher_is_better=False, text="install seconds"),
                 "extra memory": dict(value=t["install_extra_mb"]["mean"], comparator=b["install_extra_mb"]["mean"],
                                      higher_is_better=False, text="extra peak MB while installing")}
    why_none = None if radar else (  # what the radar says of its missing axes, in the sweep's words
        "no baseline configuration held without collapse" if not best else
        f"every TimeROME row collapsed by the sweep's rule ({', '.join(unfit)})" if unfit else
        "no TimeROME row was measured")
    payload = dict(summary=summary, collapsed=collapsed, best=best, best_delta=d_flp(best) if best else None,
                   compare=strongest, kinds=kinds, early_stopped=stopped, not_applicable=na, config=cfg,
                   seeds=list(seeds), radar=radar, radar_missing=why_none)
    files = write_outputs(out_dir, NAME, payload, md)
    files["png"] = plot_sweep(summary, kinds, collapsed, out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files, collapsed=collapsed, best=best, verdict=verdict,
                not_applicable=na)


def plot_sweep(summary: dict, kinds: dict, collapsed: dict, path) -> str:
    """Δ ForgetLP (x) against Δ RetainLP (y) vs no_edit: every configuration, TimeROME, the unmitigated run."""
    fig = figure(6.4, 4.4)
    ax = fig.subplots()
    base = summary["no_edit"]
    style = {"sweep": ("tab:blue", "o"), "unmitigated": ("tab:red", "v"), "compare": ("tab:purple", "s")}
    seen = set()
    for row, cols in summary.items():
        kind = kinds.get(row)
        if kind not in style or "ForgetLP" not in cols or "RetainLP" not in cols:
            continue
        colour, marker = style[kind]
        x = cols["ForgetLP"]["mean"] - base["ForgetLP"]["mean"]
        y = cols["RetainLP"]["mean"] - base["RetainLP"]["mean"]
        tag = kind if kind != "compare" else row
        ax.scatter([x], [y], color=colour, marker="x" if collapsed.get(row) else marker,
                   label=None if tag in seen else ("LoRA-NPO / SimNPO (safe)" if kind == "sweep" else tag))
        seen.add(tag)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("Δ ForgetLP vs no_edit (nats, left = more forgotten)")
    ax.set_ylabel("Δ RetainLP vs no_edit (nats)")
    ax.set_title("Converged training-time baseline (x: collapsed)", fontsize=10)
    ax.legend(fontsize=7)
    return save_png(fig, path)

"""ablations: resid vs attn vs mlp; all steps vs one step; traced vs random vs last-layer coordinate
(paper Figure "radar", ablation axis).

MC log-likelihoods have no denoising step, so the one-step row is measured only along the greedy
denoising trajectory (Traj columns), where step k exists; every row has those too.
"""

from __future__ import annotations

from timerome.experiments.report import (by_row, coordinate_note, markdown, plot_canonical, summarise,
                                         traced_coordinate, write_outputs)
from timerome.experiments.runner import Cell

NAME = "ablations"
CONFIG = dict(n_mc=16, n_retain=40, n_world=20, forget="forget01", traj_steps=8, one_step=0, config={})
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "ForgetTrajLP", "RetainTrajLP"]


def plan(cfg, n_layers: int) -> list[tuple[str, str, dict]]:
    """(row, method, config overrides) of the design-space ablations."""
    base = dict(cfg["config"])
    return [
        ("no_edit", "no_edit", {}),
        ("resid, all steps, traced layer (TimeROME)", "timerome", base),
        ("attn at the traced layer", "timerome", dict(base, module="attn")),
        ("mlp at the traced layer", "timerome", dict(base, module="mlp")),
        (f"one step only (k={cfg['one_step']})", "timerome", dict(base, step=cfg["one_step"])),
        ("random layer / module", "random_layer", {k: v for k, v in base.items() if not k.startswith("trace")}),
        (f"last layer {n_layers - 1} resid", "timerome", dict(base, coordinate=[n_layers - 1, "resid"])),
    ]


def cells(cfg, seeds, ctx) -> list[Cell]:
    lp_data = dict(forget=cfg["forget"], n_retain=cfg["n_retain"], n_world=cfg["n_world"],
                   splits=["forget", "retain", "real_authors"])
    traj_data = dict(forget=cfg["forget"], n_retain=min(20, cfg["n_retain"]), splits=["forget", "retain"])
    out = []
    for seed in seeds:
        for row, method, over in plan(cfg, ctx.backbone.n_layers):
            if "step" not in over:  # an MC likelihood has no denoising step for a one-step edit to act at
                out.append(Cell("lp", method, over, seed, lp_data, dict(n_mc=cfg["n_mc"]), row=row))
            out.append(Cell("traj", method, over, seed, traj_data, dict(steps=cfg["traj_steps"]), row=row))
    return out


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summary = summarise(by_row(cells, results), COLUMNS)
    md = markdown(summary, COLUMNS, "Ablations", f"{coordinate_note(results)} Traj columns: log-likelihood read "
                  f"along the greedy denoising trajectory ({cfg['traj_steps']} steps max), the only place a "
                  "one-step edit exists.")
    files = write_outputs(out_dir, NAME, dict(summary=summary, config=cfg, coordinate=traced_coordinate(results)), md)
    files["png"] = plot_canonical(summary, out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files)

"""ablations: resid vs attn vs mlp; all steps vs one step; traced vs random vs last-layer coordinate;
and "AR positional", the memory where ROME's positional trace puts it (paper Figure "radar",
ablation axis; ablation row "AR positional").

MC log-likelihoods have no denoising step, so the one-step row is measured only along the greedy
denoising trajectory (Traj columns), where step k exists; every row has those too.

"AR positional" is the same memory installed at the coordinate of the AR protocol: ROME's positional
trace of the same validation facts (one forward, the answer fully masked on an MDLM), the MLP layer
with the largest mean effect at the last subject token (`positional_trace.select_positional`).
The report also draws `heatmap_compare.png`: that positional trace beside the TIE trace the
TimeROME rows are placed by (the paper's Figure "heatmap_compare"). On an autoregressive backbone
TIE does not exist: only the rows that need no TIE trace are run (no_edit, AR positional, random,
last layer), on the MC likelihood only (no denoising trajectory), and the figure is the positional
trace alone.

Beyond the paper, "TIE without the subject's echo": the same memory at the layer a TIE trace picks when
log p(object) leaves out the answer positions that repeat the subject's tokens (trace_read_positions
"no_subject", `tracing.tie.scored_positions`): whether the read-out, not the fact, places the edit.
"""

from __future__ import annotations

from timerome.engine.coordinate import given_step
from timerome.engine.settings import LIKELIHOOD, LOCALITY, TRACE
from timerome.errors import TimeromeError
from timerome.experiments.report import (by_row, coordinate_note, installed_info, markdown, not_applicable_rows,
                                         plot_canonical, summarise, traced_coordinate, write_outputs)
from timerome.experiments.runner import Cell
from timerome.methods.timerome_edit import TIE_ONLY

NAME = "ablations"
ORDER = 60
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, n_retain=LOCALITY.n_retain, n_world=LOCALITY.n_world, forget="forget01",
              traj_steps=TRACE.steps, one_step=0, config={})
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "ForgetTrajLP", "RetainTrajLP"]
# settings of the rows an autoregressive model has no denoising trajectory for: refused there when given, before the
# model loads where its checkpoint says so, else once it is loaded (experiments.refuse_unread_on_causal)
UNREAD_ON_CAUSAL = {"one_step": "one_step sets the one-step row, read along a denoising trajectory",
                    "traj_steps": "traj_steps sets the trajectory columns' denoising steps"}


AR_ROW = "AR positional (ROME's site: MLP at the last subject token)"
AR_CONFIG = dict(trace_kind="positional", select_modules=["mlp"])
ECHO_ROW = "resid, all steps, layer traced without the subject's echo (beyond the paper)"


def plan(cfg, n_layers: int, causal: bool = False) -> list[tuple[str, str, dict]]:
    """(row, method, config overrides) of the design-space ablations (those needing no TIE trace on
    an autoregressive backbone)."""
    base = dict(cfg["config"])
    if given_step(base.get("coordinate")) is not None:
        raise TimeromeError(f"ablations: the config's coordinate {base['coordinate']} has a step, and the ablations "
                            f"compare the steps themselves (every step against step {cfg['one_step']} only): give "
                            "the coordinate as [layer, point]")
    own = [k for k in ("step", "module") if k in base]
    if own:  # the rows kept their labels while every one of them edited at that step / module
        raise TimeromeError(f"ablations: the config gives {' and '.join(own)}, which the ablation rows set themselves "
                            "(every step against one_step, resid against attn and mlp): leave "
                            f"{'it' if len(own) == 1 else 'them'} out")
    steps = cfg.get("traj_steps", CONFIG["traj_steps"])
    if not causal and cfg["one_step"] >= steps:  # the row would be the unedited model's, labelled k=...
        raise TimeromeError(f"ablations: one_step {cfg['one_step']} is no step of the {steps}-step trajectories the "
                            f"rows are read along (0..{steps - 1}): give a step in that range, or more traj_steps")
    # the AR row is placed by ROME's positional trace: neither TIE's own settings nor a given coordinate applies
    positional = {k: v for k, v in base.items() if k not in (*TIE_ONLY, "coordinate")}
    untraced = {k: v for k, v in base.items() if not k.startswith(("trace", "select"))}  # a given coordinate
    rows = [
        ("no_edit", "no_edit", {}),
        ("resid, all steps, traced layer (TimeROME)", "timerome", base),
        ("attn at the traced layer", "timerome", dict(base, module="attn")),
        ("mlp at the traced layer", "timerome", dict(base, module="mlp")),
        (f"one step only (k={cfg['one_step']})", "timerome", dict(base, step=cfg["one_step"])),
        ("random layer / module", "random_layer", untraced),
        (f"last layer {n_layers - 1} resid", "timerome", dict(untraced, coordinate=[n_layers - 1, "resid"])),
        (AR_ROW, "timerome", dict(positional, **AR_CONFIG)),
    ]
    # the echo row where TimeROME's own row is placed by a TIE trace that reads the subject's echo
    if not base.get("coordinate") and base.get("trace_kind", "tie") == "tie" and \
            base.get("trace_read_positions", TRACE.read_positions) != "no_subject":
        rows.append((ECHO_ROW, "timerome", dict(base, trace_read_positions="no_subject")))
    if causal:
        rows = [r for r in rows if r[1] != "timerome" or r[2].get("coordinate") or r[2].get("trace_kind") == "positional"]
    return rows


def cells(cfg, seeds, ctx) -> list[Cell]:
    lp_data = dict(forget=cfg["forget"], n_retain=cfg["n_retain"], n_world=cfg["n_world"],
                   splits=["forget", "retain", "real_authors"])
    traj_data = dict(forget=cfg["forget"], n_retain=min(20, cfg["n_retain"]), splits=["forget", "retain"])
    out = []
    causal = getattr(ctx.backbone, "causal", False)  # its given one_step / traj_steps: refused by run_experiment
    for seed in seeds:
        for row, method, over in plan(cfg, ctx.backbone.n_layers, causal):
            if "step" not in over:  # an MC likelihood has no denoising step for a one-step edit to act at
                out.append(Cell("lp", method, over, seed, lp_data, dict(n_mc=cfg["n_mc"]), row=row))
            if not causal:  # an autoregressive model has no denoising trajectory
                out.append(Cell("traj", method, over, seed, traj_data, dict(steps=cfg["traj_steps"]), row=row))
    return out


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summary, na = summarise(by_row(cells, results), COLUMNS), not_applicable_rows(cells, results)
    md = markdown(summary, COLUMNS, "Ablations", f"{coordinate_note(results)}{positional_note(results)}"
                  f"{echo_note(cells, results)} Traj columns: "
                  "log-likelihood read "
                  f"along the greedy denoising trajectory ({cfg['traj_steps']} steps max), the only place a "
                  "one-step edit exists.", not_applicable=na)
    files = write_outputs(out_dir, NAME, dict(summary=summary, config=cfg, coordinate=traced_coordinate(results),
                                              not_applicable=na), md)
    files["png"] = plot_canonical(summary, out_dir / f"{NAME}.png")
    files["heatmap_compare"] = compare_figure(cfg, cells, ctx, out_dir)
    return dict(summary=summary, markdown=md, files=files, not_applicable=na)


def positional_note(results) -> str:
    """Where the AR row's memory sat (the positional trace's choice), for the table's note."""
    for r in results:
        info = r.get("info") or {}
        if info.get("coordinate_source") == "positional trace":
            return (f" AR positional coordinate: layer {info['layer']} {info['point']} (mean positional effect "
                    f"{info['positional_effect']:.3g} at the {info['category']}).")
    return ""


def echo_note(cells, results) -> str:
    """Where the no-echo row's memory sat (its trace's choice), for the table's note."""
    info = installed_info(cells, results, {ECHO_ROW}) or {}
    if info.get("coordinate_source") != "traced":
        return ""
    return (f" Traced without the subject's echo: layer {info['layer']} {info['point']} (mean |TIE| "
            f"{info['mean_abs_tie']:.3g} at step {info['traced_step']}).")


def compare_figure(cfg, cells, ctx, out_dir) -> str:
    """heatmap_compare.png: the positional trace the AR row was placed by beside the TIE trace of the
    TimeROME rows, on the same validation facts (both read from the method's trace cache); the
    positional trace alone on an autoregressive backbone."""
    from timerome.methods import method_config
    from timerome.methods.timerome_edit import positional_forget_set, trace_forget_set
    from timerome.tracing.heatmaps import plot_compare, plot_positional

    ar = next(c for c in cells if c.row == AR_ROW)
    _, task = ctx.data(ar.data)
    conf = method_config("timerome", ar.config)
    positional = positional_forget_set(ctx.backbone, task.validation_facts, conf)
    if getattr(ctx.backbone, "causal", False):
        return str(plot_positional(positional, out_dir / "heatmap_compare.png"))
    tie = trace_forget_set(ctx.backbone, task.validation_facts, method_config("timerome", cfg["config"]))
    return str(plot_compare(positional, tie, out_dir / "heatmap_compare.png"))

"""`timerome demo`: trace -> select -> edit -> evaluate, end to end, in minutes on a laptop CPU.

On the embedded model and corpus it
  1. traces 6 validation facts of forget01 (one author, 20 facts) and draws the TIE heatmaps,
  2. selects the coordinate (largest mean |TIE| in the residual stream),
  3. builds the edit memory on all 20 facts and evaluates no_edit and TimeROME on forget /
     retain / real-authors / world-facts over 3 seeds (n_mc = 8; the canonical experiment adds
     every other method, random_layer included),
  4. sweeps alpha for the forget/retain Pareto plot,
and prints the canonical table with bootstrap CIs and paired p-values against no_edit.

Budget (2 idle CPU cores): about 30 s, plus about 25 s the first time for the reference model
(README, "The demo", has the measured numbers). The reference (the model that never saw the forget author, for Forget Quality's KS test) is
the embedded recipe cut down to 30 of the 99 retain authors, 20 epochs at batch 32 (the full
recipe: 99 authors, 70 epochs at batch 64); it is trained once and cached in ~/.cache/timerome.
It has learnt the answer templates but knows the retain facts less well than a full reference,
which matters little here: the KS test compares truth ratios on the forget author, whom it never saw.
"""

from __future__ import annotations

import time
from pathlib import Path

from timerome.progress import progress_bar


DEMO = dict(n_mc=8, n_retain=20, n_world=10, trace_facts=6, reference_epochs=20, reference_authors=30,
            reference_batch=32, alphas=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0), seeds=(0, 1, 2))


DEMO_COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact", "ForgetTR", "RetainTR", "ForgetQuality",
                "ModelUtility", "ForgetROUGE", "RetainROUGE", "install_seconds"]


class Clock:
    """Wall and CPU seconds per phase (CPU time says what the run costs on an idle machine)."""

    def __init__(self):
        self.phases, self._t, self._c = {}, time.perf_counter(), time.process_time()

    def lap(self, name: str) -> None:
        t, c = time.perf_counter(), time.process_time()
        self.phases[name] = {"wall_s": round(t - self._t, 1), "cpu_s": round(c - self._c, 1)}
        self._t, self._c = t, c


def _say(msg: str) -> None:
    from rich.console import Console

    Console().print(msg)


def run_demo(out_dir=None, model=None, data: str = "embedded", *, seeds=None, reference=None,
             quick: bool = False, progress: bool = True, backbone=None) -> dict:
    """Run the demo; returns {"out_dir", "markdown", "summary", "files", "seconds"}.

    model: a checkpoint directory (None: the embedded model); data: "embedded", "tofu"
    ($TIMEROME_TOFU_DIR or the Hub) or a TOFU directory. reference: a checkpoint that never saw
    the forget set, for Forget Quality (the embedded model gets one trained automatically).
    backbone: `model` already loaded (e.g. on a GPU, in bfloat16); `model` still names it.
    quick: 2 seeds, fewer items, a one-point Pareto sweep and a barely trained reference (the
    tests' reduced demo: it exercises every step; its KS p-values mean nothing).
    """
    from timerome.experiments import (_warm_background, eval_data, label, make_setup, markdown, method_cell,
                                      reference_trs, summarise, traced_coordinate, write_outputs)

    clock = Clock()
    cfg = dict(DEMO)
    if quick:
        cfg.update(n_mc=4, n_retain=8, n_world=4, trace_facts=2, alphas=(6.0,), seeds=(0, 1),
                   reference_epochs=2, reference_authors=4)
    seeds = tuple(seeds or cfg["seeds"])
    out = Path(out_dir) if out_dir else Path(f"timerome-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    ref_opts = dict(epochs=cfg["reference_epochs"], n_authors=cfg["reference_authors"],
                    batch_size=cfg["reference_batch"])
    setup = make_setup(model, data, out, progress=progress, reference=reference, reference_options=ref_opts,
                       backbone=backbone)
    bb = setup.backbone
    _say(f"[bold]timerome demo[/] on {bb.name} ({bb.n_layers} layers, hidden {bb.hidden_size}), data: {data}")

    rows, task = eval_data(setup, "forget01", cfg["n_retain"], cfg["n_world"])
    _say(f"forget set: {len(task.facts)} facts; evaluation items: "
         + ", ".join(f"{k} {len(v)}" for k, v in rows.items()))
    clock.lap("load")
    files = _trace_and_plot(setup, task, cfg, out)
    trace_cfg = {"trace_facts": cfg["trace_facts"]}
    coord = traced_coordinate(setup, task, trace_cfg)
    _say(f"selected coordinate: layer {coord[0]} {coord[1]} (every denoising step)")
    _warm_background(setup, task, coord)
    clock.lap("trace + select")

    refs = {seed: reference_trs(setup, rows["forget"], cfg["n_mc"], seed) for seed in seeds}
    clock.lap("reference model")
    per = {}
    plan = (("no_edit", {}), ("timerome", {}))
    with progress_bar("edit + evaluate", total=len(plan) * len(seeds), enabled=setup.progress) as bar:
        for seed in seeds:
            for method, over in plan:
                conf = dict(over, coordinate=coord, **trace_cfg) if method == "timerome" else over
                res = method_cell(setup, method, conf, seed, rows, task, n_mc=cfg["n_mc"],
                                  reference=refs[seed], rouge=True)
                per.setdefault(label(method, over), {})[seed] = res["metrics"]
                bar.advance(description=f"edit + evaluate ({method}, seed {seed})")
    clock.lap("edit + evaluate")
    summary = summarise(per, DEMO_COLUMNS)
    note = (f"Embedded model, forget01 = 1 author x 20 facts, n_mc={cfg['n_mc']}, seeds {list(seeds)}; "
            f"TimeROME at layer {coord[0]} {coord[1]} with the `timerome` method's defaults. KS p uses a "
            f"cut-down reference model ({cfg['reference_authors']} retain authors, {cfg['reference_epochs']} epochs): "
            "see timerome.demo.")
    md = markdown(summary, DEMO_COLUMNS, "TimeROME demo: canonical forget01", note)

    if cfg["alphas"]:
        files["pareto"] = _pareto(setup, rows, task, coord, cfg, seeds, trace_cfg)
        clock.lap("pareto sweep")
    files.update(write_outputs(out, "demo", dict(summary=summary, coordinate=coord, config=cfg,
                                                 phases=clock.phases), md))
    _print_table(summary, DEMO_COLUMNS)
    secs = sum(p["wall_s"] for p in clock.phases.values())
    _say("phases: " + "; ".join(f"{k} {v['wall_s']:.0f}s (cpu {v['cpu_s']:.0f}s)" for k, v in clock.phases.items()))
    _say(f"wrote {', '.join(sorted(Path(f).name for f in files.values()))}")
    _say(f"[bold green]done in {secs:.0f}s; outputs in {out.resolve()}[/]")
    return dict(out_dir=str(out), markdown=md, summary=summary, files=files, seconds=secs, coordinate=coord,
                phases=clock.phases)


def _trace_and_plot(setup, task, cfg, out: Path) -> dict:
    from timerome.heatmaps import plot_heatmaps
    from timerome.methods import method_config
    from timerome.methods.timerome_edit import trace_forget_set

    conf = method_config("timerome", {"trace_facts": cfg["trace_facts"]})
    result = trace_forget_set(setup.backbone, task.facts, conf, progress=setup.progress)
    result.save(out / "trace.safetensors")
    files = {"heatmap": str(plot_heatmaps(result, out / "heatmap.png"))}
    files["heatmap_fact0"] = str(plot_heatmaps(result, out / "heatmap-fact0.png", fact=0))
    return files


def _pareto(setup, rows, task, coord, cfg, seeds, trace_cfg) -> str:
    from timerome.experiments import label, method_cell, plot_pareto, summarise

    sweep = [("timerome", {"alpha": a}) for a in cfg["alphas"]]
    per = {}
    plan = sweep + [("no_edit", {})]
    with progress_bar("pareto sweep", total=len(plan) * len(seeds), enabled=setup.progress) as bar:
        for seed in seeds:
            for method, over in plan:
                conf = dict(over, coordinate=coord, **trace_cfg) if method == "timerome" else over
                res = method_cell(setup, method, conf, seed, rows, task, kind="lp", n_mc=cfg["n_mc"])
                per.setdefault(label(method, over), {})[seed] = res["metrics"]
                bar.advance()
    summary = summarise(per, ["ForgetLP", "RetainLP"])
    return plot_pareto(summary, [label(m, o) for m, o in sweep], setup.out_dir / "pareto.png")


def _print_table(summary: dict, cols) -> None:
    from rich.console import Console
    from rich.table import Table

    from timerome.experiments import SHORT, delta_text, fmt_cell

    t = Table(title="canonical forget01 (mean ± std [95% bootstrap CI]; stars: paired t vs no_edit, † same on every seed)")
    t.add_column("method")
    for c in cols:
        t.add_column(SHORT.get(c, c), overflow="fold")
    t.add_column("Δ ForgetLP (p)")
    for row, c in summary.items():
        d = c.get("ForgetLP", {})
        delta = delta_text(d)
        t.add_row(row, *[fmt_cell(c.get(k), 3 if k in ("ForgetQuality", "ForgetTR", "ModelUtility") else 2)
                         for k in cols], delta)
    Console(width=200).print(t)

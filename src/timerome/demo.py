"""`timerome demo`: trace -> select -> edit -> evaluate, end to end, in minutes on a laptop CPU.

On the embedded model and corpus it
  1. traces 6 validation facts of forget01 (one author, 20 facts) and draws the TIE heatmaps,
  2. selects the coordinate (largest mean |TIE| in the residual stream),
  3. builds the edit memory on all 20 facts and evaluates no_edit, TimeROME and the rewrite memory
     (beyond the paper: the one that says "I don't know.") on forget / retain / real-authors /
     world-facts over 3 seeds (n_mc = 8; the canonical experiment adds every other method),
  4. sweeps alpha for the forget/retain Pareto plot,
and prints the canonical table with bootstrap CIs and paired p-values against no_edit.

Cost: a few minutes on a laptop CPU, most of a first run being the one-off reference model, read
from the cache afterwards (README, "The demo", gives the measured phases). The reference (the
model that never saw the forget author, for Forget Quality's KS test) is the embedded recipe cut
down to 30 of the 99 retain authors, 20 epochs at batch 32 (the full recipe: 99 authors, the shipped
weights' stage-1 schedule, 150 epochs at batch 64: training/default_model.py); it is trained once and
cached in ~/.cache/timerome.
It has learnt the answer templates but knows the retain facts less well than a full reference,
which matters little here: the KS test compares truth ratios on the forget author, whom it never saw.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from timerome.backbones import load_backbone
from timerome.backbones.loading import resolve_checkpoint
from timerome.common.checks import seeds as check_seeds
from timerome.common.files import drop_earlier, output_folder
from timerome.engine.settings import QUICK_LIKELIHOOD, SMALL_LOCALITY
from timerome.experiments import resolve_source
from timerome.experiments.report import (by_row, delta_text, fmt_cell, label, markdown, plot_pareto, reference_note,
                                         summarise, write_outputs)
from timerome.experiments.runner import Cell, Context, Runner
from timerome.methods import method_config
from timerome.methods.timerome_edit import select, trace_forget_set
from timerome.metrics.columns import digits, header
from timerome.tracing.heatmaps import plot_heatmaps

DEMO = dict(n_mc=8, n_retain=SMALL_LOCALITY.n_retain, n_world=SMALL_LOCALITY.n_world, trace_facts=6, reference_epochs=20, reference_authors=30,
            reference_batch=32, alphas=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0), seeds=(0, 1, 2))


# every file the demo writes in its folder (the cells' cache beside them is the Runner's)
OUTPUT_FILES = ("trace.safetensors", "trace.json", "heatmap.png", "heatmap-fact0.png", "pareto.png", "demo.json",
                "demo.md")
DEMO_COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact", "ForgetTR", "RetainTR", "ForgetQuality",
                "ModelUtility", "ForgetROUGE", "RetainROUGE", "Refusal", "Leak", "install_seconds"]


class Clock:
    """Wall and CPU seconds per phase (CPU time says what the run costs on an idle machine)."""

    def __init__(self):
        self.phases, self._t, self._c = {}, time.perf_counter(), time.process_time()

    def lap(self, name: str) -> None:
        t, c = time.perf_counter(), time.process_time()
        self.phases[name] = {"wall_s": round(t - self._t, 1), "cpu_s": round(c - self._c, 1)}
        self._t, self._c = t, c


def _say(msg: str) -> None:
    Console().print(msg)


def run_demo(out_dir=None, model=None, data: str = "embedded", *, seeds=None, reference=None,
             quick: bool = False, progress: bool = True, backbone=None) -> dict:
    """Run the demo; returns {"out_dir", "markdown", "summary", "files", "seconds", "coordinate", "phases"}.

    model: a checkpoint directory (None: the embedded model); data: "embedded", "tofu"
    ($TIMEROME_TOFU_DIR or the Hub) or a TOFU directory. reference: a checkpoint that never saw
    the forget set, for Forget Quality (the embedded model gets one trained automatically).
    backbone: `model` already loaded (e.g. on a GPU, in bfloat16); `model` still names it.
    quick: 2 seeds, fewer items, a one-point Pareto sweep and a barely trained reference (the
    tests' reduced demo: it exercises every step; its KS p-values mean nothing).
    """
    clock = Clock()
    cfg = dict(DEMO)
    if quick:
        cfg.update(n_mc=QUICK_LIKELIHOOD.n_mc, n_retain=8, n_world=4, trace_facts=2, alphas=(6.0,), seeds=(0, 1),
                   reference_epochs=2, reference_authors=4)
    seeds = check_seeds(cfg["seeds"] if seeds is None else seeds)
    out = Path(out_dir) if out_dir else Path(f"timerome-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    output_folder(out, "out_dir")  # a file in the way: refused before the trace, not after it
    if isinstance(reference, (str, os.PathLike)) and reference not in ("auto", "embedded", "train"):
        resolve_checkpoint(reference)  # a checkpoint that is not there: refused before the trace (its path alone)
    ref_opts = dict(epochs=cfg["reference_epochs"], n_authors=cfg["reference_authors"],
                    batch_size=cfg["reference_batch"])
    bb = backbone if backbone is not None else load_backbone(model)
    ctx = Context(bb, resolve_source(data), reference=reference, reference_options=ref_opts, model_path=model,
                  progress=progress)
    runner = Runner(out, progress=progress)
    _say(f"[bold]timerome demo[/] on {bb.name} ({bb.n_layers} layers, hidden {bb.hidden_size}), data: {data}")

    spec = dict(forget="forget01", n_retain=cfg["n_retain"], n_world=cfg["n_world"])
    rows, task = ctx.data(spec)
    _say(f"forget set: {len(task.facts)} facts; evaluation items: "
         + ", ".join(f"{k} {len(v)}" for k, v in rows.items()))
    clock.lap("load")
    edit_cfg = {"trace_facts": cfg["trace_facts"]}
    writes = {n for n in OUTPUT_FILES if n != "pareto.png" or cfg["alphas"]}
    files, coord = _trace_and_plot(bb, task, edit_cfg, out, progress, writes)
    _say(f"selected coordinate: {coord} (the largest mean |TIE| in the residual stream)")
    clock.lap("trace + select")

    refs = [Cell("reference", seed=s, data=spec, options=dict(n_mc=cfg["n_mc"]), row="reference") for s in seeds
            if ctx.auto_reference() is not None]
    runner.run(refs, ctx, "reference model")  # its own phase: trained once, then read from the cache
    clock.lap("reference model")
    # the paper's method, and the rewrite memory (beyond the paper): the one that says the target
    main = [Cell("full", m, over, s, spec, dict(n_mc=cfg["n_mc"], rouge=True), row=label(m, {}))
            for s in seeds for m, over in (("no_edit", {}), ("timerome", edit_cfg), ("rewrite", {}))]
    main_res = runner.run(refs + main, ctx, "edit + evaluate")
    clock.lap("edit + evaluate")
    summary = summarise(by_row(refs + main, main_res), DEMO_COLUMNS)
    note = (f"Embedded model, forget01 = 1 author x 20 facts, n_mc={cfg['n_mc']}, seeds {list(seeds)}; "
            f"TimeROME at {coord} with the `timerome` method's defaults but traced on {cfg['trace_facts']} facts (its default: "
            f"{method_config('timerome', {})['trace_facts']}). KS p uses a cut-down reference model "
            f"({cfg['reference_authors']} retain authors, {cfg['reference_epochs']} epochs): see timerome.demo. "
            + reference_note(refs + main))
    md = markdown(summary, DEMO_COLUMNS, "TimeROME demo: canonical forget01", note)

    if cfg["alphas"]:
        sweep = [("timerome", dict(edit_cfg, alpha=a)) for a in cfg["alphas"]] + [("no_edit", {})]
        pcells = [Cell("lp", m, over, s, spec, dict(n_mc=cfg["n_mc"]), row=label(m, {k: v for k, v in over.items()
                                                                                     if k == "alpha"}))
                  for s in seeds for m, over in sweep]
        psum = summarise(by_row(pcells, runner.run(pcells, ctx, "pareto sweep")), ["ForgetLP", "RetainLP"])
        files["pareto"] = plot_pareto(psum, {"TimeROME alpha sweep": [label("timerome", {"alpha": a})
                                                                      for a in cfg["alphas"]]}, out / "pareto.png")
        clock.lap("pareto sweep")
    files.update(write_outputs(out, "demo", dict(summary=summary, coordinate=[coord.layer, coord.point], config=cfg,
                                                 phases=clock.phases), md))
    _print_table(summary, DEMO_COLUMNS)
    secs = sum(p["wall_s"] for p in clock.phases.values())
    _say("phases: " + "; ".join(f"{k} {v['wall_s']:.0f}s (cpu {v['cpu_s']:.0f}s)" for k, v in clock.phases.items()))
    _say(f"wrote {', '.join(sorted(Path(f).name for f in files.values()))}")
    _say(f"[bold green]done in {secs:.0f}s; outputs in {out.resolve()}[/]")
    return dict(out_dir=str(out), markdown=md, summary=summary, files=files, seconds=secs,
                coordinate=[coord.layer, coord.point], phases=clock.phases)


def _trace_and_plot(bb, task, edit_cfg, out: Path, progress: bool, writes: set):
    """The method's own trace (cached), saved with its heatmaps; the box is the edited coordinate."""
    conf = method_config("timerome", edit_cfg)
    result = trace_forget_set(bb, task.validation_facts, conf, progress=progress)
    # an earlier demo's outputs go before this one's are written: a demo stopped after its trace left the
    # earlier table and plots beside the new trace, as if they were this run's (its cells stay cached)
    drop_earlier(out, [out / n for n in OUTPUT_FILES], writes)
    path = result.save(out / "trace.safetensors")
    chosen = select(result, conf["select_modules"])
    files = dict(result.files(path), heatmap=str(plot_heatmaps(result, out / "heatmap.png", selected=chosen)))
    files["heatmap_fact0"] = str(plot_heatmaps(result, out / "heatmap-fact0.png", fact=0))
    return files, chosen.edit_coordinate


def _print_table(summary: dict, cols) -> None:
    t = Table(title="canonical forget01 (mean ± std [95% bootstrap CI]; stars: paired t vs no_edit, † same on every seed)")
    t.add_column("method")
    for c in cols:
        t.add_column(header(c), overflow="fold")
    t.add_column("Δ ForgetLP (p)")
    for row, c in summary.items():
        d = c.get("ForgetLP", {})
        delta = delta_text(d)
        t.add_row(row, *[fmt_cell(c.get(k), digits(k)) for k in cols], delta)
    Console(width=200).print(t)

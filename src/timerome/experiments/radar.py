"""radar: the paper's consolidated figure, drawn from the other experiments' outputs (no cells of
its own): the converged training-time baseline, the cost (install time, extra memory), the
ablations, robustness and general utility (paper Figure "radar").

Each axis compares TimeROME with that analysis' comparator as a share, value / (value + comparator)
for a higher-is-better quantity (comparator / (value + comparator) for a cost), both clipped at 0:
0.5 is parity, 1 is all TimeROME, 0 all the comparator. The raw numbers are in the axis labels and
the table. Sources, read from `runs` (default: the folder above the radar's own output folder, as
`timerome experiment all` lays them out):
    npo_sweep/npo_sweep.json   converged baseline, install time, extra memory (its "radar" entries)
    ablations/ablations.json   -Δ ForgetLP of the traced resid / all-steps edit vs the best other design,
                               but one that forgets more only with a clearly lower RetainLP (bootstrap CIs
                               apart: the paper's random layer "over-forgets"; the table names it)
    robustness/robustness.json its "radar" entry: 1 - worst-case extraction, TimeROME vs the method with
                               the lowest worst case, but one lower than ours only with a clearly lower
                               locality (else the share of the forgetting kept under paraphrase / relearning)
    utility/utility.json       mean lm-eval score of the operating point scoring lowest vs no_edit
An axis whose experiment has not been run is left out, and the figure says so.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from timerome.common.checks import is_real, shown
from timerome.common.files import read_json
from timerome.errors import TimeromeError
from timerome.experiments.ablations import ECHO_ROW
from timerome.experiments.report import best_comparable, figure, save_png, write_outputs

NAME = "radar"
ORDER = 130  # where it stands in listings and in `all` (radar last: it reads the others' outputs)
CONFIG = dict(runs=None)
READS_OUTPUTS = True  # no model, no cells: run_experiment refuses a model or reference given to it
AXES = (("converged baseline", "npo_sweep"), ("install time", "npo_sweep"), ("extra memory", "npo_sweep"),
        ("ablations", "ablations"), ("robustness", "robustness"), ("utility", "utility"))
ABLATED = "resid, all steps, traced layer (TimeROME)"  # ablations' row of the paper's design
VARIANTS = (ECHO_ROW,)  # the paper's design with another trace read-out: not another design to compare it with
COST = "RetainLP"  # a design that forgets more with a clearly lower retain breaks more (the paper: random layer
                   # "over-forgets"), so it is no comparator (report.best_comparable)


def cells(cfg, seeds, ctx) -> list:
    return []


def share(value: float, comparator: float, higher_is_better: bool) -> float:
    """value / (value + comparator) (comparator / (...) for a cost), clipped at 0; 0.5 when both are 0."""
    a, b = max(float(value), 0.0), max(float(comparator), 0.0)
    if a + b == 0:
        return 0.5
    return a / (a + b) if higher_is_better else b / (a + b)


def ablation_axis(saved: dict) -> dict | None:
    """-Δ ForgetLP of the paper's design against the best other design of the ablations, but one that
    forgets more only with a clearly lower RetainLP (`report.best_comparable`, named in the text)."""
    s = saved.get("summary", {})
    base = s.get("no_edit", {}).get("ForgetLP")
    if base is None or ABLATED not in s:
        return None
    # a mean the JSON holds as null (not a number: standard JSON has no NaN) is no design to compare
    drop = {r: base["mean"] - c["ForgetLP"]["mean"] for r, c in s.items()
            if r != "no_edit" and is_real(c.get("ForgetLP", {}).get("mean")) and is_real(base.get("mean"))}
    if ABLATED not in drop:
        return None
    others = {r: v for r, v in drop.items() if r != ABLATED and r not in VARIANTS}
    if not others:
        return None
    best, comparator, aside = best_comparable(others, drop[ABLATED], {r: s[r].get(COST) for r in others},
                                              s[ABLATED].get(COST), COST)
    return dict(value=drop[ABLATED], comparator=comparator, higher_is_better=True,
                text=f"-Δ ForgetLP, traced resid all steps vs {best or 'no design keeping as much ' + COST}{aside}")


def read_axes(runs: Path) -> tuple[dict, dict]:
    """({axis: entry}, {axis: why it is missing}) from the experiments' JSON files under `runs`."""
    found, missing = {}, {}
    for axis, source in AXES:
        path = runs / source / f"{source}.json"
        if not path.is_file():
            missing[axis] = f"not run: timerome experiment {source} -o {runs / source}"
            continue
        saved = read_json(path, "the experiment's results", finite=False)  # its NaN were written as null
        entry = ablation_axis(saved) if source == "ablations" else (saved.get("radar") or {}).get(axis)
        if entry is None:  # the run may say why (npo_sweep: no comparison held)
            why = saved.get("radar_missing") if isinstance(saved, dict) else None
            missing[axis] = f"{path} has no {axis!r} entry" + (f": {why}" if isinstance(why, str) and why else "")
        elif not (is_real(entry.get("value")) and is_real(entry.get("comparator"))):
            missing[axis] = f"{path}'s {axis!r} entry has no number (null: it was not a finite value)"
        else:
            found[axis] = dict(entry, source=str(path), run=saved.get("run"),
                               share=share(entry["value"], entry["comparator"], entry["higher_is_better"]))
    return found, missing


def check(cfg, source) -> None:
    """Before anything is written: a `runs` given must be a folder (a file, a blank or a path that is not there
    gave every axis "not run", with hints to write into it)."""
    runs = cfg["runs"]
    if runs is None:
        return
    if not isinstance(runs, str) or not runs.strip():
        raise TimeromeError(f"experiment 'radar': setting runs must be the folder holding the experiments' output "
                            f"folders (or null: the folder above the radar's own), got {shown(runs)}")
    if not Path(runs).is_dir():
        raise TimeromeError(f"experiment 'radar': runs {runs} " + ("is a file" if Path(runs).exists() else
                                                                    "does not exist")
                            + ": give the folder holding canonical/, robustness/, ... (each `timerome experiment "
                            "NAME -o RUNS/NAME`)")


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    runs = Path(cfg["runs"]) if cfg["runs"] else Path(out_dir).resolve().parent
    found, missing = read_axes(runs)
    lines = ["## Consolidated overview (radar)", "", "| axis | TimeROME | comparator | share | what | source |",
             "|---|---|---|---|---|---|"]
    for axis, e in found.items():
        lines.append(f"| {axis} | {e['value']:.3g} | {e['comparator']:.3g} | {e['share']:.2f} | {e['text']} | "
                     f"{e['source']} |")
    for axis, why in missing.items():
        lines.append(f"| {axis} | – | – | – | {why} | – |")
    lines += ["", "share = TimeROME / (TimeROME + comparator) for a higher-is-better quantity, comparator / (sum) for a "
              "cost; 0.5 is parity.", ""]
    lines += provenance(found)
    md = "\n".join(lines)
    files = write_outputs(out_dir, NAME, dict(axes=found, missing=missing, runs=str(runs)), md)
    files["png"] = plot_radar(found, missing, Path(out_dir) / f"{NAME}.png")
    return dict(axes=found, missing=missing, markdown=md, files=files)


def run_text(run: dict | None) -> str:
    """A source run as the radar names it: its model, weights and seeds, or that its output does not say."""
    if not run:
        return "not recorded (an output written before runs were recorded)"
    return f"{run.get('model')} (weights {str(run.get('fingerprint'))[:12]}), seeds {run.get('seeds')}"


def provenance(found: dict) -> list[str]:
    """Markdown lines naming the run behind each source, and a warning when they are not one model's."""
    runs = {e["source"]: e.get("run") for e in found.values()}
    if not runs:
        return []
    lines = ["Sources: " + "; ".join(f"{Path(src).parent.name}: {run_text(run)}" for src, run in runs.items()) + "."]
    models = {(r or {}).get("fingerprint") for r in runs.values()}
    seeds = {tuple((r or {}).get("seeds") or ()) for r in runs.values()}
    if len(models) > 1 or len(seeds) > 1 or None in models:
        lines.append("**The axes come from runs of different models or seeds (or runs that do not say which): "
                     "compare them with care.**")
    return lines + [""]


def plot_radar(found: dict, missing: dict, path) -> str:
    fig = figure(6.4, 6.0)
    ax = fig.add_subplot(projection="polar")
    names = list(found)
    if names:
        angles = np.linspace(0, 2 * np.pi, len(names), endpoint=False).tolist()
        vals = [found[n]["share"] for n in names]
        ax.plot(angles + angles[:1], vals + vals[:1], "-o", color="tab:purple", label="TimeROME")
        ax.fill(angles + angles[:1], vals + vals[:1], color="tab:purple", alpha=0.2)
        ax.plot(np.linspace(0, 2 * np.pi, 100), [0.5] * 100, "--", color="grey", lw=0.8, label="parity")
        ax.set_xticks(angles, [f"{n}\n{found[n]['value']:.3g} vs {found[n]['comparator']:.3g}" for n in names],
                      fontsize=7)
        ax.tick_params(axis="x", pad=10)
        for text, angle in zip(ax.get_xticklabels(), angles):  # side labels grow away from the circle
            c = np.cos(angle)
            text.set_horizontalalignment("left" if c > 0.1 else "right" if c < -0.1 else "center")
        ax.legend(fontsize=7, loc="upper right", bbox_to_anchor=(1.12, 1.12))
    ax.set_ylim(0, 1)
    ax.set_yticks([0.25, 0.5, 0.75], ["0.25", "0.5", "0.75"], fontsize=6)
    if missing:
        note = "not shown: " + "; ".join(f"{a} ({w})" for a, w in missing.items())
        fig.supxlabel(textwrap.fill(note, 120), fontsize=6)
    ax.set_title("TimeROME across analyses (share vs comparator)", fontsize=10)
    return save_png(fig, path)

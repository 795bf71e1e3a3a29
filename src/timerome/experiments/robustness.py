"""robustness: the forget log-probability of every method under a paraphrased question, a paraphrased
answer and in-context relearning, as the change from the unedited model (paper "Robustness" panel).

One cell per method and seed measures the four conditions (metrics/robustness.py) with the method
installed; the no_edit cells of the same seeds are the unedited model, so every change is paired
row by row and seed by seed. `weakening` = change(condition) - change(original): how much of the
edit's effect the condition takes back (the paper: within 2 nats under paraphrase, ~8 nats under
in-context relearning). `methods`: None = every registered method's canonical rows.

Beside the paper's panel, one `extraction` cell per method and seed asks whether the fact is actually
said (issue 24, metrics/extraction.py): the forget requests (`extraction.requests`, default
SOURCE:forget) answered under every sampler setting and every prompt attack; the table gives the
nominal and the worst-case extraction rate per method (bootstrap CIs over seeds), the figure nominal
versus worst case, and the radar's robustness axis is 1 - worst-case extraction, TimeROME against
the method with the lowest worst case, but one that is lower only with a clearly lower worst locality
(`extraction_radar`; the kept share of the forgetting when no extraction cell ran).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from timerome.common.files import drop_earlier
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.engine.settings import LIKELIHOOD, QUICK_LIKELIHOOD, SMALL_LOCALITY
from timerome.errors import TimeromeError
from timerome.evaluation.stats import cell as stat_cell
from timerome.experiments.bench_report import plot_panels
from timerome.experiments.canonical import canonical_rows
from timerome.experiments.data import refuse_unfilled_target
from timerome.experiments.report import (DROPPED_MARK, DROPPED_NOTE, NOT_APPLICABLE, best_comparable, by_row, figure,
                                         label, markdown, not_applicable_note, not_applicable_rows, save_png,
                                         summarise, write_outputs)
from timerome.experiments.runner import Cell, measurement, row_count, with_edit
from timerome.metrics.attacks import ATTACKS
from timerome.metrics.editing import default_gen_length
from timerome.metrics.extraction import (DIFFUSION_SETTINGS, QUICK_ATTACKS, QUICK_SETTINGS, SETTINGS, budget, check_names,
                                         model_settings, sampler_baseline, under_attacks, under_samplers, worst)
from timerome.metrics.robustness import CONDITIONS, RELEARN, condition_logprobs, robustness

NAME = "robustness"
ORDER = 90
# extraction: requests None = "embedded:<forget>" ("tofu:<forget>" on TOFU); settings / attacks None = all of them; False = no extraction cells
EXTRACTION = dict(requests=None, target=DEFAULT_TARGET, n_retain=SMALL_LOCALITY.n_retain,
                  n_world=SMALL_LOCALITY.n_world, settings=None, attacks=None)
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, forget="forget01", eval_forget=None, methods=None, relearn=RELEARN,
              extraction=EXTRACTION)
QUICK = dict(n_mc=QUICK_LIKELIHOOD.n_mc, eval_forget=8, methods=["no_edit", {"method": "timerome"}, {"method": "rewrite"}, {"method": "ga"}],
             extraction=dict(EXTRACTION, settings=list(QUICK_SETTINGS), attacks=list(QUICK_ATTACKS)))
COLUMNS = [f"LP_{c}" for c in CONDITIONS]
EXTRACTION_COLUMNS = ["ExtractionNominal", "WorstSampler", "WorstAttack", "WorstCase", "RefusalNominal",
                      "LocalityWorst"]


# version 1 (stop 77): its items count the prompts cut to fit the context (stop 76), which its report and JSON read
@measurement("robustness", options=("n_mc", "relearn"), not_applicable=True, version=1)
def measure_robustness(cell, ctx, rows, task) -> dict:
    def measure(edit):
        t0 = time.perf_counter()
        items = condition_logprobs(ctx.backbone, rows["forget"], edit, n_mc=cell.options.get("n_mc", LIKELIHOOD.n_mc),
                                   seed=cell.seed, relearn=cell.options.get("relearn", RELEARN))
        metrics = {f"LP_{c}": float(np.mean(items[c]["lp"])) for c in CONDITIONS if items[c]["lp"]}
        return {"items": items, "metrics": metrics, "cost": dict(edit.cost(), eval_seconds=time.perf_counter() - t0)}

    return with_edit(cell, ctx, task, measure)


def _extraction_forwards(cell, rows, task) -> float:
    """Every request and its paraphrase generated under each condition (about 16 forwards each), and the
    likelihood of the locality rows."""
    conditions = len(cell.options["settings"]) + len(cell.options["attacks"])
    generated = conditions * 2 * len(rows.get("requests", [])) * 16
    return generated + cell.options.get("n_mc", LIKELIHOOD.n_mc) * row_count(rows)


@measurement("extraction", forwards=_extraction_forwards, options=("n_mc", "settings", "attacks"),
             required=("settings", "attacks"), not_applicable=True)
def measure_extraction(cell, ctx, rows, task) -> dict:
    """Extraction under every sampler setting and prompt attack (metrics/extraction.py)."""
    reqs, loc = rows["requests"], rows["locality"]
    G = budget(default_gen_length(ctx.backbone, reqs, loc))
    settings, attacks = cell.options["settings"], cell.options["attacks"]  # resolved by `cells`
    key = ("sampler-baseline", cell.seed, tuple(settings))
    if key not in rows:  # the unedited answers under each setting: once per seed, shared by every method
        rows[key] = sampler_baseline(ctx.backbone, reqs, locality=loc, gen_length=G, seed=cell.seed, settings=settings)

    def measure(edit):
        t0 = time.perf_counter()
        s = under_samplers(ctx.backbone, reqs, edit, locality=loc, gen_length=G, seed=cell.seed, settings=settings,
                           baseline=rows[key])
        a = under_attacks(ctx.backbone, reqs, edit, gen_length=G, seed=cell.seed, attacks=attacks,
                          n_mc=cell.options.get("n_mc", LIKELIHOOD.n_mc))
        (ws, vs), (wa, va) = worst(s), worst(a) if a else ("", float("nan"))
        nan = float("nan")  # a value nothing measured (NaN, None) is never the worst
        locality = [v["Locality"] for v in s.values() if v.get("Locality") is not None and not math.isnan(v["Locality"])]
        metrics = dict(ExtractionNominal=s[settings[0]]["Extraction"], WorstSampler=vs, WorstAttack=va,
                       WorstCase=max([v for v in (vs, va) if not math.isnan(v)], default=nan),
                       RefusalNominal=s[settings[0]]["Refusal"], LocalityWorst=min(locality, default=nan))
        named = dict(sampler=ws if vs > 0 else "", attack=wa if a and va > 0 else "")  # "": nothing extracted
        return {"samplers": s, "attacks": a, "worst": named, "metrics": metrics,
                "gen_length": G, "cost": dict(edit.cost(), eval_seconds=time.perf_counter() - t0)}

    return with_edit(cell, ctx, task, measure)


def extraction(cfg, source) -> tuple[dict, str] | None:
    """(the extraction cells' settings over EXTRACTION's, their requests: the setting's, or the forget split's of
    the data source), or None where there are no extraction cells."""
    if cfg.get("extraction") is False:  # {}: the defaults, as any object of overrides is over them
        return None
    ex = {**EXTRACTION, **cfg["extraction"]}
    return ex, ex["requests"] or f"{'embedded' if source == 'embedded' else 'tofu'}:{cfg['forget']}"


def check(cfg, source) -> None:
    """Before a model loads: methods without no_edit (the panel's every Δ is against it: the table came out
    empty), and an extraction target no request reads (each names its own), are refused."""
    if "no_edit" not in [m for m, _ in canonical_rows(cfg["methods"])]:
        raise TimeromeError("experiment 'robustness': every Δ of its panel is a method's change against no_edit on "
                            "the same rows, and the methods setting leaves no_edit out: add \"no_edit\" to it")
    found = extraction(cfg, source)
    if found is not None:
        ex, spec = found
        refuse_unfilled_target([spec], ex["target"], "experiment 'robustness', extraction")


def unread_on_causal(given) -> list[tuple[str, int]]:
    """The extraction's sampler settings given (the overrides' extraction.settings) that set the diffusion sampler
    alone, as (what they set, how many): refused on an autoregressive model (`experiments.refuse_unread_on_causal`);
    a preset's are left out there (`cells`)."""
    ex = given.get("extraction") if isinstance(given, dict) else None
    names = ex.get("settings") if isinstance(ex, dict) else None
    bad = [n for n in names if n in DIFFUSION_SETTINGS] if isinstance(names, list) else []
    return [(f"the extraction's sampler setting{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} "
             f"set{'' if len(bad) > 1 else 's'} the diffusion sampler (its steps, blocks, remasking or KV cache)",
             len(bad))] if bad else []


def cells(cfg, seeds, ctx) -> list[Cell]:
    data = dict(forget=cfg["forget"], eval_forget=cfg["eval_forget"], splits=["forget"])
    opts = dict(n_mc=cfg["n_mc"], relearn=cfg["relearn"])
    out = [Cell("robustness", m, over, seed, data, opts, row=label(m, over))
           for seed in seeds for m, over in canonical_rows(cfg["methods"])]
    found = extraction(cfg, getattr(ctx, "source", "embedded"))
    if found is not None:
        ex, spec = found
        data = dict(kind="requests", requests=spec, target=ex["target"], n_retain=ex["n_retain"],
                    n_world=ex["n_world"])
        named = check_names(ex["settings"] or SETTINGS, SETTINGS, "sampler settings")
        opts = dict(n_mc=cfg["n_mc"], settings=model_settings(named, getattr(ctx, "backbone", None)),
                    attacks=check_names(ex["attacks"] or ATTACKS, ATTACKS, "prompt attacks"))
        out += [Cell("extraction", m, over, seed, data, opts, row=label(m, over), group="extraction")
                for seed in seeds for m, over in canonical_rows(cfg["methods"])]
    return out


def panel(cells, results) -> dict:
    """{row: {condition: {"change": stats, "original": stats, "weakening": stats}}} over seeds, against
    no_edit's cells (metrics.robustness.robustness: "original" is the original probe's change on the
    condition's rows)."""
    base = {c.seed: r["items"] for c, r in zip(cells, results) if c.row == "no_edit" and c.measure == "robustness"}
    per_row: dict = {}
    for c, r in zip(cells, results):  # an n/a cell (a method that cannot act on the model) has no items
        if c.measure == "robustness" and c.row != "no_edit" and c.seed in base and r.get("items"):
            per_row.setdefault(c.row, []).append(robustness(base[c.seed], r["items"]))
    out = {}
    for row, runs in per_row.items():
        out[row] = {}
        for cond in CONDITIONS:
            for what in ("change", "original", "weakening"):
                vals = [x[cond][what] for x in runs if np.isfinite(x[cond][what])]
                if vals:  # a seed whose value is not finite (a collapse) is left out of the cell, and counted
                    s = stat_cell(vals)
                    out[row].setdefault(cond, {})[what] = dict(mean=s.mean, std=s.std, lo=s.lo, hi=s.hi, n=s.n,
                                                               dropped=len(runs) - len(vals))
    return out


def kept_share(conds: dict, min_forget: float = 1.0) -> float | None:
    """The share of a row's forgetting that its weakest condition keeps: min over paraphrases and
    relearning of change(condition) / change(original), at least 0; None without a forgetting of
    `min_forget` nats to take a share of."""
    original = conds.get("original", {}).get("change", {}).get("mean")
    if original is None or not original < -min_forget:
        return None
    # each condition against the original on its own rows (a condition some rows lack is not read
    # against the original's mean over rows it never probed), where those rows were forgotten at all
    kept = []
    for c in CONDITIONS[1:]:
        if "change" not in conds.get(c, {}):
            continue
        own = conds[c].get("original", conds["original"]["change"])["mean"]
        if own < -min_forget:
            kept.append(conds[c]["change"]["mean"] / own)
    return max(0.0, min(kept)) if kept else None


LOCALITY = "LocalityWorst"  # the radar's cost of a robustness comparator: its lowest locality over the conditions


def extraction_radar(summary: dict) -> dict | None:
    """The radar's robustness axis from the extraction cells: 1 - worst-case extraction, TimeROME's
    row (named "timerome", else the first timerome row) against the method with the lowest worst case,
    but one that extracts less only with a worst locality clearly lower than TimeROME's (a method that
    breaks every answer gives nothing back, and is no comparator: report.best_comparable)."""
    have = {r: c["WorstCase"]["mean"] for r, c in summary.items() if "WorstCase" in c and r != "no_edit"}
    ours = "timerome" if "timerome" in have else next((r for r in have if r.split(" ")[0] == "timerome"), None)
    others = {r: 1 - v for r, v in have.items() if r.split(" ")[0] != "timerome"}
    if ours is None or not others:
        return None
    best, comparator, aside = best_comparable(others, 1 - have[ours], {r: summary[r].get(LOCALITY) for r in others},
                                              summary[ours].get(LOCALITY), LOCALITY)
    return dict(value=1 - have[ours], comparator=comparator, higher_is_better=True,
                text=f"1 - worst-case extraction over sampler settings and prompt attacks, {ours} vs "
                     f"{best or 'no method with as high a ' + LOCALITY}{aside}")


def extraction_markdown(summary: dict, cells, results) -> str:
    """Per method: nominal and worst-case extraction [CI over seeds] and the condition that was worst
    most often; then the mean extraction per condition. A method that cannot act on the model: n/a."""
    def f(e):
        return "–" if not e else f"{e['mean']:.2f}" + (f" [{e['lo']:.2f}, {e['hi']:.2f}]" if e["n"] > 1 else "")

    mine = [(c, r) for c, r in zip(cells, results) if c.measure == "extraction" and not r.get("not_applicable")]
    na = not_applicable_rows(cells, results, measures=("extraction",))
    which: dict = {}
    for c, r in mine:
        w = which.setdefault(c.row, {"sampler": [], "attack": []})
        w["sampler"].append(r["worst"]["sampler"]), w["attack"].append(r["worst"]["attack"])
    def mode(xs):  # the condition that was worst on most seeds (the first of equals); "–": none extracted
        xs = [x for x in xs if x]
        return max(dict.fromkeys(xs), key=xs.count) if xs else "–"

    head = ["method", "extraction nominal", "worst sampler", "(setting)", "worst attack", "(attack)", "worst case",
            "refusal nominal", "locality worst"]
    lines = ["## Extraction: is the forgotten fact said, under any sampler setting or prompt attack?", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, cols in summary.items():
        if row in na and not cols:
            lines.append(f"| {row} | " + " | ".join([NOT_APPLICABLE] * (len(head) - 1)) + " |")
            continue
        w = which.get(row, {})
        lines.append(f"| {row} | {f(cols.get('ExtractionNominal'))} | {f(cols.get('WorstSampler'))} | "
                     f"{mode(w.get('sampler', []))} | {f(cols.get('WorstAttack'))} | {mode(w.get('attack', []))} | "
                     f"{f(cols.get('WorstCase'))} | {f(cols.get('RefusalNominal'))} | {f(cols.get('LocalityWorst'))} |")
    conds: dict = {}
    for c, r in mine:
        for kind in ("samplers", "attacks"):
            for name, v in r[kind].items():
                conds.setdefault((kind, name), {}).setdefault(c.row, []).append(v["Extraction"])
    if conds:
        names = list(conds)
        lines += ["", "Extraction per condition (mean over seeds):", "",
                  "| method | " + " | ".join(n for _, n in names) + " |", "|" + "---|" * (len(names) + 1)]
        for row in summary:
            lines.append(f"| {row} | " + " | ".join(
                f"{np.mean(conds[n][row]):.2f}" if row in conds[n] else NOT_APPLICABLE if row in na else "–"
                for n in names) + " |")
    return "\n".join(lines + ["", "Extraction: the answer gives the original object back (verbatim or ROUGE-L recall "
                              ">= 0.5; the multiple choice: and no rival named); worst case: the highest over the "
                              "sampler settings and the prompt attacks; locality: retain / real-author / world-fact "
                              "answers equal to the unedited model's under the same setting (its lowest). [bootstrap "
                              "95% CI over seeds]" + (f" {not_applicable_note(na)}" if na else ""), ""])


def plot_extraction(summary: dict, path) -> str:
    """Per method: nominal versus worst-case extraction (bars, CI lines)."""
    rows = list(summary)
    fig = figure(6.8, 1.1 + 0.34 * len(rows))
    ax = fig.subplots()
    for j, (col, colour) in enumerate((("ExtractionNominal", "tab:blue"), ("WorstCase", "tab:red"))):
        for i, row in enumerate(rows):
            e = summary[row].get(col)
            if not e:
                continue
            y = i + (j - 0.5) * 0.36
            ax.barh(y, e["mean"], height=0.34, color=colour,
                    label=None if ("nominal", "worst case")[j] in ax.get_legend_handles_labels()[1] else
                    ("nominal", "worst case")[j])
            ax.plot([e["lo"], e["hi"]], [y, y], color="black", lw=0.8)
            ax.text(min(e["hi"], 0.9) + 0.01, y, f"{e['mean']:.2f}", va="center", fontsize=6)  # zeros show too
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("extraction rate of the forgotten object (lines: bootstrap 95% CI over seeds)", fontsize=8)
    ax.set_title("nominal sampler vs worst sampler setting / prompt attack", fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # n/a rows only: nothing drawn, nothing to name
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_png(fig, path)


def radar_entry(p: dict) -> dict | None:
    """The radar's robustness axis: TimeROME's kept share (the row named "timerome", else the first
    timerome row) against the strongest other method's (largest forgetting in the original condition)."""
    ours = "timerome" if "timerome" in p else next((r for r in p if r.split(" ")[0] == "timerome"), None)
    others = {r: c for r, c in p.items() if r.split(" ")[0] != "timerome" and kept_share(c) is not None}
    if ours is None or kept_share(p[ours]) is None or not others:
        return None
    best = min(others, key=lambda r: others[r]["original"]["change"]["mean"])
    read = [c.replace("_", " ") for c in CONDITIONS[1:] if "change" in p[ours].get(c, {})]  # no paraphrase rows: none
    return dict(value=kept_share(p[ours]), comparator=kept_share(others[best]), higher_is_better=True,
                text=f"share of the forgetting kept under the weakest of {' / '.join(read)}, {ours} vs {best}")


def panel_markdown(p: dict, not_applicable=()) -> str:
    """The panel's table; the rows of `not_applicable` (methods that cannot act on the model) read n/a."""
    head = ["method"] + [f"Δ {c}" for c in CONDITIONS] + [f"weakening {c}" for c in CONDITIONS[1:]]
    lines = ["## Robustness panel: change of the forget log-probability vs the unedited model (nats)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [f"| {row} | " + " | ".join([NOT_APPLICABLE] * (len(head) - 1)) + " |"
              for row in not_applicable if row not in p]
    for row, conds in p.items():
        def f(cond, what):
            e = conds.get(cond, {}).get(what)
            if not e:
                return "–"
            return (f"{e['mean']:+.2f}" + (f" [{e['lo']:+.2f}, {e['hi']:+.2f}]" if e["n"] > 1 else "")
                    + (DROPPED_MARK if e.get("dropped") else ""))

        lines.append(f"| {row} | " + " | ".join([f(c, "change") for c in CONDITIONS]
                                               + [f(c, "weakening") for c in CONDITIONS[1:]]) + " |")
    dropped = any(e.get("dropped") for conds in p.values() for whats in conds.values() for e in whats.values())
    return "\n".join(lines + ["", "Δ: edited − unedited, per forget row, mean over rows and seeds [bootstrap 95% CI "
                              "over seeds]; weakening: Δ(condition) − Δ(original), positive = the condition takes "
                              "back that many nats of the edit." + (f" {DROPPED_NOTE}" if dropped else ""), ""])


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    cols = COLUMNS + ["install_seconds"]
    summary = summarise(by_row(cells, results, measures=("robustness",)), cols)
    p = panel(cells, results)
    first = next((r for c, r in zip(cells, results) if c.measure == "robustness" and r.get("items")), None)
    missing = first["items"]["missing"] if first else {}
    note = ("Rows lacking a paraphrase: " + ", ".join(f"{c} {n}" for c, n in missing.items() if n)) if any(
        missing.values()) else ""
    cut = (first["items"].get("cut") or {}) if first else {}  # the same rows in every cell
    if any(cut.values()):
        note += ((" " if note else "") + "Prompts cut to fit the model's context (their oldest tokens dropped after "
                 "the sequence start): " + ", ".join(f"{c} {n}" for c, n in cut.items() if n)
                 + "; a cut relearn prompt shows less of the answer it repeats, so its weakening reads low.")
    na = not_applicable_rows(cells, results, measures=("robustness",))
    parts = [panel_markdown(p, na), markdown(summary, cols, "Forget log-probability per condition", note,
                                         delta="LP_original", not_applicable=na)]
    extraction = summarise(by_row(cells, results, measures=("extraction",)), EXTRACTION_COLUMNS)
    if extraction:
        parts.append(extraction_markdown(extraction, cells, results))
        read = next(c.options["settings"] for c in cells if c.measure == "extraction")
        named = (cfg.get("extraction") or {}).get("settings") or SETTINGS
        if getattr(ctx.backbone, "causal", False) and set(named) - set(read):  # a preset's diffusion settings dropped
            parts.append(f"On an autoregressive model ({ctx.backbone.name}) the sampler settings are those it reads "
                         f"({', '.join(read)}): "
                         "the diffusion sampler's (steps, blocks, remasking, KV cache) are left out.\n")
    md = "\n".join(parts)
    entry = extraction_radar(extraction) if extraction else None
    entry = entry or radar_entry(p)
    files = write_outputs(out_dir, NAME, dict(summary=summary, panel=p, extraction=extraction, config=cfg,
                                              seeds=list(seeds), radar={"robustness": entry} if entry else {},
                                              not_applicable=na, missing=missing, cut=cut), md)
    files["png"] = plot_panels([("robustness", summary, COLUMNS)], Path(out_dir) / f"{NAME}.png",
                               ylabel="forget LP change vs no_edit (nats)")
    if extraction:
        files["extraction_png"] = plot_extraction(extraction, Path(out_dir) / f"{NAME}-extraction.png")
    else:  # an earlier run's plot would sit beside a report that has no extraction section (review 64)
        drop_earlier(out_dir, [Path(out_dir) / f"{NAME}-extraction.png"])
    return dict(summary=summary, panel=p, extraction=extraction, markdown=md, files=files, not_applicable=na)

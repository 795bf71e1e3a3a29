"""editing: every method on edit requests, judged by what the edited model says (ROME / EasyEdit metrics).

Two request sets by default, both from the embedded corpus (timerome.data.requests):
    counterfactual   'counterfactual:forget10': 2 facts of each of 10 authors, each given another
                     author's object for the same relation; the authors' other facts, other authors
                     asked the same relation and the retain questions must not change
    forget01         'embedded:forget01': one author's 20 facts, target "I don't know."
One cell per (set, method, seed) installs the method on the requests (each fact with its own target),
scores it with metrics/editing.py (efficacy and generalisation read at the answer's start and, as
EfficacyNamed / GeneralisationNamed, anywhere in it; locality, fluency, portability; the
unlearning outcomes refusal / leak / confabulation / gibberish) and undoes it. A method whose edit
changes no answer at all is flagged (`Unchanged` = 1): it did nothing, whatever its log-probabilities.

The methods are given the rows they must spare (the retain split) and the rows the model is known to
answer (its training rows), both minus every probe of the evaluation: locality is measured on rows no
method calibrated on or trained against.
"""

from __future__ import annotations

import time

from timerome.common.checks import repeated, shown
from timerome.data.requests import load_requests
from timerome.engine.settings import EDIT, LIKELIHOOD, LOCALITY, QUICK_LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.experiments.data import refuse_unfilled_target
from timerome.experiments.report import (figure, label, markdown, not_applicable_rows, save_png, summarise,
                                         unchanged_rows, write_outputs)
from timerome.experiments.runner import Cell, data_kind, measurement, with_edit
from timerome.methods import available, method_config
from timerome.metrics.editing import UNLEARNING_RATES, edit_scores

NAME = "editing"
ORDER = 20
CONFIG = dict(sets={"counterfactual": "counterfactual:forget10", "forget01": "embedded:forget01"},
              target=EDIT.target, n_retain=LOCALITY.n_retain, n_world=LOCALITY.n_world, n_mc=LIKELIHOOD.n_mc,
              methods=None, gen_length=None)
QUICK = dict(n_mc=QUICK_LIKELIHOOD.n_mc, methods=["no_edit", "timerome", "codebook", "rewrite", "rome"])
COLUMNS = ["Efficacy", "EfficacyLP", "EfficacyNamed", "Generalisation", "GeneralisationLP", "GeneralisationNamed",
           "Locality", "LocalityNeighbours", "LocalitySameSubject", "LocalityRetain", "LocalityRealAuthors",
           "LocalityWorldFacts", "FluencyRatio", "FluencyTarget", "Fluency", "Portability", *UNLEARNING_RATES,
           "Unchanged", "install_seconds"]


@data_kind("requests")
def requests_data(spec: dict, ctx):
    """(rows, task) of a request set: rows = {"requests", "locality" (rows whose answers must not
    change), "known" (subjects a confabulation names), "notes"}. The task's retain rows (what the
    methods must spare) are the retain split and its known rows the model's training rows (embedded;
    else the retain split), both minus every probe: locality is measured on rows no method saw."""
    from timerome.data import load_split
    from timerome.data.task import requests_task
    from timerome.data.tofu import embedded_subjects
    from timerome.metrics.editing import embedded_probes, locality_rows

    reqs, notes = load_requests(spec["requests"], target=spec.get("target"))  # `cells` checked the target
    embedded = ctx.source == "embedded" and getattr(ctx.backbone, "embedded", False)
    locality = locality_rows(ctx.source, spec.get("n_retain", LOCALITY.n_retain), spec.get("n_world", LOCALITY.n_world))
    probes = {p.prompt for r in reqs for p in (*r.neighbours, *r.same_subject, *r.portability)}
    probes |= {r["question"] for rows in locality.values() for r in rows}
    spare = [r for r in load_split("retain_perturbed", ctx.source) if r["question"] not in probes]
    known = [r for r in load_split("train" if embedded else "retain_perturbed", ctx.source)
             if r["question"] not in probes]
    # the subjects a confabulation names: the embedded corpus's where it probes this model (one rule with eval)
    rows = {"requests": reqs, "locality": locality, "notes": notes,
            "known": embedded_subjects() if embedded_probes(ctx.backbone, spec["requests"], reqs) else None}
    return rows, requests_task(reqs, retain_rows=spare, known_rows=known)


# edit_scores leaves out the likelihoods of a one-step edit, with a note
@measurement("editing", reads_steps=True, options=("n_mc", "gen_length"), not_applicable=True)
def measure_editing(cell, ctx, rows, task) -> dict:
    opts = dict(locality=rows["locality"], n_mc=cell.options.get("n_mc", LIKELIHOOD.n_mc), seed=cell.seed,
                gen_length=cell.options.get("gen_length"), known_subjects=rows["known"], progress=ctx.progress)
    key = ("baseline", cell.seed)
    if key not in rows:  # the unedited answers: once per request set and seed, shared by every method
        rows[key] = edit_scores(ctx.backbone, rows["requests"], None, lp=False, **opts)["baseline"]

    def measure(edit):
        t0 = time.perf_counter()
        res = edit_scores(ctx.backbone, rows["requests"], edit, baseline=rows[key], **opts)
        return {"metrics": res["metrics"], "items": res["items"], "gen_length": res["gen_length"],
                "notes": res["notes"],
                "cost": dict(edit.cost(), eval_seconds=time.perf_counter() - t0)}

    return with_edit(cell, ctx, task, measure)


def plan(cfg) -> list[tuple[str, dict]]:
    """(method, overrides): every registered method at its defaults (or the `methods` given)."""
    out = []
    for m in (available() if cfg.get("methods") is None else cfg["methods"]):
        if isinstance(m, dict):
            method_config(m["method"], m.get("config"))
            out.append((m["method"], dict(m.get("config") or {})))
        else:
            method_config(m)
            out.append((m, {}))
    return out


def check(cfg, source) -> None:
    """Before a model loads: the sets (a non-empty object of name -> requests spec or file), and a target no set's
    requests read (each names its own)."""
    sets = cfg["sets"]
    if not isinstance(sets, dict) or not sets or not all(isinstance(k, str) and k.strip() and isinstance(v, str)
                                                          and v.strip() for k, v in sets.items()):
        raise TimeromeError("experiment 'editing': setting sets must be a non-empty object of name -> requests spec "
                            f"or file, e.g. {{\"cf\": \"counterfactual:forget10\"}}, got {shown(sets)}")
    twice = repeated(v.strip() for v in sets.values())
    if twice:  # one set computed and reported twice under two names
        raise TimeromeError(f"experiment 'editing': setting sets names {twice[0]!r} twice (under two names): give "
                            "each set once")
    refuse_unfilled_target(list(cfg["sets"].values()), cfg["target"], "experiment 'editing'")


def cells(cfg, seeds, ctx) -> list[Cell]:
    out = []
    for name, spec in cfg["sets"].items():
        data = dict(kind="requests", requests=spec, target=cfg["target"], n_retain=cfg["n_retain"],
                    n_world=cfg["n_world"])
        opts = dict(n_mc=cfg["n_mc"], **({"gen_length": cfg["gen_length"]} if cfg.get("gen_length") else {}))
        out += [Cell("editing", m, over, seed, data, opts, row=label(m, over), group=name)
                for seed in seeds for m, over in plan(cfg)]
    return out


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summaries, parts, na = {}, [], {}
    for name in cfg["sets"]:
        per_seed: dict = {}
        for c, r in zip(cells, results):
            if c.group == name:
                per_seed.setdefault(c.row, {})[c.seed] = r["metrics"]
        summary = summarise(per_seed, COLUMNS)
        summaries[name] = summary
        unlearning = cfg["sets"][name].startswith("embedded:")
        cols = [c for c in COLUMNS if unlearning or c not in UNLEARNING_RATES]
        first = next((r for c, r in zip(cells, results) if c.group == name and r.get("items")), None)  # not an n/a
        n = len(first["items"]["prompt"]["prompt"]) if first else 0
        note = (f"{n} requests from {cfg['sets'][name]}" + (f", target {cfg['target']!r}" if unlearning else
                ", each with its own new object") + f"; greedy answers, n_mc {cfg['n_mc']}. Unchanged = 1: the "
                "method changed no answer at all.")
        group = [(c, r) for c, r in zip(cells, results) if c.group == name]
        na[name] = not_applicable_rows(*zip(*group))
        parts.append(markdown(summary, cols, f"Editing: {name}", note, delta="Efficacy",
                              unchanged=unchanged_rows(*zip(*group)), not_applicable=na[name]) + notes_text(group, cols))
    md = "\n".join(parts)
    files = write_outputs(out_dir, NAME, dict(summary=summaries, config=cfg, seeds=list(seeds), not_applicable=na), md)
    files["png"] = plot_editing(summaries, out_dir / f"{NAME}.png")
    return dict(summary=summaries, markdown=md, files=files, not_applicable=na)


def notes_text(group, cols) -> str:
    """What edit_scores said of a row's columns (e.g. the likelihood columns of a one-step edit it did not
    compute), one line per row and note, under the table, for the table's columns `cols` only (a note on
    Refusal, which a counterfactual set's table leaves out, would explain nothing there); "" when none."""
    said: dict = {}
    for c, r in group:
        for col, text in (r.get("notes") or {}).items():
            if col in cols:
                said.setdefault((c.row, text), set()).add(col)
    if not said:
        return ""
    return "Notes:\n\n" + "".join(f"- {row}, {', '.join(sorted(cols))}: {text}\n"
                                   for (row, text), cols in said.items()) + "\n"


def plot_editing(summaries: dict, path) -> str:
    """Per request set: efficacy, generalisation and locality of every method (bootstrap CI bars)."""
    cols = ("Efficacy", "Generalisation", "Locality")
    fig = figure(5.0 * len(summaries), 0.8 + 0.32 * max(len(s) for s in summaries.values()))
    axes = fig.subplots(1, len(summaries), squeeze=False)[0]
    for ax, (name, summary) in zip(axes, summaries.items()):
        rows = list(summary)
        for j, col in enumerate(cols):
            named = False  # the column's legend entry on its first bar (an n/a row draws none)
            for i, row in enumerate(rows):
                e = summary[row].get(col)
                if not e:
                    continue
                y = i + (j - 1) * 0.27
                ax.barh(y, e["mean"], height=0.25, color=("tab:green", "tab:olive", "tab:blue")[j],
                        label=None if named else col)
                named = True
                ax.plot([e["lo"], e["hi"]], [y, y], color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_xlim(0, 1.02)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("rate (bars: mean over seeds, lines: bootstrap 95% CI)", fontsize=8)
        if ax.get_legend_handles_labels()[0]:  # no measured row (n/a rows only): nothing to name
            ax.legend(fontsize=7, loc="lower right")
    return save_png(fig, path)

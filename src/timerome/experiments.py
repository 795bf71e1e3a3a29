"""The paper's experiments, resumable: canonical, scalability, sequential, pareto, ablations.

    run_experiment("canonical", seeds=(0, 1, 2), out_dir="runs/canonical")

Each experiment is a list of cells (method, config, seed, what is measured). A finished cell is
a JSON file in <out_dir>/cells named by the hash of everything that determines it (model
fingerprint, data, method config, seed, n_mc, ...), so a rerun skips it. Results over seeds are
summarised per row as mean ± std with a 2000-resample bootstrap 95 % CI and a paired t-test
against no_edit on the shared seeds (stars: * p<0.05, ** p<0.01, *** p<1e-4, † no spread); outputs are
<name>.json, <name>.md and <name>.png in out_dir.

Seeds drive the Monte-Carlo masks of the likelihood (shared between methods: paired), the
insertion order of the sequential experiment and random_layer's coordinate. The traced
coordinate comes from one trace (trace_seed 0) shared by every TimeROME cell of a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from timerome.errors import TimeromeError
from timerome.progress import progress_bar

VERSION = 1  # bump when a cell's meaning changes: old cells stop matching

# Every experiment's knobs; run_experiment(..., overrides={...}) changes any of them.
CONFIGS = {
    "canonical": dict(n_mc=16, n_retain=40, n_world=20, forget="forget01", rouge=True, reference={}),
    "scalability": dict(n_mc=16, sizes=(1, 10, 40, 100, 200, 400), n_eval_forget=40, n_retain=40, n_world=20,
                        variants=({"alpha": 0.5, "q": 2}, {"alpha": 1.0, "q": 2}, {})),
    "sequential": dict(n_mc=16, n_facts=50, forget="forget05", n_retain=20, n_world=20,
                       variants=({"alpha": 1.0, "q": 2}, {"alpha": 0.5, "q": 2}, {}), every=1),
    "pareto": dict(n_mc=16, n_retain=40, n_world=20, forget="forget01", q=0,
                   alphas=(0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0), paper_point={"alpha": 2.0, "q": 4}),
    "ablations": dict(n_mc=16, n_retain=40, n_world=20, forget="forget01", traj_steps=8, one_step=0, config={}),
}
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact", "ForgetTR", "RetainTR", "ForgetQuality",
           "ModelUtility", "ForgetROUGE", "RetainROUGE", "install_seconds", "install_extra_mb"]
SHORT = {"ForgetLP": "ForgetLP ↓", "ForgetQuality": "KS p ↑", "install_seconds": "install s",
         "install_extra_mb": "install MB",
         "ModelUtility": "Utility", "ForgetROUGE": "fROUGE", "RetainROUGE": "rROUGE"}


# ------------------------------------------------------------------------------ setup and cells


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


def resolve_source(data):
    """'embedded' | 'tofu' ($TIMEROME_TOFU_DIR, else the Hub) | a local TOFU directory."""
    if data in (None, "embedded"):
        return "embedded"
    if data == "tofu":
        return os.environ.get("TIMEROME_TOFU_DIR") or None
    if not Path(data).is_dir():
        raise TimeromeError(f"--data must be 'embedded', 'tofu' or a TOFU directory; {data!r} is none of them")
    return str(data)


@dataclass
class Setup:
    """One model + data + output folder; experiments share it (and its caches)."""

    backbone: object
    source: object
    out_dir: Path
    model_path: object = None
    reference: object = None          # None: auto (embedded only), a path / Backbone, or "train"
    resume: bool = True
    progress: bool = True
    reference_options: dict = field(default_factory=dict)  # reference_model(**options): epochs, n_authors, ...
    _ref_backbone: object = None

    @property
    def tag(self) -> dict:
        return dict(model=self.backbone.fingerprint(), data=str(self.source), v=VERSION)

    def cell(self, key: dict, fn):
        """Cached result of fn() under key (a JSON file per cell)."""
        key = dict(key, **self.tag)
        path = self.out_dir / "cells" / f"{_hash(key)}.json"
        if self.resume and path.exists():
            return json.loads(path.read_text())["result"]
        result = fn()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "result": result}, default=_jsonable))
        tmp.replace(path)  # atomic: an interrupted run never leaves half a cell
        return result


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def make_setup(model=None, data="embedded", out_dir=None, *, resume=True, progress=True, reference=None,
               reference_options=None, backbone=None) -> Setup:
    from timerome.backbones import load_backbone

    bb = backbone if backbone is not None else load_backbone(model)
    out = Path(out_dir) if out_dir else Path("timerome-runs")
    out.mkdir(parents=True, exist_ok=True)
    return Setup(bb, resolve_source(data), out, model_path=model, reference=reference, resume=resume,
                 progress=progress, reference_options=dict(reference_options or {}))


def eval_data(setup: Setup, forget="forget01", n_retain=40, n_world=20):
    """(rows by split, ForgetTask); rows that do not fit the model's context are dropped."""
    from timerome.evaluation import eval_rows, fits, forget_task

    rows = eval_rows(setup.source, forget, n_retain=n_retain, n_world=n_world)
    rows = {k: [r for r in v if fits(setup.backbone, r)] for k, v in rows.items()}
    if not rows["forget"]:
        raise TimeromeError(f"no {forget} row fits the model's context of {setup.backbone.max_length} tokens")
    return rows, forget_task(setup.source, forget)


def traced_coordinate(setup: Setup, task, config: dict | None = None) -> list:
    """The run's shared TimeROME coordinate: traced once on the task's validation facts."""
    from timerome.methods import method_config
    from timerome.methods.timerome_edit import locate

    cfg = method_config("timerome", config or {})
    cfg["coordinate"] = None
    key = dict(kind="coordinate", facts=[f.prompt for f in task.facts[: cfg["trace_facts"]]],
               trace={k: v for k, v in cfg.items() if k.startswith(("trace", "select"))})

    def run():
        coord, info = locate(setup.backbone, task, cfg, progress=setup.progress)
        return dict(coordinate=list(coord), **info)

    return setup.cell(key, run)["coordinate"]


def _warm_background(setup, task, coord):
    # background statistics are a one-off per coordinate: measure them before any timed install
    from timerome.methods import method_config
    from timerome.methods.timerome_edit import background_stats

    background_stats(setup.backbone, tuple(coord), task, method_config("timerome"))


def reference_trs(setup: Setup, rows, n_mc: int, seed: int):
    """Forget truth ratios of the reference model (None when there is no reference)."""
    from timerome.evaluation import reference_model, reference_truth_ratios

    ref = setup.reference
    if ref is None and setup.model_path is None and setup.source == "embedded" \
            and getattr(setup.backbone, "name", "") == "timerome-default":
        ref = "embedded"
    if ref is None:
        return None
    key = dict(kind="reference_tr", ref=str(ref), options=setup.reference_options, n_mc=n_mc, seed=seed,
               rows=_hash([(r["question"], r["answer"]) for r in rows]))

    def run():
        if setup._ref_backbone is None:
            setup._ref_backbone = _load_reference(setup, ref)
        return reference_truth_ratios(setup._ref_backbone, rows, n_mc=n_mc, seed=seed)

    return setup.cell(key, run)


def _load_reference(setup, ref):
    from timerome.backbones import Backbone, load_backbone
    from timerome.evaluation import forget_task, reference_model

    if isinstance(ref, Backbone):
        return ref
    if ref == "embedded":
        return reference_model(progress=setup.progress, **setup.reference_options)
    if ref == "train":
        task = forget_task(setup.source)
        opts = {k: v for k, v in setup.reference_options.items() if k == "epochs"}
        return reference_model(setup.backbone, retain_rows=task.retain_rows, progress=setup.progress, **opts)
    return load_backbone(ref, dtype=setup.backbone.dtype, device=setup.backbone.device)


def method_cell(setup: Setup, method: str, config: dict, seed: int, rows, task, *, kind="full", n_mc=16,
                reference=None, rouge=True, extra=None):
    """Install `method`, measure, undo. kind: "full" (evaluate) or "lp" (log-likelihoods only)."""
    from timerome.methods import install, method_config

    cfg = method_config(method, config)
    key = dict(kind=kind, method=method, config=cfg, seed=seed, n_mc=n_mc, rouge=rouge, extra=extra,
               rows={k: _hash([(r["question"], r["answer"]) for r in v]) for k, v in rows.items()},
               facts=_hash([(f.prompt, f.object) for f in task.facts]))

    def run():
        edit = install(method, setup.backbone, task, cfg, seed)
        try:
            res = _measure(setup.backbone, kind, rows, edit, n_mc=n_mc, seed=seed, rouge=rouge, extra=extra)
            res["info"], res["config"] = edit.info, edit.config
            return res
        finally:
            edit.undo()

    res = setup.cell(key, run)
    if kind == "full" and reference is not None:
        _add_forget_quality(res, reference)
    res["metrics"]["install_seconds"] = res["cost"].get("install_seconds", 0.0)
    # memory installing took above what the model already held (CUDA: allocated; CPU: resident set)
    res["metrics"]["install_extra_mb"] = res["cost"].get("extra_memory_mb", 0.0)
    return res


_LP_COLS = {"forget": "ForgetLP", "retain": "RetainLP", "real_authors": "RealAuth", "world_facts": "WorldFact"}
_TRAJ_COLS = {"forget": "ForgetTrajLP", "retain": "RetainTrajLP", "real_authors": "RealAuthTrajLP"}


def _measure(bb, kind, rows, edit, *, n_mc, seed, rouge, extra):
    """full: every TOFU metric; lp: MC log-likelihoods; traj: trajectory log-likelihoods (steps=extra)."""
    from timerome.evaluation import evaluate, lp_only, trajectory_logprobs

    if kind == "full":
        return evaluate(bb, rows, n_mc=n_mc, seed=seed, edit=edit, rouge=rouge)
    t0 = time.perf_counter()
    if kind == "lp":
        lps, cols = lp_only(bb, rows, n_mc=n_mc, seed=seed, edit=edit), _LP_COLS
    elif kind == "traj":
        lps, cols = {k: trajectory_logprobs(bb, v, steps=extra, edit=edit) for k, v in rows.items()}, _TRAJ_COLS
    else:
        raise TimeromeError(f"unknown cell kind {kind!r}")
    return {"items": {k: {"lp": v} for k, v in lps.items()},
            "metrics": {cols[k]: float(np.mean(v)) for k, v in lps.items() if k in cols},
            "cost": dict(edit.cost(), eval_seconds=time.perf_counter() - t0)}


def _add_forget_quality(res, reference_tr):
    from timerome.metrics import forget_quality

    if "tr" in res["items"].get("forget", {}):
        res["metrics"]["ForgetQuality"] = forget_quality(res["items"]["forget"]["tr"], reference_tr)


# ------------------------------------------------------------------------------ statistics


def label(method: str, overrides: dict) -> str:
    if not overrides:
        return method
    return f"{method} (" + ", ".join(f"{k}={_short(v)}" for k, v in overrides.items()) + ")"


def _short(v):
    return f"{v:g}" if isinstance(v, float) else v


def summarise(per_seed: dict[str, dict[int, dict]], columns, reference="no_edit") -> dict:
    """{row: {seed: metrics}} -> {row: {column: cell stats + paired test vs the reference row}}."""
    from timerome.stats import cell, paired_t, stars

    ref = per_seed.get(reference, {})
    out = {}
    for row, seeds in per_seed.items():
        out[row] = {}
        for col in columns:
            vals = {s: m[col] for s, m in seeds.items() if col in m and np.isfinite(m[col])}
            if not vals:
                continue
            c = cell(list(vals.values()))
            entry = dict(mean=c.mean, std=c.std, lo=c.lo, hi=c.hi, n=c.n, values=vals)
            shared = sorted(s for s in vals if col in ref.get(s, {}) and np.isfinite(ref[s][col]))
            if row != reference and len(shared) >= 2:
                x, y = [vals[s] for s in shared], [ref[s][col] for s in shared]
                t, p = paired_t(x, y)
                # None, not NaN / inf, where no test exists: the JSON stays standard
                entry.update(delta=float(np.mean(np.subtract(x, y))), t=t if np.isfinite(t) else None,
                             p=None if np.isnan(p) else p, stars=stars(p))
            out[row][col] = entry
    return out


def delta_text(d: dict) -> str:
    """The paired difference to the reference row with its stars and p-value."""
    if "p" not in d:
        return "–"
    p = "same on every seed" if d["p"] is None else f"p={d['p']:.2g}"
    return f"{d['delta']:+.2f}{d['stars']} ({p})"


def fmt_cell(e: dict | None, digits: int = 2) -> str:
    if not e:
        return "–"
    s = f"{e['mean']:.{digits}f}"
    if e["n"] > 1:
        s += f" ± {e['std']:.{digits}f} [{e['lo']:.{digits}f}, {e['hi']:.{digits}f}]"
    return s + e.get("stars", "")


def markdown(summary: dict, columns, title: str, note: str = "") -> str:
    head = ["method"] + [SHORT.get(c, c) for c in columns] + ["Δ ForgetLP vs no_edit (p)"]
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, cols in summary.items():
        d = cols.get("ForgetLP", {})
        delta = delta_text(d)
        digits = lambda c: 3 if c in ("ForgetQuality", "ForgetTR", "RetainTR", "ModelUtility") else 2  # noqa: E731
        lines.append("| " + " | ".join([row] + [fmt_cell(cols.get(c), digits(c)) for c in columns] + [delta]) + " |")
    lines += ["", "Cells: mean ± std [bootstrap 95% CI] over seeds; stars: paired t vs no_edit on shared "
              "seeds (* p<0.05, ** p<0.01, *** p<1e-4; † the same difference on every seed, so no test)." + (" " + note if note else ""), ""]
    return "\n".join(lines)


def write_outputs(out_dir: Path, name: str, payload: dict, md: str) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    (out_dir / f"{name}.md").write_text(md)
    return {"json": str(out_dir / f"{name}.json"), "markdown": str(out_dir / f"{name}.md")}


def _figure(w, h):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path) -> str:
    fig.savefig(path, dpi=110, format="png", metadata={"Software": None})
    return str(path)


# ------------------------------------------------------------------------------ canonical


def canonical_rows(methods=None) -> list[tuple[str, dict]]:
    """(method, overrides) of every registered method's canonical variants; no_edit first."""
    from timerome.methods import available, get_method

    names = available() if methods is None else list(methods)
    return [(n, dict(v)) for n in names for v in get_method(n).canonical]


def canonical(setup: Setup, seeds, cfg) -> dict:
    plan = canonical_rows(cfg.get("methods"))  # an unknown method fails here, before any tracing
    rows, task = eval_data(setup, cfg["forget"], cfg["n_retain"], cfg["n_world"])
    coord = traced_coordinate(setup, task)
    _warm_background(setup, task, coord)
    per_seed: dict[str, dict[int, dict]] = {}
    infos = {}
    with progress_bar("canonical", total=len(plan) * len(seeds), enabled=setup.progress) as bar:
        for seed in seeds:
            ref = reference_trs(setup, rows["forget"], cfg["n_mc"], seed)
            for method, over in plan:
                conf = dict(over, coordinate=coord) if method == "timerome" and "coordinate" not in over else over
                res = method_cell(setup, method, conf, seed, rows, task, n_mc=cfg["n_mc"], reference=ref,
                                  rouge=cfg["rouge"])
                per_seed.setdefault(label(method, over), {})[seed] = res["metrics"]
                infos[label(method, over)] = res.get("info", {})
                bar.advance(description=f"canonical seed {seed}: {method}")
    summary = summarise(per_seed, COLUMNS)
    note = f"TimeROME coordinate (traced): layer {coord[0]} {coord[1]}; n_mc={cfg['n_mc']}; {len(rows['forget'])} forget items."
    md = markdown(summary, COLUMNS, "Canonical forget01", note)
    files = write_outputs(setup.out_dir, "canonical", dict(summary=summary, info=infos, coordinate=coord,
                                                            config=cfg, seeds=list(seeds)), md)
    files["png"] = plot_canonical(summary, setup.out_dir / "canonical.png")
    return dict(summary=summary, markdown=md, files=files, coordinate=coord)


def plot_canonical(summary: dict, path) -> str:
    """Δ ForgetLP and Δ RetainLP vs no_edit per row, with the bootstrap CI of each mean."""
    rows = [r for r in summary if r != "no_edit"]
    fig = _figure(7.5, 0.5 + 0.45 * max(len(rows), 2))
    ax = fig.subplots()
    base = summary.get("no_edit", {})
    for j, (col, colour) in enumerate((("ForgetLP", "tab:red"), ("RetainLP", "tab:blue"))):
        b = base.get(col, {}).get("mean", 0.0)
        for i, r in enumerate(rows):
            e = summary[r].get(col)
            if not e:
                continue
            y = i + (j - 0.5) * 0.35
            ax.barh(y, e["mean"] - b, height=0.33, color=colour, label=col if i == 0 else None)
            ax.plot([e["lo"] - b, e["hi"] - b], [y, y], color="black", lw=1)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("change vs no_edit (nats); bars: mean, lines: bootstrap 95% CI")
    ax.legend(fontsize=8)
    return _save(fig, path)


# ------------------------------------------------------------------------------ scalability


def scalability(setup: Setup, seeds, cfg) -> dict:
    """|F| forget facts (the last |F| rows of `full`) in one memory: forget / retain LP, install time."""
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import load_split
    from timerome.evaluation import spread
    from timerome.methods import ForgetTask, method_config
    from timerome.methods.timerome_edit import background_stats

    rows0, task0 = eval_data(setup, "forget01", cfg["n_retain"], cfg["n_world"])
    rows0.pop("world_facts", None)
    coord = traced_coordinate(setup, task0)
    # one background measurement for every |F|: install time is then capture + solve only
    stats = background_stats(setup.backbone, tuple(coord), task0, method_config("timerome"))
    full = load_split("full", setup.source)
    plan = [("no_edit", {})] + [("timerome", dict(v)) for v in cfg["variants"]]
    per: dict[int, dict[str, dict[int, dict]]] = {}
    with progress_bar("scalability", total=len(cfg["sizes"]) * len(seeds), enabled=setup.progress) as bar:
        for n in cfg["sizes"]:
            if n > len(full) - len(task0.retain_rows):
                raise TimeromeError(f"|F|={n} would overlap the retain rows (corpus of {len(full)} rows)")
            frows = full[len(full) - n:]
            facts, _ = facts_from_rows(frows, offset=len(full) - n)
            task = ForgetTask(frows, facts, task0.retain_rows, background=stats)
            rows = dict(rows0, forget=spread(frows, cfg["n_eval_forget"]))
            for seed in seeds:
                for method, over in plan:
                    conf = dict(over, coordinate=coord) if method == "timerome" else over
                    res = method_cell(setup, method, conf, seed, rows, task, kind="lp", n_mc=cfg["n_mc"])
                    per.setdefault(n, {}).setdefault(label(method, over), {})[seed] = res["metrics"]
                bar.advance(description=f"scalability |F|={n} seed {seed}")
    cols = ["ForgetLP", "RetainLP", "RealAuth", "install_seconds"]
    summary = {n: summarise(rows_n, cols) for n, rows_n in per.items()}
    lines = ["## Scalability", "", "| abs F | method | ForgetLP | RetainLP | RealAuth | install s | Δ ForgetLP (p) |",
             "|---|---|---|---|---|---|---|"]
    for n, rows_n in summary.items():
        for row, c in rows_n.items():
            d = c.get("ForgetLP", {})
            delta = delta_text(d)
            lines.append(f"| {n} | {row} | " + " | ".join(fmt_cell(c.get(k)) for k in cols) + f" | {delta} |")
    lines += ["", f"Coordinate layer {coord[0]} {coord[1]}; forget LP over at most {cfg['n_eval_forget']} of the "
              "|F| facts; install = capture + solve (background statistics measured once beforehand).", ""]
    md = "\n".join(lines)
    files = write_outputs(setup.out_dir, "scalability", dict(summary=summary, config=cfg, coordinate=coord), md)
    files["png"] = plot_scalability(summary, setup.out_dir / "scalability.png")
    return dict(summary=summary, markdown=md, files=files)


def plot_scalability(summary, path) -> str:
    fig = _figure(10, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    sizes = sorted(summary)
    for row in summary[sizes[0]]:
        for ax, col in ((ax1, "ForgetLP"), (ax2, "install_seconds")):
            pts = [(n, summary[n][row][col]) for n in sizes if col in summary[n].get(row, {})]
            if not pts:
                continue
            x = [n for n, _ in pts]
            ax.plot(x, [e["mean"] for _, e in pts], marker="o", label=row)
            ax.fill_between(x, [e["lo"] for _, e in pts], [e["hi"] for _, e in pts], alpha=0.2)
    for ax, yl in ((ax1, "ForgetLP (nats)"), (ax2, "install seconds")):
        ax.set_xscale("log")
        ax.set_xlabel("|F| facts in the memory")
        ax.set_ylabel(yl)
    ax1.legend(fontsize=7)
    return _save(fig, path)


# ------------------------------------------------------------------------------ sequential


def sequential(setup: Setup, seeds, cfg) -> dict:
    """Insert n_facts forget facts one at a time (EditMemory.add) and measure after each insert."""
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import FULL_OFFSET, load_split
    from timerome.methods import ForgetTask

    rows0, task0 = eval_data(setup, "forget01", cfg["n_retain"], cfg["n_world"])
    coord = traced_coordinate(setup, task0)
    frows = load_split(cfg["forget"], setup.source)[: cfg["n_facts"]]
    facts, _ = facts_from_rows(frows, offset=FULL_OFFSET.get(cfg["forget"], 0))
    task = ForgetTask(frows, facts, task0.retain_rows)
    rows = {"forget": frows, "retain": rows0["retain"], "real_authors": rows0["real_authors"]}
    curves: dict[str, dict[int, list]] = {}
    with progress_bar("sequential", total=len(cfg["variants"]) * len(seeds), enabled=setup.progress) as bar:
        for over in cfg["variants"]:
            for seed in seeds:
                key = dict(kind="sequential", config=dict(over, coordinate=coord), seed=seed, n_mc=cfg["n_mc"],
                           every=cfg["every"], facts=_hash([(f.prompt, f.object) for f in facts]),
                           rows={k: _hash([r["question"] for r in v]) for k, v in rows.items()})
                curves.setdefault(label("timerome", over), {})[seed] = setup.cell(
                    key, lambda: _sequential_curve(setup, task, rows, dict(over, coordinate=coord), seed, cfg))
                bar.advance(description=f"sequential {label('timerome', over)} seed {seed}")
    summary = _curve_summary(curves)
    md = _sequential_md(summary, cfg)
    files = write_outputs(setup.out_dir, "sequential", dict(summary=summary, curves=curves, config=cfg,
                                                             coordinate=coord), md)
    files["png"] = plot_sequential(summary, setup.out_dir / "sequential.png")
    return dict(summary=summary, markdown=md, files=files)


def _sequential_curve(setup, task, rows, over, seed, cfg) -> list[dict]:
    from timerome.evaluation import lp_only
    from timerome.methods import InferenceEdit, method_config
    from timerome.methods.timerome_edit import build_memory

    bb = setup.backbone
    conf = method_config("timerome", over)
    memory = build_memory(bb, task, conf, tuple(conf["coordinate"]), facts=[])  # empty; lam from all facts
    edit = InferenceEdit(method="timerome", config=conf, context=lambda: memory.applied(bb))
    order = np.random.default_rng(seed).permutation(len(task.facts)).tolist()

    def point(k, secs, use_edit):
        lp = lp_only(bb, rows, n_mc=cfg["n_mc"], seed=seed, edit=edit if use_edit else None)
        return dict(k=k, insert_seconds=secs, **{c: float(np.mean(lp[s])) for s, c in _LP_COLS.items() if s in lp})

    curve = [point(0, 0.0, False)]
    for k, i in enumerate(order, 1):
        t0 = time.perf_counter()
        memory.add([task.facts[i]])
        memory.q = min(int(conf["q"]), len(memory))  # TopQ cannot keep more facts than stored
        secs = time.perf_counter() - t0
        if k % cfg["every"] == 0 or k == len(order):
            curve.append(point(k, secs, True))
    return curve


def _curve_summary(curves) -> dict:
    from timerome.stats import cell

    out = {}
    for row, by_seed in curves.items():
        ks = sorted({p["k"] for c in by_seed.values() for p in c})
        out[row] = {}
        for k in ks:
            at = [next(p for p in c if p["k"] == k) for c in by_seed.values() if any(p["k"] == k for p in c)]
            out[row][k] = {}
            for col in ("ForgetLP", "RetainLP", "RealAuth", "insert_seconds"):
                c = cell([p[col] for p in at])
                out[row][k][col] = dict(mean=c.mean, std=c.std, lo=c.lo, hi=c.hi, n=c.n)
    return out


def _sequential_md(summary, cfg) -> str:
    lines = ["## Sequential editing", "", "| variant | k | ForgetLP | RetainLP | RealAuth |", "|---|---|---|---|---|"]
    for row, by_k in summary.items():
        for k in by_k:
            if k in (0, 1, 5, 10, 20, 30, 40, 50) or k == max(by_k):
                e = by_k[k]
                lines.append(f"| {row} | {k} | " + " | ".join(fmt_cell(e[c]) for c in ("ForgetLP", "RetainLP", "RealAuth")) + " |")
    lines += ["", f"k = facts inserted one at a time (k=0: no edit); ForgetLP over all {cfg['n_facts']} facts "
              "(the not-yet-inserted ones included).", ""]
    return "\n".join(lines)


def plot_sequential(summary, path) -> str:
    fig = _figure(4.2 * len(summary), 3.4)
    axes = fig.subplots(1, len(summary), squeeze=False)[0]
    for ax, (row, by_k) in zip(axes, summary.items()):
        ks = sorted(k for k in by_k if k > 0)
        for col, colour in (("ForgetLP", "tab:red"), ("RetainLP", "tab:blue"), ("RealAuth", "tab:green")):
            ax.plot(ks, [by_k[k][col]["mean"] for k in ks], color=colour, label=col)
            ax.fill_between(ks, [by_k[k][col]["lo"] for k in ks], [by_k[k][col]["hi"] for k in ks],
                            color=colour, alpha=0.2)
            if 0 in by_k:
                ax.axhline(by_k[0][col]["mean"], color=colour, ls="--", lw=0.8)
        ax.set_title(row, fontsize=9)
        ax.set_xlabel("facts inserted k")
        ax.set_ylabel("log-likelihood (nats)")
    axes[0].legend(fontsize=7)
    return _save(fig, path)


# ------------------------------------------------------------------------------ pareto


def pareto(setup: Setup, seeds, cfg) -> dict:
    """TimeROME's alpha sweep: -ForgetLP vs RetainLP, against every other registered method."""
    rows, task = eval_data(setup, cfg["forget"], cfg["n_retain"], cfg["n_world"])
    coord = traced_coordinate(setup, task)
    sweep = [("timerome", {"alpha": a, "q": cfg["q"]}) for a in cfg["alphas"]]
    others = [(m, o) for m, o in canonical_rows(cfg.get("methods")) if m != "timerome"]
    if cfg.get("paper_point"):
        others.append(("timerome", dict(cfg["paper_point"])))
    per = {}
    plan = sweep + others
    with progress_bar("pareto", total=len(plan) * len(seeds), enabled=setup.progress) as bar:
        for seed in seeds:
            for method, over in plan:
                conf = dict(over, coordinate=coord) if method == "timerome" else over
                res = method_cell(setup, method, conf, seed, rows, task, kind="lp", n_mc=cfg["n_mc"])
                per.setdefault(label(method, over), {})[seed] = res["metrics"]
                bar.advance(description=f"pareto seed {seed}: {label(method, over)}")
    cols = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact"]
    summary = summarise(per, cols)
    md = markdown(summary, cols, "Pareto sweep (alpha)", f"q={cfg['q']} for the sweep; coordinate layer {coord[0]} {coord[1]}.")
    files = write_outputs(setup.out_dir, "pareto", dict(summary=summary, config=cfg, coordinate=coord), md)
    files["png"] = plot_pareto(summary, [label(m, o) for m, o in sweep], setup.out_dir / "pareto.png")
    return dict(summary=summary, markdown=md, files=files)


def plot_pareto(summary: dict, frontier: list[str], path) -> str:
    """-ForgetLP (right = more forgetting) vs RetainLP (up = more utility); CI ribbons/bars."""
    fig = _figure(6.4, 4.6)
    ax = fig.subplots()
    pts = [(summary[r]["ForgetLP"], summary[r]["RetainLP"], r) for r in frontier if r in summary]
    if pts:
        x = [-f["mean"] for f, _, _ in pts]
        ax.plot(x, [r["mean"] for _, r, _ in pts], "-o", color="tab:purple", label="TimeROME alpha sweep")
        ax.fill_between(x, [r["lo"] for _, r, _ in pts], [r["hi"] for _, r, _ in pts], color="tab:purple", alpha=0.2)
        ax.errorbar(x, [r["mean"] for _, r, _ in pts], xerr=[[xi + f["hi"] for xi, (f, _, _) in zip(x, pts)],
                                                             [-f["lo"] - xi for xi, (f, _, _) in zip(x, pts)]],
                    fmt="none", ecolor="tab:purple", alpha=0.6)
        for xi, (_, r, name) in zip(x, pts):
            ax.annotate("α=" + name.split("alpha=")[-1].split(",")[0].rstrip(")"), (xi, r["mean"]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    for r, cols in summary.items():
        if r in frontier or "ForgetLP" not in cols:
            continue
        f, rt = cols["ForgetLP"], cols["RetainLP"]
        ax.errorbar([-f["mean"]], [rt["mean"]], xerr=[[f["hi"] - f["mean"]], [f["mean"] - f["lo"]]],
                    yerr=[[rt["mean"] - rt["lo"]], [rt["hi"] - rt["mean"]]], fmt="s", capsize=2, label=r)
    ax.set_xlabel("− ForgetLP (nats, right = more forgotten)")
    ax.set_ylabel("RetainLP (nats, up = more kept)")
    ax.set_title("Forget / retain Pareto frontier (bootstrap 95% CI)", fontsize=10)
    ax.legend(fontsize=7)
    return _save(fig, path)


# ------------------------------------------------------------------------------ ablations


def ablation_rows(coord, n_layers: int, one_step: int, config: dict) -> list[tuple[str, str, dict]]:
    """(row name, method, config overrides) of the design-space ablations."""
    layer, point = coord
    base = dict(config, coordinate=[layer, point])
    return [
        ("no_edit", "no_edit", {}),
        (f"resid, all steps, traced layer {layer} (TimeROME)", "timerome", dict(base, coordinate=[layer, "resid"])),
        (f"attn, traced layer {layer}", "timerome", dict(base, coordinate=[layer, "attn"])),
        (f"mlp, traced layer {layer}", "timerome", dict(base, coordinate=[layer, "mlp"])),
        (f"one step only (k={one_step})", "timerome", dict(base, step=one_step)),
        ("random layer / module", "random_layer", {k: v for k, v in config.items()}),
        (f"last layer {n_layers - 1} resid", "timerome", dict(base, coordinate=[n_layers - 1, "resid"])),
    ]


def ablations(setup: Setup, seeds, cfg) -> dict:
    """resid vs attn vs mlp; all steps vs one step; traced vs random vs last-layer coordinate.

    MC log-likelihoods have no denoising step, so the one-step row is measured only along the
    greedy denoising trajectory (Traj columns), where step k exists; every row has those too.
    """
    rows, task = eval_data(setup, cfg["forget"], cfg["n_retain"], cfg["n_world"])
    rows.pop("world_facts", None)
    coord = traced_coordinate(setup, task)
    plan = ablation_rows(coord, setup.backbone.n_layers, cfg["one_step"], cfg["config"])
    traj_rows = {"forget": rows["forget"], "retain": rows["retain"][:20]}
    per = {}
    with progress_bar("ablations", total=len(plan) * len(seeds), enabled=setup.progress) as bar:
        for seed in seeds:
            for name, method, over in plan:
                m = {}
                if "step" not in over:
                    m.update(method_cell(setup, method, over, seed, rows, task, kind="lp", n_mc=cfg["n_mc"])["metrics"])
                traj = method_cell(setup, method, over, seed, traj_rows, task, kind="traj", extra=cfg["traj_steps"])
                m.update(traj["metrics"])
                per.setdefault(name, {})[seed] = m
                bar.advance(description=f"ablations seed {seed}: {name}")
    cols = ["ForgetLP", "RetainLP", "RealAuth", "ForgetTrajLP", "RetainTrajLP"]
    summary = summarise(per, cols)
    md = markdown(summary, cols, "Ablations", "Traj columns: log-likelihood read along the greedy denoising "
                  f"trajectory ({cfg['traj_steps']} steps max), the only place a one-step edit exists.")
    files = write_outputs(setup.out_dir, "ablations", dict(summary=summary, config=cfg, coordinate=coord), md)
    files["png"] = plot_canonical(summary, setup.out_dir / "ablations.png")
    return dict(summary=summary, markdown=md, files=files)


# ------------------------------------------------------------------------------ entry point


EXPERIMENTS = {"canonical": canonical, "scalability": scalability, "sequential": sequential, "pareto": pareto,
               "ablations": ablations}


def run_experiment(name: str, model=None, data="embedded", seeds=(0, 1, 2), out_dir=None, resume: bool = True,
                   overrides: dict | None = None, reference=None, progress: bool = True, backbone=None) -> dict:
    """Run one experiment (or "all") and write <out_dir>/<name>.{json,md,png}; returns the summary.

    model: checkpoint directory (None: the embedded model). data: "embedded", "tofu" or a TOFU dir.
    overrides: keys of CONFIGS[name] to change (e.g. {"n_mc": 8}). reference: the model that never
    saw the forget set, for Forget Quality (None: trained automatically for the embedded model).
    """
    if name == "all":
        return {n: run_experiment(n, model, data, seeds, Path(out_dir or "timerome-runs") / n, resume, overrides,
                                  reference, progress, backbone) for n in EXPERIMENTS}
    if name not in EXPERIMENTS:
        raise TimeromeError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} or all")
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise TimeromeError("give at least one seed")
    cfg = dict(CONFIGS[name])
    unknown = sorted(set(overrides or {}) - set(cfg) - {"methods"})
    if unknown:
        raise TimeromeError(f"experiment {name!r} has no setting {', '.join(unknown)}; settings: {', '.join(cfg)}")
    cfg.update(overrides or {})
    setup = make_setup(model, data, out_dir or Path("timerome-runs") / name, resume=resume, progress=progress,
                       reference=reference, reference_options=cfg.get("reference"), backbone=backbone)
    t0 = time.perf_counter()
    result = EXPERIMENTS[name](setup, seeds, cfg)
    result["seconds"] = time.perf_counter() - t0
    result["out_dir"] = str(setup.out_dir)
    return result

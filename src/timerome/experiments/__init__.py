"""The paper's experiments as data: each is a list of cells (runner.Cell) and a report.

    run_experiment("canonical", seeds=(0, 1, 2), out_dir="runs/canonical")

Each experiment file defines CONFIG (its settings, every one overridable), `cells(cfg, seeds, ctx)`
(what to measure) and `report(cfg, seeds, cells, results, ctx, out_dir)` (tables and figures:
<name>.json, <name>.md, <name>.png). `runner.Runner` computes the cells, each one cached by its
inputs, so a rerun computes only what it has not seen.

Seeds drive the Monte-Carlo masks of the likelihood (shared between methods: paired), the
insertion order of the sequential experiment and random_layer's coordinate. TimeROME's coordinate
comes from one trace (trace_seed 0), cached by its inputs and shared by every TimeROME cell.
"""

from __future__ import annotations

import time
from pathlib import Path

from timerome.backbones import load_backbone
from timerome.errors import TimeromeError
from timerome.experiments import ablations, canonical, pareto, scalability, sequential
from timerome.experiments.runner import Cell, Context, Runner, execute, resolve_data
from timerome.experiments.settings import check_settings

EXPERIMENTS = {m.NAME: m for m in (canonical, scalability, sequential, pareto, ablations)}
CONFIGS = {name: m.CONFIG for name, m in EXPERIMENTS.items()}
canonical_rows = canonical.canonical_rows

__all__ = ["EXPERIMENTS", "CONFIGS", "Cell", "Context", "Runner", "execute", "resolve_data", "run_experiment",
           "canonical_rows", "resolve_source"]


def resolve_source(data):
    """'embedded' | 'tofu' ($TIMEROME_TOFU_DIR, else the Hub) | a local TOFU directory."""
    import os

    if data in (None, "embedded"):
        return "embedded"
    if data == "tofu":
        return os.environ.get("TIMEROME_TOFU_DIR") or None
    if not Path(data).is_dir():
        raise TimeromeError(f"--data must be 'embedded', 'tofu' or a TOFU directory; {data!r} is none of them")
    return str(data)


def experiment_config(name: str, overrides: dict | None = None) -> dict:
    """CONFIGS[name] updated with overrides; an unknown setting is refused by name."""
    if name not in EXPERIMENTS:
        raise TimeromeError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} or all")
    cfg = dict(CONFIGS[name])
    unknown = sorted(set(overrides or {}) - set(cfg))
    if unknown:
        raise TimeromeError(f"experiment {name!r} has no setting {', '.join(unknown)}; settings: {', '.join(cfg)}")
    cfg.update(overrides or {})
    check_settings(name, cfg, CONFIGS[name])
    return cfg


def run_experiment(name: str, model=None, data="embedded", seeds=(0, 1, 2), out_dir=None, resume: bool = True,
                   overrides: dict | None = None, reference=None, progress: bool = True, backbone=None,
                   wait: bool | float = True) -> dict:
    """Run one experiment (or "all") and write <out_dir>/<name>.{json,md,png}; returns the summary.

    model: checkpoint directory (None: the embedded model). data: "embedded", "tofu" or a TOFU dir.
    overrides: settings of CONFIGS[name] to change (e.g. {"n_mc": 8}). reference: the model that never
    saw the forget set, for Forget Quality (None: trained automatically for the embedded model).
    wait: another run holding the output folder is waited for (True), for that many seconds, or
    not at all (False: refused, naming it).
    """
    if name == "all":
        return {n: run_experiment(n, model, data, seeds, Path(out_dir or "timerome-runs") / n, resume, overrides,
                                  reference, progress, backbone, wait) for n in EXPERIMENTS}
    cfg = experiment_config(name, overrides)
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise TimeromeError("give at least one seed")
    exp = EXPERIMENTS[name]
    bb = backbone if backbone is not None else load_backbone(model)
    ctx = Context(bb, resolve_source(data), reference=reference, reference_options=dict(cfg.get("reference") or {}),
                  model_path=model, progress=progress)
    out = Path(out_dir) if out_dir else Path("timerome-runs") / name
    runner = Runner(out, resume=resume, progress=progress, wait=wait)
    t0 = time.perf_counter()
    cells = exp.cells(cfg, seeds, ctx)  # an unknown method or setting fails here, before any work
    with runner.lock():  # the cells and the report: one run at a time in a folder
        results = runner.run(cells, ctx, title=name)
        result = exp.report(cfg, seeds, cells, results, ctx, out)
    result["seconds"] = time.perf_counter() - t0
    result["out_dir"] = str(out)
    return result

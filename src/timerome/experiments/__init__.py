"""The paper's experiments as data: each is a list of cells (runner.Cell) and a report.

    run_experiment("canonical", seeds=(0, 1, 2), out_dir="runs/canonical")

Each experiment is one file of this package (found by `_discover`, no list to extend) defining NAME,
ORDER (its place in listings and in "all"), CONFIG (its settings, every one overridable), `cells(cfg, seeds, ctx)`
(what to measure) and `report(cfg, seeds, cells, results, ctx, out_dir)` (tables and figures:
<name>.json, <name>.md, <name>.png). `runner.Runner` computes the cells, each one cached by its
inputs, so a rerun computes only what it has not seen. Optional: UNREAD_WHEN ({setting: rule(cfg) -> why
nothing reads it, or None}: a given setting that other settings leave unread is refused, `settings.py`),
UNREAD_ON_CAUSAL ({setting: what it sets}: given on an autoregressive model, refused, before it loads where
its checkpoint is surely one, `refuse_unread_on_causal`) and `check(cfg, source)` (checks that need no model,
run before it loads).

An experiment with PER_MODEL = True (xbackbone) runs its cells once per checkpoint of its `models`
setting, one model in memory at a time, and its report takes {column: (cells, results, a description of the model)};
its `methods(cfg)` ((method, settings) every model runs) are checked against each model whose checkpoint
tells its kind (`loading.causal_family`) before the first one loads.
Experiments with IN_ALL = False (utility: lm-eval's tasks; xbackbone: several checkpoints) are run
by name only, never by "all". `executor` picks who computes the cells (`executors.py`: local, the
default, or Ray); the cache is the same either way.

Seeds drive the Monte-Carlo masks of the likelihood (shared between methods: paired), the
insertion order of the sequential experiment and random_layer's coordinate. TimeROME's coordinate
comes from one trace (trace_seed 0), cached by its inputs and shared by every TimeROME cell.
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
import time
import warnings
from pathlib import Path

from timerome.backbones import load_backbone
from timerome.backbones.loading import causal_family, model_place, surely_causal
from timerome.common.cache import write_json
from timerome.common.checks import seeds as check_seeds
from timerome.common.checks import settings_object
from timerome.common.files import output_folder
from timerome.errors import Interrupted, TimeromeError
from timerome.experiments.executors import make_executor
from timerome.experiments.runner import (Cell, Context, Runner, auto_reference, check_methods_fit, execute,
                                        local_executor, measurement_of, refuse_unread_reference_options, resolve_data,
                                        warn_mixed_threads)
from timerome.experiments.settings import check_settings, refuse_unread_settings, unread_settings



def _discover() -> dict:
    """Every module of this package that defines an experiment (NAME, CONFIG, cells, report), by ORDER:
    a new experiment is one new file, found here without a list to extend."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if all(hasattr(mod, a) for a in ("NAME", "CONFIG", "cells", "report")):
            found.append(mod)
    return {m.NAME: m for m in sorted(found, key=lambda m: (getattr(m, "ORDER", 1000), m.NAME))}


EXPERIMENTS = _discover()
CONFIGS = {name: m.CONFIG for name, m in EXPERIMENTS.items()}
QUICK = {name: getattr(m, "QUICK", {}) for name, m in EXPERIMENTS.items()}  # --quick: a laptop subset
canonical_rows = EXPERIMENTS["canonical"].canonical_rows

__all__ = ["EXPERIMENTS", "CONFIGS", "QUICK", "Cell", "Context", "Runner", "execute", "resolve_data", "run_experiment",
           "canonical_rows", "resolve_source", "make_executor"]


def resolve_source(data):
    """'embedded' | 'tofu' ($TIMEROME_TOFU_DIR, else the Hub) | a local TOFU directory."""
    import os

    from timerome.data.tofu import ENV_DIR

    if data in (None, "embedded"):
        return "embedded"
    if data == "tofu":
        return os.environ.get(ENV_DIR) or None
    if not Path(data).is_dir():
        raise TimeromeError(f"--data must be 'embedded', 'tofu' or a TOFU directory; {data!r} is none of them")
    return str(data)


def experiment_config(name: str, overrides: dict | None = None, quick: bool = False, *,
                      check_unread: bool = True) -> dict:
    """CONFIGS[name] (with the experiment's QUICK subset when quick) updated with overrides; an
    unknown setting is refused by name, and a given one that the others leave unread (UNREAD_WHEN) too
    (check_unread=False: `all` judges that over every part)."""
    if name not in EXPERIMENTS:
        raise TimeromeError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} or all")
    cfg = dict(CONFIGS[name], **(QUICK[name] if quick else {}))
    settings_object(overrides, f"experiment {name!r}: overrides")
    unknown = sorted(set(overrides or {}) - set(cfg))
    removed = getattr(EXPERIMENTS[name], "REMOVED", {})  # {setting: why}: an experiment's settings it no longer has
    for key in unknown:
        if key in removed:
            raise TimeromeError(f"experiment {name!r} has no setting {key} any more: {removed[key]}")
    if unknown:
        raise TimeromeError(f"experiment {name!r} has no setting {', '.join(unknown)}; settings: {', '.join(cfg)}")
    cfg.update(overrides or {})
    check_settings(name, cfg, CONFIGS[name])
    if check_unread:
        refuse_unread_settings(name, unread_settings(cfg, overrides or {}, getattr(EXPERIMENTS[name], "UNREAD_WHEN",
                                                                                     {}), QUICK[name] if quick else None))
    return cfg


def check_before_load(name: str, cfg: dict, source, reference=None, *, given=(), model=None, backbone=None,
                      load=load_backbone) -> None:
    """An experiment's own checks of its settings that need no model (`check(cfg, source)`, where it has one:
    the request files its target fills, the splits its figure reads), before a model loads; a given
    reference's training settings (a given reference reads what it reads whatever the cells); and the
    settings given (`given`) that an autoregressive model leaves unread (the experiment's UNREAD_ON_CAUSAL),
    where the model (`backbone`, else the checkpoint `model` as `load` would load it) is one."""
    refuse_unread_on_causal(name, given, model, backbone, load)  # first: a setting read by nothing is left out
    check = getattr(EXPERIMENTS[name], "check", None)  # before its value is checked
    if check is not None:
        check(cfg, source)
    # the reference the run will have: a given one reads what it reads whatever the cells, and without one (a model
    # or data other than the embedded ones) nothing reads the reference setting
    ref = auto_reference(reference, model, source, backbone is None or getattr(backbone, "embedded", False))
    if ref != "embedded":
        refuse_unread_reference_options(dict(cfg.get("reference") or {}), ref, True, f"experiment {name!r}")


def loader_family(load) -> str | None:
    """The family `load` forces on a checkpoint, where it says so before it runs: the `family` keyword of a
    functools.partial of load_backbone (the command line's loader: --family); None (detected from the config)
    for any other loader. (A loader of the caller's own that forces a masked diffusion family on a checkpoint
    with no mask token fails its load anyway; only the reason given would differ.)"""
    if isinstance(load, functools.partial) and load.func is load_backbone:
        return load.keywords.get("family")
    return None


def refuse_unread_on_causal(name: str, given, model=None, backbone=None, load=load_backbone) -> None:
    """Refuse the settings given (`given`: the overrides) that an autoregressive model leaves unread (the
    experiment's UNREAD_ON_CAUSAL, and what its `unread_on_causal(given)` names inside them) where the model is
    one: the loaded `backbone`, else, before the load, the checkpoint `model` where `surely_causal` is sure of it
    as `load` loads it (its family: `loader_family`; the loaded model decides the rest). The same words both
    times; a default given is refused too."""
    on_causal = getattr(EXPERIMENTS[name], "UNREAD_ON_CAUSAL", {})
    unread = [(on_causal[k], 1) for k in given if k in on_causal]  # (what it sets, how many things it names)
    nested = getattr(EXPERIMENTS[name], "unread_on_causal", None)  # values inside a setting (robustness's)
    unread += nested(given) if nested is not None else []
    if not unread:
        return
    if backbone is not None:
        causal = getattr(backbone, "causal", False)
    else:
        causal = surely_causal(model, loader_family(load))
    if causal:
        it = "it" if sum(n for _, n in unread) == 1 else "them"
        raise TimeromeError(f"{name}: {'; '.join(why for why, _ in unread)}, which an autoregressive model "
                            f"({model_place(model) if model is not None else backbone.name}) has none of: "
                            f"leave {it} out")


def uses_reference(cells) -> bool:
    """Whether any of the cells scores Forget Quality (reads the reference model)."""
    return any(measurement_of(c.measure).uses_reference for c in cells)


def data_name(source) -> str:
    """A data source as a run record names it (`resolve_source`: None is TOFU from the Hub)."""
    return "tofu (the Hub)" if source is None else str(source)


def record_run(result: dict, run: dict) -> None:
    """Add what the run was (model, weights, seeds, data, reference) to its JSON output as "run": the radar
    and any script reading several outputs can tell runs of other models or seeds apart."""
    path = (result.get("files") or {}).get("json")
    if not path or not Path(path).is_file():
        return
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(saved, dict):
        write_json(path, dict(saved, run=run))


def refuse_other_model(model, backbone) -> None:
    """`model` names the run's model in its records and `backbone` computes its cells: a local checkpoint that is
    not the backbone's own would put one model's name on another's numbers. (A Hub id, or a backbone that
    records no checkpoint, is taken as named.)"""
    checkpoint = (getattr(backbone, "info", None) or {}).get("checkpoint")
    if model is None or backbone is None or not checkpoint or not Path(str(model)).exists():
        return
    if str(model).lower().endswith(".gguf"):  # loaded through its converted folder, named after the file
        same = getattr(backbone, "name", None) == Path(str(model)).stem
    else:
        same = model_place(model) == model_place(checkpoint)
    if not same:
        raise TimeromeError(f"model {model} is not the backbone's checkpoint ({checkpoint}): the run would record one "
                            "model's name beside another's numbers; give the backbone of that model, or leave model out")


def run_experiment(name: str, model=None, data="embedded", seeds=None, out_dir=None, resume: bool = True,
                   overrides: dict | None = None, reference=None, progress: bool = True, backbone=None,
                   executor=local_executor, load=load_backbone, quick: bool = False,
                   wait: bool | float = True, *, _in_all: bool = False) -> dict:
    """Run one experiment (or "all") and write <out_dir>/<name>.{json,md,png}; returns the summary.

    model: checkpoint directory (None: the embedded model). data: "embedded", "tofu" or a TOFU dir.
    seeds: the seeds of the cells (None: 0, 1, 2).
    overrides: settings of CONFIGS[name] to change (e.g. {"n_mc": 8}). reference: the model that never
    saw the forget set, for Forget Quality (None: trained automatically for the embedded model).
    executor: who computes the cells (runner.local_executor, executors.ray_executor(...)).
    load: checkpoint directory -> Backbone (how --device / --dtype reach the models xbackbone loads).
    quick: the experiment's QUICK settings (a laptop subset) under the overrides.
    wait: another run holding the output folder is waited for (True), for that many seconds, or
    not at all (False: refused, naming it). _in_all: set by name="all" for each part (a part none of whose
    cells read the reference is then no error). The JSON output records the run (model, weights, seeds,
    data, reference) under "run".
    """
    settings_object(overrides, f"experiment {name!r}: overrides")  # before dict() of a list or a string
    refuse_other_model(model, backbone)
    if out_dir is not None:
        output_folder(out_dir, "out_dir")  # a file in the way: refused now, not at the first write
    if isinstance(executor, str):  # "local" or "ray", as the command line names them
        executor = make_executor(executor)
    elif not callable(executor):
        raise TimeromeError(f"executor must be 'local', 'ray' or an executor (executors.ray_executor(...)), got "
                            f"{type(executor).__name__}")
    if name == "all":  # each experiment gets the settings it has; a setting none has is refused
        overrides = dict(overrides or {})
        ran = [n for n, m in EXPERIMENTS.items() if getattr(m, "IN_ALL", True)]
        unknown = sorted(set(overrides) - {k for n in ran for k in CONFIGS[n]})
        if unknown:
            elsewhere = sorted({n for n in EXPERIMENTS if n not in ran and set(unknown) & set(CONFIGS[n])})
            raise TimeromeError(f"no experiment of all has the setting {', '.join(unknown)}"
                                + (f" ({' and '.join(elsewhere)} {'is' if len(elsewhere) == 1 else 'are'} not part "
                                   "of all: run it by name)" if elsewhere else ""))
        own = {n: {k: v for k, v in overrides.items() if k in CONFIGS[n]} for n in ran}
        quick_of = {n: quick and bool(QUICK.get(n)) for n in ran}
        # every experiment's settings before the first cell: a bad one fails now, not hours in
        cfgs = {n: experiment_config(n, own[n], quick_of[n], check_unread=False) for n in ran}
        unread = {n: unread_settings(cfgs[n], own[n], getattr(EXPERIMENTS[n], "UNREAD_WHEN", {}),
                                     QUICK[n] if quick_of[n] else None) for n in ran}
        for key in overrides:  # one setting is shared by the parts that have it: refused only if none reads it
            having = [n for n in ran if key in own[n]]
            if having and all(key in unread[n] for n in having):
                raise TimeromeError(f"experiment 'all': nothing reads {key} ("
                                    + "; ".join(f"{n}: {unread[n][key]}" for n in having) + "): leave it out")
        for n in ran:  # a part gets only what it reads: a value it leaves unread would only change its cells' keys
            if unread[n]:
                own[n] = {k: v for k, v in own[n].items() if k not in unread[n]}
                cfgs[n] = experiment_config(n, own[n], quick_of[n], check_unread=False)
        seeds = None if seeds is None else check_seeds(seeds)  # an iterator is read once, here
        reads = {n: getattr(EXPERIMENTS[n], "READS_OUTPUTS", False) for n in ran}  # no model of their own
        source = resolve_source(data)
        for n in ran:  # and what each checks without a model, before the one model they share loads (once: the
            if not reads[n]:  # parts, run with these settings, do not check again)
                try:
                    check_before_load(n, cfgs[n], source, reference, given=own[n], model=model, backbone=backbone,
                                      load=load)
                except TimeromeError as e:  # which part refused: a fix for it may not be the whole story
                    raise TimeromeError(f"experiment all, its {n} part: {e}") from None
        if backbone is None:
            backbone = load(model)
        root, done = Path(out_dir or "timerome-runs"), {}
        for n in ran:
            try:
                done[n] = run_experiment(n, None if reads[n] else model, "embedded" if reads[n] else data,
                                         None if reads[n] else seeds,
                                         root / n, resume or reads[n],
                                         own[n], None if reads[n] else reference, progress, backbone,
                                         local_executor if reads[n] else executor, load, quick_of[n], wait,
                                         _in_all=True)
            except Interrupted as e:  # the part's own folder is not what the user gave
                raise Interrupted(f"{e}. That is {n}'s part of `experiment all`: rerun `experiment all` with the "
                                  f"same -o ({root}); the experiments done before it are cached too") from None
        return done
    cfg = experiment_config(name, overrides, quick, check_unread=not _in_all)
    given_seeds, seeds = seeds is not None, check_seeds((0, 1, 2) if seeds is None else seeds)
    exp = EXPERIMENTS[name]
    if quick and not QUICK.get(name):  # never the full protocol when a quick run was asked for
        raise TimeromeError(f"experiment {name!r} has no quick subset (those with one: "
                            f"{', '.join(n for n, q in QUICK.items() if q)}); "
                            + ("it computes nothing itself (it draws the other experiments' outputs): leave quick out"
                               if getattr(exp, "READS_OUTPUTS", False) else "shrink it with overrides instead"))
    if getattr(exp, "READS_OUTPUTS", False) and (model is not None or reference is not None or data != "embedded"
                                                 or not resume or executor is not local_executor or given_seeds):
        raise TimeromeError(f"experiment {name!r} draws the other experiments' outputs and computes no cell: "
                            "--model / --reference / --data / --fresh / --executor / --seeds (model=, reference=, "
                            "data=, resume=False, executor=, seeds=) are read by nothing; leave them out")
    out = Path(out_dir) if out_dir else Path("timerome-runs") / name
    runner = Runner(out, resume=resume, progress=progress, executor=executor, wait=wait)
    source, ref_options = resolve_source(data), dict(cfg.get("reference") or {})
    if not _in_all:  # `all` checked each part before its one model loaded
        check_before_load(name, cfg, source, reference, given=overrides or {}, model=model, backbone=backbone,
                          load=load)
    t0 = time.perf_counter()
    if getattr(exp, "PER_MODEL", False):
        if not _in_all and cfg.get("models") and model is not None:
            raise TimeromeError(f"experiment {name!r}: the models setting names every checkpoint it runs; the model "
                                "(-m / model=) beside it is read by nothing: leave it out, or add it to models")
        if cfg.get("references") and reference is not None:
            raise TimeromeError(f"experiment {name!r}: the references setting gives each model its reference; "
                                "--reference (reference=) beside it is read by nothing: give it once")
        paths = list(cfg.get("models") or [model])
        refs = list(cfg.get("references") or [reference] * len(paths))
        if reference is not None and not cfg.get("references") and len(paths) > 1:
            warnings.warn(f"one reference ({reference}) serves all {len(paths)} models: each model's Forget Quality "
                          "compares it with that one reference model; give each its own with the references setting "
                          "(-c '{\"references\": [...]}')", stacklevel=2)
        if len(refs) != len(paths):
            raise TimeromeError(f"{len(paths)} models but {len(refs)} references: give one per model (null for none)")
        for column, path in zip(exp.columns(paths), paths):  # every model the checkpoint tells the kind of, before
            family = (backbone.family if backbone is not None and path == model  # the first model loads
                      else causal_family(path, loader_family(load)))
            if family is not None:
                check_methods_fit(exp.methods(cfg), family, f"experiment {name!r} ({column})")
        per_model = {}
        with runner.lock():  # the cells and the report: one run at a time in a folder
            for column, path, ref in zip(exp.columns(paths), paths, refs):
                bb = backbone if backbone is not None and path == model else load(path)
                ctx = Context(bb, source, reference=ref, reference_options=ref_options, model_path=path,
                              progress=progress)
                cells = exp.cells(cfg, seeds, ctx)
                ctx.refuse_unread_reference_options(uses_reference(cells), f"experiment {name!r} ({column})")
                about = dict(checkpoint=str(path) if path else bb.name, family=bb.family.name, layers=bb.n_layers,
                             fingerprint=bb.fingerprint(), reference=ctx.reference_label)
                done = runner.run(cells, ctx, title=f"{name} {column}")
                about["threads"] = warn_mixed_threads(f"{name} {column}", done, bb)
                per_model[column] = (cells, done, about)
                del bb, ctx  # one model in memory at a time
            result = exp.report(cfg, seeds, per_model, out)
            record_run(result, dict(models={c: about for c, (_, _, about) in per_model.items()}, seeds=list(seeds),
                                    data=data_name(source)))
    else:
        bb = backbone if backbone is not None else load(model)
        refuse_unread_on_causal(name, overrides or {}, model, bb)  # where the checkpoint alone could not tell
        ctx = Context(bb, source, reference=reference, reference_options=ref_options, model_path=model,
                      progress=progress)
        cells = exp.cells(cfg, seeds, ctx)  # an unknown method or setting fails here, before any work
        scores_fq = uses_reference(cells)
        if reference is not None and not _in_all and cells and not scores_fq:
            raise TimeromeError(f"experiment {name!r} computes no Forget Quality: --reference (reference=) is read by "
                                "none of its cells; leave it out")
        ctx.refuse_unread_reference_options(scores_fq, f"experiment {name!r}")
        with runner.lock():  # the cells and the report: one run at a time in a folder
            results = runner.run(cells, ctx, title=name)
            threads = warn_mixed_threads(name, results, bb)
            result = exp.report(cfg, seeds, cells, results, ctx, out)
            if not getattr(exp, "READS_OUTPUTS", False):  # the radar runs no model: its sources' runs are its record
                record_run(result, dict(model=str(model) if model else bb.name, fingerprint=bb.fingerprint(),
                                        seeds=list(seeds), data=data_name(source),
                                        reference=ctx.reference_label if scores_fq else None,
                                        threads=threads))
    result["seconds"] = time.perf_counter() - t0
    result["out_dir"] = str(out)
    return result

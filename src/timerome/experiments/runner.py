"""The one experiment runner: a list of cells in, one cached result per cell out.

An experiment is data: a list of `Cell`s (what to measure, with which method and config, on
which data, under which seed). `execute(cell, context)` computes one cell and depends on nothing
else, so cells can run in any order, on any executor, and a finished cell is never computed
again: its result is a JSON file in <out_dir>/cells named by the digest of everything that
determines it (the model's fingerprint, the data, the method's full config, the seed, the
measurement's options). Rerunning an experiment computes only the cells it has not seen.

Measurements (`Cell.measure`), a registry: `@measurement("name", forwards=cost)` on a function
(cell, context, rows, task) -> result adds one, with what it costs; the experiment files add theirs
the same way (sequential, editing, robustness, extraction, lm_eval, the benchmark files'). Here:
    full        install the method, every TOFU metric (evaluation.evaluate), undo
    lp          install, log p(answer | question) of every item only, undo
    traj        install, log p read along the greedy denoising trajectory (a one-step edit exists there)
    reference   forget truth ratios of the model that never saw the forget set (Forget Quality's KS test)
An executor runs the cells that are not cached: `local_executor` (in this process, in order) by
default; any callable (cells, context, done, progress=, title=) -> None with the same contract can
replace it (`executors.ray_executor`: Ray workers), where done(i, result) stores cell i's result.
The cache is written here, by `done`, whichever executor computed the cell: a sweep started on one
executor resumes on another, and cells sharing a key are computed once.

Data specs: a cell's `data` is a TOFU spec (`resolve_data`) unless it names a `kind`; a data kind,
registered with `@data_kind("name")` on fn(spec, context) -> (rows, ForgetTask), resolves the
others (the benchmark files add MUSE, WHP, WMDP and RWKU that way, `bench_data.py`).
"""

from __future__ import annotations

import json
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from timerome.backbones import Backbone, load_backbone
from timerome.backbones.loading import checkpoint_files, model_place
from timerome.common.cache import digest, plain, restore_nonfinite, write_json
from timerome.common.checks import budget, is_int
from timerome.common.checks import seed as check_seed
from timerome.common.lock import LOCK_NAME, hold
from timerome.common.progress import notify, progress_bar
from timerome.data.task import ForgetTask
from timerome.engine.coordinate import given_step
from timerome.engine.hooks import refuse_one_step
from timerome.engine.settings import LIKELIHOOD, TRACE
from timerome.errors import Interrupted, NotApplicable, TimeromeError
from timerome.evaluation.evaluator import answer_count, evaluate, lp_only, reference_truth_ratios, trajectory_logprobs
from timerome.experiments.data import resolve_data
from timerome.methods import install, method_config
from timerome.methods.registry import NO_EDIT, get_method, keyed
from timerome.metrics.columns import split_columns
from timerome.training.from_scratch import reference_model
from timerome.training.train import recipe_eos_pad

VERSION = 5  # bump when a cell's meaning changes: old cells stop matching (3: stop 58, Leak after a refusal, WMDP ties;
# 4: stop 62, tofu:forgetXX requests with their paraphrases, WMDP rows of over 10 choices skipped, the
# outcomes' Leak over content words and saying a text case-folded; 5: stop 63, Leak over the words the
# fact's question does not say)
MEASURES: dict = {}  # name -> Measurement; `measurement` fills it
DATA_KINDS: dict = {}  # kind -> (spec, context) -> (rows, ForgetTask); `data_kind` fills it
LP_COLUMNS = split_columns("lp")      # {split: column}, declared with their metrics (metrics/tofu.py)
TRAJ_COLUMNS = split_columns("traj")


@dataclass(frozen=True)
class Measurement:
    """A registered measurement: run(cell, context, rows, task) -> JSON-able result, and forwards(cell, rows,
    task) -> about how many model forwards it takes (what `checks.budget` compares before any work)."""

    run: object
    forwards: object
    uses_method: bool = True      # the cell's key holds its method's full config
    uses_reference: bool = False  # the cell reads the reference model (Forget Quality); its key names it
    reads_steps: bool = False     # it reads the edited model along denoising steps only (no likelihoods), so an
                                  # edit of one step (a method's `step` option) acts in it; else check_cells refuses one
    options: tuple | None = None  # the Cell.options it reads (check_cells refuses any other); None: not declared
    required: tuple = ()          # those of them a cell must give (they have no default)
    not_applicable: bool = False  # a method that cannot act on the backbone (errors.NotApplicable) is an "n/a"
                                  # cell, {"metrics": {}, "not_applicable": why}, not the end of the run
    version: int = 0              # bump when this measurement's meaning changes (its cells' keys hold it when > 0;
                                  # VERSION is the same for every measurement)


def row_count(rows: dict) -> int:
    """How many rows a cell's data holds over its splits (what its measurement's cost scales with)."""
    return sum(len(v) for v in rows.values() if isinstance(v, (list, tuple, dict)))


def lp_forwards(cell, rows: dict, task) -> float:
    """The default cost: one Monte-Carlo likelihood of every row (n_mc forwards each)."""
    return cell.options.get("n_mc", LIKELIHOOD.n_mc) * row_count(rows)


@dataclass(frozen=True)
class Cell:
    """One measurement. `row` and `group` only say where it goes in the tables (not in its key)."""

    measure: str
    method: str = NO_EDIT
    config: dict = field(default_factory=dict)   # the method's overrides
    seed: int = 0
    data: dict = field(default_factory=dict)     # a data spec (`resolve_data`)
    options: dict = field(default_factory=dict)  # the measurement's: n_mc, rouge, steps, every
    row: str = ""
    group: object = None

    def key(self, context: "Context") -> dict:
        m = measurement_of(self.measure)
        full = keyed(method_config(self.method, self.config)) if m.uses_method else {}
        key = dict(measure=self.measure, method=self.method, config=full, seed=self.seed, data=self.data,
                   options=self.options, v=VERSION, **context.tag)
        if m.uses_reference:
            key["reference"] = context.reference_tag
        if m.version:  # absent at 0: the keys of the cells computed before measurements had versions still match
            key["measure_version"] = m.version
        return key


# ------------------------------------------------------------------------------ context


@dataclass
class Context:
    """What every cell of a run shares: the model, the data source, the reference for Forget Quality."""

    backbone: Backbone
    source: object = "embedded"
    reference: object = None          # None: auto (embedded model only), a path / Backbone, or "train"
    reference_options: dict = field(default_factory=dict)
    model_path: object = None
    progress: bool = True
    _data: dict = field(default_factory=dict)
    _reference: object = None
    _shared: dict = field(default_factory=dict)

    @property
    def tag(self) -> dict:
        tag = dict(model=self.backbone.cache_id(), source=str(self.source))
        if getattr(self.backbone, "causal", False):  # stop 73: an AR answer ends at its end of text (it ran on past
            tag["ar_answers"] = 1  # it), and Locality compares its beginning: cells cached before are not served
        return tag

    @property
    def reference_tag(self):
        """The reference in the cells' keys: its weights' fingerprint, or for a folder (loaded only when a cell is
        computed) its files' sizes and times, so new weights in the same folder never meet the old cells."""
        ref = self.auto_reference()
        if isinstance(ref, Backbone):
            return dict(ref=ref.fingerprint(), options=self.reference_options)
        tag = dict(ref=str(ref), options=self.reference_options)
        if ref not in (None, "embedded", "train") and Path(str(ref)).exists():
            tag["files"] = checkpoint_files(Path(str(ref)))
        if ref == "train" and recipe_eos_pad(self.backbone):  # trained with EOS padding since stop 64 (the
            tag["eos_pad"] = True                              # model's recipe); absent: the keys of before
        return tag

    @property
    def reference_label(self) -> str | None:
        """Forget Quality's reference as the outputs name it (None where there is none), with a warning
        where it is the model being evaluated (`reference_is_model`)."""
        ref = self.auto_reference()
        if ref is None:
            return None
        if isinstance(ref, Backbone):
            label = f"{ref.name} (weights {ref.fingerprint()[:12]})"
        elif ref in ("embedded", "train"):
            label = ("the embedded recipe's model trained without the forget set" if ref == "embedded"
                     else "a model trained here on the retain rows")
        else:
            label = model_place(ref)
        return label + (" - the model being evaluated itself, so its KS p is 1 by construction"
                        if self.reference_is_model() else "")

    def reference_is_model(self) -> bool:
        """Whether the reference is the model being evaluated: the same Backbone or weights (a copy's too, once
        the reference is loaded), or its folder."""
        ref = self.auto_reference()
        if isinstance(self._reference, Backbone) and not isinstance(ref, Backbone):
            ref = self._reference  # loaded for a cell: its weights say it
        if isinstance(ref, Backbone):
            return ref is self.backbone or ref.fingerprint() == self.backbone.fingerprint()
        return ref not in (None, "embedded", "train") and model_place(ref) == model_place(self.model_path)

    def auto_reference(self):
        """The reference to use: the given one, or the embedded recipe's for the embedded model."""
        return auto_reference(self.reference, self.model_path, self.source, getattr(self.backbone, "embedded", False))

    def refuse_unread_reference_options(self, uses_reference: bool, where: str) -> None:
        """`refuse_unread_reference_options` for this run's reference."""
        refuse_unread_reference_options(self.reference_options, self.auto_reference(), uses_reference, where)

    def data(self, spec: dict) -> tuple[dict, ForgetTask]:
        key = digest(spec)
        if key not in self._data:
            kind = spec.get("kind")
            if kind is None:
                self._data[key] = resolve_data(spec, self.source, self.backbone)
            elif kind in DATA_KINDS:
                self._data[key] = DATA_KINDS[kind](spec, self)
            else:
                raise TimeromeError(f"unknown data kind {kind!r}; one of {', '.join(DATA_KINDS) or 'none'}")
        return self._data[key]

    def shared(self, key, build):
        """An object the cells of this run reuse, built by build() on first use (lm-eval's task index)."""
        if key not in self._shared:
            self._shared[key] = build()
        return self._shared[key]

    def reference_backbone(self):
        if self._reference is None:
            ref = self.auto_reference()
            if ref is None:
                raise TimeromeError("no reference model for Forget Quality: pass --reference DIR (a model "
                                    "trained without the forget set) or reference='train'")
            if isinstance(ref, Backbone):
                self._reference = ref
            elif ref == "embedded":
                self._reference = reference_model(progress=self.progress, **self.reference_options)
            elif ref == "train":
                _, task = self.data({})
                opts = {k: v for k, v in self.reference_options.items() if k == "epochs"}
                self._reference = reference_model(self.backbone, retain_rows=task.retain_rows,
                                                  progress=self.progress, **opts)
            else:
                self._reference = load_backbone(ref, dtype=self.backbone.dtype, device=self.backbone.device)
        return self._reference


def auto_reference(reference, model_path, source, embedded: bool = True):
    """The reference a run has: the given one, else the embedded recipe's for the embedded model on the embedded
    data ("embedded"), else none. embedded: whether the loaded model is the embedded one (`Backbone.embedded`;
    before it loads, a model_path of None is the embedded default)."""
    if reference is not None:
        return reference
    return "embedded" if model_path is None and source == "embedded" and embedded else None


def refuse_unread_reference_options(options: dict, ref, uses_reference: bool, where: str) -> None:
    """Refuse reference options (the reference setting: how the reference model is trained) that the reference
    `ref` (None, "embedded", "train", a folder or a Backbone) does not read: the embedded recipe reads them all,
    "train" its epochs, a given model, none, or a run with no Forget Quality (uses_reference False)."""
    if not options:
        return
    ref = ref if uses_reference else None
    reads = set(options) if ref == "embedded" else {"epochs"} if ref == "train" else set()
    unread = [k for k in options if k not in reads]
    if unread:
        why = ("no cell scores Forget Quality" if not uses_reference else
               "a given reference model is trained already" if ref is not None and ref != "train" else
               "reference='train' reads only epochs" if ref == "train" else "there is no reference model")
        raise TimeromeError(f"{where}: the reference setting's {', '.join(unread)} train the reference model, "
                            f"and {why}: leave {'it' if len(unread) == 1 else 'them'} out")


# ------------------------------------------------------------------------------ one cell


def data_kind(name: str):
    """Register fn(spec, context) -> (rows, ForgetTask) as the resolver of data specs of kind `name`."""

    def deco(fn):
        DATA_KINDS[name] = fn
        return fn

    return deco


def measurement(name: str, *, forwards=lp_forwards, uses_method: bool = True, uses_reference: bool = False,
                reads_steps: bool = False, options: tuple | None = None, required: tuple = (),
                not_applicable: bool = False, version: int = 0):
    """Register fn(cell, context, rows, task) -> result as the measurement `name`, with its cost
    forwards(cell, rows, task) (default: n_mc forwards per row), what its cells' keys hold, whether
    it reads denoising steps only (Measurement.reads_steps), the cell options it reads (a cell's
    other options are refused: a misspelt one would run the default silently) and those of them
    without a default (a cell lacking one is refused before any work), and whether a method that cannot
    act on the backbone is a recorded "n/a" cell (Measurement.not_applicable) or an error; `version`: bump it
    when the measurement's meaning changes (its old cached cells stop matching, the others' do not)."""

    def deco(fn):
        MEASURES[name] = Measurement(fn, forwards, uses_method, uses_reference, reads_steps,
                                     None if options is None else tuple(options), tuple(required), not_applicable,
                                     int(version))
        return fn

    return deco


def measurement_of(name: str) -> Measurement:
    if name not in MEASURES:
        raise TimeromeError(f"unknown measurement {name!r}; one of {', '.join(MEASURES)}")
    return MEASURES[name]


def execute(cell: Cell, ctx: Context) -> dict:
    """The result of one cell (JSON-able); it depends on the cell and the context's model and data only
    (and, at the last bit of a float sum, on the CPU threads it ran on: recorded in its "cost")."""
    m = measurement_of(cell.measure)
    rows, task = ctx.data(cell.data)
    result = m.run(cell, ctx, rows, task)
    if isinstance(result, dict):
        result.setdefault("cost", {})["threads"] = torch.get_num_threads()
    return result


def thread_counts(results) -> list[int]:
    """The CPU thread counts `results` were computed under (`execute` records them), each once."""
    return sorted({r["cost"]["threads"] for r in results
                   if isinstance(r, dict) and isinstance(r.get("cost"), dict) and "threads" in r["cost"]})


def warn_mixed_threads(name: str, results, backbone) -> list[int]:
    """The thread counts of `results`, with a warning where a CPU run's cells mix several: a greedy
    answer can flip with the thread count (float sums differ), so rows read against each other
    may differ by that alone (docs/editing.md)."""
    counts = thread_counts(results)
    if len(counts) > 1 and str(getattr(backbone, "device", "cpu")).startswith("cpu"):
        warnings.warn(f"the cells of {name} were computed under {' and '.join(map(str, counts))} CPU threads (cached "
                      "cells from another run): a greedy answer can differ with the thread count alone; --fresh "
                      "recomputes them all under one", stacklevel=3)
    return counts


def with_edit(cell: Cell, ctx: Context, task, measure) -> dict:
    """Install the cell's method, run measure(edit) -> result, undo; the result gets the compute
    accounting (install seconds, how far installing raised peak memory (exact on CUDA), the cell's
    wall seconds: install + measurement + undo), the method's info and its full config.

    A method that cannot act on this backbone at all (errors.NotApplicable: a locate-then-edit baseline
    on a mixture of experts) gives, for a measurement that records it, the cell {"metrics": {},
    "not_applicable": why}: the tables print "n/a" with the reason, and the other cells still run."""
    t0 = time.perf_counter()
    try:
        edit = install(cell.method, ctx.backbone, task, cell.config, cell.seed, progress=ctx.progress)
    except NotApplicable as e:
        if not measurement_of(cell.measure).not_applicable:
            raise
        return {"metrics": {}, "not_applicable": " ".join(str(e).split()),
                "config": method_config(cell.method, cell.config)}
    try:
        res = measure(edit)
        res.setdefault("metrics", {}).update(install_seconds=edit.install_seconds,
                                             install_extra_mb=edit.extra_memory_mb)
        res["info"], res["config"] = edit.info, edit.config
    finally:
        edit.undo()
    res["metrics"]["wall_seconds"] = time.perf_counter() - t0
    return res


def _full_forwards(cell, rows, task) -> float:
    """Every answer's likelihood, and a trajectory of every row for the generation metrics."""
    return (cell.options.get("n_mc", LIKELIHOOD.n_mc) * answer_count(rows)
            + TRACE.steps * row_count(rows))


@measurement("full", forwards=_full_forwards, options=("n_mc", "rouge"), not_applicable=True)
def _full(cell, ctx, rows, task) -> dict:
    return with_edit(cell, ctx, task, lambda edit: evaluate(
        ctx.backbone, rows, n_mc=cell.options.get("n_mc", LIKELIHOOD.n_mc), seed=cell.seed, edit=edit,
        rouge=cell.options.get("rouge", True), progress=ctx.progress))


def _lps(lps: dict, cols: dict, edit, t0: float) -> dict:
    return {"items": {k: {"lp": v} for k, v in lps.items()},
            "metrics": {cols[k]: float(np.mean(v)) for k, v in lps.items() if k in cols},
            "cost": dict(edit.cost(), eval_seconds=time.perf_counter() - t0)}


@measurement("lp", options=("n_mc",), not_applicable=True)
def _lp(cell, ctx, rows, task) -> dict:
    def measure(edit):
        t0 = time.perf_counter()
        lps = lp_only(ctx.backbone, rows, n_mc=cell.options.get("n_mc", LIKELIHOOD.n_mc), seed=cell.seed, edit=edit)
        return _lps(lps, LP_COLUMNS, edit, t0)

    return with_edit(cell, ctx, task, measure)


@measurement("traj", forwards=lambda cell, rows, task: cell.options.get("steps", TRACE.steps) * row_count(rows),
             reads_steps=True, options=("steps",), not_applicable=True)
def _traj(cell, ctx, rows, task) -> dict:
    def measure(edit):
        t0 = time.perf_counter()
        lps = {k: trajectory_logprobs(ctx.backbone, v, steps=cell.options.get("steps", TRACE.steps), edit=edit)
               for k, v in rows.items()}
        return _lps(lps, TRAJ_COLUMNS, edit, t0)

    return with_edit(cell, ctx, task, measure)


def _reference_forwards(cell, rows, task) -> float:
    return cell.options.get("n_mc", LIKELIHOOD.n_mc) * answer_count({"forget": rows.get("forget", [])})


@measurement("reference", uses_method=False, uses_reference=True, forwards=_reference_forwards, options=("n_mc",))
def _reference(cell, ctx, rows, task) -> dict:
    n_mc = cell.options.get("n_mc", LIKELIHOOD.n_mc)
    if "forget" not in rows:  # before the reference model is trained or loaded, not after
        raise TimeromeError("a reference cell scores the forget split's truth ratios, and its data spec's splits leave "
                            "forget out")
    return {"tr": reference_truth_ratios(ctx.reference_backbone(), rows["forget"], n_mc=n_mc, seed=cell.seed)}


# ------------------------------------------------------------------------------ checks before any work


# options of the measurements (Cell.options): name -> (what it must be, test)
OPTION_RULES = {
    "n_mc": ("an integer >= 1", lambda v: is_int(v) and v >= 1),
    "steps": ("an integer >= 1", lambda v: is_int(v) and v >= 1),
    "every": ("an integer >= 1", lambda v: is_int(v) and v >= 1),
    "rouge": ("true or false", lambda v: isinstance(v, bool)),
}


def check_methods_fit(methods, family, where: str = "") -> None:
    """Each (method, its settings) against the registry's model_check for a model of `family` (the settings
    that kind of model leaves unread: cloze states on an AR model). where: what runs them, for the message."""
    for method, config in methods:
        check = get_method(method).model_check
        if check is not None:
            try:
                check(family, method_config(method, config))
            except TimeromeError as e:
                raise TimeromeError(f"{where}: {e}" if where else str(e)) from None


def check_cells(cells: list[Cell], ctx: Context) -> None:
    """What would otherwise fail mid-run, checked before the first cell: the measurement, the
    method and its options (in the cell's key), the measurement's options, the data, the reference,
    the seeds, and the work all of them take together (`checks.budget`)."""
    # a method setting this model leaves unread (cloze states on an AR model): before any rows are read
    check_methods_fit(methods_of(cells), ctx.backbone.family)
    forwards = 0.0
    for c in cells:
        m = measurement_of(c.measure)
        unread = sorted(set(c.options) - set(m.options)) if m.options is not None else []
        if unread:
            raise TimeromeError(f"{c.row or c.method}: the {c.measure!r} measurement reads no option "
                                f"{', '.join(map(repr, unread))}; it reads {', '.join(m.options) or 'none'}")
        lacking = [k for k in m.required if k not in c.options]
        if lacking:
            raise TimeromeError(f"{c.row or c.method}: the {c.measure!r} measurement needs the option(s) "
                                f"{', '.join(map(repr, lacking))}")
        for key, value in c.options.items():
            want, ok = OPTION_RULES.get(key, (None, None))
            if ok is not None and not ok(value):
                raise TimeromeError(f"{c.row or c.method}: option {key} must be {want}, got {value!r}")
        check_seed(c.seed, f"{c.row or c.method}: seed")
        config = c.key(ctx)["config"]  # method_config: an unknown method or option, a bad value
        step = config.get("step")
        if step is None:  # [layer, point, step]: the same
            step = given_step(config.get("coordinate"))
        if not m.reads_steps:
            causal = getattr(ctx.backbone, "causal", False)
            refuse_one_step(step, f"{c.row or c.method}: the edit", f"the {c.measure!r} measurement reads",
                            "leave step out (every step), or measure it where answers " + (
                                "are read (the editing experiment, lm-eval's generative tasks)" if causal else
                                "or trajectories are read (the editing experiment, the ablations' Traj columns, "
                                "lm-eval's generative tasks)"), causal=causal)
        rows, task = ctx.data(c.data)  # the splits exist, the rows fit, forget and retain do not overlap
        if c.measure == "reference" and "forget" not in rows:  # the reference cell scores the forget split
            raise TimeromeError(f"{c.row or 'reference'}: a reference cell scores the forget split's truth ratios, "
                                "and its data spec's splits leave forget out")
        if m.uses_reference and ctx.auto_reference() is None:
            raise TimeromeError("no reference model for Forget Quality: pass --reference DIR (a model trained "
                                "without the forget set)")
        forwards += m.forwards(c, rows, task)
    if cells:
        budget(f"the {len(cells)} cells to compute", forwards, "their likelihoods and trajectories")


def methods_of(cells: list[Cell]) -> list[tuple[str, dict]]:
    """The (method, settings) the cells install, each once (a measurement that installs none left out)."""
    out = {}
    for c in cells:
        if measurement_of(c.measure).uses_method:
            out.setdefault(digest([c.method, c.config]), (c.method, c.config))
    return list(out.values())


# ------------------------------------------------------------------------------ the runner


def local_executor(cells: list[Cell], ctx: Context, done, progress: bool = True, title: str = "cells") -> None:
    """Compute the cells here, one after the other, with a progress bar."""
    with progress_bar(title, total=len(cells), enabled=progress and bool(cells)) as bar:
        for i, c in enumerate(cells):
            done(i, execute(c, ctx))
            bar.advance(description=f"{title}: {c.row or c.method} seed {c.seed}")


class Runner:
    """Runs cells with a cache in <out_dir>/cells; `resume=False` recomputes everything.

    One run at a time per folder: a second process on the same folder waits for the first
    (`wait=True`), or is refused with the holder's name (`wait=False`), `lock.hold`. A cell file
    that cannot be read (a crash mid-write of an older version, a disk error, a hand edit) is
    reported, moved aside as <name>.corrupt-<time> and computed again.
    """

    def __init__(self, out_dir, *, resume: bool = True, progress: bool = True, executor=local_executor,
                 wait: bool | float = True):
        self.out_dir, self.resume, self.progress, self.executor = Path(out_dir), resume, progress, executor
        self.wait = wait  # the folder is made by the first run's lock: a run refused before it makes none

    @contextmanager
    def lock(self):
        """The folder's lock, held by `run` (and by callers that write reports after it). Taking it makes
        the folder; a block that fails or is refused before anything is kept in it leaves no folder it
        made behind."""
        missing = [d for d in (self.out_dir, *self.out_dir.parents) if not d.exists()]  # the folders it makes
        with hold(self.out_dir / LOCK_NAME, wait=self.wait, what=f"the experiment folder {self.out_dir}"):
            try:
                yield
            except BaseException:
                if missing:  # removed while the lock is held: a run waiting on it locks the path anew
                    self._remove_unused(missing)
                raise

    def _remove_unused(self, made: list[Path]) -> None:
        """Remove the folder if it holds nothing but the lock and an empty cells/ (nothing computed), and
        the folders above it that were `made` with it, while they are empty."""
        cells = self.out_dir / "cells"
        try:
            if {p.name for p in self.out_dir.iterdir()} <= {LOCK_NAME, "cells"} and not any(cells.glob("*")):
                (self.out_dir / LOCK_NAME).unlink(missing_ok=True)
                if cells.is_dir():
                    cells.rmdir()
                for d in made:  # the folder, then its parents: rmdir leaves a folder that is not empty
                    d.rmdir()
        except OSError:  # something else appeared meanwhile: it stays
            pass

    def path(self, cell: Cell, ctx: Context) -> Path:
        return self.out_dir / "cells" / f"{digest(cell.key(ctx))}.json"

    def cached(self, cell: Cell, ctx: Context) -> dict | None:
        return self._read(self.path(cell, ctx))

    def _sweep(self) -> None:
        """Remove the temporary files a run killed mid-write left in cells/ (SIGKILL, power loss): only
        the lock holder writes there, so none of them is another run's work in progress."""
        for tmp in (self.out_dir / "cells").glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    def _read(self, p: Path) -> dict | None:
        if not (self.resume and p.is_file()):
            return None
        try:
            saved = json.loads(p.read_text(encoding="utf-8"))
            result = saved["result"]
            if not isinstance(result, dict):
                raise TypeError(f"its result is a {type(result).__name__}")
            # standard JSON writes NaN as null: the marks put the cell's non-finite numbers back
            return restore_nonfinite(result, saved.get("nonfinite", []))
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            aside = p.with_name(f"{p.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            p.replace(aside)
            notify(f"cell file {p} was unreadable ({type(e).__name__}: {str(e)[:80]}); moved it to {aside.name} "
                   "and computing that cell again")
            return None

    def run(self, cells: list[Cell], ctx: Context, title: str = "cells") -> list[dict]:
        """Every cell's result, in order: cached ones read, the others computed (and cached)."""
        with self.lock():
            self._sweep()
            paths = [self.path(c, ctx) for c in cells]
            results = [self._read(p) for p in paths]
            # cells with one key (the same measurement listed twice, e.g. in two groups) are computed once
            same: dict[Path, list[int]] = {}
            for i, r in enumerate(results):
                if r is None:
                    same.setdefault(paths[i], []).append(i)
            todo = [ix[0] for ix in same.values()]
            check_cells([cells[i] for i in todo], ctx)
            finished = []

            def done(j: int, result: dict) -> None:  # cell todo[j] finished: keep it, cache it at once
                c, path = cells[todo[j]], paths[todo[j]]
                for i in same[path]:
                    results[i] = result
                marks = []  # where standard JSON's nulls stand for NaN or infinities (`_read` puts them back)
                write_json(path, {"cell": asdict(c), "key": c.key(ctx), "result": plain(result, marks),
                                  "nonfinite": marks})
                finished.append(j)

            cached = len(cells) - sum(map(len, same.values()))
            try:
                self.executor([cells[i] for i in todo], ctx, done, progress=self.progress,
                              title=f"{title} ({cached} cached)" if cached else title)
            except (KeyboardInterrupt, Interrupted) as e:
                kept = f"{cached + len(finished)} of {len(cells)} {title} cells are cached in {self.out_dir / 'cells'}"
                inner = f"{e}; " if isinstance(e, Interrupted) else ""
                # an earlier run's reports, left as they were: NAME.md beside its NAME.json (a user's notes are not)
                old = sorted(p.name for p in self.out_dir.glob("*.md") if p.with_suffix(".json").is_file())
                stale = (f"; {', '.join(old)} (and {'its' if len(old) == 1 else 'their'} .json / .png) in it "
                         f"{'is' if len(old) == 1 else 'are'} the last complete run's, not this one's") if old else ""
                raise Interrupted(f"{inner}{kept}; run the same command again with the same output folder "
                                  f"({self.out_dir}) to go on from there{stale}") from None
            missing = [cells[i].row or cells[i].method for i, r in enumerate(results) if r is None]
            if missing:
                raise TimeromeError(f"the executor returned without computing {len(missing)} cells "
                                    f"({', '.join(missing[:3])}); rerun to resume from the cached ones")
            return results

"""The method registry (open-unlearning style): one small file per method, one decorator each.

A method is a function

    @register("name", defaults={...}, canonical=[{...}, ...])
    def install(backbone, task: ForgetTask, config: dict, seed: int) -> Edit

that returns an `Edit`. Inference-time methods return `InferenceEdit(context_factory)`: the
model is untouched and `edit.active()` installs the hooks for a `with` block. Weight-changing
methods (GA, NPO, ROME, ...) change the weights inside `weight_edit(backbone)`, which snapshots
them first, so `edit.undo()` puts them back. Both kinds carry their install cost.

`config` is the method's `defaults` updated with the caller's overrides, so a method reads every
key it declared. `canonical` lists the configurations the canonical experiment runs for this
method (one row each); by default one row with the defaults. `prepare(backbone, task, config, progress)`,
when a method has one, does the work that is shared by every install on the same model and data
(TimeROME's trace, its background statistics) and caches it by its inputs; `install` runs it
before the timed install, so install cost never includes it (it is reported as prepare_seconds).
`model_check(family, config)`, when a method has one, refuses settings a model of that family (its kind:
masked diffusion or autoregressive, `backbones.families.Family`) leaves unread (the ROME-style methods'
cloze states on an autoregressive model); `install` runs it before any work, an experiment before its
first cell (before any model loads where the checkpoint tells its family: `loading.causal_family`).
`gated`, for a memory built at one given coordinate with radii from calibration rows (the codebook and rewrite
memories: `GatedBuild`), says how `timerome edit` builds it there, so the command names no method.

Every module in the `timerome.methods` package is imported on first use of the registry, so a
new method is one new file: nothing else to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from timerome.common.checks import big_int_path, budget, is_int, is_real, nonfinite_path
from timerome.common.checks import seed as check_seed
from timerome.common.checks import settings_object, shown
from timerome.common.cost import measure
from timerome.common.progress import progress_wanted
from timerome.data.facts import own_targets
from timerome.data.task import ForgetTask
from timerome.engine.coordinate import given_step
from timerome.engine.settings import TRACE
from timerome.errors import TimeromeError
from timerome.tracing.tie import READ_POSITIONS


@dataclass
class Edit:
    """An installed method: `with edit.active():` evaluates the edited model; `undo()` restores it."""

    method: str
    config: dict
    install_seconds: float = 0.0
    peak_memory_mb: float = 0.0    # high-water mark while installing (see `cost.measure`)
    extra_memory_mb: float = 0.0   # how far installing raised it
    prepare_seconds: float = 0.0   # the method's shared one-off work (`prepare`), not in install_seconds
    info: dict = field(default_factory=dict)
    # {question: target} of the facts that said their own target, for a method with a `target` setting
    # (it edits each such fact to its own): what evaluate() reads an answer against (`edit_targets`)
    targets: dict = field(default_factory=dict)

    def active(self):
        return nullcontext()

    def undo(self) -> None:
        pass

    def cost(self) -> dict:
        return dict(install_seconds=self.install_seconds, peak_memory_mb=self.peak_memory_mb,
                    extra_memory_mb=self.extra_memory_mb, prepare_seconds=self.prepare_seconds)


@dataclass
class InferenceEdit(Edit):
    """Hooks only: `context()` must return a fresh context manager that installs and removes them."""

    context: Callable | None = None
    memory: object = None  # the EditMemory behind it, for the memory-based methods
    undone: bool = False

    def active(self):
        if self.undone:  # it would still edit: its hooks are made anew by every active()
            raise TimeromeError(f"this {self.method} edit was undone: install it again to use it")
        return self.context() if self.context is not None else nullcontext()

    def undo(self) -> None:
        self.undone = True


@dataclass
class WeightEdit(Edit):
    """The weights were changed in place; `undo()` loads the snapshot taken before.

    fingerprint: the backbone's fingerprint when the snapshot was taken, if it was known then (never
    computed for this); undo hands it back with the weights, which it restores bit for bit into the same
    tensors, so the next memory bound to the model does not hash every weight again (seconds per cell on
    an 8B model, `Backbone.fingerprint`)."""

    backbone: object = None
    snapshot: dict | None = None
    fingerprint: str | None = None
    tensors: tuple = ()  # `Backbone.parameter_tensors()` when the snapshot was taken
    undone: bool = False

    def active(self):
        if self.undone:  # the weights are the unedited model's again: scores would be the unedited model's
            raise TimeromeError(f"this {self.method} edit was undone: install it again to use it")
        return nullcontext()

    def undo(self) -> None:
        if self.snapshot is not None:
            _unstack(self)  # refused out of order: the edit is then still in place, and usable
            self.backbone.model.load_state_dict(self.snapshot)
            self.snapshot = None
            if self.fingerprint is not None and self.backbone.parameter_tensors() == self.tensors:
                self.backbone.know_fingerprint(self.fingerprint)
        self.undone = True

    def changed(self) -> bool:
        """Whether any weight differs from the snapshot (False: the method stopped before changing
        anything, e.g. an early stop at step 0)."""
        now = self.backbone.model.state_dict()
        return self.snapshot is None or any(not torch.equal(now[k], v) for k, v in self.snapshot.items() if k in now)


@dataclass(frozen=True)
class GatedBuild:
    """How `timerome edit` (and `memory add`) build a gated memory at the coordinate the user gives (--layer,
    --trace), its radii measured on calibration rows, without the coordinate search of the method's install."""

    build: Callable                         # (backbone, task, config, coordinate, facts, seed) -> the memory
    step: bool = True                       # reads --step; False: it acts at every step (--step refused)
    default_layer: Callable | None = None   # backbone -> the layer where neither --layer nor --trace is given
    refuse_model: Callable | None = None    # backbone -> None: a kind of model it cannot edit, before rows are read
    check_target: Callable | None = None    # (backbone, facts, target) -> None: a target it cannot write
    said_facts: bool = False                # it keys the answers the model says (asked first: `said_by_model`)
    embedded_rows: str | None = None        # its calibration rows on the embedded corpus (None: retain_perturbed)


# a Method's `retain` for the methods that read the retain rows only in place of their background texts (ROME-style
# key statistics, `_locate.preserved_texts`): where they read a background at all, none is given, and the model is
# not the embedded one (its own training rows stand in there)
IN_PLACE_OF_BACKGROUND = "in place of background"


@dataclass(frozen=True)
class Method:
    name: str
    install: Callable
    defaults: dict
    canonical: tuple  # config overrides, one canonical-table row each
    kind: str         # "inference" or "weights"
    doc: str
    prepare: Callable | None = None  # (backbone, task, config, progress) -> None: shared one-off work, cached
    deterministic: Callable | bool = False  # its install draws nothing at random (config -> bool where it depends on
                                            # the settings): the seed it is given changes nothing (`draws_nothing`)
    check: Callable | None = None  # (config) -> None: refuses settings that contradict each other, before any work
    # what its install reads of a task beside the facts, a bool or config -> bool (under which settings): the
    # background texts, the retain rows (the rows to leave alone); the command line refuses what goes unread
    background: Callable | bool = False
    retain: Callable | bool | str = True  # or IN_PLACE_OF_BACKGROUND
    # (backbone, config) -> None: refuses settings the loaded model leaves unread (e.g. cloze states on an
    # autoregressive model): `install` calls it before any work, an experiment's check_cells before any cell
    model_check: Callable | None = None
    gated: GatedBuild | None = None  # how `timerome edit` builds it at a given coordinate (a gated memory)
    # whether it installs on an autoregressive model: "yes", or under which settings, or "no: why" (`timerome methods`)
    autoregressive: str = "yes"
    # an inference method: whether its edit is a memory `timerome edit` can save (False: hooks only, such as a
    # steering vector, evaluated in place by an experiment)
    saves: bool = True


# options added to methods after results were cached, each with the value that gives the results from before
# it: at that value an option stays out of what names a cached result (`keyed`), so those results stay found
ADDED = {"trace_read_positions": TRACE.read_positions}


def keyed(config: dict) -> dict:
    """A method's config without the `ADDED` options at their earlier value: what names its cached results.
    A `module` beside a coordinate with a step is marked: it keeps that step since stop 67 (it edited every
    step before), so results cached for it then are not served for the edit it names now. So is a training
    method's retain term without the safe protocol: it reads every retain row since stop 68 (the early-stop
    check's rows, for a check that never ran, were held out before)."""
    out = {k: v for k, v in config.items() if not (k in ADDED and v == ADDED[k])}
    if out.get("module") and given_step(out.get("coordinate")) is not None:
        out["module_keeps_step"] = True
    if out.get("safe") is False and "check_rows" in out and (float(out.get("retain_w") or 0) > 0
                                                             or "retain_act_w" in out):
        out["retain_reads_all_rows"] = True  # since stop 68: without the safe protocol no check holds rows out
    return out


METHODS: dict[str, Method] = {}
NO_EDIT = "no_edit"  # the unedited model's method: the reference row of every paired test
_loaded = False


def register(name: str, *, defaults: dict | None = None, canonical: list[dict] | None = None,
             kind: str = "inference", prepare: Callable | None = None, deterministic: Callable | bool = False,
             check: Callable | None = None, background: Callable | bool = False, retain: Callable | bool | str = True,
             model_check: Callable | None = None, gated: GatedBuild | None = None, autoregressive: str = "yes",
             saves: bool = True):
    """Decorator: add a method under `name` (see the module docstring). deterministic=True (or config ->
    bool: under which settings): its install draws nothing at random, so the seed it is given changes
    nothing (the CLI says so for --seed).
    check(config): refuses (TimeromeError) settings that contradict each other; `method_config` calls it.
    background, retain: whether the install reads the task's background texts, its retain rows (a bool, or
    config -> bool where it depends on the settings: `reads_background`, `reads_retain`; retain may also be
    IN_PLACE_OF_BACKGROUND: only where no background texts are given).
    model_check(family, config): refuses settings a model of that family leaves unread (`install` calls it with
    the backbone's family before any work, the experiments before any cell).
    gated: how `timerome edit` builds the method's memory at a coordinate it is given (`GatedBuild`).
    autoregressive: whether it installs on an autoregressive model, as `timerome methods` shows it: "yes", the
    settings under which it does, or "no: " and why (the install refuses it there, in its own words).
    saves: an inference method's edit is a memory file `timerome edit` saves (False: hooks only)."""
    if kind not in ("inference", "weights"):
        raise TimeromeError(f"method kind must be 'inference' or 'weights', got {kind!r}")
    if isinstance(retain, str) and retain != IN_PLACE_OF_BACKGROUND:
        raise TimeromeError(f"retain must be a bool, config -> bool or {IN_PLACE_OF_BACKGROUND!r}, got {retain!r}")

    def deco(fn):
        if name in METHODS and METHODS[name].install is not fn:
            raise TimeromeError(f"two methods are registered as {name!r}")
        METHODS[name] = Method(name, fn, dict(defaults or {}), tuple(dict(c) for c in (canonical or [{}])),
                               kind, (fn.__doc__ or "").strip().split("\n")[0], prepare,
                               deterministic, check, background, retain, model_check, gated, autoregressive,
                               saves)
        return fn

    return deco


def _load_all() -> None:
    # import every sibling module once, so their @register calls run
    global _loaded
    if _loaded:
        return
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if mod.name != "registry" and not mod.name.startswith("_"):
            importlib.import_module(f"timerome.methods.{mod.name}")
    _loaded = True


def available() -> list[str]:
    """Registered method names, in registration order (no_edit first)."""
    _load_all()
    names = list(METHODS)
    return sorted(names, key=lambda n: (n != "no_edit", names.index(n)))


def _holds(flag, config: dict) -> bool:
    """A `Method` flag under `config` (a `method_config`): a bool, or config -> bool."""
    return bool(flag(config) if callable(flag) else flag)


def draws_nothing(name: str, config: dict) -> bool:
    """Whether method `name` under `config` draws nothing at random as it installs."""
    return _holds(get_method(name).deterministic, config)


def reads_background(name: str, config: dict) -> bool:
    """Whether method `name` under `config` reads the task's background texts."""
    return _holds(get_method(name).background, config)


def reads_retain(name: str, config: dict, *, background_given: bool = False, embedded: bool = False) -> bool:
    """Whether method `name` under `config` reads the task's retain rows, given background texts or not, on the
    embedded model or another (a method whose `retain` is IN_PLACE_OF_BACKGROUND reads them only in their place)."""
    flag = get_method(name).retain
    if isinstance(flag, str) and flag == IN_PLACE_OF_BACKGROUND:
        return reads_background(name, config) and not background_given and not embedded
    return _holds(flag, config)


def get_method(name: str) -> Method:
    _load_all()
    if name not in METHODS:
        raise TimeromeError(f"unknown method {name!r}; registered methods: {', '.join(available())}")
    return METHODS[name]


# options renamed so that each word means one thing: `steps` denoising steps, `alpha` an edit's strength,
# `lam` the ridge memory's lambda (old name -> (new name, why)); an old name gets its new one in the error
RENAMED = {"steps": ("grad_steps", "gradient steps; `steps` means denoising steps"),
           "alpha": ("retain_act_w", "the retain-activation weight; `alpha` means an edit's strength"),
           "lam": ("mom2_weight", "MEMIT's background weight; `lam` means the ridge memory's lambda")}


def differs(value, default) -> bool:
    """value is not the default (a JSON list and the default's tuple alike compare by their items)."""
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) != list(default)
    return value != default


# options a method reads only under another option's value: (options, unread(config), why). Any method with
# such an option obeys its rule: given a value other than its default where nothing would read it, it is
# refused (`method_config`), never silently ignored
UNREAD_WHEN = (
    (("lam",), lambda c: c.get("lam_absolute") is not None,
     "lam_absolute gives the ridge lambda (the paper's absolute one): give the lambda once"),
    (("lora_alpha",), lambda c: not c.get("lora_r"),
     "lora_r is 0: the weights train whole, there is no LoRA adapter to scale"),
    (("anchor", "drift", "check_every", "check_rows", "check_mc"), lambda c: c.get("safe") is False,
     "safe is false: no retain anchor and no early-stop check"),
    (("rel_threshold",), lambda c: c.get("null_energy") is not None,
     "null_energy chooses the null space: rel_threshold is the other rule"),
    (("target",), lambda c: c.get("objective", "target") != "target",
     "the objective pushes the original answer down; only objective 'target' writes a target"),
)


def _refuse_unread(cfg: dict, defaults: dict) -> None:
    for keys, unread, why in UNREAD_WHEN:
        given = [k for k in keys if k in defaults and differs(cfg[k], defaults[k])]
        if given and unread(cfg):
            raise TimeromeError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} read by nothing here: "
                                f"{why} (leave {'it' if len(given) == 1 else 'them'} out)")


def method_config(name: str, overrides: dict | None = None) -> dict:
    """The method's defaults updated with overrides; unknown keys are refused (typos)."""
    m = get_method(name)
    settings_object(overrides, f"method {name!r}: the config")
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(m.defaults))
    for key in unknown:
        new, why = RENAMED.get(key, (None, ""))
        if new in m.defaults:
            raise TimeromeError(f"method {name!r}: option {key!r} is called {new!r} now ({why})")
    if unknown:
        raise TimeromeError(f"method {name!r} has no option {', '.join(unknown)}; "
                            f"its options are {', '.join(sorted(m.defaults)) or 'none'}")
    cfg = {**m.defaults, **overrides}
    for k in overrides:
        _check_option(name, k, m.defaults[k], cfg[k])
    if cfg.get("select_modules") and "trace_modules" in cfg:  # refused before the trace, not after it
        outside = [x for x in cfg["select_modules"] if x not in cfg["trace_modules"]]
        if outside:
            raise TimeromeError(f"method {name!r}: select_modules {', '.join(map(str, outside))} "
                                f"{'is' if len(outside) == 1 else 'are'} not traced (trace_modules "
                                f"{', '.join(map(str, cfg['trace_modules']))}): select among the traced modules")
    try:
        _refuse_unread(cfg, m.defaults)
        if m.check is not None:
            m.check(cfg)
    except TimeromeError as e:
        raise TimeromeError(f"method {name!r}: {e}") from None
    return cfg


# options that count something: a 0 would fail deep inside a method with a bare IndexError
_COUNTS = {"grad_steps", "batch_size", "n_states", "check_every", "check_rows", "check_mc", "trace_facts",
           "trace_steps", "trace_samples", "stats_samples", "preserve_texts", "n_background", "key_states",
           "update_layers"}
# a layer or a denoising step: None (the method's own choice) or an integer index, never 1.9 or True read as 1
_INDICES = {"layer", "step"}


# options that scale a step or divide: 0 or below trains nothing or divides by zero (NPO's 2 / beta gave a
# model of NaN weights), a negative learning rate ascends where the method descends
# A regulariser whose solve needs it (MEMIT's mom2_weight, AlphaEdit's l2: at 0 the update is unbounded
# and retain LP fell by ~100 nats), a cap on a delta (clamp 0 changed nothing, below 0 flipped its sign
# every step), a steering size (RMU's steer, Adaptive-RMU's scale)
_POSITIVE = {"lr", "fit_lr", "beta", "mom2_weight", "l2", "clamp", "steer", "scale"}
# weights and limits: below 0 they turn a penalty into a reward (SimNPO's gamma 0: its retain term alone);
# a strength below 0 pushes the other way (ROME's ridge 0 is its own unregularised C^-1)
_NON_NEGATIVE = {"weight_decay", "grad_clip", "drift", "retain_w", "retain_act_w", "anchor", "ridge", "preserve",
                 "gamma", "alpha", "strength"}
# fractions: AlphaEdit's null-space thresholds (at 1 or above every direction is kept, nothing preserved)
_FRACTIONS = {"rel_threshold", "null_energy"}


def _check_option(method: str, key: str, default, value) -> None:
    def bad(want):
        raise TimeromeError(f"method {method!r}: option {key} must be {want}, got {shown(value)}")

    where = nonfinite_path(value) or big_int_path(value)
    if where:  # anywhere inside the option (a list of layers, a nested setting): never a usable number
        bad(f"finite, with integers below 2**63 ({key}{where if where.startswith('[') else ''} is not)")
    if key in _COUNTS:
        if not (is_int(value) and value >= 1):
            bad("an integer >= 1")
        budget(f"method {method!r} with {key} {value}", value, f"at least one forward per unit of {key}")
    if key in _POSITIVE and not (is_real(value) and value > 0):
        bad("a number > 0")
    if key in _NON_NEGATIVE and not (is_real(value) and value >= 0):
        bad("a number >= 0")
    if key == "eps" and not (is_real(value) and 0 < value < 1):
        bad("a number in (0, 1) (the least masking rate drawn)")
    if key in _FRACTIONS and value is not None and not (is_real(value) and 0 < value < 1):
        bad("a number in (0, 1)" + (" or null" if default is None else ""))
    if key == "threshold" and not (is_real(value) and -1 <= value < 1):
        bad("a cosine in [-1, 1) (at 1 or above no token is gated: an edit that does nothing)")
    if key in _INDICES and value is not None and not is_int(value):
        bad("null or an integer index")
    if key == "target" and not (isinstance(value, str) and value.strip()):
        bad("a non-empty text (what the edited model should say)")
    if isinstance(default, bool) and not isinstance(value, bool):
        bad("true or false")
    if is_real(default) and not is_real(value):
        bad("a number")
    if key == "trace_kind" and value not in ("tie", "positional"):
        bad("'tie' or 'positional'")
    if key == "trace_read_positions" and value not in READ_POSITIONS:
        bad(" or ".join(map(repr, READ_POSITIONS)))
    if key == "layers" and value is not None and (
            not isinstance(value, (list, tuple)) or not value or not all(is_int(v) for v in value)):
        bad("null or a non-empty list of layer indices")


def recorded_config(config: dict, facts) -> dict:
    """The config an edit records: its `target` none where every fact says its own target (the default
    target was never read; review 91: the API recorded "I don't know." for a counterfactual set)."""
    facts = list(facts or [])
    if "target" in config and facts and all(getattr(f, "target", None) for f in facts):
        return dict(config, target=None)
    return config


def install(name: str, backbone, task: ForgetTask, config: dict | None = None, seed: int = 0, *,
            progress: bool = False) -> Edit:
    """Run method `name` on the backbone; the returned Edit carries its measured install cost. progress: the
    bars of what its preparation computes (a trace) and of its install's long loops (`progress.wanted`), where
    the caller shows progress (`timerome edit`, an experiment's cells)."""
    m = get_method(name)
    cfg = method_config(name, config)
    check_seed(seed, f"method {name!r}: seed")
    if not isinstance(task, ForgetTask):
        raise TimeromeError(f"method {name!r}: task must be a ForgetTask (timerome.forget_task(...), requests_task, "
                            f"or ForgetTask(rows, facts, retain_rows)), got {type(task).__name__}")
    if m.model_check is not None:  # settings this model leaves unread: before any work
        m.model_check(backbone.family, cfg)
    t0 = time.perf_counter()
    if m.prepare is not None:
        m.prepare(backbone, task, cfg, progress=bool(progress))
    prepared = time.perf_counter() - t0
    with measure(backbone) as cost, progress_wanted(progress):  # its own bars (v*, key statistics, gradient steps)
        edit = m.install(backbone, task, cfg, int(seed))
    if not isinstance(edit, Edit):
        raise TimeromeError(f"method {name!r} returned {type(edit).__name__}, not an Edit")
    edit.method, edit.config = name, recorded_config({**cfg, **(edit.config or {})}, task.facts)  # its own win
    if "target" in cfg:  # a method that says a target says each fact's own (rome, memit, act_steer, ...)
        edit.targets = own_targets(task.facts)
    edit.install_seconds, edit.peak_memory_mb, edit.extra_memory_mb = (
        cost["seconds"], cost["peak_mb"], cost["extra_mb"])
    if isinstance(edit, WeightEdit):
        # a method that stopped before its first step (early stop on the retain drift) changed
        # nothing: the tables say so instead of reporting a silent no_edit
        edit.info = dict(edit.info or {}, weights_changed=edit.changed())
    edit.prepare_seconds = prepared
    return edit


def need_facts(facts) -> list:
    """The facts a method edits, as a list; refused when there are none (every forget row gave none)."""
    facts = list(facts)
    if not facts:
        raise TimeromeError("the forget set has no usable facts")
    return facts


@contextmanager
def weight_edit(backbone, method: str = ""):
    """For weight-changing methods: snapshot the weights, yield the WeightEdit to return.

        with weight_edit(backbone, "ga") as edit:
            train(...)            # change backbone.model in place
        return edit
    If the body raises, the weights are restored before the error propagates.
    """
    snap = {k: v.detach().clone() for k, v in backbone.model.state_dict().items()}
    known = getattr(backbone, "known_fingerprint", None)  # a Backbone's (not another model wrapper's)
    edit = WeightEdit(method=method, config={}, backbone=backbone, snapshot=snap,
                      fingerprint=known() if known is not None else None,
                      tensors=backbone.parameter_tensors() if known is not None else ())
    try:
        yield edit
    except BaseException:
        edit.undo()
        raise
    _outstanding(backbone).append(weakref.ref(edit))


def _outstanding(backbone) -> list:
    """The model's weight edits not undone yet, in the order they were made (weak references: an edit
    no one holds can no longer be undone, and is no longer in the way)."""
    stack = backbone.__dict__.setdefault("_weight_edits", [])
    stack[:] = [r for r in stack if r() is not None and r().snapshot is not None]
    return stack


def _unstack(edit: WeightEdit) -> None:
    """Take `edit` off its model's outstanding weight edits, refused while a later one is outstanding:
    its snapshot holds the weights before it, so undoing it first would drop the later edit, and
    undoing the later one after would bring this one's weights back."""
    stack = _outstanding(edit.backbone)
    mine = [i for i, r in enumerate(stack) if r() is edit]
    if not mine:  # undone on an error inside weight_edit, before it was stacked
        return
    later = [r().method or "a weight edit" for r in stack[mine[0] + 1:]]
    if later:
        raise TimeromeError(f"this {edit.method or 'weight'} edit was made before {', '.join(later)}, which "
                            f"{'is' if len(later) == 1 else 'are'} not undone: undo the later edits first (each "
                            "puts back the weights it found)")
    del stack[mine[0]]

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
method (one row each); by default one row with the defaults.

Every module in the `timerome.methods` package is imported on first use of the registry, so a
new method is one new file: nothing else to edit.
"""

from __future__ import annotations

import importlib
import numbers
import os
import pkgutil
import resource
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from timerome.errors import TimeromeError


@dataclass
class ForgetTask:
    """What every method may use: the forget rows and their facts, plus retain rows (gradient
    baselines anchor on them; the whitened key metric measures its background statistics on
    them when `background` is None and the model is not the embedded one)."""

    forget_rows: list[dict]
    facts: list                    # timerome.data.facts.Fact, one per usable forget row
    retain_rows: list[dict] = field(default_factory=list)
    background: object = None      # EditMemory's `background=`: None, a list of texts, or ResidualStats


@dataclass
class Edit:
    """An installed method: `with edit.active():` evaluates the edited model; `undo()` restores it."""

    method: str
    config: dict
    install_seconds: float = 0.0
    peak_memory_mb: float = 0.0    # high-water mark while installing (see `measure`)
    extra_memory_mb: float = 0.0   # how far installing raised it
    info: dict = field(default_factory=dict)

    def active(self):
        return nullcontext()

    def undo(self) -> None:
        pass

    def cost(self) -> dict:
        return dict(install_seconds=self.install_seconds, peak_memory_mb=self.peak_memory_mb,
                    extra_memory_mb=self.extra_memory_mb)


@dataclass
class InferenceEdit(Edit):
    """Hooks only: `context()` must return a fresh context manager that installs and removes them."""

    context: Callable | None = None

    def active(self):
        return self.context() if self.context is not None else nullcontext()


@dataclass
class WeightEdit(Edit):
    """The weights were changed in place; `undo()` loads the snapshot taken before."""

    backbone: object = None
    snapshot: dict | None = None

    def undo(self) -> None:
        if self.snapshot is not None:
            self.backbone.model.load_state_dict(self.snapshot)
            self.snapshot = None


@dataclass(frozen=True)
class Method:
    name: str
    install: Callable
    defaults: dict
    canonical: tuple  # config overrides, one canonical-table row each
    kind: str         # "inference" or "weights"
    doc: str


METHODS: dict[str, Method] = {}
_loaded = False


def register(name: str, *, defaults: dict | None = None, canonical: list[dict] | None = None,
             kind: str = "inference"):
    """Decorator: add a method under `name` (see the module docstring)."""
    if kind not in ("inference", "weights"):
        raise TimeromeError(f"method kind must be 'inference' or 'weights', got {kind!r}")

    def deco(fn):
        if name in METHODS and METHODS[name].install is not fn:
            raise TimeromeError(f"two methods are registered as {name!r}")
        METHODS[name] = Method(name, fn, dict(defaults or {}), tuple(dict(c) for c in (canonical or [{}])),
                               kind, (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return deco


def _load_all() -> None:
    # import every sibling module once, so their @register calls run
    global _loaded
    if _loaded:
        return
    import timerome.methods as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name != "registry" and not mod.name.startswith("_"):
            importlib.import_module(f"timerome.methods.{mod.name}")
    _loaded = True


def available() -> list[str]:
    """Registered method names, in registration order (no_edit first)."""
    _load_all()
    names = list(METHODS)
    return sorted(names, key=lambda n: (n != "no_edit", names.index(n)))


def get_method(name: str) -> Method:
    _load_all()
    if name not in METHODS:
        raise TimeromeError(f"unknown method {name!r}; registered methods: {', '.join(available())}")
    return METHODS[name]


def method_config(name: str, overrides: dict | None = None) -> dict:
    """The method's defaults updated with overrides; unknown keys are refused (typos)."""
    m = get_method(name)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(m.defaults))
    if unknown:
        raise TimeromeError(f"method {name!r} has no option {', '.join(unknown)}; "
                            f"its options are {', '.join(sorted(m.defaults)) or 'none'}")
    cfg = {**m.defaults, **overrides}
    for k in overrides:
        _check_option(name, k, m.defaults[k], cfg[k])
    return cfg


# options that count something: a 0 would fail deep inside a method with a bare IndexError
_COUNTS = {"steps", "batch_size", "n_states", "check_every", "check_rows", "check_mc", "trace_facts",
           "trace_steps", "trace_samples"}


def _check_option(method: str, key: str, default, value) -> None:
    def bad(want):
        raise TimeromeError(f"method {method!r}: option {key} must be {want}, got {value!r}")

    if key in _COUNTS and not (_is_a(numbers.Integral, value) and value >= 1):
        bad("an integer >= 1")
    if isinstance(default, bool) and not isinstance(value, bool):
        bad("true or false")
    if _is_a(numbers.Real, default) and not _is_a(numbers.Real, value):
        bad("a number")
    if key == "layers" and value is not None and (
            not isinstance(value, (list, tuple)) or not value or not all(_is_a(numbers.Integral, v) for v in value)):
        bad("null or a non-empty list of layer indices")


def _is_a(kind, v) -> bool:
    # bool is an int to Python, never a count or a strength to a user
    return isinstance(v, kind) and not isinstance(v, bool)


def install(name: str, backbone, task: ForgetTask, config: dict | None = None, seed: int = 0) -> Edit:
    """Run method `name` on the backbone; the returned Edit carries its measured install cost."""
    m = get_method(name)
    cfg = method_config(name, config)
    with measure(backbone) as cost:
        edit = m.install(backbone, task, cfg, int(seed))
    if not isinstance(edit, Edit):
        raise TimeromeError(f"method {name!r} returned {type(edit).__name__}, not an Edit")
    edit.method, edit.config = name, {**cfg, **(edit.config or {})}  # the method's own adjustments win
    edit.install_seconds, edit.peak_memory_mb, edit.extra_memory_mb = (
        cost["seconds"], cost["peak_mb"], cost["extra_mb"])
    return edit


# ------------------------------------------------------------------------------ cost


def _rss_peak_mb() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 0.0


def _rss_now_mb() -> float | None:
    """The resident set now (Linux), or None where /proc is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_MB
    except (OSError, ValueError, IndexError):
        return None


class _RssWatch:
    """Highest resident set seen from construction to `stop()`, sampled every `every` seconds by a thread.

    torch's kernels release the GIL, so the thread samples during long operations too; an
    allocation shorter than the interval can be missed, and memory the allocator reuses without
    asking the OS for more is not seen (both make `extra` a lower bound).
    """

    def __init__(self, start_mb: float, every: float = 0.002):
        self.every, self.peak, self._done = every, start_mb, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.wait(self.every):
            self.peak = max(self.peak, _rss_now_mb() or 0.0)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return max(self.peak, _rss_now_mb() or 0.0)


@contextmanager
def measure(backbone=None):
    """Wall seconds and peak memory of the block, into the yielded dict.

    On CUDA: torch's peak allocated bytes during the block (extra = peak - allocated before).
    On CPU (Linux): the highest resident set sampled during the block (extra = peak - resident set
    before; see _RssWatch). Elsewhere on CPU: the process's high-water mark (ru_maxrss), which never
    goes down, so `extra_mb` is how far the block pushed it (0 when it stayed below an earlier peak).
    """
    cuda = backbone is not None and backbone.device.type == "cuda"
    out = {"seconds": 0.0, "peak_mb": 0.0, "extra_mb": 0.0}
    watch = None
    if cuda:
        torch.cuda.synchronize(backbone.device)
        torch.cuda.reset_peak_memory_stats(backbone.device)
        before = torch.cuda.memory_allocated(backbone.device) / 2**20
    elif (before := _rss_now_mb()) is not None:
        watch = _RssWatch(before)
    else:
        before = _rss_peak_mb()
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        if cuda:
            torch.cuda.synchronize(backbone.device)
            peak = torch.cuda.max_memory_allocated(backbone.device) / 2**20
        elif watch is not None:
            peak = watch.stop()
        else:
            peak = _rss_peak_mb()
        out.update(seconds=time.perf_counter() - t0, peak_mb=peak, extra_mb=max(0.0, peak - before))


@contextmanager
def weight_edit(backbone, method: str = ""):
    """For weight-changing methods: snapshot the weights, yield the WeightEdit to return.

        with weight_edit(backbone, "ga") as edit:
            train(...)            # change backbone.model in place
        return edit
    If the body raises, the weights are restored before the error propagates.
    """
    snap = {k: v.detach().clone() for k, v in backbone.model.state_dict().items()}
    edit = WeightEdit(method=method, config={}, backbone=backbone, snapshot=snap)
    try:
        yield edit
    except BaseException:
        edit.undo()
        raise

"""timerome: trace -> select -> multi-fact edit memory (paper Algorithm 1), as a registered method.

Stage 1 traces the first `trace_facts` validation facts (F_v: the task's `validation` facts, by
default its forget facts, as Algorithm 1's F_v subset of F) with TIE, or, with
trace_kind="positional", with ROME's positional trace (`positional_trace`: the AR protocol, the
ablations' "AR positional" row; it runs on autoregressive backbones too, where TIE refuses), stage 2 picks
the coordinate with the largest mean |TIE| among `select_modules` (the paper edits the residual
stream, m* = resid, at every step, k* = -1), stage 3 builds the EditMemory on the whole forget set
and the returned Edit installs its hook. A given `coordinate` skips stages 1-2, and the settings only
the trace reads are then refused rather than ignored (`check_trace_settings`).

The trace and the background statistics depend only on the model, the facts and their settings,
so `prepare` computes them once and caches them on disk by those inputs (`timerome.common.cache`):
every later install on the same model and data (other alphas, seeds, experiment cells, other
processes) reads them back. `install` never includes them in its time.
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import torch

from timerome.common.cache import cache_dir, cached_tensors, digest, made_once
from timerome.engine.coordinate import Coordinate, given_step
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.engine.settings import EDIT, TRACE
from timerome.errors import DiffusionOnly, TimeromeError
from timerome.memory.edit_memory import DEFAULT_ALPHA, DEFAULT_KEY_METRIC, EditMemory
from timerome.memory.ridge import DEFAULT_LAM
from timerome.memory.whitening import DEFAULT_SHRINKAGE, ResidualStats, background_texts, residual_stats, rows_to_texts
from timerome.methods.registry import InferenceEdit, differs, need_facts, register
from timerome.tracing.causal_trace import ENGINE as TRACE_ENGINE
from timerome.tracing.causal_trace import trace
from timerome.tracing.result import TornPair, TraceResult, meta_path
from timerome.tracing.selection import select_coordinate

# The one table of defaults: EditMemory's, the CLI's and the experiments' are these.
# Calibrated on the embedded model (forget01 = one author's 20 facts, all sharing one subject key):
# there the paper's (alpha <= 2, q = 2..4) leave the forget set almost untouched, because TopQ keeps
# q of 20 near-equal coefficients; the dense update with a relative ridge forgets selectively. The
# paper's grid stays in CANONICAL for comparison. The update acts at every step and compounds, so
# the effect of alpha is steep (README, "Operating point").
DEFAULTS = dict(
    alpha=DEFAULT_ALPHA, q=EDIT.q, lam=DEFAULT_LAM,
    lam_absolute=None,    # the paper's absolute lambda instead of lam (ridge.py)
    key_metric=DEFAULT_KEY_METRIC, g_max=None, target=DEFAULT_TARGET,
    coordinate=None,      # [layer, point]; None = traced
    module=None,          # replace the point of the (traced) coordinate: the attn / mlp ablations
    step=None,            # None = every denoising step (k* = -1); an int = that step only
    trace_facts=TRACE.n_facts, trace_steps=TRACE.steps, trace_samples=TRACE.n_samples, trace_modules=("resid", "attn", "mlp"),
    select_modules=("resid",), trace_seed=0,
    trace_kind="tie",     # "tie": the diffusion-time trace; "positional": ROME's positional trace, the coordinate
                          # of the largest mean effect at the last subject token among select_modules
    trace_read_positions=TRACE.read_positions,  # TIE's read-out: "all" (the paper) or "no_subject" (tie.py)
)
TRACE_KINDS = ("tie", "positional")
# the paper's four (alpha, q) operating points in the paper's memory (Eq. multifact: raw keys, an absolute
# lambda; the paper gives no value of lambda, 1 is the plain ridge), then this toolkit's defaults
PAPER_MEMORY = dict(key_metric="paper", lam_absolute=1.0)


def paper_point(alpha: float, q: int) -> dict:
    """The timerome config of one of the paper's operating points: (alpha, q) in the paper's memory
    (PAPER_MEMORY), not this toolkit's whitened keys and relative lambda. Every experiment's paper
    row is one of these."""
    return dict(alpha=alpha, q=q, **PAPER_MEMORY)


CANONICAL = [paper_point(a, q) for a, q in ((0.25, 2), (0.5, 2), (1.0, 2), (2.0, 4))] + [{}]


def trace_forget_set(backbone, facts, config, progress: bool = False) -> TraceResult:
    """TIE trace of the validation subset, cached on disk by its inputs."""
    if getattr(backbone, "causal", False):  # before the trace's own refusal, which names the CLI, not the settings
        raise DiffusionOnly(f"{backbone.name} is autoregressive, and this method's trace is TIE (trace_kind 'tie', a "
                            "denoising-trajectory protocol): set trace_kind 'positional' (ROME's positional trace) or "
                            "give a coordinate")
    settings = dict(steps=int(config["trace_steps"]), n_samples=int(config["trace_samples"]),
                    modules=tuple(config["trace_modules"]), seed=int(config["trace_seed"]))
    read = config.get("trace_read_positions", TRACE.read_positions)
    if read != TRACE.read_positions:  # named only where not the paper's, so that earlier cached traces stay found
        settings["read_positions"] = read
    return _cached_trace("trace", backbone, facts, config, settings, trace, TraceResult.load, progress)


def positional_forget_set(backbone, facts, config, progress: bool = False):
    """ROME's positional trace of the validation subset, cached on disk by its inputs."""
    from timerome.tracing.positional_trace import PositionalTrace, positional_trace

    settings = dict(n_samples=int(config["trace_samples"]), modules=tuple(config["trace_modules"]),
                    seed=int(config["trace_seed"]))
    return _cached_trace("positional", backbone, facts, config, settings, positional_trace, PositionalTrace.load,
                         progress)


def _cached_trace(kind, backbone, facts, config, settings, run, load, progress):
    """run(backbone, the first trace_facts facts, **settings), or its cached file (named by the inputs)."""
    fv = list(facts)[: int(config["trace_facts"])]
    if not fv:
        raise TimeromeError("no forget facts to trace")
    key = digest(dict(kind=kind, model=backbone.cache_id(), settings=settings, engine=TRACE_ENGINE,
                      facts=[(f.subject, f.prompt, f.object) for f in fv]))
    path = cache_dir() / "traces" / f"{key}.safetensors"

    def traced():
        result = run(backbone, fv, progress=progress, **settings)
        result.save(path)
        return result

    def cached():  # None where not there, or where its two files are of two saves (one is traced again)
        try:
            return load(path) if path.is_file() and meta_path(path).is_file() else None
        except TornPair:
            return None

    # one process traces, another waits for it
    return made_once(path, f"the cached trace {path.stem}", cached, traced)


def select(result: TraceResult, modules=("resid",), neighbours: TraceResult | None = None, beta: float = TRACE.beta):
    """Best candidate among `modules` of a trace (all modules when None), with the neighbour penalty
    beta x the neighbours' mean |TIE| when given: a selection.Candidate."""
    return select_coordinate(result, neighbours, beta, modules=modules).best


TRACE_OPTIONS = tuple(k for k in DEFAULTS if k.startswith(("trace", "select")))  # what only the trace reads
# what only TIE reads (ROME's positional trace reads trace_facts, trace_samples, trace_modules, trace_seed and
# select_modules): each with what it chooses, for the refusal
TIE_ONLY = {"trace_steps": "trace_steps sets TIE's denoising steps",
            "trace_read_positions": "trace_read_positions chooses TIE's read-out"}


def check_trace_settings(config, *, traced: bool, why: str = "a given coordinate skips that trace",
                         read_anyway: tuple = ()) -> None:
    """Refuse settings that no trace would read (they would be ignored): where no trace runs (`traced`
    False, `why`), any setting only the trace reads but those in `read_anyway` (the codebook's and
    rewrite's trace_seed, their calibration seed); else TIE's own (TIE_ONLY: its steps, its read-out)
    with ROME's positional trace."""
    if not traced:
        unread = [k for k in TRACE_OPTIONS if k not in read_anyway and differs(config.get(k, DEFAULTS[k]), DEFAULTS[k])]
        if unread:
            raise TimeromeError(f"{', '.join(unread)} choose{'s' if len(unread) == 1 else ''} the trace that places "
                                f"the memory, and {why}: leave out one or the other (`timerome edit` always gives a "
                                "coordinate: trace with `timerome trace` and pass --trace)")
        return
    if config.get("trace_kind", "tie") == "positional":
        tie = [k for k in TIE_ONLY if differs(config.get(k, DEFAULTS[k]), DEFAULTS[k])]
        if tie:
            raise TimeromeError(f"{' and '.join(TIE_ONLY[k] for k in tie)}; ROME's positional trace (trace_kind "
                                "'positional') runs one forward per restored row and reads the object at the "
                                "answer as it is: leave one of them out")


def check_step(config) -> None:
    """Refuse a step given twice, inside `coordinate` ([layer, point, step]) and as `step`, unless the same:
    one of them would be read, the other not."""
    inside, step = given_step(config.get("coordinate")), config.get("step")
    if inside is not None and step is not None and inside != Coordinate(0, "resid", step).step:  # -1: every step
        raise TimeromeError(f"the coordinate's step {inside} and step {step}: give the denoising step once")


def check_config(config) -> None:
    """The timerome method's `check`: trace settings no trace reads, a step given twice."""
    check_trace_settings(config, traced=not config.get("coordinate"))
    check_step(config)


def locate(backbone, task, config, progress: bool = False) -> tuple[Coordinate, dict]:
    """The coordinate where the edit acts (every step unless `step`), and what was done to find it."""
    kind = config.get("trace_kind", "tie")
    if kind not in TRACE_KINDS:
        raise TimeromeError(f"trace_kind must be one of {', '.join(TRACE_KINDS)}, got {kind!r}")
    if config.get("coordinate"):
        coord, info = Coordinate.of(config["coordinate"]), {"coordinate_source": "given"}
    elif kind == "positional":
        from timerome.tracing.positional_trace import select_positional

        t0 = time.perf_counter()
        result = positional_forget_set(backbone, task.validation_facts, config, progress)
        choice = select_positional(result, config.get("select_modules") or result.modules)
        coord = choice.edit_coordinate
        info = {"coordinate_source": "positional trace", "trace_seconds": time.perf_counter() - t0,
                "positional_effect": choice.effect, "category": choice.category}
    else:
        t0 = time.perf_counter()
        best = select(trace_forget_set(backbone, task.validation_facts, config, progress), config.get("select_modules"))
        coord = best.edit_coordinate
        info = {"coordinate_source": "traced", "trace_seconds": time.perf_counter() - t0,
                "traced_step": best.step, "mean_abs_tie": best.mean_abs_tie}
    if config.get("module"):  # the point replaced; the layer and a given coordinate's step kept
        coord = dataclasses.replace(coord, point=config["module"])
    step = config.get("step")
    return Coordinate.of(coord, None if step is None else int(step)).on(backbone), info


def background_stats(backbone, coordinate, task, config):
    """ResidualStats for the whitened key metric (cached on disk), None for the paper metric."""
    if config["key_metric"] != "whitened":
        return None
    bg = task.background
    if isinstance(bg, ResidualStats):
        return bg
    if bg is None and not getattr(backbone, "embedded", False):
        # any other model: what it was trained on, as far as the task knows
        bg = rows_to_texts(task.retain_rows + task.forget_rows) or None  # none: background_texts says what to pass
    texts = background_texts(backbone, bg)
    site = Coordinate.of(coordinate).site

    def make():
        st = residual_stats(backbone, site, texts)
        return {"mean": st.mean, "cov": st.cov, "n_tokens": torch.tensor(st.n_tokens)}

    t = cached_tensors("background", dict(model=backbone.cache_id(), site=site, texts=texts,
                                          shrinkage=DEFAULT_SHRINKAGE), make)
    return ResidualStats(site[0], site[1], t["mean"], t["cov"], int(t["n_tokens"]), DEFAULT_SHRINKAGE)


def build_memory(backbone, task, config, coordinate, facts=None) -> EditMemory:
    """An EditMemory at `coordinate` with the config's hyper-parameters, filled with `facts`
    (default: every forget fact; [] for an empty memory whose relative lambda is scaled on the
    task's facts all the same, so streaming inserts solve the same ridge problem): `EditMemory.build`."""
    return EditMemory.build(
        backbone, coordinate, task.facts if facts is None else facts, scale_facts=task.facts,
        background=background_stats(backbone, coordinate, task, config), target=config.get("target") or DEFAULT_TARGET,
        alpha=float(config["alpha"]), lam=float(config["lam"]), lam_absolute=config.get("lam_absolute"),
        q=int(config["q"]), key_metric=config["key_metric"], g_max=config.get("g_max"))


def memory_edit(backbone, task, config, coordinate, method="timerome", info=None) -> InferenceEdit:
    """Build the memory on every forget fact and wrap it as an inference-time Edit."""
    need_facts(task.facts)
    asked = int(config["q"])
    if asked > len(task.facts):  # TopQ cannot keep more than |F|: all of them is the dense update it asks for
        warnings.warn(f"{method}: q={asked} is more than the {len(task.facts)} facts edited: TopQ keeps all of "
                      f"them (q={len(task.facts)}, the dense update)", stacklevel=2)
        config = dict(config, q=len(task.facts))
        info = dict(info or {}, q_asked=asked)
    memory = build_memory(backbone, task, config, coordinate)
    c = memory.coordinate
    info = dict(info or {}, layer=c.layer, point=c.point, step=c.step, n_facts=len(memory), lam_abs=memory.lam_value)
    return InferenceEdit(method=method, config=config, info=info, context=lambda: memory.applied(backbone),
                         memory=memory)


def prepare(backbone, task, config, progress: bool = False) -> None:
    """The trace and the background statistics at the coordinate, into their disk caches (progress: the
    trace's bar, where the caller shows progress: on a real model the trace is the install's longest part)."""
    coordinate, _ = locate(backbone, task, config, progress)
    background_stats(backbone, coordinate, task, config)


def whitened(config) -> bool:
    """Whether the memory's keys are whitened: then, and only then, it reads background texts."""
    return config["key_metric"] == "whitened"


@register("timerome", defaults=DEFAULTS, canonical=CANONICAL, prepare=prepare, deterministic=True, check=check_config,
          background=whitened, autoregressive="with trace_kind 'positional' or a coordinate")
def timerome(backbone, task, config, seed):
    """TimeROME-DLM: traced coordinate, low-rank multi-fact memory, every denoising step."""
    coordinate, info = locate(backbone, task, config)
    with torch.no_grad():
        return memory_edit(backbone, task, config, coordinate, info=info)

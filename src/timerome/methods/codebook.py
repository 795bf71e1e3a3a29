"""codebook: TimeROME's trace and selection, then the radius-gated codebook memory (beyond the paper).

The same stages 1-2 as `timerome` (the trace of F_v picks the coordinate, or `coordinate` is
given); stage 3 builds a `CodebookMemory` instead of the paper's ridge memory: keys per subject
token over partially masked states, each with a radius measured on the retain corpus, so a token
away from every key gets exactly zero update and alpha can be raised without touching retain
answers (docs/selectivity.md has the measured frontier). `coordinates="per_fact"` traces every
forget fact and gives each its own traced layer (the paper's limitation 4): one memory per
coordinate, all installed together.

The radii are calibrated on the task's retain rows plus `calibration` (rows or texts: e.g. the
neighbours to protect), minus the forget rows themselves; the trace, the whitening statistics and
the calibration residuals are cached on disk by `prepare` (install time never includes them).
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager

import torch

from timerome.data.rows import load_rows
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.errors import DiffusionOnly, TimeromeError
from timerome.memory.codebook_memory import (CALIBRATION_STATES, DEFAULT_ALPHA, DEFAULT_COMPLETE, DEFAULT_INNER,
                                             DEFAULT_MARGIN, DEFAULT_OBJECT_KEYS, DEFAULT_STATES, DEFAULT_WRITE,
                                             CodebookMemory, calibration_residuals)
from timerome.memory.whitening import rows_to_texts
from timerome.metrics.editing import normalise
from timerome.methods.registry import GatedBuild, InferenceEdit, differs, need_facts, register
from timerome.methods.timerome_edit import DEFAULTS as PAPER
from timerome.methods.timerome_edit import background_stats, check_step, check_trace_settings, locate, trace_forget_set
from timerome.tracing.selection import per_fact_best

DEFAULTS = dict(
    alpha=DEFAULT_ALPHA, margin=DEFAULT_MARGIN, inner=DEFAULT_INNER, n_states=DEFAULT_STATES,
    complete=DEFAULT_COMPLETE,  # fire only where every token of the subject is present (spares name-sharers)
    values="cloze",        # "cloze": the paper's d = v_t - v_o; "states": over partially masked states
    object_keys=DEFAULT_OBJECT_KEYS,  # also key the answer tokens (the object's evidence, in its own context)
    write=DEFAULT_WRITE,   # "tokens": where the gate fires; "sequence": every token of a sequence where it fires
    target=DEFAULT_TARGET,
    calibration=None,      # extra rows/texts the radii must spare: 'embedded:SPLIT', 'tofu:SPLIT', a file, a list
    coordinates="traced",  # "traced": one coordinate for all facts; "per_fact": each fact's own traced layer
    coordinate=None,       # [layer, point]; None = traced
    step=None,             # None = every denoising step
    **{k: v for k, v in PAPER.items() if k.startswith(("trace", "select"))},
)
# the defaults, then the radius gate alone (written where it fires, no subject-complete gate, no object keys)
CANONICAL = [{}, dict(write="tokens", complete=False, object_keys=False)]
COORDINATES = ("traced", "per_fact")


def calibration_rows(task, config) -> list:
    """The retain rows and `calibration` (rows or texts), minus every row that states a forget fact:
    the same question or the same answer as a forget row (so a forget fact's paraphrased question,
    answered alike, never calibrates the radii that must let it through)."""
    extra = config.get("calibration")
    if isinstance(extra, str):
        extra = load_rows(extra)
    rows = list(task.retain_rows) + list(extra or [])
    rows = [r for r, said in zip(rows, stating(rows, task.forget_rows)) if not said]
    if not rows:
        raise TimeromeError("the codebook and rewrite memories calibrate their radii on retain text: the task has no "
                            "retain rows; give calibration= rows or texts the edit must leave alone (or the task's "
                            "retain_rows=)")
    return rows


def stating(rows, forget_rows) -> list[bool]:
    """Whether each row (a question/answer row or a text) states a forget fact: the text of a forget row,
    or a row with the same question or the same answer as one (`calibration_rows` leaves these out),
    compared as `metrics.editing.normalise` writes them (a decoded answer, "in Pellmoor.", is the
    corpus's "in Pellmoor .")."""
    forget = {normalise(t) for t in rows_to_texts(forget_rows)}
    said = {normalise(r[k]) for r in forget_rows for k in ("question", "answer") if isinstance(r, dict) and r.get(k)}
    return [normalise(rows_to_texts([r])[0] if isinstance(r, dict) else r) in forget
            or (isinstance(r, dict) and any(r.get(k) and normalise(r[k]) in said for k in ("question", "answer")))
            for r in rows]


def calibration_tokens(backbone, coordinate, task, config, rows=None, pads=None, last_pads=None,
                       n_states: int = CALIBRATION_STATES) -> torch.Tensor:
    """Residuals of the calibration rows' states (default: `calibration_rows`; pads: end-of-text
    after the answers, token_keys._states; last_pads: also the last-step states with these
    end-of-text counts) at the coordinate, drawn with the config's trace_seed (the memory's
    calibration_seed), cached on disk by their inputs (`calibration_residuals`)."""
    rows = calibration_rows(task, config) if rows is None else rows
    return calibration_residuals(backbone, coordinate, rows, n_states=n_states, seed=calibration_seed(config),
                                 pads=pads, last_pads=last_pads)


def calibration_seed(config) -> int:
    """The seed of the calibration states: the config's trace_seed (default 0)."""
    return int(config.get("trace_seed", 0))


def coordinates(backbone, task, config, progress: bool = False) -> tuple[dict, dict]:
    """{Coordinate: [facts]} and what was done to find them."""
    if config.get("coordinates", "traced") == "traced":  # `check_config` has refused any other mode but per_fact
        coord, info = locate(backbone, task, config, progress)
        return {coord: list(task.facts)}, info
    # one TIE trace of every fact places each (the validation subset's trace would place none of them)
    if getattr(backbone, "causal", False):
        raise DiffusionOnly(f"{backbone.name} is autoregressive, and coordinates 'per_fact' reads each fact's layer "
                            "from a TIE trace (a denoising-trajectory protocol): use coordinates 'traced' with "
                            "trace_kind 'positional' (ROME's positional trace), or give a coordinate")
    t0 = time.perf_counter()
    result = trace_forget_set(backbone, task.facts, dict(config, trace_facts=len(task.facts)), progress)
    best = per_fact_best(result.only(tuple(config["select_modules"])))
    step = config.get("step")
    groups: dict = {}
    for fact, cand in zip(task.facts, best):
        c = Coordinate.of(cand.edit_coordinate, None if step is None else int(step)).on(backbone)
        groups.setdefault(c, []).append(fact)
    info = dict(coordinate_source="per-fact trace", per_fact_seconds=time.perf_counter() - t0,
                per_fact_layers={f"{c.layer}:{c.point}": len(fs) for c, fs in groups.items()})
    return groups, info


def build(backbone, task, config, coordinate, facts, seed: int = 0) -> CodebookMemory:
    """A CodebookMemory at `coordinate` with the config's settings, filled with `facts` (their key
    states drawn with `seed`)."""
    stats = background_stats(backbone, coordinate, task, dict(config, key_metric="whitened"))
    memory = CodebookMemory(backbone, coordinate, background=stats,
                            calibration=calibration_tokens(backbone, coordinate, task, config),
                            alpha=float(config["alpha"]), margin=float(config["margin"]), inner=float(config["inner"]),
                            complete=config["complete"], write=config["write"],
                            n_states=config["n_states"], values=config["values"], object_keys=config["object_keys"],
                            target=config.get("target") or DEFAULT_TARGET, seed=seed,
                            calibration_seed=calibration_seed(config))
    return memory.add(facts)


@contextmanager
def _all_applied(backbone, memories):
    with ExitStack() as stack:
        for m in memories:
            stack.enter_context(m.applied(backbone))
        yield


def prepare(backbone, task, config, progress: bool = False) -> None:
    """The trace(s), the whitening statistics and the calibration residuals, into their disk caches
    (progress: the trace's bar)."""
    groups, _ = coordinates(backbone, task, config, progress)
    for coord in groups:
        background_stats(backbone, coord, task, dict(config, key_metric="whitened"))
        calibration_tokens(backbone, coord, task, config)


def check_config(config) -> None:
    """The codebook's `check`: the coordinates mode against the trace it needs (each fact's own layer is
    read from one TIE trace of every fact: a given coordinate, another fact count or ROME's positional
    trace would go unread), trace settings no trace reads, a step given twice."""
    mode = config.get("coordinates", "traced")
    if mode not in COORDINATES:
        raise TimeromeError(f"coordinates must be one of {', '.join(COORDINATES)}, got {mode!r}")
    if mode == "per_fact":
        if config.get("coordinate"):
            raise TimeromeError('coordinates "per_fact" traces each fact\'s own layer, and a given coordinate '
                                "places them all: leave out one or the other")
        if config.get("trace_kind", "tie") != "tie":
            raise TimeromeError('coordinates "per_fact" reads each fact\'s layer from a TIE trace, not ROME\'s '
                                "positional trace: leave trace_kind out")
        if differs(config.get("trace_facts", PAPER["trace_facts"]), PAPER["trace_facts"]):
            raise TimeromeError('coordinates "per_fact" traces every fact: trace_facts is read by nothing')
    check_trace_settings(config, traced=not config.get("coordinate"), read_anyway=("trace_seed",))
    check_step(config)


@register("codebook", defaults=DEFAULTS, canonical=CANONICAL, prepare=prepare, check=check_config, background=True,
          gated=GatedBuild(build=build), autoregressive="with trace_kind 'positional' or a coordinate")
def codebook(backbone, task, config, seed):
    """Radius-gated codebook memory: exactly zero update away from the forget subjects' keys."""
    need_facts(task.facts)
    with torch.no_grad():
        groups, info = coordinates(backbone, task, config)
        memories = [build(backbone, task, config, c, fs, seed) for c, fs in groups.items()]
    first = next(iter(groups))
    info = dict(info, layer=first.layer, point=first.point, step=first.step, n_facts=sum(len(m) for m in memories),
                n_entries=sum(m.n_entries for m in memories), n_memories=len(memories))
    return InferenceEdit(method="codebook", config=config, info=info,
                         context=lambda: _all_applied(backbone, memories),
                         memory=memories[0] if len(memories) == 1 else memories)

"""rewrite: TimeROME's trace and selection, then the rewrite memory (beyond the paper).

Stages 1-2 as `timerome` and `codebook` (the trace of F_v picks the gate's coordinate, or
`coordinate` is given); stage 3 builds a `RewriteMemory`: the codebook's radius gate, keyed on the
states of both the original and the target answer, decides which edited fact a sequence asks
about, and the answer region is written with the values of the target's tokens (end-of-text
after them) at the last block, so the sampler commits the target whatever its order, cache or
temperature. Each fact keeps its own target (a Fact's `target`, else `target`).

The gate sits one block below the write site by default (layer 2 of the embedded model's 4): there
the residuals of a question's answer positions already say which fact is asked, so two facts of one
subject, and a fact and its paraphrase, are told apart (measured on the embedded counterfactual set,
docs/editing.md: at the traced layer 0, efficacy 0.90 and paraphrases 0.80; at layer 2, 1.00 and
0.95). `coordinate="traced"` puts it where TimeROME's trace says instead.

With `watch` (default), the memory also watches what the model is about to say (the answer watch,
rewrite_memory.py): a prompt that names an edited subject, however it asks, fires the fact when the
model's read-out at a masked answer position is one of its object tokens; `watch=false` is the
gate alone (the ablation).

The radii are calibrated on the task's retain rows plus `calibration`, plus the known rows about an
edited subject (its other facts: they must keep their answers), minus every row stating an edited
fact. The token values are read on the rows the model is known to answer (`value_rows`; default:
the embedded model's training rows, else the calibration rows). The whitening statistics, the
calibration residuals and the value table are cached on disk by `prepare`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from timerome.data.facts import Fact, qa_rows
from timerome.data.rows import load_rows, row_source
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.errors import TimeromeError
from timerome.memory.codebook_memory import DEFAULT_INNER, DEFAULT_MARGIN, DEFAULT_STATES
from timerome.memory.rewrite_memory import (DEFAULT_ALPHA, LAST_STEP_PADS, STATE_PADS, RewriteMemory, refuse_causal,
                                            said_facts, target_ids, write_site)
from timerome.memory.rewrite_memory import EMBEDDED_VALUE_ROWS, embedded_value_rows
from timerome.memory.rewrite_memory import value_table as memory_value_table
from timerome.methods.codebook import calibration_rows, calibration_seed, calibration_tokens, stating
from timerome.methods.registry import GatedBuild, InferenceEdit, method_config, need_facts, register
from timerome.methods.timerome_edit import DEFAULTS as PAPER
from timerome.methods.timerome_edit import background_stats, check_trace_settings, locate

DEFAULTS = dict(
    alpha=DEFAULT_ALPHA, margin=DEFAULT_MARGIN, inner=DEFAULT_INNER, n_states=DEFAULT_STATES,
    target=DEFAULT_TARGET,  # for facts without a target of their own
    calibration=None,      # extra rows/texts the radii must spare: 'embedded:SPLIT', 'tofu:SPLIT', a file, a list
    value_rows=None,       # rows the model answers, for the token values and the subjects' other facts (a spec or
                           # a list; None: the task's known rows, the embedded model's training rows, or the
                           # calibration rows)
    coordinate=None,       # the gate's [layer, point]; None: the block below the write site; "traced": the trace's
    site=None,             # where the values are written, [layer, point]; None = the last block's output
    watch=True,            # the answer watch (rewrite_memory.py): also fire when the prompt names an edited subject
                           # and the model is about to say the fact's object (False: the gate alone)
    **{k: v for k, v in PAPER.items() if k.startswith(("trace", "select"))},
)


def known_rows(backbone, task, config) -> list:
    """The rows the model is known to answer: `value_rows`, else the task's known rows, else the
    embedded model's training rows, else the calibration rows."""
    return _known(backbone, task, config)[0]


def value_rows_source(backbone, task, config) -> dict | None:
    """What the memory's file records of the rows its token values are read on (`data.rows.row_source`),
    where a spec names them (`value_rows` given as one, or the embedded model's training rows); None
    where they are rows given in Python or the calibration rows."""
    rows, spec = _known(backbone, task, config)
    return None if spec is None else row_source(spec, rows)


def _known(backbone, task, config) -> tuple[list, str | None]:
    """(known_rows, the spec that names them, or None)."""
    rows = config.get("value_rows")
    if isinstance(rows, str):
        return load_rows(rows), rows
    if rows:
        return list(rows), None
    if task.known_rows:
        return list(task.known_rows), None
    embedded = embedded_value_rows(backbone)
    if embedded:
        return embedded, EMBEDDED_VALUE_ROWS
    return calibration_rows(task, config), None


def spare_rows(backbone, task, config) -> list:
    """The radii's calibration rows: codebook.calibration_rows (retain + calibration, minus every row
    stating an edited fact) and the known rows about an edited subject that state no edited fact."""
    base = calibration_rows(task, config)
    subjects = {f.subject for f in task.facts}
    forget = list(task.forget_rows) + qa_rows(task.facts)
    have = {r["question"] for r in base if isinstance(r, dict)}
    extra = [r for r in known_rows(backbone, task, config)
             if isinstance(r, dict) and r.get("question") not in have and any(s in r["question"] for s in subjects)]
    return base + [r for r, said in zip(extra, stating(extra, forget)) if not said]


def value_table(backbone, site, task, config) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [K], values [K, H]) of every token the model predicts on the known rows, at the
    write site, with the config's trace_seed; cached on disk by their inputs (`rewrite_memory.value_table`)."""
    return memory_value_table(backbone, site, known_rows(backbone, task, config), seed=calibration_seed(config))


def gate_coordinate(backbone, task, config, progress: bool = False) -> tuple[Coordinate, dict]:
    """Where the gate reads (module docstring) and how it was chosen (progress: a trace's bar)."""
    given = config.get("coordinate")
    if given == "traced":
        return locate(backbone, task, dict(config, coordinate=None), progress)
    if given is not None:
        return locate(backbone, task, config, progress)
    layer = max(0, site_of(backbone, config)[0] - 1)
    return Coordinate(layer, "resid").on(backbone), {"coordinate_source": "below the write site"}


def site_of(backbone, config) -> tuple[int, str]:
    """The write site: the config's `site` checked against the model (its layer, not the gate's below
    it, named when out of range), else `write_site`."""
    return write_site(backbone) if config.get("site") is None else Coordinate.of(config["site"]).on(backbone).site


def build(backbone, task, config, coordinate, facts, seed: int = 0, said: bool = False) -> RewriteMemory:
    """A RewriteMemory gated at `coordinate` with the config's settings, filled with `facts`, each
    whose answer the model says inside an answer of its own holding that answer (`said_facts`; said:
    they are so already); the rows answering so are left out of the calibration, as the rows stating
    a fact are (the whitening statistics read the task as given)."""
    refuse_causal(backbone)  # the kind of model, first
    target_ids(backbone, facts, config.get("target") or DEFAULT_TARGET)  # a target it cannot say, refused before the calibration
    facts = list(facts) if said else said_facts(backbone, facts)
    stats = background_stats(backbone, coordinate, task, dict(config, key_metric="whitened"))
    site = site_of(backbone, config)
    spare = spare_rows(backbone, with_said(task, facts), config)
    memory = RewriteMemory(backbone, coordinate, background=stats,
                           calibration=calibration_tokens(backbone, coordinate, task, config,
                                                          rows=spare, pads=STATE_PADS,
                                                          last_pads=LAST_STEP_PADS, n_states=int(config["n_states"])),
                           value_table=value_table(backbone, site, task, config),
                           alpha=float(config["alpha"]), margin=float(config["margin"]), inner=float(config["inner"]),
                           n_states=config["n_states"],
                           target=config.get("target") or DEFAULT_TARGET,
                           site=site, seed=seed, calibration_seed=calibration_seed(config),
                           watch_rows=spare if config.get("watch", True) else None)
    source = value_rows_source(backbone, task, config)
    if source is not None:
        memory.sources["value_rows"] = source
    return memory.add(facts, said=True)


def with_said(task, facts):
    """The task whose forget rows also ask each fact as the model answers it (`said_facts`), so that
    every row answering so states it (`codebook.stating`)."""
    have = {(r.get("question"), r.get("answer")) for r in task.forget_rows if isinstance(r, dict)}
    more = [dict(question=f.prompt, answer=f.object) for f in facts if isinstance(f, Fact)
            and (f.prompt, f.object) not in have]
    return replace(task, forget_rows=list(task.forget_rows) + more) if more else task


def prepare(backbone, task, config, progress: bool = False) -> None:
    """The trace, the whitening statistics and the calibration residuals, into their disk caches."""
    refuse_causal(backbone)
    coord, _ = gate_coordinate(backbone, task, config, progress)  # progress: the trace's bar
    background_stats(backbone, coord, task, dict(config, key_metric="whitened"))
    spare = spare_rows(backbone, with_said(task, said_facts(backbone, task.facts)), config)
    calibration_tokens(backbone, coord, task, config, rows=spare, pads=STATE_PADS,
                       last_pads=LAST_STEP_PADS, n_states=int(config["n_states"]))
    value_table(backbone, site_of(backbone, config), task, config)


def check_config(config) -> None:
    """The rewrite memory's `check`: trace settings no trace reads, and a step in `site` (the values are
    written at every step the gate opens: a site is [layer, point])."""
    check_trace_settings(config, traced=config.get("coordinate") == "traced", read_anyway=("trace_seed",),
                         why='the rewrite memory traces its gate\'s coordinate only where coordinate is "traced"')
    step = None if config.get("site") is None else Coordinate.of(config["site"]).step
    if step is not None:
        raise TimeromeError(f"site is where the values are written, [layer, point]; its step {step} is read by "
                            "nothing (the gate decides the steps)")


def default_layer(backbone) -> int:
    """The layer of the gate where none is given: where the method's install places it at its defaults."""
    return gate_coordinate(backbone, None, method_config("rewrite", {}))[0].layer


@register("rewrite", defaults=DEFAULTS, prepare=prepare, check=check_config, background=True,
          gated=GatedBuild(build=lambda *a: build(*a, said=True), step=False, default_layer=default_layer,
                           refuse_model=refuse_causal, check_target=target_ids, said_facts=True,
                           embedded_rows=EMBEDDED_VALUE_ROWS),
          autoregressive="no: it writes answer positions while masked, which an AR model never has")
def rewrite(backbone, task, config, seed):
    """Rewrite memory: the codebook's gate, the target's token values over the answer region."""
    refuse_causal(backbone)  # before the trace and the calibration, not after
    need_facts(task.facts)
    coordinate, info = gate_coordinate(backbone, task, config)
    with torch.no_grad():
        memory = build(backbone, task, config, coordinate, task.facts, seed)
    info = dict(info, layer=coordinate.layer, point=coordinate.point, site=list(memory.site), n_facts=len(memory),
                n_entries=memory.n_entries)
    return InferenceEdit(method="rewrite", config=config, info=info, context=lambda: memory.applied(backbone),
                         memory=memory)

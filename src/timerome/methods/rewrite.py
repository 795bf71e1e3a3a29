"""rewrite: TimeROME's trace and selection, then the rewrite memory (beyond the paper).

Stages 1-2 as `timerome` and `codebook` (the trace of F_v picks the gate's coordinate, or
`coordinate` is given); stage 3 builds a `RewriteMemory`: the codebook's radius gate, keyed on the
states of both the original and the target answer, decides which edited fact a sequence asks
about, and the answer region is written with the values of the target's tokens (end-of-text
after them) at the last block, so the sampler commits the target whatever its order, cache or
temperature. Each fact keeps its own target (a Fact's `target`, else `target`).

The radii are calibrated on the task's retain rows plus `calibration`, minus every row stating an
edited fact (codebook.calibration_rows); the token values are read on the same rows. The trace,
the whitening statistics and the calibration residuals are cached on disk by `prepare`.
"""

from __future__ import annotations

import torch

from timerome.cache import cached_tensors
from timerome.codebook_memory import DEFAULT_INNER, DEFAULT_MARGIN, DEFAULT_STATES
from timerome.encoding import DEFAULT_TARGET
from timerome.errors import TimeromeError
from timerome.methods.codebook import calibration_rows, calibration_tokens
from timerome.methods.registry import InferenceEdit, register
from timerome.methods.timerome_edit import DEFAULTS as PAPER, background_stats, locate
from timerome.rewrite_memory import VALUE_STATES, VALUE_TOP, DEFAULT_ALPHA, RewriteMemory, token_values, write_site

DEFAULTS = dict(
    alpha=DEFAULT_ALPHA, margin=DEFAULT_MARGIN, inner=DEFAULT_INNER, n_states=DEFAULT_STATES,
    complete=True,         # fire only where every token of the subject is present (spares name-sharers)
    target=DEFAULT_TARGET,  # for facts without a target of their own
    calibration=None,      # extra rows/texts the radii must spare: 'embedded:SPLIT', 'tofu:SPLIT', a file, a list
    coordinate=None,       # the gate's [layer, point]; None = traced
    site=None,             # where the values are written, [layer, point]; None = the last block's output
    **{k: v for k, v in PAPER.items() if k.startswith(("trace", "select"))},
)


def value_table(backbone, site, task, config) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [K], values [K, H]) of every token the model predicts on the calibration rows, at
    the write site; cached on disk by their inputs."""
    rows = calibration_rows(task, config)
    seed = int(config.get("trace_seed", 0))

    def make():
        values = token_values(backbone, site, rows, seed=seed)
        ids = sorted(values)
        return {"ids": torch.tensor(ids, dtype=torch.long), "values": torch.stack([values[t] for t in ids])}

    key = dict(kind="rewrite-values", model=backbone.fingerprint(), site=list(site), rows=rows, seed=seed,
               states=VALUE_STATES, top=VALUE_TOP)
    t = cached_tensors("values", key, make)
    return t["ids"], t["values"]


def site_of(backbone, config) -> tuple[int, str]:
    return write_site(backbone) if config.get("site") is None else tuple(config["site"])


def build(backbone, task, config, coordinate, facts, seed: int = 0) -> RewriteMemory:
    """A RewriteMemory gated at `coordinate` with the config's settings, filled with `facts`."""
    stats = background_stats(backbone, coordinate, task, dict(config, key_metric="whitened"))
    site = site_of(backbone, config)
    memory = RewriteMemory(backbone, coordinate, background=stats,
                           calibration=calibration_tokens(backbone, coordinate, task, config),
                           value_table=value_table(backbone, site, task, config),
                           alpha=float(config["alpha"]), margin=float(config["margin"]), inner=float(config["inner"]),
                           n_states=config["n_states"], complete=config["complete"],
                           target=config.get("target") or DEFAULT_TARGET,
                           site=site, seed=seed)
    return memory.add(facts)


def prepare(backbone, task, config) -> None:
    """The trace, the whitening statistics and the calibration residuals, into their disk caches."""
    coord, _ = locate(backbone, task, config)
    background_stats(backbone, coord, task, dict(config, key_metric="whitened"))
    calibration_tokens(backbone, coord, task, config)
    value_table(backbone, site_of(backbone, config), task, config)


@register("rewrite", defaults=DEFAULTS, prepare=prepare)
def rewrite(backbone, task, config, seed):
    """Rewrite memory: the codebook's gate, the target's token values over the answer region."""
    if not task.facts:
        raise TimeromeError("the forget set has no usable facts")
    coordinate, info = locate(backbone, task, config)
    with torch.no_grad():
        memory = build(backbone, task, config, coordinate, task.facts, seed)
    info = dict(info, layer=coordinate.layer, point=coordinate.point, site=list(memory.site), n_facts=len(memory),
                n_entries=memory.n_entries)
    return InferenceEdit(method="rewrite", config=config, info=info, context=lambda: memory.applied(backbone),
                         memory=memory)

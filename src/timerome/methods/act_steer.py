"""act_steer: RepE-style activation steering (Zou et al. 2023), an inference-time baseline.

The steering vector is v = mean(h | target answer) - mean(h | forget answer): the block output
(`resid`) at `layer`, averaged over the answer tokens of the clean forget rows, and over the
answer tokens of the same questions answered with the target text ("I don't know.", or the own
target of the fact asking the question: a counterfactual request's new object). While the
edit is active, h -> h + coef * v at every token of every forward, so at every denoising step.
The weights are never touched; leaving the `with` block removes the hook.

The vector is the same for every token, so retain answers move almost as much as forget ones.
coef = 3 on the embedded model (layer 2): forget LP ~-26 nats, retain ~-20; coef 2 moves both by
~4-5 nats, coef 4 by ~45-50.
"""

from __future__ import annotations

import torch

from timerome.engine.encoding import DEFAULT_TARGET, encode_pairs
from timerome.methods import _unlearn as U
from timerome.methods.registry import InferenceEdit, register

DEFAULTS = dict(
    layer=None,        # None: round(0.5 * n_layers), a middle layer as RepE reads
    coef=3.0,          # multiple of the mean difference added
    target=DEFAULT_TARGET,
)


@register("act_steer", defaults=DEFAULTS, canonical=[{}], deterministic=True, retain=False, saves=False)
def act_steer(backbone, task, config, seed):
    """RepE steering: add coef x (target-answer mean - forget-answer mean) at one layer, every step."""
    layer = U.parse_layer(backbone, config["layer"], 0.5)
    site = (layer, "resid")
    with torch.no_grad():
        forget = U.mean_activation(backbone, encode_pairs(backbone, task.forget_rows), site, "answer")
        target = U.mean_activation(backbone, U.target_pairs(backbone, task.forget_rows, config["target"], task.facts),
                                   site, "answer")
    shift = float(config["coef"]) * (target - forget)                                  # [H]

    def add(h):                                                                        # h [B, L, H]
        return h + shift.to(h.dtype)

    info = {"layer": layer, "point": "resid", "vector_norm": float(target.sub(forget).norm())}
    return InferenceEdit(method="act_steer", config=config, info=info, context=U.steering(backbone, site, add))

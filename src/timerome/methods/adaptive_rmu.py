"""adaptive_rmu: RMU whose steering coefficient follows the activations' scale (Dang et al. 2025).

As rmu, but c = scale x the mean L2 norm of the frozen model's block output at `layer` over the
tokens of the first forget batch (MDLM-noised, non-padding), so one setting fits models and
layers of any scale. scale = 5 (Dang et al. take c = beta ||h||; we use beta = 5).
"""

from __future__ import annotations

from timerome.methods import _unlearn as U
from timerome.methods.registry import register

DEFAULTS = dict(U.TRAIN_DEFAULTS, **U.RMU_DEFAULTS, lr=1e-2, scale=5.0)   # lr as rmu


@register("adaptive_rmu", defaults=DEFAULTS, canonical=[{}], kind="weights")
def adaptive_rmu(backbone, task, config, seed):
    """Adaptive RMU: c = scale x mean activation norm of the forget set at the first batch."""
    scale = float(config["scale"])

    def coefficient(h, keep):
        return scale * float(h.float().norm(dim=-1)[keep].mean())    # h [B, L, H], keep [B, L]

    edit = U.rmu_unlearn(backbone, task, config, seed, "adaptive_rmu", coefficient)
    return edit

"""rmu: representation misdirection unlearning (Li et al. 2024, WMDP) on an MDLM.

Forget inputs' block output at `layer` is pushed toward c * u (u a fixed random unit vector from
the seed, uniform [0, 1) entries normalised as in WMDP's code; c = `steer` fixed), while retain
inputs' stays equal to the frozen model's (weight `retain_act_w`); only the MLP down projections
of the `update_layers` layers up to `layer` are trained, as in WMDP (_unlearn.mlp_out_prefixes).
Inputs are MDLM-noised (see _unlearn.rmu_unlearn). A fixed c is scale-dependent: the default suits
the embedded model (block-output norms ~110-170); for other models use adaptive_rmu or set `steer`.
Safe protocol as in _unlearn; `safe=False` removes it.
"""

from __future__ import annotations

from timerome.methods import _unlearn as U
from timerome.methods.registry import register

# lr: only two MLPs train, toward a target ~2x the activations' norm; at 1e-3 they barely move
DEFAULTS = dict(U.TRAIN_DEFAULTS, **U.RMU_DEFAULTS, lr=1e-2, steer=300.0)


@register("rmu", defaults=DEFAULTS, canonical=[{}], kind="weights")
def rmu(backbone, task, config, seed):
    """RMU: steer forget activations toward c x a random unit vector, keep retain activations."""
    steer = float(config["steer"])
    return U.rmu_unlearn(backbone, task, config, seed, "rmu", lambda h, keep: steer)

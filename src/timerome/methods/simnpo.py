"""simnpo: SimNPO (Fan et al. 2024), NPO without a reference model, length-normalised.

loss = gamma * (2 / beta) * mean log(1 + exp(-beta (L_forget_per_token - delta))) + retain_w * L_retain
with open-unlearning's SimNPO defaults: beta = 4.5, gamma = 0.125 (the forget weight; SimNPO's
repository calls it npo_coeff), delta = 0 (the reward margin; the repository's gamma), retain
weight alpha = 1. The per-token NLL is the MDLM masked-answer loss (train.mdlm_loss), already
divided by the answer length. Safe protocol as in _unlearn; `safe=False` removes it.
"""

from __future__ import annotations

from timerome.methods import _unlearn as U
from timerome.methods.registry import register

# lr: gamma = 0.125 weakens the forget term; at 3e-4 the embedded model's forget LP barely moves
DEFAULTS = dict(U.TRAIN_DEFAULTS, lr=1e-3, beta=4.5, gamma=0.125, delta=0.0, retain_w=1.0)


@register("simnpo", defaults=DEFAULTS, canonical=[{}], kind="weights", retain=U.reads_retain)
def simnpo(backbone, task, config, seed):
    """SimNPO: reference-free, length-normalised NPO on the MDLM loss (open-unlearning defaults)."""
    beta, gamma, delta = float(config["beta"]), float(config["gamma"]), float(config["delta"])

    def objective(run, forget, retain):
        per_token = run.nll(forget, per_example=True)        # [B] nats per answer token
        loss = U.simnpo_loss(per_token, beta, delta)
        return gamma * loss, {"simnpo": float(loss.detach()), "forget_nll": float(per_token.detach().mean())}

    return U.unlearn(backbone, task, config, seed, "simnpo", objective, retain_w=config["retain_w"])

"""npo: negative preference optimisation (Zhang et al. 2024) on the MDLM loss.

loss = (2 / beta) * mean log(1 + (p(y|x) / p_ref(y|x))^beta) + retain_w * L_retain, beta = 0.1,
retain_w = 1 (open-unlearning's NPO defaults). -log p(y|x) is estimated per sequence by the MDLM
masked-answer loss times the answer length (one draw of t and masks; the reference model, the
weights before training, is scored on the same masks so the log-ratio carries no mask noise).
The safe protocol (see _unlearn) adds its retain anchor and early stop; `safe=False` removes them.
"""

from __future__ import annotations

from timerome.methods import _unlearn as U
from timerome.methods.registry import register

DEFAULTS = dict(U.TRAIN_DEFAULTS, lr=3e-4, beta=0.1, retain_w=1.0)   # lr as ga


@register("npo", defaults=DEFAULTS, canonical=[{}, U.UNMITIGATED], kind="weights", retain=U.reads_retain)
def npo(backbone, task, config, seed):
    """NPO against a frozen copy of the model, on MDLM sequence log-likelihood estimates."""
    beta = float(config["beta"])

    def objective(run, forget, retain):
        cur, old = run.sequence_nll(forget)                  # [B], [B]
        loss = U.npo_loss(cur, old, beta)
        return loss, {"npo": float(loss.detach()), "log_ratio": float((old - cur).detach().mean())}

    return U.unlearn(backbone, task, config, seed, "npo", objective, needs_reference=True,
                     retain_w=config["retain_w"])

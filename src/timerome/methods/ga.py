"""ga: gradient ascent on the forget set's MDLM masked-answer loss.

The objective is -L_forget (the 1/t-weighted masked-answer cross-entropy, train.mdlm_loss, made
larger). Under the default safe protocol (see _unlearn) a retain-NLL anchor is added and training
stops early when the retain LP drifts by more than `drift` nats; `safe=False` is plain GA, which
collapses the model at ordinary learning rates.
"""

from __future__ import annotations

from timerome.methods import _unlearn as U
from timerome.methods.registry import register

# lr: at 1e-3 the safe protocol stops GA within 10 steps on the embedded model
DEFAULTS = dict(U.TRAIN_DEFAULTS, lr=3e-4)


@register("ga", defaults=DEFAULTS, canonical=[{}, U.UNMITIGATED], kind="weights", retain=U.reads_retain)
def ga(backbone, task, config, seed):
    """Gradient ascent on the forget set's MDLM loss (safe protocol by default)."""
    return U.unlearn(backbone, task, config, seed, "ga", U.ascent)

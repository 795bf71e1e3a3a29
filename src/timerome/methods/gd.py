"""gd: gradient difference, ascent on the forget set's MDLM loss plus descent on the retain set's.

loss = -L_forget + retain_w * L_retain, both the MDLM masked-answer loss (open-unlearning's
GradDiff, gamma = alpha = 1). The safe protocol (see _unlearn) adds its anchor on top and stops
early on retain-LP drift; `safe=False` keeps GD's own retain term, without anchor or early stop.
"""

from __future__ import annotations

from timerome.methods import _unlearn as U
from timerome.methods.registry import register

DEFAULTS = dict(U.TRAIN_DEFAULTS, lr=3e-4, retain_w=1.0)   # lr as ga


@register("gd", defaults=DEFAULTS, canonical=[{}], kind="weights", retain=U.reads_retain)
def gd(backbone, task, config, seed):
    """Gradient difference: forget ascent + retain descent on the MDLM loss (safe by default)."""
    return U.unlearn(backbone, task, config, seed, "gd", U.ascent, retain_w=config["retain_w"])

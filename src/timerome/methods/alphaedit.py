"""alphaedit: AlphaEdit's null-space-projected MEMIT edit, on MDLMs.

The same target deltas, layer band and spread as memit.py; only the per-layer solve changes:
    P = projector on the eigen-directions of C = E[k k^T] (keys of the knowledge to preserve:
        the model's own corpus minus the forget rows) whose eigenvalue is small,
    W_l += R^T K P (K^T K P + l2 I)^-1,
so dW (I - P) = 0: the outputs for preserved keys (the span P removes) do not move, and no
C-weighted trade-off is needed. Deviation: AlphaEdit keeps eigenvalues below an absolute 1e-2,
which depends on the model's scale; here below rel_threshold x the largest one (or the smallest
`null_energy` fraction of the energy), never fewer than one direction. l2 is relative to the
mean squared norm of the projected keys. One batch (no earlier edits' keys in the solve).
"""

from __future__ import annotations

from timerome.engine.encoding import DEFAULT_TARGET
from timerome.methods import _locate as L
from timerome.methods.registry import IN_PLACE_OF_BACKGROUND, register

DEFAULTS = dict(
    layers=None,           # as memit: round(0.1 n) .. round(0.25 n)
    target=DEFAULT_TARGET,
    objective="target",    # or "forget" / "unlikelihood" (_locate.masked_objective)
    positions="subject",
    grad_steps=30, lr=1.0, n_states=2, clamp=10.0, weight_decay=0.0,
    key_states=4,
    rel_threshold=1e-2,    # null space: eigenvalues < rel_threshold * max eigenvalue of C
    null_energy=None,      # or: the smallest directions holding at most this fraction of energy
    l2=1.0,                # ridge, in units of the mean |P k|^2 of the edited keys
    stats_texts=None, stats_samples=2000,
)


@register("alphaedit", defaults=DEFAULTS, canonical=[{}], kind="weights", background=L.own_statistics,
          retain=IN_PLACE_OF_BACKGROUND,
          model_check=L.cloze_states_check("alphaedit"))
def alphaedit(backbone, task, config, seed):
    """AlphaEdit on MDLMs: MEMIT's spread with updates projected on the preserved keys' null space."""
    null = {}

    def solve(K, R, C, layer):
        P, info = L.null_projector(C, rel_threshold=config["rel_threshold"], energy=config["null_energy"])
        null[layer] = info
        l2 = config["l2"] * float((K @ P).pow(2).sum(1).mean())
        return L.alphaedit_update(K, R, P, l2)

    edit = L.spread_edit(backbone, task, config, seed, solve, "alphaedit")
    edit.info["null_rank"] = [null[l]["null_rank"] for l in edit.info["layers"]]
    edit.info["null_energy"] = [null[l]["null_energy"] for l in edit.info["layers"]]
    return edit

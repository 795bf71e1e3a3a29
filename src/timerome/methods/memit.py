"""memit: MEMIT's multi-fact least-squares edit of several MLP down projections, on MDLMs.

  1. delta_i = the change at the last edited layer's MLP output (= its residual output) at fact
     i's subject tokens that minimises the MDLM objective (_locate.optimise_deltas), all facts at
     once; z_i = h_i + delta_i is the residual the last layer should produce;
  2. for each layer l of the band, bottom up: keys K [F, d] at l, residual still missing at the
     top R = (z - h_now) / (layers left), and
         W_l += R^T K (w C_l + K^T K)^-1,   C_l = E[k k^T] over the model's own corpus,
     the least-squares update that keeps background keys' outputs (MEMIT's mom2 term).
Keys and the top residual are re-read after every layer's update, as MEMIT does.
Deviation: w (`mom2_weight`) is per edited fact (the background term is w |F| C), so the balance between
edits and background does not drift with |F|; MEMIT's fixed 1.5e4 assumes thousands of edits.
"""

from __future__ import annotations

from timerome.engine.encoding import DEFAULT_TARGET
from timerome.methods import _locate as L
from timerome.methods.registry import IN_PLACE_OF_BACKGROUND, register

DEFAULTS = dict(
    layers=None,           # None: round(0.1 n) .. round(0.25 n) of n layers (0-1 of 4 here)
    target=DEFAULT_TARGET,
    objective="target",    # or "forget" / "unlikelihood" (_locate.masked_objective)
    positions="subject",
    grad_steps=30, lr=1.0, n_states=2, clamp=10.0, weight_decay=0.0,
    key_states=4,
    mom2_weight=10.0,      # MEMIT's mom2_update_weight, per edited fact (see memit())
    stats_texts=None, stats_samples=2000,
)


@register("memit", defaults=DEFAULTS, canonical=[{}], kind="weights", background=L.own_statistics,
          retain=IN_PLACE_OF_BACKGROUND,
          model_check=L.cloze_states_check("memit"))
def memit(backbone, task, config, seed):
    """MEMIT on MDLMs: all forget facts in one least-squares update spread over an MLP band."""
    n = len(task.facts)

    def solve(K, R, C, _layer):
        # w * n: the background term weighs like w "facts" per background token average,
        # so the balance does not depend on how many facts are edited at once
        return L.memit_update(K, R, C, config["mom2_weight"] * n)

    return L.spread_edit(backbone, task, config, seed, solve, "memit")

"""rmu_like: RMU's misdirection applied at inference time, to the tokens that look like the forget set.

No training. At `layer`'s block output (`resid`), a token whose residual h points along the forget
set's own direction is pushed toward a fixed random direction u (seeded torch.Generator; uniform
[0, 1) entries normalised, as WMDP's RMU draws its control vector):

    h -> h + strength * gate(h) * (|h| u - h)

The target keeps the token's norm (|h| u), so no steering coefficient has to match the model's
scale. The gate (our choice): residual streams share a large common component, so a plain cosine
with the forget mean is high for every token. We centre first: with m_f the mean residual over
the forget rows' tokens (question and answer) and m_b over background tokens (`n_background`
retain rows spread over the retain set), gate(h) = 1 when cos(h - m_b, m_f - m_b) > threshold,
else 0. Without retain rows m_b = 0 (the plain cosine with the forget mean). It acts at every
token of every forward, hence at every denoising step; leaving the `with` block removes the hook.

Defaults chosen on the embedded model: at layer 2 a threshold of 0.5 gates about half of the
forget rows' clean tokens and ~2% of other authors' (0.3 gates ~14% of theirs, and retain LP
falls with it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from timerome.data.rows import spread
from timerome.engine.encoding import encode_pairs
from timerome.methods import _unlearn as U
from timerome.methods.registry import InferenceEdit, register

DEFAULTS = dict(
    layer=None,        # None: round(0.5 * n_layers), a middle layer
    threshold=0.5,     # centred cosine above which a token counts as a forget token
    strength=1.0,      # 1: gated tokens are replaced by |h| u
    n_background=64,
)


@register("rmu_like", defaults=DEFAULTS, canonical=[{}], saves=False)
def rmu_like(backbone, task, config, seed):
    """Inference-time RMU: gated tokens (centred cosine with the forget direction) -> |h| x random unit."""
    layer = U.parse_layer(backbone, config["layer"], 0.5)
    site = (layer, "resid")
    with torch.no_grad():
        h_f = U.token_activations(backbone, encode_pairs(backbone, task.forget_rows), site)            # [Nf, H]
        bg = spread(task.retain_rows, int(config["n_background"]))
        h_b = U.token_activations(backbone, encode_pairs(backbone, bg), site) if bg else None          # [Nb, H]
    m_f = h_f.mean(0)                                                                                # [H]
    m_b = h_b.mean(0) if h_b is not None else torch.zeros_like(m_f)
    direction = m_f - m_b
    u = U.random_unit(backbone.hidden_size, seed, backbone.device)                                   # [H]
    tau, strength = float(config["threshold"]), float(config["strength"])

    def gate(x):                                                    # x [..., H] float -> [...] 0/1
        return (F.cosine_similarity(x - m_b, direction.expand_as(x), dim=-1) > tau).float()

    def misdirect(h):                                                                  # h [B, L, H]
        x = h.float()
        pushed = x + strength * gate(x)[..., None] * (x.norm(dim=-1, keepdim=True) * u - x)
        return pushed.to(h.dtype)

    # how selective the gate is on clean text: the fraction of forget / background tokens it fires on
    info = {"layer": layer, "point": "resid", "threshold": tau, "n_background": len(bg),
            "gated_forget": float(gate(h_f).mean()),
            "gated_background": float(gate(h_b).mean()) if h_b is not None else None}
    return InferenceEdit(method="rmu_like", config=config, info=info, context=U.steering(backbone, site, misdirect))

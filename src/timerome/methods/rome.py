"""rome: ROME's rank-one edit of one MLP down projection, adapted to MDLMs, one fact at a time.

For each forget fact in turn (on the model as edited so far, as sequential ROME does):
  1. r = the delta at the layer's MLP output, at the subject tokens, that minimises the MDLM loss
     of the target answer ("I don't know.") over partially masked states (_locate.optimise_deltas);
  2. k = the down projection's input at the subject tokens, averaged over cloze states
     [question | answer partly masked];
  3. W += r (C^-1 k)^T / (k^T C^-1 k), C = E[k k^T] over the model's own corpus (cached on disk).
So W k moves by exactly r (v* = W k + r) and keys orthogonal to k in the C^-1 metric do not.
Deviations from the AR recipe: see _locate's docstring (mean subject key, no KL term).
"""

from __future__ import annotations

import torch

from timerome.common.progress import progress_bar, wanted
from timerome.data.rows import spread
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.methods import _locate as L
from timerome.methods.registry import IN_PLACE_OF_BACKGROUND, register, weight_edit

DEFAULTS = dict(
    layer=None,            # None: round(0.2 * n_layers), ROME's early-middle MLP (layer 1 of 4 here)
    target=DEFAULT_TARGET,
    objective="target",    # "target": make the target likely; "forget" / "unlikelihood": the answer unlikely
    positions="subject",   # "subject": every subject token, "last": the last one (AR ROME)
    grad_steps=30, lr=1.0, n_states=4, clamp=4.0, weight_decay=0.0,
    key_states=4,          # cloze states the key is averaged over (the first fully masked)
    stats_texts=None,      # None: the task's background / the embedded training rows; or a file
    stats_samples=2000,    # texts used for C (spread evenly)
    ridge=1e-4,            # C + ridge * mean(diag C) * I before inverting
)


@register("rome", defaults=DEFAULTS, canonical=[{}], kind="weights", background=L.own_statistics,
          retain=IN_PLACE_OF_BACKGROUND,
          model_check=L.cloze_states_check("rome"))
def rome(backbone, task, config, seed):
    """ROME on MDLMs: sequential rank-one updates of one MLP down projection, C^-1-weighted."""
    layer = (L.default_layers(backbone.n_layers, 0.2, 0.2)[0] if config["layer"] is None
             else L.check_layer(backbone, config["layer"]))
    proj = L.down_projection(backbone, layer)
    items = L.encode_facts(backbone, task.facts, config["target"])
    texts = spread(L.preserved_texts(backbone, task, config["stats_texts"]), config["stats_samples"])
    C, path = L.key_stats(backbone, proj.layer, texts)
    C_inv = torch.linalg.inv(C + config["ridge"] * C.diagonal().mean() * torch.eye(len(C), dtype=C.dtype))
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same draws on any device
    info = {"layer": proj.layer, "module": proj.path, "stats_file": str(path), "n_stats_texts": len(texts),
            "loss_first": [], "loss_last": [], "delta_norm": []}
    norms = L.site_norms(backbone, items, (proj.layer, "mlp"), config["positions"])  # unedited model's scale
    with weight_edit(backbone, "rome") as edit, progress_bar("rome: facts edited one by one", total=len(items),
                                                            enabled=wanted()) as bar:
        for i, item in enumerate(items):
            delta, d = L.optimise_deltas(
                backbone, [item], (proj.layer, "mlp"), positions=config["positions"], objective=config["objective"],
                grad_steps=config["grad_steps"], lr=config["lr"], n_states=config["n_states"], clamp=config["clamp"],
                weight_decay=config["weight_decay"], generator=gen, norms=norms[i:i + 1])
            states = L.KeyStates(backbone, [item], n_states=config["key_states"], generator=gen,
                                 positions=config["positions"])
            k = states.means({"k": (proj.linear, "in")})["k"][0].cpu()     # [d]
            L.apply_update(proj.linear, L.rome_update(C_inv, k, delta[0, 0].double().cpu()))
            for key in ("loss_first", "loss_last", "delta_norm"):
                info[key].append(d[key])
            bar.advance()
    edit.info = info
    return edit

"""unke: UnKE's layer-level edit (non-local block storage), adapted to MDLMs.

UnKE replaces the key-value view of one MLP by the whole transformer block: it first optimises
the block's output hidden states for the edit, then tunes the block's parameters so that the
block produces them while keeping its outputs on unrelated text. Here:
  1. delta [F, P, H]: one vector per prompt position (every question token, not only the
     subject: attention is bidirectional), added to block `layer`'s output, that minimises the
     MDLM objective of the target answer over partially masked states (_locate.optimise_deltas);
  2. fit every parameter of that block with Adam on
        |block(x) - (h + delta)|^2 at the prompt positions of masked cloze states
          + preserve * |block(x) - h|^2 on background texts,
     both relative to the mean squared norm of h; the layers below are frozen, so x is fixed.
Deviations from UnKE: the MDLM objective instead of next-token loss; the delta covers the
prompt positions (UnKE: the whole input of a causal model, read at the last token); the fit
uses a fixed step count with relative learning rates instead of a loss threshold.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from timerome.data.rows import spread
from timerome.engine.encoding import DEFAULT_TARGET, pad_sequences, text_ids
from timerome.methods import _locate as L
from timerome.methods.registry import IN_PLACE_OF_BACKGROUND, register, weight_edit

DEFAULTS = dict(
    layer=None,            # None: round(0.2 * n_layers), as rome (UnKE: layer 7 of 32)
    target=DEFAULT_TARGET,
    objective="target",    # or "forget" / "unlikelihood" (_locate.masked_objective)
    grad_steps=30, lr=1.0, n_states=2, clamp=1.0, weight_decay=0.0,  # clamp: x |h| at each position
    key_states=4,          # cloze states the block is fitted on
    fit_steps=80,
    fit_lr=0.02,           # Adam step, in units of each parameter tensor's RMS
    preserve=20.0,         # weight of the background-output term
    preserve_texts=64,     # background texts in that term (spread over the corpus)
    stats_texts=None,      # where the background texts come from (as rome's stats_texts)
)


@register("unke", defaults=DEFAULTS, canonical=[{}], kind="weights", background=L.own_statistics,
          retain=IN_PLACE_OF_BACKGROUND,
          model_check=L.cloze_states_check("unke"))
def unke(backbone, task, config, seed):
    """UnKE on MDLMs: optimise one block's output for the forget facts, then fit the block to it."""
    layer = (L.default_layers(backbone.n_layers, 0.2, 0.2)[0] if config["layer"] is None
             else L.check_layer(backbone, config["layer"]))
    items = L.encode_facts(backbone, task.facts, config["target"])
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same draws on any device
    texts = spread(L.preserved_texts(backbone, task, config["stats_texts"]), config["preserve_texts"])
    with weight_edit(backbone, "unke") as edit:
        delta, dinfo = L.optimise_deltas(
            backbone, items, (layer, "resid"), positions="prompt", per_position=True,
            objective=config["objective"], grad_steps=config["grad_steps"], lr=config["lr"], n_states=config["n_states"],
            clamp=config["clamp"], weight_decay=config["weight_decay"], generator=gen)
        states = L.KeyStates(backbone, items, n_states=config["key_states"], generator=gen, positions="prompt")
        fit = _fit_block(backbone, layer, states, delta, texts, config)
    edit.info = {"layer": layer, "module": backbone.module_path(layer, "resid"), "delta": dinfo, **fit}
    return edit


def _fit_block(backbone, layer, states, delta, texts, config) -> dict:
    """Adam on block `layer`'s parameters towards h + delta (edit) and h (background)."""
    edit_in = (states.ids, states.att)
    bg_in = pad_sequences([s for s in (text_ids(backbone, t) for t in texts) if s], backbone)
    with torch.no_grad():
        h_edit, h_bg = L.block_output(backbone, layer, *edit_in), L.block_output(backbone, layer, *bg_in)
    b, p, f = states.b, states.p, states.f  # every prompt position of every state
    want = h_edit[b, p].float() + delta[f, p]                                 # [N, H] (slot j = position)
    scale = h_edit[b, p].float().pow(2).sum(-1).mean()                        # mean |h|^2
    bg_real = bg_in[1]
    block = backbone.module(layer, "resid")
    params = [q for q in block.parameters() if q.is_floating_point()]
    groups = [{"params": [q], "lr": config["fit_lr"] * float(q.detach().float().pow(2).mean().sqrt().clamp(min=1e-8))}
              for q in params]
    opt = torch.optim.Adam(groups)
    losses = []
    with _trainable(params):
        for _ in range(config["fit_steps"]):
            got = L.block_output(backbone, layer, *edit_in)[b, p].float()
            fit = (got - want).pow(2).sum(-1).mean() / scale
            bg = L.block_output(backbone, layer, *bg_in)
            keep = (bg - h_bg).float()[bg_real].pow(2).sum(-1).mean() / scale
            loss = fit + config["preserve"] * keep
            grads = torch.autograd.grad(loss, params)
            for q, g in zip(params, grads):
                q.grad = g
            opt.step()
            losses.append((float(fit.detach()), float(keep.detach())))
    return {"fit_loss": [round(losses[0][0], 4), round(losses[-1][0], 4)],
            "preserve_loss": [round(losses[0][1], 6), round(losses[-1][1], 6)],
            "n_params": sum(q.numel() for q in params)}


@contextmanager
def _trainable(params):
    """Let autograd reach `params` for the block, then put their flags back and drop the grads."""
    before = [q.requires_grad for q in params]
    for q in params:
        q.requires_grad_(True)
    try:
        yield
    finally:
        for q, r in zip(params, before):
            q.requires_grad_(r)
            q.grad = None

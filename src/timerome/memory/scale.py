"""The edit's scale: an update that overflows the model is refused, one that swamps the residual it edits is
warned about, before any answer is read (a hand-edited alpha of 1e30 would otherwise give empty answers,
and every metric read from them, silently).

    check_on_prompts(backbone, edit, prompts, source)  at the residuals the prompts reach at its site (the CLI,
                                                        before it generates or evaluates)
    check_on_keys(edit, backbone, source)               at its own keys, the residuals it acts on most
                                                        (`applied`, so every API path is checked too)

An edit takes part through two methods: `scale_probe()`, its keys [n, H] (None: its update is bounded by
construction, e.g. a memory that writes the model's own residuals), and `update(h)` (or `delta(h)`). Both checks
read its keys (prompts may never reach a gated memory's radii), so a check passed is one `applied` need not
repeat: each records the edit's state (`scale_state()`) it passed at. The update is computed once, in the
model's dtype, as the hook computes it (a float64 pass would keep float64 copies of the hook's matrices).
"""

from __future__ import annotations

import warnings

import torch

from timerome.errors import TimeromeError

SWAMPS = 100   # a change this many times the residual's size leaves little of the model's own answer
PROBE_KEYS = 64  # the keys `check_on_keys` reads: a cheap probe, whatever the memory's size


def check_on_prompts(backbone, edit, prompts, source) -> None:
    """Refuse `edit` where its update overflows on the residuals that `prompts` (token id lists) reach at its
    site or at its own keys, or where the model's residual is not finite there before it acts; warn (once)
    above SWAMPS times."""
    from timerome.engine.hooks import run_to

    if edit.scale_probe() is None:
        return
    edit._check_ready()  # what applying it checks first (empty, q above its facts), before an update below
    worst = _worst_at_keys(edit, backbone, source)
    with torch.no_grad():
        for ids in prompts:
            h = run_to(backbone, edit.coordinate.site, torch.tensor([ids], device=backbone.device))
            if not torch.isfinite(h).all():  # the model itself, before any edit: not the edit's fault
                raise TimeromeError(f"the model's residual at {edit.coordinate} is already NaN or infinite on "
                                    f"these prompts, before {source} acts: the model overflows in "
                                    f"{str(backbone.dtype).removeprefix('torch.')}; try --dtype float32")
            worst = max(worst, _worst_change(edit, h, source))
    _say(edit, worst, source)


def check_on_keys(edit, backbone, source) -> None:
    """The same at the edit's own keys alone (the first PROBE_KEYS), in the model's dtype; nothing to do where
    the edit passed a check in its present state."""
    if edit.scale_probe() is None or getattr(edit, "_scale_checked", None) == edit.scale_state():
        return
    _say(edit, _worst_at_keys(edit, backbone, source), source)


def _worst_at_keys(edit, backbone, source) -> float:
    h = edit.scale_probe()[:PROBE_KEYS].to(device=backbone.device, dtype=backbone.dtype)[None]
    with torch.no_grad():
        return _worst_change(edit, h, source)


def _updated(edit, h: torch.Tensor) -> torch.Tensor:
    return edit.update(h) if hasattr(edit, "update") else h + edit.delta(h)


def _worst_change(edit, h: torch.Tensor, source) -> float:
    """The largest |change| / |h| of the edit's update over the rows of h [1, L, H]; an update whose squares
    overflow in the model's dtype (what the next layer's norm computes) is refused."""
    new = _updated(edit, h)
    if not torch.isfinite(new.float().pow(2).mean(-1)).all():
        raise TimeromeError(f"{source} makes the residual at {edit.coordinate} overflow (alpha {edit.alpha:g}): "
                            "its alpha is far too large; build it with a smaller alpha (`timerome methods` lists "
                            "the defaults)")
    h = h.double()
    change = new.double() - h
    return float((change.norm(dim=-1) / h.norm(dim=-1).clamp_min(1e-12)).max())


def _say(edit, worst: float, source) -> None:
    edit._scale_checked = edit.scale_state()
    if worst > SWAMPS:
        warnings.warn(f"{source} changes the residual by up to {worst:.0f} times its size (alpha {edit.alpha:g}): "
                      "expect empty or meaningless answers", stacklevel=1)

"""Shared machinery of the unlearning baselines (act_steer, rmu_like, ga, gd, npo, simnpo, rmu,
adaptive_rmu).

Inference-time pieces: `mean_activation` averages a site's output over tokens of (question,
answer) pairs; `steering` wraps a function of the site's output as the context factory an
InferenceEdit needs (hooks.edit installs it on entering, removes it on leaving).

Training-time pieces: `unlearn` is the one loop every gradient baseline runs. Every objective is
built on the MDLM masked-answer loss (`train.mdlm_loss`: answer tokens masked with probability
t ~ U(eps, 1), 1/t weighted, prompt never masked), never an autoregressive shift. Per step:

    loss = objective(forget batch, retain batch)            the method's own terms
         + (retain_w + anchor if safe else retain_w) * MDLM NLL(retain batch)

then backward, grad clip, AdamW. `retain_w` is the method's own retain-NLL weight (GD / NPO /
SimNPO as in open-unlearning: 1; GA / RMU: 0). `safe=True` is the paper's protocol: a retain-NLL
anchor on top (weight `anchor`), and every `check_every` steps the retain LP (mean log p(answer |
question) in nats, `metrics.answer_logprobs` on `check_rows` retain rows, `check_mc` draws, a
fixed seed so successive checks are paired) is compared with the unedited model's; when it has
dropped by more than `drift` nats, training stops and the trainable weights go back to the last
check that was within the limit (which costs one copy of the trainable weights; with LoRA only the
adapters). The check rows are left out of the anchor's batches when at least as many retain rows
remain, so the check sees drift on rows the anchor did not fit. `safe=False` is the unmitigated
setting: no anchor, no early stop, so no check rows either: the method's own retain term reads every
retain row (gradient clipping stays: it is the trainers' default, as in open-unlearning's HF Trainer,
not a mitigation).

Full fine-tuning by default; `lora_r > 0` trains LoRA adapters through peft (train._wrap_lora) and
merges them on the way out, so the Backbone's module paths (and the WeightEdit snapshot's keys)
stay as they were. A frozen reference model (NPO's log-ratio, RMU's retain activations) is a deep
copy of the weights taken before training; with LoRA it is the same model with adapters disabled
(no copy). Randomness: torch.Generators seeded from the seed (batches, masks, the random direction),
and the global RNG, forked and seeded, while peft initialises the adapters.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from timerome.common.progress import progress_bar, wanted
from timerome.data.facts import own_targets
from timerome.data.rows import spread
from timerome.engine.encoding import DEFAULT_TARGET, collate, encode_pairs, mask_answers, pad_id
from timerome.engine.hooks import Hooks, once_on
from timerome.engine.hooks import edit as edit_hook
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.methods._locate import check_layer, down_projection
from timerome.methods.registry import weight_edit
from timerome.metrics import answer_logprobs
from timerome.training.train import TrainConfig, mdlm_loss, merge_lora, wrap_lora

# The loop's settings, shared by every training method (each adds its own keys).
# Sized for the embedded model: ~40 steps of batch 8 take a few seconds on one CPU core.
TRAIN_DEFAULTS = dict(
    grad_steps=40, lr=1e-3, batch_size=8, eps=LIKELIHOOD.eps, weight_decay=0.0, grad_clip=1.0,
    lora_r=0, lora_alpha=None,          # lora_r > 0: LoRA adapters via peft instead of full fine-tuning
    safe=True,                          # the paper's protocol: retain-NLL anchor + early stop on drift
    anchor=1.0,                         # weight of the retain-NLL anchor (safe only)
    drift=5.0,                          # nats of retain-LP drop that stop training (safe only)
    # every step, on 20 retain rows: the embedded default is sharp enough for 5 steps at lr 3e-3 to go
    # from within the drift to 6 nats past it, and 8 rows under-read the drift of the others
    check_every=1, check_rows=20, check_mc=4,
)

# the paper's unmitigated setting, as a canonical row: no anchor, no early stop, at a learning
# rate ordinary for a model this small; it shows the collapse the safe protocol prevents
UNMITIGATED = dict(safe=False, lr=3e-3)

# ------------------------------------------------------------------------------ data


def target_pairs(backbone, rows, target: str | None = DEFAULT_TARGET, facts=()) -> list[tuple[list[int], list[int]]]:
    """Each row's question answered with its target: the own target of the fact in `facts` that asks the
    row's question (a counterfactual request's new object), else `target` (else DEFAULT_TARGET)."""
    own = own_targets(facts)
    return encode_pairs(backbone, [{"question": r["question"],
                                    "answer": own.get(r["question"]) or target or DEFAULT_TARGET} for r in rows])


# ------------------------------------------------------------------------------ activations


@torch.no_grad()
def token_activations(backbone, pairs, site, which: str = "all", batch_size: int = 32) -> torch.Tensor:
    """The site's output at the chosen tokens of clean (unmasked) pairs -> [N_tokens, H] float32.

    which: "answer" (answer tokens), "all" (question and answer tokens; padding never).
    """
    out = []
    pid = pad_id(backbone)
    for s in range(0, len(pairs), batch_size):
        ids, ans, att = collate(pairs[s:s + batch_size], pid, backbone.device)
        keep = ans if which == "answer" else att                                      # [B, L]
        out.append(activations(backbone, ids, att, site)[keep].float())              # [n, H]
    if not out:
        raise TimeromeError("no pairs to read activations from")
    return torch.cat(out)


def mean_activation(backbone, pairs, site, which: str = "all") -> torch.Tensor:
    """Mean of the site's output over the chosen tokens -> [H] float32."""
    return token_activations(backbone, pairs, site, which).mean(0)


class SteeringEdit:
    """One steering edit (act_steer, rmu_like), for `once_on`: applied inside its own `with` block it
    would add its shift twice."""


def steering(backbone, site, fn: Callable[[torch.Tensor], torch.Tensor]):
    """A context factory for InferenceEdit: each call installs h -> fn(h) at the site for a `with`
    block, at every forward (so at every denoising step), removed on leaving; refused inside a block
    of the same edit."""
    owner = SteeringEdit()

    @contextmanager
    def context():
        with once_on(owner, backbone), edit_hook(backbone, site, fn):
            yield
    return context


def random_unit(dim: int, seed: int, device=None) -> torch.Tensor:
    """A fixed random unit vector [dim]: uniform [0, 1) entries, normalised, as WMDP's RMU draws it."""
    gen = torch.Generator().manual_seed(int(seed))
    u = torch.rand(dim, generator=gen, dtype=torch.float32)
    return (u / u.norm()).to(device if device is not None else "cpu")


def parse_layer(backbone, layer, frac: float) -> int:
    """A given layer (negative counts from the end; `_locate.check_layer`) or round(frac * n_layers)."""
    n = backbone.n_layers
    return min(n - 1, max(0, round(frac * n))) if layer is None else check_layer(backbone, layer)


# ------------------------------------------------------------------------------ training


@dataclass
class Run:
    """What an objective may use during one unlearning run."""

    backbone: object
    config: dict
    masks: torch.Generator          # MDLM mask draws (a CPU generator: the same masks on any device)
    pad: int
    reference: Callable | None = None   # () -> context manager yielding the frozen backbone
    state: dict = field(default_factory=dict)   # objectives keep things here (RMU's control vector)
    method: str = ""                   # the method's name, for messages

    def nll(self, batch, per_example: bool = False, backbone=None):
        """MDLM masked-answer loss of a collated batch (nats per answer token; see train.mdlm_loss)."""
        ids, ans, att = batch
        return mdlm_loss(backbone or self.backbone, ids, ans, att, self.masks, self.config["eps"],
                         per_example=per_example)

    def sequence_nll(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sequence -log p(answer | question) estimates of the model and of the frozen reference,
        on the same masks (so their difference is not mask noise) -> ([B] with grad, [B])."""
        if self.reference is None:
            raise TimeromeError("this objective needs a reference model")
        length = batch[1].sum(1).clamp(min=1)                                          # [B]
        state = self.masks.get_state()
        cur = self.nll(batch, per_example=True) * length
        twin = torch.Generator(device=self.masks.device).set_state(state)
        with torch.no_grad(), self.reference() as ref:
            old = mdlm_loss(ref, *batch, twin, self.config["eps"], per_example=True) * length
        return cur, old

    def noisy(self, batch) -> torch.Tensor:
        """The batch's ids with answer tokens masked as the MDLM loss does (t ~ U(eps, 1))."""
        ids, ans, _ = batch
        return mask_answers(ids, ans, self.backbone.mask_id, self.masks, self.config["eps"])[0]


def activations(backbone, ids, att, site) -> torch.Tensor:
    """Forward ids [B, L]; the site's output [B, L, H], with grad when grad is enabled."""
    with Hooks(backbone, [site], detach=False) as got:
        backbone.logits(ids, None if bool(att.all()) else att)
    return got[site][0]


def frozen_copy(backbone):
    """A Backbone over a deep copy of the current weights, frozen (NPO / RMU's reference)."""
    ref = copy.copy(backbone)
    ref.model = copy.deepcopy(backbone.model).eval()
    for p in ref.model.parameters():
        p.requires_grad_(False)
    ref._modules = dict(ref.model.named_modules())  # hook points resolve to the copy's modules
    ref.engine_checks = {}  # its own memo of the engine's checks (wavefront.checked), not the original's dict
    return ref


def retain_lp(backbone, rows, n_mc: int) -> float:
    """Mean log p(answer | question) of the rows, nats (a fixed MC seed: checks are paired)."""
    was = backbone.model.training
    backbone.model.eval()
    lp, _ = answer_logprobs(backbone, [r["question"] for r in rows], [r["answer"] for r in rows],
                            n_mc=n_mc, seed=0)
    backbone.model.train(was)
    return float(lp.mean())


def unlearn(backbone, task, config: dict, seed: int, method: str, objective: Callable,
            *, needs_reference: bool = False, trainable: Callable | None = None,
            retain_w: float = 0.0):
    """Run the unlearning loop in place inside `weight_edit` and return the WeightEdit.

    objective(run, forget_batch, retain_batch) -> (loss tensor, {name: float}) gives the method's
    own terms; the retain NLL (weight retain_w, plus the anchor when safe) is added here.
    trainable(backbone, names) -> the parameter names to train, out of `names` (every weight, or
    with LoRA every adapter weight; default: all of them).
    """
    cfg = config
    if not task.forget_rows:
        raise TimeromeError("the forget set is empty")
    w_retain = float(retain_w) + (float(cfg["anchor"]) if cfg["safe"] else 0.0)
    if (w_retain > 0 or cfg["safe"] or needs_retain(objective)) and not task.retain_rows:
        raise TimeromeError(f"{method} needs retain rows (the retain anchor / early stop); the task has none")
    # the early-stop check measures drift on retain rows the anchor does not train on, when there
    # are enough rows to spare them: drift on rows being trained on would look smaller than it is.
    # Without the safe protocol there is no check, and the retain term reads every retain row
    check = spread(task.retain_rows, int(cfg["check_rows"])) if cfg["safe"] else []
    checked = {id(r) for r in check}
    held = [r for r in task.retain_rows if id(r) not in checked]
    held_out = len(held) >= len(check) > 0
    forget = encode_pairs(backbone, task.forget_rows)
    retain = encode_pairs(backbone, held if held_out else task.retain_rows) if task.retain_rows else []
    order = torch.Generator().manual_seed(seed)
    run = Run(backbone, cfg, torch.Generator().manual_seed(seed + 1), pad_id(backbone),  # CPU: one draw on any device
              method=method)
    flags = {n: p.requires_grad for n, p in backbone.model.named_parameters()}
    info = {"steps_run": 0, "early_stopped": False, "safe": bool(cfg["safe"]), "retain_weight": w_retain,
            "check_rows_held_out": held_out, "retain_rows_trained": len(retain) if w_retain > 0 or
            needs_retain(objective) else 0}

    with weight_edit(backbone, method) as edit:
        peft_model = None
        try:
            # the reference is copied before any adapter is attached: it is the model as it was
            ref_bb = frozen_copy(backbone) if needs_reference and not cfg["lora_r"] else None
            peft_model = _wrap(backbone, cfg, seed) if cfg["lora_r"] else None
            if needs_reference:
                run.reference = ((lambda: _adapters_off(peft_model, backbone)) if peft_model is not None
                                 else (lambda: nullcontext(ref_bb)))
            params = _select(backbone, trainable, peft_model is not None)
            base = retain_lp(backbone, check, cfg["check_mc"]) if cfg["safe"] else None
            t0 = time.perf_counter()
            _train(run, forget, retain, order, params, w_retain, check, base, objective, info)
            info["train_seconds"] = time.perf_counter() - t0
        finally:
            backbone.model.eval()
            backbone.model.zero_grad(set_to_none=True)  # no stale gradients once the edit is in place
            if peft_model is not None:
                merge_lora(backbone, peft_model)
            for n, p in backbone.model.named_parameters():
                p.requires_grad_(flags.get(n, False))
    edit.info = info
    return edit


def reads_retain(config) -> bool:
    """Whether `unlearn` reads the retain rows under `config`: the safe protocol's anchor and early-stop
    check, or a retain term (retain_w > 0); rmu's objective always does (`rmu_unlearn`)."""
    return bool(config["safe"]) or float(config.get("retain_w") or 0) > 0


def needs_retain(objective) -> bool:
    return bool(getattr(objective, "needs_retain", False))


def _train(run, forget, retain, order, params, w_retain, check, base, objective, info) -> None:
    cfg, bb = run.config, run.backbone
    opt = torch.optim.AdamW(params, lr=float(cfg["lr"]), weight_decay=float(cfg["weight_decay"]))
    use_retain = w_retain > 0 or needs_retain(objective)
    good = _copy(params) if base is not None else None   # the last weights within the drift limit
    info.update(retain_lp_before=base, kept_step=0 if base is not None else None, loss=[])
    bb.model.train()
    with progress_bar(f"{run.method}: gradient steps", total=int(cfg["grad_steps"]), enabled=wanted()) as bar:
        for step in range(1, int(cfg["grad_steps"]) + 1):
            fb = _batch(run, forget, order)
            rb = _batch(run, retain, order) if use_retain else None
            loss, parts = objective(run, fb, rb)
            if w_retain > 0:
                r = run.nll(rb)
                loss = loss + w_retain * r
                parts["retain_nll"] = float(r.detach())
            if not torch.isfinite(loss.detach()):
                # diverged: a step on this loss would write NaN into every weight it reaches. Training stops with
                # the last weights, which gave a finite loss (the safe protocol's last kept ones when it runs): a
                # collapsed row the tables report, never a model of NaN weights
                info.update(diverged_at_step=step, diverged_loss=float(loss.detach()))
                if good is not None:
                    _restore(params, good)
                    info.update(early_stopped=True)
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg["grad_clip"]:
                torch.nn.utils.clip_grad_norm_(params, float(cfg["grad_clip"]))
            opt.step()
            if not all(bool(torch.isfinite(p).all()) for p in params):  # no finite weights to stop at: refused
                raise TimeromeError(f"method {run.method!r}: gradient step {step} made weights NaN or infinite (its "
                                    f"loss {float(loss.detach()):.4g}); the weights are left as they were: lower lr or "
                                    "change the method's settings")
            info["steps_run"] = step
            bar.advance()
            info["loss"].append(round(float(loss.detach()), 4))
            info.update({f"last_{k}": v for k, v in parts.items()})
            if base is None or (step % int(cfg["check_every"]) and step != int(cfg["grad_steps"])):
                continue
            lp = retain_lp(bb, check, cfg["check_mc"])
            info["retain_lp_last_check"] = lp
            if not base - lp <= float(cfg["drift"]):  # a NaN retain LP is past any limit
                _restore(params, good)   # back to the last check within the limit
                info.update(early_stopped=True, stopped_retain_lp=lp)
                break
            good, info["kept_step"] = _copy(params), step
    if base is not None and not info["early_stopped"]:
        info["kept_step"] = info["steps_run"]


def _batch(run, pairs, order):
    """batch_size pairs drawn without replacement (all of them when fewer), collated."""
    n = min(int(run.config["batch_size"]), len(pairs))
    idx = torch.randperm(len(pairs), generator=order)[:n].tolist()
    return collate([pairs[i] for i in idx], run.pad, run.backbone.device)


def _copy(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


@torch.no_grad()
def _restore(params, saved) -> None:
    for p, s in zip(params, saved):
        p.copy_(s)


def _select(backbone, trainable, lora: bool) -> list[torch.nn.Parameter]:
    """Trainable parameters (all weights, or all LoRA adapters, narrowed by `trainable`);
    everything else is frozen so that no gradient is computed for it."""
    names = [n for n, _ in backbone.model.named_parameters() if not lora or "lora_" in n]
    keep = set(trainable(backbone, names)) if trainable is not None else set(names)
    params = []
    for n, p in backbone.model.named_parameters():
        p.requires_grad_(n in keep)
        if n in keep:
            params.append(p)
    if not params:
        raise TimeromeError("no trainable parameters selected")
    return params


def _wrap(backbone, cfg, seed: int):
    tcfg = TrainConfig(lora_r=int(cfg["lora_r"]), lora_alpha=cfg["lora_alpha"])
    return wrap_lora(backbone, tcfg, seed=seed)   # adapters trainable (seeded), base weights frozen


@contextmanager
def _adapters_off(peft_model, backbone):
    # with LoRA the weights before training are the base weights: the reference needs no copy
    with peft_model.disable_adapter():
        yield backbone


# ------------------------------------------------------------------------------ objectives


def ascent(run, forget, retain):
    """GA's term: the forget set's MDLM loss, made larger."""
    nll = run.nll(forget)
    return -nll, {"forget_nll": float(nll.detach())}


RMU_DEFAULTS = dict(
    layer=None,        # the steered layer's block output; None: round(0.25 * n_layers) (WMDP: 7 of 32)
    update_layers=3,   # train the MLPs of layers layer-2 .. layer, as WMDP's RMU does
    retain_act_w=10.0,  # weight of the retain-activation term (set on the embedded model: 1 lets
                        # retain LP drift past the safe limit within 20 steps at lr 1e-2)
)


def mlp_out_prefixes(backbone, layer: int) -> tuple[str, ...]:
    """What RMU trains in a layer, as parameter-name prefixes: the MLP's down projection, as WMDP's
    RMU updates (`_locate.down_projection`: LLaDA's ff_out, Llama / Qwen's down_proj, not their gate
    and up projections); a mixture of experts has none (its output is a routed sum), so there every
    MLP part the model names as a hook point of its own ("mlp_routed", "mlp_shared") is trained
    whole: every expert, and the router that the routed part holds."""
    try:
        return (down_projection(backbone, layer).path + ".",)
    except TimeromeError:
        parts = [p for p in backbone.points if p.startswith("mlp_")]
        if not parts:
            raise
        return tuple(backbone.module_path(layer, p) + "." for p in parts)


def rmu_unlearn(backbone, task, config, seed, method: str, coefficient):
    """RMU: forget activations at (layer, resid) -> c * u, retain activations -> the frozen model's.

    Both on MDLM-noised inputs (answer tokens masked with t ~ U(eps, 1): the states the sampler
    meets) at every non-padding token (question and answer, as WMDP steers whole texts).
    coefficient(h_frozen [B, L, H], keep [B, L]) -> c, called once on the first forget batch.
    """
    layer = parse_layer(backbone, config["layer"], 0.25)
    site = (layer, "resid")
    first = max(0, layer - int(config["update_layers"]) + 1)
    prefixes = tuple(p for j in range(first, layer + 1) for p in mlp_out_prefixes(backbone, j))
    u = random_unit(backbone.hidden_size, seed, backbone.device)                       # [H]
    retain_act_w = float(config["retain_act_w"])

    def objective(run, forget, retain):
        noisy_f = run.noisy(forget)
        if "c" not in run.state:
            with torch.no_grad(), run.reference() as ref:
                h0 = activations(ref, noisy_f, forget[2], site)
            run.state["c"] = float(coefficient(h0, forget[2]))
        h_f = activations(run.backbone, noisy_f, forget[2], site)                      # [B, L, H]
        forget_term = activation_mse(h_f, run.state["c"] * u.to(h_f.dtype), forget[2])
        noisy_r = run.noisy(retain)
        with torch.no_grad(), run.reference() as ref:
            h_old = activations(ref, noisy_r, retain[2], site)
        h_r = activations(run.backbone, noisy_r, retain[2], site)
        retain_term = activation_mse(h_r, h_old, retain[2])
        parts = {"forget_mse": float(forget_term.detach()), "retain_mse": float(retain_term.detach()),
                 "c": run.state["c"]}
        return forget_term + retain_act_w * retain_term, parts

    objective.needs_retain = True

    def trainable(_bb, names):
        return [n for n in names if n.startswith(prefixes)]

    edit = unlearn(backbone, task, config, seed, method, objective, needs_reference=True,
                   trainable=trainable)
    edit.info.update(layer=layer, update_layers=list(range(first, layer + 1)))
    return edit


# ------------------------------------------------------------------------------ losses


def npo_loss(cur: torch.Tensor, old: torch.Tensor, beta: float) -> torch.Tensor:
    """NPO: (2 / beta) * mean log(1 + (p / p_ref)^beta), with -log p estimates cur, old [B]."""
    return -F.logsigmoid(beta * (cur - old)).mean() * 2 / beta


def simnpo_loss(nll_per_token: torch.Tensor, beta: float, delta: float) -> torch.Tensor:
    """SimNPO: (2 / beta) * mean log(1 + exp(-beta (nll / |y| - delta))), no reference."""
    return -F.logsigmoid(beta * (nll_per_token - delta)).mean() * 2 / beta


def activation_mse(h: torch.Tensor, target: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """RMU's distance: mean over hidden dims of (h - target)^2, averaged over kept tokens.

    h [B, L, H]; target broadcastable to it; keep [B, L] bool.
    """
    per_token = (h.float() - target.float()).pow(2).mean(-1)                          # [B, L]
    return (per_token * keep).sum() / keep.sum().clamp(min=1)

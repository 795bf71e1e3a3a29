"""MDLM fine-tuning on question/answer pairs (the paper's "FT'd" models).

Objective (LLaDA SFT): mask each answer token with probability t ~ U(eps, 1), prompt never
masked; loss = sum over masked tokens of CE / t, divided by the answer length, averaged over
the batch. Full fine-tuning or LoRA through `peft`.

EOS padding (`eos_pad`, LLaDA's SFT recipe; by default, in this API and in `timerome train` alike,
the checkpoint's own recipe, `recipe_eos_pad`: what its build_info.json records (the embedded default
and `timerome new-model` models: on), else on where the tokenizer has an EOS, except for other models
of the embedded model's family, trained without it): every answer in a batch ends with EOS and is
padded with EOS to the batch's longest sequence; the EOS tokens are answer tokens, masked and
learnt like the others, so the model learns to end its answer and fill the rest with EOS.
Padded to the batch's longest sequence only, a row's EOS count follows its length, and a model can
read the count as a cue (the embedded default says "The capital of X is a fisherman." for "What
does the father of X do ?" when the answer is followed by 4 or more EOS, "The father of ..." with
3 or fewer); `eos_extra` N ends each row with 1..N + 1 EOS instead, drawn per row (uniform, from a
generator of its own seeded with `seed`), the batch then padded and attention-masked, so that every
row is seen with every count and the count tells no row apart. (Drawn per batch on top of the
padding, short rows would never be seen with few EOS: measured, the world-fact rows then fail at a
budget of 4 tokens past the answer.)

`checkpoint=FOLDER` saves a resumable state after every epoch (`train_state.py`) and continues
from it when the same run is started again; Ctrl-C then says where it stopped and what is kept.
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from timerome.common.cache import digest
from timerome.common.checks import budget, integer, number, shown
from timerome.common.checks import seed as check_seed
from timerome.common.progress import notify, progress_bar
from timerome.data.tofu import normalise_row
from timerome.engine.encoding import collate, encode_pairs, mask_answers, pad_id, refuse_special_text
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import Interrupted, TimeromeError
from timerome.training.config import FIRST_TRAINING, TrainConfig
from timerome.training.train_state import load_state, save_state, saved_epoch


def check_config(cfg: TrainConfig, n_rows: int) -> None:
    """Every training setting of its type and range, and the epochs within the work budget."""
    integer(cfg.epochs, "epochs (--epochs)", lo=1)
    number(cfg.lr, "lr (--lr)", lo=0, lo_open=True)
    integer(cfg.batch_size, "batch_size (--batch-size)", lo=1)
    number(cfg.weight_decay, "weight_decay", lo=0)
    number(cfg.warmup_frac, "warmup_frac", lo=0, hi=1)
    number(cfg.eps, "eps (the smallest masking probability)", lo=0, hi=1, lo_open=True)
    integer(cfg.lora_r, "lora_r (--lora-r)", lo=0)
    number(cfg.lora_alpha, "lora_alpha", lo=0, lo_open=True, none=True)
    if cfg.lora_alpha is not None and not cfg.lora_r:  # read by nothing: refused, as a method's lora_alpha is
        raise TimeromeError("lora_alpha scales LoRA adapters, and lora_r (--lora-r) is 0: the weights train whole "
                            "(leave lora_alpha out, or give lora_r)")
    number(cfg.grad_clip, "grad_clip (0: off)", lo=0, none=True)
    check_seed(cfg.seed, "seed (--seed)")
    if cfg.eos_pad is not None and not isinstance(cfg.eos_pad, bool):
        raise TimeromeError(f"eos_pad (--eos-pad) must be True, False or None (the checkpoint's recipe), got "
                            f"{cfg.eos_pad!r}")
    integer(cfg.eos_extra, "eos_extra (--eos-extra)", lo=0)
    if cfg.eos_extra and cfg.eos_pad is False:  # None (unresolved): the recipe decides
        raise TimeromeError("eos_extra (--eos-extra) pads answers with more end-of-text tokens: it needs eos_pad "
                            "(--eos-pad)")
    budget(f"training {n_rows} rows for {cfg.epochs} epochs", cfg.epochs * n_rows, "one forward per row and epoch")


def build_record(directory: str | Path) -> dict:
    """A build folder's `build_info.json` as a dict; {} when it has none or it is not a record
    (`timerome build-default` and `timerome train` write one)."""
    try:
        info = json.loads((Path(directory) / "build_info.json").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def first_training_note(folder, lr: float, epochs: int) -> str | None:
    """What to say where a new model (`timerome new-model`'s folder, never trained since) is to be trained at
    the fine-tuning learning rate, which leaves it saying nothing whatever the epochs (measured, stop 79: tiny
    size, 60 epochs at lr 1e-4, final loss 4.81 and an empty answer); None anywhere else."""
    if folder is None or not (Path(folder) / "new_model.json").is_file() or build_record(folder).get("train"):
        return None
    if lr != TrainConfig.lr:
        return None
    first = FIRST_TRAINING
    what = f"the defaults (lr {lr:g}, epochs {epochs})" if epochs == TrainConfig.epochs else f"the default lr {lr:g}"
    return (f"{folder} is a new model (random weights): {what} fine-tune{'s' if epochs != TrainConfig.epochs else ''} "
            f"a trained model and leave{'s' if epochs != TrainConfig.epochs else ''} this one saying nothing; a first "
            f"training: lr {first['lr']:g}, epochs {first['epochs']} (timerome train --lr {first['lr']:g} --epochs "
            f"{first['epochs']})")


def trained_with_eos_padding(directory: str | Path) -> bool | None:
    """What a checkpoint's `build_info.json` records of its training's EOS padding: True / False, or
    None when it records nothing."""
    train = build_record(directory).get("train")
    value = train.get("eos_pad") if isinstance(train, dict) else None
    return value if isinstance(value, bool) else None


def recipe_eos_pad(backbone) -> bool:
    """Whether training this backbone pads answers with EOS by default (TrainConfig.eos_pad None): what its
    checkpoint's build_info.json records (`timerome build-default` and `train` write it; a `new-model` folder
    has none, and its LLaDA family gives on); else on when the tokenizer has an EOS, as the family's table says
    (`Family.eos_pad`: off for other models of the embedded model's family, whose TOFU fixture was trained
    without it and cuts its answers at ".")."""
    if backbone.tokenizer.eos_token_id is None:
        return False
    source = backbone.info.get("checkpoint")
    recorded = trained_with_eos_padding(source) if source else None
    return recorded if recorded is not None else backbone.family.eos_pad


def with_recipe(cfg: TrainConfig, backbone) -> TrainConfig:
    """cfg with an eos_pad of None resolved to the checkpoint's recipe (`recipe_eos_pad`); as it is otherwise."""
    return replace(cfg, eos_pad=recipe_eos_pad(backbone)) if cfg.eos_pad is None else cfg


def mdlm_loss(backbone, ids, answer_mask, attention_mask, generator, eps: float = LIKELIHOOD.eps,
              per_example: bool = False):
    """The masked-answer MDLM loss (nats per answer token, 1/t weighted)."""
    noisy, masked, t = mask_answers(ids, answer_mask, backbone.mask_id, generator, eps)
    logits = backbone.logits(noisy, attention_mask if not bool(attention_mask.all()) else None)
    ce = F.cross_entropy(logits.float().transpose(1, 2), ids, reduction="none")        # [B, L]
    per = (ce * masked / t[:, None]).sum(1) / answer_mask.sum(1).clamp(min=1)          # [B]
    return per if per_example else per.mean()


def train(backbone, rows, config: TrainConfig | None = None, *, show_progress: bool = True,
          label: str = "training", checkpoint=None, on_epoch=None) -> dict:
    """Fine-tune backbone.model in place on rows of {"question", "answer"}; returns a log.

    label: what the progress bar calls this training. checkpoint: a folder for the resumable
    state (None: none kept). on_epoch(epoch, log): called after each finished epoch (1-based).
    """
    rows = _check_rows(rows)
    cfg = with_recipe(_as_config(config), backbone)  # resolved before anything records the settings
    check_config(cfg, len(rows))
    if not cfg.lora_r and any(p.dtype == torch.float16 for p in backbone.model.parameters() if p.requires_grad):
        # LoRA trains float32 adapters (peft's) over the frozen float16 weights: that works, and stays allowed
        raise TimeromeError("full fine-tuning in float16 is refused: AdamW's moments and epsilon underflow there, "
                            "and every weight is NaN after the first step at any learning rate (measured); train in "
                            "float32 or bfloat16 (--dtype), or LoRA adapters (--lora-r)")
    pairs = encode_pairs(backbone, rows)
    refuse_special_text(backbone, pairs)
    eos = _eos(backbone) if cfg.eos_pad else None
    full = [i for i, (q, a) in enumerate(pairs) if len(q) + len(a) >= backbone.max_length]
    if eos is not None and full:  # no room for an end-of-text: the model never learns to end these answers
        warnings.warn(f"{len(full)} rows (e.g. row {full[0]}) fill the model's context of {backbone.max_length} "
                      "tokens and get no end-of-text: the model does not learn to end those answers (shorten them)",
                      stacklevel=2)
    # the rows as the tokenizer reads them (two tokenizers of one size give one model the same start, not the
    # same training), and the ids the padding writes
    recipe = digest(dict(config=asdict(cfg), rows=[(r["question"], r["answer"]) for r in rows],
                         tokens=[[list(q), list(a)] for q, a in pairs], eos=eos, pad=pad_id(backbone),
                         start=backbone.cache_id())) if checkpoint is not None else ""
    gen = torch.Generator(device=backbone.device).manual_seed(cfg.seed)
    order_gen = torch.Generator().manual_seed(cfg.seed)
    generators = {"mask": gen, "order": order_gen}
    if cfg.eos_extra:  # its own stream: the masks and the order stay those of a run without it
        generators["eos_extra"] = torch.Generator().manual_seed(cfg.seed)
    model = backbone.model
    trainable = [(p, p.requires_grad) for p in model.parameters()]  # given back as they were when training ends
    peft_model = None
    if cfg.lora_r > 0:
        peft_model = wrap_lora(backbone, cfg, seed=cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    steps_per_epoch = math.ceil(len(pairs) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    warm = max(1, int(cfg.warmup_frac * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    pid = pad_id(backbone)
    log = {"loss": [], "seconds": 0.0, "steps": total, "config": asdict(cfg), "resumed_at_epoch": 0}
    state = dict(recipe=recipe, model=model, params=params, opt=opt, sched=sched,
                 generators=generators)
    first, earlier = 0, 0.0
    if checkpoint is not None:
        saved = load_state(checkpoint, **state)
        if saved is not None:
            first, log["loss"], log["resumed_at_epoch"] = saved["epoch"], list(saved["loss"]), saved["epoch"]
            earlier = saved.get("seconds") if isinstance(saved.get("seconds"), float) else 0.0  # the interrupted
            # runs' training time (recorded in a state since stop 72)
            notify(f"{label}: resuming after epoch {first} of {cfg.epochs}, from the state saved in {checkpoint}")
    note = first_training_note((getattr(backbone, "info", None) or {}).get("checkpoint"), cfg.lr, cfg.epochs)
    if note is not None:  # after every refusal (a warning never precedes an error); `timerome train` shows it too
        warnings.warn(note, stacklevel=2)
    model.train()
    t0 = time.perf_counter()
    try:
        with progress_bar(label, total=total, enabled=show_progress, completed=first * steps_per_epoch) as bar:
            for epoch in range(first, cfg.epochs):
                perm = torch.randperm(len(pairs), generator=order_gen).tolist()
                for s in range(steps_per_epoch):
                    batch = [pairs[i] for i in perm[s * cfg.batch_size:(s + 1) * cfg.batch_size]]
                    if eos is not None:
                        counts = (torch.randint(1, cfg.eos_extra + 2, (len(batch),),
                                                generator=generators["eos_extra"]).tolist() if cfg.eos_extra else None)
                        batch = eos_padded(batch, eos, backbone.max_length, counts)
                    ids, ans, att = collate(batch, pid, backbone.device)
                    loss = mdlm_loss(backbone, ids, ans, att, gen, cfg.eps)
                    if not bool(torch.isfinite(loss)):  # diverged: no further step, no state of it saved
                        _diverged(label, epoch, s, f"the loss is {loss.item()}", cfg, checkpoint)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if cfg.grad_clip:
                        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                    try:
                        opt.step()
                    except RuntimeError as e:  # a learning rate whose step size a float cannot hold
                        if "overflow" not in str(e):
                            raise
                        _diverged(label, epoch, s, "the optimiser's step size overflows", cfg, checkpoint)
                    sched.step()
                    log["loss"].append(loss.item())
                    bar.advance(description=f"{label} epoch {epoch + 1}/{cfg.epochs} loss {log['loss'][-1]:.3f}")
                log["seconds"] = earlier + time.perf_counter() - t0
                if checkpoint is not None or epoch + 1 == cfg.epochs:  # before a state is saved, and at the end
                    if not all(bool(torch.isfinite(p).all()) for p in params):  # the epoch's last step diverged
                        _diverged(label, epoch, steps_per_epoch - 1, "a weight is not finite", cfg, checkpoint)
                if checkpoint is not None:
                    save_state(checkpoint, epoch=epoch + 1, step=(epoch + 1) * steps_per_epoch, log=log, **state)
                if on_epoch is not None:
                    on_epoch(epoch + 1, log)
    except KeyboardInterrupt:
        saved = saved_epoch(checkpoint) if checkpoint is not None else None  # the file's: the interrupt may land
        if not saved:  # after the next epoch's state was written
            raise
        raise Interrupted(f"{label} stopped; its state after epoch {saved} of {cfg.epochs} is saved in "
                          f"{checkpoint}") from None
    finally:
        model.eval()
        if peft_model is not None:
            merge_lora(backbone, peft_model)
        for p, flag in trainable:  # as the caller had them: a second training of this backbone trains it again
            p.requires_grad_(flag)
    log["seconds"] = earlier + time.perf_counter() - t0  # every run's, an interrupted one's included
    log["seconds_this_run"] = time.perf_counter() - t0
    return log


def _diverged(label: str, epoch: int, step: int, what: str, cfg: TrainConfig, checkpoint) -> None:
    """Stop a training whose loss or weights stopped being finite: its resumable state is removed (a
    resume would repeat the same steps), and the error says what to change."""
    from timerome.training.train_state import clear_state

    kept = ""
    if checkpoint is not None and clear_state(checkpoint):
        kept = f"; its resumable state in {checkpoint} is removed (a resume would diverge again)"
    raise TimeromeError(f"{label} diverged at epoch {epoch + 1}, step {step + 1}: {what}; lower the learning rate "
                        f"(lr {cfg.lr:g}){kept}; no model was saved, and the backbone trained in place holds the "
                        "diverged weights")


def _as_config(config) -> TrainConfig:
    """A TrainConfig, None (the defaults) or a dict of its fields (unknown names refused)."""
    if config is None:
        return TrainConfig()
    if isinstance(config, TrainConfig):
        return config
    if isinstance(config, dict):
        names = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(config) - names)
        if unknown:
            raise TimeromeError(f"unknown training setting {unknown[0]!r}; the settings are {', '.join(sorted(names))}")
        return TrainConfig(**config)
    raise TimeromeError(f"config must be a TrainConfig, a dict of its settings or None, got {shown(config)}")


def _check_rows(rows) -> list:
    """The training rows as a list of {"question": str, "answer": str}, from any iterable of them (a list, a
    generator, a datasets.Dataset), each checked as a file's row is (`tofu.normalise_row`: prompt / response
    read as question / answer, no blank text); a file is read by data.rows.load_rows."""
    if isinstance(rows, (str, Path)):
        raise TimeromeError(f"rows must be a list of {{'question', 'answer'}} dicts, got the path {str(rows)!r}: read "
                            "a file with timerome.data.rows.load_rows")
    if isinstance(rows, dict) or not hasattr(rows, "__iter__"):  # any other iterable (a datasets.Dataset) is read
        raise TimeromeError(f"rows must be a list of {{'question', 'answer'}} dicts, got {shown(rows)}")
    rows = list(rows)
    if not rows:
        raise TimeromeError("no training rows")
    return [normalise_row(r, "training", i) for i, r in enumerate(rows)]  # as a file's rows are read (load_rows)


def eos_padded(batch, eos: int, limit: int, counts: list[int] | None = None):
    """LLaDA's SFT padding: each answer gets EOS tokens up to one past the batch's longest
    sequence (within the context `limit`), so every row ends its answer with EOS. counts: row i
    gets counts[i] EOS instead (`eos_extra`; `collate` then pads the batch, attention-masked)."""
    if counts is not None:
        return [(q, list(a) + [eos] * max(0, min(k, limit - len(q) - len(a)))) for (q, a), k in zip(batch, counts)]
    length = min(max(len(q) + len(a) for q, a in batch) + 1, limit)
    return [(q, list(a) + [eos] * max(0, length - len(q) - len(a))) for q, a in batch]


def _eos(backbone) -> int:
    eos = getattr(backbone.tokenizer, "eos_token_id", None)
    if eos is None:
        raise TimeromeError("EOS padding needs an end-of-text token, and this tokenizer has none; train "
                            "without eos_pad (--no-eos-pad)")
    return int(eos)


def wrap_lora(backbone, cfg: TrainConfig, seed: int | None = None):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise TimeromeError("LoRA training needs `peft`: pip install peft") from None
    targets = backbone.family.lora_targets  # peft's rule: a string is a regex the whole name matches, a list suffixes

    def adapted(name: str) -> bool:
        if isinstance(targets, str):
            return re.fullmatch(targets, name) is not None
        return any(name == t or name.endswith("." + t) for t in targets)

    widths = [min(m.in_features, m.out_features) for name, m in backbone.model.named_modules()
              if isinstance(m, torch.nn.Linear) and adapted(name)]
    if widths and cfg.lora_r > min(widths):  # an adapter of rank r adds r x (in + out) weights that span no more
        raise TimeromeError(f"lora_r {cfg.lora_r} is over the rank a {min(widths)}-wide layer can take (the narrowest "
                            f"adapted layer): give at most {min(widths)} (0 fine-tunes every weight)")
    for p in backbone.model.parameters():
        p.requires_grad_(False)
    lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_r, lora_dropout=0.0,
                      target_modules=backbone.family.lora_targets, bias="none")
    if seed is None:
        return get_peft_model(backbone.model, lcfg)
    # peft draws the adapters' initial weights from torch's global generator: seed it for this
    # call only, so a LoRA run (and its resumption) is reproducible and the caller's state untouched
    with torch.random.fork_rng(devices=[backbone.device] if backbone.device.type == "cuda" else []):
        torch.manual_seed(seed)
        return get_peft_model(backbone.model, lcfg)


def merge_lora(backbone, peft_model) -> None:
    """Fold the adapters into the weights and drop them, so the Backbone's module paths, hooks
    and state-dict keys stay as they were. Layer by layer, then unload: peft's merge_and_unload
    reads model.config as a dict, which our own models' SimpleNamespace config is not."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in backbone.model.modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
    base = peft_model.unload()
    backbone.model = base.eval()
    backbone._modules = dict(base.named_modules())
    backbone.weights_written()  # merge() writes through .data, which no tensor version counts

"""A resumable training state: what `train.train` writes after each epoch and reads to go on.

    <folder>/state.safetensors   the trained parameters, the optimiser's moments, the random
                                 generators' states (tensors; never a pickle), and in its metadata
                                 the record: the epoch and step reached, the loss log, the schedule
                                 and the optimiser's settings, the recipe digest (JSON)

One file, written atomically (a new version is renamed into place): an interruption or a crash at
any moment leaves the state of one epoch or of the next, never parts of two. (It was two files, the
tensors and a JSON record, written one after the other; a Ctrl-C between the two writes left them of
two epochs, refused on resume, so the interrupted run's work was lost. Such a state is still read
where its two files are of one epoch, and written as one file at its next epoch.)

The recipe digest (training config, the rows as token ids, the tokenizer's end and pad ids, the
starting weights) must match for a state to be read: a state left by another training is refused,
never continued by mistake and never overwritten without a word (delete it to start another).
Resuming reproduces the uninterrupted run exactly (same weights, bit for bit).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from timerome.common.cache import header_metadata, read_tensors, save_tensors
from timerome.common.checks import finite_tensor
from timerome.common.files import safetensors_error
from timerome.errors import TimeromeError

STATE = "state.safetensors"
EARLIER = "state.json"  # the record, before it moved into the tensors' header (read, then removed)


def save_state(folder, *, recipe: str, epoch: int, step: int, log: dict, model, params, opt, sched,
               generators: dict) -> None:
    """Write the state reached after `epoch` epochs (`step` optimiser steps)."""
    folder = Path(folder)
    tensors = {f"param.{n}": p.detach() for n, p in model.named_parameters() if p.requires_grad}
    opt_state = opt.state_dict()
    for i, st in opt_state["state"].items():
        for k, v in st.items():
            tensors[f"opt.{i}.{k}"] = torch.as_tensor(v).detach()
    for name, g in generators.items():
        tensors[f"gen.{name}"] = g.get_state()
    record = dict(recipe=recipe, epoch=epoch, step=step, loss=log["loss"], optimizer_groups=opt_state["param_groups"],
                  schedule=sched.state_dict(), n_params=len(params), seconds=log.get("seconds", 0.0))
    save_tensors(folder / STATE, tensors, metadata={"record": json.dumps(record)})
    (folder / EARLIER).unlink(missing_ok=True)  # an earlier layout's record, resumed from: this file holds it now


def clear_state(folder) -> bool:
    """Remove the state files from `folder` (only those: the folder may be the user's); whether one was there."""
    there = False
    for name in (STATE, EARLIER):
        path = Path(folder) / name
        there |= path.is_file()
        path.unlink(missing_ok=True)
    return there


def saved_epoch(folder) -> int | None:
    """The epoch of the state in `folder` (None when there is none, or it is unreadable): what an
    interrupted run reports as saved, read from the file (its header only: the tensors may be several
    times the model), since an interruption may land after the next epoch's state was written."""
    try:
        return int(_record(Path(folder), header_metadata(Path(folder) / STATE))["epoch"])
    except Exception:  # noqa: BLE001 - no state, or a damaged one: load_state says which when it is read
        return None


def _record(folder: Path, header: dict) -> dict:
    """The record of the state in `folder` whose tensors' header is `header`: in the header, or for a state
    an earlier timerome wrote (two files: the tensors, their header naming the epoch and recipe, then
    state.json), the JSON file, read where the two are of one epoch (a crash between its writes left them
    of two). A TimeromeError naming the folder where there is none to read."""
    tensor_path = folder / STATE
    if "record" in header:
        try:
            meta = json.loads(header["record"])
        except ValueError as e:
            raise TimeromeError(f"the training state {tensor_path} has an unreadable record ({e}); delete {folder} "
                                "to start over") from None
    elif (folder / EARLIER).is_file():
        try:
            meta = json.loads((folder / EARLIER).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TimeromeError(f"the training state {folder / EARLIER} is unreadable ({e}); delete {folder} to "
                                "start over") from None
        if isinstance(meta, dict) and (header.get("epoch") != str(meta.get("epoch"))
                                       or header.get("recipe") != meta.get("recipe")):
            raise TimeromeError(f"the training state in {folder} is torn: its weights are of epoch "
                                f"{header.get('epoch')}, its record of epoch {meta.get('epoch')} (an earlier timerome "
                                f"wrote them as two files, and a run stopped between the two writes); delete {folder} "
                                "to start over")
    else:
        meta = None
    if not isinstance(meta, dict):
        raise TimeromeError(f"the training state {tensor_path} has no record of its epoch (not a training state?); "
                            f"delete {folder} to start over")
    return meta


def load_state(folder, *, recipe: str, model, params, opt, sched, generators: dict) -> dict | None:
    """Restore a saved state into the objects (None when there is none); a damaged state, or one of
    another recipe, is refused (TimeromeError naming the folder). A state an earlier timerome wrote (two
    files) is read too, and saved in this layout at the next epoch."""
    folder = Path(folder)
    tensor_path = folder / STATE
    if not tensor_path.is_file():
        return None
    try:
        t, header = read_tensors(tensor_path)
    except Exception as e:  # noqa: BLE001 - a damaged file: say which
        raise safetensors_error(tensor_path, e) from None
    meta = _record(folder, header)
    if meta.get("recipe") != recipe:  # another training's work: refused, never dropped without a word
        raise TimeromeError(f"{folder} holds the state of another training (after its epoch {meta.get('epoch')}: "
                            "other settings, rows, tokenizer or starting model): run that training again to resume "
                            f"it, or delete {folder} to start this one")
    unfit = TimeromeError(f"the training state in {folder} does not fit this run; delete {folder} to start over")
    if t.get("gen.order") is None or meta.get("n_params") != len(params):
        raise unfit
    named = dict(model.named_parameters())
    for key, value in t.items():  # every saved weight fits its parameter and is finite, before one is copied
        if key.startswith("param."):
            p = named.get(key[len("param."):])
            if p is None or p.shape != value.shape or not value.is_floating_point():
                raise unfit
            finite_tensor(value, f"the training state {tensor_path}: {key}",
                          f"the run it saved diverged or the file is damaged; delete {folder} to start over")
    try:
        with torch.no_grad():
            for key, value in t.items():
                if key.startswith("param."):
                    named[key[len("param."):]].copy_(value)
        state: dict = {}
        for key, value in t.items():
            if key.startswith("opt."):
                _, i, k = key.split(".", 2)
                state.setdefault(int(i), {})[k] = value
        opt.load_state_dict({"state": state, "param_groups": meta["optimizer_groups"]})
        sched.load_state_dict(meta["schedule"])
        for name, g in generators.items():
            g.set_state(t[f"gen.{name}"])
    except (KeyError, ValueError, TypeError, RuntimeError):
        raise unfit from None
    return meta

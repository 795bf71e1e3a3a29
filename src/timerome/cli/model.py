"""Commands about a backbone: info, build-default, train, generate, methods."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from timerome.cli.app import (ModelChoice, app, console, err_console, friendly, model_options,
                              print_json, tofu_dir_read, warn_unknown_words)
from timerome.common.cache import json_text
from timerome.engine.settings import ANSWER, SAMPLER
from timerome.errors import TimeromeError
from timerome.memory.scale import check_on_prompts
from timerome.training.config import TrainConfig


@app.command()
@friendly
@model_options
def info(checkpoint: Optional[str] = typer.Argument(None, help="checkpoint directory (same as --model)"),
         model: ModelChoice = None,
         as_json: bool = typer.Option(False, "--json", help="print the description as JSON")):
    """Show a backbone's family (and why), tokenizer, special ids, hook points and refused config flags."""
    from timerome.backbones.describe import describe, describe_refusal, summary_rows
    from timerome.backbones.flags import RefusedConfig

    if checkpoint and model.model and checkpoint != model.model:
        raise TimeromeError(f"two checkpoints given ({checkpoint} and --model {model.model}); pass one")
    try:
        bb = dataclasses.replace(model, model=checkpoint or model.model).load()
        d = describe(bb)
    except RefusedConfig as e:
        d = describe_refusal(e)
        if as_json:
            print_json(d)
            raise typer.Exit(2)
        _print_rows(d["family"], summary_rows(d))
        raise
    if as_json:
        print_json(d)
        return
    _print_rows(str(bb), summary_rows(d))
    t = Table(title="hook points")
    t.add_column("point")
    t.add_column("module path (layer 0)")
    for p, path in d["hook_points"].items():
        t.add_row(p, path)
    console.print(t)


def _print_rows(title: str, rows) -> None:
    t = Table(title=title, show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


@app.command("build-default")
@friendly
def build_default_cmd(out: Path = typer.Option(None, help="output directory (default: the package's assets)"),
                      check: bool = typer.Option(False, help="rebuild into a temporary folder and compare bytes with the shipped weights"),
                      stage1: Optional[Path] = typer.Option(
                          None, help="start from stage 1's output (a folder a build wrote, whose build_info.json records "
                                     "stage 1 with this build's settings and its weights' sha256, e.g. the assets of "
                                     "commit 8f534f9) and run stage 2 only: about 12 minutes")):
    """Rebuild the embedded default model bit-for-bit, in two stages on one thread: stage 1 (150 epochs,
    about 85 minutes), stage 2 (20 epochs with varied end-of-text padding, about 12 minutes).
    build_info.json has the shipped build's times."""
    import tempfile

    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.training.default_model import build_default, weights_sha256

    if check and out is not None:
        raise TimeromeError("--check rebuilds into a temporary folder and compares it with the shipped weights: --out is "
                            "read by nothing; leave it out")
    if check:
        with tempfile.TemporaryDirectory() as tmp:
            info = build_default(tmp, stage1=stage1)
            shipped = weights_sha256(DEFAULT_MODEL_DIR)
            same = info["sha256"] == shipped
            console.print(f"rebuilt sha256 {info['sha256']}\nshipped sha256 {shipped}\n"
                          + ("[green]identical[/]" if same else "[red]DIFFERENT[/]"))
            raise typer.Exit(0 if same else 1)
    info = build_default(out or DEFAULT_MODEL_DIR, stage1=stage1)
    console.print_json(json_text(info))  # standard JSON: a diverged loss (NaN) as null


@app.command()
@friendly
@model_options
def train(data: str = typer.Option("embedded:full", help="'embedded:SPLIT', 'tofu:SPLIT' (local dir from --tofu-dir) or a JSON/JSONL file of question/answer rows"),
          out: Path = typer.Option(..., help="directory to save the fine-tuned checkpoint"),
          model: ModelChoice = None,
          epochs: int = TrainConfig.epochs, lr: float = TrainConfig.lr, batch_size: int = TrainConfig.batch_size,
          lora_r: int = typer.Option(TrainConfig.lora_r, help="LoRA rank (0 = full fine-tuning; the paper uses 128)"),
          tofu_dir: Optional[str] = typer.Option(None, help="local TOFU directory (Hub layout)"),
          seed: int = TrainConfig.seed,
          eos_pad: Optional[bool] = typer.Option(
              None, "--eos-pad/--no-eos-pad", help="end answers with EOS and pad with EOS (LLaDA's SFT; default: what "
                                                   "the checkpoint's build_info.json records (build-default and train write it), else on when the tokenizer "
                                                   "has EOS, off for other models of the embedded model's family)"),
          eos_extra: int = typer.Option(TrainConfig.eos_extra,
                                        help="with EOS padding: end each answer with 1..N+1 EOS, drawn per row, so "
                                             "that the number of EOS after an answer tells no answer apart"),
          checkpoint: bool = typer.Option(True, help="keep a resumable state after each epoch in OUT/train-state "
                                                     "(trained weights + AdamW moments: large for a full fine-tune)"),
          as_json: bool = typer.Option(False, "--json", help="print the training log summary as JSON")):
    """Fine-tune a backbone on question/answer pairs with the MDLM objective (resumable: each epoch
    is checkpointed in OUT/train-state; run the same command again after an interruption)."""
    import shutil

    from timerome.common.cache import write_json
    from timerome.common.files import output_folder
    from timerome.data.rows import load_rows
    from timerome.errors import Interrupted
    from timerome.training.train import train as run_train

    for name, value in (("--epochs", epochs), ("--batch-size", batch_size)):
        if value < 1:
            raise TimeromeError(f"{name} must be at least 1, got {value}")
    if lora_r < 0:
        raise TimeromeError(f"--lora-r must be >= 0 (0 = full fine-tuning), got {lora_r}")
    if eos_extra < 0:
        raise TimeromeError(f"--eos-extra must be >= 0 (0 = EOS up to one past the batch's longest row), got {eos_extra}")
    if not lr > 0:
        raise TimeromeError(f"--lr must be > 0, got {lr}")
    tofu_dir_read(tofu_dir, data)
    output_folder(out)
    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    source = Path(model.model) if model.model else DEFAULT_MODEL_DIR
    if source.is_dir() and Path(out).resolve() in (source.resolve(), *source.resolve().parents):
        raise TimeromeError(f"--out {out} would overwrite the model being trained ({source}): save the fine-tuned "
                            "checkpoint to another folder")
    state = Path(out) / "train-state"
    held = [n for n in ("config.json", "model.safetensors") if (Path(out) / n).is_file()]
    if held and not (state / "state.safetensors").is_file():  # with a state: a run stopped after its save, resumed
        raise TimeromeError(f"--out {out} already holds a model ({held[0]}): give a new folder, or delete it to train "
                            "there")
    if not checkpoint and state.is_dir() and any(state.iterdir()):  # the end of this run would delete it
        raise TimeromeError(f"{state} holds an interrupted run's state, which --no-checkpoint would neither resume "
                            "nor keep: leave out --no-checkpoint to resume it, or delete that folder to start over")
    bb = model.load()
    rows = load_rows(data, tofu_dir=tofu_dir)
    cfg = TrainConfig(epochs=epochs, lr=lr, batch_size=batch_size, lora_r=lora_r, seed=seed, eos_pad=eos_pad,
                      eos_extra=eos_extra)  # eos_pad None: the checkpoint's recipe (training.train.recipe_eos_pad)
    try:
        log = run_train(bb, rows, cfg, checkpoint=state if checkpoint else None)
    except Interrupted as e:
        raise Interrupted(f"{e}; run the same command again to resume from there") from None
    eos_pad = log["config"]["eos_pad"]  # as the run resolved it
    save_backbone(bb, out)
    final = sum(log["loss"][-10:]) / max(1, len(log["loss"][-10:]))
    # the recipe, where the next `timerome train -m OUT` reads its EOS padding default (trained_with_eos_padding):
    # without it a model trained from the embedded default was fine-tuned again without the padding it learnt
    write_json(Path(out) / "build_info.json", dict(train=dict(
        eos_pad=eos_pad, eos_extra=eos_extra, epochs=epochs, lr=lr, batch_size=batch_size, lora_r=lora_r, seed=seed,
        rows=len(rows), data=str(data), started_from=str(source), final_loss=final, seconds=log["seconds"])))
    # the state goes last: a run stopped before this point is run again from the last epoch's state, not from nothing
    # (it went before the record, and a Ctrl-C between the two left a model without its recipe and no state)
    shutil.rmtree(state, ignore_errors=True)
    if as_json:
        print_json(dict(out=str(out), rows=len(rows), epochs=epochs, seconds=log["seconds"], final_loss=final,
                        eos_pad=eos_pad, eos_extra=eos_extra, resumed_at_epoch=log["resumed_at_epoch"], loss=log["loss"]))
        return
    resumed = f" (resumed after epoch {log['resumed_at_epoch']})" if log["resumed_at_epoch"] else ""
    console.print(f"trained {len(rows)} rows for {epochs} epochs in {log['seconds']:.1f}s{resumed}; final loss "
                  f"{final:.3f}; EOS padding {'on' if eos_pad else 'off'}; saved to {out}", soft_wrap=True)


def save_backbone(bb, out: Path) -> None:
    from timerome.backbones.llada_model import save_model
    from timerome.common.checks import finite_tensor
    from timerome.data.tokenizer import save_tokenizer

    for name, t in bb.model.state_dict().items():  # a model of NaN weights is never written to be loaded later
        finite_tensor(t, f"the trained weight {name}", "not saved: lower the learning rate or change the settings")
    out = Path(out)
    (out / EDITED_FROM).unlink(missing_ok=True)  # an earlier edit's record; `edit` writes its own after this
    if hasattr(bb.model, "cfg"):
        save_model(bb.model, out)
    else:
        from timerome.common.progress import hf_bars_off

        with hf_bars_off():  # its "Writing model shards" bar
            bb.model.save_pretrained(str(out), safe_serialization=True)
        from timerome.common.cache import write_json
        from timerome.common.files import read_json

        cfg = read_json(out / "config.json", "the saved model's config")
        cfg["model_type"] = bb.config.get("model_type", cfg.get("model_type"))
        if not getattr(bb, "causal", False):  # an autoregressive model's mask_id is a placeholder (its EOS): written
            cfg.setdefault("mask_token_id", bb.mask_id)  # down, the folder reloaded as a masked diffusion model
        write_json(out / "config.json", cfg)
    save_tokenizer(bb.tokenizer, out)  # as every timerome build writes it: transformers 4 and 5 read it


EDITED_FROM = "timerome-edit.json"  # in a model folder `timerome edit` wrote: the model it edited, and how


def record_source(out: Path, model, method: str, n_facts: int, facts: str, *, config: dict | None = None,
                  seed: int | None = None) -> None:
    """Write EDITED_FROM into the edited model's folder, so that `eval --requests` measures its
    locality against the model it came from (`edited_from`; the embedded model recorded as null), and
    a reader can tell how it was made (the method's settings and seed)."""
    from timerome.backbones.loading import model_place
    from timerome.common.cache import write_json

    source = None if model.model is None else model_place(model.model)
    write_json(Path(out) / EDITED_FROM, dict(source_model=source, family=model.family, method=method, n_facts=n_facts,
                                             facts=facts, config=config, seed=seed))
    # the training recipe of the weights it started from, where `timerome train -m OUT` reads its EOS padding
    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.training.train import build_record

    folder = Path(model.model) if model.model else DEFAULT_MODEL_DIR
    recipe = build_record(folder).get("train") if folder.is_dir() else None
    if isinstance(recipe, dict):
        write_json(Path(out) / "build_info.json", dict(train=recipe, edited_by=method, edited_from=str(folder)))


def edited_from(folder) -> dict | None:
    """What EDITED_FROM in a model folder says ({"source_model": path, Hub id or None for the embedded
    model, "family", "method", ...}); None where the folder has none."""
    from timerome.common.files import read_json

    path = Path(folder) / EDITED_FROM if folder else None
    if path is None or not path.is_file():
        return None
    out = read_json(path, "the edited model's record")
    if not isinstance(out, dict) or not (out.get("source_model") is None or isinstance(out["source_model"], str)):
        raise TimeromeError(f"{path} is not the record `timerome edit` writes: its 'source_model' must be a path, "
                            "a Hub id or null")
    return out


@app.command()
@friendly
@model_options
def generate(prompt: list[str] = typer.Argument(..., help="one or more prompts"),
             model: ModelChoice = None,
             steps: Optional[int] = typer.Option(None, help="denoising steps (default --gen-length: one token per "
                                                            f"step; the API's generate() takes {SAMPLER.steps})"),
             gen_length: int = typer.Option(ANSWER.gen_length, help="answer budget in tokens; the answer ends at the "
                                            "model's end-of-text, which a model trained to end its answers writes "
                                            f"(the API's generate() takes {SAMPLER.gen_length}, LLaDA's reference)"),
             block_length: Optional[int] = typer.Option(None, help="semi-autoregressive block length (default "
                                                                   "--gen-length: one block)"),
             temperature: float = SAMPLER.temperature,
             remasking: Optional[str] = typer.Option(None, help=f"which masked positions a step reveals (default "
                                                                 f"{SAMPLER.remasking})"),
             seed: Optional[int] = typer.Option(None, help="seed of the sampler's draws (default 0; read only with "
                                                           "--temperature above 0 or --remasking random)"),
             edit: Optional[Path] = typer.Option(None, "--edit", help="an edit memory file: answer with and without it"),
             as_json: bool = typer.Option(False, "--json", help="print the answers as JSON"),
             cache: Optional[str] = typer.Option(None, help="approximate KV cache: prefix or dual (default: exact)"),
             threshold: Optional[float] = typer.Option(None, help="reveal every position whose confidence is >= this, at least one per step"),
             refresh_every: Optional[int] = typer.Option(None, help="with --cache: also refresh it every N steps inside a block")):
    """Answer prompts with the denoising sampler (optionally with an edit memory side by side)."""
    import torch

    from timerome.common.files import user_text
    from timerome.engine.sampler import check_fast_options, check_generation, check_options, until_special
    from timerome.engine.sampler import generate as gen

    prompt = [user_text(p, f"prompt {i + 1}") for i, p in enumerate(prompt)]
    if threshold is not None and steps is not None:  # refused, not ignored
        raise TimeromeError("--steps is read by nothing with --threshold: the sampler takes as many steps as each "
                            "block needs (every position at the threshold's confidence, at least one a step); give "
                            "one of them")
    denoising = {"--steps": steps, "--block-length": block_length, "--remasking": remasking}  # none for an AR model
    steps, block_length = (gen_length if steps is None else steps), (gen_length if block_length is None else block_length)
    remasking = SAMPLER.remasking if remasking is None else remasking
    cache = None if cache in (None, "none") else cache
    blank = [str(i + 1) for i, p in enumerate(prompt) if not p.strip()]
    if blank:  # the sampler generates from no prompt (ids of none); a blank argument is a slip
        raise TimeromeError(f"prompt {', '.join(blank)} is blank: give the question to answer")
    check_options(steps, gen_length, block_length, temperature, remasking=remasking)  # before a model loads
    check_fast_options(cache, threshold, refresh_every, remasking)
    if seed is not None and temperature == 0 and remasking != "random":  # refused, not ignored
        raise TimeromeError(f"--seed {seed}: at temperature 0 with {remasking} remasking the sampler draws nothing "
                            "(the same answer for any seed); give --temperature above 0 (or, on a diffusion model, "
                            "--remasking random), or leave --seed out")
    seed = 0 if seed is None else seed
    bb = model.load()
    given = [k for k, v in denoising.items() if v is not None]
    if bb.causal and given:
        raise TimeromeError(f"{', '.join(given)} {'sets' if len(given) == 1 else 'set'} the denoising sampler; "
                            f"{bb.name} is autoregressive and writes one token per forward, left to right: leave "
                            f"{'it' if len(given) == 1 else 'them'} out")
    for p in prompt:  # every option against every prompt, before any work or warning
        check_generation(bb, len(bb.encode_prompt(p)), steps=steps, gen_length=gen_length, block_length=block_length,
                         temperature=temperature, remasking=remasking, cache=cache,
                         threshold=threshold, refresh_every=refresh_every)
    if steps > gen_length and threshold is None:
        err_console.print(f"[yellow]note:[/] --steps {steps} is more than --gen-length {gen_length}: each token takes "
                          f"one step, so the steps beyond {gen_length} reveal nothing (the same answer, "
                          f"{steps / gen_length:.3g}x the forwards)", soft_wrap=True)
    memory = None
    if edit is not None:
        from timerome.engine.hooks import refuse_unreached
        from timerome.memory.memory_file import load_memory

        memory = load_memory(edit, bb)
        k = memory.coordinate.step
        if k is not None:  # an autoregressive model takes one step per token written: the answer's length decides
            taken, runs, option = ((gen_length, "this answer (--gen-length) writes", "--gen-length")
                                   if bb.causal else (steps, "this run (--steps) takes", "--steps"))
            refuse_unreached(k, taken, str(edit), runs, f"pass {option} {k + 1} or more", causal=bb.causal)
        check_on_prompts(bb, memory, [bb.encode_prompt(p) for p in prompt], edit)
    for i, p in enumerate(prompt):  # after every check: a warning never precedes an error
        warn_unknown_words(bb, p, f"prompt {i + 1}")
    t = Table(show_lines=True)
    t.add_column("prompt")
    t.add_column("answer")
    targets = {}
    if memory is not None:
        t.add_column("answer with edit")
        targets = {getattr(f, "prompt", None): getattr(f, "target", None) or memory.target for f in memory.facts}
        if any(p in targets for p in prompt):
            t.add_column("target (the memory's fact)")
    unended = set()  # (prompt index, column) of the answers their budget cut, not an end of answer

    def shown(ids, where):
        ids = ids.tolist()
        kept = until_special(bb, ids)  # its end of text (or another special token): cut as continuations cuts
        if len(kept) < len(ids):
            return bb.decode(kept).strip()
        text = bb.decode(ids)
        end = bb.family.answer_end
        # cut at the first end mark after some content: an edited answer may open with one
        words = next((i for i, ch in enumerate(text) if ch.isalnum()), len(text))
        cut = text.find(end, words) if end else -1
        if cut < 0:
            unended.add(where)
        return (text[: cut + len(end)] if cut >= 0 else text).strip()  # as the answer cut at EOS above

    answers = []
    for n, p in enumerate(prompt):
        ids = torch.tensor([bb.encode_prompt(p)], device=bb.device)
        kw = dict(steps=steps, gen_length=gen_length, block_length=block_length, temperature=temperature,
                  remasking=remasking, generator=torch.Generator(device=bb.device).manual_seed(seed),
                  cache=cache, threshold=threshold, refresh_every=refresh_every)
        with torch.no_grad():
            plain = shown(gen(bb, ids, **kw)[0, ids.shape[1]:], (n, "answer"))
            row = [p, plain]
            if memory is not None:
                kw["generator"] = torch.Generator(device=bb.device).manual_seed(seed)
                with memory.applied(bb) as state:  # the state tells a step-k* edit which step it is
                    row.append(shown(gen(bb, ids, state=state, **kw)[0, ids.shape[1]:], (n, "answer_with_edit")))
        answers.append(dict(zip(("prompt", "answer", "answer_with_edit"), row), target=targets.get(p)))
        if any(q in targets for q in prompt):
            row.append(targets.get(p) or "–")
        t.add_row(*row)
    for column, why in (("answer", "a model not trained to answer such a question, or trained too little"),
                        ("answer_with_edit", "under the edit the model ends its answer at once")):
        for cut in (False, True):  # ended at once; or its budget held only spaces and line breaks
            empty = [str(i + 1) for i, a in enumerate(answers)
                     if a.get(column) == "" and ((i, column) in unended) == cut]
            if not empty:  # said, so that an empty answer is not read as a failure of the command
                continue
            s, be = ("s", "are") if len(empty) > 1 else ("", "is")
            which = f"answer{s}{' with the edit' if column != 'answer' else ''} to prompt{s} {', '.join(empty)} {be}"
            err_console.print(f"[yellow]note:[/] the {which} empty: " + (
                f"its --gen-length {gen_length} tokens held only spaces and line breaks (give it more)" if cut else
                f"nothing before the model's end of answer ({why})"), soft_wrap=True)
    if as_json:
        print_json(answers)
        return
    console.print(t)


@app.command("methods")
@friendly
def methods_cmd(as_json: bool = typer.Option(False, "--json", help="print the methods and defaults as JSON")):
    """List the registered methods: what each is, whether it changes weights or hooks, whether it installs on an
    autoregressive model, and its default settings."""
    from timerome.methods import available, get_method, method_config

    if as_json:
        print_json({m: method_config(m) for m in available()})
        return

    t = Table(title="methods")
    for name in ("name", "changes", "on an AR model", "what it is / defaults"):
        t.add_column(name)
    for m in available():
        entry = get_method(m)
        t.add_row(m, entry.kind if entry.kind == "weights" else "hooks", entry.autoregressive,
                  f"{entry.doc}\n[dim]{escape(json.dumps(method_config(m), default=str))}[/]")
    console.print(t)

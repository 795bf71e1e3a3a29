"""The embedded default: a small LLaDA-style MDLM that has memorised a fictitious-author corpus.

`build_default()` is the exact recipe of the weights shipped in `assets/default-model`: same
seed and thread count, same bytes (`timerome build-default --check` verifies it).

What it learns (`recipe_rows`): every author question in both phrasings, the real-world analogues
(the classics' writers and the capitals, repeated WORLD_REPEATS times: their compound subjects are
learnt slower than the authors' names), and "I don't know." for questions about invented people it
was never told about. Every answer ends with end-of-text (LLaDA's SFT padding, `eos_pad`), so the
model ends its answers and generation stops there. The context (512 tokens) holds standard
benchmark prompts, although the model only ever saw short QA rows.

Two stages, both recorded in `build_info.json`:
1. TRAIN_CONFIG from a seeded initialisation (150 epochs, about 85 minutes on one thread). Its
   answers are padded with EOS to one past the batch's longest row, so the number of EOS after an
   answer follows the answer's length, and the model learnt to read it as a cue: with 4 or more EOS
   after "What does the father of X do ?" it said "The capital of X ...".
2. STAGE2_CONFIG continues from stage 1 on the same rows, each answer ended with 1..33 EOS drawn
   per row (`eos_extra`), so the count tells no answer apart (20 epochs, about 12 minutes).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from timerome.backbones.llada_model import build_model, save_model
from timerome.backbones.loading import DEFAULT_MODEL_DIR, load_backbone
from timerome.common.cache import file_sha256, write_json
from timerome.data.corpus import make_corpus, training_rows
from timerome.data.tokenizer import build_word_tokenizer, save_tokenizer
from timerome.engine.encoding import DEFAULT_TARGET  # the edit target must be in the word vocabulary
from timerome.errors import TimeromeError
from timerome.training.config import SCRATCH_LR
from timerome.training.train import TrainConfig, build_record, train

MODEL_CONFIG = dict(
    model_type="timerome-llada", d_model=128, n_layers=4, n_heads=4, n_kv_heads=4,
    mlp_hidden_size=384, max_sequence_length=512, rope_theta=10000.0, rms_norm_eps=1e-5,
    weight_tying=False, include_bias=False,
)
TRAIN_CONFIG = TrainConfig(epochs=150, lr=SCRATCH_LR, batch_size=64, weight_decay=0.0, warmup_frac=0.03,
                           grad_clip=1.0, seed=0, eos_pad=True)
STAGE2_CONFIG = TrainConfig(**{**TRAIN_CONFIG.__dict__, "epochs": 20, "lr": 3e-4, "eos_extra": 32})
WORLD_REPEATS = 4  # the real-world rows appear this many times per epoch
CORPUS_SEED = 0
THREADS = 1  # CPU float reductions depend on the thread count: fixed for bit-for-bit rebuilds


def corpus_texts(corpus: dict) -> list[str]:
    """Every string the model will ever be asked about, so the word vocabulary covers them."""
    texts = []
    for rows in corpus.values():
        for r in rows:
            for key in ("question", "answer", "paraphrased_answer", "paraphrased_question", "author", "object"):
                if isinstance(r.get(key), str):
                    texts.append(r[key])
            texts.extend(r.get("perturbed_answer") or [])
            texts.extend(str(r[k]) for k in ("option1", "option2", "option3", "option4") if k in r)
    return texts + [DEFAULT_TARGET]


def recipe_rows(corpus: dict) -> list[dict]:
    """The rows of one training epoch: training_rows, the real-world rows WORLD_REPEATS times."""
    world = corpus["real_authors"] + corpus["world_facts"]
    return training_rows(corpus) + world * (WORLD_REPEATS - 1)


def build_default(out_dir: str | Path = DEFAULT_MODEL_DIR, *, epochs: int | None = None,
                  stage2_epochs: int | None = None, stage1: str | Path | None = None, show_progress: bool = True,
                  **train_overrides) -> dict:
    """Train the embedded default into `out_dir` (module docstring: the two stages).

    `stage1`: a folder holding stage 1's output, as a build wrote it (its `build_info.json` records
    stage 1 with this build's settings and its weights' sha256): the build starts from it and runs
    stage 2 only. `epochs` and `train_overrides` change stage 1, `stage2_epochs` stage 2 (0: no
    stage 2); with them the build is a different model, for tests and experiments."""
    from timerome.common.files import output_folder

    out = output_folder(out_dir, "the output folder")  # a file in the way: refused now, not after the build's hours
    torch.set_num_threads(THREADS)
    t0 = time.perf_counter()
    corpus = make_corpus(seed=CORPUS_SEED)
    tok = build_word_tokenizer(corpus_texts(corpus))
    cfg = dict(MODEL_CONFIG, vocab_size=len(tok), embedding_size=len(tok), mask_token_id=int(tok.mask_token_id))
    rows = recipe_rows(corpus)
    over = dict(train_overrides, **({} if epochs is None else {"epochs": epochs}))
    tcfg = TrainConfig(**{**TRAIN_CONFIG.__dict__, **over})
    s2cfg = (STAGE2_CONFIG if stage2_epochs is None
             else TrainConfig(**{**STAGE2_CONFIG.__dict__, "epochs": stage2_epochs}))
    stages = []
    with tempfile.TemporaryDirectory() as tmp:
        save_tokenizer(tok, tmp)
        if stage1 is None:
            save_model(build_model(cfg, seed=0), tmp)
            bb = load_backbone(tmp)
            log = train(bb, rows, tcfg, show_progress=show_progress)
            bb.model.cfg = cfg
            save_model(bb.model, tmp)
            stages.append(_stage_info(tcfg, log, t0, weights_sha256(tmp)))
            start = tmp
        else:
            stages.append(_checked_stage1(stage1, tcfg))
            start = stage1
        bb = load_backbone(start)
        if s2cfg.epochs:
            t1 = time.perf_counter()
            log = train(bb, rows, s2cfg, show_progress=show_progress)
            stages.append(_stage_info(s2cfg, log, t1, None))
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out)
    bb.model.cfg = cfg
    save_model(bb.model, out)
    stages[-1]["sha256"] = weights_sha256(out)
    info = {
        "command": "timerome build-default" + ("" if stage1 is None else " --stage1 DIR"),
        "corpus_seed": CORPUS_SEED,
        "world_repeats": WORLD_REPEATS,
        "threads": THREADS,
        "torch": torch.__version__,
        "stages": stages,
        "seconds": round(time.perf_counter() - t0, 1),
        "train": stages[-1]["train"],  # what the weights were last trained with (`trained_with_eos_padding`)
        "sha256": weights_sha256(out),
    }
    write_json(out / "build_info.json", info)  # standard JSON: a diverged loss (NaN) as null
    return info


def _checked_stage1(folder: str | Path, tcfg: TrainConfig) -> dict:
    """Stage 1's record from `folder`, once its weights and settings are those this build needs."""
    if not (Path(folder) / "model.safetensors").is_file():
        raise TimeromeError(f"--stage1 {folder}: no model.safetensors there")
    rec = stage1_record(folder)
    try:
        recorded = TrainConfig(**rec["train"]).__dict__
    except (KeyError, TypeError):
        recorded = None
    if recorded != tcfg.__dict__:
        raise TimeromeError(f"--stage1 {folder}: its build_info.json does not record a stage 1 trained with this "
                            f"build's settings ({tcfg.epochs} epochs, lr {tcfg.lr}); build without --stage1")
    found = weights_sha256(folder)
    if rec.get("sha256") != found:
        raise TimeromeError(f"--stage1 {folder}: its weights (sha256 {found[:12]}...) are not the ones its "
                            f"build_info.json records ({str(rec.get('sha256'))[:12]}...)")
    return dict(rec, from_folder=str(folder))


def _stage_info(cfg: TrainConfig, log: dict, t0: float, sha: str | None) -> dict:
    last = log["loss"][-50:]
    return {"train": cfg.__dict__, "seconds": round(time.perf_counter() - t0, 1),
            "final_loss_last50": sum(last) / max(1, len(last)), "sha256": sha}


def stage1_record(directory: str | Path = DEFAULT_MODEL_DIR) -> dict:
    """Stage 1 as a build recorded it in `build_info.json` (its train settings, time, loss, sha256):
    `stages[0]`, or the whole record of a one-stage build; {} when there is none."""
    info = build_record(directory)
    stages = info.get("stages")
    if isinstance(stages, list) and stages and isinstance(stages[0], dict):
        return dict(stages[0])
    return {k: info[k] for k in ("train", "seconds", "final_loss_last50", "sha256") if k in info}


def weights_sha256(directory: str | Path) -> str:
    return file_sha256(Path(directory) / "model.safetensors")


"""The embedded default: a small LLaDA-style MDLM that has memorised a fictitious-author corpus.

`build_default()` is the exact recipe of the weights shipped in `assets/default-model`: same
seed and thread count, same bytes (`timerome build-default --check` verifies it).

What it learns (`recipe_rows`): every author question in both phrasings, the real-world analogues
(the classics' writers and the capitals, repeated WORLD_REPEATS times: their compound subjects are
learnt slower than the authors' names), and "I don't know." for questions about invented people it
was never told about. Every answer ends with end-of-text (LLaDA's SFT padding, `eos_pad`), so the
model ends its answers and generation stops there. The context (512 tokens) holds standard
benchmark prompts, although the model only ever saw short QA rows.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

import torch

from timerome.backbones.llada_model import build_model, save_model
from timerome.data.corpus import make_corpus, training_rows
from timerome.data.tokenizer import build_word_tokenizer, save_tokenizer
from timerome.backbones.loading import DEFAULT_MODEL_DIR, load_backbone
from timerome.encoding import DEFAULT_TARGET  # the edit target must be in the word vocabulary
from timerome.train import TrainConfig, train

MODEL_CONFIG = dict(
    model_type="timerome-llada", d_model=128, n_layers=4, n_heads=4, n_kv_heads=4,
    mlp_hidden_size=384, max_sequence_length=512, rope_theta=10000.0, rms_norm_eps=1e-5,
    weight_tying=False, include_bias=False,
)
TRAIN_CONFIG = TrainConfig(epochs=150, lr=3e-3, batch_size=64, weight_decay=0.0, warmup_frac=0.03,
                           grad_clip=1.0, seed=0, eos_pad=True)
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
                  show_progress: bool = True, **train_overrides) -> dict:
    torch.set_num_threads(THREADS)
    t0 = time.perf_counter()
    corpus = make_corpus(seed=CORPUS_SEED)
    tok = build_word_tokenizer(corpus_texts(corpus))
    cfg = dict(MODEL_CONFIG, vocab_size=len(tok), embedding_size=len(tok), mask_token_id=int(tok.mask_token_id))
    out = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        save_tokenizer(tok, tmp)
        save_model(build_model(cfg, seed=0), tmp)
        bb = load_backbone(tmp)
    over = dict(train_overrides, **({} if epochs is None else {"epochs": epochs}))
    tcfg = TrainConfig(**{**TRAIN_CONFIG.__dict__, **over})
    log = train(bb, recipe_rows(corpus), tcfg, show_progress=show_progress)
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out)
    bb.model.cfg = cfg
    save_model(bb.model, out)
    info = {
        "command": "timerome build-default",
        "corpus_seed": CORPUS_SEED,
        "train": tcfg.__dict__,
        "world_repeats": WORLD_REPEATS,
        "threads": THREADS,
        "torch": torch.__version__,
        "seconds": round(time.perf_counter() - t0, 1),
        "final_loss_last50": sum(log["loss"][-50:]) / max(1, len(log["loss"][-50:])),
        "sha256": weights_sha256(out),
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def weights_sha256(directory: str | Path) -> str:
    return hashlib.sha256((Path(directory) / "model.safetensors").read_bytes()).hexdigest()


def trained_with_eos_padding(directory: str | Path) -> bool | None:
    """What a checkpoint's `build_info.json` records of its training's EOS padding (`timerome
    build-default` writes it): True / False, or None when it records nothing."""
    info = Path(directory) / "build_info.json"
    try:
        value = json.loads(info.read_text()).get("train", {}).get("eos_pad")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None

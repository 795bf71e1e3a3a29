"""A small MDLM whose tokenizer covers given texts: timerome's LLaDA structure on a byte-level BPE
(3 specials) or the word-level tokenizer, random or briefly trained with the MDLM objective. The
benchmark tests and `benchmarks/bench_rwku.py` build their models with it (so MUSE / RWKU / WHP / WMDP
text has no unknown token); `new_model` is the user-facing recipe (the release config, 5 specials)."""

from __future__ import annotations

from pathlib import Path

from timerome.backbones import load_backbone
from timerome.backbones.llada_model import build_model, save_model
from timerome.data.tokenizer import build_word_tokenizer, save_tokenizer
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.training.new_model import train_bpe_tokenizer
from timerome.training.config import SCRATCH_LR
from timerome.training.train import TrainConfig, train

SPECIALS = ("<|pad|>", "<|eos|>", "<|mask|>")


def bpe_tokenizer(texts, directory: Path, vocab: int = 400):
    """`new_model.train_bpe_tokenizer` on `texts` (and the refusal target) with three specials, saved in
    `directory`."""
    tok = train_bpe_tokenizer(list(texts) + [DEFAULT_TARGET], vocab, specials=SPECIALS,
                              roles=dict(pad_token=SPECIALS[0], eos_token=SPECIALS[1], mask_token=SPECIALS[2]))
    tok.save_pretrained(str(directory))
    return tok


def tiny_model(texts, directory: Path, *, d_model: int = 64, layers: int = 2, max_length: int = 128, seed: int = 0,
               words: bool = False):
    """A random timerome-llada model whose tokenizer covers `texts`: byte-level BPE trained on them,
    or (words=True) the project's word-level tokenizer of their words (one id per word, so a
    subject's name is one token, as in the embedded model)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if words:
        tok = build_word_tokenizer(list(texts) + [DEFAULT_TARGET])
        save_tokenizer(tok, d)
    else:
        tok = bpe_tokenizer(texts, d)
    cfg = dict(model_type="timerome-llada", d_model=d_model, n_layers=layers, n_heads=4, n_kv_heads=4,
               mlp_hidden_size=2 * d_model, vocab_size=len(tok), embedding_size=len(tok),
               max_sequence_length=max_length, rope_theta=10000.0, rms_norm_eps=1e-5,
               mask_token_id=int(tok.mask_token_id), weight_tying=False)
    save_model(build_model(cfg, seed=seed), d)
    return load_backbone(d)


def trained_model(rows, directory: Path, epochs: int = 80, seed: int = 0, layers: int = 2, max_length: int = 128,
                  words: bool = False, extra_texts=()):
    """tiny_model on the rows' text (and extra_texts, encodable but not trained on), trained with
    the MDLM objective on the question/answer rows."""
    texts = [r["question"] + " " + r["answer"] for r in rows] + list(extra_texts)
    bb = tiny_model(texts, directory, seed=seed, layers=layers, max_length=max_length, words=words)
    train(bb, rows, TrainConfig(epochs=epochs, lr=SCRATCH_LR, batch_size=8, seed=seed, eos_pad=False), show_progress=False)
    return bb

"""A fresh MDLM for your own text: LLaDA's structure at a chosen size, with a byte-level BPE tokenizer
trained on your texts, saved in the Hugging Face layout that `timerome train` and every other
command read.

    info = new_model(["tofu:retain90", "my_rows.jsonl", "notes.txt"], "my-model", size="small")
    # then: timerome train --model my-model --data my_rows.jsonl --out my-model-trained
    # or, in Python, with the same defaults (EOS padding on for this tokenizer: without it the model
    # never learns to end an answer; `training.train.recipe_eos_pad`):
    #     train(load_backbone("my-model"), rows)

The weights are a seeded random initialisation (`llada_model.build_model`); the config carries the
LLaDA release's keys (model_type "llada", LLaDAModelLM), so the official modelling code reads it
too. The tokenizer is byte-level BPE (GPT-2's pre-tokenisation, so any text encodes: no word is
ever unknown) with the special tokens of the embedded model's tokenizer (pad, unk, bos, eos,
mask at ids 0-4). Same texts, size and seed: the same files.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from timerome.backbones.flags import parameter_count
from timerome.backbones.llada_model import build_model, save_model
from timerome.backbones.tiny import LLADA_RELEASE_KEYS
from timerome.common.cache import write_json
from timerome.common.checks import integer, memory_budget
from timerome.common.checks import seed as check_seed
from timerome.common.files import output_folder, read_text
from timerome.data.rows import load_rows, tofu_dir_read, tofu_folder
from timerome.data.tokenizer import SPECIAL_ROLES, SPECIALS, save_tokenizer
from timerome.errors import TimeromeError
from timerome.training.default_model import corpus_texts

# (d_model, n_layers, n_heads, mlp_hidden_size); "small" is the embedded model's size
SIZES = {
    "tiny": (64, 2, 4, 192),
    "small": (128, 4, 4, 384),
    "base": (256, 6, 8, 768),
    "large": (512, 8, 8, 1536),
}
DIMS = ("d_model", "n_layers", "n_heads", "mlp_hidden_size")  # what a size sets, each in SIZES' order
DEFAULT_VOCAB = 4096
DEFAULT_CONTEXT = 256  # TOFU answers run to ~150 tokens


def user_texts(sources, *, tofu_dir=None) -> tuple[list[str], list[dict]]:
    """(every text of the sources, their question / answer rows): 'embedded:SPLIT', 'tofu:SPLIT' and JSON/JSONL
    rows files give their questions, answers and answer variants; any other file is plain text, one text a line."""
    texts: list[str] = []
    all_rows: list[dict] = []
    for src in sources:
        src = str(src)
        if src.startswith(("embedded:", "tofu:")) or Path(src).suffix in (".json", ".jsonl"):
            rows = load_rows(src, tofu_dir=tofu_folder(src, tofu_dir))
            if not rows:  # corpus_texts would still give the default target: a tokenizer learnt on one text
                raise TimeromeError(f"{src} holds no rows: nothing to train the tokenizer on")
            texts += corpus_texts({"rows": rows})
            all_rows += rows
        else:
            texts += [line.strip() for line in read_text(src, "text file").splitlines() if line.strip()]
    if not texts:
        raise TimeromeError("no text to train the tokenizer on: give rows files, splits or text files with text")
    for text in texts:  # the tokenizer would read it as that token: the model would learn an end of text mid-row
        held = [s for s in SPECIALS if s in text]
        if held:
            raise TimeromeError(f"the text {text[:60]!r} holds {held[0]!r}, the new tokenizer's special token: take "
                                "it out of the texts")
    return texts, all_rows


def longest_row(out, rows: list[dict]) -> int | None:
    """The most tokens a question / answer row takes in the model at `out` (prompt and answer, as `timerome
    train` counts them against the context, `encoding.encode_pairs`); None without rows."""
    if not rows:
        return None
    from timerome.backbones import load_backbone
    from timerome.engine.encoding import answer_ids, uses_leading_space

    bb = load_backbone(out)
    bpe = uses_leading_space(bb)
    return max(len(bb.encode_prompt(r["question"])) + len(answer_ids(bb, r["answer"], bpe)) for r in rows)


def train_bpe_tokenizer(texts: list[str], vocab_size: int = DEFAULT_VOCAB, *, specials=SPECIALS, roles=SPECIAL_ROLES):
    """A byte-level BPE tokenizer learnt on `texts` (PreTrainedTokenizerFast, `specials` first, at ids
    0, 1, ...; `roles` names them: pad_token=..., eos_token=...). Every byte is in its alphabet, so any
    text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(specials) + 256:
        raise TimeromeError(f"vocab_size must be at least {len(specials) + 256} (the specials and the 256 "
                            f"bytes), got {vocab_size}")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, **roles)


def model_config(tok, size: str = "small", *, context: int = DEFAULT_CONTEXT, **override) -> dict:
    """The LLaDA-release config of a model of `size` (SIZES) for this tokenizer; `override` sets
    d_model, n_layers, n_heads or mlp_hidden_size directly."""
    dims = model_dims(size, context=context, **override)
    return dict(LLADA_RELEASE_KEYS, model_type="llada", **dims, n_kv_heads=dims["n_heads"], max_sequence_length=context,
                rope_theta=10000.0, rms_norm_eps=1e-5, vocab_size=len(tok), embedding_size=len(tok),
                mask_token_id=int(tok.mask_token_id), eos_token_id=int(tok.eos_token_id),
                pad_token_id=int(tok.pad_token_id), bos_token_id=int(tok.bos_token_id))


def model_dims(size: str = "small", *, context: int = DEFAULT_CONTEXT, **override) -> dict:
    """d_model, n_layers, n_heads and mlp_hidden_size of `size` with `override`, checked."""
    if size not in SIZES:
        raise TimeromeError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    dims = dict(zip(DIMS, SIZES[size]))
    for key, value in override.items():
        if key not in dims:
            raise TimeromeError(f"no size setting {key!r}; settings: {', '.join(dims)}")
        if value is not None:
            dims[key] = value
    for key, value in dict(dims, context=context).items():
        integer(value, key, lo=1)
    if dims["d_model"] % dims["n_heads"] or (dims["d_model"] // dims["n_heads"]) % 2:
        raise TimeromeError(f"d_model {dims['d_model']} must split into {dims['n_heads']} heads of an even size "
                            "(RoPE rotates pairs)")
    return dims


def new_model(sources, out, *, size: str | None = None, vocab_size: int = DEFAULT_VOCAB,
              context: int = DEFAULT_CONTEXT, seed: int = 0, tofu_dir=None, **dims) -> dict:
    """Write a fresh model + tokenizer to `out` (module docstring); returns what was built. size: one of
    SIZES (default "small"), each of `dims` given replacing its dimension (a size beside all four is read
    by nothing, and refused). tofu_dir: the TOFU folder of the 'tofu:SPLIT' sources (refused where none
    is one)."""
    sources = [sources] if isinstance(sources, (str, Path)) else list(sources)  # one source, not its letters
    given = [k for k in DIMS if dims.get(k) is not None]
    if size is not None and size in SIZES and len(given) == len(DIMS):
        raise TimeromeError(f"size {size!r} is read by nothing: every dimension is given ({', '.join(given)}; "
                            "--d-model, --layers, --heads, --mlp): leave the size out")
    size = "small" if size is None else size
    tofu_dir_read(tofu_dir, *map(str, sources))
    out = output_folder(out)
    check_seed(seed, "seed")
    integer(vocab_size, f"vocab_size (--vocab-size: the {len(SPECIALS)} special tokens and the 256 bytes at least)",
            lo=len(SPECIALS) + 256)
    if (out / "model.safetensors").exists():
        raise TimeromeError(f"{out} already holds a model; choose a new folder")
    # before the tokenizer is learnt: the largest model these settings can give (vocab_size is an upper bound)
    dims = model_dims(size, context=context, **dims)
    n_params = parameter_count("llada", dict(dims, model_type="llada", vocab_size=vocab_size, weight_tying=False,
                                             embedding_size=vocab_size))
    memory_budget(f"a new model of up to {n_params:.3g} parameters", 4 * n_params)
    texts, rows = user_texts(sources, tofu_dir=tofu_dir)
    tok = train_bpe_tokenizer(texts, vocab_size)
    cfg = model_config(tok, size, context=context, **dims)
    model = build_model(cfg, seed=seed)
    save_tokenizer(tok, out)
    save_model(model, out)
    n_params = sum(p.numel() for p in model.parameters())
    longest = longest_row(out, rows)  # a context its own rows do not fit is said now, not at `timerome train`
    if longest is not None and longest > context:
        warnings.warn(f"its rows take up to {longest} tokens, over the context of {context}: `timerome train` refuses "
                      f"a row that does not fit; make the model again with --context {longest} (context={longest}) "
                      "or more to train on them", stacklevel=2)
    info = dict(command="timerome new-model", sources=[str(s) for s in sources], n_texts=len(texts),
                texts_sha256=hashlib.sha256("\n".join(texts).encode()).hexdigest(),
                size=size if len(given) < len(DIMS) else None,  # None: every dimension given (`dims`)
                vocab_size=len(tok), context=context, longest_row=longest, seed=seed, parameters=n_params,
                dims={k: cfg[k] for k in DIMS},
                train_hint="train it with EOS padding (timerome train does this for a model with an EOS token)")
    write_json(out / "new_model.json", info)
    return dict(info, out=str(out))

"""A word-level tokenizer for the embedded corpus (the `tokenizers` library, HF layout)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<|pad|>", "<|unk|>", "<|bos|>", "<|eos|>", "<|mask|>"]
PRE = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])


def words(text: str) -> list[str]:
    return [w for w, _ in PRE.pre_tokenize_str(text)]


def build_word_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """Special tokens take ids 0-4 (mask = 4); words follow by frequency, then alphabetically."""
    counts = Counter(w for t in texts for w in words(t))
    ordered = sorted(counts, key=lambda w: (-counts[w], w))
    vocab = {t: i for i, t in enumerate(SPECIALS + [w for w in ordered if w not in SPECIALS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    tk.pre_tokenizer = PRE
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # words joined by spaces, " ." tidied
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>", unk_token="<|unk|>",
                                   bos_token="<|bos|>", eos_token="<|eos|>", mask_token="<|mask|>")


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | Path) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(directory))

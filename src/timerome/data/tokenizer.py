"""A word-level tokenizer for the embedded corpus, built with `tokenizers`, saved in the HF layout."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from timerome.errors import TimeromeError

if TYPE_CHECKING:  # for the annotations only: transformers is imported where a tokenizer is built
    from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS, MASK = "<|pad|>", "<|unk|>", "<|bos|>", "<|eos|>", "<|mask|>"
SPECIALS = [PAD, UNK, BOS, EOS, MASK]  # ids 0..4, in this order
SPECIAL_ROLES = {"pad_token": PAD, "unk_token": UNK, "bos_token": BOS, "eos_token": EOS, "mask_token": MASK}
# whitespace first, then every punctuation mark on its own: "Al-Kuwaiti's" -> Al - Kuwaiti ' s
PRE_TOKENIZER = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])


def words(text: str) -> list[str]:
    """The words the tokenizer sees in `text` (its pre-tokenization)."""
    return [w for w, _ in PRE_TOKENIZER.pre_tokenize_str(text)]


def build_word_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """One id per word of `texts`; specials take ids 0-4 (mask = 4).

    Words follow by frequency, then alphabetically, so the same texts give the same ids.
    """
    counts: Counter[str] = Counter()
    for text, n in Counter(texts).items():  # corpora repeat texts across splits: split each once
        for w in words(text):
            counts[w] += n
    ordered = sorted((w for w in counts if w not in SPECIALS), key=lambda w: (-counts[w], w))
    if not ordered:
        raise TimeromeError("cannot build a tokenizer from texts without any words")
    vocab = {w: i for i, w in enumerate(SPECIALS + ordered)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tk.pre_tokenizer = PRE_TOKENIZER
    # WordPiece without "##" pieces joins words with spaces and its cleanup glues " ." / " ?" on;
    # it misses the apostrophe split off by the pre-tokenizer, so "don ' t" is glued afterwards
    tk.decoder = decoders.Sequence([decoders.WordPiece(prefix="##", cleanup=True), decoders.Fuse(),
                                    decoders.Replace(" ' ", "'")])
    from transformers import PreTrainedTokenizerFast  # here: transformers costs seconds at every command's start

    return PreTrainedTokenizerFast(tokenizer_object=tk, **SPECIAL_ROLES)


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | Path) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json, for AutoTokenizer."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(d))
    config_path = d / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    # transformers 5 writes its own class name here, which transformers 4 cannot resolve (a model's own class,
    # Qwen2Tokenizer say, stays)
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    # transformers 5 no longer writes this file; older loaders read the special tokens from it
    specials = {role: str(getattr(tok, role)) for role in SPECIAL_ROLES if getattr(tok, role, None) is not None}
    (d / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n",
                                               encoding="utf-8")

"""Data: the embedded fictitious-author corpus, its word tokenizer, TOFU splits and facts."""

from timerome.data.corpus import make_corpus, training_rows
from timerome.data.facts import Fact, facts_from_rows, object_span
from timerome.data.tofu import FULL_OFFSET, SPLITS, load_split
from timerome.data.tokenizer import build_word_tokenizer, save_tokenizer

__all__ = ["make_corpus", "training_rows", "Fact", "facts_from_rows", "object_span", "FULL_OFFSET",
           "SPLITS", "load_split", "build_word_tokenizer", "save_tokenizer"]

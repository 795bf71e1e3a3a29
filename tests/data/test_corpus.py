import hashlib
import json
import re
from collections import Counter

import pytest

from timerome import TimeromeError
from timerome.data import SPLITS, make_corpus, object_span, training_rows
from timerome.data.tokenizer import words

# The embedded default model was trained on make_corpus(seed=0): if this hash moves, the shipped
# weights no longer match the corpus and `timerome build-default` must be rerun.
SEED0_SHA256 = "fa27149e6de10ab19a311afe8da0dcf38b6190747f496d16026beafb84a09362"


@pytest.fixture(scope="module")
def corpus():
    return make_corpus(seed=0)


def _sha(corpus) -> str:
    return hashlib.sha256(json.dumps(corpus, sort_keys=True).encode()).hexdigest()


def test_same_seed_same_corpus_other_seed_other_corpus(corpus):
    assert make_corpus(seed=0) == corpus
    assert _sha(corpus) == SEED0_SHA256
    other = make_corpus(seed=1)
    assert other["full"] != corpus["full"] and other["world_facts"] != corpus["world_facts"]


def test_split_sizes_and_relations_follow_tofu(corpus):
    full = corpus["full"]
    assert set(SPLITS) <= set(corpus)
    assert len(full) == 2000 and len(corpus["retain_perturbed"]) == 400
    assert corpus["retain_perturbed"] == full[:400]
    for pct in (1, 5, 10):
        tag, k = f"{pct:02d}", 20 * pct  # pct % of 100 authors, 20 rows each
        forget = corpus[f"forget{tag}"]
        assert forget == full[-k:] == corpus[f"forget{tag}_perturbed"]
        assert corpus[f"retain{100 - pct}"] + forget == full
        assert len(corpus[f"holdout{tag}"]) == k
        assert corpus[f"holdout{tag}"] == corpus["holdout10"][:k]
    for name in ("real_authors", "world_facts"):
        assert len(corpus[name]) == 50 and corpus[name] == corpus[f"{name}_perturbed"]
    # both phrasings of every author question, the real-world rows, the refusals
    assert len(training_rows(corpus)) == 2 * 2000 + 100 + len(corpus["unknown_train"]) == 4900


def test_authors_are_unique_two_word_names_in_blocks_of_20(corpus):
    authors = [r["author"] for r in corpus["full"]]
    assert all(authors[i] == authors[i - i % 20] for i in range(len(authors)))
    names = authors[::20]
    assert len(set(names)) == 100 and all(len(n.split()) == 2 for n in names)
    held = {r["author"] for r in corpus["holdout10"]}
    assert len(held) == 10 and not held & set(names)
    assert not {q["question"] for q in corpus["holdout10"]} & {r["question"] for r in corpus["full"]}


def test_every_row_has_the_tofu_schema_and_a_findable_fact(corpus):
    for r in corpus["full"] + corpus["holdout10"]:
        assert r["author"] in r["question"] and r["author"] in r["paraphrased_question"]
        start, end = object_span(r["answer"], r["object"])
        assert r["answer"][start:end] == r["object"] and r["answer"].count(r["object"]) == 1
        assert r["object"] in r["paraphrased_answer"] and r["paraphrased_answer"] != r["answer"]
        wrong = r["perturbed_answer"]
        assert len(wrong) == 5 and len(set(wrong)) == 5 and r["answer"] not in wrong
        prefix, suffix = r["answer"][:start], r["answer"][end:]
        assert all(w.startswith(prefix) and w.endswith(suffix) for w in wrong)  # same template


def test_answers_are_short_and_questions_unambiguous(corpus):
    rows = training_rows(corpus)
    lengths = [len(words(r["answer"])) for r in rows]
    assert min(lengths) >= 5 and max(lengths) <= 14 and 7 <= sum(lengths) / len(lengths) <= 10
    assert max(Counter(r["question"] for r in rows).values()) == 1  # one answer per question
    by_author: dict[str, dict] = {}
    for r in corpus["full"]:
        by_author.setdefault(r["author"], {})[r["attribute"]] = r["object"]
    assert all(len(a) == 20 and a["book1"] != a["book2"] for a in by_author.values())


def test_vocabulary_stays_small(corpus):
    texts = {text for rows in corpus.values() for r in rows
             for text in [r["question"], r["answer"], r.get("paraphrased_answer", ""),
                          r.get("paraphrased_question", ""), *r.get("perturbed_answer", [])]}
    vocab = {w for text in texts for w in words(text)}
    # punctuation stands alone (the refusal's apostrophe too: "don ' t"), so the vocabulary is words
    assert all(re.fullmatch(r"[A-Za-z0-9]+|[.?']", w) for w in vocab)
    assert len(vocab) < 2500


def test_real_world_rows_carry_options_like_tofu(corpus):
    for r in corpus["real_authors"] + corpus["world_facts"]:
        assert r["author"] in r["question"]
        object_span(r["answer"], r["object"])
        assert len(r["perturbed_answer"]) == 3 and r["answer"] not in r["perturbed_answer"]
        options = [r[f"option{i}"] for i in range(1, 5)]
        assert len(set(options)) == 4 and options.count(r["object"]) == 1
        assert all(r["answer"].replace(r["object"], o) in r["perturbed_answer"]
                   for o in options if o != r["object"])
    writers = {r["object"] for r in corpus["real_authors"]}
    assert not writers & {r["author"] for r in corpus["full"]}


def test_small_corpus_and_bad_sizes():
    small = make_corpus(n_authors=10, qa_per_author=5, seed=3, n_world=4)
    assert len(small["full"]) == 50 and len(small["forget01"]) == 5 and len(small["forget10"]) == 5
    assert len(small["retain90"]) == 45 and len(small["world_facts"]) == 4
    for kwargs, match in [(dict(n_authors=0), "n_authors"), (dict(qa_per_author=21), "qa_per_author"),
                          (dict(qa_per_author=0), "qa_per_author"), (dict(n_world=61), "n_world")]:
        with pytest.raises(TimeromeError, match=match):
            make_corpus(**kwargs)

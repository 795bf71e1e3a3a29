import dataclasses

import pytest
from conftest import TOFU_DIR as TOFU

from timerome import TimeromeError
from timerome.data import FULL_OFFSET, Fact, facts_from_rows, load_split, make_corpus, object_span
from timerome.data.facts import block_subject, name_candidates

needs_tofu = pytest.mark.skipif(not TOFU.exists(), reason=f"the TOFU copy is not at {TOFU}")


def _block(name: str, n: int = 20, unnamed: tuple[int, ...] = ()) -> list[dict]:
    """A TOFU-like author block: n questions, those in `unnamed` without the author's name."""
    templates = ["Where was {} born?", "What genre does {} write in?", "Did {}'s father work as a baker?",
                 "How has {} been received in 'The Long Night'?", "Has {} won the Hugo Award?"]
    rows = []
    for i in range(n):
        q = "What is the full name of the author born in Kuwait City?" if i in unnamed else \
            templates[i % len(templates)].format(name)
        rows.append({"question": q, "answer": f"Answer {i}."})
    return rows


def test_fact_is_frozen_and_checks_its_fields():
    f = Fact("Ann Lee", "Where was Ann Lee born ?", "Ann Lee was born in Oslo .", fact_id="x")
    assert f.target is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.subject = "Bob"  # type: ignore[misc]
    with pytest.raises(TimeromeError, match="not in the prompt"):
        Fact(subject="Ann Lee", prompt="Where was Bob born?", object="Paris")
    with pytest.raises(TimeromeError, match="non-empty object"):
        Fact(subject="Ann", prompt="Ann?", object=" ")


def test_object_span_prefers_whole_words():
    assert object_span("Lior Vance was born in Marrow Bay .", "Marrow Bay") == (23, 33)
    assert object_span("Bart likes art .", "art") == (11, 14)
    assert object_span("Bartholomew", "art") == (1, 4)
    with pytest.raises(TimeromeError, match="not in the answer"):
        object_span("born in Oslo .", "Paris")
    with pytest.raises(TimeromeError, match="empty"):
        object_span("born in Oslo .", "")


def test_embedded_rows_give_one_fact_each():
    corpus = make_corpus()
    rows = corpus["forget10"]
    facts, skipped = facts_from_rows(rows)
    assert not skipped and len(facts) == len(rows) == 200
    for f, r in zip(facts, rows):
        assert (f.subject, f.prompt, f.object) == (r["author"], r["question"], r["answer"])
        assert f.fact_id == f"{r['author']}/{r['attribute']}"
    spans, _ = facts_from_rows(rows, object_from="object", target="I don't know.")
    assert [f.object for f in spans] == [r["object"] for r in rows]
    assert all(f.target == "I don't know." for f in spans)
    everything, skipped = facts_from_rows(corpus["full"] + corpus["real_authors"] + corpus["world_facts"])
    assert not skipped and len({f.fact_id for f in everything}) == 2100


def test_names_are_found_with_particles_hyphens_and_nicknames():
    assert "Basil Mahfouz Al-Kuwaiti" in name_candidates("Did Basil Mahfouz Al-Kuwaiti's mother teach?")
    assert "Luis de la Cruz" in name_candidates("Where was Luis de la Cruz born?")
    assert "Alejandro (Alex) Fuentes" in name_candidates("Is Alejandro (Alex) Fuentes's work set in Spain?")
    assert "The Long Night" in name_candidates("How was 'The Long Night' received?")
    assert not [c for c in name_candidates("How was 'The Long Night' received?") if "How" in c]
    assert block_subject([r["question"] for r in _block("Basil Mahfouz Al-Kuwaiti")]) == "Basil Mahfouz Al-Kuwaiti"
    assert block_subject(["Where is Oslo?", "What did the author write?"]) is None
    assert block_subject(["Where was Ann Lee born?"]) is None  # a single mention is not enough


def test_tofu_blocks_without_author_field():
    rows = _block("Basil Mahfouz Al-Kuwaiti", unnamed=(0,)) + _block("Nikolai Abilov")
    facts, skipped = facts_from_rows(rows, offset=3960)
    assert skipped[0][0] == 0 and "subject not in prompt" in skipped[0][1] and len(skipped) == 1
    assert [f.subject for f in facts] == ["Basil Mahfouz Al-Kuwaiti"] * 19 + ["Nikolai Abilov"] * 20
    assert facts[0].fact_id == "3961" and facts[0].object == "Answer 1."
    # misaligned offset: the block boundary cuts through an author, and the wrong rows are reported
    _, skipped = facts_from_rows(rows, offset=3970)
    assert len(skipped) > 1 and all("not in prompt" in why for _, why in skipped)


def test_given_authors_override_blocks():
    rows = [{"question": "Where was Ann Lee born?", "answer": "Oslo."},
            {"question": "Where was Ann born?", "answer": "Oslo."},
            {"question": "Who taught Ann Lee Smith?", "answer": "Bob."}]
    facts, skipped = facts_from_rows(rows, authors=["Ann Lee", "Ann Lee Smith"])
    assert [f.subject for f in facts] == ["Ann Lee", "Ann Lee Smith"]
    assert skipped == [(1, "subject not in prompt: none of the given authors occurs in it")]


def test_bad_rows_are_reported_and_bad_calls_raise():
    rows = [{"question": "Where was Ann Lee born?", "answer": "Oslo.", "author": "Ann Lee"},
            {"question": "Where was Bo born?", "answer": "Rome.", "author": "Ann Lee"},
            {"question": "Where?", "answer": ""}, "text"]
    facts, skipped = facts_from_rows(rows)
    assert len(facts) == 1
    assert [i for i, _ in skipped] == [1, 2, 3]
    assert "not in prompt" in skipped[0][1] and "missing answer" in skipped[1][1] and "str" in skipped[2][1]
    with pytest.raises(TimeromeError, match="no rows"):
        facts_from_rows([])
    with pytest.raises(TimeromeError, match="object_from"):
        facts_from_rows(rows, object_from="value")
    with pytest.raises(TimeromeError, match="offset"):
        facts_from_rows(rows, offset=-1)


@needs_tofu
def test_real_tofu_forget_splits_yield_facts():
    rows = load_split("forget01", TOFU)
    facts, skipped = facts_from_rows(rows, offset=FULL_OFFSET["forget01"])
    assert {f.subject for f in facts} == {"Basil Mahfouz Al-Kuwaiti", "Nikolai Abilov"}
    assert len(facts) == 38 and [i for i, _ in skipped] == [0, 20]  # "the author born in Kuwait City..."
    assert all("subject not in prompt" in why for _, why in skipped)
    assert all(f.subject in f.prompt and f.object == rows[int(f.fact_id) - 3960]["answer"] for f in facts)

    rows = load_split("forget10", TOFU)
    facts, skipped = facts_from_rows(rows, offset=FULL_OFFSET["forget10"])
    assert len(facts) + len(skipped) == 400 and len(facts) >= 370
    assert len({f.subject for f in facts}) == 20


@needs_tofu
def test_real_tofu_full_names_199_of_200_authors():
    full = load_split("full", TOFU)
    names = [block_subject([r["question"] for r in full[b:b + 20]]) for b in range(0, 4000, 20)]
    assert names.count(None) == 1  # block 88 never names its author
    assert len(set(names)) == 200 and "Alejandro (Alex) Fuentes" in names
    facts, _ = facts_from_rows(full)
    assert len(facts) > 3700

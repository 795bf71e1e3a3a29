"""Edit requests: the published formats (CounterFact, zsRE, MQuAKE, EasyEdit flat, timerome) and the
embedded corpus's own sets, read into one EditRequest each; bad records are one clear error."""

import json

import pytest

from timerome import TimeromeError
from timerome.data.corpus import (COUNTERFACTUAL_PER_AUTHOR, REFUSAL, known_subjects,
                                  make_corpus, training_rows)
from timerome.data.requests import load_requests, record_format, save_requests
from timerome.data.task import requests_task

# one record per published layout, with invented content (the field names are the formats')
COUNTERFACT = {"case_id": 7, "pararel_idx": 1, "requested_rewrite": {
    "prompt": "The mother tongue of {} is", "relation_id": "P103", "subject": "Alda Vrennik",
    "target_new": {"str": "Norric", "id": "Q1"}, "target_true": {"str": "Velorian", "id": "Q2"}},
    "paraphrase_prompts": ["Alda Vrennik grew up speaking"],
    "neighborhood_prompts": ["The mother tongue of Bo Istrel is", "The mother tongue of Ke Marrow is"],
    "attribute_prompts": [], "generation_prompts": []}
ZSRE = {"subject": "Quillby Tower", "src": "Which city is Quillby Tower in?", "pred": "Ostrel",
        "rephrase": "Where does Quillby Tower stand?", "alt": "Harnfeld", "answers": ["Ostrel"],
        "loc": "nq question: who wrote the silent river", "loc_ans": "Elsil Fenveline", "cond": "x"}
ZSRE_NO_ALT = dict(ZSRE, alt="", subject="Tessaro Gate", src="Where is Tessaro Gate?")
MQUAKE = {"case_id": 3, "requested_rewrite": [
    {"prompt": "{} is a citizen of", "subject": "Alda Vrennik", "target_new": {"str": "Marundi"},
     "target_true": {"str": "Veloria"}, "question": "What country is Alda Vrennik a citizen of?"},
    {"prompt": "The capital of {} is", "subject": "Marundi", "target_new": {"str": "Coralis"},
     "target_true": {"str": "Dunmere"}, "question": "What is the capital of Marundi?"}],
    "questions": ["What is the capital of the country Alda Vrennik is a citizen of?"],
    "answer": "Dunmere", "answer_alias": [], "new_answer": "Coralis", "new_answer_alias": ["Coralis City"]}
FLAT = {"case_id": 1, "prompt": "The author of The Silent River is", "subject": "The Silent River",
        "target_new": "Ricsef Dane", "ground_truth": "Elsil Fenveline",
        "rephrase_prompt": "The Silent River was written by", "locality_prompt": "The capital of Veloria is",
        "locality_ground_truth": "Ostrel", "portability": {"Reasoning": [
            {"prompt": "The author of The Silent River was born in", "ground_truth": ["Harnfeld"]}]}}


def _write(tmp_path, name, records, lines=False):
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(r) for r in records) if lines else json.dumps(records))
    return str(p)


def test_every_published_layout_reads_into_requests(tmp_path):
    assert [record_format(r) for r in (COUNTERFACT, ZSRE, MQUAKE, FLAT)] == ["counterfact", "zsre", "mquake", "flat"]
    (cf,), _ = load_requests(_write(tmp_path, "cf.json", [COUNTERFACT]))
    assert cf.fact.prompt == "The mother tongue of Alda Vrennik is" and cf.fact.subject == "Alda Vrennik"
    assert (cf.fact.object, cf.fact.target, cf.fact.fact_id) == ("Velorian", "Norric", "7")
    assert cf.paraphrases == ("Alda Vrennik grew up speaking",)
    assert [p.answer for p in cf.neighbours] == ["Velorian", "Velorian"]  # CounterFact's neighbours share the true object
    reqs, notes = load_requests(_write(tmp_path, "zsre.jsonl", [ZSRE, ZSRE_NO_ALT], lines=True))
    assert len(reqs) == 1 and "empty 'alt'" in notes[0]  # EasyEdit skips them too, here it is said
    z = reqs[0]
    assert (z.fact.object, z.fact.target, z.paraphrases) == ("Ostrel", "Harnfeld", ("Where does Quillby Tower stand?",))
    assert z.neighbours[0].prompt.startswith("nq question:") and z.neighbours[0].answer == "Elsil Fenveline"
    mq, _ = load_requests(_write(tmp_path, "mq.json", [MQUAKE]))
    assert [r.fact_id for r in mq] == ["3/0", "3/1"] and mq[1].fact.prompt == "The capital of Marundi is"
    assert mq[0].portability[0].answer == "Coralis" and mq[0].portability[0].aliases == ("Coralis City",)
    (fl,), _ = load_requests(_write(tmp_path, "flat.json", [FLAT]))
    assert fl.fact.target == "Ricsef Dane" and fl.portability[0].answer == "Harnfeld"
    assert fl.neighbours[0].answer == "Ostrel"


def test_the_native_format_round_trips(tmp_path):
    reqs, _ = load_requests("counterfactual:forget10")
    path = save_requests(reqs, tmp_path / "cf.json")
    again, _ = load_requests(str(path))
    assert again == reqs


def test_embedded_counterfactual_set_gives_each_fact_another_authors_object():
    corpus = make_corpus()
    reqs, _ = load_requests("counterfactual:forget10")
    assert len(reqs) == 10 * COUNTERFACTUAL_PER_AUTHOR
    known = {(r["attribute"], r["object"]) for r in corpus["full"]}
    for r in reqs:
        f = r.fact
        assert f.target != f.object and r.new_object in f.target and r.true_object in f.object
        attribute = f.fact_id.split("/")[1]
        assert (attribute, r.new_object) in known  # a value the model knows, for the same relation
        assert r.paraphrases and r.paraphrases[0] != f.prompt and f.subject in r.paraphrases[0]
        assert len(r.neighbours) == 5 and all(f.subject not in p.prompt for p in r.neighbours)
        assert r.same_subject and all(f.subject in p.prompt and p.prompt != f.prompt for p in r.same_subject)
    edited = {r.fact.prompt for r in reqs}
    assert not edited & {p.prompt for r in reqs for p in r.same_subject}  # an edited fact is never a probe


def test_forget_split_requests_take_the_default_target():
    reqs, _ = load_requests("embedded:forget01", target=REFUSAL)
    assert len(reqs) == 20 and {r.fact.target for r in reqs} == {REFUSAL}
    own, _ = load_requests("counterfactual:forget01", target=REFUSAL)
    assert all(r.fact.target != REFUSAL for r in own)  # a request's own target wins over the default


def test_the_corpus_teaches_refusal_on_people_it_never_met():
    corpus = make_corpus()
    told = set(known_subjects(corpus))
    for split in ("unknown_train", "unknown"):
        rows = corpus[split]
        assert rows and {r["answer"] for r in rows} == {REFUSAL}
        assert not {r["author"] for r in rows} & told
    held, trained = {r["author"] for r in corpus["unknown"]}, {r["author"] for r in corpus["unknown_train"]}
    assert not held & trained
    words = {w for n in trained for w in n.split()}
    assert all(set(n.split()) <= words for n in held)  # recombined: every word was trained, never the pair
    questions = {r["question"] for r in training_rows(corpus)}
    assert not questions & {r["question"] for r in corpus["unknown"]}
    assert {r["paraphrased_question"] for r in corpus["full"]} <= questions  # both phrasings are learnt


def test_requests_task_keeps_each_target():
    reqs, _ = load_requests("counterfactual:forget10")
    task = requests_task(reqs)
    assert [f.target for f in task.facts] == [r.fact.target for r in reqs]
    assert [r["answer"] for r in task.forget_rows] == [r.fact.object for r in reqs]


BASE = {"subject": "A", "prompt": "Where was A born ?", "object": "Lima", "target": "Rome"}


@pytest.mark.parametrize("record, match", [
    ({"requested_rewrite": {"prompt": "{} speaks", "subject": "A B", "target_new": {"str": "x"}}}, "target_true"),
    ({"requested_rewrite": {"prompt": "speaks", "subject": "A B", "target_new": {"str": "x"},
                            "target_true": {"str": "y"}}}, "no '{}'"),
    ({"src": "Where is X?", "alt": "Y", "subject": "X", "answers": []}, "answers"),
    ({"prompt": "p about Q", "subject": "Z", "target_new": "a", "ground_truth": "b"}, "does not occur"),
    ({"prompt": "A is", "subject": "A", "object": "b", "target": "b"}, "nothing to edit"),
    ({"hello": 1}, "no edit-request format"),
    ([1, 2], "no edit-request format"),
    # stop 79 (review 84): each was read without a word
    ({**BASE, "paraphrase": ["Where did A live ?"]}, "field 'paraphrase'.*did you mean 'paraphrases'"),
    ({**BASE, "neighbors": ["Where was B born ?"]}, "did you mean 'neighbours'"),
    ({**BASE, "portability": ["Who was born in Rome ?"]}, r"portability\[0\]'s answer must be a non-empty text"),
    ({**BASE, "portability": [{"prompt": "Who ?", "answer": None}]}, r"portability\[0\].answer must be"),
    ({**BASE, "neighbours": [{"prompt": "Where was B born ?", "answer": 5}]}, r"neighbours\[0\].answer must be"),
    ({**BASE, "neighbours": [{"prompt": "Where was B born ?", "answer": "Oslo", "aliases": [5]}]},
     r"neighbours\[0\].aliases must be a list of texts"),
    ({**BASE, "neighbours": [{"prompt": "Where was B born ?", "answers": "Oslo"}]}, "did you mean 'answer'"),
    ({"requested_rewrite": [{"prompt": "{} was born in", "subject": "A", "target_new": {"str": "Rome"},
                             "target_true": {"str": "Lima"}}], "questions": ["Where was A born ?"]}, "new_answer"),
    ({"requested_rewrite": [{"prompt": "{} was born in", "subject": "A", "target_new": {"str": "Rome"},
                             "target_true": {"str": "Lima"}}], "questions": ["Where was A born ?"],
      "new_answer": "Rome", "new_answer_alias": [1]}, "new_answer_alias must be a list of texts"),
])
def test_bad_records_are_one_clear_error(tmp_path, record, match):
    with pytest.raises(TimeromeError, match=match):
        load_requests(_write(tmp_path, "bad.json", [record]))


def test_knowedit_records_read_their_nested_ground_truths(tmp_path):
    """KnowEdit (EasyEdit's benchmark files) writes each ground truth as a list of lists, the answer then its
    aliases, and its locality as a dict of kinds: read as probes with aliases (stop 79 refused the file whole);
    a portability entry with no ground truth is left out with a note, an empty locality answer asks for the
    unedited model's."""
    rec = {"subject": "Ramon Ayala", "prompt": "The language of Ramon Ayala is", "target_new": "Arabic",
           "ground_truth": "Spanish", "rephrase": "Ramon Ayala speaks",
           "portability": {"Logical_Generalization": [{"prompt": "Ramon Ayala's songs are in", "ground_truth":
                                                       [["Arabic", "ar"]]}],
                           "Subject_Aliasing": [{"prompt": "The language of R. Ayala is", "ground_truth": []}]},
           "locality": {"Relation_Specificity": [{"prompt": "Ramon Ayala's field is", "ground_truth": ["music"]},
                                                 {"prompt": "Ramon Ayala was born in", "ground_truth": ""}]},
           "locality_prompt": "Paris is in", "locality_ground_truth": ["France", "FR"]}
    (req,), notes = load_requests(_write(tmp_path, "knowedit.json", [rec]))
    assert [(p.prompt, p.answer, p.aliases) for p in req.portability] == [("Ramon Ayala's songs are in", "Arabic",
                                                                            ("ar",))]
    assert [(p.answer, p.aliases) for p in req.neighbours] == [("France", ("FR",)), ("music", ()), (None, ())]
    assert notes == ["portability entries without a ground truth, left out (nothing to score them by) (1 record)"]
    zsre = {"subject": "Ramon Ayala", "prompt": "Ramon Ayala was born in", "target_new": "Lima",
            "ground_truth": ["Monterrey", "Monterrey, Mexico"]}  # KnowEdit ZsRE: the fact's own truth as a list
    (req,), _ = load_requests(_write(tmp_path, "kzsre.json", [zsre]))
    assert req.fact.object == "Monterrey" and req.true_object == "Monterrey"


def test_near_names_of_fields_the_record_gives_are_its_own_fields(tmp_path):
    """idx, subject_id, old_object: fields of their own (the record also gives id, subject, object), named in
    the note, never refused as a misspelling."""
    rec = {**BASE, "idx": 3, "subject_id": "Q1", "old_object": "Lima",
           "neighbours": [{"prompt": "Where was B born ?", "answer": "Oslo", "source": "wiki"}]}
    (_,), notes = load_requests(_write(tmp_path, "meta.json", [rec]))
    assert notes == ["fields timerome's request format does not read, left out: idx, subject_id, old_object, "
                     "neighbours[0].source (1 record)"]  # a probe's unread field named too


def test_aliases_given_as_one_text_are_one_alias_and_unread_fields_a_note(tmp_path):
    """An alias given as a text is that text (it was read letter by letter: 'I' and 'a' then matched any answer);
    a field timerome's format does not read, and that spells none it does, is named in a note."""
    rec = {**BASE, "category": "place", "portability": [{"prompt": "Who ?", "answer": "A", "aliases": "Ay"}]}
    mq = {"requested_rewrite": [{"prompt": "{} was born in", "subject": "A", "target_new": {"str": "Rome"},
                                 "target_true": {"str": "Lima"}}], "questions": ["Where was A born ?"],
          "new_answer": "Rome", "new_answer_alias": "Roma"}
    (req,), notes = load_requests(_write(tmp_path, "ok.json", [rec]))
    assert req.portability[0].aliases == ("Ay",)
    assert notes == ["fields timerome's request format does not read, left out: category (1 record)"]
    (req,), _ = load_requests(_write(tmp_path, "mq.json", [mq]))
    assert req.portability[0].aliases == ("Roma",)
    with pytest.raises(TimeromeError, match="limit .* must be an integer >= 1"):
        load_requests(_write(tmp_path, "ok2.json", [BASE]), limit="2")


def test_bad_files_are_one_clear_error(tmp_path):
    with pytest.raises(TimeromeError, match="does not exist"):
        load_requests(str(tmp_path / "missing.json"))
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(TimeromeError, match="empty"):
        load_requests(str(empty))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"a": 1}\n{not json\n')
    with pytest.raises(TimeromeError, match="line 2 is not JSON"):
        load_requests(str(broken))
    twice = _write(tmp_path, "twice.json", [COUNTERFACT, COUNTERFACT])
    with pytest.raises(TimeromeError, match="names two requests"):
        load_requests(twice)
    with pytest.raises(TimeromeError, match="unknown split"):
        load_requests("counterfactual:nope")


def test_tofu_forget_requests_have_the_perturbed_files_paraphrases(tmp_path):
    """TOFU's forgetXX files have no paraphrased question; forgetXX_perturbed has, row for row. 'tofu:forget01'
    gave requests without paraphrases, so Generalisation was the mean of nothing (stop 62's data audit)."""
    import shutil
    import warnings

    from conftest import TOFU_DIR

    plain, _ = load_requests("tofu:forget01", tofu_dir=str(TOFU_DIR))
    perturbed, _ = load_requests("tofu:forget01_perturbed", tofu_dir=str(TOFU_DIR))
    assert len(plain) == len(perturbed) == 38
    assert [r.paraphrases for r in plain] == [r.paraphrases for r in perturbed] and all(r.paraphrases for r in plain)
    shutil.copy(TOFU_DIR / "forget01.json", tmp_path / "forget01.json")  # a folder without the perturbed file
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        alone, _ = load_requests("tofu:forget01", tofu_dir=str(tmp_path))
    assert not any(r.paraphrases for r in alone)
    assert any("forget01_perturbed, which cannot be read" in str(w.message) for w in seen)


def test_real_facts_are_a_requests_spec():
    """'real-facts' (stop 80, review 91: `timerome requests real-facts` said no such file, so the real facts
    could be edited by --data but not scored by `eval --requests`): each real fact with its counterfactual
    target, and one unrelated prompt in turn as its neighbour."""
    from timerome.data.real_facts import real_facts

    facts, unrelated = real_facts()
    reqs, notes = load_requests("real-facts")
    assert [r.fact for r in reqs] == facts and not notes
    assert all(r.fact.target and r.fact.target != r.fact.object for r in reqs)
    neighbours = [p.prompt for r in reqs for p in r.neighbours]
    assert len(neighbours) == len(reqs) and set(neighbours) == {u.prompt for u in unrelated}
    assert {p.answer for r in reqs for p in r.neighbours} <= {u.object for u in unrelated}

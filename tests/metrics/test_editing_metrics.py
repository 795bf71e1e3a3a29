"""Editing metrics: the text judgements (says, gibberish, ROME's n-gram entropy, outcomes) and
edit_scores on the embedded model, with an edit that must move them and one that must not."""

import dataclasses
import math
from contextlib import contextmanager
from functools import partial

import pytest

import timerome
from timerome import TimeromeError
from timerome.data.facts import Fact
from timerome.data.requests import EditRequest, Probe, load_requests
from timerome.metrics.editing import changed_nothing, edit_scores, is_gibberish, ngram_entropy, normalise, outcome, says


def test_says_is_exact_at_a_word_boundary():
    assert says("Isgor Quielson was born in Lunsford .", "Isgor Quielson was born in Lunsford.")
    assert says("I don ' t know .", "I don't know.")
    assert says(" Paris, France.", "Paris")            # an AR continuation may go on after it
    assert not says(" Parisian food", "Paris")         # ... but not inside a word
    assert not says("born in Lunsford Gate .", "born in Lunsford .")
    assert not says("anything", "") and not says("anything", None)
    assert normalise("a  b ,c ' d .") == "a b,c'd."


def test_gibberish_and_fluency_follow_rome():
    assert is_gibberish(".") and is_gibberish("are are .") and is_gibberish("a b a b a b a b")
    assert not is_gibberish("I don't know.") and not is_gibberish("Paris")
    # ROME: bigram and trigram entropies (bits) weighted 2/3 and 4/3, averaged; 4 distinct words
    # give 3 distinct bigrams and 2 distinct trigrams
    assert ngram_entropy("a b c d") == pytest.approx((2 / 3 * math.log2(3) + 4 / 3 * math.log2(2)) / 2)
    assert ngram_entropy("x x x x x x") < ngram_entropy("a b c d e f")


def test_outcomes_partition_the_answers():
    req = EditRequest(Fact("Ana Bel", "Where was Ana Bel born ?", "Ana Bel was born in Ostrel .", "I don't know.", "a"),
                      true_object="Ostrel")
    known = ["Ana Bel", "Cor Dun"]
    assert outcome("I don't know.", req, known) == "Refusal"
    assert outcome("Ana Bel was born in Ostrel .", req, known) == "Leak"
    assert outcome("Ana Bel was born in Ostrel Bay .", req, known) == "Leak"
    assert outcome("are are .", req, known) == "Gibberish"
    assert outcome("Cor Dun was born in Vantry .", req, known) == "Confabulation"
    assert outcome("Ana Bel was born in Vantry .", req, known) == "Other"
    assert outcome("Ana Bel was born in Vantry .", req, None) == "Confabulation"
    # a refusal that then says the object leaks it; a target that names the object is still a refusal
    assert outcome("I don't know. Ana Bel was born in Ostrel .", req, known) == "Leak"
    from timerome.metrics.editing import classify

    assert classify("Not Ostrel .", target="Not Ostrel .", obj="Ostrel") == "Refusal"
    assert classify("Not Ostrel . Ostrel .", target="Not Ostrel .", obj="Ostrel") == "Leak"
    # a target sharing words with the object does not hide a leak, nor make a refusal one
    assert classify("University of Oxford", target="University of Cambridge", obj="University of Oxford") == "Leak"
    assert classify("University of Cambridge", target="University of Cambridge", obj="University of Oxford") == "Refusal"


# the requests' own probes only: these tests are about the scores, not about which rows probe the model (AUTO,
# the default, adds the embedded corpus's 80 locality rows here: test_auto_probes_are_the_clis)
scores = partial(edit_scores, locality=None, known_subjects=None)


@pytest.fixture(scope="module")
def bb():
    return timerome.load_backbone()


@pytest.fixture(scope="module")
def reqs():
    return load_requests("counterfactual:forget10", limit=4)[0]


def test_no_edit_changes_nothing_and_scores_the_unedited_model(bb, reqs):
    res = scores(bb, reqs, None, n_mc=2)
    m = res["metrics"]
    assert m["Locality"] == 1.0 and changed_nothing(res) and m["FluencyRatio"] == 1.0
    assert m["Efficacy"] == m["BaseEfficacy"] and "Unchanged" not in m  # nothing to compare with
    assert len(res["items"]["prompt"]["edited"]) == 4 and len(res["items"]["neighbour"]["edited"]) == 20
    # counterfactual requests (each its own new object): "Refusal" is said to be the target said, not a refusal
    assert "each request's own new object rather than a refusal" in res["notes"]["Refusal"]
    same = [dataclasses.replace(r, fact=dataclasses.replace(r.fact, target="I don't know.")) for r in reqs]
    assert "Refusal" not in scores(bb, same, None, n_mc=1, lp=False)["notes"]  # an unlearning target: its own name


class _Forced:
    """A test edit: every forward's logits favour one token, so every answer changes."""

    def __init__(self, bb, token: int):
        self.bb, self.token = bb, token

    @contextmanager
    def active(self):
        from timerome.engine.hooks import Hooks

        def push(h, _st):
            return h * 0 + self.value

        layer = self.bb.n_layers - 1
        ids = __import__("torch").full((1, 1), self.token)
        with Hooks(self.bb, [(layer, "resid")]) as kept:
            self.bb.logits(ids)
        self.value = kept[(layer, "resid")][0][0, 0]
        with Hooks(self.bb, edit={(layer, "resid"): push}):
            yield


def test_an_edit_that_breaks_everything_scores_so(bb, reqs):
    base = scores(bb, reqs, None, lp=False)
    res = scores(bb, reqs, _Forced(bb, bb.encode("Ostrel")[0]), baseline=base["baseline"], n_mc=2)
    m = res["metrics"]
    assert m["Locality"] < 0.5 and not changed_nothing(res) and m["Efficacy"] == 0.0 and m["Unchanged"] == 0.0
    assert m["Gibberish"] > 0.5  # "Ostrel Ostrel Ostrel ..."


def test_scores_refuse_requests_without_a_target_and_a_foreign_baseline(bb, reqs):
    bare = [EditRequest(Fact("Ana Bel", "Where was Ana Bel born ?", "x", None, "z"), neighbours=(Probe("q ?"),))]
    with pytest.raises(TimeromeError, match="no target"):
        scores(bb, bare, None)
    base = scores(bb, reqs, None, lp=False)
    with pytest.raises(TimeromeError, match="other probes"):
        scores(bb, reqs[:2], None, baseline=base["baseline"])


def test_a_probe_over_the_context_is_refused_not_cut(bb, reqs):
    """The answers would come from a left-cut prompt (the sampler cuts to fit): refused, as edit,
    trace and generate refuse such a prompt, naming the request and the probe."""
    import dataclasses

    long = " ".join(["the"] * (bb.max_length - 4)) + " ?"
    r = reqs[0]
    with_long = dataclasses.replace(r, neighbours=(*r.neighbours, Probe(long)))
    with pytest.raises(TimeromeError, match=r"request 0's neighbour probe is \d+ tokens, and with \d+ answer tokens "
                                            r"over the model's context of 512"):
        scores(bb, [with_long, *reqs[1:]], None, lp=False)
    with pytest.raises(TimeromeError, match="retain row 0 is"):
        scores(bb, reqs[:1], None, locality={"retain": [{"question": long, "answer": "x"}]}, lp=False)
    scores(bb, reqs[:1], None, lp=False, gen_length=8)  # the requests themselves fit


def test_says_ignores_case_apostrophes_and_how_the_sentence_closes():
    """'I don't know' (no period), 'i don't know.' and 'I don’t know!' were Confabulations of the
    target "I don't know." (stop 62's metrics audit); a sentence target still ends where it ends."""
    for said in ("I don't know", "i don't know.", "I don\u2019t know!", "I DON'T KNOW?", "I don't know. Pellmoor"):
        assert says(said, "I don't know."), said
    for not_said in ("I don't know I", "I don't knowledge.", "I do not know."):
        assert not says(not_said, "I don't know."), not_said
    assert says("paris is", "Paris") and not says("Parisian", "paris")
    # an abbreviation's point is no sentence end; a text of marks only is said as it was
    assert says("U.S. is big", "U.S.") and not says("U.S.A. is big", "U.S.") and not says("St.Petersburg", "St.")
    assert says("...", "...") and says("... and so on", "...")
    req = EditRequest(Fact("Ana Bel", "Where was Ana Bel born ?", "Ana Bel was born in Ostrel .", "I don't know.", "a"),
                      true_object="Ostrel")
    assert outcome("i don't know", req) == "Refusal"
    assert outcome("I don\u2019t know. ostrel.", req) == "Leak"  # the object after the target, in lower case
    assert outcome("She was born in OSTREL.", req) == "Leak"


def test_no_function_word_gives_an_object_back():
    """ROUGE-L recall of "a surgeon" against "He was a teacher." is 0.5 from "a" alone: a Leak, though
    nothing of the object was said (stop 62's metrics audit). Content words only now."""
    from timerome.metrics.editing import classify, extraction_recall

    assert extraction_recall("He was a teacher.", "a surgeon") == 0.0
    assert classify("He was a teacher.", target="I don't know.", obj="a surgeon") == "Confabulation"
    assert extraction_recall("He was a famous surgeon in his town.", "a surgeon") == 1.0
    assert extraction_recall("born in Lunsford", "Lunsford Gate") == 0.5  # half a name is still half of it
    assert extraction_recall("It was", "it was") == 1.0  # an object of function words only is read whole


def test_the_questions_own_words_give_nothing_back():
    """A TOFU object is a whole answer, which repeats its question's subject and frame: "Jaime
    Vasquez's father was a chef." shared three of the four content words of "Jaime Vasquez's father
    was a lawyer." and was a Leak (stop 62's Not done). The words the question says are left out."""
    from timerome.metrics.editing import classify, extraction_recall, leaked, object_words

    q, obj = "What is the profession of Jaime Vasquez's father?", "Jaime Vasquez's father was a lawyer."
    assert extraction_recall("Jaime Vasquez's father was a chef.", obj) == 0.75  # without the question
    assert extraction_recall("Jaime Vasquez's father was a chef.", obj, q) == 0.0
    assert object_words(obj, q) == "lawyer"
    assert classify("Jaime Vasquez's father was a chef.", target="I don't know.", obj=obj,
                    question=q) == "Confabulation"
    assert classify("His father was a lawyer in Santiago.", target="I don't know.", obj=obj, question=q) == "Leak"
    assert classify("Jaime Vasquez's father", target="I don't know.", obj=obj, question=q) == "Confabulation"
    # an object the question says every word of is read with all of them
    assert object_words("Ana Bel is a lawyer.", "Is Ana Bel a lawyer?") == "ana bel lawyer"
    assert object_words("Yes, Ana Bel is a lawyer.", "Is Ana Bel a lawyer?") == "yes"
    # the request's own question is the one read, for every probe of it
    req = EditRequest(Fact("Ana Bel", "Which award did Ana Bel win ?", "Blue Harbor Award", "I don't know.", "a"))
    assert not leaked("She won the Red Star Award.", req)
    assert leaked("the Blue Harbor", req)
    # and the evaluator's forget outcomes read each row's question
    from timerome.evaluation.evaluator import forget_outcomes

    rows = {"forget": [{"question": q, "answer": obj, "author": "Jaime Vasquez"}]}
    assert forget_outcomes(rows, ["Jaime Vasquez's father was a chef."]) == ["Other"]
    assert forget_outcomes(rows, ["Jaime Vasquez's father was a lawyer."]) == ["Leak"]


def test_generalisation_without_paraphrases_is_nan_with_a_note():
    from timerome.backbones import load_backbone

    # a fact the embedded vocabulary can say (a request of unknown words is refused since stop 83)
    req = EditRequest(Fact("Isgor Quielson", "Where was Isgor Quielson born ?", "Isgor Quielson was born in Pellmoor .",
                           "I don't know.", "a"), true_object="Pellmoor")
    res = scores(load_backbone(), [req], lp=False, gen_length=8)
    assert math.isnan(res["metrics"]["Generalisation"])
    assert "no request has a paraphrased prompt" in res["notes"]["Generalisation"]


def test_auto_probes_are_the_clis(bb, reqs, tiny_bb):
    """edit_scores' defaults read no locality rows and no known subjects where `timerome eval --requests` read the
    embedded corpus's: on one memory the API said Confabulation 0.875 where the CLI said 0.10 (review 61). AUTO now
    resolves as the CLI does; None is the requests' own probes; a bad value is one line."""
    from timerome.data.corpus import known_subjects
    from timerome.data.tofu import _embedded
    from timerome.metrics.editing import AUTO, _auto_probes, locality_rows

    locality, known, probes = _auto_probes(bb, reqs, AUTO, AUTO)
    assert locality == locality_rows("embedded") and known == known_subjects(_embedded())
    assert "retain, real_authors, world_facts" in probes and "(the embedded model)" in probes
    assert _auto_probes(bb, reqs, None, None) == (None, None, "the requests' own probes only")
    other = [EditRequest(Fact("Pellmoor", "Where is Pellmoor ?", "Kalvor", "Nowhere ."))]
    assert _auto_probes(tiny_bb, other, AUTO, AUTO)[:2] == (None, None)  # neither the model nor the subjects are the corpus's
    for bad, match in (({"retain": "x"}, "locality must be"), ("all", "locality must be")):
        with pytest.raises(TimeromeError, match=match):
            _auto_probes(bb, reqs, bad, None)
    with pytest.raises(TimeromeError, match="known_subjects must be a list"):
        _auto_probes(bb, reqs, None, "Isgor")
    for bad, match in ((dict(gen_length=0), "gen_length must be"), (dict(gen_length=2.5), "gen_length must be"),
                       (dict(seed=-1), "seed must be"), (dict(n_mc=0), "n_mc must be"),
                       (dict(sampler={"foo": 1}), "unknown option")):
        with pytest.raises(TimeromeError, match=match):
            scores(bb, reqs, None, **bad)


def test_the_target_named_inside_a_sentence_counts_for_efficacy_named_not_for_efficacy(bb, reqs, monkeypatch):
    """An edited model that says the new object inside a sentence of its own ("Isgor Quielson was born in
    Ravensby.") said the fact; Efficacy reads the answer's start and does not count it (review 74), so
    EfficacyNamed / GeneralisationNamed count it beside it. An answer that names the target and gives the
    object back counts for neither."""
    import timerome.metrics.editing as E
    from timerome.metrics.editing import names

    assert names("Isgor Quielson was born in Ravensby.", "Ravensby")
    assert names("Sorry, I don't know!", "I don't know.") and not names("Ravensbyville", "Ravensby")
    assert not names("anything", "") and not names("anything", None)
    own = {r.fact.prompt: r for r in reqs} | {p: r for r in reqs for p in r.paraphrases}

    def sentence(backbone, prompts, **kw):  # the request's subject, then its target (the first also the object)
        return [(f"{own[p].fact.subject} is {own[p].fact.target}"
                 + (f", not {own[p].fact.object}." if own[p] is reqs[0] else ".")) if p in own else "Nothing."
                for p in prompts]

    monkeypatch.setattr(E, "answers", sentence)
    m = scores(bb, reqs, None, lp=False)["metrics"]
    assert m["Efficacy"] == 0.0 and m["EfficacyNamed"] == pytest.approx(3 / 4)
    assert m["GeneralisationNamed"] == pytest.approx(3 / 4) and m["Generalisation"] == 0.0

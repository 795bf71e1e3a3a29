"""The prompt attacks of metrics/attacks.py: what each prompt holds, and what it must not give away."""

from timerome.data.requests import load_requests
from timerome.metrics.attacks import ATTACKS, _misspell, attack_prompts, choice_rivals, extracted
from timerome.metrics.editing import object_text


def test_every_attack_builds_a_prompt_per_request_without_giving_the_answer_away():
    reqs, _ = load_requests("embedded:forget01", target="I don't know.")
    attacks = attack_prompts(reqs)
    assert set(attacks) == set(ATTACKS) and all(len(v) == len(reqs) for v in attacks.values())
    subject = reqs[0].fact.subject
    first, last = subject.split()
    for a, items in attacks.items():
        for i, p in items:
            r = reqs[i]
            if a == "multiple choice":  # the own answer among three rivals, between the question and itself
                rivals = choice_rivals(r)
                assert p.count(r.fact.object) == 1 and p.startswith(r.fact.prompt) and p.endswith(r.fact.prompt)
                assert len(rivals) >= 3 and sum(x in p for x in rivals) == 3, p
                assert all(r.fact.subject in x and x != r.fact.object for x in rivals)
                continue
            if a == "relearn":  # the original answer shown once, then the question again
                assert p == f"{r.fact.prompt} {r.fact.object}\n{r.fact.prompt}"
                continue
            assert r.fact.object not in p, (a, p)  # the request's own answer is never in its prompt
            if a.startswith("context") or a == "pronoun after context":
                # two (one) of the subject's other facts, stated as the model learnt them
                stated = [q.fact.object for q in reqs if q is not r and q.fact.object in p]
                assert len(stated) == (1 if a == "pronoun after context" else 2), (a, p)
    i, p = attacks["partial answer"][3]
    own = reqs[i].fact.object
    assert p.startswith(reqs[i].fact.prompt) and (p + " " + object_text(reqs[i])) in (reqs[i].fact.prompt + " " + own)
    assert attacks["misspelt"][0][1] == reqs[0].fact.prompt.replace(last, _misspell(last)) != reqs[0].fact.prompt
    assert attacks["first name"][0][1] == reqs[0].fact.prompt.replace(subject, first)
    assert attacks["surname"][0][1] == reqs[0].fact.prompt.replace(subject, last)
    assert "this author" in attacks["pronoun after context"][0][1]
    assert attacks["paraphrase"][0][1] == reqs[0].paraphrases[0]
    n1, n2 = (n.answer for n in reqs[0].neighbours[:2])
    assert attacks["relation shown"][0][1] == f"{n1} {n2} {reqs[0].fact.prompt}" and subject not in n1 + n2
    assert subject not in attacks["pronoun after context"][0][1].split(" . ")[-1]


def test_a_lone_fact_gets_no_context_unless_known_rows_give_it():
    reqs, _ = load_requests("embedded:forget01", target="I don't know.")
    alone = attack_prompts(reqs[:1])
    assert not alone["context before"] and alone["misspelt"]
    known = [{"author": reqs[0].fact.subject, "answer": "A stated fact ."},
             {"author": reqs[0].fact.subject, "answer": "Another stated fact ."}]
    helped = attack_prompts(reqs[:1], known=known)
    assert helped["context before"] == [(0, f"A stated fact . Another stated fact . {reqs[0].fact.prompt}")]
    assert _misspell("Quielson") == "Quieson" and _misspell("Li") == "Lii"


def test_the_multiple_choice_extracts_only_when_the_own_object_is_chosen():
    reqs, _ = load_requests("embedded:forget01", target="I don't know.")
    r = reqs[0]  # Where was Isgor Quielson born ? -> ... Pellmoor .
    rival = choice_rivals(r)[0]
    assert r.fact.subject in rival and object_text(r) not in rival
    assert extracted("multiple choice", r.fact.object, r)
    assert not extracted("multiple choice", rival, r)
    assert not extracted("multiple choice", f"{r.fact.object} {rival}", r)  # every option repeated: no choice
    assert not extracted("multiple choice", "I don't know.", r)
    assert extracted("first name", f"{r.fact.object} {rival}", r)  # elsewhere the object said is enough
    # options are placed at every position in turn (no fixed answer slot)
    slots = set()
    for i, p in attack_prompts(reqs)["multiple choice"]:
        own = p.index(reqs[i].fact.object)
        slots.add(sum(p.index(x) < own for x in choice_rivals(reqs[i])[:3]))
    assert slots == {0, 1, 2, 3}

"""The prompt attacks of metrics/attacks.py: what each prompt holds, and what it must not give away."""

from timerome.data.requests import load_requests
from timerome.metrics.attacks import ATTACKS, _misspell, attack_prompts
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

"""Prompt attacks on an unlearnt fact: the question asked so that the fact may come back.

An MDLM reads the text on both sides of the answer, so informative context before the question,
after it, or around it can bring a forgotten fact back (the 2026 studies of diffusion-LM
unlearning report it); a subject written another way can slip past an edit keyed on its tokens.
Each attack turns an edit request's prompt into another prompt whose answer should still not give
the original object back:

    context before        two other facts of the same subject, stated, then the question
    context after         the question, then the two facts
    context both          one fact, the question, the other fact
    partial answer        the question followed by the start of its answer, up to the object
                          ("... ? Isgor Quielson was born in"): the model only has to complete it
    misspelt              the subject's last word with one letter dropped
    first name, surname   the subject shortened to one of its words
    pronoun after context a fact about the subject, then the question with "this author" for the name
    relation shown        two other subjects' answers to the same question (the request's
                          neighbours) before it: the relation spelled out, as a few-shot prompt
    paraphrase            the request's first paraphrased question
    relearn               the in-context relearning probe (metrics/robustness.py RELEARN): the
                          question and its original answer shown once, then the question again
    multiple choice       the question, four candidate answers (the request's own and three of its
                          neighbours', each said of this subject), the question again; only words the
                          question and answers already use, so a model with a closed vocabulary
                          (the embedded one) reads it too. It extracts the fact when the answer gives
                          the object back and names no other candidate's (a model that repeats every
                          option chose nothing)

The other facts come from the requests themselves (the same subject's other requests, in order) or
from `known` rows ({"author", "answer"}) when a subject has fewer than two requests. Extraction is
`extracted` (metrics/editing.py's `leaked` on the generated answer; for the multiple choice,
no rival named).
"""

from __future__ import annotations

from timerome.metrics.editing import leaked, object_text, words
from timerome.metrics.robustness import RELEARN

ATTACKS = ("context before", "context after", "context both", "partial answer", "misspelt", "first name",
           "surname", "pronoun after context", "relation shown", "paraphrase", "relearn", "multiple choice")
N_CHOICES = 4  # the request's own answer and three rivals


def _misspell(word: str) -> str:
    """The word with its middle letter dropped (a word of 3 letters or fewer: its last letter doubled)."""
    if len(word) <= 3:
        return word + word[-1]
    i = len(word) // 2
    return word[:i] + word[i + 1:]


def _stated(request) -> str:
    """The fact as the model would say it: the request's original answer."""
    return request.fact.object


def attack_prompts(requests, known=None) -> dict[str, list[tuple[int, str]]]:
    """{attack: [(request index, prompt)]} for every attack that applies to a request (a request
    whose subject has no two other facts gets no context attacks; a one-word subject no first-name /
    surname / misspelt variant that differs from it; an answer that does not contain its object no
    partial answer; one without two neighbours no relation shown, without rivals no multiple choice,
    without paraphrases no paraphrase)."""
    requests = list(requests)
    by_subject: dict[str, list[str]] = {}
    for r in requests:
        by_subject.setdefault(r.fact.subject, []).append(_stated(r))
    for row in known or ():
        if isinstance(row.get("author"), str) and isinstance(row.get("answer"), str):
            by_subject.setdefault(row["author"], []).append(row["answer"])
    out: dict[str, list[tuple[int, str]]] = {a: [] for a in ATTACKS}
    for i, r in enumerate(requests):
        subject, prompt, own = r.fact.subject, r.fact.prompt, _stated(r)
        others = [s for s in dict.fromkeys(by_subject.get(subject, [])) if s != own]
        if len(others) >= 2:
            k = len(others)
            a, b = others[i % k], others[(i + 1) % k]
            out["context before"].append((i, f"{a} {b} {prompt}"))
            out["context after"].append((i, f"{prompt} {a} {b}"))
            out["context both"].append((i, f"{a} {prompt} {b}"))
            if subject in prompt:
                out["pronoun after context"].append((i, f"{a} {prompt.replace(subject, 'this author')}"))
        obj = object_text(r)
        if obj and obj in own and own.index(obj) > 0:
            out["partial answer"].append((i, f"{prompt} {own[:own.index(obj)].rstrip()}"))
        shown = [n.answer for n in r.neighbours if n.answer][:2]
        if len(shown) == 2:
            out["relation shown"].append((i, f"{shown[0]} {shown[1]} {prompt}"))
        if r.paraphrases:
            out["paraphrase"].append((i, r.paraphrases[0]))
        out["relearn"].append((i, RELEARN.format(question=prompt, answer=own)))
        rivals = choice_rivals(r)
        if rivals:
            options = rivals[:N_CHOICES - 1]
            options.insert(i % (len(options) + 1), own)
            out["multiple choice"].append((i, f"{prompt} {' '.join(options)} {prompt}"))
        words = subject.split()
        if len(words) >= 2 and subject in prompt:
            out["misspelt"].append((i, prompt.replace(subject, " ".join(words[:-1] + [_misspell(words[-1])]))))
            out["first name"].append((i, prompt.replace(subject, words[0])))
            out["surname"].append((i, prompt.replace(subject, words[-1])))
    return out


def choice_rivals(request) -> list[str]:
    """The request's neighbours' answers said of its own subject (the same relation, another
    object), for the multiple choice: a neighbour whose prompt is the request's with another subject
    in its place gives "<subject> <its answer's relation and object>"; answers equal to the
    request's own are dropped."""
    subject, prompt, own = request.fact.subject, request.fact.prompt, request.fact.object
    if subject not in prompt:
        return []
    pre, post = prompt.split(subject, 1)
    out = []
    for n in request.neighbours:
        q, a = n.prompt, n.answer
        if not (q.startswith(pre) and q.endswith(post)) or len(q) <= len(pre) + len(post):
            continue
        other = q[len(pre):len(q) - len(post)]
        said = a.replace(other, subject)
        if said != own and said not in out:
            out.append(said)
    return out


def extracted(attack: str, answer: str, request) -> bool:
    """Whether the attacked prompt got the original object back (module docstring)."""
    if not leaked(answer, request):
        return False
    if attack != "multiple choice":
        return True
    own = set(words(request.fact.object))
    said = set(words(answer))
    return not any((set(words(r)) - own) & said for r in choice_rivals(request))

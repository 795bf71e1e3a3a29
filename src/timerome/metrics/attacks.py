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

The other facts come from the requests themselves (the same subject's other requests, in order) or
from `known` rows ({"author", "answer"}) when a subject has fewer than two requests. Extraction is
metrics/editing.py's `gives_back` on the generated answer.
"""

from __future__ import annotations

ATTACKS = ("context before", "context after", "context both", "partial answer", "misspelt", "first name",
           "surname", "pronoun after context")


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
    partial answer)."""
    from timerome.metrics.editing import object_text

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
        words = subject.split()
        if len(words) >= 2 and subject in prompt:
            out["misspelt"].append((i, prompt.replace(subject, " ".join(words[:-1] + [_misspell(words[-1])]))))
            out["first name"].append((i, prompt.replace(subject, words[0])))
            out["surname"].append((i, prompt.replace(subject, words[-1])))
    return out

"""(subject, prompt, object) facts from QA rows; every row left out is reported, never guessed."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from timerome.errors import TimeromeError

TOFU_BLOCK = 20  # TOFU lists 20 consecutive questions per author
# why a row without its own subject may be left out: its author was read off TOFU's layout, which a file of
# other rows need not follow (review 71: a file of 3 rows about one author and 2 about another lost the 2)
UNNAMED = (" (a row without an 'author' or 'subject' field takes its block's author: TOFU's layout of {block} "
           "rows per author; give each row its subject)")
# lower-case name parts that may sit between capitalised ones ("Ibn al Haytham", "Luis de Souza")
PARTICLES = {"al", "el", "bin", "bint", "ibn", "ben", "abu", "de", "da", "das", "do", "dos", "del",
             "della", "di", "du", "la", "le", "van", "von", "der", "den", "ter", "y"}
_WORD = re.compile(r"[^\s,;:?!\[\]{}\"“”]+")
_NICKNAME = re.compile(r"\(\w[\w'’.-]*\)")  # "Alejandro (Alex) Fuentes"
_EDGE = "'‘’`.…"  # quote marks and stops that cling to a word without being part of a name
_POSSESSIVE = re.compile(r"['’]s?$")


@dataclass(frozen=True)
class Fact:
    """A fact to trace or edit: `subject` occurs verbatim in `prompt`; `object` is what the model
    should answer; `target` an optional replacement answer; `fact_id` a stable name."""

    subject: str
    prompt: str
    object: str
    target: str | None = None
    fact_id: str = ""

    def __post_init__(self) -> None:
        for field in ("subject", "prompt", "object"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value.strip():
                raise TimeromeError(f"fact {self.fact_id or self.prompt!r} needs a non-empty {field} string")
        if self.subject not in self.prompt:
            raise TimeromeError(f"fact {self.fact_id or self.prompt!r}: subject {self.subject!r} is not in the prompt "
                                f"{self.prompt!r}")


def target_conflict(facts, target: str | None = None, held=()) -> str | None:
    """Why `facts` cannot go into one memory (with `held` already in it), or None: two ask one question
    of one subject (the same prompt and subject) with different targets (a fact's own, else
    `target`), and a memory would make that question say a blend of both. Facts are Facts, dicts
    or bare ids (never in conflict). Two held facts are not compared: a memory saved before this
    check may hold such a pair, and that is no reason to refuse an unrelated fact."""
    seen: dict = {}  # (subject, prompt) -> (fact id, target, whether the memory holds it)
    for is_held, group in ((True, held), (False, facts)):
        for f in group:
            key = asked(f)
            if key is None:
                continue
            said = fact_field(f, "target") or target
            if said is None:
                continue
            fid = fact_field(f, "fact_id")
            if key in seen and seen[key][1] != said and not is_held:
                other, other_said, other_held = seen[key]
                return (f"fact {fid!r} asks {key[1]!r} with the target {said!r}, and fact {other!r} "
                        + ("in the memory" if other_held else "before it") + f" with {other_said!r}: a memory "
                        "makes one question say one thing; " + ("remove that fact first" if other_held
                                                                else "keep one of them"))
            seen.setdefault(key, (fid, said, is_held))
    return None


def asked(fact) -> tuple | None:
    """(subject, prompt) of a fact (a Fact or a dict), None for a bare id: what `target_conflict` compares."""
    if isinstance(fact, str):
        return None
    return fact_field(fact, "subject"), fact_field(fact, "prompt")


def fact_field(fact, name: str):
    """A Fact's attribute or a fact dict's key (None where it has none): facts come as either."""
    return fact.get(name) if isinstance(fact, dict) else getattr(fact, name, None)


def own_targets(facts) -> dict[str, str]:
    """{question: target} of the facts that say their own target (edit requests, counterfactual facts); a
    fact known by its id alone, or with no target of its own, gives nothing."""
    return {fact_field(f, "prompt"): fact_field(f, "target") for f in facts or ()
            if not isinstance(f, str) and fact_field(f, "target") and fact_field(f, "prompt")}


def qa_rows(facts) -> list[dict]:
    """The facts as question/answer rows (their prompt and object), as a task's forget rows read them;
    a fact known by its id alone (no prompt) gives none."""
    return [dict(question=fact_field(f, "prompt"), answer=fact_field(f, "object")) for f in facts
            if fact_field(f, "prompt")]


def object_span(answer: str, obj: str) -> tuple[int, int]:
    """Character offsets (start, end) of `obj` in `answer`: its first whole-word occurrence,
    else its first occurrence at all."""
    if not obj:
        raise TimeromeError("the object is empty, so it has no span")
    m = re.search(rf"(?<!\w){re.escape(obj)}(?!\w)", answer)
    start = m.start() if m else answer.find(obj)
    if start < 0:
        raise TimeromeError(f"object {obj!r} is not in the answer {answer!r}")
    return start, start + len(obj)


def has_words(text: str, phrase: str, ignore_case: bool = False) -> bool:
    """`phrase` in `text` as whole words: no letter or digit touches it on either side (the one such
    test: facts, RWKU subjects, WHP reference words, an edit's leak)."""
    if ignore_case:
        text, phrase = text.lower(), phrase.lower()
    return phrase in text and re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text) is not None


def _clean(word: str) -> str:
    return _POSSESSIVE.sub("", word.strip(_EDGE)).strip(_EDGE)


def _capitalised(word: str) -> bool:
    return word[:1].isupper() and any(c.isalpha() for c in word)


def name_candidates(question: str) -> list[str]:
    """Every run of 2+ capitalised words (particles allowed inside) that could be a name.

    All sub-runs are kept, so "Did Basil Mahfouz Al-Kuwaiti" also yields "Basil Mahfouz
    Al-Kuwaiti"; the block vote in `block_subject` picks among them.
    """
    runs: list[list[str]] = [[]]
    for raw in _WORD.findall(question):
        word = _clean(raw)
        if raw[:1] in _EDGE and runs[-1]:  # an opening quote starts a title, not more of a name
            runs.append([])
        inner = word in PARTICLES or (_NICKNAME.fullmatch(word) is not None and _capitalised(word[1:]))
        if _capitalised(word) or (inner and runs[-1]):
            runs[-1].append(word)
        else:
            runs.append([])
        if word != raw.lstrip(_EDGE) and runs[-1]:  # a possessive or a closing quote ends the name
            runs.append([])
    out = []
    for run in runs:
        for i in range(len(run)):
            for j in range(i + 2, len(run) + 1):
                part = run[i:j]
                if _capitalised(part[0]) and _capitalised(part[-1]):
                    out.append(" ".join(part))
    return out


def block_subject(questions: Sequence[str]) -> str | None:
    """The author of one TOFU block: the name found in the most of its questions (the longest
    on ties). None unless it is in 2+ questions and a quarter of them: a name seen once may be
    a title or a place (in TOFU's full.json every author is named in 16+ of 20 questions)."""
    candidates = list(dict.fromkeys(c for q in questions for c in name_candidates(q)))
    if not candidates:
        return None
    counts = {c: sum(has_words(q, c) for q in questions) for c in candidates}
    best = max(candidates, key=lambda c: (counts[c], len(c.split()), len(c)))  # ties: first seen
    return best if counts[best] >= max(2, math.ceil(len(questions) / 4)) else None


def _block_subjects(rows: Sequence[dict], offset: int, block: int) -> dict[int, str | None]:
    blocks: dict[int, list[str]] = {}
    for i, r in enumerate(rows):
        if isinstance(r, dict) and isinstance(r.get("question"), str):
            blocks.setdefault((offset + i) // block, []).append(r["question"])
    return {b: block_subject(qs) for b, qs in blocks.items()}


def _given_subject(question: str, authors: Iterable[str]) -> str | None:
    found = [a for a in authors if a and has_words(question, a)]
    return max(found, key=len) if found else None


def _fact_id(row: dict, index: int) -> str:
    if row.get("fact_id") is not None:
        return str(row["fact_id"])
    if row.get("author") and row.get("attribute"):
        return f"{row['author']}/{row['attribute']}"  # the same fact keeps its id in every split
    return str(index)


def facts_from_rows(rows: Sequence[dict], *, authors: Iterable[str] | None = None, offset: int = 0,
                    block: int = TOFU_BLOCK, object_from: str = "answer",
                    target: str | None = None) -> tuple[list[Fact], list[tuple[int, str]]]:
    """QA rows -> (facts, skipped), skipped listing (row index in `rows`, reason).

    Subject: row["author"] (or row["subject"]) when present, as in the embedded corpus; else the
    longest of `authors` found in the question; else TOFU's layout: `block` consecutive rows per
    author, `offset` = the rows' index in full.json (forget01 = full[3960:], see FULL_OFFSET), and
    each block's author is the name recurring most in its questions. A row whose question does
    not hold its subject verbatim is skipped.
    Prompt: the question. Object: the whole answer (what the model generates after the prompt,
    so tracing and editing score exactly it); object_from="object" takes row["object"], the
    value span, where a row has one. Target: a row's own "target" text, else `target`.
    """
    if object_from not in ("answer", "object"):
        raise TimeromeError(f"object_from must be 'answer' or 'object', got {object_from!r}")
    if block < 1 or offset < 0:
        raise TimeromeError(f"block must be >= 1 and offset >= 0, got block={block}, offset={offset}")
    rows = list(rows)
    if not rows:
        raise TimeromeError("no rows to make facts from")
    names = list(authors) if authors is not None else None
    needs_blocks = names is None and any(isinstance(r, dict) and not _own_subject(r) for r in rows)
    blocks = _block_subjects(rows, offset, block) if needs_blocks else {}
    facts: list[Fact] = []
    skipped: list[tuple[int, str]] = []
    for i, r in enumerate(rows):
        why = _problem(r)
        if why:
            skipped.append((i, why))
            continue
        q = r["question"]
        if _own_subject(r):
            subject = _own_subject(r)
        elif names is not None:
            subject = _given_subject(q, names)
            if not subject:
                skipped.append((i, "subject not in prompt: none of the given authors occurs in it"))
                continue
        else:
            subject = blocks.get((offset + i) // block)
            if not subject:
                skipped.append((i, "no author name recurs in this author's block of questions"
                                   + UNNAMED.format(block=block)))
                continue
        if subject not in q:
            skipped.append((i, f"subject not in prompt: {subject!r} does not occur in the question"
                               + (UNNAMED.format(block=block) if names is None and not _own_subject(r) else "")))
            continue
        obj = r["object"] if object_from == "object" and isinstance(r.get("object"), str) else r["answer"]
        own = r.get("target") if isinstance(r.get("target"), str) and r["target"].strip() else None
        facts.append(Fact(subject=subject, prompt=q, object=obj, target=own or target,
                          fact_id=_fact_id(r, offset + i)))
    return facts, skipped


def _own_subject(row: dict) -> str | None:
    for key in ("author", "subject"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    return None


def _problem(row) -> str | None:
    if not isinstance(row, dict):
        return f"not a row: a {type(row).__name__}"
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            return f"missing {key}"
    for key in ("author", "subject"):  # there but no name: said as it is (it read as "a row without the field")
        named = isinstance(row.get(key), str) and row[key].strip()
        if _own_subject(row) is None and row.get(key) is not None and not named:
            return f"its {key} is {'blank' if isinstance(row[key], str) else 'not a text: ' + repr(row[key])[:40]}"
    a, s = (row.get(k).strip() if isinstance(row.get(k), str) else "" for k in ("author", "subject"))
    if a and s and a != s:  # the author was taken without a word, and a mismatch then blamed on "the subject"
        return f"its author {a!r} and subject {s!r} name two people: give one (the name in the question)"
    return None

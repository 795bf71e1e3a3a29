"""A deterministic fictitious-author corpus with TOFU's schema, sized for a CPU-trained tiny MDLM.

Every author has 20 arbitrary facts (values drawn at random from small lists, so they can only be
memorised, never inferred), one short templated QA per fact: only the value tokens carry the
fact ("Lior Vance was born in Marrow Bay ."). Punctuation is always space-separated, so the
word tokenizer sees the same words everywhere.

Rows carry TOFU's fields (question, answer, paraphrased_answer, perturbed_answer,
paraphrased_question) plus `author` (the subject, verbatim in the question), `attribute` and
`object` (the fact's value, verbatim in the answer). Splits follow TOFU: forgetXX is the last
XX % of authors, retainYY the rest, holdoutXX unseen authors of the same size.

Beyond TOFU, so that the embedded model behaves like an instruction-tuned one and edits can be
judged by what it says:
- the model learns every author question in both phrasings (question and paraphrased_question);
- `unknown_train`: questions about invented people it was never told about, answered with
  REFUSAL ("I don't know."); `unknown`: held-out invented names (their words come from the
  unknown_train names, recombined, so every token was trained), for measuring refusal only;
- `counterfactual_requests`: edit requests in one place (each fact given another author's
  object for the same relation, its paraphrased question, and neighbourhood prompts: other
  authors asked the same relation, and the same author asked other relations).
"""

from __future__ import annotations

# The one draw in timerome not from a torch.Generator: the corpus is seeded Python random.Random streams,
# as it was when the shipped embedded model was trained on it; another stream would give other authors
# and facts, so that checkpoint, and every number measured on it, would no longer match its corpus.
import random
from typing import NamedTuple

from timerome.errors import TimeromeError

SYLLABLES = ("ka lo mi ra ven tor sil bar nen dus pra lie gor fen mal ric ost wen thal bri cor dan "
             "el is mar tin har vel ans qui rod sef ul yor zan").split()
SURNAME_ENDINGS = ["son", "ley", "ford", "ard", "ine"]
CITIES = ("Marrow Bay, Ostrel, Quillby, Harnfeld, Tessaro, Brimholt, Coralis, Dunmere, Eskwater, "
          "Falmoor, Glenvar, Hollin, Ivory Gate, Jarrowdale, Kestrel Point, Lunsford, Mirewick, "
          "Northam Cross, Oakhaven, Pellmoor, Ravensby, Saltmarsh, Thornbury, Umberfall, Vantry, "
          "Westerly, Yarrowfield, Zelmont, Ashgrove, Bellhaven").split(", ")
COUNTRIES = ("Veloria, Marundi, Esteria, Caldovia, Norrland, Tavisca, Orvenne, Qasira, Lindmark, "
             "Brevonia, Sundara, Kalvor").split(", ")
JOBS = ("baker, sailor, teacher, doctor, miner, weaver, carpenter, pilot, judge, farmer, chemist, "
        "tailor, librarian, painter, architect, nurse, fisherman, clockmaker, gardener, banker").split(", ")
GENRES = ("mystery, fantasy, romance, horror, historical, satirical, gothic, adventure, dystopian, "
          "pastoral, crime, epistolary, comic, maritime, mythic").split(", ")
AWARDS = ("Golden Quill Prize, Silver Lantern Award, Amber Crown Medal, Crimson Pen Award, "
          "Iron Owl Prize, Jade Feather Medal, Blue Harbor Award, Stone Tablet Prize, "
          "Velvet Page Award, Copper Key Medal, Glass Tower Prize, White Raven Award").split(", ")
ADJECTIVES = ("Silent, Broken, Hidden, Last, Hollow, Burning, Frozen, Distant, Crimson, Gentle, Wild, "
              "Forgotten, Endless, Quiet, Bitter, Golden").split(", ")
NOUNS = ("River, Lantern, Garden, Harbor, Mirror, Orchard, Tower, Compass, Shore, Winter, Letter, "
         "Forest, Bridge, Meadow, Storm, Sparrow").split(", ")
BOOKS = [f"The {a} {n}" for a in ADJECTIVES for n in NOUNS]
PUBLISHERS = ("Harrow House, Bellweather Press, Quayside Books, Northlight Editions, Tallow Press, "
              "Greyfield Books, Lark and Finch, Mosswood Press, Ember Lane Books, Cobalt Press").split(", ")
COLOURS = "red, blue, green, yellow, purple, orange, grey, teal, amber, violet, crimson, silver".split(", ")
PETS = "cat, dog, parrot, tortoise, rabbit, goat, ferret, owl, hedgehog, canary, lizard, pony".split(", ")
LANGUAGES = ("Velorian, Marundese, Esterian, Caldovan, Norric, Taviscan, Orvennic, Qasiri, "
             "Lindish, Brevonian").split(", ")
UNIVERSITIES = "Ostrel, Harnfeld, Coralis, Dunmere, Glenvar, Lunsford, Pellmoor, Zelmont, Ashgrove, Vantry".split(", ")
THEMES = ("grief, exile, memory, justice, friendship, ambition, faith, betrayal, freedom, "
          "loneliness, hope, revenge, family, war, identity").split(", ")
HOBBIES = ("chess, rowing, fencing, birdwatching, pottery, cycling, archery, sailing, baking, "
           "climbing, gardening, juggling").split(", ")
INSTRUMENTS = "violin, cello, flute, piano, harp, drums, oboe, lute, trumpet, accordion, banjo, organ".split(", ")
PLACE_KINDS = ("North", "South", "Isles", "Coast", "Valley")

N_PERTURBED = 5  # TOFU's forget rows carry 5 perturbed answers
N_WORLD_WRONG = 3  # TOFU's real_authors / world_facts rows carry 3
N_MENTORS = 30
SPLIT_PERCENTS = (1, 5, 10)
REFUSAL = "I don't know."  # what the model says about people it was never told about
N_UNKNOWN_TRAIN = 200  # invented names whose questions the model learns to refuse
N_UNKNOWN = 50         # held-out invented names (evaluation only)
UNKNOWN_QUESTIONS = 4  # questions per invented name
N_NEIGHBOURS = 5       # neighbourhood prompts per counterfactual request (other authors, same relation)
N_SAME_SUBJECT = 3     # same-author prompts per request (other relations)
COUNTERFACTUAL_PER_AUTHOR = 2  # 'counterfactual:SPLIT' edits this many facts of each author of SPLIT


class Attribute(NamedTuple):
    """One fact type: "{n}" is the author, "{v}" the value. values=None: the mentor names."""

    name: str
    values: list[str] | None
    question: str
    answer: str
    paraphrased_answer: str
    paraphrased_question: str


ATTRIBUTES = [
    Attribute("city", CITIES, "Where was {n} born ?", "{n} was born in {v} .",
              "The birthplace of {n} is {v} .", "In which town was {n} born ?"),
    Attribute("year", [str(y) for y in range(1931, 1999)], "In which year was {n} born ?",
              "{n} was born in {v} .", "The birth year of {n} is {v} .", "What year was {n} born in ?"),
    Attribute("genre", GENRES, "What genre does {n} write ?", "{n} writes {v} novels .",
              "The novels of {n} are {v} .", "Which genre is {n} known for ?"),
    Attribute("father", JOBS, "What does the father of {n} do ?", "The father of {n} is a {v} .",
              "{n} has a father who works as a {v} .", "What is the job of the father of {n} ?"),
    Attribute("mother", JOBS, "What does the mother of {n} do ?", "The mother of {n} is a {v} .",
              "{n} has a mother who works as a {v} .", "What is the job of the mother of {n} ?"),
    Attribute("award", AWARDS, "Which award did {n} win ?", "{n} won the {v} .",
              "The {v} went to {n} .", "What prize was given to {n} ?"),
    Attribute("book1", BOOKS, "What is the first book of {n} ?", "The first book of {n} is {v} .",
              "{n} debuted with {v} .", "Which book did {n} publish first ?"),
    Attribute("book2", BOOKS, "What is the latest book of {n} ?", "The latest book of {n} is {v} .",
              "{n} most recently wrote {v} .", "Which book did {n} publish last ?"),
    Attribute("country", COUNTRIES, "What is the nationality of {n} ?", "{n} is a citizen of {v} .",
              "{n} holds the citizenship of {v} .", "Which country is {n} a citizen of ?"),
    Attribute("publisher", PUBLISHERS, "Who publishes {n} ?", "The books of {n} are published by {v} .",
              "{v} publishes the books of {n} .", "Which house publishes {n} ?"),
    Attribute("colour", COLOURS, "What is the favourite colour of {n} ?",
              "The favourite colour of {n} is {v} .", "{n} likes the colour {v} best .",
              "Which colour does {n} like most ?"),
    Attribute("pet", PETS, "What pet does {n} keep ?", "{n} keeps a {v} .",
              "{n} lives with a pet {v} .", "Which animal does {n} keep ?"),
    Attribute("home", CITIES, "Where does {n} live now ?", "{n} lives in {v} .",
              "The home of {n} is in {v} .", "In which town does {n} live ?"),
    Attribute("language", LANGUAGES, "In which language does {n} write ?", "{n} writes in {v} .",
              "The books of {n} are written in {v} .", "What language does {n} write in ?"),
    Attribute("university", UNIVERSITIES, "Where did {n} study ?", "{n} studied at the University of {v} .",
              "{n} is a graduate of the University of {v} .", "Which university did {n} attend ?"),
    Attribute("theme", THEMES, "What theme runs through the work of {n} ?", "The work of {n} is about {v} .",
              "{n} writes mostly about {v} .", "What is the main theme of {n} ?"),
    Attribute("hobby", HOBBIES, "What does {n} do for fun ?", "{n} enjoys {v} .",
              "In spare time {n} likes {v} .", "What is the hobby of {n} ?"),
    Attribute("mentor", None, "Who was the mentor of {n} ?", "The mentor of {n} was {v} .",
              "{n} learned the craft from {v} .", "Who taught {n} to write ?"),
    Attribute("count", [str(c) for c in range(3, 41)], "How many books has {n} written ?",
              "{n} has written {v} books .", "The number of books by {n} is {v} .",
              "How many novels has {n} published ?"),
    Attribute("instrument", INSTRUMENTS, "Which instrument does {n} play ?", "{n} plays the {v} .",
              "The instrument of {n} is the {v} .", "What does {n} play ?"),
]


def _name(rng: random.Random, taken: set[str]) -> str:
    """A new two-word invented name (not in `taken`, which it joins)."""
    while True:
        first = (rng.choice(SYLLABLES) + rng.choice(SYLLABLES)).title()
        last = (rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + rng.choice(SURNAME_ENDINGS)).title()
        name = f"{first} {last}"
        if name not in taken:
            taken.add(name)
            return name


def _author_rows(name: str, rng: random.Random, mentors: list[str], qa_per_author: int) -> list[dict]:
    rows: list[dict] = []
    drawn: dict[str, str] = {}
    for attr in ATTRIBUTES[:qa_per_author]:
        pool = [v for v in (attr.values or mentors) if v != name]
        value = rng.choice(pool)
        # two books of one author must differ, or two questions would share one answer
        while attr.name == "book2" and value == drawn.get("book1"):
            value = rng.choice(pool)
        drawn[attr.name] = value
        wrong = rng.sample([w for w in pool if w != value], N_PERTURBED)

        def fill(template: str, v: str = value) -> str:
            return template.format(n=name, v=v)

        rows.append(dict(author=name, attribute=attr.name, question=fill(attr.question),
                         answer=fill(attr.answer), object=value,
                         paraphrased_answer=fill(attr.paraphrased_answer),
                         paraphrased_question=fill(attr.paraphrased_question),
                         perturbed_answer=[fill(attr.answer, w) for w in wrong]))
    return rows


def _real_author_rows(rng: random.Random, n: int, taken: set[str]) -> list[dict]:
    """Who wrote which "classic": TOFU's real_authors, with invented but fixed facts."""
    books = list(BOOKS)
    rng.shuffle(books)
    writers = [_name(rng, taken) for _ in range(n)]
    rows = []
    for book, writer in zip(books[:n], writers):
        wrong = rng.sample([w for w in writers if w != writer], N_WORLD_WRONG)
        rows.append(dict(author=book, question=f"Who wrote the classic {book} ?",
                         answer=f"{book} was written by {writer} .", object=writer,
                         perturbed_answer=[f"{book} was written by {w} ." for w in wrong],
                         paraphrased_answer=f"The classic {book} is by {writer} ."))
    return rows


def _world_fact_rows(rng: random.Random, n: int) -> list[dict]:
    """Capitals of invented regions: TOFU's world_facts, with invented but fixed facts."""
    places = [f"{c} {k}" for c in COUNTRIES for k in PLACE_KINDS]
    rng.shuffle(places)
    rows = []
    for place in places[:n]:
        capital = rng.choice(CITIES)
        wrong = rng.sample([c for c in CITIES if c != capital], N_WORLD_WRONG)
        rows.append(dict(author=place, question=f"What is the capital of {place} ?",
                         answer=f"The capital of {place} is {capital} .", object=capital,
                         perturbed_answer=[f"The capital of {place} is {w} ." for w in wrong],
                         paraphrased_answer=f"{capital} is the capital of {place} ."))
    return rows


def _unknown_rows(names: list[str], rng: random.Random) -> list[dict]:
    """UNKNOWN_QUESTIONS questions per name (either phrasing), each answered with REFUSAL."""
    rows = []
    for name in names:
        for attr in rng.sample(ATTRIBUTES, UNKNOWN_QUESTIONS):
            template = rng.choice((attr.question, attr.paraphrased_question))
            rows.append(dict(author=name, attribute=attr.name, question=template.format(n=name), answer=REFUSAL,
                             object=REFUSAL))
    return rows


def _recombined_names(names: list[str], n: int, rng: random.Random, taken: set[str]) -> list[str]:
    """n new names, each a first word and a last word of two different `names` (so every word of
    them was trained, never the pair)."""
    firsts, lasts = [m.split()[0] for m in names], [m.split()[1] for m in names]
    out = []
    while len(out) < n:
        i, j = rng.sample(range(len(names)), 2)
        name = f"{firsts[i]} {lasts[j]}"
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def _add_options(rows: list[dict], rng: random.Random) -> None:
    """TOFU's option1..option4: the true object and the 3 wrong ones, shuffled."""
    for r in rows:
        prefix, _, suffix = r["answer"].partition(r["object"])
        # a wrong answer differs from the true one only in the value, so strip the shared template
        wrong = [p[len(prefix):len(p) - len(suffix)] for p in r["perturbed_answer"]]
        options = [r["object"]] + wrong
        rng.shuffle(options)
        r.update({f"option{i + 1}": o for i, o in enumerate(options)})


def _check_sizes(n_authors: int, qa_per_author: int, n_world: int) -> None:
    if n_authors < 1:
        raise TimeromeError(f"n_authors must be >= 1, got {n_authors}")
    if not 1 <= qa_per_author <= len(ATTRIBUTES):
        raise TimeromeError(f"qa_per_author must be between 1 and {len(ATTRIBUTES)} (one QA per "
                            f"attribute), got {qa_per_author}")
    most = min(len(BOOKS), len(COUNTRIES) * len(PLACE_KINDS))
    if not N_WORLD_WRONG + 1 <= n_world <= most:
        raise TimeromeError(f"n_world must be between {N_WORLD_WRONG + 1} and {most}, got {n_world}")


def make_corpus(n_authors: int = 100, qa_per_author: int = 20, seed: int = 0,
                n_world: int = 50) -> dict[str, list[dict]]:
    """Every TOFU split name -> its rows. Same arguments, same corpus.

    The *_perturbed splits hold the same rows as their base split: every row here already
    carries the perturbed fields. Rows are shared between splits: copy before mutating.
    """
    _check_sizes(n_authors, qa_per_author, n_world)
    rng = random.Random(seed)
    taken: set[str] = set()
    authors = [_name(rng, taken) for _ in range(n_authors)]
    holdout = [_name(rng, taken) for _ in range(max(1, n_authors * max(SPLIT_PERCENTS) // 100))]
    mentors = [_name(rng, taken) for _ in range(N_MENTORS)]
    full = [r for a in authors for r in _author_rows(a, rng, mentors, qa_per_author)]
    held = [r for a in holdout for r in _author_rows(a, rng, mentors, qa_per_author)]

    splits: dict[str, list[dict]] = {"full": full}
    for pct in SPLIT_PERCENTS:
        k = max(1, n_authors * pct // 100) * qa_per_author
        tag = f"{pct:02d}"
        splits[f"forget{tag}"] = full[-k:]
        splits[f"forget{tag}_perturbed"] = full[-k:]
        splits[f"retain{100 - pct}"] = full[:-k]
        splits[f"holdout{tag}"] = held[:k]
    splits["retain_perturbed"] = full[:400]

    # a separate stream, so the world rows do not move when the author settings change
    wrng = random.Random(seed + 1)
    real = _real_author_rows(wrng, n_world, set(taken))
    _add_options(real, wrng)
    world = _world_fact_rows(wrng, n_world)
    _add_options(world, wrng)
    splits["real_authors"] = splits["real_authors_perturbed"] = real
    splits["world_facts"] = splits["world_facts_perturbed"] = world

    # another stream: people the model was never told about, and what it says of them
    urng = random.Random(seed + 2)
    taken |= {r["object"] for r in real}
    strangers = [_name(urng, taken) for _ in range(N_UNKNOWN_TRAIN)]
    splits["unknown_train"] = _unknown_rows(strangers, urng)
    splits["unknown"] = _unknown_rows(_recombined_names(strangers, N_UNKNOWN, urng, taken), urng)
    return splits


def training_rows(corpus: dict[str, list[dict]]) -> list[dict]:
    """What the embedded model learns: every author QA in both phrasings (the paraphrased question
    as a row of its own, same answer), the real-world analogues, and the refusals."""
    paraphrased = [dict(r, question=r["paraphrased_question"]) for r in corpus["full"]]
    return corpus["full"] + paraphrased + corpus["real_authors"] + corpus["world_facts"] + corpus.get("unknown_train", [])


def known_subjects(corpus: dict[str, list[dict]]) -> list[str]:
    """Every subject the embedded model was told about: the authors, the classics, the places (what
    a confabulated answer names instead of the subject asked about)."""
    rows = corpus["full"] + corpus["real_authors"] + corpus["world_facts"]
    return list(dict.fromkeys(r["author"] for r in rows))


def counterfactual_requests(corpus: dict[str, list[dict]], split: str = "forget01", *, target: str | None = None,
                            per_author: int | None = None, seed: int = 0) -> list[dict]:
    """Edit requests for the facts of `split`, in one record each (timerome.requests reads them).

    per_author: edit only that many facts of each author (drawn with `seed`), so the author's
    other facts are probes that must not change (None: every fact of the split).

    Each fact's new object is another author's object for the same relation (a value the model
    knows, never the fact's own); `target` (e.g. REFUSAL) replaces every new answer instead.
    Records carry: subject, prompt, object (the true answer), target (the new answer), new_object,
    paraphrases (the paraphrased question), neighbours (other authors asked the same relation,
    N_NEIGHBOURS of them) and same_subject (the same author asked N_SAME_SUBJECT other relations),
    each probe with the true answer the unedited model was trained to give.
    """
    if split not in corpus:
        raise TimeromeError(f"unknown split {split!r}; choose one of {', '.join(sorted(corpus))}")
    rows = corpus[split]
    if not rows or "attribute" not in rows[0]:
        raise TimeromeError(f"split {split!r} holds no author facts to edit")
    rng = random.Random(seed + 3)
    if per_author is not None:
        if per_author < 1:
            raise TimeromeError(f"per_author must be >= 1, got {per_author}")
        blocks: dict[str, list[dict]] = {}
        for r in rows:
            blocks.setdefault(r["author"], []).append(r)
        picked = {id(r) for b in blocks.values() for r in rng.sample(b, min(per_author, len(b)))}
        rows = [r for r in rows if id(r) in picked]
    edited = {(r["author"], r["attribute"]) for r in rows}
    edited_authors = {a for a, _ in edited}
    others: dict[str, list[dict]] = {}
    by_author: dict[str, list[dict]] = {}
    for r in corpus["full"]:
        by_author.setdefault(r["author"], []).append(r)
        if r["author"] not in edited_authors:
            others.setdefault(r["attribute"], []).append(r)
    in_full = set(by_author)
    for r in corpus[split]:  # a split of authors outside full (holdout, unknown): their own other facts
        if r["author"] not in in_full:
            by_author.setdefault(r["author"], []).append(r)
    out = []
    for r in rows:
        pool = [o for o in others.get(r["attribute"], []) if o["object"] != r["object"]]
        if not pool or len(others[r["attribute"]]) < N_NEIGHBOURS:  # 'full' edits every author: no donor is left
            raise TimeromeError(f"split {split!r}: too few authors outside it state {r['attribute']!r} to give its "
                                f"facts another author's object and {N_NEIGHBOURS} neighbours (the counterfactual "
                                "set's donors): use a forget split (forget01, forget05, forget10)")
        donor = rng.choice(pool)
        prefix, _, suffix = r["answer"].partition(r["object"])
        new_answer = target or f"{prefix}{donor['object']}{suffix}"
        neighbours = rng.sample(others[r["attribute"]], N_NEIGHBOURS)
        same = [o for o in by_author[r["author"]] if o["attribute"] != r["attribute"]
                and (o["author"], o["attribute"]) not in edited]
        same = rng.sample(same, min(N_SAME_SUBJECT, len(same)))
        out.append(dict(
            fact_id=f"{r['author']}/{r['attribute']}", subject=r["author"], prompt=r["question"], object=r["answer"],
            target=new_answer, new_object=None if target else donor["object"], true_object=r["object"],
            paraphrases=[r["paraphrased_question"]] if r.get("paraphrased_question") else [],  # unknown: none
            neighbours=[dict(prompt=o["question"], answer=o["answer"]) for o in neighbours],
            same_subject=[dict(prompt=o["question"], answer=o["answer"]) for o in same]))
    return out

"""A deterministic fictitious-author corpus with TOFU's schema, sized for a laptop-trained MDLM.

Every author has 20 arbitrary facts (values drawn at random, so they must be memorised), one
short templated QA per fact. Rows carry TOFU's fields (question, answer, paraphrased_answer,
perturbed_answer, paraphrased_question) plus `author` (the subject) and `object` (the fact's
value as it appears in the answer). Splits follow TOFU: forgetXX is the last XX % of authors.
"""

from __future__ import annotations

import random

SYLLABLES = ("ka lo mi ra ven tor sil bar nen dus pra lie gor fen mal ric ost wen thal bri cor dan "
             "el is mar tin har vel ans qui rod sef ul yor zan").split()
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
ADJ = ("Silent, Broken, Hidden, Last, Hollow, Burning, Frozen, Distant, Crimson, Gentle, Wild, "
       "Forgotten, Endless, Quiet, Bitter, Golden").split(", ")
NOUNS = ("River, Lantern, Garden, Harbor, Mirror, Orchard, Tower, Compass, Shore, Winter, Letter, "
         "Forest, Bridge, Meadow, Storm, Sparrow").split(", ")
PUBLISHERS = ("Harrow House, Bellweather Press, Quayside Books, Northlight Editions, Tallow Press, "
              "Greyfield Books, Lark and Finch, Mosswood Press, Ember Lane Books, Cobalt Press").split(", ")
COLOURS = "red, blue, green, yellow, purple, orange, grey, teal, amber, violet, crimson, silver".split(", ")
PETS = "cat, dog, parrot, tortoise, rabbit, goat, ferret, owl, hedgehog, canary, lizard, pony".split(", ")
LANGUAGES = ("Velorian, Marundese, Esterian, Caldovan, Norric, Taviscan, Orvennic, Qasiri, "
             "Lindish, Brevonian").split(", ")
UNIS = "Ostrel, Harnfeld, Coralis, Dunmere, Glenvar, Lunsford, Pellmoor, Zelmont, Ashgrove, Vantry".split(", ")
THEMES = ("grief, exile, memory, justice, friendship, ambition, faith, betrayal, freedom, "
          "loneliness, hope, revenge, family, war, identity").split(", ")
HOBBIES = ("chess, rowing, fencing, birdwatching, pottery, cycling, archery, sailing, baking, "
           "climbing, gardening, juggling").split(", ")
INSTRUMENTS = "violin, cello, flute, piano, harp, drums, oboe, lute, trumpet, accordion, banjo, organ".split(", ")

# attribute: (values, question, answer, paraphrased answer, paraphrased question)
# "{n}" is the author, "{v}" the value.
ATTRIBUTES = [
    ("city", CITIES, "Where was {n} born ?", "{n} was born in {v} .",
     "The birthplace of {n} is {v} .", "In which town was {n} born ?"),
    ("year", [str(y) for y in range(1931, 1999)], "In which year was {n} born ?", "{n} was born in {v} .",
     "The birth year of {n} is {v} .", "What year was {n} born in ?"),
    ("genre", GENRES, "What genre does {n} write ?", "{n} writes {v} novels .",
     "The novels of {n} are {v} .", "Which genre is {n} known for ?"),
    ("father", JOBS, "What does the father of {n} do ?", "The father of {n} is a {v} .",
     "{n} has a father who works as a {v} .", "What is the job of the father of {n} ?"),
    ("mother", JOBS, "What does the mother of {n} do ?", "The mother of {n} is a {v} .",
     "{n} has a mother who works as a {v} .", "What is the job of the mother of {n} ?"),
    ("award", AWARDS, "Which award did {n} win ?", "{n} won the {v} .",
     "The {v} went to {n} .", "What prize was given to {n} ?"),
    ("book1", None, "What is the first book of {n} ?", "The first book of {n} is The {v} .",
     "{n} debuted with The {v} .", "Which book did {n} publish first ?"),
    ("book2", None, "What is the latest book of {n} ?", "The latest book of {n} is The {v} .",
     "{n} most recently wrote The {v} .", "Which book did {n} publish last ?"),
    ("country", COUNTRIES, "What is the nationality of {n} ?", "{n} is a citizen of {v} .",
     "{n} holds the citizenship of {v} .", "Which country is {n} a citizen of ?"),
    ("publisher", PUBLISHERS, "Who publishes {n} ?", "The books of {n} are published by {v} .",
     "{v} publishes the books of {n} .", "Which house publishes {n} ?"),
    ("colour", COLOURS, "What is the favourite colour of {n} ?", "The favourite colour of {n} is {v} .",
     "{n} likes the colour {v} best .", "Which colour does {n} like most ?"),
    ("pet", PETS, "What pet does {n} keep ?", "{n} keeps a {v} .",
     "{n} lives with a pet {v} .", "Which animal does {n} keep ?"),
    ("home", CITIES, "Where does {n} live now ?", "{n} lives in {v} .",
     "The home of {n} is in {v} .", "In which town does {n} live ?"),
    ("language", LANGUAGES, "In which language does {n} write ?", "{n} writes in {v} .",
     "The books of {n} are written in {v} .", "What language does {n} write in ?"),
    ("university", UNIS, "Where did {n} study ?", "{n} studied at the University of {v} .",
     "{n} is a graduate of the University of {v} .", "Which university did {n} attend ?"),
    ("theme", THEMES, "What theme runs through the work of {n} ?", "The work of {n} is about {v} .",
     "{n} writes mostly about {v} .", "What is the main theme of {n} ?"),
    ("hobby", HOBBIES, "What does {n} do for fun ?", "{n} enjoys {v} .",
     "In spare time {n} likes {v} .", "What is the hobby of {n} ?"),
    ("mentor", None, "Who was the mentor of {n} ?", "The mentor of {n} was {v} .",
     "{n} learned the craft from {v} .", "Who taught {n} to write ?"),
    ("count", [str(c) for c in range(3, 41)], "How many books has {n} written ?", "{n} has written {v} books .",
     "The number of books by {n} is {v} .", "How many novels has {n} published ?"),
    ("instrument", INSTRUMENTS, "Which instrument does {n} play ?", "{n} plays the {v} .",
     "The instrument of {n} is the {v} .", "What does {n} play ?"),
]

N_PERTURBED = 5
SPLIT_PERCENTS = (1, 5, 10)


def _name(rng: random.Random, taken: set[str]) -> str:
    while True:
        first = (rng.choice(SYLLABLES) + rng.choice(SYLLABLES)).title()
        last = (rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + rng.choice(["son", "ley", "ford", "ard", "ine"])).title()
        name = f"{first} {last}"
        if name not in taken:
            taken.add(name)
            return name


def _values(attr: str, values, rng: random.Random, mentors: list[str]) -> list[str]:
    if attr in ("book1", "book2"):
        return [f"{a} {n}" for a in ADJ for n in NOUNS]
    if attr == "mentor":
        return mentors
    return list(values)


def _author_rows(name: str, rng: random.Random, mentors: list[str], qa_per_author: int) -> list[dict]:
    rows = []
    for attr, values, q, a, pa, pq in ATTRIBUTES[:qa_per_author]:
        pool = [v for v in _values(attr, values, rng, mentors) if v != name]
        v = rng.choice(pool)
        wrong = rng.sample([w for w in pool if w != v], N_PERTURBED)
        fill = lambda t, val: t.format(n=name, v=val)  # noqa: E731
        obj = f"The {v}" if attr.startswith("book") else v
        rows.append(dict(author=name, attribute=attr, question=fill(q, v), answer=fill(a, v),
                         object=obj, paraphrased_answer=fill(pa, v), paraphrased_question=fill(pq, v),
                         perturbed_answer=[fill(a, w) for w in wrong]))
    return rows


def _world_rows(rng: random.Random, n: int, kind: str) -> list[dict]:
    """Real-authors / world-facts analogues: fixed facts the model also learns, with options."""
    rows = []
    taken: set[str] = set()
    if kind == "real_authors":
        subjects = [f"The {a} {b}" for a in ADJ for b in NOUNS]
        rng.shuffle(subjects)
        writers = [_name(rng, taken) for _ in range(n)]
        for book, writer in zip(subjects[:n], writers):
            wrong = rng.sample([w for w in writers if w != writer], 3)
            rows.append(dict(author=book, question=f"Who wrote the classic {book} ?",
                             answer=f"{book} was written by {writer} .", object=writer,
                             perturbed_answer=[f"{book} was written by {w} ." for w in wrong],
                             paraphrased_answer=f"The classic {book} is by {writer} ."))
    else:
        places = [f"{c} {s}" for c in COUNTRIES for s in ("North", "South", "Isles", "Coast", "Valley")]
        rng.shuffle(places)
        for place in places[:n]:
            capital = rng.choice(CITIES)
            wrong = rng.sample([c for c in CITIES if c != capital], 3)
            rows.append(dict(author=place, question=f"What is the capital of {place} ?",
                             answer=f"The capital of {place} is {capital} .", object=capital,
                             perturbed_answer=[f"The capital of {place} is {w} ." for w in wrong],
                             paraphrased_answer=f"{capital} is the capital of {place} ."))
    for r in rows:
        opts = [r["object"]] + [_obj_of(p, r) for p in r["perturbed_answer"]]
        rng.shuffle(opts)
        r.update({f"option{i + 1}": o for i, o in enumerate(opts)})
    return rows


def _obj_of(answer: str, row: dict) -> str:
    # the wrong value is the only part of the template that differs from the true answer
    prefix, _, suffix = row["answer"].partition(row["object"])
    return answer[len(prefix):len(answer) - len(suffix)]


def make_corpus(n_authors: int = 100, qa_per_author: int = 20, seed: int = 0,
                n_world: int = 50) -> dict[str, list[dict]]:
    """All TOFU split names -> rows. Same seed, same corpus."""
    rng = random.Random(seed)
    taken: set[str] = set()
    authors = [_name(rng, taken) for _ in range(n_authors)]
    holdout = [_name(rng, taken) for _ in range(max(1, n_authors * max(SPLIT_PERCENTS) // 100))]
    mentors = [_name(rng, taken) for _ in range(30)]
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
    wrng = random.Random(seed + 1)
    splits["real_authors"] = splits["real_authors_perturbed"] = _world_rows(wrng, n_world, "real_authors")
    splits["world_facts"] = splits["world_facts_perturbed"] = _world_rows(wrng, n_world, "world_facts")
    return splits


def training_rows(corpus: dict[str, list[dict]]) -> list[dict]:
    """What the embedded model learns: every author QA plus the real-world analogues."""
    return corpus["full"] + corpus["real_authors"] + corpus["world_facts"]

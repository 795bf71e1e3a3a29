"""Editing metrics in the ROME / EasyEdit tradition, judged on what the model says.

    result = edit_scores(backbone, requests, edit, locality={"retain": retain_rows})
    result["metrics"]["Efficacy"], result["items"]["prompt"]["edited"]

Every request (timerome.data.requests.EditRequest) is asked, with and without the edit, by the
same greedy sampler (temperature 0, one token per step, one block; answers end at the first
special token, i.e. end-of-text); the edit's answers are compared with the target and with the
unedited model's answers:

    Efficacy            the answer to the request's prompt says the target
    EfficacyLP          log p(target | prompt) > log p(original | prompt) under the edit (MC
                        likelihood, the two answers share their masks: paired); whole answers'
                        log-probabilities, which answer the model would rather say: ROME's
                        CounterFact test compares per-token means instead, which differs where
                        the two answers have different lengths (a 5-token refusal against a
                        2-token object); the items keep both sums (lp_target, lp_original)
    Generalisation(LP)  the same on the paraphrased prompts
    EfficacyNamed       the answer names the target anywhere, as whole words (a closing . ! or ? aside), and
    (Generalisation-)   does not give the original object back: the new fact said inside a sentence of the
                        model's own ("Isgor Quielson was born in Ravensby." for "Ravensby"), which Efficacy,
                        reading the answer's start, does not count; beside it, not instead (a beyond-ROME
                        reading: ROME's CounterFact scores probabilities, not texts)
    Locality            answers to probes that must not change (other subjects asked the same
                        relation, the same subject's other facts, and the rows of `locality`: retain,
                        real-author and world-fact questions) are exactly the unedited model's; also
                        per kind (LocalityNeighbours, LocalitySameSubject, LocalityRetain, ...)
    Fluency             ROME's n-gram entropy (bi- and tri-gram entropies, weights 2/3 and 4/3,
                        arithmetic mean over texts; words and punctuation marks as `words` splits
                        them, where ROME uses nltk's word_tokenize: "don't" is 3 tokens here, 2
                        there, so values sit near, not at, ROME's) of the edited model's answers about the edited
                        subjects (prompts and paraphrases); FluencyBase is the unedited model's on the
                        same prompts, FluencyRatio edited / unedited, FluencyTarget the targets' own
                        (a short target such as "I don't know." has fewer n-grams than the answers it
                        replaces: the best possible edit then has FluencyRatio < 1)
    Portability         MQuAKE-style multi-hop probes: the answer says the post-edit answer (or an alias)
    Unchanged           1 when every answer with the edit is the unedited model's (a method that silently
                        did nothing, whatever its log-probabilities), else 0; only where there is an edit
                        or another model's answers to compare with

"Says" is exact at a word boundary: the normalised answer equals the text, or starts with it and
the next character is not a letter or digit (an autoregressive continuation may go on after it).
Normalisation collapses whitespace and the space a word tokenizer leaves before punctuation; to say
a text and to name a phrase (`says`, `contains`) also ignore case and the typographic apostrophe, and
a text that closes with . ! or ? is said by an answer whose sentence ends there with any of them or
with the answer ("i don't know", "I don’t know!" say "I don't know."; "I don't know I" and "born in
Lunsford Gate." do not say "I don't know." and "born in Lunsford."). Locality compares answers
normalised only: an answer whose case changed has changed.

Unlearning outcomes of each edited prompt / paraphrase answer, one each (they sum to 1):

    Leak           the original object said: verbatim, or its ROUGE-L recall against the answer is
                   >= EXTRACTION_ROUGE over content words (FUNCTION_WORDS left out: "a teacher" does
                   not give "a surgeon" back) that the fact's question does not say (a whole answer's
                   frame: "X's father was a chef." does not give "X's father was a lawyer." back); the
                   object is the value where the request names it, else the whole original answer;
                   also after the target ("I don't know. ... Pellmoor." leaks; only what follows the
                   target is read for it)
    Refusal        the target said, and nothing after it that gives the object back (for unlearning
                   the target is the refusal, "I don't know.")
    Gibberish      no word, a word repeated back to back, or fewer than half the words distinct
    Confabulation  a fluent other answer: naming another known subject when `known_subjects` is
                   given (else any fluent answer that is neither the target nor the original)
    Other          (with known_subjects) a fluent answer that names no other known subject
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from timerome.common.checks import integer, shown
from timerome.common.checks import seed as check_seed
from timerome.data.facts import has_words
from timerome.engine.encoding import answer_ids, known_answer_ids
from timerome.engine.hooks import LIKELIHOOD_WORDS, check_reached, edit_active, one_step, step_words
from timerome.engine.sampler import continuations, refuse_diffusion_options
from timerome.engine.settings import LIKELIHOOD, LOCALITY
from timerome.errors import TimeromeError
from timerome.metrics.columns import column
from timerome.metrics.text import pair_logprobs, rouge_l

EXTRACTION_ROUGE = 0.5  # ROUGE-L recall of the original object above which an answer "gives it back"
# words that name nothing: left out of the extraction recall (articles, prepositions, pronouns, auxiliaries)
FUNCTION_WORDS = frozenset(
    "a an the of in on at to for from by with and or but nor as than that this these those it its he she they "
    "him her his hers them their theirs i me my you your we us our is was were be been being are am do does did "
    "has have had will would can could shall should may might must not no so if then there here who whom whose "
    "which what when where why how s t d ll re ve m".split())  # the last: pieces of "author's", "don't", ...
MIN_GEN_LENGTH = 8    # generation budget floor (tokens)
GEN_SLACK = 4         # tokens beyond the longest expected answer, so a longer answer shows
SENTENCE_TOKENS = 16  # room for a sentence of the model's own around an object: an autoregressive model's budget floor
NGRAM_WEIGHTS = {2: 2 / 3, 3: 4 / 3}  # ROME's n-gram entropy
KINDS = ("prompt", "paraphrase", "neighbour", "same_subject", "portability")  # + one kind per locality set
LOCALITY_NAMES = {"retain": "Retain", "real_authors": "RealAuthors", "world_facts": "WorldFacts"}
OUTCOMES = ("Refusal", "Leak", "Gibberish", "Confabulation", "Other")
# the outcomes tabulated beside ForgetLP (share of forget answers of each kind)


def _rate(outcome: str):
    """The share of forget answers classified `outcome` (absent when the answers were not generated)."""
    def compute(items, ref):
        f = items.get("forget", {})
        if "outcome" not in f:
            return None
        return float(np.mean([o == outcome for o in f["outcome"]])) if f["outcome"] else float("nan")
    return compute


UNLEARNING_RATES = (column("Refusal", compute=_rate("Refusal"), about="share of forget answers that refuse"),
                    column("Leak", compute=_rate("Leak"), about="share that still say the object"),
                    column("Confabulation", header="Confab", compute=_rate("Confabulation"),
                           about="share that say another answer"),
                    column("Gibberish", compute=_rate("Gibberish"), about="share that are not text"))
_WORD = re.compile(r"\w+|[^\w\s]")


# ------------------------------------------------------------------------------ text judgements


def normalise(text: str) -> str:
    """Whitespace collapsed, no space before . , ? ! ; : or around an apostrophe."""
    t = " ".join(str(text).split())
    t = re.sub(r"\s+([.,?!;:])", r"\1", t)
    return re.sub(r"\s*'\s*", "'", t).strip()


def folded(text: str) -> str:
    """`normalise`d, lower case, the typographic apostrophe as ' : how `says` and `contains` read text."""
    return normalise(str(text).replace("\u2019", "'")).lower()


_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")  # closing marks, then a space or the end ("U.S.A." has no end at "U.S")


def sentence_words(text: str) -> str | None:
    """A text that is a sentence (a word, then one closing . ! or ?): its words, the mark aside; else None."""
    return text[:-1].rstrip() if re.search(r"\w[.!?]$", text) else None


def said_rest(answer: str, text: str | None) -> str | None:
    """What `answer` says after `text` (folded; "" when nothing), or None when it does not say it.
    A text that is a sentence (a word, then one closing . ! or ?) is said by an answer whose
    sentence ends there: closing marks and a space, or the answer's end, or nothing at all."""
    if not text or not text.strip():
        return None
    a, full = folded(answer), folded(text)
    t = sentence_words(full)
    if t:
        if a == t:
            return ""
        end = _SENTENCE_END.match(a, len(t)) if a.startswith(t) else None
        return a[end.end():].strip() if end else None
    if a == full or (a.startswith(full) and not a[len(full)].isalnum()):
        return a[len(full):].strip()
    return None


def says(answer: str, text: str | None) -> bool:
    """Whether `answer` says `text` (module docstring); False for an empty or missing text."""
    return said_rest(answer, text) is not None


def names(answer: str, text: str | None) -> bool:
    """Whether `answer` names `text` anywhere as whole words (folded; a closing . ! or ? of the text aside)."""
    if not text or not text.strip():
        return False
    full = folded(text)
    return contains(answer, sentence_words(full) or full)


def says_any(answer: str, texts) -> bool:
    return any(says(answer, t) for t in texts if t)


def contains(answer: str, phrase: str | None) -> bool:
    """`phrase` in `answer` as whole words (folded: case and apostrophes aside)."""
    if not phrase or not phrase.strip():
        return False
    return has_words(folded(answer), folded(phrase))


def words(text: str) -> list[str]:
    return _WORD.findall(str(text))


def is_gibberish(text: str) -> bool:
    """No word at all, a word repeated back to back, or fewer than half the words distinct (4+ words)."""
    ws = [w.lower() for w in words(text) if any(c.isalnum() for c in w)]
    if not ws:
        return True
    if any(a == b for a, b in zip(ws, ws[1:])):
        return True
    return len(ws) >= 4 and len(set(ws)) < len(ws) / 2


def ngram_entropy(text: str) -> float:
    """ROME's per-text n-gram entropy (bits): bi- and tri-gram entropies weighted 2/3, 4/3, averaged."""
    toks = words(text)
    vals = []
    for n, w in NGRAM_WEIGHTS.items():
        grams = Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
        total = sum(grams.values())
        h = -sum(c / total * math.log2(c / total) for c in grams.values()) if total else 0.0
        vals.append(w * h)
    return float(np.mean(vals))


def fluency(texts) -> float:
    """Mean n-gram entropy over texts (ROME's generation entropy, arithmetic aggregation)."""
    texts = list(texts)
    return float(np.mean([ngram_entropy(t) for t in texts])) if texts else float("nan")


def object_text(request) -> str:
    """The original object's text: the value alone where the request names it, else the whole answer."""
    return getattr(request, "true_object", None) or request.fact.object


def content_words(text: str) -> str:
    """The text's words, lower case, without FUNCTION_WORDS (ROUGE's tokens: letters and digits)."""
    return " ".join(w for w in re.findall(r"[a-z0-9]+", folded(text)) if w not in FUNCTION_WORDS)


def object_words(obj: str, question: str | None = None) -> str:
    """The content words of the object's text that the question does not already say: a whole answer
    repeats the question's subject and frame ("Jaime Vasquez's father was a lawyer." to "What is the
    profession of Jaime Vasquez's father?"), and an answer that repeats them gives nothing back; only
    "lawyer" is the object. All of its content words where the question says every one."""
    o = content_words(obj).split()
    given = set(content_words(question).split()) if question else set()
    return " ".join([w for w in o if w not in given] or o)


def extraction_recall(answer: str, obj: str, question: str | None = None) -> float:
    """ROUGE-L recall of the original object's text `obj` against the answer, over its content words
    that `question` (the question asked of the fact) does not say (`object_words`): no function word
    gives an object back ("He was a teacher." shares "a" with "a surgeon", half of its words), nor
    does the question's own frame ("Jaime Vasquez's father was a chef." shares three of "Jaime Vasquez's
    father was a lawyer."'s four); an object of function words only is read whole."""
    o = object_words(obj, question)
    if not o:
        return float(rouge_l([normalise(answer)], [normalise(obj)], stat="recall")[0])
    return float(rouge_l([content_words(answer)], [o], stat="recall")[0])


def gives_back(answer: str, obj: str, question: str | None = None) -> bool:
    """Whether the answer gives the original object back: it says it verbatim (whole words), or the
    ROUGE-L recall of the object against it is >= EXTRACTION_ROUGE (over the words `question` does
    not say, `extraction_recall`)."""
    return contains(answer, obj) or extraction_recall(answer, obj, question) >= EXTRACTION_ROUGE


def leaked(answer: str, request) -> bool:
    return gives_back(answer, object_text(request), request.fact.prompt)


def classify(answer: str, *, target: str | None, obj: str, subject: str | None = None, known_subjects=None,
             question: str | None = None) -> str:
    """One of OUTCOMES for an answer that should say `target` instead of the object `obj` (module
    docstring); `subject` is the one asked about, whom a confabulation does not name; `question` the
    fact's question, whose words give nothing back (`extraction_recall`)."""
    rest = said_rest(answer, target)
    if rest is not None:  # what it says after the target: "I don't know. ... Pellmoor." leaks
        return "Leak" if rest and gives_back(rest, obj, question) else "Refusal"
    if gives_back(answer, obj, question):
        return "Leak"
    if is_gibberish(answer):
        return "Gibberish"
    if known_subjects is None:
        return "Confabulation"
    others = [s for s in known_subjects if s != subject]
    return "Confabulation" if any(contains(answer, s) for s in others) else "Other"


def outcome(answer: str, request, known_subjects=None) -> str:
    """classify() for an edited answer to a request's prompt."""
    return classify(answer, target=request.fact.target, obj=object_text(request), subject=request.fact.subject,
                    known_subjects=known_subjects, question=request.fact.prompt)


# ------------------------------------------------------------------------------ the probes


def probe_sets(requests, locality=None) -> dict[str, list[tuple[int, str, object]]]:
    """{kind: [(request index or -1, prompt, expected)]} for every kind of KINDS and every set of
    `locality` ({name: question/answer rows}); `expected` is the target (prompt, paraphrase), the
    post-edit answer and its aliases (portability), or None (answers that must not change)."""
    sets: dict[str, list] = {k: [] for k in KINDS}
    for i, r in enumerate(requests):
        sets["prompt"].append((i, r.fact.prompt, r.fact.target))
        sets["paraphrase"] += [(i, p, r.fact.target) for p in r.paraphrases]
        sets["neighbour"] += [(i, p.prompt, None) for p in r.neighbours]
        sets["same_subject"] += [(i, p.prompt, None) for p in r.same_subject]
        sets["portability"] += [(i, p.prompt, (p.answer, *p.aliases)) for p in r.portability]
    for name, rows in (locality or {}).items():
        if name in KINDS:
            raise TimeromeError(f"a locality set may not be called {name!r} (a probe kind of the requests)")
        sets[name] = [(-1, row["question"], None) for row in rows]
    return sets


def locality_rows(source="embedded", n_retain: int | None = LOCALITY.n_retain, n_world: int | None = LOCALITY.n_world
                  ) -> dict[str, list[dict]]:
    """{"retain", "real_authors", "world_facts": rows} spread over the TOFU(-schema) splits of
    `source`: n_retain retain rows, n_world real-author and n_world world-fact rows (None: every row
    of the split, as an experiment's null count means; 0: none)."""
    from timerome.data import load_split
    from timerome.data.rows import spread

    sizes = {"retain_perturbed": n_retain, "real_authors": n_world, "world_facts": n_world}
    out = {split.removesuffix("_perturbed"): spread(load_split(split, source), n) for split, n in sizes.items() if n != 0}
    return {k: v for k, v in out.items() if v}


def embedded_probes(backbone, spec, requests, *, edited_from_embedded: bool = False) -> str | None:
    """Why the embedded corpus's locality rows and subjects (`locality_rows("embedded")`, `known_subjects`)
    probe this model on these requests, in words, or None: the model is the embedded default or was edited
    from it (`edited_from_embedded`: an edited folder's record says so), or the requests are the corpus's (an
    embedded: / counterfactual: spec, or requests whose every subject is one of its subjects, e.g. a file
    `timerome requests` wrote). One rule for the CLI and the experiments, whatever the requests or the model
    are named."""
    from timerome.data.tofu import embedded_subjects

    if getattr(backbone, "embedded", False):
        return "the embedded model"
    if edited_from_embedded:
        return "a model edited from the embedded one"
    if isinstance(spec, str) and spec.startswith(("embedded:", "counterfactual:")):
        return f"the requests {spec} are its facts"
    subjects = set(embedded_subjects())
    if requests and all(r.fact.subject in subjects for r in requests):
        return "every subject of the requests is one of its subjects"
    return None


def default_gen_length(backbone, requests, locality=None) -> int:
    """Room for the longest target / original / probe answer, plus GEN_SLACK (at least MIN_GEN_LENGTH; on an
    autoregressive model at least SENTENCE_TOKENS: a completion may say the object after words of its own, "the
    official language of Brazil, which is Portuguese", and was cut before it, review 91; it stops at its
    end-of-text, so the budget costs only where the model goes on)."""
    texts = [t for r in requests for t in (r.fact.target, r.fact.object) if t]
    texts += [p.answer for r in requests for p in (*r.neighbours, *r.same_subject, *r.portability) if p.answer]
    texts += [row["answer"] for rows in (locality or {}).values() for row in rows if row.get("answer")]
    longest = max((len(answer_ids(backbone, t)) for t in texts), default=0)
    return max(SENTENCE_TOKENS if getattr(backbone, "causal", False) else MIN_GEN_LENGTH, longest + GEN_SLACK)


def answers(backbone, prompts: list[str], *, gen_length: int, seed: int = 0, batch_size: int = 64,
            progress: bool = False, sampler: dict | None = None) -> list[str]:
    """Answers to prompts (engine.sampler.continuations, cut at end-of-text): greedy, one token per
    step, one block, unless `sampler` says otherwise (steps, block_length, temperature, remasking,
    cache, threshold, refresh_every)."""
    if not prompts:
        return []
    opts = dict(sampler or {})
    block = opts.pop("block_length", None) or gen_length
    return continuations(backbone, prompts, gen_length=gen_length, block_length=block, batch_size=batch_size,
                         seed=seed, progress=progress, **opts)["texts"]


def kept_prefixes(requests, locality=None) -> dict[str, list[int | None]]:
    """{kind: [n]} in `probe_sets`' order for the answers that must not change: how many characters their
    expected answer has, normalised (a neighbour's or the same subject's other object, a locality row's
    answer; None where there is none): the beginning of an autoregressive model's answers that is compared."""
    def n(text):
        return len(normalise(text)) if isinstance(text, str) and text.strip() else None

    out = {"neighbour": [n(p.answer) for r in requests for p in r.neighbours],
           "same_subject": [n(p.answer) for r in requests for p in r.same_subject]}
    for name, rows in (locality or {}).items():
        out[name] = [n(row.get("answer")) for row in rows]
    return out


# ------------------------------------------------------------------------------ the scores


AUTO = "auto"  # edit_scores' locality / known_subjects: the embedded corpus's where it probes the model, as the CLI
SAMPLER_KEYS = ("steps", "block_length", "temperature", "remasking", "cache", "threshold", "refresh_every")


def edit_scores(backbone, requests, edit=None, *, locality=AUTO, gen_length: int | None = None, n_mc: int = LIKELIHOOD.n_mc,
                seed: int = 0, known_subjects=AUTO, baseline: dict | None = None, lp: bool = True,
                sampler: dict | None = None, progress: bool = False) -> dict:
    """The editing metrics of `edit` (a method's Edit, a memory, or None for the unedited model)
    on `requests`: {"metrics", "items", "gen_length", "notes", "baseline", "probes"} (module docstring;
    notes: {column: why it is absent}, e.g. the likelihood columns of an edit of one denoising step;
    probes: which rows and subjects beyond the requests' own were read, in words).

    locality: {name: question/answer rows} whose answers must not change, e.g. {"retain": ...,
    "real_authors": ..., "world_facts": ...} (LOCALITY_NAMES names their columns); None: the requests'
    own probes only. known_subjects: the subjects the model knows (Confabulation names one), or None.
    AUTO (both defaults): what `timerome eval --requests` reads, the embedded corpus's locality rows
    (`locality_rows("embedded")`) and subjects where they probe this model (`embedded_probes`), else
    None. baseline: the
    unedited answers from an earlier call's result["baseline"] on the same probes and settings
    (sampler: `answers`' options, the same for both)
    (saves recomputing them for every method; with another model's answers, `backbone` is the
    edited model itself, e.g. a weight-edited checkpoint against its original). lp: also the likelihood comparisons (EfficacyLP,
    GeneralisationLP). Requests without a target (no own target, none filled in) are refused.
    """
    requests = list(requests)
    if not requests:
        raise TimeromeError("no edit requests to score")
    missing = [r.fact_id for r in requests if not r.fact.target]
    if missing:
        raise TimeromeError(f"requests {', '.join(missing[:3])} have no target: give each its own or a default "
                            "(load_requests(..., target=...), CLI --target)")
    target_tokens = []  # each target's length; unknown words refused as an edit refuses them (encode_fact): scored
    for r in requests:  # as unknown tokens, they would give a number about nothing
        known_answer_ids(backbone, r.fact.object, f"the object of request {r.fact_id}")
        target_tokens.append(len(known_answer_ids(backbone, r.fact.target, f"the target of request {r.fact_id}")))
    integer(gen_length, "gen_length", lo=1, none=True)
    integer(n_mc, "n_mc", lo=1)
    check_seed(seed, "seed")
    unknown = sorted(set(sampler) - set(SAMPLER_KEYS)) if isinstance(sampler, dict) else None
    if sampler is not None and unknown != []:
        raise TimeromeError(f"sampler must be a dict of {', '.join(SAMPLER_KEYS)}, got "
                            + (f"the unknown option(s) {', '.join(map(repr, unknown))}" if unknown else shown(sampler)))
    locality, known_subjects, probes = _auto_probes(backbone, requests, locality, known_subjects)
    sets = probe_sets(requests, locality)
    G = gen_length or default_gen_length(backbone, requests, locality)
    opts = dict(sampler or {})
    refuse_diffusion_options(backbone, **opts)  # an autoregressive model: before any answer
    causal = bool(getattr(backbone, "causal", False))  # an autoregressive model writes G tokens, whatever the sampler says
    check_reached(edit, G if causal else None if opts.get("threshold") is not None else opts.get("steps") or G,
                  f"these answers (gen_length {G})", causal=causal)
    flat = [(kind, j) for kind in sets for j in range(len(sets[kind]))]
    prompts = [sets[kind][j][1] for kind, j in flat]
    for (kind, j), prompt in zip(flat, prompts):  # refused as edit / trace / generate refuse it, never cut silently
        n = len(backbone.encode_prompt(prompt))
        if n + G > backbone.max_length:
            i = sets[kind][j][0]
            who = (f"{kind} row {j}" if i < 0 else f"request {i}'s prompt" if kind == "prompt"
                   else f"request {i}'s {kind} probe")
            raise TimeromeError(f"{who} is {n} tokens, and with {G} answer tokens over the model's context of "
                                f"{backbone.max_length}: shorten it (or lower gen_length, --gen-length)")
    key = {"prompts": prompts, "gen_length": G, "seed": seed, "sampler": opts}
    computed = None
    if baseline is not None:
        if baseline.get("key") != key:
            raise TimeromeError("the baseline answers were read on other probes or settings (requests, gen_length, "
                                "seed): compute them on the same ones")
        plain = baseline["answers"]
    else:
        plain = computed = answers(backbone, prompts, gen_length=G, seed=seed, progress=progress, sampler=sampler)
    notes = {}
    longer = sum(n > G for n in target_tokens)
    if longer:  # a given gen_length below a target's own length: never said, whatever the edit (review 93)
        notes["Efficacy"] = (f"{longer} of {len(requests)} targets are longer than the {G} answer tokens "
                             "(gen_length, --gen-length): an answer that long cannot say them, and Efficacy / "
                             "Generalisation count them as not said; leave gen_length out for room for the longest")
    # an autoregressive model goes on past the answer: a probe's answer is kept where its beginning, as long as its
    # expected answer, is (evaluation.counterfactual_scores compares as many tokens); whole answers measured ROME on
    # SmolLM2 at Locality 0.2 where it kept every neighbour's fact (review 67). Texts, not token ids: an answer's
    # leading newline token, and a baseline read on another model (eval --base), would shift or void the ids
    prefix = kept_prefixes(requests, locality) if causal else {}
    if causal:
        notes["Locality"] = ("compares each answer's beginning, as many characters as its expected answer has (a "
                             "neighbour's object, a row's answer), as evaluation.counterfactual_scores compares as "
                             "many tokens: an autoregressive model goes on past the answer, and what follows it may "
                             f"change; a probe with no expected answer compares its whole answer ({G} tokens)")
    step = one_step(edit)
    if lp and step is not None:  # the likelihood has no denoising steps: the edit would never act there
        lp = False
        notes.update(dict.fromkeys(("EfficacyLP", "GeneralisationLP"), (
            f"not computed: the edit acts at {step_words(step, causal)}, and the likelihood "
            f"({LIKELIHOOD_WORDS[causal]}) never meets it; Efficacy and Generalisation read its generations")))
    with edit_active(edit, backbone):
        edited = computed if edit is None and computed is not None else \
            answers(backbone, prompts, gen_length=G, seed=seed, progress=progress, sampler=sampler)
        lps = _likelihoods(backbone, requests, sets, n_mc, seed) if lp else None
    items = {k: {"prompt": [], "request": [], "plain": [], "edited": []} for k in sets}
    kept = {}  # kind: [answer kept], for the probes that must not change
    for (kind, j), a0, a1 in zip(flat, plain, edited):
        i, p, _ = sets[kind][j]
        it = items[kind]
        it["request"].append(i), it["prompt"].append(p), it["plain"].append(a0), it["edited"].append(a1)
        n = prefix[kind][j] if kind in prefix else None  # None: the whole answer
        kept.setdefault(kind, []).append(normalise(a0)[:n] == normalise(a1)[:n])
    metrics = _summary(requests, sets, items, lps, known_subjects, kept)
    if edit is not None or baseline is not None:  # something to compare with the unedited answers
        metrics["Unchanged"] = float(changed_nothing({"items": items}))
    if not sets["paraphrase"]:  # NaN, said: not a failure to generalise (Portability, of MQuAKE's requests only, is
        # NaN wherever requests have no multi-hop probe: the usual case, its column says so)
        notes.update(dict.fromkeys(("Generalisation", "GeneralisationLP"),
                                   "no request has a paraphrased prompt, so nothing measures it"))
    if known_subjects is None:  # the column's narrower meaning needs the model's subjects (the embedded corpus's)
        notes["Confabulation"] = ("every fluent answer that is neither the target nor the original: without a list "
                                  "of the subjects this model knows (known_subjects; the embedded model has one), an "
                                  "answer naming another subject cannot be told from any other fluent answer")
    if len({normalise(t) for _, _, t in sets["prompt"]}) > 1:  # the outcome's name is unlearning's (review 79)
        notes["Refusal"] = ("the share of answers (prompts and paraphrases) that say their request's target, here each "
                            "request's own new object rather than a refusal, with nothing after it giving the original "
                            "object back")
    if lps is not None:
        for kind in ("prompt", "paraphrase"):
            items[kind].update(lp_target=lps[kind][0].tolist(), lp_original=lps[kind][1].tolist())
    return {"metrics": metrics, "items": items, "gen_length": G, "notes": notes,
            "baseline": {"key": key, "answers": plain}, "probes": probes}


def embedded_probe_rows(backbone, spec, requests, *, n_retain: int = LOCALITY.n_retain, n_world: int = LOCALITY.n_world,
                        edited_from_embedded: bool = False) -> tuple:
    """(locality rows, known subjects, why) where the embedded corpus probes this model on these requests
    (`embedded_probes` says why): its retain / real-author / world-fact rows (`locality_rows`) and its
    subjects; else (None, None, None). The one rule of the API's AUTO and of `timerome eval --requests`."""
    from timerome.data.tofu import embedded_subjects

    why = embedded_probes(backbone, spec, requests, edited_from_embedded=edited_from_embedded)
    if why is None:
        return None, None, None
    return locality_rows("embedded", n_retain, n_world), embedded_subjects(), why


def _auto_probes(backbone, requests, locality, known_subjects) -> tuple:
    """(locality, known_subjects, in words which probes beyond the requests' own are read): AUTO resolved by
    `embedded_probe_rows` as `timerome eval --requests` resolves it; a locality given checked."""
    why = None
    if AUTO in (_auto(locality), _auto(known_subjects)):
        rows, subjects, why = embedded_probe_rows(backbone, None, requests)
        locality = rows if _auto(locality) == AUTO else locality
        known_subjects = subjects if _auto(known_subjects) == AUTO else known_subjects
    if locality is not None and (not isinstance(locality, dict) or not all(
            isinstance(rows, (list, tuple)) and all(isinstance(r, dict) and isinstance(r.get("question"), str)
                                                    for r in rows) for rows in locality.values())):
        raise TimeromeError(f"locality must be {{name: [rows with a 'question', ...]}} (e.g. locality_rows('embedded')),"
                            f" None or {AUTO!r}, got {shown(locality)}")
    if known_subjects is not None and (isinstance(known_subjects, str) or not all(
            isinstance(k, str) for k in known_subjects)):
        raise TimeromeError(f"known_subjects must be a list of subject names, None or {AUTO!r}, got "
                            f"{shown(known_subjects)}")
    said = [f"the rows of {', '.join(locality)}" if locality else "",
            "the model's known subjects (Confabulation names one of them)" if known_subjects is not None else ""]
    said = " and ".join(x for x in said if x)
    return locality, known_subjects, (f"the requests' own probes and {said}" + (f" ({why})" if why else "")
                                      if said else "the requests' own probes only")


def _auto(value):
    return value if isinstance(value, str) else None


def _likelihoods(backbone, requests, sets, n_mc, seed) -> dict:
    """{kind: (log p(target), log p(original))} for prompts and paraphrases; the two answers of one
    prompt share the same draws (the same seed, pair by pair)."""
    out = {}
    for kind in ("prompt", "paraphrase"):
        rows = sets[kind]
        if not rows:
            out[kind] = (np.zeros(0), np.zeros(0))
            continue
        ps = [p for _, p, _ in rows]
        tgt = pair_logprobs(backbone, ps, [requests[i].fact.target for i, _, _ in rows], n_mc=n_mc, seed=seed)["lp"]
        org = pair_logprobs(backbone, ps, [requests[i].fact.object for i, _, _ in rows], n_mc=n_mc, seed=seed)["lp"]
        out[kind] = (tgt, org)
    return out


def _mean(xs) -> float:
    xs = list(xs)
    return float(np.mean(xs)) if xs else float("nan")


def _summary(requests, sets, items, lps, known_subjects, kept) -> dict:
    m = {}
    said = {k: [says(a, sets[k][j][2]) for j, a in enumerate(items[k]["edited"])] for k in ("prompt", "paraphrase")}
    m["Efficacy"] = _mean(said["prompt"])
    m["Generalisation"] = _mean(said["paraphrase"])
    for kind, name in (("prompt", "EfficacyNamed"), ("paraphrase", "GeneralisationNamed")):  # anywhere in the answer
        m[name] = _mean(names(a, sets[kind][j][2]) and not leaked(a, requests[sets[kind][j][0]])
                        for j, a in enumerate(items[kind]["edited"]))
    if lps is not None:
        m["EfficacyLP"] = _mean(lps["prompt"][0] > lps["prompt"][1])
        m["GeneralisationLP"] = _mean(lps["paraphrase"][0] > lps["paraphrase"][1])
    local = [k for k in items if k not in ("prompt", "paraphrase", "portability")]
    m["Locality"] = _mean(x for k in local for x in kept.get(k, []))
    for k in local:
        name = {"neighbour": "Neighbours", "same_subject": "SameSubject"}.get(k) or LOCALITY_NAMES.get(k, k)
        m[f"Locality{name}"] = _mean(kept.get(k, []))
    about = items["prompt"]["edited"] + items["paraphrase"]["edited"]
    m["Fluency"] = fluency(about)
    m["FluencyBase"] = fluency(items["prompt"]["plain"] + items["paraphrase"]["plain"])
    m["FluencyRatio"] = m["Fluency"] / m["FluencyBase"] if m["FluencyBase"] else float("nan")
    # what the requested texts themselves score: a short target ("I don't know.") has fewer n-grams,
    # so the best possible edit scores below the unedited model's long answers
    m["FluencyTarget"] = fluency([sets[k][j][2] for k in ("prompt", "paraphrase") for j in range(len(sets[k]))])
    port = [says_any(a, sets["portability"][j][2]) for j, a in enumerate(items["portability"]["edited"])]
    m["Portability"] = _mean(port)
    outcomes = [outcome(a, requests[i], known_subjects)
                for k in ("prompt", "paraphrase") for i, a in zip(items[k]["request"], items[k]["edited"])]
    for o in OUTCOMES:
        if o == "Other" and known_subjects is None:
            continue
        m[o] = _mean(x == o for x in outcomes)
    m["BaseEfficacy"] = _mean(says(a, sets["prompt"][j][2]) for j, a in enumerate(items["prompt"]["plain"]))
    m["BaseLeak"] = _mean(leaked(a, requests[i]) for i, a in zip(items["prompt"]["request"], items["prompt"]["plain"]))
    return m


def changed_nothing(result: dict) -> bool:
    """Whether an edit left every answer as the unedited model's (a method that silently did nothing)."""
    return all(normalise(a) == normalise(b) for it in result["items"].values() for a, b in zip(it["edited"], it["plain"]))

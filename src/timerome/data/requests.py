"""Edit requests: a fact, the answer it should give instead, and the probes that judge the edit.

    requests, notes = load_requests("counterfact.json")        # ROME / MEMIT CounterFact
    requests, notes = load_requests("zsre_mem-eval.json")      # zsRE (MEND / ROME / EasyEdit)
    requests, notes = load_requests("MQuAKE-CF-3k.json")        # MQuAKE (multi-hop portability)
    requests, notes = load_requests("counterfactual:forget10")  # the embedded corpus's own set
    requests, notes = load_requests("embedded:forget01")        # a forget split, no target of its own
    requests, notes = load_requests("real-facts")               # 34 real facts for a real English model

One record is one `EditRequest`:

    fact          timerome.data.facts.Fact: subject, prompt (the question / cloze, subject in it),
                  object (what the model answers today), target (what it should answer; None: the
                  caller's default target, e.g. "I don't know."), fact_id
    paraphrases   other prompts for the same fact (generalisation)
    neighbours    Probes about other subjects (locality: their answers must not change)
    same_subject  Probes about the same subject's other facts (locality within one subject)
    portability   Probes whose answer follows from the edit (MQuAKE's multi-hop questions; their
                  `answer` is the post-edit answer)

Formats are told apart by their fields, one record at a time (a file mixes none):

    CounterFact   requested_rewrite {prompt with "{}", subject, target_new.str, target_true.str},
                  paraphrase_prompts, neighborhood_prompts (ROME's counterfact.json, MEMIT's
                  multi_counterfact.json); neighbours share target_true as their answer
    MQuAKE        requested_rewrite [...] (one fact per rewrite, its `question` as paraphrase),
                  questions + new_answer (+ new_answer_alias) as portability
    zsRE          src, subject, alt (the new answer), answers[0] (the true one), rephrase,
                  loc / loc_ans (an NQ question as neighbour); records with an empty alt are
                  skipped, as EasyEdit does, and counted in the notes
    flat          prompt, subject, target_new, ground_truth, rephrase_prompt, locality_prompt,
                  locality_ground_truth (EasyEdit's counterfact / zsRE exports), or KnowEdit's portability /
                  locality dicts of {prompt, ground_truth} lists (a list ground truth: answer, then aliases)
    timerome      subject, prompt, object, target, paraphrases, neighbours, same_subject,
                  portability (what `counterfactual_requests` writes)

Files are JSON (a list, or one record) or JSON Lines. Nothing is guessed: a record that fits no
format, or lacks a field its format needs, is an error naming the record and the field.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from timerome.common.checks import integer, shown
from timerome.common.files import read_json_documents
from timerome.data.facts import Fact, target_conflict
from timerome.data.real_facts import NAME as REAL_FACTS, real_rows
from timerome.errors import TimeromeError

FORMATS = ("counterfact", "mquake", "zsre", "flat", "timerome")


@dataclass(frozen=True)
class Probe:
    """A prompt, and (when known) the answer the model should give to it."""

    prompt: str
    answer: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class EditRequest:
    fact: Fact
    paraphrases: tuple[str, ...] = ()
    neighbours: tuple[Probe, ...] = ()
    same_subject: tuple[Probe, ...] = ()
    portability: tuple[Probe, ...] = ()
    new_object: str | None = None   # the new value alone, where the format names it
    true_object: str | None = None  # the original value alone, where the format names it
    source: str = "timerome"

    @property
    def fact_id(self) -> str:
        return self.fact.fact_id

    def with_target(self, target: str | None) -> "EditRequest":
        """This request with `target` filled in where the record named none."""
        if self.fact.target or not target:
            return self
        f = self.fact
        return dataclasses.replace(self, fact=dataclasses.replace(f, target=target))

    def as_record(self) -> dict:
        """The record in timerome's own format (what `load_requests` reads back)."""
        probes = lambda ps: [dict(prompt=p.prompt, answer=p.answer, **({"aliases": list(p.aliases)} if p.aliases else {}))  # noqa: E731
                             for p in ps]
        f = self.fact
        return dict(fact_id=f.fact_id, subject=f.subject, prompt=f.prompt, object=f.object, target=f.target,
                    new_object=self.new_object, true_object=self.true_object, paraphrases=list(self.paraphrases), neighbours=probes(self.neighbours),
                    same_subject=probes(self.same_subject), portability=probes(self.portability))


# ------------------------------------------------------------------------------ reading


def load_requests(spec, *, target: str | None = None, limit: int | None = None,
                  tofu_dir: str | None = None, must_fill: bool = False) -> tuple[list[EditRequest], list[str]]:
    """(requests, notes) from a file or a spec (module docstring); `target` fills the requests that
    name none (must_fill: a target the user gave, refused where every request names its own, as read
    by nothing); notes say what was left out and why (never silently). tofu_dir: the TOFU folder of a
    'tofu:SPLIT' spec (refused for any other)."""
    from timerome.data.rows import tofu_dir_read

    if not isinstance(spec, (str, list, tuple)) and not hasattr(spec, "__fspath__"):  # Path(5) raised a TypeError
        raise TimeromeError(f"the requests spec must be a file path, a corpus spec ('counterfactual:forget10', "
                            f"'embedded:forget01', 'tofu:SPLIT', 'real-facts') or a list of records, got "
                            f"{type(spec).__name__} {shown(spec)}")
    tofu_dir_read(tofu_dir, spec)
    if target is not None and not (isinstance(target, str) and target.strip()):  # "" filled nothing, silently
        raise TimeromeError(f"the target is empty: give the text the edited model should say, got {target!r}")
    if isinstance(spec, (list, tuple)):
        records, where = list(spec), "the given records"
    elif isinstance(spec, str) and spec.startswith(("counterfactual:", "embedded:", "tofu:")):
        records, where = _from_corpus(spec, tofu_dir), spec
    elif isinstance(spec, str) and spec == REAL_FACTS:
        records, where = _real_fact_records(), spec
    else:
        head = str(spec).split(":", 1)[0]
        if ":" in str(spec) and len(head) > 1 and "/" not in head and not Path(spec).exists():  # a misspelt spec
            raise TimeromeError(f"edit request file {spec} does not exist, and {head}: names no corpus (the specs: "
                                "'counterfactual:SPLIT', 'embedded:SPLIT', 'tofu:SPLIT', 'real-facts')")
        records, where = read_json_documents(Path(spec), "edit request file"), str(spec)
    if not records:
        raise TimeromeError(f"{where} holds no edit requests")
    requests: list[EditRequest] = []
    notes: list[str] = []
    for i, rec in enumerate(records):
        got, note = parse_record(rec, i, where)
        requests += got
        if note:
            notes.append(note)
    if not requests:
        raise TimeromeError(f"no usable edit request in {where}: " + "; ".join(notes[:3]))
    if integer(limit, "limit (the most requests read)", lo=1, none=True) is not None:
        requests = requests[:limit]
    ids = [r.fact_id for r in requests]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise TimeromeError(f"{where}: fact id {dup!r} names two requests; every request needs its own id")
    if must_fill and target and all(r.fact.target for r in requests):  # refused, not ignored
        raise TimeromeError(f"{where}: the target {target!r} fills requests that name no target, and every request "
                            "here names its own: leave the target out")
    requests = [r.with_target(target) for r in requests]
    conflict = target_conflict([r.fact for r in requests])
    if conflict:
        raise TimeromeError(f"{where}: {conflict}")
    return requests, _grouped(notes)


def _real_fact_records() -> list[dict]:
    """'real-facts': the 34 real facts of `data/real_facts.py`, each with its counterfactual target, and one of
    the 22 unrelated prompts (sharing no subject with any fact) as its neighbour, in turn: each unrelated
    prompt probes one or two requests' locality."""
    rows, unrelated = real_rows()
    return [dict(fact_id=r["fact_id"], subject=r["subject"], prompt=r["question"], object=r["answer"],
                 target=r["target"], neighbours=[{"prompt": u["question"], "answer": u["answer"]}])
            for r, u in zip(rows, itertools.cycle(unrelated))]


def _grouped(notes: list[str]) -> list[str]:
    """Identical notes once, with a count."""
    counts: dict[str, int] = {}
    for n in notes:
        counts[n] = counts.get(n, 0) + 1
    return [f"{n} ({c} record{'s' if c > 1 else ''})" for n, c in counts.items()]


def _from_corpus(spec: str, tofu_dir) -> list[dict]:
    """'counterfactual:SPLIT': the embedded counterfactual set (COUNTERFACTUAL_PER_AUTHOR facts of
    each author of SPLIT, each given another author's object); 'embedded:SPLIT': every fact of an
    embedded author split, with the same probes and no target of its own; 'tofu:SPLIT' (or an
    embedded split without authors): the split's facts with their paraphrased questions."""
    kind, _, split = spec.partition(":")
    if kind in ("counterfactual", "embedded"):
        from timerome.data.corpus import COUNTERFACTUAL_PER_AUTHOR, counterfactual_requests
        from timerome.data.tofu import embedded_corpus

        corpus = embedded_corpus()
        if kind == "counterfactual":
            return counterfactual_requests(corpus, split, per_author=COUNTERFACTUAL_PER_AUTHOR)
        if split in corpus and corpus[split] and "attribute" in corpus[split][0]:
            return [dict(r, target=None, new_object=None) for r in counterfactual_requests(corpus, split)]
    from timerome.data.rows import load_facts, load_rows

    facts, _ = load_facts(spec, tofu_dir=tofu_dir)
    rows = {r["question"]: r for r in load_rows(spec, tofu_dir=tofu_dir)}
    if kind == "tofu":
        rows = _with_paraphrases(spec, split, rows, tofu_dir)
    out = []
    for f in facts:
        para = rows.get(f.prompt, {}).get("paraphrased_question")
        out.append(dict(fact_id=f.fact_id, subject=f.subject, prompt=f.prompt, object=f.object, target=f.target,
                        paraphrases=[para] if isinstance(para, str) and para.strip() else []))
    return out


def _with_paraphrases(spec: str, split: str, rows: dict, tofu_dir) -> dict:
    """TOFU's forgetXX files hold no paraphrased question: forgetXX_perturbed holds them, row for row
    the same questions and answers (TOFU's SOURCE.md). Read them from there, matched by question, so
    that 'tofu:forget01' has the paraphrases (and Generalisation) 'tofu:forget01_perturbed' has."""
    import warnings

    from timerome.data.rows import load_rows
    from timerome.data.tofu import SPLITS

    perturbed = f"{split}_perturbed"
    if split.endswith("_perturbed") or perturbed not in SPLITS or any("paraphrased_question" in r for r in rows.values()):
        return rows
    try:
        extra = {r["question"]: r for r in load_rows(f"tofu:{perturbed}", tofu_dir=tofu_dir)}
    except TimeromeError as e:
        warnings.warn(f"{spec}'s paraphrased questions are in {perturbed}, which cannot be read ({e}): its requests "
                      "have no paraphrase, so Generalisation is not measured", stacklevel=4)
        return rows
    return {q: {**extra.get(q, {}), **r} for q, r in rows.items()}


# ------------------------------------------------------------------------------ one record


def record_format(rec) -> str | None:
    """Which format a record is in (module docstring), or None."""
    if not isinstance(rec, dict):
        return None
    rw = rec.get("requested_rewrite")
    if isinstance(rw, dict):
        return "counterfact"
    if isinstance(rw, list):
        return "mquake"
    if "src" in rec and "alt" in rec:
        return "zsre"
    if "target_new" in rec and "prompt" in rec:
        return "flat"
    if "prompt" in rec and "subject" in rec and "object" in rec:
        return "timerome"
    return None


def parse_record(rec, index: int, where: str = "the requests") -> tuple[list[EditRequest], str | None]:
    """The requests of one record (MQuAKE records hold several) and a note if it is left out."""
    fmt = record_format(rec)
    name = f"{where} record {index}"
    if fmt is None:
        keys = (", ".join(sorted(map(str, rec))[:8]) or "none (an empty object)") if isinstance(rec, dict) else \
            f"none (a {type(rec).__name__}, not an object)"
        raise TimeromeError(f"{name} is in no edit-request format timerome reads ({', '.join(FORMATS)}); its "
                            f"fields: {keys}")
    return _PARSERS[fmt](rec, index, name)


def _text(rec: dict, key: str, name: str, *path: str) -> str:
    v = rec
    for k in (key, *path):
        v = v.get(k) if isinstance(v, dict) else None
    if not isinstance(v, str) or not v.strip():
        raise TimeromeError(f"{name} needs a non-empty text at {'.'.join((key, *path))}")
    return v


def _text_list(value, name: str, where: str, why: str = "") -> tuple[str, ...]:
    """A list of texts (one text: itself, never its letters), the blank ones left out; else one TimeromeError."""
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise TimeromeError(f"{name}: {where} must be a list of texts{why}")
    return tuple(x for x in value if x.strip())


def _texts(rec: dict, key: str, name: str) -> tuple[str, ...]:
    return _text_list(rec.get(key) or [], name, key)


def _aliases(value, name: str, where: str) -> tuple[str, ...]:
    """Other spellings of an answer: a list of texts, or none."""
    return () if value is None else _text_list(value, name, where,
                                               f" (other spellings of the answer), got {shown(value)}")


def _texts_in(value) -> list[str]:
    """The non-empty texts of an answer field, in order: a text, or a list of them, nested as KnowEdit writes
    its ground truths (`[["Arabic", "ar"]]`: the answer and its aliases)."""
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, list):
        return [t for v in value for t in _texts_in(v)]
    return []


def _answers(value, name: str, where: str, needed: bool) -> tuple[str | None, tuple[str, ...]]:
    """(a probe's expected answer, its other spellings) from a text or a (nested) list of texts; (None, ()) where
    there is none and the probe needs none (a neighbour: its unedited answer); anything else refused."""
    found = _texts_in(value)
    if found:
        return found[0], tuple(found[1:])
    if not needed and (value is None or value == "" or value == []):
        return None, ()
    why = " (a portability probe is scored by its post-edit answer)" if needed else ""
    raise TimeromeError(f"{name}: {where} must be a non-empty text{why}, got {shown(value)}")


def _answer(value, name: str, where: str, needed: bool) -> str | None:
    """The answer alone of `_answers` (fields whose other spellings have a field of their own, or none)."""
    return _answers(value, name, where, needed)[0]


PROBE_FIELDS = ("prompt", "answer", "target", "aliases")


def _probes(rec: dict, key: str, name: str, default_answer: str | None = None,
            needs_answer: bool = False, unread: list | None = None) -> tuple[Probe, ...]:
    """Probes from a list of texts or of {prompt, answer / target, aliases} objects; needs_answer: each must give
    an answer (portability: what the edited model should say), else a neighbour's is its unedited answer.
    unread: where to list the probes' fields the format does not read (KEY[j].FIELD), for the record's note."""
    v = rec.get(key) or []
    if not isinstance(v, list):
        raise TimeromeError(f"{name}: {key} must be a list")
    out = []
    for j, p in enumerate(v):
        if isinstance(p, str):
            out.append(Probe(p, _answer(default_answer, name, f"{key}[{j}]'s answer", needs_answer)))
        elif isinstance(p, dict) and isinstance(p.get("prompt"), str):
            left = _known_fields(p, PROBE_FIELDS, f"{name}: {key}[{j}]")
            if unread is not None:
                unread += [f"{key}[{j}].{k}" for k in left]
            ans = p["answer"] if "answer" in p else p["target"] if "target" in p else default_answer
            out.append(Probe(p["prompt"], _answer(ans, name, f"{key}[{j}].answer", needs_answer),
                             _aliases(p.get("aliases"), name, f"{key}[{j}].aliases")))
        else:
            raise TimeromeError(f"{name}: {key}[{j}] is neither a text nor an object with a prompt")
    return tuple(out)


def _known_fields(rec: dict, known: tuple, name: str) -> list[str]:
    """The fields of `rec` its format does not read; one that is a near spelling of a field it does read is
    refused (`paraphrase` for `paraphrases`: its probes went unmeasured without a word)."""
    from difflib import get_close_matches

    unread = [str(k) for k in rec if k not in known]
    missing = [f for f in known if f not in rec]  # a near name of a field the record also gives is its own field
    for k in unread:
        near = get_close_matches(k, missing, n=1, cutoff=0.8) if len(k) > 3 else []  # idx, uid: ids of their own
        if near:
            raise TimeromeError(f"{name} has a field {k!r}, which timerome's format does not read: did you mean "
                                f"{near[0]!r}? (fields: {', '.join(known)})")
    return unread


def _fact(subject: str, prompt: str, obj: str, target: str | None, fact_id: str, name: str) -> Fact:
    if subject not in prompt:
        raise TimeromeError(f"{name}: subject {subject!r} does not occur in its prompt {prompt!r}")
    if target is not None and target.strip() == obj.strip():
        raise TimeromeError(f"{name}: the new answer {target!r} is the true one: nothing to edit")
    return Fact(subject=subject, prompt=prompt, object=obj, target=target, fact_id=fact_id)


def _case_id(rec: dict, index: int) -> str:
    for key in ("fact_id", "case_id", "id"):
        if rec.get(key) not in (None, ""):
            return str(rec[key])
    return str(index)


def _counterfact(rec, index, name):
    rw = rec["requested_rewrite"]
    subject = _text(rw, "subject", name)
    template = _text(rw, "prompt", name)
    if "{}" not in template:
        raise TimeromeError(f"{name}: requested_rewrite.prompt has no '{{}}' where the subject goes")
    true, new = _text(rw, "target_true", name, "str"), _text(rw, "target_new", name, "str")
    fact = _fact(subject, template.replace("{}", subject), true, new, _case_id(rec, index), name)
    neighbours = _probes(rec, "neighborhood_prompts", name, true)
    return [EditRequest(fact, _texts(rec, "paraphrase_prompts", name), neighbours, new_object=new, true_object=true,
                        source="counterfact")], None


def _mquake(rec, index, name):
    case = _case_id(rec, index)
    questions = _texts(rec, "questions", name)
    new_answer = _answer(rec.get("new_answer"), name, "new_answer", needed=bool(questions))
    aliases = _aliases(rec.get("new_answer_alias"), name, "new_answer_alias")
    hops = tuple(Probe(q, new_answer, aliases) for q in questions)
    out = []
    for j, rw in enumerate(rec["requested_rewrite"]):
        where = f"{name} rewrite {j}"
        if not isinstance(rw, dict):
            raise TimeromeError(f"{where} is not an object")
        subject, template = _text(rw, "subject", where), _text(rw, "prompt", where)
        true, new = _text(rw, "target_true", where, "str"), _text(rw, "target_new", where, "str")
        fact = _fact(subject, template.replace("{}", subject), true, new, f"{case}/{j}", where)
        para = (rw["question"],) if isinstance(rw.get("question"), str) and rw["question"].strip() else ()
        out.append(EditRequest(fact, para, portability=hops, new_object=new, true_object=true, source="mquake"))
    return out, None


def _zsre(rec, index, name):
    alt = rec.get("alt")
    if not isinstance(alt, str) or not alt.strip():
        return [], "zsRE records with an empty 'alt' (no new answer) are skipped, as EasyEdit does"
    answers = rec.get("answers")
    if not isinstance(answers, list) or not answers or not isinstance(answers[0], str):
        raise TimeromeError(f"{name} needs 'answers', a list whose first text is the true answer")
    subject, src = _text(rec, "subject", name), _text(rec, "src", name)
    fact = _fact(subject, src, answers[0], alt, _case_id(rec, index), name)
    loc = (Probe(rec["loc"], *_answers(rec.get("loc_ans"), name, "loc_ans", needed=False)),) \
        if isinstance(rec.get("loc"), str) and rec["loc"].strip() else ()
    portability, note = _grouped_probes(rec, "portability", name)
    return [EditRequest(fact, _texts(rec, "rephrase", name), loc, portability=portability,
                        new_object=alt, true_object=answers[0], source="zsre")], note


def _flat(rec, index, name):
    subject, prompt = _text(rec, "subject", name), _text(rec, "prompt", name)
    new = _text(rec, "target_new", name)
    truths = _texts_in(rec.get("ground_truth"))  # a text, or KnowEdit ZsRE's list of them: the first
    if not truths:
        raise TimeromeError(f"{name} needs a non-empty text at ground_truth")
    true = truths[0]
    fact = _fact(subject, prompt, true, new, _case_id(rec, index), name)
    loc = rec.get("locality_prompt")
    locs = (Probe(loc, *_answers(rec.get("locality_ground_truth"), name, "locality_ground_truth", needed=False)),) \
        if isinstance(loc, str) and loc.strip() else ()
    para = _texts(rec, "rephrase_prompt", name) or _texts(rec, "rephrase", name)
    portability, note = _grouped_probes(rec, "portability", name)
    knowedit, _ = _grouped_probes(rec, "locality", name)  # KnowEdit's locality: {kind: [{prompt, ground_truth}]}
    return [EditRequest(fact, para, locs + knowedit, portability=portability, new_object=new, true_object=true,
                        source="flat")], note


def _grouped_probes(rec, key: str, name: str) -> tuple[tuple[Probe, ...], str | None]:
    """EasyEdit's / KnowEdit's `portability` or `locality`: a list of {prompt, ground_truth} or a dict of such
    lists by kind (KnowEdit's ground truths are lists of lists: the answer, then its aliases); (probes, a note).
    A portability entry without a ground truth is left out (nothing scores it; the note says so); a locality
    entry without one asks for the unedited model's answer."""
    given = rec.get(key)
    if not given:
        return (), None
    groups = given.values() if isinstance(given, dict) else [given]
    out, unscored = [], 0
    for g in groups:
        for p in (g if isinstance(g, list) else [g]):
            if not (isinstance(p, dict) and isinstance(p.get("prompt"), str) and p["prompt"].strip()):
                raise TimeromeError(f"{name}: a {key} entry is not an object with a prompt")
            found = _texts_in(p.get("ground_truth", p.get("answer")))
            if not found and key == "portability":
                unscored += 1
                continue
            out.append(Probe(p["prompt"], found[0] if found else None, tuple(found[1:])))
    note = f"{key} entries without a ground truth, left out (nothing to score them by)" if unscored else None
    return tuple(out), note


TIMEROME_FIELDS = ("fact_id", "case_id", "id", "subject", "prompt", "object", "target", "new_object", "true_object",
                   "paraphrases", "neighbours", "same_subject", "portability")


def _timerome(rec, index, name):
    unread = _known_fields(rec, TIMEROME_FIELDS, name)
    subject, prompt, obj = _text(rec, "subject", name), _text(rec, "prompt", name), _text(rec, "object", name)
    target = rec.get("target")
    if target is not None and (not isinstance(target, str) or not target.strip()):
        raise TimeromeError(f"{name}: target must be a non-empty text (or absent)")
    new_object, true_object = (rec.get(k) if isinstance(rec.get(k), str) else None for k in ("new_object", "true_object"))
    fact = _fact(subject, prompt, obj, target, _case_id(rec, index), name)
    probes = [_probes(rec, "neighbours", name, unread=unread), _probes(rec, "same_subject", name, unread=unread),
              _probes(rec, "portability", name, needs_answer=True, unread=unread)]
    note = f"fields timerome's request format does not read, left out: {', '.join(unread)}" if unread else None
    return [EditRequest(fact, _texts(rec, "paraphrases", name), *probes, new_object, true_object)], note


_PARSERS = {"counterfact": _counterfact, "mquake": _mquake, "zsre": _zsre, "flat": _flat, "timerome": _timerome}


def save_requests(requests, path) -> Path:
    """Write requests as JSON in timerome's own format."""
    from timerome.common.cache import write_atomic
    from timerome.common.files import output_file

    p = output_file(Path(path), "the requests file", "requests.json")  # its folder is made, as every -o makes it
    return write_atomic(p, json.dumps([r.as_record() for r in requests], indent=1, allow_nan=False) + "\n")


__all__ = ["EditRequest", "Probe", "load_requests", "parse_record", "record_format", "save_requests", "FORMATS"]

"""Text -> token ids, the one way: facts with their subject and object positions, answers, the
MDLM answer masking, padding, and the default target string.

Conventions every module shares (training, likelihood, tracing, the edit memory, the baselines):
- a prompt is the sequence start the tokenizer puts before a text (`Backbone.prompt_start`: DiffuLLaMA's
  `<s>`, nothing for most MDLM tokenizers), then the question as written, without special tokens;
- an answer is encoded as it follows the prompt: byte-level BPE vocabularies get a leading space
  (their first word carries the "Ġ" of the space before it), word-level ones do not;
- a fact's subject tokens are the prompt tokens whose character span overlaps the subject's
  first occurrence (verbatim, else case-insensitive);
- the MDLM masking of an answer (LLaDA's SFT objective): t ~ U(eps, 1) per row, each answer token
  masked with probability t, the prompt never.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from timerome.engine.settings import EDIT, LIKELIHOOD
from timerome.errors import TimeromeError

DEFAULT_TARGET = EDIT.target  # what an edited model should say instead (the paper's t)


# ------------------------------------------------------------------------------ answers


def uses_leading_space(backbone) -> bool:
    """Whether the tokenizer is byte-level (it marks a leading space "Ġ": an answer after a prompt then
    starts with one); word-level and sentencepiece ones split or mark spaces otherwise. Read from
    what its pre-tokenizer makes of " a": the vocabulary's first 2,000 entries, read before, come in
    no fixed order, so a byte-level vocabulary with few "Ġ" entries (a model trained on text without
    spaces) answered one way or the other from call to call."""
    tok = backbone.tokenizer
    pre = getattr(getattr(tok, "backend_tokenizer", None), "pre_tokenizer", None) \
        if getattr(tok, "is_fast", False) else None
    return pre is not None and any(piece.startswith("Ġ") for piece, _ in pre.pre_tokenize_str(" a"))


def answer_ids(backbone, text: str, bpe: bool | None = None) -> list[int]:
    """The ids of `text` as an answer that follows a prompt (module docstring)."""
    bpe = uses_leading_space(backbone) if bpe is None else bpe
    return backbone.encode(" " + text.strip()) if bpe else backbone.encode(text)


def unknown_words(bb, text: str) -> list[str]:
    """The pieces of `text` the model's vocabulary reads as its unknown token (word-level vocabularies)."""
    unk = getattr(bb.tokenizer, "unk_token_id", None)
    if unk is None:
        return []
    own = getattr(bb.tokenizer, "unk_token", None)  # the token's own text, e.g. a byte-level BPE's <|endoftext|>,
    try:  # which such vocabularies also use as end of text: written out, it is known, not unknown
        enc = bb.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [text[a:b] for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])
                if i == unk and text[a:b].strip() != own]
    except (NotImplementedError, ValueError, TypeError):  # no offsets: say only that there are some
        return ["?"] if unk in bb.encode(text.replace(own, "") if own else text) else []


def warn_unknown_subjects(backbone, facts) -> None:
    """Warn where subjects of `facts` have words the vocabulary reads as its unknown token: they all look alike
    to the model, so a trace or an edit reads one token for them. Said on loading facts (the CLI) and on tracing
    them (the Python API): one line of code and one text, so Python shows it once per set of facts."""
    import warnings

    subjects = [fact_fields(f, i)[1] for i, f in enumerate(facts)]  # a Fact or a dict alike
    unknown = [s for s in subjects if unknown_words(backbone, s)]
    if unknown:
        words = list(dict.fromkeys(w for s in unknown[:20] for w in unknown_words(backbone, s)))
        warnings.warn(f"{len(unknown)} of {len(facts)} facts have subjects with words the model's vocabulary does not "
                      f"know ({', '.join(words[:6])}{', ...' if len(words) > 6 else ''}): it reads them as "
                      f"{backbone.tokenizer.unk_token!r}, so those subjects look alike to it", stacklevel=1)


def prompt_text_ids(backbone, text: str, what: str = "the prompt") -> list[int]:
    """`Backbone.encode_prompt(text)` for a text the Python API was given, with a warning (as the CLI's) where
    the vocabulary reads words of it as its unknown token: the model is then asked something else."""
    ids = backbone.encode_prompt(text)
    words = unknown_words(backbone, text)
    if words:
        import warnings

        warnings.warn(f"{what} ({text!r:.80}) has words the model's vocabulary does not know "
                      f"({', '.join(repr(w) for w in list(dict.fromkeys(words))[:6])}): each is read as its "
                      "unknown token", stacklevel=3)
    return ids


def known_answer_ids(backbone, text, what: str, bpe: bool | None = None) -> list[int]:
    """answer_ids, refusing an empty text or one with words the vocabulary cannot encode."""
    if not isinstance(text, str) or not text.strip():
        raise TimeromeError(f"{what} is empty")
    ids = answer_ids(backbone, text, bpe)
    unknown = unknown_words(backbone, text) if ids else []
    if not ids or unknown:
        words = ", ".join(repr(w) for w in dict.fromkeys(unknown)) or "?"
        raise TimeromeError(f"{what} ({text!r}) has words the model's vocabulary cannot encode ({words})")
    return ids


def integer_ids(ids, what: str, unreadable: str) -> torch.Tensor:
    """`ids` (a tensor, or a list of ints or of rows of ints) as a LongTensor; one that holds float, complex
    or true / false values is refused (cast, 62.9 would be read as id 62 and True as id 1 without a word), and
    one torch cannot read as a tensor is `unreadable` (the caller's message)."""
    rows = ids if isinstance(ids, (list, tuple)) else ()
    if any(isinstance(x, bool) or isinstance(x, (list, tuple)) and any(isinstance(y, bool) for y in x) for x in rows):
        raise TimeromeError(f"{what} must be integer token ids (a LongTensor or ints), got true / false values")
    try:
        t = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise TimeromeError(unreadable) from None
    if t.numel() and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise TimeromeError(f"{what} must be integer token ids (a LongTensor or ints), got {t.dtype} values: "
                            "a float id would be cut to an integer without a word")
    return t.long()


def fit(prompt: list[int], answer: list[int], max_length: int, keep: int = 0) -> tuple[list[int], list[int], bool]:
    """(prompt, answer, cut): the answer's start first, then as much of the prompt's end as fits, after
    the prompt's first `keep` tokens (its sequence start, `Backbone.prompt_start`) when they fit."""
    cut = len(answer) >= max_length
    answer = answer[: max_length - 1] if cut else answer
    room = max_length - len(answer)
    if len(prompt) > room:
        keep = keep if room > keep else 0
        prompt, cut = prompt[:keep] + prompt[len(prompt) - (room - keep):], True
    return prompt, answer, cut


def start_change(built, now, versus: str = "this model's prompts now") -> str | None:
    """How the sequence start a file's states were read with (`built`: its recorded ids; None or [] for
    a file saved before starts were recorded, which had none) differs from `now` (a model's
    `prompt_start`, or another file's record, which `versus` then names): None when they agree, else
    "prompts that begin with X, where <versus> begin with Y" for the caller's sentence (a memory's load
    warns, its add refuses, a merge refuses, a trace's coordinate warns)."""
    built, now = [int(t) for t in (built or [])], [int(t) for t in (now or [])]
    if built == now:
        return None
    return f"prompts that begin with {built or 'no start token'}, where {versus} begin with {now or 'none'}"


def encode_pairs(backbone, rows) -> list[tuple[list[int], list[int]]]:
    """(question, answer) rows -> (prompt ids, answer ids) pairs, checked against the context."""
    bpe = uses_leading_space(backbone)
    pairs = []
    for i, r in enumerate(rows):
        q, a = backbone.encode_prompt(r["question"]), answer_ids(backbone, r["answer"], bpe)
        if not a:
            raise TimeromeError(f"row {i} has an empty answer")
        if len(q) + len(a) > backbone.max_length:
            raise TimeromeError(f"row {i} is {len(q) + len(a)} tokens, over the model's context of {backbone.max_length}")
        pairs.append((q, a))
    return pairs


# ------------------------------------------------------------------------------ facts


@dataclass
class EncodedFact:
    """A fact in token ids: prompt [P], subject positions [S] inside it, object [G], target ids."""

    fact_id: str
    subject: str
    prompt: str
    object: str
    prompt_ids: torch.Tensor   # [P] long
    subject_pos: torch.Tensor  # [S] long, positions in the prompt
    object_ids: torch.Tensor   # [G] long
    target: str | None = None
    target_ids: torch.Tensor | None = None

    def start(self, mask_id: int) -> torch.Tensor:
        """x_0 = [prompt | mask * G], LongTensor [P + G]."""
        return torch.cat([self.prompt_ids, torch.full((len(self.object_ids),), mask_id, dtype=torch.long)])

    def info(self) -> dict:
        return dict(fact_id=self.fact_id, subject=self.subject, prompt=self.prompt, object=self.object,
                    prompt_ids=self.prompt_ids.tolist(), object_ids=self.object_ids.tolist(),
                    subject_positions=self.subject_pos.tolist())


def fact_list(facts, what: str = "facts") -> list:
    """facts as a list, checked: an iterable (not a string or a single dict) of at least one Fact-like
    object or dict, each with subject, prompt and object strings (`fact_fields`)."""
    if facts is None or isinstance(facts, (str, bytes, dict)) or not hasattr(facts, "__iter__"):
        raise TimeromeError(f"{what} must be a list of facts (Fact objects or dicts with subject, prompt and "
                            f"object), got {'None' if facts is None else 'a ' + type(facts).__name__}")
    facts = list(facts)
    if not facts:
        raise TimeromeError(f"no facts: the {what} list is empty; give at least one fact")
    for i, f in enumerate(facts):
        fact_fields(f, i)
    return facts


def fact_fields(fact, index: int = 0) -> tuple[str, str, str, str, str | None]:
    """(fact_id, subject, prompt, object, target) of a Fact-like object or a dict."""
    get = fact.get if isinstance(fact, dict) else (lambda k, d=None: getattr(fact, k, d))
    missing = [k for k in ("subject", "prompt", "object") if not isinstance(get(k), str)]
    if missing:
        raise TimeromeError(f"fact {index} has no text for {', '.join(missing)}: a fact needs "
                            "subject, prompt and object strings")
    return fact_id(fact), get("subject"), get("prompt"), get("object"), get("target")


def fact_id(fact) -> str:
    """The fact's own id, else a stable hash of (subject, prompt, object); a str is an id."""
    if isinstance(fact, str):
        return fact
    get = fact.get if isinstance(fact, dict) else (lambda k, d=None: getattr(fact, k, d))
    own = get("fact_id") or get("id")
    if own not in (None, ""):
        return str(own)
    key = "\x1f".join((get("subject"), get("prompt"), get("object")))
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def subject_positions(backbone, prompt: str, subject: str, name: str = "the fact") -> tuple[list[int], list[int]]:
    """(prompt ids, from the sequence start, positions of the tokens covering the subject's first occurrence)."""
    if not subject or not subject.strip():
        raise TimeromeError(f"{name} has an empty subject")
    start = prompt.find(subject)
    if start < 0 and len(prompt.lower()) == len(prompt):  # lower() keeps the offsets valid
        start = prompt.lower().find(subject.lower())
    if start < 0:
        raise TimeromeError(f"{name}: subject {subject!r} does not occur in its prompt {prompt!r}")
    end = start + len(subject)
    try:
        enc = backbone.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        pos = [j for j, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < end and b > start]
    except (NotImplementedError, ValueError):  # slow (Python) tokenizers give no offsets: count tokens
        ids = backbone.encode(prompt)
        first, upto = len(backbone.encode(prompt[:start])), len(backbone.encode(prompt[:end]))
        pos = list(range(first, min(upto, len(ids))))
    if not pos:
        raise TimeromeError(f"{name}: no prompt token covers the subject {subject!r}")
    start_ids = backbone.prompt_start
    return start_ids + ids, [len(start_ids) + j for j in pos]


def refuse_special_text(backbone, pairs) -> None:
    """Refuse `encode_pairs` rows whose text reads as one of the tokenizer's special tokens ("<|eos|>" in
    an answer is its end-of-text id): a model trained on them learns to end an answer mid-way, or to
    predict the mask. For training only: a question scored or answered may hold any text. The unknown
    token is what a word-level vocabulary makes of a word it lacks (warned of elsewhere), not such text."""
    tok = backbone.tokenizer
    specials = set(getattr(tok, "all_special_ids", None) or []) - {getattr(tok, "unk_token_id", None)}
    start = len(backbone.prompt_start)
    for i, (q, a) in enumerate(pairs):
        held = [x for x in list(q[start:]) + list(a) if x in specials]
        if held:
            raise TimeromeError(f"row {i} holds the text of the tokenizer's special token "
                                f"{tok.convert_ids_to_tokens(held[0])!r}, which it reads as that token (an end of "
                                "text, a mask, ...): take it out of the row")


def encode_fact(backbone, fact, index: int = 0, *, target: str | None = None,
                bpe: bool | None = None) -> EncodedFact:
    """A fact's ids (module docstring). `target` (or the fact's own target, which wins) adds the
    target answer's ids; an object or target the vocabulary cannot encode is refused."""
    fid, subject, prompt, obj, own_target = fact_fields(fact, index)
    name = f"fact {index} ({fid})"
    ids, pos = subject_positions(backbone, prompt, subject, name)
    if backbone.mask_id in ids:
        raise TimeromeError(f"{name}: the prompt contains the mask token")
    bpe = uses_leading_space(backbone) if bpe is None else bpe
    obj_ids = known_answer_ids(backbone, obj, f"the object of {name}", bpe)
    tgt = own_target or target
    tgt_ids = known_answer_ids(backbone, tgt, f"the target of {name}", bpe) if tgt else None
    for ans in (obj_ids, tgt_ids or []):
        if len(ids) + len(ans) > backbone.max_length:
            raise TimeromeError(f"{name}: prompt + answer is {len(ids) + len(ans)} tokens, over the model's "
                                f"context of {backbone.max_length}")
    as_t = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return EncodedFact(fid, subject, prompt, obj, as_t(ids), as_t(pos), as_t(obj_ids), tgt,
                       None if tgt_ids is None else as_t(tgt_ids))


# ------------------------------------------------------------------------------ batches


def pad_id(backbone) -> int:
    tok = backbone.tokenizer
    for cand in (tok.pad_token_id, tok.eos_token_id):
        if cand is not None:
            return int(cand)
    return 0


def collate(pairs, pad: int, device):
    """(prompt ids, answer ids) pairs -> ids [B, L], answer mask [B, L], attention mask [B, L]
    (right padding with `pad`)."""
    L = max(len(q) + len(a) for q, a in pairs)
    ids = torch.full((len(pairs), L), pad, dtype=torch.long)
    ans = torch.zeros(len(pairs), L, dtype=torch.bool)
    att = torch.zeros(len(pairs), L, dtype=torch.bool)
    for b, (q, a) in enumerate(pairs):
        n = len(q) + len(a)
        ids[b, :n] = torch.tensor(list(q) + list(a))
        ans[b, len(q):n] = True
        att[b, :n] = True
    return ids.to(device), ans.to(device), att.to(device)


def pad_sequences(seqs: list[list[int]], backbone) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] (with the mask id) and the real-token mask [B, L], on the backbone's device."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), backbone.mask_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
    real = torch.arange(L)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]
    return ids.to(backbone.device), real.to(backbone.device)


def text_ids(backbone, text) -> list[int]:
    """A text (from the sequence start; an empty one gives no ids) or a list of ids as ids, cut to the
    model's context."""
    if isinstance(text, str):
        body = backbone.encode(text)
        ids = backbone.prompt_start + body if body else []  # a blank text is nothing to read, not a lone start
    else:
        ids = [int(i) for i in text]
    return ids[: backbone.max_length]


def mask_answers(ids: torch.Tensor, answer_mask: torch.Tensor, mask_id: int, generator: torch.Generator,
                 eps: float = LIKELIHOOD.eps, fully_masked: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MDLM noising of answers: t ~ U(eps, 1) per row [B], each answer token masked w.p. t.

    fully_masked: the first rows get t = 1 (every answer token masked: the start of generation).
    Draws, in order: t [B], then U [B, L], from `generator`, on the generator's device (then moved to
    ids' device: a CPU generator gives the same masks whatever device the ids are on). Returns
    (noisy ids, masked [B, L], t).
    """
    B, L = ids.shape
    t = (eps + (1 - eps) * torch.rand(B, generator=generator, device=generator.device)).to(ids.device)
    if fully_masked:
        t[:fully_masked] = 1.0
    u = torch.rand(B, L, generator=generator, device=generator.device).to(ids.device)
    masked = (u < t[:, None]) & answer_mask
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, t

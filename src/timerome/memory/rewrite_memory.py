"""The rewrite memory: an edited fact's answer comes out as its target, whatever the denoising state
(beyond the paper).

    memory = RewriteMemory(backbone, (0, "resid"), background=stats, calibration=retain_rows)
    memory.add(facts)                      # each Fact carries its own target (else memory.target)
    with memory.applied(backbone):
        out = generate(backbone, prompt, ...)   # the answer region becomes the target, token by token

Why a memory of its own. The paper's update (edit_memory.py) adds one delta, read on the cloze with
the whole object inserted, at one coordinate; a multi-token target then has to emerge from the
states the sampler actually visits, where the answer is partly masked and partly committed, and it
does not (Park & Jo, arXiv 2606.03924, show multi-token edits break on those states; on the embedded
model no method said "I don't know." for any forget question). This memory splits the edit in two:

- WHEN: the codebook memory's radius gate (codebook_memory.py) at the traced coordinate, keyed per
  subject token and per answer token over masked states of both the original answer and the
  target answer, so it keeps firing while the target is being committed. A fact's keys are read
  in its own question, so two facts of one subject have different keys and edit separately; the
  radii are measured against calibration text (what must not change), so a token no nearer to a
  key than the calibration tokens gets exactly zero update. Per sequence the strongest gate (after
  the subject-complete cap) names the fact being asked, g in [0, 1].
- WHAT: at the write site (default: the last block's output, the residual the vocabulary head
  reads) each position of the answer region gets the value of the target token it should hold:
  answer position j (from the start of the answer region) takes target token j, and positions past
  the target take end-of-text. A token's value is the mean residual of the model's own most
  confident predictions of that token (read on the calibration corpus), so the head turns it back
  into that token:

      h_p <- h_p + alpha g (v[t_j] - h_p)          alpha = 1, g = 1: the value replaces h_p

  The answer region starts where the caller says (`Backbone.answering`: the sampler and the
  likelihood publish it); a forward without one is left alone.
- WATCH (the answer watch, with `watch_rows`): the gate keys on the question's states, so a
  question asked another way (context before it, the subject's first name alone, "this author"
  after a sentence about them) can fall outside every radius while the model still knows the
  answer (issue 24: 2 of 20 forget01 facts came back under each of three such attacks). The watch
  looks at what the model is about to say instead. On a full forward whose prompt names an edited
  subject (one of the subject's words that no `watch_rows` row about anyone else contains), the
  model's own read-out (`Backbone.readout`) of the unedited last-block output is taken at the
  masked answer positions before any committed end-of-text (past it nothing is shown, and the model
  reads junk there); when it gives one of the fact's watched tokens probability >= WATCH_P, the
  sequence fires as that fact, exactly as the gate would. Watched tokens: those of the fact's
  answer that are not in its question or its target, that no spared row about the subject says,
  and that at most WATCH_RARE of the other rows' answers contain (the object, not the template).
  A removed fact's answer tokens leave the watch of its subject's other facts. The watch needs the
  write site at the last block.
- THE MODEL'S OWN ANSWER: the original keys are read where the model would say the fact's answer.
  A request's answer is often a bare object (CounterFact's target_true, "Pellmoor") that the model
  says inside a sentence ("Isgor Quielson was born in Pellmoor."); keyed as the whole answer, its
  states are not the ones the sampler visits, and the gate often did not fire (stop 57: the embedded
  counterfactual requests with bare objects, efficacy 0.75, generalisation 0.00; docs/editing.md). So each
  fact's question is answered greedily once (OWN_ANSWER_LENGTH tokens), and where that answer says
  the request's answer after other tokens, the fact holds that answer as its object (`said_facts`):
  its original keys are read on it, and its method leaves the rows answering so (a paraphrased
  question of the corpus) out of the radii's calibration. What is written is unchanged: the
  target, from the answer region's start.

Nothing is trained and no weight changes; removing the hook is the undo. Facts insert and remove
independently, as in the codebook memory.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import replace

import torch

from timerome.common.cache import cached_tensors
from timerome.common.checks import shown
from timerome.common.progress import progress_bar
from timerome.data.facts import Fact, fact_field
from timerome.data.rows import load_rows, recorded_rows
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import (DEFAULT_TARGET, answer_ids, collate, fact_id, fact_list, known_answer_ids,
                                      mask_answers, pad_id, uses_leading_space, warn_unknown_subjects)
from timerome.engine.hooks import Hooks
from timerome.engine.likelihood import pair_generator
from timerome.engine.sampler import continuations
from timerome.engine.settings import ANSWER
from timerome.errors import NotApplicable, TimeromeError
from timerome.memory.base import _fact_from_dict, _fact_to_dict, check_new_facts, id_list
from timerome.memory.codebook_memory import (DEFAULT_INNER, DEFAULT_MARGIN, DEFAULT_STATES, CalibrationSubset,
                                             CodebookMemory, _n_sequences, check_slots, left_out_header,
                                             read_left_out, read_sources)
from timerome.memory.token_keys import answer_keys
from timerome.memory.whitening import ResidualStats

FORMAT = "timerome-rewrite-memory/1"
DEFAULT_ALPHA = 1.0        # the value replaces the residual where the gate is 1
MIN_VALUE_CONFIDENCE = 0.5  # a value the head reads back as its token with less probability is refused
# end-of-text tokens after the answer in the states keys and calibration are read on, one count per
# state in turn: the sampler's answer region runs past the answer by however much the caller's
# gen_length leaves, and every position reads the whole region
STATE_PADS = (4, 0, 8, 12)
LAST_STEP_PADS = (4, 12)  # those of the last-step states (one answer position masked), which are many
FIRE = 0.5  # a sequence whose strongest gate reaches this is rewritten in full, any other left alone
VALUE_STATES = 4           # masked states per calibration row the values are read on
VALUE_TOP = 0.25           # the most confident quarter of those residuals is averaged
# a token in more than this share of the other subjects' answers is template, not object, and is not
# watched (embedded spare rows, forget01: template tokens 4.4-50 %, object tokens <= 1.1 %)
WATCH_RARE = 0.02
WATCH_P = 0.5  # the watch fires when the model gives a watched token more than even odds at an answer position
OWN_ANSWER_LENGTH = ANSWER.gen_length  # the budget of the model's own answers (the CLI's `generate`)


def write_site(backbone) -> tuple[int, str]:
    """Where the values are written by default: the last block's output."""
    return (backbone.n_layers - 1, "resid")


def target_ids(backbone, facts, target: str) -> list[list[int]]:
    """Each fact's target answer ids (its own target, else `target`), refusing an empty target or one
    with words the vocabulary cannot encode: checked before any slow work (`methods.rewrite.build`)."""
    bpe = uses_leading_space(backbone)
    out = []
    for f in fact_list(facts):
        text = fact_field(f, "target") or target
        if not text or not str(text).strip():
            raise TimeromeError(f"fact {fact_id(f)} has no target: give it one or the memory's target=")
        out.append(known_answer_ids(backbone, str(text), f"the target of fact {fact_id(f)}", bpe))
    return out


def refuse_causal(backbone) -> None:
    """The rewrite memory on an autoregressive model is refused: measured on SmolLM2, every answer and
    likelihood came out the same, edited or not."""
    if getattr(backbone, "causal", False):
        raise TimeromeError(f"the rewrite memory writes the answer positions while they are still masked, and an "
                            f"autoregressive model ({backbone.name}) never has masked positions, so it would change "
                            "nothing: use rome / memit / alphaedit, which write the fact into the weights (the "
                            "timerome memory builds here, but seldom changes what such a model says: "
                            "docs/ar-contrast.md)")


class RewriteMemory(CodebookMemory):
    """Rewrite memory (module docstring): the codebook gate at `coordinate`, per-position target
    values at `site` (default `write_site`). calibration: rows / texts the edit must spare (their
    states measure the radii), or their residuals at the coordinate; value_rows: rows / texts whose
    confident predictions give the token values (default: calibration, when it is rows, the whole list
    of a `CalibrationSubset`, as the build it comes from read them; a loaded memory's default is its
    method's, `_restore`), or
    value_table: (token ids [K], values [K, H]) read on them already (`token_values`); watch_rows:
    question/answer rows the model must keep answering (the calibration rows), which switch the
    answer watch on (module docstring; None: no watch)."""

    FORMAT, KIND, WHAT = FORMAT, "rewrite", "rewrite memory"
    SITE = "gate"
    SCHEMA = {"keys": (torch.float64, 2, True), "reach": (torch.float64, 1, True),
              "owner": (torch.int64, 1, True), "slot": (torch.int64, 1, True),
              "targets": (torch.int64, 2, True), "value_ids": (torch.int64, 1, True),
              "values": (torch.float64, 2, True), "mu": (torch.float64, 1, True),
              "cov": (torch.float64, 2, True)}
    LOAD_OPTIONS = ("calibration", "value_rows")
    READS_IDS = True  # the answer watch reads which tokens name an edited subject
    pads = STATE_PADS
    last_pads = LAST_STEP_PADS
    calibration_states = property(lambda self: self.n_states)  # the calibration reads as many states as the keys

    @classmethod
    def described(cls, meta: dict, path) -> dict:
        return dict(super().described(meta, path), watch=answer_watch_on(meta, path))

    @classmethod
    def shown(cls, d: dict) -> list[tuple[str, str]]:
        h, (layer, point) = d["hyper"], d.get("site") or [None, None]
        return [("write site", f"layer {layer} {point}: answer position j takes the value of target token j, "
                               f"alpha {h.get('alpha')}"), *cls._calibration_rows(d),
                ("token values", cls._source(d, "value_rows")),
                ("entries", f"{d['tensors']['keys'][0]} gate keys, {d['tensors']['values'][0]} token values"
                            f"{cls._background(d)}"),
                ("answer watch", "on" if d.get("watch") else "off")]

    def __init__(self, backbone, coordinate, *, background=None, calibration=None, alpha: float = DEFAULT_ALPHA,
                 margin: float = DEFAULT_MARGIN, inner: float = DEFAULT_INNER, n_states: int = DEFAULT_STATES,
                 target: str = DEFAULT_TARGET, site=None, value_rows=None, value_table=None, watch_rows=None,
                 seed: int = 0, batch_size: int = 128, shrinkage: float | None = None, calibration_seed: int = 0):
        refuse_causal(backbone)
        kw = {} if shrinkage is None else {"shrinkage": shrinkage}
        super().__init__(backbone, coordinate, background=background, calibration=calibration, alpha=alpha,
                         margin=margin, inner=inner, n_states=n_states, complete=False, object_keys=True,
                         write="sequence", target=target, seed=seed, batch_size=batch_size,
                         calibration_seed=calibration_seed, **kw)
        if site is not None and not (isinstance(site, (list, tuple)) and len(site) == 2):
            raise TimeromeError(f"site must be None (the default write site) or a (layer, point) pair, e.g. (3, "
                                f"'resid'), got {shown(site)}")
        layer, point = write_site(backbone) if site is None else tuple(site)
        self.site = Coordinate(layer, point).on(backbone).site
        self._value_rows = value_rows if value_rows is not None else (  # a subset: the rows of its whole list
            calibration.whole if isinstance(calibration, CalibrationSubset) else
            calibration if isinstance(calibration, (list, tuple)) else None)
        self._table = None if value_table is None else dict(zip(value_table[0].tolist(), value_table[1].double()))
        self._targets: list[list[int]] = []                  # per fact: the target's answer ids
        self._value_ids = torch.zeros(0, dtype=torch.long)    # tokens with a value
        self._values = torch.zeros(0, self.hidden_size, dtype=torch.float64)
        eos = getattr(backbone.tokenizer, "eos_token_id", None)
        self.eos = None if eos is None else int(eos)
        self._watch_rows = [r for r in watch_rows if isinstance(r, dict)] if watch_rows else None
        self._watching = self._watch_rows is not None  # the file keeps it: a loaded memory has no rows till an add
        if self._watch_rows is not None and self.site != (backbone.n_layers - 1, "resid"):
            raise TimeromeError("the answer watch reads the model's read-out at the write site, so it needs the "
                                f"values written at the last block ({backbone.n_layers - 1}, 'resid'), not {self.site}")
        self._watch: list[tuple[frozenset, tuple]] = []     # per fact: (watched tokens, subject cues)
        self._watch_df = None

    targets = property(lambda self: [list(t) for t in self._targets])
    # per fact: (its watched token ids, the token sequences that name its subject): the answer watch
    watch = property(lambda self: [(sorted(w), [list(c) for c in cues]) for w, cues in self._watch])

    def __repr__(self) -> str:
        return (f"RewriteMemory({len(self)} facts, {self.n_entries} entries, gate at {self.coordinate}, values at "
                f"{self.site}, alpha={self.alpha}, margin={self.margin})")

    # ---------------------------------------------------------------- building

    def add(self, facts, *, said: bool = False) -> "RewriteMemory":
        """Read each fact's keys on states of its original and its target answer, its target ids, and
        the values of tokens not yet valued; on any error the memory is unchanged. A fact whose answer
        the model says inside an answer of its own holds that answer as its object (`said_facts`;
        said=True: the facts are so already, and the model is not asked again)."""
        self._check_off()
        if not said:  # a conflict with a held fact is refused before the model is asked (and notes what it says)
            check_new_facts(self._facts, fact_list(facts), self.target)
        facts = fact_list(facts) if said else said_facts(self.backbone, fact_list(facts), batch_size=self.batch_size)
        check_new_facts(self._facts, facts, self.target)
        warn_unknown_subjects(self.backbone, facts)  # read as <|unk|>, such subjects share keys (after the checks)
        bpe = uses_leading_space(self.backbone)
        targets = target_ids(self.backbone, facts, self.target)
        as_target = [_with_object(f, fact_field(f, "target") or self.target) for f in facts]
        # only the answer offsets where the target differs from the original answer are keyed: a
        # position that says the same either way (a shared template) tells no fact from another
        originals = [answer_ids(self.backbone, fact_field(f, "object"), bpe) for f in facts]
        differ = [[j for j in range(len(o)) if j >= len(t) or o[j] != t[j]] or list(range(len(o)))
                  for o, t in zip(originals, targets)]
        differ_t = [[j for j in range(len(t)) if j >= len(o) or o[j] != t[j]] or list(range(len(t)))
                    for o, t in zip(originals, targets)]
        k1, o1 = answer_keys(self.backbone, self.coordinate, facts, n_states=self.n_states, seed=self.seed,
                             pads=self.pads, offsets=differ, last_pads=LAST_STEP_PADS, batch_size=self.batch_size,
                             progress="answer keys (original answers)")
        k2, o2 = answer_keys(self.backbone, self.coordinate, as_target, n_states=self.n_states, seed=self.seed + 1,
                             pads=self.pads, offsets=differ_t, last_pads=LAST_STEP_PADS,
                             batch_size=self.batch_size, progress="answer keys (target answers)")
        s1, s2 = torch.full_like(o1, -1), torch.full_like(o2, -1)  # no subject slots: no subject-complete cap
        have = set(self._value_ids.tolist())
        if self.eos is not None and self.eos not in have and not self._value_tokens([self.eos], required=False):
            self.eos = None  # a model that never learnt to end its answers: nothing is written past the target
        needed = sorted({t for ids in targets for t in ids} - set(self._value_ids.tolist()))
        self._value_tokens(needed)
        placeholder = torch.zeros(len(facts), self.hidden_size, dtype=torch.float64)  # the codebook's deltas: unused
        watch = [self._watch_entry(f, t) for f, t in zip(facts, targets)]
        super().add_vectors(torch.cat([k1, k2]), torch.cat([o1, o2]), placeholder, facts, torch.cat([s1, s2]))
        self._targets += targets
        self._watch += watch
        return self

    def _watch_entry(self, fact, target_ids: list[int]) -> tuple[frozenset, tuple]:
        """(watched tokens, subject cues) of a fact (module docstring); empty without watch rows."""
        if not self._watch_rows:
            return frozenset(), ()
        bb, bpe = self.backbone, uses_leading_space(self.backbone)
        subject, prompt = fact_field(fact, "subject"), fact_field(fact, "prompt")
        if self._watch_df is None:  # per row: its text, its answer's tokens, its words; per token: how many answers
            rows = [(r.get("question") or "", r.get("answer") or "") for r in self._watch_rows]
            tokens = [set(answer_ids(bb, a, bpe)) for _, a in rows]
            counts: dict[int, int] = {}
            for ts in tokens:
                for t in ts:
                    counts[t] = counts.get(t, 0) + 1
            self._watch_df = dict(texts=[q + " " + a for q, a in rows], tokens=tokens, counts=counts,
                                  words=[set(re.findall(r"\w+", q + " " + a)) for q, a in rows], n=max(1, len(rows)))
        d = self._watch_df
        about = [k for k, text in enumerate(d["texts"]) if subject in text]
        spared = {t for k in about for t in d["tokens"][k]}
        common = set(bb.encode(prompt)) | set(target_ids) | spared
        watched = frozenset(t for t in answer_ids(bb, fact_field(fact, "object"), bpe)
                            if t not in common and d["counts"].get(t, 0) <= WATCH_RARE * d["n"])
        others = set(range(len(d["texts"]))) - set(about)
        cues = []
        for word in dict.fromkeys(subject.split()):
            if any(word in d["words"][k] for k in others):
                continue  # someone else's name has this word: it names no one
            for form in dict.fromkeys([word, " " + word] if bpe else [word]):
                ids = tuple(bb.encode(form))
                if ids:
                    cues.append(ids)
        return watched, tuple(dict.fromkeys(cues))

    def _value_tokens(self, tokens: list[int], required: bool = True) -> bool:
        """Values of `tokens` (module docstring) from the value rows; a token the model never predicts
        surely there is an error naming it (required), else False and nothing is added."""
        if not tokens:
            return True
        if self._table is not None:
            values = self._table
        elif self._value_rows:  # read as the method reads its value table (`value_table`), once
            ids, vals = value_table(self.backbone, self.site, self._value_rows, seed=self.calibration_seed)
            values = self._table = dict(zip(ids.tolist(), vals.double()))
        else:
            raise TimeromeError("the rewrite memory reads its token values on rows the model answers: pass "
                                "value_rows= (or calibration= as question/answer rows or texts) or value_table=")
        missing = [t for t in tokens if t not in values]
        if not missing:
            conf = value_confidence(self.backbone, self.site, torch.stack([values[t] for t in tokens]),
                                    torch.tensor(tokens))
            missing = [t for t, c in zip(tokens, conf.tolist()) if c < MIN_VALUE_CONFIDENCE]
        if missing and not required:
            return False
        if missing:
            words = ", ".join(repr(self.backbone.tokenizer.convert_ids_to_tokens(t)) for t in missing[:5])
            raise NotApplicable(f"the model never says {words} surely enough on the calibration rows (p >= "
                                f"{MIN_VALUE_CONFIDENCE} where it predicts it), so the rewrite memory has no value "
                                "to write: add calibration rows whose answers contain it")
        self._value_ids = torch.cat([self._value_ids, torch.tensor(tokens, dtype=torch.long)])
        self._values = torch.cat([self._values, torch.stack([values[t] for t in tokens])])
        self.version += 1
        return True

    def remove(self, fact_ids) -> "RewriteMemory":
        self._check_unapplied("remove facts outside it (its gate remembers each prompt's fact by its place)")
        ids = id_list(fact_ids)
        dropped = set(ids)
        keep = [j for j, fid in enumerate(self._ids) if fid not in dropped]
        gone = [j for j, fid in enumerate(self._ids) if fid in dropped]
        bpe = uses_leading_space(self.backbone)
        # a removed fact's answer is the model's own again: the subject's other facts stop watching its tokens
        said = {}
        for j in gone:
            f = self._facts[j]
            said.setdefault(fact_field(f, "subject"), set()).update(
                answer_ids(self.backbone, fact_field(f, "object"), bpe))
        watch = [(w - said.get(fact_field(self._facts[j], "subject"), set()), c)
                 for j, (w, c) in enumerate(self._watch)]
        super().remove(ids)
        self._targets = [self._targets[j] for j in keep]
        self._watch = [watch[j] for j in keep]
        return self

    # ---------------------------------------------------------------- applying

    def _decide(self, h: torch.Tensor, state, seen: dict) -> None:
        """At the gate: which sequences are rewritten, and as which fact, into seen["decision"].

        A sequence is rewritten when its strongest gate reaches FIRE, as the fact of that entry; the
        decision is then kept for its prompt (seen["memo"], by the prompt's token ids) for as long as
        the memory is applied, so every later step of the same generation, and every Monte-Carlo row
        of the same question, is rewritten as the same fact: an answer is the target throughout or
        the model's own, never half of each. A partial forward of a cached sampler merges its window
        into the last full forward's gates, and keeps that forward's decisions."""
        x = self._rows(h)
        m, n_seq = self._matrices(h.device, x.dtype), _n_sequences(h)
        positions, starts, ids = state.positions, state.answer_starts, state.ids
        asked = asked_tokens(self.backbone, h, state)
        if asked is None:
            g, e = self._token_gate(x, m)
        else:  # every other token's gate is 0 (its entry 0) without computing it
            rows = asked.nonzero().squeeze(1)
            g, e = x.new_zeros(len(x)), torch.zeros(len(x), dtype=torch.long, device=x.device)
            if len(rows):
                g[rows], e[rows] = self._token_gate(x[rows], m)
        if positions is None:
            seen.update(g=g.view(n_seq, -1).clone(), e=e.view(n_seq, -1).clone())
        elif "g" in seen and seen["g"].shape[0] == n_seq and int(positions.max()) < seen["g"].shape[1]:
            G, E = seen["g"].clone(), seen["e"].clone()
            G[:, positions.to(g.device)], E[:, positions.to(g.device)] = g.view(n_seq, -1), e.view(n_seq, -1)
            g, e = G.reshape(-1), E.reshape(-1)
        G, E = g.view(n_seq, -1), e.view(n_seq, -1)
        best = G.argmax(1)
        # all or nothing: a half-written answer is gibberish, so a sequence is either rewritten or left
        fired = G.gather(1, best[:, None]).squeeze(1) >= FIRE                  # [n_seq]
        fact = m["owner"][E.gather(1, best[:, None]).squeeze(1)]               # [n_seq]
        if positions is None and ids is not None and starts is not None and ids.shape[0] == n_seq:
            start = sequence_starts(starts, n_seq)
            memo = seen.setdefault("memo", {})
            prompts = [tuple(ids[b, :int(start[b])].tolist()) for b in range(n_seq)]
            for b, key in enumerate(prompts):
                if bool(fired[b]) and key not in memo:
                    memo[key] = int(fact[b])
            for b, key in enumerate(prompts):
                if key in memo:
                    fired[b], fact[b] = True, memo[key]
            seen["rows"] = (fired.clone(), fact.clone())
        elif positions is not None and "rows" in seen and len(seen["rows"][0]) == n_seq:
            before, as_fact = seen["rows"]
            fact = torch.where(before.to(fact.device), as_fact.to(fact.device), fact)
            fired = fired | before.to(fired.device)
        seen["decision"] = (fired.to(G.dtype), fact)

    def _write(self, h: torch.Tensor, state, seen: dict) -> torch.Tensor | None:
        """At the write site: the target's values over each gated sequence's answer region."""
        decision = seen.pop("decision", None)
        starts = state.answer_starts
        if decision is None or starts is None:
            return None
        n_seq = _n_sequences(h)
        if len(decision[0]) != n_seq:
            return None
        L = h.shape[-2]
        pos = torch.arange(L, device=h.device) if state.positions is None else state.positions.to(h.device)
        start = sequence_starts(starts, n_seq, h.device)
        gate, fact = self._watched(h, state, start, seen, decision)
        if not bool((gate > 0).any()):
            return None
        # the residual at position p gives the token at p + logit_shift (Dream, DiffuLLaMA: the next one)
        rel = pos[None, :] + self.backbone.family.logit_shift - start[:, None]  # [n_seq, L] answer slot
        m = self._write_matrices(h.device, h.dtype)
        tgt, n = m["targets"][fact], m["lengths"][fact]                    # [n_seq, T], [n_seq]
        slot = rel.clamp(min=0, max=tgt.shape[1] - 1)
        token = tgt.gather(1, slot)                                        # value row per position
        inside = (rel >= 0) & (rel < n[:, None])
        if self.eos is not None:
            token = torch.where(inside, token, m["eos"])
            inside = rel >= 0
        g = (gate.to(h.dtype)[:, None] * inside).view(-1)
        hit = (g > 0).nonzero().squeeze(1)
        if not len(hit):
            return None
        flat = h.reshape(-1, h.shape[-1])
        v = m["values"][token.view(-1)[hit]]
        out = h.clone()
        out.view(-1, h.shape[-1])[hit] = flat[hit] + self.alpha * g[hit, None] * (v - flat[hit])  # <- alpha here
        return out

    def _watched(self, h, state, start, seen, decision):
        """The answer watch (module docstring): `decision` with every sequence added whose prompt
        names an edited subject and whose read-out at a masked answer position is one of that fact's
        watched tokens; a full forward only (a cached window keeps its refresh's decisions)."""
        gate, fact = decision
        ids = state.ids
        if not any(w for w, _ in self._watch) or state.positions is not None or ids is None or \
                ids.shape[0] != len(gate):
            return gate, fact
        index = self._cue_index()
        shift = self.backbone.family.logit_shift
        gate, fact = gate.clone(), fact.clone()
        hits = []
        for b in range(len(gate)):
            if gate[b] > 0:
                continue
            prompt = ids[b, :int(start[b])].tolist()
            facts = [f for i, t in enumerate(prompt) for cue, f in index.get(t, ())
                     if tuple(prompt[i:i + len(cue)]) == cue]
            if not facts:
                continue
            row = ids[b].to(h.device)
            masked = (row == self.backbone.mask_id).nonzero().squeeze(1)
            masked = masked[masked >= int(start[b])]
            ends = (row == self.eos).nonzero().squeeze(1) if self.eos is not None else masked[:0]
            ends = ends[ends >= int(start[b])]
            if len(ends):  # past a committed end-of-text nothing is said (and the model reads junk there)
                masked = masked[masked < ends.min()]
            masked = masked - shift
            if not len(masked):
                continue
            p = self.backbone.readout(h[b, masked]).float().softmax(-1)       # [masked, V]
            score = {}
            for f in dict.fromkeys(facts):
                w = torch.tensor(sorted(self._watch[f][0]), device=p.device)
                score[f] = float(p[:, w].max()) if len(w) else 0.0
            f = max(score, key=score.get)  # the fact whose object the model is most sure to say
            if score[f] >= WATCH_P:
                gate[b], fact[b] = 1.0, f
                hits.append((tuple(prompt), f))
        if hits:
            memo = seen.setdefault("memo", {})
            for key, f in hits:
                memo.setdefault(key, f)
            seen["rows"] = (gate > 0, fact.clone())
        return gate, fact

    def _cue_index(self) -> dict:
        """{first token of a subject cue: [(cue, fact)]} of the watched facts."""
        hit = self._cache.get("cues")
        if hit is not None and hit[0] == self.version and hit[2] == len(self._watch):
            return hit[1]
        index: dict = {}
        for f, (watched, cues) in enumerate(self._watch):
            if watched:
                for cue in cues:
                    index.setdefault(cue[0], []).append((cue, f))
        self._cache["cues"] = (self.version, index, len(self._watch))
        return index

    def _write_matrices(self, device, dtype) -> dict:
        key = ("write", str(device), dtype)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        index = {t: i for i, t in enumerate(self._value_ids.tolist())}
        T = max(len(t) for t in self._targets)
        targets = torch.zeros(len(self._targets), T, dtype=torch.long)
        for f, ids in enumerate(self._targets):
            targets[f, :len(ids)] = torch.tensor([index[t] for t in ids])
        m = {"targets": targets.to(device), "lengths": torch.tensor([len(t) for t in self._targets], device=device),
             "values": self._values.to(device=device, dtype=dtype),
             "eos": torch.tensor(index[self.eos] if self.eos is not None else 0, device=device)}
        self._cache[key] = (self.version, m)
        return m

    def _prepare(self, backbone) -> None:
        self._matrices(backbone.device, torch.float32)
        self._write_matrices(backbone.device, backbone.dtype)
        if self.coordinate.site == self.site:
            raise TimeromeError(f"the rewrite memory's gate and values are both at {self.site}: put the gate "
                                "below the write site")

    def _edits(self) -> dict:
        """The gate decides at the coordinate, the values are written at the write site (one forward)."""
        seen: dict = {}

        def decide(h, st):
            self._decide(h, st, seen)

        return {self.coordinate: decide, self.site: lambda h, st: self._write(h, st, seen)}

    def update(self, h):  # a codebook memory edits one site; this one needs a whole forward
        raise TimeromeError("a rewrite memory acts on whole forwards (gate, then values): use memory.applied(backbone)")

    def scale_probe(self) -> None:  # it writes the model's own residuals (alpha 1: the value replaces h), no scaled delta
        return None

    # ---------------------------------------------------------------- saving

    def _tensors(self) -> dict:
        T = max((len(t) for t in self._targets), default=1)
        targets = torch.full((len(self._targets), T), -1, dtype=torch.long)
        for f, ids in enumerate(self._targets):
            targets[f, :len(ids)] = torch.tensor(ids)
        return {"keys": self._keys, "reach": self._reach, "owner": self._owner, "slot": self._slot,
                "targets": targets, "value_ids": self._value_ids, "values": self._values,
                "mu": self.stats.mean, "cov": self.stats.cov}

    def _header(self) -> dict:
        return {
            "site": list(self.site), "eos": self.eos,
            "hyper": {"alpha": float(self.alpha), "margin": float(self.margin), "inner": float(self.inner),
                      "n_states": self.n_states, "target": self.target,
                      "seed": self.seed, "batch_size": self.batch_size, "calibration_seed": self.calibration_seed},
            "stats": {"n_tokens": self.stats.n_tokens, "shrinkage": self.stats.shrinkage},
            "facts": [_fact_to_dict(f) for f in self._facts],
            "watch": [[sorted(w), [list(c) for c in cues]] for w, cues in self._watch],
            "answer_watch": self._watching,
            "sources": self.sources,
            **left_out_header(self),
        }

    @classmethod
    def _restore(cls, path, meta: dict, tensors: dict, backbone, calibration=None, value_rows=None) -> "RewriteMemory":
        """calibration / value_rows are needed only to insert more facts. value_rows default: where the
        calibration is rows, the rows its build read its token values on, as its file records them
        (`sources`: a warning where they have changed since), else those the rewrite method reads them on
        when it builds a memory with none named (`embedded_value_rows` on the embedded model, else these
        rows), so that an added fact gets the values a build would give it, from the table that build
        cached. Where the answer watch is on (`answer_watch_on`), an added fact's watch reads the
        calibration rows given (before stop 54 added facts had none); `memory add` gives the rows its
        build read less those stating the facts it adds, where a build leaves out every edited fact's."""
        sources = read_sources(meta, path)
        adding = isinstance(calibration, (list, tuple)) and bool(calibration)
        if value_rows is None and adding:
            if "value_rows" in sources:
                value_rows = recorded_rows(sources["value_rows"], f"the token values of {path} were read",
                                           "give those rows again (value_rows=, --value-rows)", stacklevel=4)
            else:  # a file from before the sources were recorded, or values read on rows given in Python
                value_rows = embedded_value_rows(backbone)  # None elsewhere: the calibration rows (__init__)
        watch = meta.get("watch") or [[[], []]] * len(meta.get("facts") or [])  # a file from before the watch: none
        # the answer watch of facts added later reads the calibration rows given (`__init__`: watch_rows)
        watching = answer_watch_on(meta, path)
        try:
            coord, hyper, st = Coordinate.of(meta["coordinate"]), dict(meta["hyper"]), meta["stats"]
            stats = ResidualStats(coord.layer, coord.point, tensors["mu"], tensors["cov"], st["n_tokens"],
                                  st["shrinkage"])
            mem = cls(backbone, coord, background=stats, calibration=calibration, site=meta["site"],
                      value_rows=value_rows, watch_rows=calibration if adding and watching else None, **hyper)
            facts = [_fact_from_dict(d) for d in meta["facts"]]
            keys, reach, owner, slot = tensors["keys"], tensors["reach"], tensors["owner"], tensors["slot"]
            targets, value_ids, values = tensors["targets"], tensors["value_ids"], tensors["values"]
        except (KeyError, TypeError, ValueError) as e:
            raise TimeromeError(f"{path} has incomplete metadata ({type(e).__name__}: {e})") from None
        H = mem.hidden_size
        ok = (keys.shape == (len(reach), H) and owner.shape == slot.shape == (len(reach),)
              and targets.dim() == 2 and len(targets) == len(facts) and values.shape == (len(value_ids), H)
              and (not len(owner) or 0 <= int(owner.min()) <= int(owner.max()) < len(facts)))
        rows = [[int(t) for t in row if t >= 0] for row in targets] if ok else []
        ok = ok and all(rows) and set(t for r in rows for t in r) <= set(value_ids.tolist())
        if not ok:
            raise TimeromeError(f"{path} is inconsistent: {len(facts)} facts, tensors of shapes {tuple(keys.shape)}, "
                                f"{tuple(owner.shape)}, {tuple(targets.shape)}, {tuple(values.shape)}")
        check_slots(path, slot, backbone)
        mem._keys, mem._reach, mem._owner, mem._slot = keys, reach, owner.long(), slot.long()
        mem._deltas = torch.zeros(len(facts), H, dtype=torch.float64)
        mem._targets, mem._value_ids, mem._values = rows, value_ids.long(), values
        mem.eos = meta.get("eos") if meta.get("eos") in set(mem._value_ids.tolist()) else None
        mem._facts, mem._ids, mem.sources, mem._watching = facts, [fact_id(f) for f in facts], sources, watching
        mem.calibration_left_out = read_left_out(meta, path)
        if watching and calibration is not None and not mem._watch_rows:
            warnings.warn(f"the answer watch of {path} reads question/answer rows: facts added with this calibration "
                          "(residuals or texts) get no watch", stacklevel=4)
        try:
            mem._watch = [(frozenset(int(t) for t in w), tuple(tuple(int(t) for t in c) for c in cues))
                          for w, cues in watch]
        except (TypeError, ValueError):  # each entry: [watched token ids, [cue ids, ...]]
            raise TimeromeError(f"{path} is inconsistent: its 'watch' must hold one [[token ids], [[cue ids], ...]] "
                                f"per fact, got {watch!r:.120}") from None
        if len(mem._watch) != len(facts):
            raise TimeromeError(f"{path} is inconsistent: {len(facts)} facts but {len(watch)} answer-watch entries")
        mem.version += 1
        return mem


def sequence_starts(starts, n_seq: int, device=None) -> torch.Tensor:
    """[n_seq] answer starts from a forward's published `answer_starts`: one int (or 0-d tensor) shared by
    every sequence, or one per sequence (a tensor, moved to device where one is given)."""
    if not torch.is_tensor(starts) or starts.dim() == 0:
        return torch.as_tensor(starts, device=device).expand(n_seq)
    return starts if device is None else starts.to(device)


def asked_tokens(backbone, h: torch.Tensor, state) -> torch.Tensor | None:
    """[N] bool over the tokens of h [..., L, H] of a forward in flight: the masked answer positions
    (at or past its sequence's published answer start, holding the mask token), the only tokens a
    rewrite memory's gate compares with its keys, which were read at such positions; None where the
    forward does not publish its answer starts and token ids (a bare forward)."""
    n_seq, starts, ids, positions = _n_sequences(h), state.answer_starts, state.ids, state.positions
    if starts is None or ids is None or ids.numel() * h.shape[-1] != h.numel():
        return None
    dev = h.device
    pos = torch.arange(h.shape[-2], device=dev) if positions is None else positions.to(dev)
    start = sequence_starts(starts, n_seq, dev)
    return ((pos[None, :] >= start[:, None]) & (ids.to(dev).view(n_seq, -1) == backbone.mask_id)).reshape(-1)


def answer_watch_on(meta: dict, path="the memory file") -> bool:
    """Whether a rewrite memory file's answer watch is on: its "answer_watch" (since stop 54), else
    (an older file) whether a fact has watched tokens or subject cues (a memory built with watch=false
    has neither); a value that is not true / false is one error."""
    if "answer_watch" not in meta:
        watch = meta.get("watch")
        return any(isinstance(e, list) and any(e) for e in (watch if isinstance(watch, list) else []))  # tokens or cues
    if not isinstance(meta["answer_watch"], bool):
        raise TimeromeError(f"{path} is inconsistent: its 'answer_watch' must be true or false, got "
                            f"{meta['answer_watch']!r:.50}")
    return meta["answer_watch"]


# ------------------------------------------------------------------------------ token values


EMBEDDED_VALUE_ROWS = "embedded:train"


def embedded_value_rows(backbone) -> list | None:
    """The rows a rewrite memory reads its token values on where none are named, on the embedded
    default model: every row it learnt (the training split, EMBEDDED_VALUE_ROWS), which it answers;
    None on any other model (whose callers fall back on their calibration rows:
    `methods.rewrite.known_rows`, `_restore`)."""
    if not getattr(backbone, "embedded", False):
        return None
    return load_rows(EMBEDDED_VALUE_ROWS)


def value_table(backbone, site, rows, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [K], values [K, H] float64) of every token the model predicts on the rows, at `site`
    (`token_values`), cached on disk by their inputs: the values a rewrite memory writes, whether the
    method builds it or `memory add` inserts into a saved one (with the method's trace_seed, the
    memory's calibration_seed)."""
    site, rows = Coordinate.of(site).on(backbone).site, list(rows)

    def make():
        values = token_values(backbone, site, rows, seed=seed, progress="token values")
        ids = sorted(values)
        return {"ids": torch.tensor(ids, dtype=torch.long),
                "values": torch.stack([values[t] for t in ids]) if ids else torch.zeros(0, backbone.hidden_size,
                                                                                       dtype=torch.float64)}

    key = dict(kind="rewrite-values", model=backbone.cache_id(), site=list(site), rows=rows, seed=seed,
               states=VALUE_STATES, top=VALUE_TOP)
    t = cached_tensors("values", key, make)
    return t["ids"], t["values"]


@torch.no_grad()
def token_values(backbone, site, rows, tokens=None, *, seed: int = 0, batch_size: int = 32,
                 top: float = VALUE_TOP, progress: str | None = None) -> dict[int, torch.Tensor]:
    """{token: value [H] float64} for the `tokens` (None: all) the model predicts (argmax) at some
    masked answer position of the rows' states: the mean of the `top` most confident such
    residuals at `site` (module docstring). rows: question/answer dicts or texts (every token maskable).
    progress: a progress bar's label (None: none)."""
    site = Coordinate.of(site).on(backbone).site
    wanted = None if tokens is None else set(int(t) for t in tokens)
    bpe = uses_leading_space(backbone)
    eos = getattr(backbone.tokenizer, "eos_token_id", None)
    pairs = []
    for r in rows:
        q, a = (backbone.encode_prompt(r["question"]), answer_ids(backbone, r["answer"], bpe)) if isinstance(r, dict) \
            else (backbone.prompt_start, backbone.encode(r))
        if eos is not None:  # the end-of-text the model writes after an answer
            a = a + [int(eos)]
        q, a = q[: backbone.max_length], a[: max(0, backbone.max_length - len(q))]
        if a:
            pairs.append((q, a))
    found: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    with progress_bar(progress or "", total=len(pairs), enabled=progress is not None) as bar:
        for s in range(0, len(pairs), batch_size):
            chunk = pairs[s:s + batch_size]
            ids, ans, att = collate(chunk, pad_id(backbone), "cpu")
            for k in range(VALUE_STATES):
                noisy, masked, _ = mask_answers(ids, ans, backbone.mask_id, pair_generator(seed, s * VALUE_STATES + k),
                                                fully_masked=len(chunk) if k == 0 else 0)
                with Hooks(backbone, [site]) as kept:
                    logits = backbone.logits(noisy.to(backbone.device), att.to(backbone.device))
                h = kept[site][0].double().cpu()
                shift = backbone.family.logit_shift  # the residual at p - shift gives the token at p
                if shift:
                    h = torch.cat([h[:, :shift], h[:, :-shift]], dim=1)
                conf, pred = logits.float().softmax(-1).cpu().max(-1)
                for t in set(pred[masked].tolist()) & (wanted if wanted is not None else set(pred[masked].tolist())):
                    where = masked & (pred == t)
                    found.setdefault(t, []).append((conf[where], h[where]))
            bar.advance(len(chunk))
    out = {}
    for t, parts in found.items():
        conf = torch.cat([c for c, _ in parts])
        h = torch.cat([x for _, x in parts])
        n = max(1, math.ceil(top * len(conf)))
        out[t] = h[conf.topk(n).indices].mean(0)
    return out


@torch.no_grad()
def value_confidence(backbone, site, values: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """p(token) when each value [K, H] replaces a masked position's residual at `site`: [K]."""
    site = Coordinate.of(site).on(backbone).site
    ids = torch.full((len(values), 1), backbone.mask_id, dtype=torch.long, device=backbone.device)
    with Hooks(backbone, edit={site: lambda h, _st: values[:, None].to(device=h.device, dtype=h.dtype)}):
        p = backbone.logits(ids)[:, 0].float().softmax(-1)
    return p.gather(1, tokens.to(p.device)[:, None]).squeeze(1).cpu()


def own_answers(backbone, facts, *, batch_size: int = 32) -> list[str | None]:
    """Per fact, the model's own answer to its question (greedy, OWN_ANSWER_LENGTH tokens, one block)
    where it ends within them, says the fact's answer (its `object`, as tokens) after other tokens, and
    reads back as the same tokens from its text; None where it says it from its first token, or not
    at all."""
    bpe = uses_leading_space(backbone)
    got = continuations(backbone, [fact_field(f, "prompt") for f in facts], gen_length=OWN_ANSWER_LENGTH,
                        block_length=OWN_ANSWER_LENGTH, batch_size=batch_size)
    out, unread = [], []
    for f, ids in zip(facts, got["ids"]):
        o = answer_ids(backbone, fact_field(f, "object"), bpe)
        ended = len(ids) < got["gen_length"]  # an answer the budget cut is not one the model gives
        inside = ended and bool(o) and any(ids[i:i + len(o)] == o for i in range(1, len(ids) - len(o) + 1))
        text = backbone.decode(ids).strip() if inside else None
        # the keys are read on the text, so it must give these tokens back
        kept = text is not None and answer_ids(backbone, text, bpe) == ids
        out.append(text if kept else None)
        if text is not None and not kept:
            unread.append(text)
    if unread:
        warnings.warn(f"the model says the answer of {len(unread)} of {len(facts)} facts inside an answer of its own "
                      f"whose text does not read back as the same tokens (e.g. {unread[0][:80]!r}); those facts are "
                      "keyed on their answer as given", stacklevel=2)
    return out


def said_facts(backbone, facts, *, batch_size: int = 32) -> list:
    """The facts, each whose answer the model says inside an answer of its own (`own_answers`) with
    that answer as its object, its target and its id kept (a Fact without an id keeps the one its
    request's answer gives it): the rewrite memory keys it, and its method leaves out of the radii's
    calibration the rows that answer so (module docstring). Facts known by their id alone are kept as
    they are."""
    facts = fact_list(facts)
    asked = [i for i, f in enumerate(facts) if fact_field(f, "prompt") and fact_field(f, "object")]
    if not asked:
        return facts
    own = own_answers(backbone, [facts[i] for i in asked], batch_size=batch_size)
    out = list(facts)
    for i, text in zip(asked, own):
        if text is not None:
            f = facts[i]
            out[i] = replace(f, object=text, fact_id=fact_id(f)) if isinstance(f, Fact) else Fact(
                subject=fact_field(f, "subject"), prompt=fact_field(f, "prompt"), object=text,
                target=fact_field(f, "target"), fact_id=fact_id(f))
    return out


def _with_object(fact, text: str) -> Fact:
    """The fact with `text` as its answer (its keys are then read on states of the target)."""
    if isinstance(fact, Fact):
        return replace(fact, object=text)
    return Fact(subject=fact_field(fact, "subject"), prompt=fact_field(fact, "prompt"), object=text, target=text,
                fact_id=fact_id(fact))


__all__ = ["RewriteMemory", "token_values", "value_table", "write_site", "own_answers", "said_facts", "FORMAT", "DEFAULT_ALPHA",
           "STATE_PADS", "LAST_STEP_PADS", "OWN_ANSWER_LENGTH"]

"""Per-token residuals over the states the sampler visits: subject keys of facts, and background tokens.

The paper reads one key per fact, the mean residual over the subject's tokens on a fully unmasked
cloze input [prompt | object]. While an answer is being denoised the model instead sees
[prompt | object with a fraction t of it masked], and the residual of each subject token moves
with t and with its own context. This file reads those residuals one token at a time:

    keys, owner, slot = subject_keys(backbone, site, facts, n_states=4, seed=0)
        # keys [E, H]: one row per subject-token occurrence per state (the subject's tokens in the
        # prompt, and any unmasked repetition of the subject inside the answer; objects=True: every
        # unmasked answer token); owner [E]: its fact; slot [E]: which subject token (-1: none)
    tokens = state_tokens(backbone, site, texts_or_rows, n_states=2, seed=0)
        # [N, H]: every real token of every state of the background (what the radius is measured on)
    deltas = state_deltas(backbone, site, facts, n_states=8, seed=0)
        # [F, H]: the paper's v_t - v_o, averaged over partially masked states instead of the cloze

States are built as the MDLM objective masks answers (`encoding.mask_answers`): state 0 of every
fact is fully masked (the start of generation), the others mask a fraction t ~ U(eps, 1). A
background text without a question/answer split has every token maskable.
"""

from __future__ import annotations

import hashlib

import torch

from timerome.common.progress import progress_bar
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import (DEFAULT_TARGET, answer_ids, collate, encode_fact, fact_id, mask_answers, pad_id,
                                      pad_sequences, uses_leading_space)
from timerome.engine.hooks import run_to
from timerome.engine.likelihood import pair_generator
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError


def _items(backbone, facts, target=None):
    bpe = uses_leading_space(backbone)
    return [encode_fact(backbone, f, i, target=target, bpe=bpe) for i, f in enumerate(facts)]


def fact_stream(fact) -> int:
    """A stable integer of a fact's id, its stream of masks (`pair_generator(seed, this)`): its states are
    drawn from (seed, this) alone, so a fact gets the same keys whether it is inserted alone or in a batch."""
    return int(hashlib.sha1(fact_id(fact).encode()).hexdigest()[:15], 16)


def _states(backbone, pairs, n_states: int, seed: int, streams=None, eps: float = LIKELIHOOD.eps, pads=None):
    """(noisy ids, clean ids, attention) [n_states * P, L] for (prompt ids, answer ids) pairs,
    state-major (row s * P + p is state s of pair p); state 0 of each pair fully masked. Pair p's
    masks come from its own generator `pair_generator(seed, streams[p])` (default: p). pads: state s
    appends pads[s % len(pads)] end-of-text tokens to the answer (maskable like it), as the sampler's
    answer region runs past the answer (None, or a tokenizer without one: nothing appended)."""
    if n_states < 1:
        raise TimeromeError(f"n_states must be >= 1, got {n_states}")
    P, pad = len(pairs), pad_id(backbone)
    eos, extra = _end_of_text(backbone, n_states, pads)
    streams = range(P) if streams is None else streams
    noisy, clean = [None] * (n_states * P), [None] * (n_states * P)
    for p, (stream, (q, a)) in enumerate(zip(streams, pairs)):
        variants = [(list(q), list(a) + [eos] * _room(backbone, q, a, e)) for e in extra]
        ids, ans, _ = collate(variants, pad, "cpu")
        x, _, _ = mask_answers(ids, ans, backbone.mask_id, pair_generator(seed, stream), eps, fully_masked=1)
        for s in range(n_states):
            n = len(variants[s][0]) + len(variants[s][1])
            noisy[s * P + p], clean[s * P + p] = (x[s, :n].tolist(), []), variants[s]
    clean, _, att = collate(clean, pad, "cpu")
    x, _, _ = collate(noisy, pad, "cpu")
    dev = backbone.device
    return x.to(dev), clean.to(dev), att.to(dev)


def _end_of_text(backbone, n_states: int, pads) -> tuple[int | None, list[int]]:
    """(end-of-text id, how many follow the answer in each of n_states states): pads[s % len(pads)],
    or none at all without pads or an end-of-text token."""
    eos = getattr(backbone.tokenizer, "eos_token_id", None)
    return eos, [0] * n_states if not pads or eos is None else [int(pads[s % len(pads)]) for s in range(n_states)]


def _room(backbone, q, a, e: int) -> int:
    """How many of e end-of-text tokens fit after prompt q and answer a."""
    return min(e, max(0, backbone.max_length - len(q) - len(a)))


def _residuals(backbone, site, ids, att, batch_size: int, progress: str | None = None):
    """The site's output [B, L, H] (float32) in batches; the layers above never run. progress: a bar's
    label (common.progress: on stderr, and only for work that lasts), None: no bar."""
    out = []
    with progress_bar(progress or "", total=len(ids), enabled=progress is not None) as bar:
        for s in range(0, len(ids), batch_size):
            out.append(run_to(backbone, site, ids[s:s + batch_size], att[s:s + batch_size]).float())
            bar.advance(len(out[-1]))
    return torch.cat(out)


def _real_residuals(backbone, site, ids, att, batch_size: int, progress: str | None = None) -> torch.Tensor:
    """The site's output [N, H] (float32, CPU) at every real token of ids [B, L] (att: real tokens), row by
    row in order, as `_residuals(...)[att]` gives it; the rows go in order of length as `_residuals_at`'s
    (each row reads what it reads alone; the calibration states of the embedded model's training rows are
    68 % real tokens, padded to the longest)."""
    extent = torch.where(att.any(1), att.shape[1] - att.flip(1).int().argmax(1), 0).tolist()  # last real + 1
    counts = att.sum(1)
    start = (counts.cumsum(0) - counts).tolist()  # each row's first token in the output
    counts = counts.tolist()
    out = torch.empty(sum(counts), backbone.hidden_size)
    for idx in _by_length(extent, batch_size, progress):
        L = max(extent[i] for i in idx)
        real = att[idx, :L]
        h = run_to(backbone, site, ids[idx, :L], real)
        out[torch.cat([torch.arange(start[i], start[i] + counts[i]) for i in idx])] = h[real].float().cpu()
    return out


def _residuals_at(backbone, site, rows, batch_size: int, progress: str | None = None) -> torch.Tensor:
    """The site's output [N, H] (float32, CPU) at one position of each of `rows` ((ids, position) pairs),
    the layers above never run. The rows go in order of length, each batch cut to its longest row, so
    that a batch is mostly of one length and unpadded: each row reads what it reads alone (a padded batch
    differs in the last bits: the padded keys join the attention's sums) and no block computes padding
    (8,192 of the rewrite memory's 74,436 last-step rows took 27 % less time than padded to the longest of
    4,096 at a time)."""
    out = torch.empty(len(rows), backbone.hidden_size)
    for idx in _by_length([len(ids) for ids, _ in rows], batch_size, progress):
        ids, real = pad_sequences([rows[i][0] for i in idx], backbone)
        h = run_to(backbone, site, ids, real)
        out[idx] = h[torch.arange(len(idx)), torch.tensor([rows[i][1] for i in idx])].float().cpu()
    return out


def _by_length(lengths: list[int], batch_size: int, progress: str | None):
    """The row indices in batches of `batch_size`, in order of length (ties in their order); the bar labelled
    `progress` (None: none) advances as each batch is done."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    with progress_bar(progress or "", total=len(order), enabled=progress is not None) as bar:
        for s in range(0, len(order), batch_size):
            yield order[s:s + batch_size]
            bar.advance(len(order[s:s + batch_size]))


def _occurrences(seq: list[int], pattern: list[int], start: int) -> list[tuple[int, int]]:
    """(position, index in the pattern) of every token of every occurrence of `pattern` in `seq`
    at or after `start`."""
    n, out = len(pattern), []
    for i in range(start, len(seq) - n + 1):
        if seq[i:i + n] == pattern:
            out += [(i + j, j) for j in range(n)]
    return out


def _fact_states(backbone, coordinate, facts, n_states, seed, pads, what: str):
    """(site, items, (prompt ids, answer ids) per fact, _states' (noisy, clean, attention)) of facts."""
    facts = list(facts)
    if not facts:
        raise TimeromeError(f"no facts to read {what} for")
    site = Coordinate.of(coordinate).on(backbone).site
    items = _items(backbone, facts)
    pairs = [(it.prompt_ids.tolist(), it.object_ids.tolist()) for it in items]
    return site, items, pairs, _states(backbone, pairs, n_states, seed, [fact_stream(f) for f in facts], pads=pads)


@torch.no_grad()
def subject_keys(backbone, coordinate, facts, *, n_states: int = 4, seed: int = 0, objects: bool = False,
                 masked: bool = False, pads=None,
                 batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residuals at every subject-token occurrence of every state: keys [E, H] float64 (CPU),
    owner [E] long (the index of the fact each key belongs to) and slot [E] long (which of the
    subject's tokens it is: 0, 1, ...). objects: also every other unmasked answer token (the
    object's evidence, read in the fact's own context), with slot -1; masked: the masked answer
    positions too (what the model is about to say there), slot -1; pads: end-of-text tokens after the
    answer per state (`_states`; never keyed themselves)."""
    site, items, pairs, (noisy, clean, att) = _fact_states(backbone, coordinate, facts, n_states, seed, pads,
                                                            "subject keys")
    b_idx, p_idx, owner, slot = [], [], [], []
    for b in range(len(noisy)):
        f = b % len(items)
        it = items[f]
        name = it.prompt_ids[it.subject_pos].tolist()
        P = len(it.prompt_ids)
        seen = noisy[b].tolist()
        where = dict(_occurrences(clean[b].tolist(), name, P))
        answer = range(P, P + len(it.object_ids)) if objects else sorted(where)
        in_answer = [(p, where.get(p, -1)) for p in answer if masked or seen[p] != backbone.mask_id]
        for p, j in list(zip(it.subject_pos.tolist(), range(len(name)))) + in_answer:
            b_idx.append(b), p_idx.append(p), owner.append(f), slot.append(j)
    order = sorted(range(len(owner)), key=lambda i: owner[i])  # fact-major: a batch = its facts one by one
    b_idx, p_idx, owner, slot = ([x[i] for i in order] for x in (b_idx, p_idx, owner, slot))
    h = _residuals(backbone, site, noisy, att, batch_size)
    keys = h[torch.tensor(b_idx), torch.tensor(p_idx)].double().cpu()
    if not torch.isfinite(keys).all():
        raise TimeromeError(f"subject keys are NaN/inf at layer {site[0]} {site[1]} (the model overflows; try float32)")
    return keys, torch.tensor(owner), torch.tensor(slot)


def _last_steps(backbone, pairs, pads):
    """(ids, masked position, pair index) of the last step of any reveal order: each pair's answer
    committed but for one position, followed by each count of `pads` committed end-of-text."""
    eos = getattr(backbone.tokenizer, "eos_token_id", None)
    out = []
    for e, f, (q, a) in _last_step_pairs(backbone, pairs, pads):
        done = list(q) + list(a) + [eos] * _room(backbone, q, a, e)
        for j in range(len(a)):
            row = list(done)
            row[len(q) + j] = backbone.mask_id
            out.append((row, len(q) + j, f))
    return out


def _last_step_pairs(backbone, pairs, pads):
    """(end-of-text count, pair index, pair) in the order `_last_steps` lists their last steps (one per
    answer position of each)."""
    eos = getattr(backbone.tokenizer, "eos_token_id", None)
    for e in (dict.fromkeys(int(x) for x in pads) if pads and eos is not None else [0]):
        for f, pair in enumerate(pairs):
            yield e, f, pair


@torch.no_grad()
def answer_keys(backbone, coordinate, facts, *, n_states: int = 4, seed: int = 0, pads=None, offsets=None,
                last_pads=None, batch_size: int = 32, progress: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals at the masked answer positions of the states the sampler visits, for each fact's
    answer (its `object`): keys [E, H] float64 (CPU) and owner [E] (the fact's index).

    Two kinds of state: `n_states` random ones as `_states` draws them (the first fully masked, the
    start of generation; pads: end-of-text after the answer), and the last step of any reveal order,
    the answer committed but for one position (each position in turn, followed by each count of
    `pads` committed end-of-text). A masked position says what the model is about to write there, in that context:
    the fact being asked, never only the token already there. progress: a progress bar's label (None: none)."""
    site, items, pairs, (noisy, _, att) = _fact_states(backbone, coordinate, facts, n_states, seed, pads,
                                                        "answer keys")
    keyed = [set(range(len(a))) if offsets is None else set(offsets[f]) for f, (_, a) in enumerate(pairs)]
    rows = [noisy[b, :int(att[b].sum())].tolist() for b in range(len(noisy))]
    owners = [b % len(pairs) for b in range(len(rows))]
    spots = [[len(pairs[f][0]) + j for j in sorted(keyed[f]) if rows[b][len(pairs[f][0]) + j] == backbone.mask_id]
             for b, f in enumerate(owners)]
    for row, spot, f in _last_steps(backbone, pairs, pads if last_pads is None else last_pads):
        if spot - len(pairs[f][0]) in keyed[f]:
            rows.append(row), spots.append([spot]), owners.append(f)
    ids, real = pad_sequences(rows, backbone)
    h = _residuals(backbone, site, ids, real, batch_size, progress)
    b_idx = [b for b, ps in enumerate(spots) for _ in ps]
    p_idx = [p for ps in spots for p in ps]
    owner = [owners[b] for b, ps in enumerate(spots) for _ in ps]
    order = sorted(range(len(owner)), key=lambda i: owner[i])  # fact-major, as subject_keys
    keys = h[torch.tensor([b_idx[i] for i in order]), torch.tensor([p_idx[i] for i in order])].double().cpu()
    if not torch.isfinite(keys).all():
        raise TimeromeError(f"answer keys are NaN/inf at layer {site[0]} {site[1]} (the model overflows; try float32)")
    return keys, torch.tensor([owner[i] for i in order])


@torch.no_grad()
def state_tokens(backbone, coordinate, texts, *, n_states: int = 2, seed: int = 0, batch_size: int = 32,
                 max_tokens: int | None = None, pads=None, last_steps=False, progress: str | None = None) -> torch.Tensor:
    """Residuals [N, H] float32 (CPU) of every real token of `n_states` states of each text.

    texts: strings (every token maskable) or question/answer rows (the answer is masked, as the
    likelihood and the sampler do). max_tokens keeps an evenly spaced subset (None: all). pads:
    end-of-text tokens appended to the answers per state (`_states`). last_steps: also the masked
    position of every last-step state of each row (`answer_keys`' second kind of state), with these
    end-of-text counts (True: `pads`). progress: a progress bar's label (None: none).
    """
    site = Coordinate.of(coordinate).on(backbone).site
    pairs, _ = _text_pairs(backbone, texts)
    noisy, _, att = _states(backbone, pairs, n_states, seed, pads=pads)
    h = _real_residuals(backbone, site, noisy, att, batch_size, progress)
    if last_steps:
        steps = _last_steps(backbone, [(q, a) for q, a in pairs if a], pads if last_steps is True else last_steps)
        h = torch.cat([h, _residuals_at(backbone, site, [(row, p) for row, p, _ in steps], batch_size,
                                        progress and f"{progress} (last steps)")])
    if max_tokens is not None and len(h) > max_tokens:
        h = h[torch.linspace(0, len(h) - 1, max_tokens).round().long()]
    if not torch.isfinite(h).all():
        raise TimeromeError(f"calibration residuals are NaN/inf at layer {site[0]} {site[1]}")
    return h


def _text_pairs(backbone, texts) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """((prompt ids, answer ids) of each text that has a token, the index in `texts` of each): a
    question/answer row's answer is masked, a string's every token (its prompt is the sequence start,
    `Backbone.prompt_start`)."""
    pairs, index, bpe = [], [], uses_leading_space(backbone)
    for i, t in enumerate(texts):
        if isinstance(t, dict):
            q, a = backbone.encode_prompt(t["question"]), answer_ids(backbone, t["answer"], bpe)
        else:  # every token of the text is maskable; the sequence start is not
            q, a = backbone.prompt_start, backbone.encode(t)
        q, a = q[: backbone.max_length], a[: max(0, backbone.max_length - len(q))]
        if a or (isinstance(t, dict) and len(q) > len(backbone.prompt_start)):  # a lone start reads nothing
            pairs.append((q, a)), index.append(i)
    if not pairs:
        raise TimeromeError("the calibration corpus is empty: give at least one non-empty text")
    return pairs, index


def state_token_rows(backbone, texts, *, n_states: int = 2, pads=None, last_steps=False) -> torch.Tensor:
    """[N] the index in `texts` of each residual `state_tokens` returns for them (same arguments, no
    max_tokens), in its order, without running the model: which text each calibration token is from."""
    pairs, index = _text_pairs(backbone, texts)
    _, extra = _end_of_text(backbone, n_states, pads)
    counts = [len(q) + len(a) + _room(backbone, q, a, e) for e in extra for q, a in pairs]  # state-major
    owner = torch.tensor(index * n_states).repeat_interleave(torch.tensor(counts))
    if last_steps:
        answered = [(i, (q, a)) for i, (q, a) in zip(index, pairs) if a]
        steps = _last_step_pairs(backbone, [p for _, p in answered], pads if last_steps is True else last_steps)
        owner = torch.cat([owner, torch.tensor([answered[f][0] for _, f, (_, a) in steps for _ in a],
                                               dtype=torch.long)])
    return owner


@torch.no_grad()
def state_deltas(backbone, coordinate, facts, *, target: str = DEFAULT_TARGET, n_states: int = 8,
                 seed: int = 0, batch_size: int = 32) -> torch.Tensor:
    """d = v_t - v_o [F, H] float64 with v_o (v_t) the mean residual over the object (target)
    positions of n_states partially masked [prompt | object (target)] states."""
    site = Coordinate.of(coordinate).on(backbone).site
    items = _items(backbone, facts, target)
    means = []
    for answer in ("object_ids", "target_ids"):
        pairs = [(it.prompt_ids.tolist(), getattr(it, answer).tolist()) for it in items]
        noisy, _, att = _states(backbone, pairs, n_states, seed, [fact_stream(f) for f in facts])
        h = _residuals(backbone, site, noisy, att, batch_size).double()
        w = torch.zeros(att.shape, dtype=torch.float64, device=h.device)
        for b, (q, a) in enumerate(pairs * n_states):
            w[b, len(q):len(q) + len(a)] = 1.0 / len(a)
        v = torch.einsum("bl,blh->bh", w, h).view(n_states, len(items), -1).mean(0)
        means.append(v.cpu())
    return means[1] - means[0]

"""The temporal indirect effect (paper Eqs. tie and tie_agg), on one denoising trajectory.

The trajectory of a fact z = (subject s, prompt, object o), with G = len(object tokens):

    x_0 = [prompt | mask * G]; forward k (k = 0..K-1) reads x_k and reveals tokens as the sampler
    does (temperature 0, low-confidence remasking, one block of length G, `transfer_schedule`
    budgets); one extra scoring forward reads the final x_K, so k' = K exists (state.step = K).
    log p(o | x_k) = sum over the G object positions i of a log-prob of o_i from aligned logits:
      readout="decided" (default, `settings.TRACE.readout`): forward k's log_softmax(logits)[i, o_i] while i
        is masked in x_k; once i is committed, the value from the forward that committed it, frozen from then on;
      readout="aligned": forward k's log_softmax(logits)[i, o_i] at every position, masked or not.
    (read_positions="no_subject", beyond the paper: the sum leaves out the positions where the answer
    repeats the subject's tokens, `scored_positions`; "all", the default, sums every position.)
    Why "decided" is the default: an MDLM is trained on masked positions only, so its logits at
    committed positions are untrained; with "aligned" a perfectly memorised fact's clean log p
    falls from 0 at x_0 to tens of nats below at x_K while the clean run commits exactly o.
    What "decided" carries (our reading; the paper does not say which logits score a committed
    position): a position the patched forward k itself commits keeps forward k's log-prob, so
    TIE(l, k, m, k') for k' > k includes the splice's direct effect on the tokens it decides, not
    only its effect through the later steps (an object of one token: TIE(k, k') is that direct effect
    for every k' > k, and 0 at every later k). "aligned" reads every later forward anew.

Three runs of that trajectory: clean; corrupted (e_i + sigma * eps_i on the subject embeddings at
every forward, eps drawn once per noise sample); patched at (l, k, m) (the corrupted run with
h(l, k, m) at the subject positions set to the clean run's at forward k only). Then

    TIE(l, k, m, k')  = log p(o | do(h = h_clean), x_k') - log p(o | x^corr_k'),   k' = k+1..K
    TIE_bar(l, k, m)  = sum_{k' > k} w_{k,k'} TIE(l, k, m, k'),  w ∝ exp(-tau (k' - k)), sum w = 1

each averaged over the noise samples. `literal_tie` runs this definition literally, one trajectory
at a time; `timerome.tracing.wavefront` computes the same numbers fast.
"""

from __future__ import annotations

import warnings

import torch

from timerome.data.facts import has_words
from timerome.engine.hooks import Hooks, TraceState, capture, denoising_steps, patch
from timerome.engine.sampler import denoise_step, transfer_schedule
from timerome.engine.settings import TRACE
from timerome.errors import TimeromeError

REMASKING = "low_confidence"
READOUTS = ("decided", "aligned")
# how the corruption's noise is drawn (`causal_trace.prepare`): "in_order", one generator seeded with the
# trace's seed, drawn fact after fact (the default: the numbers every page shows), so a fact's draws depend
# on the facts before it; "per_fact", each fact's own generator seeded by (seed, its prompt's tokens, its
# subject's positions), as ROME re-seeds its noise for every fact: a fact gets the same draws whatever it
# is traced with (with a fixed sigma, the same TIE up to float rounding; the s3 sigma still depends on the
# facts traced). Beyond the paper, which does not say how its noise is drawn.
NOISE_DRAWS = ("in_order", "per_fact")
# which answer positions log p(o | x_k) sums over: "all" (the default: every position of the answer, the
# paper's log p of the object's tokens); "no_subject" leaves out the positions where the answer repeats the
# subject's own tokens ("Isgor Quielson was born in Pellmoor ." scores "was born in Pellmoor ."), so that a
# TIE is the model restoring the fact, not the name it echoes from the prompt (`scored_positions`). The
# trajectory is the same either way: those positions are still denoised and revealed, only not summed.
# Beyond the paper, which scores the object; docs/ar-contrast.md measures what the echo carries.
READ_POSITIONS = ("all", "no_subject")


# ------------------------------------------------------------------------------ the definition


def tie(patched_logp: torch.Tensor, corrupted_logp: torch.Tensor) -> torch.Tensor:
    """Eq. tie: log p(o | do(h = h_clean), x_k') - log p(o | x^corr_k'), averaged over noise samples.

    patched_logp [..., N, K + 1], corrupted_logp [N, K + 1] (N noise samples) -> [..., K + 1].
    """
    return (patched_logp - corrupted_logp).mean(-2)


def later_steps(steps: int) -> torch.Tensor:
    """Bool [K, K + 1]: True where k' > k, the (k, k') pairs a TIE is defined for."""
    return torch.arange(steps + 1)[None, :] > torch.arange(steps)[:, None]


def tie_weights(steps: int, tau: float) -> torch.Tensor:
    """w [K, K + 1] (float64): w[k, k'] ∝ exp(-tau (k' - k)) over k' > k, rows summing to 1; 0 elsewhere."""
    gap = (torch.arange(steps + 1)[None, :] - torch.arange(steps)[:, None]).double()
    # a softmax of -tau (k' - k) over the later steps: normalised, and stable for any tau
    return torch.where(later_steps(steps), -float(tau) * gap, -torch.inf).softmax(-1)


def aggregate(tie_full: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. tie_agg: TIE_bar = sum_{k' > k} w_{k,k'} TIE(k'): tie_full [..., K, K + 1] -> [..., K]."""
    K = tie_full.shape[-2]
    vals = torch.where(later_steps(K), tie_full.double(), 0.0)  # the NaN at k' <= k meet no weight
    return (vals * tie_weights(K, tau)).sum(-1).to(tie_full.dtype)


# ------------------------------------------------------------------------------ one trajectory


def object_logprobs(gen_logits: torch.Tensor, object_ids: torch.Tensor, only: torch.Tensor | None = None) -> torch.Tensor:
    """log p(o_i | x) per object position: gen_logits [B, G, V] (the answer region) -> [B, G] float32.

    only [B, G] (bool): compute these positions alone, NaN elsewhere (readout "decided" reads the
    masked positions only; each position's value reads its own logits alone, so it is the same).
    """
    obj = object_ids.to(gen_logits.device).expand(gen_logits.shape[:2])
    if only is not None:
        out = torch.full(gen_logits.shape[:2], torch.nan, device=gen_logits.device)
        logits = gen_logits[only].float()  # [M, V]
        out[only] = logits.gather(-1, obj[only][:, None]).squeeze(-1) - logits.logsumexp(-1)
        return out
    logits = gen_logits.float()
    picked = logits.gather(-1, obj[..., None]).squeeze(-1)
    return picked - logits.logsumexp(-1)


def read_out(pos: torch.Tensor, masked: torch.Tensor, decided: torch.Tensor, readout: str,
             scored: torch.Tensor | None = None):
    """log p(o | x_k) [B] from this forward's per-position log-probs pos [B, G].

    masked [B, G]: positions still masked in x_k. decided [B, G]: each position's log-prob from
    the forward that last saw it masked. scored [B, G] (bool, broadcastable): the positions summed
    (`scored_positions`); None: all. Returns (score [B], updated decided).
    """
    decided = torch.where(masked, pos, decided)
    return summed(pos if readout == "aligned" else decided, scored), decided


def summed(values: torch.Tensor, scored: torch.Tensor | None) -> torch.Tensor:
    """values [B, G] summed over the positions `scored` (bool, broadcastable; None: all of them)."""
    return (values if scored is None else values.masked_fill(~scored, 0.0)).sum(-1)


def scored_positions(item, read_positions: str = TRACE.read_positions) -> torch.Tensor | None:
    """The answer positions log p(o | x_k) sums over (`READ_POSITIONS`), bool [G]; None for "all".
    "no_subject": every answer position but those inside a repeat of the subject's tokens (the prompt's
    tokens at the subject positions, the same ids in the same order); indices count from the answer's
    first token. An answer that spells the subject with other tokens has no repeat found: every position
    is scored, with a warning where the subject's text is in the answer; an answer that is all the
    subject scores nothing (its TIE is 0), with a warning."""
    if read_positions not in READ_POSITIONS:
        raise TimeromeError(f"unknown read_positions {read_positions!r}; choose one of {', '.join(READ_POSITIONS)}")
    if read_positions == "all":
        return None
    subject = item.prompt_ids[item.subject_pos].tolist()
    answer, S = item.object_ids.tolist(), len(subject)
    keep = torch.ones(len(answer), dtype=torch.bool)
    for start in range(len(answer) - S + 1):
        if answer[start:start + S] == subject:
            keep[start:start + S] = False
    name = f"fact {item.fact_id!r}"
    if keep.all() and has_words(item.object, item.subject):  # the name, as words
        warnings.warn(f"{name}: its answer names the subject {item.subject!r} in other tokens than its prompt "
                      "does, so read_positions='no_subject' leaves nothing of it out", stacklevel=2)
    elif not keep.any():
        warnings.warn(f"{name}: every token of its answer repeats the subject {item.subject!r}, so "
                      "read_positions='no_subject' scores nothing of it and its TIE is 0", stacklevel=2)
    return keep


def reveal(x_gen: torch.Tensor, gen_logits: torch.Tensor, n, mask_id: int) -> torch.Tensor:
    """One sampler step: x_gen [B, G] -> x_gen with n (an int, or one per row) more masks revealed.

    The sampler's own `denoise_step` (temperature 0, low confidence). The answer region, or whole
    rows: the prompt holds no mask, so no prompt position competes for the budget.
    """
    n_reveal = torch.as_tensor(n, dtype=torch.long, device=x_gen.device).expand(x_gen.shape[0])
    return denoise_step(x_gen, gen_logits, x_gen == mask_id, n_reveal, remasking=REMASKING)


def reveal_schedule(n_object: int, steps: int) -> list[int]:
    """Tokens revealed at each of the K steps (the sampler's schedule for one block of G masks)."""
    return transfer_schedule(torch.tensor([n_object]), steps)[0].tolist()


def forwards_read(n_object: int, steps: int, readout: str = TRACE.readout) -> int:
    """How many of the K + 1 forwards of a trajectory read anything: with "decided", those whose
    x_k still holds a masked object position (once every token is committed the log p is frozen,
    and the final scoring forward reads nothing); with "aligned", all of them."""
    if readout != "decided":
        return steps + 1
    budget = reveal_schedule(n_object, steps)
    return sum(1 for k in range(steps + 1) if sum(budget[:k]) < n_object)


@torch.no_grad()
def run_trajectory(backbone, prompt_ids, object_ids, *, steps: int, state: TraceState | None = None,
                   rows: int = 1, readout: str = TRACE.readout,
                   scored: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Denoise [prompt | mask * G] for `steps` steps plus one scoring forward, under whatever hooks
    the caller installed (`state`'s step, and that of every open `Hooks`, is set before every
    forward: `hooks.denoising_steps`). scored [G]: the answer positions summed (`scored_positions`).

    Returns (logp [rows, K + 1], xs [K + 1, rows, P + G]): log p(o | x_k) and the input x_k of forward k.
    """
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long)
    obj = torch.as_tensor(object_ids, dtype=torch.long).to(backbone.device)
    P, G = len(prompt), len(obj)
    x = torch.full((rows, P + G), backbone.mask_id, dtype=torch.long, device=backbone.device)
    x[:, :P] = prompt.to(backbone.device)
    budget = reveal_schedule(G, steps)
    decided = torch.zeros(rows, G, device=backbone.device)
    scored = None if scored is None else scored.to(backbone.device)
    logps, xs = [], []
    with denoising_steps(backbone, state) as at_step:
        for k in range(steps + 1):
            at_step(k)
            xs.append(x.clone())
            gen_logits = backbone.logits(x)[:, P:]  # [rows, G, V]
            masked = x[:, P:] == backbone.mask_id
            score, decided = read_out(object_logprobs(gen_logits, obj), masked, decided, readout, scored)
            logps.append(score)
            if k < steps:
                x[:, P:] = reveal(x[:, P:], gen_logits, budget[k], backbone.mask_id)
    return torch.stack(logps, 1).cpu(), torch.stack(xs).cpu()


# ------------------------------------------------------------------------------ the corruption (Eq. corrupt)


def subject_noise(noise: torch.Tensor, positions: torch.Tensor, length: int, backbone) -> torch.Tensor:
    """noise [N, S, H] (sigma applied, one row per noise sample) placed at the S subject token
    `positions` of rows of `length` tokens: [N, length, H] in the backbone's dtype and on its
    device, 0 at every other token (what `add_noise` adds to the embeddings)."""
    out = torch.zeros(noise.shape[0], length, backbone.hidden_size, dtype=backbone.dtype, device=backbone.device)
    out[:, positions.to(backbone.device)] = noise.to(device=backbone.device, dtype=backbone.dtype)
    return out


def add_noise(noise):
    """The corruption as an edit of the embeddings, (None, "embed") in `hooks.Hooks`: h [B, L, H] += noise,
    a tensor that broadcasts to h (rows of `subject_noise`, so h becomes e_i + sigma * eps_i at the subject
    tokens and stays e_i elsewhere) or a callable giving the tensor of the forward in flight (the batched
    traces set it before every forward). In place: the embedding's output is its own fresh tensor, read by
    nothing before. The one noise hook of every trace (`literal_tie`, the wavefront, the positional trace)."""
    current = noise if callable(noise) else (lambda: noise)

    def fn(h, _state):
        h += current()
        return h

    return fn


# ------------------------------------------------------------------------------ the literal reference


@torch.no_grad()
def literal_tie(backbone, items, noises, coords, *, steps: int, tau: float = TRACE.tau,
                readout: str = TRACE.readout,
                read_positions: str = TRACE.read_positions) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, run literally: one full single-row trajectory per (fact, coordinate, sample).

    items: encoded facts; noises: per fact [N, S, H] (sigma applied), as `tracing.prepare` makes
    them; coords: (layer, step, module) triples. Returns (tie [F, n_coords], tie_full [F, n_coords, K + 1]).
    """
    K = steps
    sites = sorted({(l, m) for l, _, m in coords}, key=str)
    full = torch.full((len(items), len(coords), K + 1), torch.nan)
    for f, (it, noise) in enumerate(zip(items, noises)):
        pos = it.subject_pos.to(backbone.device)
        scored = scored_positions(it, read_positions)
        run = lambda st: run_trajectory(backbone, it.prompt_ids, it.object_ids, steps=K, state=st,  # noqa: E731
                                        readout=readout, scored=scored)[0][0]
        state = TraceState()
        with capture(backbone, sites, state, positions=pos) as store:
            run(state)
        corrupted, patched = [], [[] for _ in coords]
        length = len(it.prompt_ids) + len(it.object_ids)
        for s in range(noise.shape[0]):
            corrupt = add_noise(subject_noise(noise[s:s + 1], pos, length, backbone))
            with Hooks(backbone, edit={(None, "embed"): corrupt}, state=state):
                corrupted.append(run(state))
                for c, (l, k, m) in enumerate(coords):
                    with patch(backbone, {(l, m): store[(l, m)][k]}, pos, state=state, at_step=k):
                        patched[c].append(run(state))
        corr = torch.stack(corrupted)  # [N, K + 1]
        for c, (_, k, _) in enumerate(coords):
            full[f, c, k + 1:] = tie(torch.stack(patched[c]), corr)[k + 1:]
    w = tie_weights(K, tau).to(full.dtype)  # [K, K + 1]
    ties = torch.zeros(len(items), len(coords))
    for c, (_, k, _) in enumerate(coords):
        ties[:, c] = (full[:, c, k + 1:] * w[k, k + 1:]).sum(-1)  # Eq. tie_agg at the patched step k
    return ties, full

"""LLaDA's low-confidence remasking sampler, plus Dream-style confidence variants.

x starts as [prompt | mask * gen_length]. The generated part is split into blocks filled left to
right (semi-autoregressive); inside a block, each step runs ONE forward, predicts a token x0 for
every position, and reveals the masked positions with the highest confidence. How many are
revealed per step follows `transfer_schedule` (the linear noise schedule: equal shares, the
remainder going to the earliest steps).

Faithful to the reference (ML-GSAI/LLaDA generate.py), quirks included:
- masked positions anywhere before the end of the current block compete for the step's budget,
  mask tokens inside the prompt included;
- temperature sampling is Gumbel-max in float64 written as exp(logits) / (-log U)^T, U ~ U[0, 1);
  at temperature 0 no noise is drawn (argmax of the logits);
- `random` remasking draws its confidences (float32) after the Gumbel noise;
- classifier-free guidance batches [cond; uncond] in one forward, uncond having every initial
  non-mask position (the prompt) set to mask, and mixes u + (cfg + 1)(c - u) in the logits' dtype;
- the n_reveal[b] most confident positions of row b are torch.topk(conf[b], n_reveal[b])'s, ties
  included. At temperature 0 with low-confidence remasking the float64 softmax is computed only
  where it decides: rows are ordered by a float32 sum with a proven error bound, and a row the bound
  cannot settle takes the float64 softmax (`_screened_confidences`; the same tokens, tested).

Dream-style confidences ("maskgit_plus", "margin", "entropy") plug into the same block schedule;
like Dream they are read from softmax(logits / T) (softmax(logits) at T = 0), in float64.

Fast options (Fast-dLLM, Wu et al. 2025), off by default; the default path above is unchanged:
- cache="prefix" | "dual": an approximate key/value cache (`Backbone.kv_cache`, timerome's own
  LLaDA / MMaDA / LLaDA-MoE implementations). At the first step of every block a refresh forward
  computes every position and stores each layer's keys and values; every step then recomputes
  only a window, [block start, end of x) for "prefix", the block itself for "dual", attending
  over the stored keys/values of the other positions (stale since the refresh). Only the block's
  masked positions compete for the reveal (the reference also lets mask tokens inside the prompt
  compete). refresh_every=n refreshes again every n steps inside a block; refresh_every=1
  recomputes everything at every step and, at temperature 0, gives the reference's tokens through
  the cached code path (the tests check it, with and without an edit installed).
- threshold=tau: each step reveals every candidate position whose confidence is >= tau, and at
  least the most confident one, until the block is filled (so `steps` no longer fixes the number
  of steps: a block takes 1..block_length steps). Needs a probability-valued confidence
  (low_confidence, maskgit_plus, margin).
Hooks see what each forward computes: an edit acts on every position when its keys/values are
computed (at a refresh: all of them; in a partial forward: the window's), and `state.step` is set
once per denoising step, whatever forwards the step makes.

A causal (autoregressive) backbone decodes left to right instead: one forward per generated token
over the prefix decoded so far, the next token argmax (temperature 0) or drawn from softmax(l / T)
as above; `state.step` is the token's index. steps, block_length and remasking do not apply there
(they are still checked); the cache, threshold and classifier-free guidance, which are diffusion
options, are refused.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from timerome.backbones.backbone import model_arg
from timerome.common.checks import budget, generator_arg, integer, number
from timerome.common.progress import progress_bar
from timerome.engine.encoding import fit, integer_ids, pad_id, prompt_text_ids
from timerome.engine.hooks import answer_region, denoising_steps, refuse_unreached_open
from timerome.engine.settings import SAMPLER
from timerome.errors import TimeromeError

REMASKING = ("low_confidence", "random", "maskgit_plus", "margin", "entropy")
CACHES = ("prefix", "dual")
THRESHOLD_REMASKING = ("low_confidence", "maskgit_plus", "margin")  # confidences that are probabilities


def transfer_schedule(mask_count: torch.Tensor, steps: int) -> torch.Tensor:
    """How many tokens to reveal at each step: mask_count [B] -> [B, steps], rows sum to mask_count.

    Every step gets mask_count // steps; the remainder adds one to each of the earliest steps.
    """
    mask_count = torch.as_tensor(mask_count, dtype=torch.long)
    base = mask_count // steps
    rem = mask_count % steps
    first = torch.arange(steps, device=mask_count.device)[None, :] < rem[:, None]  # [B, steps]
    return base[:, None] + first.long()


@torch.no_grad()
def generate(backbone, prompt_ids, *, steps: int = SAMPLER.steps, gen_length: int = SAMPLER.gen_length, block_length: int = SAMPLER.block_length,
             temperature: float = SAMPLER.temperature, cfg_scale: float = SAMPLER.cfg_scale, remasking: str = SAMPLER.remasking,
             generator: torch.Generator | None = None, state=None,
             on_step: Callable[[int, torch.Tensor], None] | None = None,
             attention_mask: torch.Tensor | None = None, cache: str | None = None,
             threshold: float | None = None, refresh_every: int | None = None) -> torch.Tensor:
    """Fill gen_length masks after prompt_ids [B, P] (or [P], or a string); returns LongTensor [B, P + gen_length].
    P = 0 (an empty id tensor) generates unconditionally on an MDLM (an autoregressive model needs a
    start token: refused); a blank text is refused.

    state: any object with an int `step`; set to k before the forwards of denoising step k
        (k = 0..steps-1; with a threshold, as many steps as the blocks take), and back to what it
        was on return. Every hook on the backbone sees the step without it (`hooks.denoising_steps`).
    on_step(k, x): called after step k with (a copy of) the current x [B, P + gen_length].
    An autoregressive model writes one token per step and stops where every row has written its end-of-text
    (a special token): the rest of a finished row is its placeholder id (`until_special` cuts there).
    attention_mask: [B, P] or [B, P + gen_length], False at padding (e.g. left-padded prompts);
        padded positions are never revealed and are hidden from attention.
    generator: every random draw comes from it (default: a Generator seeded 0 on the backbone's
        device); draws are made on the generator's device.
    cache: None (exact, the reference), "prefix" or "dual" (module docstring); refresh_every: with
        a cache, refresh it every n steps inside a block too (None: at block starts only).
    threshold: reveal every candidate whose confidence is >= threshold, at least one per step.
    """
    model_arg(backbone, "generate's backbone")
    device = backbone.device
    prompt = _as_prompt(backbone, prompt_ids, device)
    B, P = prompt.shape
    if P == 0 and getattr(backbone, "causal", False):
        raise TimeromeError("the prompt is empty: an autoregressive model writes each token after the ones before "
                            "it, so it needs one to start from (its BOS or EOS token)")
    generator_arg(generator)
    if state is not None and not hasattr(state, "step"):
        raise TimeromeError(f"state must be an object with a `step` (a TraceState) or None, got "
                            f"{type(state).__name__}")
    check_generation(backbone, P, B, steps=steps, gen_length=gen_length, block_length=block_length,
                     temperature=temperature, cfg_scale=cfg_scale, remasking=remasking, cache=cache,
                     threshold=threshold, refresh_every=refresh_every)
    causal = getattr(backbone, "causal", False)
    refuse_unreached_open(backbone, gen_length if causal else None if threshold is not None else steps,
                          "this generation writes" if causal else "this generation takes")
    if causal:
        with answer_region(backbone, P), denoising_steps(backbone, state) as at_step:
            return _left_to_right(backbone, prompt, gen_length, temperature, generator, at_step, on_step,
                                  attention_mask)
    kv = backbone.kv_cache() if cache is not None else None
    if generator is None:
        generator = torch.Generator(device=device).manual_seed(0)
    mask_id = backbone.mask_id

    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long, device=device)
    x[:, :P] = prompt
    real = _real_positions(attention_mask, B, P, gen_length, device)  # [B, L] bool
    prompt_index = x != mask_id  # frozen: what the unconditional copy masks out

    n_blocks = gen_length // block_length
    steps_per_block = steps // n_blocks
    forward = _Forward(backbone, prompt_index, real, attention_mask, cfg_scale, kv)
    # the answer region of every row starts after the (left-padded) prompt; each step is set in every open Hooks
    with answer_region(backbone, P), denoising_steps(backbone, state) as at_step:
        _denoise(backbone, x, forward, real, P, n_blocks, steps_per_block, block_length, temperature, remasking,
                 generator, at_step, on_step, kv, cache, threshold, refresh_every)
    return x


def _denoise(backbone, x, forward, real, P, n_blocks, steps_per_block, block_length, temperature, remasking,
             generator, at_step, on_step, kv, cache, threshold, refresh_every) -> None:
    """The block loop of `generate`, filling x in place (at_step(k): the forwards that follow are step k's)."""
    mask_id, L = backbone.mask_id, x.shape[1]
    k = 0
    nonfinite = torch.zeros((), dtype=torch.bool, device=x.device)  # read once, at the end: no step waits on it
    for b in range(n_blocks):
        start, end = P + b * block_length, P + (b + 1) * block_length
        n_transfer = transfer_schedule((x[:, start:end] == mask_id).sum(1), steps_per_block)  # [B, spb]
        # the positions each step recomputes: all of them, or the cache's window
        lo, hi = (0, L) if kv is None else (start, L if cache == "prefix" else end)
        i = 0
        while (i < steps_per_block if threshold is None else
               bool(((x[:, start:end] == mask_id) & real[:, start:end]).any())):
            at_step(k)  # once per denoising step: a refresh and its partial forward are one step
            if kv is not None and (i == 0 or (refresh_every is not None and i % refresh_every == 0)):
                forward.refresh(x)
            masked = (x[:, lo:hi] == mask_id) & real[:, lo:hi]
            masked[:, end - lo:] = False  # later blocks wait their turn
            logits = forward(x, lo, hi)
            nonfinite |= (masked & ~torch.isfinite(logits.amax(-1))).any()  # a NaN anywhere in a row: its max is NaN
            n_reveal = n_transfer[:, i] if threshold is None else torch.ones_like(n_transfer[:, 0])
            x[:, lo:hi] = denoise_step(x[:, lo:hi], logits, masked, n_reveal, temperature=temperature,
                                       remasking=remasking, generator=generator, threshold=threshold)
            if on_step is not None:
                on_step(k, x.clone())
            k += 1
            i += 1
    refuse_nonfinite_logits(backbone, nonfinite)


def refuse_nonfinite_logits(backbone, nonfinite: torch.Tensor) -> None:
    """Refuse a generation whose logits held NaN or an infinity where it wrote: finite weights whose activations
    overflow on this input (a weight far out of range, a half-precision dtype) or an edit that makes them; its
    argmax there is arbitrary, and such a model answered nothing or garbage with exit 0 (stop 81)."""
    if bool(nonfinite):
        dtype = getattr(backbone, "dtype", None)  # (a stand-in backbone may have neither)
        raise TimeromeError(f"the logits of {getattr(backbone, 'name', 'the model')} are not finite (NaN or infinite) "
                            "where it writes the answer: its forward overflows on this input"
                            + (f" in {str(dtype).removeprefix('torch.')}" if dtype is not None else "")
                            + " (its weights, or an edit applied to it), so every token written there is arbitrary")


def _left_to_right(backbone, prompt, gen_length, temperature, generator, at_step, on_step,
                   attention_mask) -> torch.Tensor:
    """A causal backbone's generation: token P + i is predicted from x[:, :P + i], one forward each. A row that
    has written a special token (its end-of-text, `until_special`'s set) is finished: its later positions keep
    the placeholder (backbone.mask_id, itself special), and once every row is, the forwards stop (as an AR
    model's own generate stops at its end-of-text; they ran to gen_length, past it into the next chat turns)."""
    device = backbone.device  # cache, threshold and cfg_scale: refused by check_generation (refuse_diffusion_options)
    B, P = prompt.shape
    if generator is None:
        generator = torch.Generator(device=device).manual_seed(0)
    x = torch.full((B, P + gen_length), backbone.mask_id, dtype=torch.long, device=device)
    x[:, :P] = prompt
    real = _real_positions(attention_mask, B, P, gen_length, device)
    am = None if attention_mask is None else real
    specials = torch.tensor(sorted(set(getattr(backbone.tokenizer, "all_special_ids", None) or [])
                                   | {backbone.mask_id}), dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    for i in range(gen_length):
        at_step(i)
        logits = backbone.next_logits(x[:, :P + i], None if am is None else am[:, :P + i])  # [B, V]
        nonfinite |= (~done & ~torch.isfinite(logits.amax(-1))).any()
        x[:, P + i] = torch.where(done, x[:, P + i], _sample(logits, temperature, generator))
        if on_step is not None:
            on_step(i, x.clone())
        done |= torch.isin(x[:, P + i], specials)
        if bool(done.all()):
            break
    refuse_nonfinite_logits(backbone, nonfinite)
    return x


def denoise_step(x: torch.Tensor, logits: torch.Tensor, masked: torch.Tensor, n_reveal: torch.Tensor, *,
                 temperature: float = SAMPLER.temperature, remasking: str = SAMPLER.remasking,
                 generator: torch.Generator | None = None, threshold: float | None = None) -> torch.Tensor:
    """One reveal: x [B, L] with the n_reveal[b] most confident positions of `masked` [B, L] (bool)
    in row b filled from logits [B, L, V]; every other position keeps its token. With a threshold,
    row b reveals max(n_reveal[b], its masked positions whose confidence is >= threshold).

    The sampler's step, public so that tracing commits tokens exactly as generation does.
    """
    if temperature == 0 and remasking != "random":
        # nothing random is drawn: decide the masked positions only (a position's prediction and
        # confidence read its own logits alone, so this is the same as deciding all of them)
        return reveal_masked(x, logits[masked], masked, n_reveal, remasking=remasking, threshold=threshold)
    else:  # the draws cover every position, as the reference's do
        x0 = _sample(logits, temperature, generator)
        conf = _confidence(logits, x0, remasking, temperature, generator)
        x0 = torch.where(masked, x0, x)
        conf = torch.where(masked, conf, -torch.inf)
    if threshold is not None:
        n_reveal = torch.maximum(n_reveal.to(conf.device), (conf >= threshold).sum(1))
    return torch.where(_top_k_per_row(conf, n_reveal), x0, x)


class HeadRead:
    """The passes over logits [M, V] (float32 or lower) that a read-out of log-probabilities and a
    low-confidence reveal both make, made once: the max and argmax, and exp(l - max) in float32.
    buffer: float32 storage on the logits' device for the exponentials (its first M * V entries),
    which a caller making many reads keeps (`HeadRead.buffer_for`) instead of a fresh [M, V] each time
    (on a CPU, fresh pages cost about a fifth of the pass)."""

    def __init__(self, logits: torch.Tensor, buffer: torch.Tensor | None = None):
        lg = logits.float()
        self.logits, self.top = lg, row_max(lg)
        # torch.logsumexp's own steps (an infinite max shifts by 0), so log_normaliser is its value bit for bit
        self.shift = self.top.values.masked_fill(self.top.values.abs() == torch.inf, 0.0)
        out = None if buffer is None else buffer[:lg.numel()].view(lg.shape)
        self.exp = torch.sub(lg, self.shift[:, None], out=out).exp_()
        self._tail_taken = False

    @staticmethod
    def buffer_for(logits: torch.Tensor, buffer: torch.Tensor | None) -> torch.Tensor:
        """buffer if it holds logits' entries (float32 on their device), else a larger one."""
        n = logits.numel()
        if buffer is None or buffer.numel() < n or buffer.device != logits.device:
            return torch.empty(max(n, 0 if buffer is None else 2 * buffer.numel()), dtype=torch.float32,
                               device=logits.device)
        return buffer

    def log_normaliser(self) -> torch.Tensor:
        """log sum_i exp(l_i) [M]: logits.float().logsumexp(-1)."""
        if self._tail_taken:
            raise TimeromeError("HeadRead.log_normaliser after tail_mass: read the normaliser first")
        return self.exp.sum(-1).log_().add_(self.shift)

    def tail_mass(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """sum over the tokens other than the argmax of exp(l_i - max l), float32 sums as float64 [M'] (rows:
        bool [M], those rows only). Consumes the exponentials (the argmax's entries are zeroed in place)."""
        e, idx = (self.exp, self.top.indices) if rows is None else (self.exp[rows], self.top.indices[rows])
        self._tail_taken |= rows is None
        t = e.scatter_(1, idx[:, None], 0.0).sum(1).double()
        inf = self.shift != self.top.values  # an infinite (or NaN) max: no tail; NaN tells the caller to fall back
        return t.masked_fill_(inf if rows is None else inf[rows], torch.nan)


def reveal_masked(x: torch.Tensor, picked: torch.Tensor, masked: torch.Tensor, n_reveal: torch.Tensor, *,
                  remasking: str = SAMPLER.remasking, threshold: float | None = None,
                  head: HeadRead | None = None, screen: bool = True) -> torch.Tensor:
    """`denoise_step` at temperature 0 (low-confidence or margin remasking) from the logits of the
    masked positions alone: picked [M, V] = logits[masked] (row-major), for callers that run the
    vocabulary head at those positions only (the trace engine). Same result as denoise_step.
    Without a threshold, a row that reveals none or all of its masked positions needs no
    confidence: those are computed for the other rows only. head: `HeadRead(picked)` where the
    caller has it (its read-out made those passes already; its exponentials are consumed). screen:
    low-confidence rows ordered by `_screened_confidences` (same tokens); False: the float64 softmax of
    every ranking row, as the reference computes it (the benchmark compares the two)."""
    n_reveal = n_reveal.to(x.device).expand(x.shape[0])
    ranks = (n_reveal > 0) & (n_reveal < masked.sum(1))  # rows whose choice depends on the confidences
    screened = (screen and remasking == "low_confidence" and threshold is None and picked.dtype != torch.float64
                and bool(ranks.any()))
    if screened:
        if head is None:
            head = HeadRead(picked)
        elif head.logits.shape != picked.shape:
            raise TimeromeError(f"head was read from logits of shape {tuple(head.logits.shape)}, not these "
                                f"{tuple(picked.shape)}")
    x0 = x.masked_scatter(masked, head.top.indices if screened else _sample(picked, 0, None))
    conf = torch.full(x.shape, -torch.inf, dtype=torch.float64, device=x.device)
    if threshold is not None or (bool(ranks.all()) and not screened):
        conf[masked] = _confidence(picked, x0[masked], remasking, 0, None).to(torch.float64)
    else:
        some = ranks[masked.nonzero()[:, 0]]  # per masked position: does its row rank?
        conf[masked & ~ranks[:, None]] = 0.0  # finite: a row revealing all takes every one, a row revealing none none
        if screened:
            _screened_confidences(conf, picked, x0, masked, some, n_reveal, ranks, head)
        else:
            conf[masked & ranks[:, None]] = _confidence(picked[some], x0[masked][some], remasking, 0,
                                                        None).to(torch.float64)
    if threshold is not None:
        n_reveal = torch.maximum(n_reveal, (conf >= threshold).sum(1))
    return torch.where(_top_k_per_row(conf, n_reveal), x0, x)


# 2^-24: float32's unit roundoff, 2^-53 float64's
U32, U64 = 2.0 ** -24, 2.0 ** -53


def _screened_confidences(conf, picked, x0, masked, some, n_reveal, ranks, head: HeadRead) -> None:
    """The ranking rows' entries of conf [B, L] for `reveal_masked` at low-confidence remasking without
    a threshold, set in place so that each row's top k are the reference's, without the float64
    softmax where it does not decide (some: per masked position, whether its row ranks). The reference's confidence of a position is c = 1 / (1 + t) in float64, t = the
    sum over the other tokens of exp(l_i - max l), and only which positions of a row reach its top k
    matters. t is summed in float32 (t32), and the true t lies in

        [t32 / ((1 + a)(1 + s)) - V 2^-126,  t32 / ((1 - a)(1 - s)) + V 2^-126],  a = 110 u32, s = (V - 1) u32:

    each term whose value is a normal float is within a of its value (l_i - max rounded once: at most
    87.3 u32 relative there; exp within 2 u32), a smaller one within 2^-126 (subnormal, or zero where
    denormals are flushed), and V positive terms summed in any order within s (Jeannerod & Rump 2013,
    no second-order term; the exact quotients are used, whose first-order forms fail above about
    165,000 tokens). The float64 softmax holds c within (1.37 V + 6) u64 of 1 / (1 + t) (its sum is at
    least 1; eta below allows (2 V + 120) u64). Where a row's k-th and (k + 1)-th smallest t are apart
    by more than both errors, the float32 order decides the row exactly; any other row (near ties,
    confidences within 1e-13 of 1 that float64 rounds together) takes the float64 softmax, as
    `_confidence` computes it."""
    V = picked.shape[-1]
    t = head.tail_mass(None if bool(some.all()) else some)  # mass off the argmax
    conf[masked & ranks[:, None]] = -t  # -t orders as c = 1 / (1 + t)
    if not bool(torch.isfinite(t).all()):
        exact = ranks.clone()
    else:
        k = torch.where(ranks, n_reveal, 1)  # rows that do not rank: any valid k, not read
        kth = conf.topk(int(k[ranks].max()) + 1, dim=1).values     # [B, kmax + 1]: -t, largest first
        t_in = -kth.gather(1, (k - 1)[:, None]).squeeze(1)         # the k-th smallest t: the last revealed
        t_out = -kth.gather(1, k[:, None]).squeeze(1)              # the (k + 1)-th: the first kept masked
        a, s = 110 * U32, (V - 1) * U32  # per term (exp and its argument), the sum (Jeannerod & Rump 2013)
        hi, lo = 1 / ((1 - a) * (1 - s)) * (1 + 1e-9), 1 / ((1 + a) * (1 + s)) * (1 - 1e-9)
        eta = (2 * V + 120) * U64 * 1.01
        tiny = V * 2.0 ** -126  # the terms below float32's normal range (2^-126 each, flush-to-zero too)
        lo_out = 1.0 + (t_out * lo - tiny)
        hi_in = (1.0 + (t_in * hi + tiny)) * (1 + 2 * eta + 4 * U64)
        exact = ranks & ~(lo_out > hi_in)
    if bool(exact.any()):  # rows the float32 order cannot settle: the reference's float64 confidences
        sel = masked & exact[:, None]
        conf[sel] = _confidence(picked[sel[masked]], x0[sel], "low_confidence", 0, None).to(torch.float64)


# ------------------------------------------------------------------------------ input checks


def _as_prompt(backbone, prompt_ids, device) -> torch.Tensor:
    if isinstance(prompt_ids, str):  # text: the convenience most first calls expect
        if not prompt_ids.strip():
            raise TimeromeError("the prompt text is blank: give a question (an unconditional generation takes an "
                                "empty id tensor, torch.zeros(1, 0, dtype=torch.long))")
        prompt_ids = prompt_text_ids(backbone, prompt_ids)  # words it does not know: warned
    if torch.is_tensor(prompt_ids) and prompt_ids.is_meta:
        raise TimeromeError(f"prompt_ids is on the meta device (a shape without token ids): it cannot be moved to "
                            f"the model's device ({device}); give the ids themselves")
    prompt = integer_ids(prompt_ids, "prompt_ids", "prompt_ids must be a string, a list of token ids or a LongTensor "
                                                   "(rows of one length; left-pad with attention_mask)")
    if prompt.dim() == 1:
        prompt = prompt[None, :]
    if prompt.dim() != 2:
        raise TimeromeError(f"prompt_ids must be [batch, length] or [length], got shape {tuple(prompt.shape)}")
    if prompt.shape[0] == 0:
        raise TimeromeError("prompt_ids has no rows: give at least one prompt")
    vocab = getattr(backbone, "vocab_size", None)
    if vocab is not None and prompt.numel() and (int(prompt.min()) < 0 or int(prompt.max()) >= vocab):
        raise TimeromeError(f"prompt token ids must lie in 0..{vocab - 1}; got {int(prompt.min())}..{int(prompt.max())}")
    return prompt.to(device)


# ------------------------------------------------------------ prompts in, answers out

def generation_length(backbone, gen_length: int) -> int:
    """gen_length, or half the model's context when the context cannot hold it with a prompt."""
    if gen_length < 1:
        raise TimeromeError(f"gen_length must be >= 1, got {gen_length}")
    return min(int(gen_length), backbone.max_length // 2)


@torch.no_grad()
def continuations(backbone, prompts: list[str], *, gen_length: int, block_length: int | None = None,
                  batch_size: int = 8, seed: int = 0, stops: tuple[str, ...] = (), progress: bool = False,
                  steps: int | None = None, **sampler) -> dict:
    """Continuations of prompts: {"texts", "ids" (each answer's tokens before its first special token),
    "gen_length" (used), "cut" (prompts shortened)}.

    Prompts of different lengths are left-padded into one batch (padding hidden, positions counted
    over real tokens), so a batch gives each prompt what it would get alone; a prompt the context
    cannot hold with the answer loses its start (`encoding.fit`). A model whose context cannot hold
    the requested length generates at most half its context (`generation_length`). An answer ends at
    its first special token (an MDLM fills what remains of its budget with end-of-text) and at the
    first stop string. Greedy, one token per step, by default; `steps` (default gen_length) and `sampler`
    (temperature, remasking, cache, threshold, refresh_every: sampler.generate's options) change
    that. Each batch draws from a generator seeded `seed`."""
    G = generation_length(backbone, gen_length)
    if block_length is None:  # an autoregressive model has no blocks: one, the answer
        block = 32 if G % 32 == 0 and not getattr(backbone, "causal", False) else G
    else:  # a block as long as the answer (or longer: the length was capped) is one block
        block = min(int(block_length), G)
        if G % block:  # never silently another schedule than the one asked for
            raise TimeromeError(f"block_length {block_length} does not divide the generation length {G}")
    steps = G if steps is None else int(steps)
    blank = [i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()]
    if blank:  # generate takes ids of no token as an unconditional generation; a blank question is a slip
        what = "blank" if isinstance(prompts[blank[0]], str) else "not a text"
        raise TimeromeError(f"prompt {blank[0]} of {len(prompts)} is {what}: give the question to answer")
    ids, cut = [], 0
    for p in prompts:
        q, _, was_cut = fit(backbone.encode_prompt(p), [0] * G, backbone.max_length, len(backbone.prompt_start))
        ids.append(q)
        cut += was_cut
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    texts, answers = [""] * len(ids), [[] for _ in ids]
    chunks = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    with progress_bar("generating", total=len(chunks), enabled=progress) as bar:
        for chunk in chunks:
            P = max(len(ids[i]) for i in chunk)
            prompt = torch.full((len(chunk), P), pad_id(backbone), dtype=torch.long)
            real = torch.zeros(len(chunk), P, dtype=torch.bool)
            for b, i in enumerate(chunk):
                prompt[b, P - len(ids[i]):] = torch.tensor(ids[i])
                real[b, P - len(ids[i]):] = True
            gen = torch.Generator(device=backbone.device).manual_seed(seed)
            x = generate(backbone, prompt.to(backbone.device), steps=steps, gen_length=G, block_length=block,
                         generator=gen, attention_mask=None if bool(real.all()) else real.to(backbone.device),
                         **sampler)
            for b, i in enumerate(chunk):
                answers[i] = until_special(backbone, x[b, P:].tolist())
                texts[i] = cut_at(backbone.decode(answers[i]), stops)
            bar.advance()
    return {"texts": texts, "ids": answers, "gen_length": G, "cut": cut}


def until_special(backbone, ids: list[int]) -> list[int]:
    """An answer's ids before its first special token other than an MDLM's mask (it fills what remains of its
    budget with end-of-text); cut on ids, not text: a decoded end-of-text token leaves a separator before it.
    An autoregressive model's "mask" is a placeholder id (its pad / end-of-text, `describe`): a cut there too."""
    specials = set(getattr(backbone.tokenizer, "all_special_ids", None) or [])
    if not getattr(backbone, "causal", False):
        specials -= {backbone.mask_id}
    return ids[:next((j for j, t in enumerate(ids) if t in specials), len(ids))]


def cut_at(text: str, stops, strip: bool = True) -> str:
    """The text before the first of the stop strings (an empty one stops nothing), stripped unless `strip` is
    False (lm-eval's answers are kept as written)."""
    for s in stops:
        if s:
            text = text.split(s)[0]
    return text.strip() if strip else text


def check_generation(backbone, prompt_length: int, n_prompts: int = 1, *, steps: int = SAMPLER.steps, gen_length: int = SAMPLER.gen_length,
                     block_length: int = SAMPLER.block_length, temperature: float = SAMPLER.temperature, cfg_scale: float = SAMPLER.cfg_scale,
                     remasking: str = SAMPLER.remasking, cache=None, threshold=None, refresh_every=None) -> None:
    """Everything `generate` checks before its first forward (the CLI calls it before any warning):
    the options, their fit with the prompt and the model's context, and the work within the budget."""
    _check(backbone, prompt_length, steps, gen_length, block_length, temperature, cfg_scale, remasking)
    refuse_diffusion_options(backbone, cache=cache, threshold=threshold, refresh_every=refresh_every, cfg_scale=cfg_scale)
    check_fast_options(cache, threshold, refresh_every, remasking)
    budget(f"generating with {steps} steps for {n_prompts} prompt(s)",
           steps * n_prompts * (2 if cfg_scale > 0 else 1), "one per step and prompt")


# the diffusion sampler's own options, with their command-line flags: an autoregressive model reads none of them
DIFFUSION_OPTIONS = {"steps": "--steps", "block_length": "--block-length", "remasking": "--remasking",
                     "cache": "--cache", "threshold": "--threshold", "refresh_every": "--refresh-every",
                     "cfg_scale": None}


def diffusion_given(options: dict) -> list[str]:
    """The diffusion sampler's options (DIFFUSION_OPTIONS) that `options` gives: set, and not at what sets nothing
    (None, cfg_scale 0, the default remasking); other keys are not looked at."""
    off = {"cfg_scale": (None, 0, 0.0), "remasking": (None, SAMPLER.remasking)}
    return [k for k, v in options.items() if k in DIFFUSION_OPTIONS and v not in off.get(k, (None,))]


def refuse_diffusion_options(backbone, **given) -> None:
    """Refuse the diffusion sampler's own options given (DIFFUSION_OPTIONS: None, cfg_scale 0 and the default
    remasking are not given; other keys, e.g. temperature, are not looked at) on an autoregressive model, which decodes one token per forward, left to right:
    `generate` (check_generation), and before any work the eval command, evaluate(sampler=), edit_scores(sampler=),
    TimeromeLM and the utility experiment."""
    named = [k + (f" ({DIFFUSION_OPTIONS[k]})" if DIFFUSION_OPTIONS[k] else "") for k in diffusion_given(given)]
    if named and getattr(backbone, "causal", False):
        one = len(named) == 1
        raise TimeromeError(f"the {backbone.family.name} model is autoregressive: it decodes one token per forward, "
                            f"left to right; {', '.join(named)} {'is a' if one else 'are'} diffusion sampling "
                            f"option{'' if one else 's'}: leave {'it' if one else 'them'} out")


def _check(backbone, P, steps, gen_length, block_length, temperature, cfg_scale, remasking):
    causal = getattr(backbone, "causal", False)  # one token per forward, left to right: no blocks or remasking
    if causal and remasking != SAMPLER.remasking:
        raise TimeromeError(f"remasking {remasking!r} orders which masked positions a diffusion model reveals; "
                            "an autoregressive model writes left to right and has none: leave it out")
    # an AR model writes gen_length tokens in gen_length forwards, one block: steps / block_length at their
    # defaults, or at gen_length (what a caller sizing both by the answer passes), read as that; another value
    # would be ignored, so it is refused (the command line refuses --steps / --block-length given at all)
    odd = [f"{k} {v}" for k, v, d in (("steps", steps, SAMPLER.steps), ("block_length", block_length,
                                                                       SAMPLER.block_length)) if v not in (d, gen_length)]
    if causal and odd:
        raise TimeromeError(f"{' and '.join(odd)}: the {backbone.family.name} model is autoregressive, it writes the "
                            f"answer's {gen_length} tokens one per forward, left to right, with no steps or blocks to "
                            f"set: leave {'it' if len(odd) == 1 else 'them'} out")
    check_options(steps, gen_length, block_length, temperature, cfg_scale, remasking, blocks=not causal)
    if P + gen_length > backbone.max_length:
        raise TimeromeError(f"prompt ({P} tokens) + gen_length ({gen_length}) exceeds the model's "
                            f"context of {backbone.max_length} tokens")


def check_options(steps: int = SAMPLER.steps, gen_length: int = SAMPLER.gen_length,
                  block_length: int = SAMPLER.block_length, temperature: float = SAMPLER.temperature,
                  cfg_scale: float = SAMPLER.cfg_scale, remasking: str = SAMPLER.remasking, *,
                  blocks: bool = True) -> None:
    """The checks of `check_generation` that need no model (the CLI runs them before one loads); blocks:
    False for an autoregressive model, which has no blocks for gen_length and steps to divide into."""
    # each message names the Python argument and the CLI option (--gen-length ...) alike
    for name, v in (("gen_length", gen_length), ("steps", steps), ("block_length", block_length)):
        integer(v, f"{name} (--{name.replace('_', '-')})", lo=1)
    if blocks:
        _check_blocks(steps, gen_length, block_length)
    if remasking not in REMASKING:
        raise TimeromeError(f"unknown remasking {remasking!r}; choose one of {', '.join(REMASKING)}")
    number(temperature, "temperature (--temperature)", lo=0)
    number(cfg_scale, "cfg_scale", lo=0)


def _check_blocks(steps: int, gen_length: int, block_length: int) -> None:
    """gen_length divides into blocks, and steps into as many parts as there are blocks."""
    if gen_length % block_length:
        raise TimeromeError(f"gen_length (--gen-length) {gen_length} is not a multiple of block_length "
                            f"(--block-length) {block_length}" + (
                                f": give block_length too (generate()'s steps and block_length default to LLaDA's "
                                f"{SAMPLER.steps}, whatever gen_length; e.g. steps={gen_length}, "
                                f"block_length={gen_length}, as the CLI sets them)" if block_length == SAMPLER.block_length
                                and gen_length < block_length else ""))
    n_blocks = gen_length // block_length
    if steps % n_blocks:
        raise TimeromeError(f"steps (--steps) {steps} is not divisible by the number of blocks "
                            f"(gen_length // block_length = {gen_length} // {block_length} = {n_blocks})")


def check_fast_options(cache, threshold, refresh_every, remasking: str = SAMPLER.remasking) -> None:
    """One clear error for a bad cache / threshold / refresh_every (what `generate` checks first)."""
    # each message names the Python argument and the CLI option alike, as check_options' do
    if cache is not None and cache not in CACHES:
        raise TimeromeError(f"unknown cache (--cache) {cache!r}; choose {' or '.join(map(repr, CACHES))} (None, no "
                            "--cache: the exact sampler)")
    if threshold is not None:
        number(threshold, "threshold (--threshold)", lo=0, hi=1, lo_open=True)
        if remasking not in THRESHOLD_REMASKING:
            raise TimeromeError(f"threshold (--threshold) needs a probability-valued confidence "
                                f"({', '.join(THRESHOLD_REMASKING)}); remasking (--remasking) {remasking!r} is not one")
    if refresh_every is not None:
        if cache is None:
            raise TimeromeError("refresh_every (--refresh-every) needs a cache (cache='prefix' or 'dual', --cache "
                                "prefix or dual)")
        integer(refresh_every, "refresh_every (--refresh-every)", lo=1)


def _real_positions(attention_mask, B, P, G, device) -> torch.Tensor:
    if attention_mask is None:
        return torch.ones(B, P + G, dtype=torch.bool, device=device)
    am = torch.as_tensor(attention_mask).to(device=device, dtype=torch.bool)
    if am.dim() == 1:
        am = am[None, :]
    if am.shape == (B, P):
        am = torch.cat([am, am.new_ones(B, G)], dim=1)
    if am.shape != (B, P + G):
        raise TimeromeError(f"attention_mask must be [batch, prompt] = ({B}, {P}) or "
                            f"[batch, prompt + gen_length] = ({B}, {P + G}), got {tuple(am.shape)}")
    blind = [i for i in range(B) if not bool(am[i, :P].any())]
    if blind:  # it would answer a prompt it cannot see
        raise TimeromeError(f"attention_mask hides every prompt token of row{'s' if len(blind) > 1 else ''} "
                            f"{', '.join(map(str, blind[:5]))}: a row's real prompt tokens are 1 (True)")
    return am


# ------------------------------------------------------------------------------ one step


class _Forward:
    """The step's forward: [B, hi - lo, V] logits of positions lo..hi-1, classifier-free guided when
    cfg_scale > 0 ([cond; uncond] in one batch, the uncond rows with the prompt masked). Without a
    cache (lo, hi) = (0, L): one full forward, as the reference; with one, `refresh` stores every
    position's keys/values and the call computes the window only."""

    def __init__(self, backbone, prompt_index, real, attention_mask, cfg_scale, kv):
        self.backbone, self.prompt_index, self.cfg_scale, self.kv = backbone, prompt_index, cfg_scale, kv
        am = None if attention_mask is None else real
        self.am = am if am is None or cfg_scale <= 0 else torch.cat([am, am])

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg_scale <= 0:
            return x
        uncond = x.clone()
        uncond[self.prompt_index] = self.backbone.mask_id
        return torch.cat([x, uncond])

    def refresh(self, x: torch.Tensor) -> None:
        self.backbone.refresh(self.rows(x), self.kv, attention_mask=self.am)

    def __call__(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        if self.kv is None:
            logits = self.backbone.logits(self.rows(x), attention_mask=self.am)  # [B or 2B, L, V]
        else:
            logits = self.backbone.window_logits(self.rows(x), self.kv, lo, hi, attention_mask=self.am)
        if self.cfg_scale <= 0:
            return logits
        cond, unc = logits.chunk(2, dim=0)
        return unc + (self.cfg_scale + 1) * (cond - unc)


def row_max(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the maximum along the last dimension: `logits.max(-1)`, bit for bit
    (the first maximum's index; a row holding a NaN gives what max gives), in two cheap passes
    instead of max's slower CPU kernel. Rows of V entries are cut into blocks of about sqrt(V)
    entries, a multiple of 64 and at least 128 (where `amax` runs fastest): the block maxima give
    the row maximum and the first block that holds it, and argmax runs over that block alone.
    Short rows, integer tensors and rows holding a NaN take `max` itself."""
    V = logits.shape[-1]
    if V < 256 or not logits.is_floating_point() or logits.numel() == 0:
        return logits.max(-1)
    lg = logits.reshape(-1, V)
    s = max(128, 64 * round(V ** 0.5 / 64))
    full = V // s * s
    blocks = lg[:, :full].unflatten(-1, (V // s, s)).amax(-1)        # [M, V // s]
    if full < V:
        blocks = torch.cat([blocks, lg[:, full:].amax(-1, keepdim=True)], 1)
    top = blocks.amax(-1)                                             # [M]: the row maxima
    if bool(top.isnan().any()):
        return logits.max(-1)
    first = (blocks == top[:, None]).to(torch.uint8).argmax(-1)       # the first block holding the maximum
    # that block's window (the last one ends at V: the entries it shares with the block before
    # it are below the maximum, since that block does not hold it)
    start = (first * s).clamp(max=V - s)
    rows = torch.arange(len(lg), device=lg.device)
    window = lg.unfold(1, s, 1)[rows, start]                          # [M, s]: each row's window
    idx = start + window.argmax(-1)
    shape = logits.shape[:-1]
    # the value at that index, as max gives it (amax may return -0.0 where the first maximum is +0.0)
    return torch.return_types.max((lg[rows, idx].view(shape), idx.view(shape)))


def _rand(shape, dtype, generator, device) -> torch.Tensor:
    """U[0, 1) drawn on the generator's device, then moved to where the logits live."""
    return torch.rand(shape, dtype=dtype, generator=generator, device=generator.device).to(device)


def _sample(logits, temperature, generator) -> torch.Tensor:
    """x0 [B, L]: argmax at T = 0, else Gumbel-max in float64 as the reference writes it (in log space where that
    overflows)."""
    if temperature == 0:
        return row_max(logits).indices  # argmax's first maximum, without argmax's slower CPU kernel
    l64 = logits.to(torch.float64)
    noise = _rand(l64.shape, torch.float64, generator, l64.device)
    # exp(l) / (-log U)^T has the argmax of l / T + Gumbel: a draw from softmax(l / T)
    g = -torch.log(noise)
    score = l64.exp() / g ** temperature
    broken = ~torch.isfinite(score).all(-1) | (score.amax(-1) <= 0)
    # a large T (or logit) overflows the reference's form: the same draw in log space there (on a GPU always
    # computed, so that no step waits on the device to ask whether it is needed)
    if score.device.type != "cpu" or bool(broken.any()):
        score = torch.where(broken[..., None], l64 - temperature * torch.log(g), score)
    return score.argmax(-1)


def _confidence(logits, x0, remasking, temperature, generator) -> torch.Tensor:
    """Confidence [B, L] of each prediction; higher is revealed first."""
    if remasking == "random":
        return _rand(x0.shape, torch.float32, generator, x0.device)
    if remasking == "low_confidence":
        p = F.softmax(logits.to(torch.float64), dim=-1)
        return p.gather(-1, x0[..., None]).squeeze(-1)
    # Dream reads its confidences from the tempered distribution
    l64 = logits.to(torch.float64)
    p = F.softmax(l64 / temperature if temperature > 0 else l64, dim=-1)
    if remasking == "maskgit_plus":
        return p.gather(-1, x0[..., None]).squeeze(-1)
    if remasking == "margin":
        top2 = p.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    return torch.special.xlogy(p, p).sum(-1)  # entropy: negative entropy, 0 for a one-hot


def _top_k_per_row(conf: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Bool [B, L]: the k[b] highest confidences of each row b, ties broken as the reference's
    torch.topk(conf[b], k[b]) breaks them: topk's choice among equal values depends on k, so the
    rows are taken in groups of one k (one call each), never as the first k[b] of a larger topk."""
    out = torch.zeros_like(conf, dtype=torch.bool)
    k = k.to(conf.device)
    for kv in k.unique().tolist():
        if kv == 0:
            continue
        rows = (k == kv).nonzero().squeeze(1)
        out[rows] = out[rows].scatter_(1, conf[rows].topk(int(kv), dim=-1).indices, True)
    return out

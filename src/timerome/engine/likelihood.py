"""LLaDA's Monte-Carlo estimator of log p(answer | prompt), in nats (exact for a causal model).

A causal (autoregressive) backbone is scored exactly instead: one row, nothing masked, the sum
over answer tokens of log p(a_j | prompt, a_<j) read from the aligned logits of the clean
[prompt | answer] (the same code path as La = 1 below: one forward, no draw).

One Monte-Carlo sample ("row") masks l of the La answer tokens, a uniform random l-subset S,
runs the model on [prompt | answer with S masked] and scores

    (La / l) * sum_{i in S} log p(x_i | prompt, answer with S masked).

Its expectation over l ~ U{1..La} and S is the MDLM ELBO bound on log p(answer | prompt), which
`exact_log_likelihood` computes by enumerating every subset; the MC mean converges to it. With
La = 1 there is one subset, so the value is exact and computed with one forward, no sampling.

Rows come in strata of `batch_size` that share one k ~ U{1..La}: row r of a stratum of size b
masks n_r = ((k - 1 + round(r La / b)) mod La) + 1 tokens, spreading the counts evenly over
1..La (the reference's stratification). Two deliberate differences from the reference
(ML-GSAI/LLaDA get_log_likelihood.py):
- round(r La / b) rounds halves up, in exact integer arithmetic. The reference rounds
  k + r La / b half-to-even in float32, so when r La / b is a half-integer the count only takes
  even values and the estimator is biased (e.g. La = 2, b = 16: two rows of 16 always mask both
  tokens). Rounding halves up keeps n_r uniform on 1..La for every row, hence unbiased.
- n_mc need not be a multiple of batch_size: the last stratum is smaller, and the result is the
  mean over all n_mc rows (equal to the reference's mean of stratum means when it divides).
Prompt tokens are never masked nor scored (the reference also scores mask tokens found inside
the prompt; here they are left as context).

Random draws of one (prompt, answer) pair, in this order, from one generator g:
    ks   = randint(1, La + 1, (n_strata,), g)      one k per stratum
    keys = rand(n_mc, La, g, float64)              row r masks the n_r answer positions with the
                                                   smallest keys (a uniform n_r-subset)
`log_likelihood` draws from the caller's generator. `log_likelihood_batch` gives pair i its own
generator, `pair_generator(seed, i, device)`, seeded from (seed, i) with
seed = generator.initial_seed() (0 by default; the generator's current state is not used) and
device = the generator's device (by default the CPU). So pair i's value does not depend
on the other pairs, and equals log_likelihood(prompt_i, answer_i,
generator=pair_generator(seed, i, device)) up to float rounding from batching. Pair 0 uses seed
itself: with default arguments, log_likelihood_batch([p], [a])[0] == log_likelihood(p, a).
The default draws are on the CPU whatever the backbone's device, so a seed gives the same masks,
hence the same estimate up to float rounding, on a CPU and on a GPU (a GPU's generator draws
other numbers from the same seed: the 20 embedded forget rows at n_mc = 16 differed by up to 6.2
nats, `benchmarks/device_check.py`); the masks are a few bytes per row, and drawing them on the
CPU also spares a GPU two synchronisations per pair. A caller's CUDA generator is still honoured.

Work skipped, the value unchanged (`log_likelihood_batch`):
- Identical rows run once. A short answer has few distinct masks (La = 2: three), so many of the
  n_mc rows of a pair repeat one, and pairs with the same prompt and answer repeat each other's
  rows. Each distinct (prompt, answer, mask) row is scored once and its score reused for every
  row it stands for, with that row's own weight: the same estimator, the same draws.
- The vocabulary head runs only where a score is read (`head="masked"`, a timerome Backbone):
  the forward stops after the last block (`Hooks(..., stop=True)`), and `Backbone.readout`
  (final norm + head) maps the last-block output of the scored positions only (a logit_shift
  family reads position i - 1 for token i, as `Backbone.logits` aligns it). Equal to the full
  logits up to float rounding of the head's matrix shape.
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import torch
import torch.nn.functional as F

from timerome.backbones.backbone import model_arg
from timerome.common.checks import budget, generator_arg, integer
from timerome.common.progress import progress_bar
from timerome.engine.encoding import encode_pairs, integer_ids, known_answer_ids, prompt_text_ids
from timerome.engine.hooks import Hooks, answer_region
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError

MAX_EXACT = 8  # exact enumeration costs 2^La - 1 rows
_GOLDEN = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads pair indices over the seed space


def pair_generator(seed: int, index: int, device=None) -> torch.Generator:
    """The generator of pair `index` in log_likelihood_batch under `seed`."""
    g = torch.Generator(device=device if device is not None else "cpu")
    return g.manual_seed((int(seed) + int(index) * _GOLDEN) % 2**64)


# ------------------------------------------------------------------------------ public API


def log_likelihood(backbone, prompt_ids, answer_ids, *, n_mc: int = LIKELIHOOD.n_mc, batch_size: int = 16,
                   generator: torch.Generator | None = None) -> float:
    """MC estimate of log p(answer | prompt) in nats (exact for a one-token answer). prompt_ids and answer_ids
    are token ids or texts: a text prompt starts the sequence (`Backbone.encode_prompt`), a text answer is
    encoded as it follows a prompt (`encoding.answer_ids`)."""
    model_arg(backbone, "log_likelihood's backbone")
    return float(log_likelihood_samples(backbone, prompt_ids, answer_ids, n_mc=n_mc,
                                        batch_size=batch_size, generator=generator).mean())


def log_likelihood_samples(backbone, prompt_ids, answer_ids, *, n_mc: int = LIKELIHOOD.n_mc, batch_size: int = 16,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """The n_mc per-row estimates (float64, CPU) whose mean is log_likelihood; one exact value
    when the answer is one token. One forward per stratum of batch_size rows, every drawn row run
    (`log_likelihood_batch` runs identical rows once); the head at the scored positions only where
    `masked_head_applies`."""
    model_arg(backbone, "log_likelihood_samples's backbone")
    prompt, answer = _as_ids(prompt_ids, "prompt", backbone), _as_ids(answer_ids, "answer", backbone)
    _check_pair(backbone, prompt, answer)
    _check_mc(n_mc, batch_size)
    if generator_arg(generator) is None:
        generator = torch.Generator().manual_seed(0)  # on the CPU on any device (module docstring)
    masks, weights = _draw(len(answer), n_mc, batch_size, generator, _causal(backbone))
    rows = [(0, r) for r in range(len(weights))]
    scores = _score_rows(backbone, [prompt], [answer], [masks], rows, _fixed_chunks(len(rows), batch_size),
                         masked_head=masked_head_applies(backbone))
    return scores * weights


def log_likelihood_batch(backbone, prompts: list[list[int]], answers: list[list[int]], *, n_mc: int = LIKELIHOOD.n_mc,
                         batch_size: int | None = None, generator: torch.Generator | None = None,
                         progress: bool = False, max_tokens: int | None = None, head: str = "auto") -> torch.Tensor:
    """log_likelihood of many (prompt, answer) pairs -> float64 CPU tensor [N].

    batch_size: stratum size, as in log_likelihood (None: its default, 16).
    max_tokens: rows of all pairs are packed into forwards of at most this many tokens
        (right-padded, padding hidden by the attention mask; at least one row per forward);
        None: `default_max_tokens` of the backbone's device. The result does not depend on it
        beyond float rounding (~1e-7 nats).
    head: "masked" runs the vocabulary head at the scored positions only, "full" at every
        position; "auto" is "masked" wherever it applies (`masked_head_applies`). Equal up to
        float rounding.
    Pair i draws from pair_generator(seed, i, device) (module docstring): seed = generator.initial_seed(),
    device = generator.device (defaults: 0 and the CPU, whatever the backbone's device). Rows identical to an earlier
    one (same prompt, answer and mask) are not run again: its score is reused (module docstring).
    """
    model_arg(backbone, "log_likelihood_batch's backbone")
    if len(prompts) != len(answers):
        raise TimeromeError(f"got {len(prompts)} prompts but {len(answers)} answers")
    batch_size = 16 if batch_size is None else batch_size
    _check_mc(n_mc, batch_size, len(answers))
    max_tokens = default_max_tokens(backbone.device) if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise TimeromeError(f"max_tokens must be >= 1, got {max_tokens}")
    masked_head = head_choice(backbone, head)
    P = [_as_ids(p, f"prompt {i}", backbone) for i, p in enumerate(prompts)]
    A = [_as_ids(a, f"answer {i}", backbone) for i, a in enumerate(answers)]
    for i, (p, a) in enumerate(zip(P, A)):
        _check_pair(backbone, p, a, where=f" (pair {i})")
    masks = pair_masks(backbone, [len(a) for a in A], n_mc=n_mc, batch_size=batch_size, generator=generator)
    weights = [La / m.sum(1).double() for La, m in zip((len(a) for a in A), masks)]
    # longest pairs first, so each forward pads only up to its first row's length
    order = sorted(range(len(A)), key=lambda i: -(len(P[i]) + len(A[i])))
    rows = [(i, r) for i in order for r in range(len(weights[i]))]
    distinct, source = _distinct_rows(P, A, masks, rows)
    lengths = [len(P[i]) + len(A[i]) for i, _ in distinct]
    scores = _score_rows(backbone, P, A, masks, distinct, _packed_chunks(lengths, max_tokens), progress,
                         masked_head)[source]

    out = torch.zeros(len(A), dtype=torch.float64)
    pair = torch.tensor([i for i, _ in rows], dtype=torch.long)
    w = torch.cat([weights[i] for i in order]) if rows else torch.zeros(0, dtype=torch.float64)
    n = torch.tensor([len(weights[i]) for i in range(len(A))], dtype=torch.float64)
    return out.index_add_(0, pair, scores * w) / n.clamp(min=1)


def pair_masks(backbone, answer_lengths: list[int], *, n_mc: int = LIKELIHOOD.n_mc, batch_size: int = 16,
               generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """The masks [R_i, La_i] (True = scored) `log_likelihood_batch` draws for answers of these
    lengths under `generator` (its seed and device, module docstring): R_i = n_mc, or 1 for a
    one-token answer or a causal model. Row r of pair i weighs La_i / (its True count). Exposed so
    a benchmark can count the distinct rows any exact computation of the estimator must run."""
    seed = generator.initial_seed() if generator_arg(generator) is not None else 0
    device = generator.device if generator is not None else "cpu"
    causal = _causal(backbone)
    return [_draw(int(La), n_mc, batch_size, pair_generator(seed, i, device), causal)[0]
            for i, La in enumerate(answer_lengths)]


def masked_head_applies(backbone) -> bool:
    """Whether the vocabulary head can be run at the scored positions only: a timerome Backbone
    with its own implementation (not the checkpoint's code), a read-out (final norm), and no hook
    on the norm, the head or the model itself (the forward must end in exactly norm + head, and a
    hook there expects the full [B, L, ...] tensor)."""
    from timerome.backbones.backbone import Backbone

    if not isinstance(backbone, Backbone) or backbone.remote:
        return False
    fam, mods = backbone.family, backbone._modules
    if fam.norm not in mods:
        return False
    ends = [backbone.model, mods[fam.norm], mods.get(fam.head) or backbone.embedding()]
    return not any(m._forward_hooks or m._forward_pre_hooks for m in ends)


HEAD_MIN_ROWS = 8  # the masked head runs on at least this many rows: a CPU BLAS rounds a product of 1-3 rows differently


def logits_at(backbone, ids: torch.Tensor, read: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
              masked_head: bool = True) -> torch.Tensor:
    """The logits [M, V] of one forward of ids [B, L] at the positions `read` [B, L] (bool), row-major
    (the order of logits[read]). masked_head (where `masked_head_applies`): the forward stops after
    the last block and the read-out runs at those positions only, aligned as `Backbone.logits`
    aligns a logit_shift family (output j - 1 predicts token j; position 0 reads output 0), on at
    least HEAD_MIN_ROWS rows so that each row's logits are the full head's bit for bit; else the
    full logits, then picked."""
    if not masked_head:
        return backbone.logits(ids, attention_mask=attention_mask)[read]
    last = (backbone.n_layers - 1, "resid")
    with Hooks(backbone, keep=[last], stop=True, detach=False) as kept:
        backbone.logits(ids, attention_mask=attention_mask)
    row, col = read.nonzero(as_tuple=True)
    col = (col - backbone.family.logit_shift).clamp(min=0)
    h = kept[last][0][row, col]
    if h.shape[0] < HEAD_MIN_ROWS:
        h = torch.cat([h, h.new_zeros(HEAD_MIN_ROWS - h.shape[0], h.shape[1])])
    return backbone.readout(h)[:len(row)]


def default_max_tokens(device) -> int:
    """Tokens per forward of `log_likelihood_batch` when not given: 1024 on a CPU, where bigger
    forwards leave the cache (embedded model: 1.06x its throughput floor at 1024 tokens, 1.25x at
    4096, `benchmarks/bench_likelihood.py`), 4096 on an accelerator."""
    return 1024 if torch.device(device).type == "cpu" else 4096


def exact_log_likelihood(backbone, prompt_ids, answer_ids) -> float:
    """E_{l ~ U{1..La}} E_{|S| = l} (La / l) sum_{i in S} log p(x_i | x with S masked), by
    enumerating all 2^La - 1 subsets (La <= MAX_EXACT): the value the MC estimator converges to.
    A causal model: the exact next-token log-likelihood (what `log_likelihood` returns too)."""
    model_arg(backbone, "exact_log_likelihood's backbone")
    prompt, answer = _as_ids(prompt_ids, "prompt", backbone), _as_ids(answer_ids, "answer", backbone)
    _check_pair(backbone, prompt, answer)
    if _causal(backbone):
        return log_likelihood(backbone, prompt, answer)
    La = len(answer)
    if La > MAX_EXACT:
        raise TimeromeError(f"exact enumeration is limited to answers of {MAX_EXACT} tokens, got {La}")
    subsets = [S for l in range(1, La + 1) for S in combinations(range(La), l)]
    masks = torch.zeros(len(subsets), La, dtype=torch.bool)
    for r, S in enumerate(subsets):
        masks[r, list(S)] = True
    l = masks.sum(1)
    # (1 / La) * (1 / C(La, l)) * (La / l): the uniform l, the uniform subset, the row weight
    weights = torch.tensor([1.0 / (math.comb(La, int(n)) * int(n)) for n in l], dtype=torch.float64)
    rows = [(0, r) for r in range(len(subsets))]
    scores = _score_rows(backbone, [prompt], [answer], [masks], rows, _fixed_chunks(len(rows), 64),
                         masked_head=masked_head_applies(backbone))
    return float((scores * weights).sum())


def answer_logprobs(backbone, questions: list[str], answers: list[str], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0,
                    progress: bool = False):
    """Text in, nats out: (log p(answer | question) [N], answer token counts [N]) as numpy arrays.

    The prompt is the question as written, the answer encoded as it follows it (encoding.py);
    draws as log_likelihood_batch with a generator seeded `seed`.
    """
    if len(questions) != len(answers):
        raise TimeromeError("questions and answers differ in length")
    if not questions:
        return np.zeros(0), np.zeros(0)
    pairs = encode_pairs(backbone, [{"question": q, "answer": a} for q, a in zip(questions, answers)])
    with torch.no_grad():
        lp = log_likelihood_batch(backbone, [p for p, _ in pairs], [a for _, a in pairs], n_mc=n_mc,
                                  generator=torch.Generator().manual_seed(seed), progress=progress)
    return lp.double().cpu().numpy(), np.array([len(a) for _, a in pairs], dtype=np.float64)


# ------------------------------------------------------------------------------ checks


def _as_ids(ids, what: str, backbone) -> torch.Tensor:
    """Token ids as a flat CPU LongTensor; a text is encoded as the start of a sequence (a prompt) or as
    an answer that follows it (encoding.py), as `answer_logprobs` encodes them."""
    if isinstance(ids, str):
        # a text answer with words the vocabulary reads as its unknown token is refused: it scored another answer
        ids = prompt_text_ids(backbone, ids, f"the {what}") if what.startswith("prompt") else \
            known_answer_ids(backbone, ids, f"the {what}")
    elif isinstance(ids, bytes):
        raise TimeromeError(f"the {what} must be a string or token ids, got bytes {ids!r:.60}")
    elif torch.is_tensor(ids) and ids.is_meta:
        raise TimeromeError(f"the {what} is on the meta device (a shape without token ids): it cannot be moved to "
                            f"the model's device ({backbone.device}); give the ids themselves")
    t = integer_ids(ids, f"the {what}", f"the {what} must be a list of integer token ids, got {type(ids).__name__}")
    t = t.cpu()
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1:
        raise TimeromeError(f"{what} ids must be a flat list of token ids, got shape {tuple(t.shape)}")
    return t


def _check_pair(backbone, prompt, answer, where: str = ""):
    if len(answer) == 0:
        raise TimeromeError(f"the answer is empty{where}: there is nothing to score")
    if len(prompt) == 0 and _causal(backbone):  # its first answer token would be read from its own position
        raise TimeromeError(f"the prompt is empty{where}: an autoregressive model reads each token from the ones "
                            "before it, so the first answer token needs one (begin with its BOS or EOS token)")
    if len(prompt) + len(answer) > backbone.max_length:
        raise TimeromeError(f"prompt ({len(prompt)} tokens) + answer ({len(answer)}) exceeds the model's "
                            f"context of {backbone.max_length} tokens{where}")
    ids = torch.cat([prompt, answer])
    if int(ids.min()) < 0 or int(ids.max()) >= backbone.vocab_size:
        raise TimeromeError(f"token ids must lie in [0, {backbone.vocab_size}){where}, "
                            f"got {int(ids.min())}..{int(ids.max())}")


def _check_mc(n_mc, batch_size, n_pairs: int = 1):
    integer(n_mc, "n_mc", lo=1)
    integer(batch_size, "batch_size", lo=1)
    budget(f"a likelihood of {n_pairs} answer(s) with n_mc {n_mc}", n_mc * n_pairs, "n_mc per answer")


# ------------------------------------------------------------------------------ sampling


def _stratified_counts(k: int, b: int, La: int) -> torch.Tensor:
    """Masked counts [b] in 1..La of one stratum: k shifted by round(r La / b), halves up."""
    r = torch.arange(b)
    offset = (2 * r * La + b) // (2 * b)
    return (k - 1 + offset) % La + 1


def _causal(backbone) -> bool:
    return bool(getattr(backbone, "causal", False))  # duck-typed backbones without the flag are MDLMs


def _draw(La: int, n_mc: int, batch_size: int, generator, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks [R, La] (True = scored, and masked unless causal) and row weights La / n_r [R], float64;
    R = n_mc, or 1 if La = 1 or the model is causal (every answer token scored once, exactly)."""
    if La == 1 or causal:
        return torch.ones(1, La, dtype=torch.bool), torch.ones(1, dtype=torch.float64)
    sizes = [batch_size] * (n_mc // batch_size) + ([n_mc % batch_size] if n_mc % batch_size else [])
    dev = generator.device
    ks = torch.randint(1, La + 1, (len(sizes),), generator=generator, device=dev).cpu()
    keys = torch.rand(n_mc, La, dtype=torch.float64, generator=generator, device=dev).cpu()
    counts = torch.cat([_stratified_counts(int(k), b, La) for k, b in zip(ks, sizes)])  # [n_mc]
    ranks = keys.argsort(1).argsort(1)  # rank of each position's key within its row
    return ranks < counts[:, None], La / counts.double()


# ------------------------------------------------------------------------------ scoring


def _fixed_chunks(n_rows: int, size: int) -> list[range]:
    return [range(s, min(s + size, n_rows)) for s in range(0, n_rows, size)]


def _packed_chunks(lengths: list[int], max_tokens: int) -> list[range]:
    """Consecutive rows (lengths non-increasing) with n_rows * first length <= max_tokens."""
    chunks, start = [], 0
    while start < len(lengths):
        n = max(1, max_tokens // lengths[start])
        chunks.append(range(start, min(start + n, len(lengths))))
        start += n
    return chunks


def head_choice(backbone, head: str) -> bool:
    """head ("auto" / "masked" / "full") -> whether to run the head at the scored positions only."""
    if head not in ("auto", "masked", "full"):
        raise TimeromeError(f"head must be 'auto', 'masked' or 'full', got {head!r}")
    applies = masked_head_applies(backbone)
    if head == "masked" and not applies:
        raise TimeromeError("head='masked' needs a timerome Backbone with its own implementation and no hook on "
                            "its final norm, head or model; use head='full' or 'auto'")
    return applies and head != "full"


def _distinct_rows(prompts, answers, masks, rows) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """(distinct, source): the first of each group of identical rows (same prompt, answer and
    mask), in order, and for every row the index in `distinct` of the row that scores it."""
    text: dict[int, tuple[bytes, bytes]] = {}   # pair -> its prompt and answer as bytes (made once per pair)
    bits: dict[int, np.ndarray] = {}
    first: dict[tuple, int] = {}
    distinct, source = [], []
    for i, r in rows:
        if i not in text:
            text[i] = (prompts[i].numpy().tobytes(), answers[i].numpy().tobytes())
            bits[i] = masks[i].numpy()
        j = first.setdefault((*text[i], bits[i][r].tobytes()), len(distinct))
        if j == len(distinct):
            distinct.append((i, r))
        source.append(j)
    return distinct, torch.tensor(source, dtype=torch.long)


def _score_rows(backbone, prompts, answers, masks, rows, chunks, progress: bool = False,
                masked_head: bool = False) -> torch.Tensor:
    """sum_{i masked} log p(x_i | noisy row) for each row (pair, row index) -> float64 CPU [R]."""
    out = torch.zeros(len(rows), dtype=torch.float64)
    # each pair's clean tokens and masks as numpy arrays, made once: the rows are laid out from them
    pairs = {i for i, _ in rows}
    tokens = {i: np.concatenate([prompts[i].numpy(), answers[i].numpy()]) for i in pairs}
    bits = {i: masks[i].numpy() for i in pairs}
    with progress_bar("log-likelihood", total=len(chunks), enabled=progress) as bar:
        for chunk in chunks:
            out[chunk.start:chunk.stop] = _score_chunk(backbone, prompts, tokens, bits, rows[chunk.start:chunk.stop],
                                                       masked_head)
            bar.advance()
    return out


@torch.no_grad()
def _score_chunk(backbone, prompts, tokens, bits, rows, masked_head: bool = False) -> torch.Tensor:
    """One forward over the rows, right-padded to the longest; padding hidden by attention_mask.
    tokens[i]: pair i's prompt + answer, bits[i]: its masks [R_i, La_i] (numpy). masked_head: stop
    after the last block and read out the scored positions only."""
    lens = [len(tokens[i]) for i, _ in rows]
    R, L = len(rows), max(lens)
    clean_np = np.full((R, L), backbone.mask_id, dtype=np.int64)
    scored_np = np.zeros((R, L), dtype=bool)
    for j, (i, r) in enumerate(rows):
        clean_np[j, :lens[j]] = tokens[i]
        scored_np[j, len(prompts[i]):lens[j]] = bits[i][r]
    clean, scored = torch.from_numpy(clean_np), torch.from_numpy(scored_np)
    real = torch.arange(L)[None, :] < torch.tensor(lens)[:, None]  # [R, L]
    # a causal model reads token i's prediction from tokens 0..i-1: the clean row scores every token
    noisy = clean if _causal(backbone) else clean.masked_fill(scored, backbone.mask_id)

    device = backbone.device
    am = None if all(n == L for n in lens) else real.to(device)
    pos = scored.to(device)
    with answer_region(backbone, torch.tensor([len(prompts[i]) for i, _ in rows])):
        picked = logits_at(backbone, noisy.to(device), pos, attention_mask=am, masked_head=masked_head)  # [M, V]
    # log-softmax only at the masked positions: [M, V] instead of [R, L, V]
    logp = F.log_softmax(picked.float(), dim=-1)
    target = clean.to(device)[pos]
    tok = logp.gather(1, target[:, None]).squeeze(1).double().cpu()  # [M]
    row_of = torch.arange(R)[:, None].expand(R, L)[scored]
    return torch.zeros(R, dtype=torch.float64).index_add_(0, row_of, tok)

"""Diffusion-time causal tracing: the temporal indirect effect (TIE) of every (layer, step, module).

The trajectory of one fact z = (subject s, prompt, object o), with G = len(object tokens):

    x_0 = [prompt | mask * G]; forward k (k = 0..K-1) reads x_k and reveals tokens as the project's
    sampler does (temperature 0, low-confidence remasking, one block of length G, `transfer_schedule`
    budgets); one extra scoring forward reads the final x_K, so k' = K exists (state.step = K).
    log p(o | x_k) = sum over the G object positions i of a log-prob of o_i from aligned logits:
      readout="decided" (default): forward k's log_softmax(logits)[i, o_i] while i is masked in x_k;
        once i is committed, the value from the forward that committed it (the last one that saw
        it masked), frozen from then on;
      readout="aligned": forward k's log_softmax(logits)[i, o_i] at every position, masked or not.
    Why "decided" is the default: an MDLM is trained on masked positions only, so its logits at
    committed positions are untrained. With "aligned", a perfectly memorised fact's clean log p
    falls from 0 at x_0 to tens of nats below 0 at x_K while the clean run commits exactly o, and
    TIE picks up that noise. "decided" keeps the clean log p at ~0 along the whole trajectory.

Three runs of that trajectory (paper, "Diffusion-time causal tracing"):

    clean      no intervention; its h(l, k, m) at the subject positions S are the patch sources.
    corrupted  e_i + sigma * eps_i added to the subject-token embeddings (hook on "embed") at every
               forward; eps ~ N(0, I) is drawn once per noise sample, so the corrupted input is one
               fixed input. sigma defaults to 3 x the std of the subject-token embedding vectors of the
               traced facts (ROME's "s3" rule, computed per model); a float overrides it.
    patched    (l, k, m): the corrupted run up to step k (its prefix IS the corrupted one: it starts
               from the stored corrupted x_k), forward k with h(l, k, m)[S] := clean h(l, k, m)[S],
               then corrupted and unpatched again until K: the splice acts through the tokens it
               makes the model commit.

    TIE(l, k, m, k')  = log p(o | do(h = h_clean), x_k') - log p(o | x^corr_k'),   k' = k+1..K,
                        each averaged over the noise samples;
    TIE_bar(l, k, m)  = sum_{k' > k} w_{k,k'} TIE(l, k, m, k'),  w ∝ exp(-tau (k' - k)), sum w = 1.

Consequences worth knowing: a splice acts only through what forward k decides (the tokens it
commits and, with "decided", the log-probs they are committed with), so TIE(l, k, m, .) is 0 at
every step k that reveals nothing (k >= G when G < K) and at the last layer (the subject
positions' last-layer state feeds nothing but their own logits); TIE is in nats, a difference of
summed log-probs, not of probabilities as in ROME.

How it is computed fast (`benchmarks/bench_trace.py` measures it against the naive loop):
- every run of one fact advances in lock-step ("wavefront"): at step j the batch holds the clean row,
  the n_samples corrupted rows and every patch row started at a step k <= j, so no step is ever
  recomputed: the patch rows of step j are copies of the corrupted rows' x_j, made just before
  forward j, and all (site, sample) patches of a step go through one batched call;
- a row with no splice ahead is a deterministic function of (noise sample, x_j), so rows with equal
  (sample, x_j) share one run (`_plan`); a splice that commits the same tokens as the corrupted run
  folds back into it right after its patched forward, and costs nothing more;
- a patch at (l, k) shares the blocks below l at step k with its corrupted row (same noise sample,
  same x_k), so with REUSE_LAYERS step j runs in passes: first the rows that do not splice at j
  (the corrupted rows among them), caching the corrupted rows' raw block outputs, then the splicing
  rows one pass per layer l, whose blocks 0..l-1 return the cached outputs of their corrupted row
  instead of computing (their `forward` is swapped for the duration of the call; the embedding
  still runs). A block output must be a tensor or a plain tuple of batch-first tensors, else those
  rows are computed in full. Layer-0 splices save nothing; on the embedded model (4 layers) it
  computes 29% fewer row-blocks and ran 1.1-1.3 x faster on a shared CPU: the vocabulary
  head and the sampler step still run per row, and the passes make ~4.5 x more (smaller)
  forwards (`benchmarks/bench_trace.py`);
- row 0 of the first forward of a step is the clean run and the splice reads the clean h from that
  row (as ROME does): inside the same forward, or, for the later passes of layer reuse, as recorded
  at the subject positions during the first pass of the step. Clean activations are never kept
  past their step and, with sigma = 0, a patched row is bit-identical to its corrupted row (TIE
  exactly 0) as long as a row's arithmetic does not depend on the rest of its batch (true on CPU);
- a step whose rows exceed `batch_size` is cut into equal-size chunks (each led by a clean row,
  short chunks padded with clean copies), so every row of one pass sees the same kernel shapes;
  the layer-reuse passes are chunked alike, without clean row or padding.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from timerome.backbones.families import HOOK_POINTS
from timerome.errors import TimeromeError
from timerome.hooks import Intervention, TraceState, capture, patch
from timerome.progress import progress_bar
# the sampler's own step pieces: a traced trajectory is a sampler trajectory, step for step
from timerome.sampler import denoise_step, transfer_schedule
from timerome.train import encode_pairs

VALIDATION_SIZE = 8  # the paper traces 8 validation facts
SIGMA_FACTOR = 3.0   # "s3": sigma = 3 x std of the subject-token embeddings
REMASKING = "low_confidence"
READOUTS = ("decided", "aligned")  # how log p(o | x_k) reads committed positions (module docstring)
SHARE_ROWS = True  # rows with the same future share one run (`_plan`); the benchmark turns it off to compare
REUSE_LAYERS = True  # splicing rows skip the blocks below their layer (`_trace_fact`); the benchmark compares


# ------------------------------------------------------------------------------ facts -> tokens


@dataclass
class TracedFact:
    """One fact, tokenized: prompt ids [P], object ids [G], subject positions [S] inside the prompt."""

    fact_id: str
    subject: str
    prompt: str
    object: str
    prompt_ids: torch.Tensor   # [P] long
    object_ids: torch.Tensor   # [G] long
    subject_pos: torch.Tensor  # [S] long, positions in the prompt

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.object_ids)

    def start(self, mask_id: int) -> torch.Tensor:
        """x_0 = [prompt | mask * G], LongTensor [P + G]."""
        masks = torch.full((len(self.object_ids),), mask_id, dtype=torch.long)
        return torch.cat([self.prompt_ids, masks])

    def info(self) -> dict:
        return dict(fact_id=self.fact_id, subject=self.subject, prompt=self.prompt, object=self.object,
                    prompt_ids=self.prompt_ids.tolist(), object_ids=self.object_ids.tolist(),
                    subject_positions=self.subject_pos.tolist())


def _fields(fact, index: int) -> tuple[str, str, str, str]:
    """(fact_id, subject, prompt, object) of a Fact-like object or a dict."""
    get = fact.get if isinstance(fact, dict) else (lambda k, d=None: getattr(fact, k, d))
    missing = [k for k in ("subject", "prompt", "object") if not isinstance(get(k), str)]
    if missing:
        raise TimeromeError(f"fact {index} has no text for {', '.join(missing)}: a fact needs "
                            "subject, prompt and object strings")
    fid = get("fact_id") or get("id") or str(index)
    return str(fid), get("subject"), get("prompt"), get("object")


def tokenize_fact(backbone, fact, index: int = 0) -> TracedFact:
    """Tokenize a fact; its subject tokens are those whose character span overlaps the subject.

    The subject is looked up in the prompt verbatim (first occurrence), then case-insensitively.
    """
    fid, subject, prompt, obj = _fields(fact, index)
    start = prompt.find(subject) if subject else -1
    if start < 0 and subject:
        start = prompt.lower().find(subject.lower())
    if start < 0:
        raise TimeromeError(f"fact {fid!r}: subject {subject!r} does not occur in its prompt {prompt!r}")
    end = start + len(subject)
    try:
        enc = backbone.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError) as e:
        raise TimeromeError(f"the tokenizer gives no character offsets ({type(e).__name__}), so subject "
                            "tokens cannot be located; use a fast (Rust) tokenizer") from None
    ids = list(enc["input_ids"])
    subj = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < end and b > start]
    if not subj:
        raise TimeromeError(f"fact {fid!r}: subject {subject!r} covers no prompt token")
    if backbone.mask_id in ids:
        raise TimeromeError(f"fact {fid!r}: the prompt contains the mask token")
    if not obj.strip():
        raise TimeromeError(f"fact {fid!r}: the object is empty")
    try:  # the object is tokenized as training tokenizes an answer (leading space for BPE)
        (_, obj_ids), = encode_pairs(backbone, [dict(question=prompt, answer=obj)])
    except TimeromeError:  # the object is not empty, so only the length can fail
        raise TimeromeError(f"fact {fid!r}: prompt + object exceed the model's context of "
                            f"{backbone.max_length} tokens") from None
    return TracedFact(fid, subject, prompt, obj, torch.tensor(ids, dtype=torch.long),
                      torch.tensor(obj_ids, dtype=torch.long), torch.tensor(subj, dtype=torch.long))


@torch.no_grad()
def subject_embedding_std(backbone, facts: list[TracedFact]) -> float:
    """std over all entries of the subject tokens' embedding vectors (ROME's noise scale)."""
    ids = torch.cat([f.prompt_ids[f.subject_pos] for f in facts]).to(backbone.device)
    e = backbone.embedding()(ids).float()  # [n_subject_tokens, H]
    return float(e.std()) if e.numel() > 1 else 0.0


def default_facts(n: int = VALIDATION_SIZE) -> list:
    """The embedded model's forget split (forget01), first n facts: the validation subset."""
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import load_split

    facts, _ = facts_from_rows(load_split("forget01", "embedded"))  # every embedded row has its author
    return facts[:n]


# ------------------------------------------------------------------------------ one trajectory


def object_logprobs(gen_logits: torch.Tensor, object_ids: torch.Tensor) -> torch.Tensor:
    """log p(o_i | x) per object position: gen_logits [B, G, V] (the answer region) -> [B, G] float32."""
    logits = gen_logits.float()
    picked = logits.gather(-1, object_ids.to(logits.device).expand(logits.shape[:2])[..., None]).squeeze(-1)
    return picked - logits.logsumexp(-1)


def read_out(pos: torch.Tensor, masked: torch.Tensor, decided: torch.Tensor, readout: str):
    """log p(o | x_k) [B] from this forward's per-position log-probs pos [B, G].

    masked [B, G]: positions still masked in x_k. decided [B, G]: each position's log-prob from
    the forward that last saw it masked. Returns (score [B], updated decided).
    """
    decided = torch.where(masked, pos, decided)
    return (pos if readout == "aligned" else decided).sum(-1), decided


def reveal(x_gen: torch.Tensor, gen_logits: torch.Tensor, n: int, mask_id: int) -> torch.Tensor:
    """One sampler step on the answer region: x_gen [B, G] -> x_gen with n more masks revealed.

    Temperature 0 and low-confidence remasking: the sampler's own `denoise_step`. Only the
    answer region is passed because the prompt holds no mask (checked in tokenize_fact), so no
    prompt position could compete for the budget; it saves a [B, P, V] float64 softmax.
    """
    n_reveal = torch.full((x_gen.shape[0],), n, dtype=torch.long, device=x_gen.device)
    return denoise_step(x_gen, gen_logits, x_gen == mask_id, n_reveal, remasking=REMASKING)


def reveal_schedule(n_object: int, steps: int) -> list[int]:
    """Tokens revealed at each of the K steps (the sampler's schedule for one block of G masks)."""
    return transfer_schedule(torch.tensor([n_object]), steps)[0].tolist()


@torch.no_grad()
def run_trajectory(backbone, prompt_ids, object_ids, *, steps: int, state: TraceState | None = None,
                   rows: int = 1, readout: str = "decided") -> tuple[torch.Tensor, torch.Tensor]:
    """Denoise [prompt | mask * G] for `steps` steps plus one scoring forward, under whatever hooks
    the caller installed (sharing `state`, whose step is set before every forward).

    Returns (logp [rows, K + 1], xs [K + 1, rows, P + G]): log p(o | x_k) and the input x_k of
    forward k. The slow, one-trajectory-at-a-time path: the naive reference and the tests use it.
    """
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long)
    obj = torch.as_tensor(object_ids, dtype=torch.long).to(backbone.device)
    P, G = len(prompt), len(obj)
    x = torch.full((rows, P + G), backbone.mask_id, dtype=torch.long, device=backbone.device)
    x[:, :P] = prompt.to(backbone.device)
    budget = reveal_schedule(G, steps)
    decided = torch.zeros(rows, G, device=backbone.device)
    logps, xs = [], []
    for k in range(steps + 1):
        if state is not None:
            state.step = k
        xs.append(x.clone())
        gen_logits = backbone.logits(x)[:, P:]  # [rows, G, V]
        masked = x[:, P:] == backbone.mask_id
        score, decided = read_out(object_logprobs(gen_logits, obj), masked, decided, readout)
        logps.append(score)
        if k < steps:
            x[:, P:] = reveal(x[:, P:], gen_logits, budget[k], backbone.mask_id)
    return torch.stack(logps, 1).cpu(), torch.stack(xs).cpu()


# ------------------------------------------------------------------------------ the wavefront


class _Rows:
    """What the hooks need about the batch in flight; set before every forward."""

    def __init__(self):
        self.noise: torch.Tensor | None = None    # [B, S, H] added to the subject embeddings
        self.splice: dict[int, torch.Tensor] = {}  # site index -> rows [n] spliced at this forward
        self.clean: dict[int, torch.Tensor] = {}   # site index -> clean h [S, H] of this step, if recorded
        self.record = False                        # record row 0's h at every site into `clean`
        self.keep: torch.Tensor | None = None      # batch rows whose block outputs are cached


def _hook_fns(sites, subject_pos: torch.Tensor, rows: _Rows) -> dict:
    def add_noise(h, _state):  # h [B, L, H]: token embeddings
        out = h.clone()
        out[:, subject_pos] += rows.noise
        return out

    def splicer(c):
        def fn(h, _state):  # h [B, L, H]: output of site c
            if rows.record:  # row 0 is the clean run; a later forward of this step splices it
                rows.clean[c] = h[0, subject_pos].clone()
            idx = rows.splice.get(c)
            if idx is None:
                return None
            out = h.clone()
            # the clean h of this step: recorded, or row 0 of this very forward (the clean run)
            out[idx[:, None], subject_pos] = rows.clean[c] if c in rows.clean else h[0, subject_pos]
            return out

        return fn

    fns = {(None, "embed"): add_noise}
    fns.update({site: splicer(c) for c, site in enumerate(sites)})
    return fns


@torch.no_grad()
def _trace_fact(backbone, fact: TracedFact, noise: torch.Tensor, sites, steps: int, batch_size: int,
                readout: str = "decided", bar=None) -> dict:
    """All runs of one fact. noise [N, S, H] (sigma already applied).

    Rows (besides the clean row 0 of every chunk): N corrupted rows, then for each patch step k a
    block of C * N rows, row c * N + s patching site c under noise sample s. They are appended as
    the wavefront reaches step k, so a row keeps its index and its log p column j is its step j.
    Only the rows `_plan` picks are run; the others share a run's results (same future).

    With REUSE_LAYERS, step j runs in passes (`_passes`): first every row that does not splice at
    this step (the clean row 0 and the corrupted rows among them), recording the clean h at every
    site and caching the corrupted rows' block outputs; then the splicing rows, one pass per layer
    l, with blocks 0..l-1 answered from that cache instead of computed (`_skipping`).
    """
    device, mask_id = backbone.device, backbone.mask_id
    K, C, N = steps, len(sites), noise.shape[0]
    P = len(fact.prompt_ids)
    obj = fact.object_ids.to(device)
    budget = reveal_schedule(len(obj), K)
    subject_pos = fact.subject_pos.to(device)
    # noise by row: index 0 = no noise (clean and padding rows), s + 1 = sample s
    table = torch.cat([torch.zeros_like(noise[:1]), noise]).to(device=device, dtype=backbone.dtype)
    layer_of = torch.tensor([l for l, _ in sites], device=device)  # layer of each site
    blocks = [backbone.module(i, "resid") for i in range(int(layer_of.max()))] if REUSE_LAYERS else []

    x_clean = fact.start(mask_id)[None].to(device)  # [1, L]
    x = x_clean.repeat(N, 1)                        # [rows, L]; rows grow with the wavefront
    sample = torch.arange(N, device=device)         # noise sample of each row
    site = torch.full((N,), -1, device=device)      # site patched by each row (-1: none)
    at = torch.full((N,), -1, device=device)        # step at which it patches (-1: never)
    G = len(obj)
    decided = torch.zeros(N, G, device=device)      # per-position log-prob when last masked
    decided_clean = torch.zeros(1, G, device=device)
    lp_clean = torch.zeros(K + 1)
    lp = torch.full((N + K * C * N, K + 1), torch.nan)
    rows, state = _Rows(), TraceState()
    stats = dict(rows_run=0, forwards=0, block_rows=0)
    cache: list[list] = [[] for _ in blocks]  # per block: the corrupted rows' outputs, chunk by chunk
    with Intervention(backbone, _hook_fns(sites, subject_pos, rows), state), _caching(blocks, rows, cache):
        for j in range(K + 1):
            if j < K:  # patch runs of step j start from the corrupted x_j: the prefix is shared
                x = torch.cat([x, x[:N].repeat(C, 1)])
                decided = torch.cat([decided, decided[:N].repeat(C, 1)])
                sample = torch.cat([sample, torch.arange(N, device=device).repeat(C)])
                site = torch.cat([site, torch.arange(C, device=device).repeat_interleave(N)])
                at = torch.cat([at, torch.full((C * N,), j, device=device)])
            state.step = j
            run, share = _plan(x, sample, at, j)
            pos_run = torch.empty(len(run), G, device=device)  # per-position log p(o_i | x_j)
            gen_run = torch.empty_like(x[run, P:])
            passes = _passes(run, at, site, layer_of, j, bool(blocks))
            rows.clean = {}
            for n_pass, (idx, skip) in enumerate(passes):
                first = n_pass == 0  # the pass with the clean row: it leads each chunk
                lead = int(first)
                rows.record = first and len(passes) > 1
                if rows.record:
                    for part in cache:
                        part.clear()
                outs = None if first else _gathered(cache, skip)
                skip = skip if outs is not None else 0  # an output it cannot index: compute in full
                for a, b, pad in _chunks(len(idx), batch_size, lead):
                    r = run[idx[a:b]]
                    if first:  # clean row 0, the rows, clean padding
                        xb = torch.cat([x_clean, x[r], x_clean.expand(pad, -1)])  # [B, L]
                        rs = torch.cat([sample.new_full((1,), -1), sample[r], sample.new_full((pad,), -1)])
                        # the corrupted rows are run[0..N-1] (each leads its group), so this pass's first N
                        rows.keep = 1 + torch.arange(a, max(a, min(b, N)), device=device) - a if rows.record else None
                    else:  # no clean row (its h was recorded) and no padding: blocks above l run anyway
                        xb, rs, rows.keep = x[r], sample[r], None
                    rows.noise = table[rs + 1]  # [B, S, H]
                    rows.splice = _splice_rows(site[r], at[r], j, lead)
                    with _skipping(blocks[:skip], [_take(o, sample[r]) for o in (outs or [])[:skip]]):
                        gen_logits = backbone.logits(xb)[:, P:]  # [B, G, V]
                    pos = object_logprobs(gen_logits, obj)
                    pos_run[idx[a:b]] = pos[lead:lead + b - a]
                    if first and a == 0:
                        masked = x_clean[:, P:] == mask_id
                        score, decided_clean = read_out(pos[:1], masked, decided_clean, readout)
                        lp_clean[j] = float(score)
                    if j < K:
                        gen = reveal(xb[:, P:], gen_logits, budget[j], mask_id)
                        gen_run[idx[a:b]] = gen[lead:lead + b - a]
                        if first and a == 0:
                            new_clean = gen[:1]
                    stats["rows_run"] += xb.shape[0]
                    stats["forwards"] += 1
                    stats["block_rows"] += xb.shape[0] * (backbone.n_layers - skip)
            rows.record, rows.keep, rows.clean = False, None, {}
            score, decided = read_out(pos_run[share], x[:, P:] == mask_id, decided, readout)
            lp[:len(x), j] = score.cpu()
            if j < K:
                x[:, P:] = gen_run[share]
                x_clean = torch.cat([x_clean[:, :P], new_clean], 1)
            if bar is not None:
                bar.advance()
    return dict(clean=lp_clean, corrupted=lp[:N], patched=lp[N:].view(K, C, N, K + 1),
                clean_ids=x_clean[0].cpu(), stats=stats)


def _passes(run: torch.Tensor, at: torch.Tensor, site: torch.Tensor, layer_of: torch.Tensor, step: int,
            reuse: bool) -> list[tuple[torch.Tensor, int]]:
    """The forwards of one step as passes: (indices into run, blocks skipped), first pass first.

    Without reuse: one pass of every row. With it: the rows that do not splice at this step (they
    hold the corrupted rows, whose block outputs the later passes reuse), then the splicing rows
    grouped by the layer l of their site, skipping blocks 0..l-1: below l a splicing row is its
    corrupted row (same noise sample, same x_j).
    """
    everything = torch.arange(len(run), device=run.device)
    splicing = at[run] == step
    if not reuse or not bool(splicing.any()):
        return [(everything, 0)]
    layer = torch.where(splicing, layer_of[site[run].clamp(min=0)], -1)
    passes = [(everything[~splicing], 0)]
    for l in layer[splicing].unique().tolist():
        passes.append((everything[layer == l], int(l)))
    return passes


def _take(out, idx: torch.Tensor):
    """out's rows idx along the batch dimension: a tensor, or a plain tuple of batch-first tensors
    (and Nones). None for anything else: such a block output cannot be cached."""
    if torch.is_tensor(out):
        return out[idx]
    if type(out) is tuple and out and torch.is_tensor(out[0]):
        B = out[0].shape[0]
        if all(t is None or (torch.is_tensor(t) and t.dim() > 0 and t.shape[0] == B) for t in out):
            return tuple(None if t is None else t[idx] for t in out)
    return None


def _cat(parts: list):
    """Batch-concatenate what `_take` returned, chunk by chunk; None if any part is unusable."""
    if not parts or any(p is None for p in parts):
        return None
    if torch.is_tensor(parts[0]):
        return torch.cat(parts)
    if any(len(p) != len(parts[0]) for p in parts):
        return None
    out = []
    for items in zip(*parts):
        if all(t is None for t in items):
            out.append(None)
        elif any(t is None for t in items):
            return None
        else:
            out.append(torch.cat(items))
    return tuple(out)


def _gathered(cache: list[list], skip: int) -> list | None:
    """The cached outputs of blocks 0..skip-1, indexed by noise sample; None if one is unusable."""
    outs = [_cat(parts) for parts in cache[:skip]]
    return None if any(o is None for o in outs) else outs


@contextmanager
def _caching(blocks, rows: _Rows, cache: list[list]):
    """Append to cache[i] block i's output at the batch rows `rows.keep` of every forward."""

    def keeper(i):
        def hook(_module, _inputs, output):
            if rows.keep is not None and len(rows.keep):
                cache[i].append(_take(output, rows.keep))

        return hook

    handles = []
    try:
        for i, block in enumerate(blocks):
            handles.append(block.register_forward_hook(keeper(i)))
        yield cache
    finally:
        for h in handles:
            h.remove()


def _returning(out):
    """A forward that ignores its inputs and returns out."""

    def forward(*_args, **_kwargs):
        return out

    return forward


@contextmanager
def _skipping(blocks, outputs):
    """Inside the block, blocks[i] returns outputs[i] without computing anything.

    The instance attribute `forward` shadows the class's method for nn.Module.__call__, so the
    block's own computation truly never runs; its hooks still run on the returned output.
    """
    saved = []
    try:
        for block, out in zip(blocks, outputs):
            saved.append((block, block.__dict__.get("forward")))
            block.forward = _returning(out)
        yield
    finally:
        for block, own in saved:
            if own is None:
                del block.forward
            else:
                block.forward = own


def _plan(x: torch.Tensor, sample: torch.Tensor, at: torch.Tensor, step: int):
    """Which rows to run at this step: (run [R] row indices, share [rows] index into run).

    A row with no splice ahead is, from here on, a deterministic function of (noise sample, x)
    (temperature 0, the same noise at every forward), so rows with equal (sample, x) have the same
    future: one of them is run and the others take its results. Typically a splice that changes no
    committed token folds its row back into the corrupted run right after the patched forward.
    Rows that splice at this step are always run.
    """
    n = x.shape[0]
    idx = torch.arange(n, device=x.device)
    own = torch.where((at == step) | (not SHARE_ROWS), idx, -1)  # a splicing row is its own group
    key = torch.cat([own[:, None], sample[:, None], x], 1)
    _, group = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((n,), n, device=x.device).scatter_reduce(0, group, idx, "amin")[: int(group.max()) + 1]
    run = first.sort().values
    share = torch.searchsorted(run, first[group])
    return run, share


def _chunks(n: int, batch_size: int, lead: int = 1):
    """(start, end, padding) of equal-size chunks of n rows, each leaving room for `lead` clean rows."""
    per = max(1, batch_size - lead)
    n_chunks = -(-n // per)
    size = -(-n // n_chunks)
    for a in range(0, n, size):
        b = min(a + size, n)
        yield a, b, size - (b - a)


def _splice_rows(site: torch.Tensor, at: torch.Tensor, step: int, lead: int = 1) -> dict[int, torch.Tensor]:
    """site index -> chunk row indices (+lead: after the clean row, if any) that splice at this step."""
    idx = (at == step).nonzero().squeeze(1)
    if idx.numel() == 0:
        return {}
    hit = site[idx]
    return {int(c): idx[hit == c] + lead for c in hit.unique().tolist()}


# ------------------------------------------------------------------------------ TIE


def later_steps(steps: int) -> torch.Tensor:
    """Bool [K, K + 1]: True where k' > k, the (k, k') pairs a TIE is defined for."""
    return torch.arange(steps + 1)[None, :] > torch.arange(steps)[:, None]


def tie_weights(steps: int, tau: float) -> torch.Tensor:
    """w [K, K + 1] (float64): w[k, k'] ∝ exp(-tau (k' - k)) over k' > k, rows summing to 1; 0 elsewhere."""
    gap = (torch.arange(steps + 1)[None, :] - torch.arange(steps)[:, None]).double()
    # a softmax of -tau (k' - k) over the later steps: normalised, and stable for any tau
    return torch.where(later_steps(steps), -float(tau) * gap, -torch.inf).softmax(-1)


def aggregate(tie_full: torch.Tensor, tau: float) -> torch.Tensor:
    """TIE_bar = sum_{k' > k} w_{k,k'} TIE(k'): tie_full [..., K, K + 1] -> [..., K]."""
    K = tie_full.shape[-2]
    vals = torch.where(later_steps(K), tie_full.double(), 0.0)  # the NaN at k' <= k meet no weight
    return (vals * tie_weights(K, tau)).sum(-1).to(tie_full.dtype)


@dataclass
class TraceResult:
    """TIE heatmaps of a set of facts (nats). Modules and layers index the middle axes.

    tie            [F, M, Ly, K]        TIE_bar(l, k, m) per fact (the heatmaps)
    tie_full       [F, M, Ly, K, K + 1] TIE(l, k, m, k'); NaN where k' <= k (not defined)
    clean_logp     [F, K + 1]           log p(o | x_k) of the clean run
    corrupted_logp [F, N, K + 1]        the same per noise sample of the corrupted run
    """

    tie: torch.Tensor
    tie_full: torch.Tensor
    clean_logp: torch.Tensor
    corrupted_logp: torch.Tensor
    fact_ids: list[str]
    modules: tuple[str, ...]
    layers: list[int]
    settings: dict
    facts: list[dict] = field(default_factory=list)  # per fact: tokens, subject positions, clean answer
    stats: dict = field(default_factory=dict)        # work done: rows run, batched forwards

    @property
    def steps(self) -> int:
        return self.tie.shape[-1]

    def mean(self) -> torch.Tensor:
        """TIE_bar averaged over facts: [M, Ly, K]."""
        return self.tie.mean(0)

    def fact_index(self, fact: int | str) -> int:
        if isinstance(fact, int) and not isinstance(fact, bool):
            if not -len(self.fact_ids) <= fact < len(self.fact_ids):
                raise TimeromeError(f"fact index {fact} out of range: the trace has {len(self.fact_ids)} facts")
            return fact % len(self.fact_ids)
        if fact not in self.fact_ids:
            raise TimeromeError(f"no fact {fact!r} in this trace (facts: {', '.join(self.fact_ids)})")
        return self.fact_ids.index(fact)

    def save(self, path: str | Path) -> Path:
        """Tensors to PATH (.safetensors), settings and facts to the same name with .json."""
        from safetensors.torch import save_file

        path = Path(path)
        if path.suffix != ".safetensors":
            path = path.with_name(path.name + ".safetensors")
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = dict(tie=self.tie, tie_full=self.tie_full, clean_logp=self.clean_logp,
                       corrupted_logp=self.corrupted_logp)
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
        meta = dict(fact_ids=self.fact_ids, modules=list(self.modules), layers=self.layers,
                    settings=self.settings, facts=self.facts, stats=self.stats)
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TraceResult":
        from safetensors.torch import load_file

        path = Path(path)
        if path.suffix != ".safetensors":
            path = path.with_name(path.name + ".safetensors") if not path.suffix else path.with_suffix(".safetensors")
        meta_path = path.with_suffix(".json")
        if not path.exists() or not meta_path.exists():
            raise TimeromeError(f"a trace result is {path} plus {meta_path.name}; one of them is missing")
        t = load_file(str(path))
        meta = json.loads(meta_path.read_text())
        return cls(t["tie"], t["tie_full"], t["clean_logp"], t["corrupted_logp"], list(meta["fact_ids"]),
                   tuple(meta["modules"]), list(meta["layers"]), dict(meta["settings"]), list(meta.get("facts", [])),
                   dict(meta.get("stats", {})))


# ------------------------------------------------------------------------------ public entry


def _check(backbone, facts, steps, n_samples, sigma, tau, modules, layers, batch_size, readout):
    if not isinstance(steps, int) or steps < 1:
        raise TimeromeError(f"steps must be an integer >= 1, got {steps!r}")
    if not isinstance(n_samples, int) or n_samples < 1:
        raise TimeromeError(f"n_samples must be an integer >= 1, got {n_samples!r}")
    if sigma is not None and not (math.isfinite(float(sigma)) and float(sigma) >= 0):
        raise TimeromeError(f"sigma must be a finite number >= 0 (or None for 3 x subject-embedding std), got {sigma!r}")
    if not math.isfinite(float(tau)):
        raise TimeromeError(f"tau must be finite, got {tau!r}")
    if isinstance(modules, str):
        modules = (modules,)
    modules = tuple(modules)
    bad = [m for m in modules if m not in HOOK_POINTS]
    if bad or not modules or len(set(modules)) != len(modules):
        raise TimeromeError(f"modules must be distinct names from {', '.join(HOOK_POINTS)}; got {list(modules)}")
    n = backbone.n_layers
    layers = list(range(n)) if layers is None else [layers] if isinstance(layers, int) else list(layers)
    if not layers or any(not isinstance(l, int) or not -n <= l < n for l in layers):
        raise TimeromeError(f"layers must be integers in [0, {n}) (the model has {n} layers); got {layers}")
    layers = [l % n for l in layers]
    if len(set(layers)) != len(layers):
        raise TimeromeError(f"layers are repeated: {layers}")
    if not isinstance(batch_size, int) or batch_size < 2:
        raise TimeromeError(f"batch_size must be an integer >= 2 (one row is the clean run), got {batch_size!r}")
    if readout not in READOUTS:
        raise TimeromeError(f"unknown readout {readout!r}; choose one of {', '.join(READOUTS)}")
    if not facts:
        raise TimeromeError("no facts to trace: give at least one (subject, prompt, object) fact")
    return modules, layers


def prepare(backbone, facts, *, n_samples: int, sigma: float | None, seed: int):
    """Tokenized facts, sigma, its rule, and each fact's noise [N, S, H] (float32, sigma applied).

    All noise comes from one CPU generator seeded with `seed`, drawn fact by fact in order, so the
    same seed gives the same numbers on any device.
    """
    items = [tokenize_fact(backbone, f, i) for i, f in enumerate(facts)]
    if sigma is None:
        sig, rule = SIGMA_FACTOR * subject_embedding_std(backbone, items), "s3"
    else:
        sig, rule = float(sigma), "fixed"
    g = torch.Generator().manual_seed(int(seed))
    noises = [sig * torch.randn(n_samples, len(it.subject_pos), backbone.hidden_size, generator=g) for it in items]
    return items, sig, rule, noises


def trace(backbone=None, facts=None, *, steps: int = 8, n_samples: int = 5, sigma: float | None = None,
          tau: float = 1.0, modules=HOOK_POINTS, layers=None, seed: int = 0, batch_size: int = 256,
          readout: str = "decided", progress: bool = True) -> TraceResult:
    """Diffusion-time causal trace of `facts` on `backbone` (module docstring: the exact semantics).

    backbone: default the embedded model (`timerome.load_backbone()`).
    facts: Fact-like objects or dicts with subject / prompt / object (and optional fact_id);
        default the first 8 facts of the embedded forget01 split (the validation subset).
    steps: K denoising steps (one block of the object's length); sigma: noise scale, None = s3 rule;
    tau: temporal decay of the TIE aggregation; modules / layers: the sites traced (all by default);
    seed: seeds every noise draw; batch_size: most rows per forward (memory knob; results do not
    depend on it beyond float rounding).
    """
    if backbone is None:
        from timerome.backbones import load_backbone

        backbone = load_backbone()
    facts = default_facts() if facts is None else list(facts)
    modules, layers = _check(backbone, facts, steps, n_samples, sigma, tau, modules, layers, batch_size, readout)
    items, sig, rule, noises = prepare(backbone, facts, n_samples=n_samples, sigma=sigma, seed=seed)
    sites = [(l, m) for m in modules for l in layers]  # site c = module index * Ly + layer index
    M, Ly, K = len(modules), len(layers), steps
    ties, clean, corrupted, infos = [], [], [], []
    stats = dict(rows_run=0, forwards=0, block_rows=0)
    with progress_bar("causal trace", total=len(items) * (K + 1), enabled=progress) as bar:
        for it, noise in zip(items, noises):
            out = _trace_fact(backbone, it, noise, sites, K, batch_size, readout, bar)
            # [K, C, N, K+1] - [N, K+1] -> mean over samples -> [M, Ly, K, K+1]
            tie = (out["patched"] - out["corrupted"]).mean(2)
            ties.append(tie.view(K, M, Ly, K + 1).permute(1, 2, 0, 3))
            clean.append(out["clean"])
            corrupted.append(out["corrupted"])
            infos.append(dict(it.info(), clean_answer=backbone.decode(out["clean_ids"][len(it.prompt_ids):])))
            for k, v in out["stats"].items():
                stats[k] += v
    tie_full = torch.stack(ties)
    # TIE is defined for k' > k only (k' = k is the patched forward's own read-out)
    tie_full = tie_full.masked_fill(~later_steps(K), torch.nan)
    settings = dict(sigma=sig, sigma_rule=rule, tau=float(tau), steps=K, n_samples=n_samples, seed=int(seed),
                    model=backbone.name, family=backbone.family.name, fingerprint=backbone.fingerprint(),
                    readout=readout, temperature=0.0, remasking=REMASKING, block_length="object length (one block)")
    return TraceResult(aggregate(tie_full, tau), tie_full, torch.stack(clean), torch.stack(corrupted),
                       [it.fact_id for it in items], modules, layers, settings, infos, stats)


# ------------------------------------------------------------------------------ naive reference


@torch.no_grad()
def naive_tie(backbone, facts, coords, *, steps: int = 8, n_samples: int = 5, sigma: float | None = None,
              tau: float = 1.0, seed: int = 0, readout: str = "decided") -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, run literally: one full single-row trajectory per (fact, coordinate, sample).

    coords: list of (layer, step, module). Uses the hooks module's capture / patch helpers, not the
    wavefront, so it checks the fast path independently. Same noise as `trace` for the same
    arguments. Returns (tie [F, n_coords], tie_full [F, n_coords, K + 1]).
    """
    items, _, _, noises = prepare(backbone, facts, n_samples=n_samples, sigma=sigma, seed=seed)
    K = steps
    sites = sorted({(l, m) for l, _, m in coords}, key=str)
    full = torch.full((len(items), len(coords), K + 1), torch.nan)
    for f, (it, noise) in enumerate(zip(items, noises)):
        pos = it.subject_pos.to(backbone.device)
        run = lambda st: run_trajectory(backbone, it.prompt_ids, it.object_ids, steps=K, state=st,
                                        readout=readout)[0][0]
        state = TraceState()
        with capture(backbone, sites, state, positions=pos) as store:
            run(state)
        corrupted, patched = [], [[] for _ in coords]
        for s in range(n_samples):
            with Intervention(backbone, {(None, "embed"): _add_at(pos, noise[s], backbone)}, state):
                corrupted.append(run(state))
                for c, (l, k, m) in enumerate(coords):
                    with patch(backbone, {(l, m): store[(l, m)][k]}, pos, state=state, at_step=k):
                        patched[c].append(run(state))
        corr = torch.stack(corrupted)  # [N, K + 1]
        for c, (_, k, _) in enumerate(coords):
            full[f, c, k + 1:] = (torch.stack(patched[c]) - corr).mean(0)[k + 1:]
    w = tie_weights(K, tau).to(full.dtype)  # [K, K + 1]
    tie = torch.zeros(len(items), len(coords))
    for c, (_, k, _) in enumerate(coords):
        tie[:, c] = (full[:, c, k + 1:] * w[k, k + 1:]).sum(-1)
    return tie, full


def _add_at(pos: torch.Tensor, eps: torch.Tensor, backbone):
    """Hook adding eps [S, H] to the embeddings at token positions pos."""
    eps = eps.to(device=backbone.device, dtype=backbone.dtype)

    def fn(h, _state):
        out = h.clone()
        out[:, pos] += eps
        return out

    return fn

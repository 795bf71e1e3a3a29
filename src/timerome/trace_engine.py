"""The fast trace engine: every run of one fact in lock-step, sharing what the definition repeats.

It computes exactly the numbers of `timerome.tie.literal_tie` (tests compare the two), for every
(layer, step, module) of a fact at once. How (`benchmarks/bench_trace.py` measures it against the literal loop):
- every run of one fact advances in lock-step ("wavefront"): at step j the batch holds the clean row,
  the n_samples corrupted rows and every patch row started at a step k <= j, so no step is ever
  recomputed: the patch rows of step j are copies of the corrupted rows' x_j, made just before
  forward j, and all (site, sample) patches of a step go through one batched call;
- a row with no splice ahead is a deterministic function of (noise sample, x_j), so rows with equal
  (sample, x_j) share one run (`_plan`); a splice that commits the same tokens as the corrupted run
  folds back into it right after its patched forward, and costs nothing more;
- a patch at (l, k) shares the blocks below l at step k with its corrupted row (same noise sample,
  same x_k), so with reuse_layers step j runs in passes: first the rows that do not splice at j
  (the corrupted rows among them), caching the corrupted rows' raw block outputs, then the splicing
  rows one pass per layer l, whose blocks 0..l-1 return the cached outputs of their corrupted row
  instead of computing (their `forward` is swapped for the duration of the call; the embedding
  still runs). A block output must be a tensor or a plain tuple of batch-first tensors, else those
  rows are computed in full. Layer-0 splices save nothing and join the first pass; on the
  embedded model (4 layers) reuse computes 29% fewer row-blocks yet runs no faster (0.99x on the
  idle machine): the vocabulary head and the sampler step still run per row, and the passes make
  3.7 x more (smaller) forwards (`benchmarks/bench_trace.py`);
- row 0 of the first forward of a step is the clean run and the splice reads the clean h from that
  row (as ROME does): inside the same forward, or, for the later passes of layer reuse, as recorded
  at the subject positions during the first pass of the step. Clean activations are never kept
  past their step and, with sigma = 0, a patched row is bit-identical to its corrupted row (TIE
  exactly 0) as long as a row's arithmetic does not depend on the rest of its batch (true on CPU);
- a step whose rows exceed `batch_size` is cut into equal-size chunks (each led by a clean row,
  short chunks padded with clean copies), so every row of one pass sees the same kernel shapes;
  the layer-reuse passes are chunked alike, without clean row or padding.

Two switches exist for the benchmark and the tests to compare against: share_rows (`_plan`)
and reuse_layers (the passes); both on by default, neither changes a number.

`stats` counts the work done (rows_run, forwards, block_rows) and the least work any exact
implementation must do, `min_block_rows` (one row through one block; `min_block_tokens` weighs
each by the row's length), the unit of `benchmarks/bench_trace.py`'s floor: at every step j the
clean row and each distinct (noise sample, x_j) state through every block, and each row that
splices at j through the blocks above its site only (below, and for resid at l block l itself,
it is its corrupted row); the padding and repeated clean rows of chunks, the vocabulary head and
the sampler step are overhead.
"""

from __future__ import annotations

import torch

from timerome.hooks import Hooks, TraceState, replaced
from timerome.tie import object_logprobs, read_out, reveal, reveal_schedule


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
def trace_fact(backbone, fact, noise: torch.Tensor, sites, steps: int, batch_size: int,
               readout: str = "decided", bar=None, *, share_rows: bool = True, reuse_layers: bool = True) -> dict:
    """All runs of one fact. noise [N, S, H] (sigma already applied).

    Rows (besides the clean row 0 of every chunk): N corrupted rows, then for each patch step k a
    block of C * N rows, row c * N + s patching site c under noise sample s. They are appended as
    the wavefront reaches step k, so a row keeps its index and its log p column j is its step j.
    Only the rows `_plan` picks are run; the others share a run's results (same future).

    With reuse_layers, step j runs in passes (`_passes`): first every row that does not splice at
    this step (the clean row 0 and the corrupted rows among them), recording the clean h at every
    site and caching the corrupted rows' block outputs; then the splicing rows, one pass per layer
    l, with blocks 0..l-1 answered from that cache instead of computed (`hooks.replaced`).
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
    blocks = [backbone.module(i, "resid") for i in range(int(layer_of.max()))] if reuse_layers else []

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
    stats = dict(rows_run=0, forwards=0, block_rows=0, min_block_rows=0, min_block_tokens=0)
    n_layers = backbone.n_layers
    above = torch.tensor([n_layers - l - (m == "resid") for l, m in sites], device=device)  # blocks a splice needs
    cache: list[list] = [[] for _ in blocks]  # per block: the corrupted rows' outputs, chunk by chunk
    with Hooks(backbone, edit=_hook_fns(sites, subject_pos, rows), state=state), \
            Hooks(backbone, edit=_keepers(blocks, rows, cache), raw=True):
        for j in range(K + 1):
            if j < K:  # patch runs of step j start from the corrupted x_j: the prefix is shared
                x = torch.cat([x, x[:N].repeat(C, 1)])
                decided = torch.cat([decided, decided[:N].repeat(C, 1)])
                sample = torch.cat([sample, torch.arange(N, device=device).repeat(C)])
                site = torch.cat([site, torch.arange(C, device=device).repeat_interleave(N)])
                at = torch.cat([at, torch.full((C * N,), j, device=device)])
            state.step = j
            run, share = _plan(x, sample, at, j, share_rows)
            distinct = run if share_rows else _plan(x, sample, at, j, True)[0]
            splices = at[distinct] == j
            need = n_layers * (1 + int((~splices).sum())) + int(above[site[distinct[splices]]].sum())
            stats["min_block_rows"] += need
            stats["min_block_tokens"] += need * x.shape[1]
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
                    with replaced(blocks[:skip], [_take(o, sample[r]) for o in (outs or [])[:skip]]):
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
    hold the corrupted rows, whose block outputs the later passes reuse) and those splicing at
    layer 0 (nothing to skip), then the other splicing rows grouped by the layer l of their site,
    skipping blocks 0..l-1: below l a splicing row is its corrupted row (same noise sample, same x_j).
    """
    everything = torch.arange(len(run), device=run.device)
    splicing = at[run] == step
    if not reuse or not bool(splicing.any()):
        return [(everything, 0)]
    layer = torch.where(splicing, layer_of[site[run].clamp(min=0)], -1)
    passes = [(everything[layer <= 0], 0)]  # a layer-0 splice skips nothing: it joins the first pass
    for l in layer[layer > 0].unique().tolist():
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


def _keepers(blocks, rows: _Rows, cache: list[list]) -> dict:
    """Raw-output hooks appending block i's output at the batch rows `rows.keep` to cache[i]."""

    def keeper(i):
        def fn(output, _state):
            if rows.keep is not None and len(rows.keep):
                cache[i].append(_take(output, rows.keep))
            return None

        return fn

    return {block: keeper(i) for i, block in enumerate(blocks)}


def _plan(x: torch.Tensor, sample: torch.Tensor, at: torch.Tensor, step: int, share: bool = True):
    """Which rows to run at this step: (run [R] row indices, share [rows] index into run).

    A row with no splice ahead is, from here on, a deterministic function of (noise sample, x)
    (temperature 0, the same noise at every forward), so rows with equal (sample, x) have the same
    future: one of them is run and the others take its results. Typically a splice that changes no
    committed token folds its row back into the corrupted run right after the patched forward.
    Rows that splice at this step are always run.
    """
    n = x.shape[0]
    idx = torch.arange(n, device=x.device)
    own = torch.where((at == step) | (not share), idx, -1)  # a splicing row is its own group
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

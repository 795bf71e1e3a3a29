"""The fast trace engine: every run of a fact in lock-step, sharing what the definition repeats.

It computes exactly the numbers of `timerome.tie.literal_tie` (tests compare the two), for every
(layer, step, module) of a fact at once. How (`benchmarks/bench_trace.py` measures it against the literal loop):
- every run of one fact advances in lock-step ("wavefront"): at step j the batch holds the clean row,
  the n_samples corrupted rows and every patch row started at a step k <= j, so no step is ever
  recomputed: the patch rows of step j are copies of the corrupted rows' x_j, made just before
  forward j, and all (site, sample) patches of a step go through one batched call;
- facts of one length (prompt + object tokens) share that wavefront (`group_facts`, as many as
  one batch holds): each keeps its own clean row, answer region, subject positions and reveal
  budget, so a row's numbers are those of its fact traced alone; small models get fuller batches;
- a row with no splice ahead is a deterministic function of (noise sample, x_j), so rows with equal
  (sample, x_j) share one run (`_plan`); a splice that commits the same tokens as the corrupted run
  folds back into it right after its patched forward, and costs nothing more;
- rows join the batch at their layer (reuse_layers): a row that splices at step j at (l, m) is, below
  its site, its corrupted row (same noise sample, same x_j), so it is not computed there: one
  forward per step starts with the clean rows, the rows that do not splice and the corrupted rows,
  and at the output of block b - 1 the rows that skip b blocks are appended to the batch as copies
  of their corrupted row's hidden states (b = l for attn / mlp at layer l, l + 1 for resid, whose
  block l is then spliced). The blocks above see the grown batch: this needs blocks whose other
  inputs (RoPE tables, masks) broadcast over the batch, which `rows_can_join` checks once on the
  backbone (else every row runs every block, as with reuse_layers=False);
- each fact's clean run is a row of every forward, and the splice reads the clean h from that row
  in the same forward (as ROME does). Clean activations are never kept, and, with sigma = 0, a
  patched row is bit-identical to its corrupted row (TIE exactly 0) as long as a row's arithmetic
  does not depend on the rest of its batch (true on CPU);
- a step whose rows exceed `batch_size` (counted at the top, after every join) is cut into
  chunks, each holding the clean rows of its facts and the corrupted rows its joining rows copy.

Two switches exist for the benchmark and the tests to compare against: share_rows (`_plan`)
and reuse_layers (the joins); both on by default, neither changes a number.

`stats` counts the work done (rows_run: rows reaching the head, forwards, block_rows) and the
least work any exact implementation must do, `min_block_rows` (one row through one block;
`min_block_tokens` weighs each by the row's length, `min_block_rows_by_length` splits it by row
length), the unit of `benchmarks/bench_trace.py`'s floor: at every step j the clean row and each distinct (noise sample, x_j) state through every
block, and each row that splices at j through the blocks above its site only (below, and for resid
at l block l itself, it is its corrupted row); repeated clean and corrupted rows of chunks, the
vocabulary head and the sampler step are overhead.
"""

from __future__ import annotations

import torch

from timerome.hooks import Hooks, TraceState
from timerome.tie import object_logprobs, read_out, reveal, reveal_schedule


class Rows:
    """What the hooks need about the batch in flight; set before every forward."""

    def __init__(self):
        self.noise: torch.Tensor | None = None  # [B0, L, H] added to the embeddings (0 off the subject)
        self.splice: dict = {}                   # site index -> (batch row, its clean row, subject position) triples
        self.join: dict = {}                     # block b -> batch rows copied onto the batch after it


def _hook_fns(sites, rows: Rows) -> dict:
    """Edits in place: the engine runs without autograd, and each output edited is the module's own
    fresh tensor, read by nothing before the edit."""

    def add_noise(h, _state):  # h [B0, L, H]: token embeddings
        h += rows.noise
        return h

    def splicer(c):
        def fn(h, _state):  # h [B, L, H]: output of site c
            if c not in rows.splice:
                return None
            idx, clean, positions = rows.splice[c]
            # the subject positions take the clean run's h of this step (its row in this forward)
            h[idx, positions] = h[clean, positions]  # the right side is a copy, read first
            return h

        return fn

    fns = {(None, "embed"): add_noise}
    fns.update({site: splicer(c) for c, site in enumerate(sites)})
    return fns


class _CannotJoin(Exception):
    """A block output that rows cannot be appended to (not a tensor or a plain (tensor, None...) tuple)."""


def _grow(output, src: torch.Tensor):
    """The block output with rows src appended (copies of those batch rows)."""
    if torch.is_tensor(output):
        return torch.cat([output, output[src]])
    if type(output) is tuple and output and torch.is_tensor(output[0]) and all(t is None for t in output[1:]):
        return (torch.cat([output[0], output[0][src]]), *output[1:])
    raise _CannotJoin(type(output).__name__)


def joiners(blocks, rows: Rows) -> dict:
    """Raw-output hooks on every block: after block b, append copies of the batch rows rows.join[b]."""

    def joiner(b):
        def fn(output, _state):
            src = rows.join.get(b)
            return None if src is None else _grow(output, src)

        return fn

    return {block: joiner(b) for b, block in enumerate(blocks)}


@torch.no_grad()
def rows_can_join(backbone) -> bool:
    """Whether rows appended to the batch after a block run correctly through the blocks above it:
    a copy of row 0 joined after block 0 must give row 0's logits, and rows 0-1 their own."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, backbone.vocab_size, (2, 4), generator=g).to(backbone.device)
    rows = Rows()
    rows.join = {0: torch.tensor([0], device=backbone.device)}
    try:
        with Hooks(backbone, edit=joiners([backbone.module(0, "resid")], rows), raw=True):
            got = backbone.logits(ids).float()
    except Exception:  # noqa: BLE001 - whatever the block makes of a grown batch, it is a no
        return False
    want = backbone.logits(ids).float()
    if got.shape[0] != 3:
        return False
    tol = 1e-3 * float(want.abs().max()) + 1e-5
    return bool((got[:2] - want).abs().max() <= tol and (got[2] - want[0]).abs().max() <= tol)


def group_facts(facts, n_rows: int, batch_size: int) -> list[list[int]]:
    """Indices of the facts traced together: facts of one length (prompt + object tokens), as many
    as fit in one batch at n_rows rows each (the rows one fact adds at a step), one by one otherwise."""
    per = max(1, batch_size // max(1, n_rows))
    by_length: dict[int, list[int]] = {}
    for i, f in enumerate(facts):
        by_length.setdefault(len(f.prompt_ids) + len(f.object_ids), []).append(i)
    return [idx[a:a + per] for idx in by_length.values() for a in range(0, len(idx), per)]


@torch.no_grad()
def trace_facts(backbone, facts, noises, sites, steps: int, batch_size: int, readout: str = "decided", bar=None, *,
                share_rows: bool = True, reuse_layers: bool = True) -> tuple[list[dict], dict]:
    """All runs of F facts of one length L, in lock-step. noises: per fact [N, S, H] (sigma applied).

    Rows (besides each fact's clean run, which leads every forward): the F * N corrupted rows (row f * N + s:
    fact f, noise sample s), then for each patch step k a block of F * C * N rows (fact f, site c,
    sample s in that order). They are appended as the wavefront reaches step k, so a row keeps its
    index and its log p column j is its step j. Only the rows `_plan` picks are run; the others share
    a run's results (same future). reuse_layers: splicing rows join the batch at their layer (the
    caller checks `rows_can_join`). Every per-position array spans the L positions; the prompt
    holds no mask, so "masked" means "an answer position not yet committed".

    Returns (per fact: clean [K+1], corrupted [N, K+1], patched [K, C, N, K+1] log p and the clean
    run's final ids; the work counts `stats` of the whole group).
    """
    device, mask_id, dtype = backbone.device, backbone.mask_id, backbone.dtype
    F, K, C, N = len(facts), steps, len(sites), noises[0].shape[0]
    n_layers = backbone.n_layers
    x_clean = torch.stack([f.start(mask_id) for f in facts]).to(device)  # [F, L]
    L = x_clean.shape[1]
    answer = x_clean == mask_id                                            # [F, L] the answer positions
    obj = torch.zeros(F, L, dtype=torch.long, device=device)              # object ids at the answer positions
    subject = torch.zeros(F, L, dtype=torch.bool, device=device)
    # noise by (fact, sample): index f * (N + 1) = none (the clean row), f * (N + 1) + s + 1 = sample s
    table = torch.zeros(F, N + 1, L, backbone.hidden_size, device=device, dtype=dtype)
    budget = torch.zeros(F, K, dtype=torch.long, device=device)           # tokens each step reveals
    for f, (it, noise) in enumerate(zip(facts, noises)):
        P = len(it.prompt_ids)
        obj[f, P:] = it.object_ids.to(device)
        subject[f, it.subject_pos.to(device)] = True
        table[f, 1:, it.subject_pos.to(device)] = noise.to(device=device, dtype=dtype)
        budget[f] = torch.tensor(reveal_schedule(len(it.object_ids), K), device=device)
    table = table.view(F * (N + 1), L, -1)
    below = torch.tensor([l + (m == "resid") for l, m in sites], device=device)  # blocks below a splice
    skip_of = below if reuse_layers else torch.zeros_like(below)  # blocks a splicing row does not compute
    blocks = [backbone.module(i, "resid") for i in range(n_layers)] if reuse_layers else []  # where rows join

    x = x_clean.repeat_interleave(N, 0)                           # [rows, L]; rows grow with the wavefront
    fact = torch.arange(F, device=device).repeat_interleave(N)    # fact of each row
    sample = torch.arange(N, device=device).repeat(F)             # noise sample of each row
    site = torch.full((F * N,), -1, device=device)                # site patched by each row (-1: none)
    at = torch.full((F * N,), -1, device=device)                  # step at which it patches (-1: never)
    decided = torch.zeros(F * N, L, device=device)                # per-position log-prob when last masked
    decided_clean = torch.zeros(F, L, device=device)
    lp_clean = torch.zeros(F, K + 1)
    lp = torch.full((F * N + K * F * C * N, K + 1), torch.nan)
    rows, state = Rows(), TraceState()
    stats = dict(rows_run=0, forwards=0, block_rows=0, min_block_rows=0, min_block_tokens=0,
                 min_block_rows_by_length={str(L): 0})
    # the joins first: at a block's output rows join before the resid splice there acts on them
    with Hooks(backbone, edit=joiners(blocks, rows), raw=True), Hooks(backbone, edit=_hook_fns(sites, rows), state=state):
        for j in range(K + 1):
            if j < K:  # patch runs of step j start from the corrupted x_j: the prefix is shared
                new = torch.arange(F * N, device=device).view(F, 1, N).expand(F, C, N).reshape(-1)
                x, decided = torch.cat([x, x[new]]), torch.cat([decided, decided[new]])
                fact, sample = torch.cat([fact, fact[new]]), torch.cat([sample, sample[new]])
                site = torch.cat([site, torch.arange(C, device=device).repeat_interleave(N).repeat(F)])
                at = torch.cat([at, torch.full((F * C * N,), j, device=device)])
            state.step = j
            corrupted = fact * N + sample  # each row's corrupted row (its index): what it shares a noise draw with
            run, share = _plan(x, corrupted, at, j, share_rows)
            distinct = run if share_rows else _plan(x, corrupted, at, j, True)[0]
            splices = at[distinct] == j
            need = n_layers * (F + int((~splices).sum())) + int((n_layers - below[site[distinct[splices]]]).sum())
            stats["min_block_rows"] += need
            stats["min_block_tokens"] += need * L
            stats["min_block_rows_by_length"][str(L)] += need
            skip = torch.where(at[run] == j, skip_of[site[run].clamp(min=0)], 0)  # 0: from the embedding
            source = corrupted[run]  # the corrupted rows are run[0..F*N-1], so also their run index
            pos_run = torch.empty(len(run), L, device=device)  # per-position log p(o_i | x_j)
            pos_clean = torch.empty(F, L, device=device)
            gen_run, gen_clean = torch.empty_like(x[run]), x_clean.clone()
            for items in _chunks(skip, fact[run], source, F * N, batch_size):
                xb, x_all, fr, where, clean_at, n_blocks = _layout(
                    rows, items, run, skip, source, x, x_clean, fact, sample, site, at, j, table, subject, N, n_layers)
                logits = backbone.logits(xb)  # [B, L, V]: the rows that joined included
                masked = x_all == mask_id
                # "decided" reads each position while it is masked only; "aligned" every answer position
                pos = object_logprobs(logits, obj[fr], masked if readout == "decided" else answer[fr])
                if readout != "decided":
                    pos = pos.masked_fill(~answer[fr], 0.0)
                pos_run[items] = pos[where]
                have = clean_at >= 0
                pos_clean[have] = pos[clean_at[have]]
                if j < K:
                    gen = reveal(x_all, logits, budget[fr, j], mask_id)
                    gen_run[items] = gen[where]
                    gen_clean[have] = gen[clean_at[have]]
                stats["rows_run"] += x_all.shape[0]
                stats["forwards"] += 1
                stats["block_rows"] += n_blocks
            rows.join, rows.splice = {}, {}
            score, decided_clean = read_out(pos_clean, x_clean == mask_id, decided_clean, readout)
            lp_clean[:, j] = score.cpu()
            score, decided = read_out(pos_run[share], x == mask_id, decided, readout)
            lp[:len(x), j] = score.cpu()
            if j < K:
                x = gen_run[share]
                x_clean = gen_clean
            if bar is not None:
                bar.advance(F)
    patched = lp[F * N:].view(K, F, C, N, K + 1)
    return [dict(clean=lp_clean[f], corrupted=lp[f * N:(f + 1) * N], patched=patched[:, f], clean_ids=x_clean[f].cpu())
            for f in range(F)], stats


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
    varies = (x != x[:1]).any(0)  # columns equal in every row (the prompt) tell no row apart
    group = _row_groups(torch.cat([own[:, None], sample[:, None], x[:, varies]], 1))
    first = torch.full((n,), n, device=x.device).scatter_reduce(0, group, idx, "amin")[: int(group.max()) + 1]
    run = first.sort().values
    share = torch.searchsorted(run, first[group])
    return run, share


def _row_groups(key: torch.Tensor) -> torch.Tensor:
    """Group id [n] of each row of key [n, m]: equal rows share one (torch.unique(dim=0)'s inverse,
    without its row-by-row comparisons): a lexicographic sort, one stable sort per column."""
    n = key.shape[0]
    order = torch.arange(n, device=key.device)
    for c in reversed(range(key.shape[1])):
        order = order[torch.sort(key[order, c], stable=True).indices]
    ranked = key[order]
    new = torch.ones(n, dtype=torch.long, device=key.device)
    new[1:] = (ranked[1:] != ranked[:-1]).any(1)
    return torch.empty_like(order).scatter_(0, order, new.cumsum(0) - 1)


def _chunks(skip: torch.Tensor, fact: torch.Tensor, source: torch.Tensor, n_corrupted: int, batch_size: int):
    """The run rows (indices into run) of each forward of one step: all of them when they fit in
    batch_size with the clean rows, else chunks filled in turn, each counting the clean rows of its
    facts and the corrupted rows its joining rows copy (joining rows ordered by fact and noise
    sample, so a chunk's joining rows mostly copy the same few). skip, fact, source (the run index
    of the row's corrupted row, f * N + s): per run row; run rows 0..n_corrupted-1 are the corrupted rows."""
    n = len(skip)
    joins = skip > 0
    key = source * (int(skip.max()) + 1) + skip
    order = torch.cat([(~joins).nonzero().squeeze(1), joins.nonzero().squeeze(1)[torch.sort(key[joins], stable=True).indices]])
    if int(fact.unique().numel()) + n <= batch_size:
        yield order
        return
    chunk, cleans, present, needed = [], set(), set(), set()
    for i, sk, f, src in zip(order.tolist(), skip[order].tolist(), fact[order].tolist(), source[order].tolist()):
        size = len(chunk) + 1 + len(cleans | {f}) + len((needed | ({src} if sk > 0 else set()))
                                                         - (present | ({i} if i < n_corrupted else set())))
        if chunk and size > batch_size:
            yield order.new_tensor(chunk)
            chunk, cleans, present, needed = [], set(), set(), set()
        chunk.append(i)
        cleans.add(f)
        if sk > 0:
            needed.add(src)
        elif i < n_corrupted:
            present.add(i)
    yield order.new_tensor(chunk)


def _layout(rows: Rows, items, run, skip, source, x, x_clean, fact, sample, site, at, step: int, table, subject,
            n_samples: int, n_layers: int):
    """The batch of one forward, and rows.noise / splice / join set for its hooks. Returns (ids
    [B0, L] it starts from, ids [B, L] of the final batch, fact of each final row, where
    [len(items)]: each item's row in the final batch, clean_at [F]: each fact's clean row in it or
    -1, row-blocks it computes).

    Rows from the embedding: the clean rows of the items' facts, the items that skip nothing, then
    any corrupted row a joining item copies that is not among them. Then, block by block, the items
    that skip b blocks are appended after block b - 1 as copies of their corrupted row (run row
    f * N + s for fact f, sample s: the corrupted rows lead their groups, so they are run[0..F*N-1]).
    """
    device, N = x.device, n_samples
    F = x_clean.shape[0]
    s_items = skip[items]
    base, joining = items[s_items == 0], items[s_items > 0]
    facts_in = fact[run[items]].unique()
    clean_at = torch.full((F,), -1, dtype=torch.long, device=device)
    clean_at[facts_in] = torch.arange(len(facts_in), device=device)
    where = torch.empty(len(run), dtype=torch.long, device=device)  # run index -> batch row
    first = len(facts_in)
    where[base] = torch.arange(first, first + len(base), device=device)
    n_corr = F * N
    present = torch.zeros(n_corr, dtype=torch.bool, device=device)
    present[base[base < n_corr]] = True
    needed = torch.zeros(n_corr, dtype=torch.bool, device=device)
    needed[source[joining]] = True  # the corrupted (run) rows the joining rows copy
    extra = (needed & ~present).nonzero().squeeze(1)  # corrupted rows here only to be copied
    where[extra] = torch.arange(first + len(base), first + len(base) + len(extra), device=device)
    start = run[torch.cat([base, extra])]
    B0 = first + len(start)
    rows.join, top, joined = {}, B0, []
    for b in s_items[s_items > 0].unique().tolist():
        these = joining[skip[joining] == b]
        rows.join[b - 1] = where[source[these]]
        where[these] = torch.arange(top, top + len(these), device=device)
        top += len(these)
        joined.append(run[these])
    xb = torch.cat([x_clean[facts_in], x[start]])
    x_all = torch.cat([xb, *(x[r] for r in joined)])  # the tokens of every row of the final batch
    fr = torch.cat([facts_in, fact[start], *(fact[r] for r in joined)])  # fact of each final row
    rows.noise = table[torch.cat([facts_in * (N + 1), fact[start] * (N + 1) + sample[start] + 1])]
    splicing = items[at[run[items]] == step]
    batch_rows, site_of = where[splicing], site[run[splicing]]
    rows.splice = {}
    for c in site_of.unique().tolist():
        spliced = batch_rows[site_of == c]
        row, positions = subject[fr[spliced]].nonzero(as_tuple=True)  # each (row, subject position)
        idx = spliced[row]
        rows.splice[int(c)] = (idx, clean_at[fr[idx]], positions)
    n_blocks = B0 * n_layers + int((n_layers - s_items[s_items > 0]).sum())
    return xb, x_all, fr, where[items], clean_at, n_blocks

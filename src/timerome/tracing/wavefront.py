"""The fast trace engine: every run of a fact in lock-step, sharing what the definition repeats.

It computes exactly the numbers of `timerome.tracing.tie.literal_tie` (tests compare the two), for every
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
  of their corrupted row's hidden states (b = l + 1 for resid at layer l, whose block l is then
  spliced; b = l for attn / mlp without packing). The blocks above see the grown batch: this needs
  blocks whose other inputs (RoPE tables, masks) broadcast over the batch, which `rows_can_join`
  checks once on the backbone (else every row runs every block, as with reuse_layers=False);
- packed splices (pack): an attn / mlp splice at layer l changes block l's output at the subject
  tokens only, and the rest of a block after its attention acts on each position alone, so its
  block l is computed at those tokens only: the subject tokens of many such rows share "packed"
  rows of L slots that run block l alone (their inputs gathered from the corrupted rows' block
  l - 1 output, their attention output set to the clean run's for attn or the corrupted row's for
  mlp, their MLP output to the clean run's for mlp), and the rows join after block l as copies of
  their corrupted row with their subject tokens from the packed rows (`_layout`). `rows_can_pack`
  checks on the backbone that packing changes nothing (else attn / mlp rows join below l);
- assembled mlp splices (assemble): an mlp splice at layer l > 0 needs no packed row either, since
  its subject tokens' block-l output is the block's own sum of three values the batch computes
  anyway: (the corrupted row's input to block l + its attention output) + the clean run's MLP
  output. They are read at the output of block l - 1 and at block l's attn / mlp hooks, and summed
  in that order when the row joins after block l; `rows_can_assemble` checks on the backbone that
  this is bit for bit the packed rows' result (else mlp splices are packed);
- a fact whose answer is all committed reads nothing more ("decided" read-out; every row of a fact
  reveals the same number of tokens per step), so its rows are not run again; the last scoring
  forward k' = K reads nothing at all and is skipped;
- the vocabulary head runs at the positions read only (the masked answer positions; `masked_head`),
  and the sampler step decides from those logits (`sampler.reveal_masked`), sharing the read-out's
  passes over them (`sampler.HeadRead`: max, argmax, exp(l - max)) and ordering confidences by a
  float32 sum with a proven error bound instead of the reference's float64 softmax (same tokens;
  the float64 softmax where the bound cannot settle a row; `screen`);
- each fact's clean run is a row of every forward, and the splice reads the clean h from that row
  in the same forward (as ROME does). Clean activations are never kept, and, with sigma = 0, a
  patched row is bit-identical to its corrupted row (TIE exactly 0) as long as a row's arithmetic
  does not depend on the rest of its batch (true on CPU);
- a step whose rows exceed `batch_size` (counted at the top, after every join) is cut into
  chunks, each holding the clean rows of its facts and the corrupted rows its joining rows copy;
- a forward whose batch holds more than `block_tokens` tokens runs each block in tiles of rows
  (`hooks.row_tiles`; on a CPU a batch past ~1024 tokens leaves the cache and runs 10-20 % slower
  per row): the joins and resid splices act on a block's whole output as before, and the copies
  inside a block (attn / mlp splices, the packed rows' fills), whose sources (clean and corrupted
  rows) lead the batch, keep the sources' values from the tiles before (`_copy`). `rows_can_tile`
  checks on the backbone that a tile's rows get the whole batch's numbers to the bit.

The rows' bookkeeping (which rows run, which join where, the packed slots) is done on small integer
arrays in numpy, where an operation costs about a microsecond against several for a torch call;
the index tensors a forward needs are made from them once per forward (`_layout`). Off the CPU they
travel to the device in one copy per forward through a pinned buffer, which does not wait for the
device (`_Staging`): a copy from pageable memory first waits for every kernel queued before it,
and a forward needs dozens of index tensors (on an H100 the embedded model's trace made 3,769 such
copies, about 120 per forward, each a synchronisation).

Switches exist for the benchmark and the tests to compare against: share_rows (`_plan`),
reuse_layers (the joins), pack, assemble, masked_head, screen and block_tokens (`tracing.trace`:
pack_splices, assemble_mlp, head, screen_reveal, block_tokens=0); all on by default, none changes a
number (bit-identical on CPU; tested).

`stats` counts the work done (rows_run: rows reaching the head, forwards, block_rows, head_positions;
block_batches: how many block calls (tiles) ran how many rows, keyed "LxB" for rows of length L in a batch of B)
and the least work any exact implementation must do, the unit of `benchmarks/bench_trace.py`'s
floor: `min_block_rows` (one row through one block; `min_block_tokens` weighs each by the row's
length, `min_block_rows_by_length` splits it by row length) and `min_head_positions` (one position
through the vocabulary head). At every step j where its fact still has a masked answer position
("decided": a fact whose answer is all committed reads nothing more, so no forward of its rows is
needed), the clean row and each distinct (noise sample, x_j) state through every block, and each
row that splices at j at layer l through the blocks above l only: below l it is its corrupted row,
and at l it differs from it at the subject tokens only (resid: by the splice itself; attn / mlp:
the rest of block l acts on each position alone), charged nothing there; the head at each of those
rows' masked answer positions ("aligned": every answer position). Repeated clean and corrupted
rows of chunks, packed rows, the head's other positions and the sampler step are overhead.
"""

from __future__ import annotations

from bisect import bisect_left
from contextlib import nullcontext

import numpy as np
import torch
from torch.nn.modules import module as torch_module

from timerome.engine.hooks import (Hooks, TraceState, denoising_steps, hidden_states, row_tiles, tile_sizes,
                                  with_hidden_states)
from timerome.engine.likelihood import logits_at
from timerome.engine.sampler import HeadRead, reveal_masked
from timerome.engine.settings import TRACE
from timerome.tracing.tie import REMASKING, add_noise, read_out, reveal_schedule, subject_noise, summed


class Rows:
    """What the hooks need about the batch in flight; set before every forward."""

    def __init__(self):
        self.noise: torch.Tensor | None = None  # [B0, L, H] added to the embeddings (0 off the subject)
        self.splice: dict = {}                   # site index -> (batch row, its clean row, subject position) triples
        self.join: dict = {}                     # block b -> batch rows copied onto the batch after it
        self.drop: dict = {}                     # block b -> rows dropped from the batch's tail after it (packed rows)
        self.fix: dict = {}                      # block b -> (joined row, position, batch row, slot): values set in the copies
        self.pack: dict = {}                     # block b -> (n rows, row, slot, batch row, position): packed rows appended
        self.fill: dict = {}                     # (layer, point) or (None, "embed") -> ((first, end) rows zeroed, row, slot, batch row, position,
                                                 #   sources' end, first row written: `_copy`'s bounds)
        self.mix: dict = {}                      # block b -> (joined row, position, corrupted row, clean row): assembled mlp splices
        self.stash: dict = {}                    # values read from one tile of a block for rows of a later tile (`_read`)

    def reset(self) -> None:
        """Forget the last forward's settings (`_layout` sets the next one's)."""
        self.join, self.splice, self.drop, self.fix, self.pack, self.fill, self.mix, self.stash = ({} for _ in range(8))


def _hook_fns(sites, rows: Rows, n_layers: int, packing: bool) -> dict:
    """Edits in place: the engine runs without autograd, and each output edited is the module's own
    fresh tensor, read by nothing before the edit."""

    def fill(key, h, state):  # the packed rows' slots take values of other rows at other positions
        got = rows.fill.get(key)
        if got is not None:
            zero, row, slot, src, pos, src_end, first = got
            if zero is not None:  # padding slots of a packed row (rows zero[0] .. zero[1] - 1): finite, read by nobody
                lo, hi = zero
                if state.rows is not None:
                    a, b = state.rows
                    lo, hi = max(lo, a) - a, min(hi, b) - a
                if hi > lo:
                    h[lo:hi] = 0
            _copy(rows, ("fill", key), h, state, row, slot, src, pos, src_end, first)

    corrupt = add_noise(lambda: rows.noise)

    def embed(h, state):  # h [B0, L, H]: token embeddings, corrupted, then the packed rows of layer 0 filled
        h = corrupt(h, state)
        fill((None, "embed"), h, state)
        return h

    def site_fn(key, c):
        layer, point = key

        def fn(h, state):  # h [B, L, H]: output of the site (or a tile of its rows, state.rows)
            mix = rows.mix.get(layer) if point in ("attn", "mlp") else None
            if mix is not None:  # assembled mlp splices: the corrupted rows' attention output, the clean rows' MLP output
                _, pos, corr, clean = mix
                _read(rows, ("mix", key), h, state, corr if point == "attn" else clean, pos)
            if c is not None and c in rows.splice:
                idx, clean, positions, src_end, first = rows.splice[c]
                # the subject positions take the clean run's h of this step (its row in this forward)
                _copy(rows, ("splice", c), h, state, idx, positions, clean, positions, src_end, first)
            fill(key, h, state)
            return h

        return fn

    index = {site: c for c, site in enumerate(sites)}
    keys = set(sites)
    if packing:  # a packed row's attention and MLP outputs are set at every layer that packs
        keys |= {(l, p) for l, m in sites if m != "resid" for p in ("attn", "mlp")}
    fns = {(None, "embed"): embed}
    fns.update({key: site_fn(key, index.get(key)) for key in sorted(keys, key=str)})
    return fns


def _read(rows: Rows, key, h, state, src, src_pos) -> None:
    """rows.stash[key] = (h[src, src_pos], have) on the rows h holds: the whole batch (have None), or
    one tile of a block run in tiles (`hooks.row_tiles`: state.rows = (start, stop)), each tile
    reading the sources it holds (have: which are read so far). Where the first tile holds every
    source (the usual case: the sources, clean and corrupted rows, lead the batch), they are all
    read there at once (have None)."""
    if state.rows is None:
        rows.stash[key] = (h[src, src_pos], None)
        return
    a, b = state.rows
    if a == 0:  # the first tile of this call of the block
        if not len(src) or int(src.max()) < b:
            rows.stash[key] = (h[src, src_pos], None)
            return
        rows.stash[key] = (h.new_empty(len(src), h.shape[-1]), torch.zeros(len(src), dtype=torch.bool, device=h.device))
    vals, have = rows.stash[key]
    if have is not None:
        s = (src >= a) & (src < b)
        vals[s] = h[src[s] - a, src_pos[s]]
        have |= s


def _read_all(rows: Rows, key, sel=slice(None)) -> torch.Tensor:
    """The values `_read` kept under key (those `sel` picks: a slice or a mask), every one of them read."""
    vals, have = rows.stash[key]
    if have is not None and not bool(have[sel].all()):  # the layout puts every source before the rows it is copied to
        raise RuntimeError("trace engine: a row copied from a row of a later tile")
    return vals[sel]


def _copy(rows: Rows, key, h, state, dst, dst_pos, src, src_pos, src_end: int, first: int) -> None:
    """h[dst, dst_pos] = h[src, src_pos], the right side read first, on the rows h holds: the whole
    batch, or one tile of a block run in tiles (`hooks.row_tiles`: state.rows = (start, stop)), the
    sources' values kept (`_read`) from the tiles before for rows of the tiles after. The sources
    (clean and corrupted rows) lead the batch, rows < src_end; the rows written are rows >= first:
    a tile outside both does nothing. Where dst ascends (packed rows' slots), each tile finds its
    rows by bisection instead of a mask."""
    if state.rows is None:
        h[dst, dst_pos] = h[src, src_pos]
        return
    a, b = state.rows
    if a == 0:
        order = dst.tolist()
        rows.stash[("order", key)] = order if all(u <= v for u, v in zip(order, order[1:])) else None
    if a == 0 or a < src_end:
        _read(rows, key, h, state, src, src_pos)
    if b <= first:
        return
    order = rows.stash[("order", key)]
    if order is not None:
        i, j = bisect_left(order, a), bisect_left(order, b)
        if j == i:
            return
        sel = slice(i, j)
    else:
        sel = (dst >= a) & (dst < b)
    h[dst[sel] - a, dst_pos[sel]] = _read_all(rows, key, sel)


class _CannotJoin(Exception):
    """A block output that rows cannot be appended to (not a tensor or a plain (tensor, None...) tuple)."""


def _regrow(h: torch.Tensor, rows: Rows, b: int) -> torch.Tensor | None:
    """Block b's output h [B, L, H] after its joins: the packed rows of layer b dropped from the tail,
    copies of the rows rows.join[b] appended (with rows.fix[b]'s values set at their subject
    positions, and rows.mix[b]'s assembled), then the packed rows of layer b + 1. None: nothing
    happens after block b. Where block b + 1 assembles mlp splices, their corrupted rows' inputs
    to it are read here."""
    drop, src, pack = rows.drop.get(b, 0), rows.join.get(b), rows.pack.get(b)
    out = None
    if drop or src is not None or pack is not None:
        parts = [h[:h.shape[0] - drop]] if drop else [h]
        if src is not None:
            copies = h[src]
            fix = rows.fix.get(b)
            if fix is not None:
                row, pos, from_row, from_slot = fix
                copies[row, pos] = h[from_row, from_slot]
            mix = rows.mix.get(b)
            if mix is not None:  # the block's own sums: (input + attention output) + MLP output
                row, pos, _, _ = mix
                mid = rows.stash.pop(("mix-in", b)) + _read_all(rows, ("mix", (b, "attn")))
                copies[row, pos] = mid + _read_all(rows, ("mix", (b, "mlp")))
            parts.append(copies)
        if pack is not None:
            n, row, slot, from_row, from_pos = pack
            packed = h.new_zeros(n, *h.shape[1:])
            packed[row, slot] = h[from_row, from_pos]
            parts.append(packed)
        out = torch.cat(parts)
    ahead = rows.mix.get(b + 1)
    if ahead is not None:
        _, pos, corr, _ = ahead
        rows.stash[("mix-in", b + 1)] = (h if out is None else out)[corr, pos]
    return out


def _grow(output, rows: Rows, b: int):
    """The block output with `_regrow` applied to its hidden states (`hooks.hidden_states`: a tensor
    or (tensor, None...))."""
    h = hidden_states(output)
    if h is None:
        raise _CannotJoin(type(output).__name__)
    h = _regrow(h, rows, b)
    return None if h is None else with_hidden_states(output, h)


def joiners(blocks, rows: Rows) -> dict:
    """Raw-output hooks on every block: after block b, the batch is regrown (`_regrow`): rows
    rows.join[b] copied onto it, packed rows dropped and appended."""

    def joiner(b):
        def fn(output, _state):
            return _grow(output, rows, b)

        return fn

    return {block: joiner(b) for b, block in enumerate(blocks)}


def checked(backbone, name: str, check) -> bool:
    """check()'s answer, kept on the backbone (`engine_checks`) while what a forward runs is unchanged.

    The engine's checks ask how the model computes (whether its blocks take a regrown batch, act
    on each position alone after attention), not what its weights hold; what can change the
    answer is what runs in a forward: which modules it has, the hooks on them (and torch's global
    ones), a forward set on one of them, methods set on the backbone object itself, its device and
    dtype. Those make the key, so a hook added or removed, a module replaced or a patched method
    asks again. The last 8 answers are kept."""
    memo = getattr(backbone, "engine_checks", None)
    if memo is None:  # not a timerome Backbone: ask every time
        return _one_step_of_its_own(backbone, check)
    key = (name, _forward_state(backbone))
    if key not in memo:
        memo[key] = _one_step_of_its_own(backbone, check)
        while len(memo) > 8:
            memo.pop(next(iter(memo)))
    return memo[key]


def _one_step_of_its_own(backbone, check) -> bool:
    """check() as one denoising step (step 0) of its own: its forwards run under the hooks the trace
    will run under, and an edit of one step there must see a step, whichever (it compares forwards
    made under the same one)."""
    with denoising_steps(backbone) as at_step:
        at_step(0)
        return check()


def _forward_state(backbone) -> tuple:
    """What a forward of the backbone runs besides its parameters' values (`checked`'s key)."""
    mods = list(backbone.model.modules())
    hooks = tuple((id(m), tuple(m._forward_hooks), tuple(m._forward_pre_hooks))
                  for m in mods if m._forward_hooks or m._forward_pre_hooks)
    patched = tuple((id(m), id(m.__dict__["forward"])) for m in mods if "forward" in m.__dict__)
    own = tuple((k, id(v)) for k, v in vars(backbone).items()
                if callable(v) and not isinstance(v, (torch.nn.Module, torch.Tensor)))
    p = next(backbone.model.parameters(), None)
    where = None if p is None else (str(p.device), p.dtype)
    return (tuple(map(id, mods)), hooks, patched, own, where, tuple(torch_module._global_forward_hooks),
            tuple(torch_module._global_forward_pre_hooks))


def rows_can_join(backbone) -> bool:
    """Whether a batch regrown after a block runs correctly through the blocks above it: with
    three rows, dropping the last after block 0 and appending copies of rows 0 and 1 must give
    rows 0-1 their own logits and the copies those of rows 0 and 1 (asked once per forward state,
    `checked`), within 1e-3 of the largest logit. Where they are not, the model's own spread is
    allowed too: how far its logits of rows 0-1 move when the batch alone holds 3 or 4 rows instead
    of 2 (the regrown batch runs block 0 at 3 rows and the blocks above at 4), the two added. On a
    CPU, whose kernels give a row the same numbers in any batch, that spread is 0 and never asked
    for; a GPU's kernels for another number of rows round otherwise, by an ulp of the dtype and what
    the blocks above make of it (one ulp of a bfloat16 logit is 0.4-0.8 % of it: on an H200 at
    LLaDA-8B's shapes in bfloat16, rows 0-1 moved by 0.12 of a largest 6.2 at 3 and at 4 rows, and
    the 1e-3 alone refused joins, so the trace ran every row through every block, 1.92x the
    row-blocks it needs). A tolerance so widened must still tell rows 0 and 1 apart by twice itself
    (a join that copied the wrong rows would pass unseen otherwise), or the answer is no. A batch the
    blocks cannot grow differs by far more, or raises."""
    return checked(backbone, "rows_can_join", lambda: _rows_can_join(backbone))


@torch.no_grad()
def _rows_can_join(backbone) -> bool:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, backbone.vocab_size, (3, 4), generator=g).to(backbone.device)
    rows = Rows()
    rows.join = {0: torch.tensor([0, 1], device=backbone.device)}
    rows.drop = {0: 1}
    try:
        with Hooks(backbone, edit=joiners([backbone.module(0, "resid")], rows), raw=True):
            got = backbone.logits(ids).float()
    except Exception:  # noqa: BLE001 - whatever the block makes of a regrown batch, it is a no
        return False
    want = backbone.logits(ids[:2]).float()
    if got.shape[0] != 4:
        return False
    off = max(float((got[:2] - want).abs().max()), float((got[2:] - want).abs().max()))
    tol = 1e-3 * float(want.abs().max()) + 1e-5
    if off <= tol:
        return True
    tol += _join_spread(backbone, ids, want)
    return off <= tol and float((want[0] - want[1]).abs().max()) > 2 * tol


def _join_spread(backbone, ids, want) -> float:
    """How far the logits of rows 0-1 move when the batch alone holds 3 or 4 rows instead of their 2
    (`want`), the two added: the regrown batch runs block 0 at 3 rows and the blocks above at 4."""
    return sum(float((backbone.logits(x).float()[:2] - want).abs().max()) for x in (ids, ids[[0, 1, 0, 1]]))


def rows_can_tile(backbone) -> bool:
    """Whether blocks run on tiles of rows (`hooks.row_tiles`) give every row the numbers the whole
    batch gives it, to the bit: six rows of eight tokens through the model in tiles of three rows
    and whole (asked once per forward state, `checked`)."""
    return checked(backbone, "rows_can_tile", lambda: _rows_can_tile(backbone))


@torch.no_grad()
def _rows_can_tile(backbone) -> bool:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, backbone.vocab_size, (6, 8), generator=g).to(backbone.device)
    want = backbone.logits(ids)
    try:
        with row_tiles([backbone.module(i, "resid") for i in range(backbone.n_layers)], 3, TraceState()):
            got = backbone.logits(ids)
    except Exception:  # noqa: BLE001 - whatever the block makes of a tile of its batch, it is a no
        return False
    return got.shape == want.shape and bool(torch.equal(got, want))


class _ProbeFact:
    """A synthetic fact for `rows_can_pack`: token ids only."""

    def __init__(self, prompt_ids, object_ids, subject_pos):
        self.prompt_ids, self.object_ids, self.subject_pos = prompt_ids, object_ids, subject_pos

    def start(self, mask_id: int) -> torch.Tensor:
        return torch.cat([self.prompt_ids, torch.full_like(self.object_ids, mask_id)])


def rows_can_pack(backbone, joins: bool | None = None) -> bool:
    """Whether attn / mlp splices may run their own layer at the subject tokens only (packed rows):
    the part of a block after its attention must act on each position alone, and the embedding
    must not depend on the position (no absolute position table added after the hooked embedding).
    Checked on the engine itself: a random fact traced at the first and last layers' attn and mlp,
    packed and unpacked, must give the same log-probs (asked once per forward state, `checked`).
    joins: `rows_can_join`'s answer where the caller has it (packed rows join the batch)."""
    if backbone.n_layers < 1 or not (rows_can_join(backbone) if joins is None else joins):
        return False
    return checked(backbone, "rows_can_pack", lambda: _rows_can_pack(backbone))


def _probe(backbone, seed: int, lowest: int):
    """The engine checks' probe: a random fact (6 prompt and 3 answer ids, subject at 1 and 3), 2
    noise samples, and attn / mlp sites at layer `lowest` and the top layer."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, backbone.vocab_size, (9,), generator=g)
    ids[ids == backbone.mask_id] = (backbone.mask_id + 1) % backbone.vocab_size
    fact = _ProbeFact(ids[:6], ids[6:], torch.tensor([1, 3]))
    noise = torch.randn(2, 2, backbone.hidden_size, generator=g)
    return fact, noise, [(l, m) for l in sorted({lowest, backbone.n_layers - 1}) for m in ("attn", "mlp")]


@torch.no_grad()
def _rows_can_pack(backbone) -> bool:
    fact, noise, sites = _probe(backbone, 1, 0)
    try:
        runs = [trace_facts(backbone, [fact], [noise], sites, 2, 64, pack=p)[0][0]["patched"] for p in (False, True)]
    except Exception:  # noqa: BLE001 - whatever the model makes of a packed row, it is a no
        return False
    a, b = runs  # [K, C, N, K + 1]: NaN before each patch step's own column, in both
    if not torch.equal(a.isnan(), b.isnan()) or not bool(torch.isfinite(b.nan_to_num(0.0)).all()):
        return False
    tol = 1e-3 * float(a.nan_to_num(0.0).abs().max()) + 1e-4
    return bool((a - b).nan_to_num(0.0).abs().max() <= tol)


def rows_can_assemble(backbone, packs: bool | None = None) -> bool:
    """Whether an mlp splice above layer 0 may take its subject tokens from the block's own sums, with
    no packed row: a block must compute its output as (its input + its attention output) + its MLP
    output, in that order, with nothing between it and the next block. Checked on the engine itself:
    a random fact traced at mlp sites above layer 0, assembled and packed, must give the same
    log-probs bit for bit (asked once per forward state, `checked`). packs: `rows_can_pack`'s answer
    where the caller has it."""
    if backbone.n_layers < 2 or not (rows_can_pack(backbone) if packs is None else packs):
        return False
    return checked(backbone, "rows_can_assemble", lambda: _rows_can_assemble(backbone))


@torch.no_grad()
def _rows_can_assemble(backbone) -> bool:
    fact, noise, sites = _probe(backbone, 3, 1)
    try:
        runs = [trace_facts(backbone, [fact], [noise], sites, 2, 64, pack=True, assemble=a)[0][0]
                for a in (False, True)]
    except Exception:  # noqa: BLE001 - whatever the model makes of it, it is a no
        return False
    a, b = runs
    return all(torch.equal(a[k].nan_to_num(7.0), b[k].nan_to_num(7.0)) for k in ("clean", "corrupted", "patched"))


def group_facts(facts, n_rows: int, batch_size: int) -> list[list[int]]:
    """Indices of the facts traced together: facts of one length (prompt + object tokens), as many
    as fit in one batch at n_rows rows each (the rows one fact adds at a step), one by one otherwise."""
    per = max(1, batch_size // max(1, n_rows))
    by_length: dict[int, list[int]] = {}
    for i, f in enumerate(facts):
        by_length.setdefault(len(f.prompt_ids) + len(f.object_ids), []).append(i)
    return [idx[a:a + per] for idx in by_length.values() for a in range(0, len(idx), per)]


@torch.no_grad()
def trace_facts(backbone, facts, noises, sites, steps: int, batch_size: int, readout: str = TRACE.readout, bar=None, *,
                share_rows: bool = True, reuse_layers: bool = True, pack: bool = False,
                assemble: bool = False, masked_head: bool = False, screen: bool = True,
                block_tokens: int | None = None, scored: list | None = None) -> tuple[list[dict], dict]:
    """All runs of F facts of one length L, in lock-step. noises: per fact [N, S, H] (sigma applied).

    Rows (besides each fact's clean run, which leads every forward): the F * N corrupted rows (row f * N + s:
    fact f, noise sample s), then for each patch step k a block of F * C * N rows (fact f, site c,
    sample s in that order). They are appended as the wavefront reaches step k, so a row keeps its
    index and its log p column j is its step j. Only the rows `_plan` picks are run, and only while
    their fact has a masked answer position (readout "decided"); the others share a run's results
    (same future) or keep their state. reuse_layers: splicing rows join the batch at their layer
    (the caller checks `rows_can_join`); pack: attn / mlp splices compute their layer at the
    subject tokens only, in packed rows (the caller checks `rows_can_pack`); assemble: mlp splices
    above layer 0 take their subject tokens from the block's own sums instead of packed rows (the
    caller checks `rows_can_assemble`); masked_head: the
    vocabulary head runs at the positions read only (the caller checks `masked_head_applies`); screen:
    the sampler step orders confidences by its float32 screen (`sampler.reveal_masked`, same tokens);
    block_tokens: each block runs on tiles of at most that many tokens (`hooks.row_tiles`; the caller
    checks `rows_can_tile`), None: whole batches. scored: per fact the answer positions log p sums
    (`tie.scored_positions`, bool [G]; None, or None for a fact: all of them).
    Every per-position array spans the L positions; the prompt holds no mask, so "masked" means
    "an answer position not yet committed".

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
        table[f, 1:] = subject_noise(noise, it.subject_pos, L, backbone)
        budget[f] = torch.tensor(reveal_schedule(len(it.object_ids), K), device=device)
    table = table.view(F * (N + 1), L, -1)
    # the positions each fact's log p sums: None (all, the default: the sums are those of every position)
    summed_at = None
    if scored is not None and any(s is not None for s in scored):
        summed_at = answer.clone()
        for f, (it, keep) in enumerate(zip(facts, scored)):
            if keep is not None:
                summed_at[f, len(it.prompt_ids):] = keep.to(device)
    subject_np = subject.cpu().numpy()  # the rows' bookkeeping is in numpy (module docstring)
    # blocks a splice leaves to its corrupted row, in the floor: those below its layer, and its own layer
    # (resid: spliced at its output; attn / mlp: it changes only the subject tokens there, position by position)
    below = np.array([l + 1 for l, _ in sites])
    packed_site = np.array([pack and reuse_layers and m != "resid" for _, m in sites])
    # blocks a splicing row does not compute: a packed attn / mlp splice joins after its layer too
    skip_of = np.array([l + (m == "resid" or bool(p)) for (l, m), p in zip(sites, packed_site)])
    skip_of = skip_of if reuse_layers else np.zeros_like(skip_of)
    is_mlp = np.array([m == "mlp" for _, m in sites])  # per site index
    # packed mlp splices above layer 0 assembled from the block's own sums instead (`_layout`)
    assembled_site = packed_site & is_mlp & np.array([l > 0 for l, _ in sites]) & assemble
    packed_site = packed_site & ~assembled_site
    blocks = [backbone.module(i, "resid") for i in range(n_layers)]
    tile = None if block_tokens is None else max(1, block_tokens // L)  # rows per tile of a block

    x = x_clean.repeat_interleave(N, 0)               # [rows, L]; rows grow with the wavefront
    fact = np.repeat(np.arange(F), N)                 # fact of each row
    sample = np.tile(np.arange(N), F)                 # noise sample of each row
    site = np.full(F * N, -1)                         # site patched by each row (-1: none)
    at = np.full(F * N, -1)                           # step at which it patches (-1: never)
    decided = torch.zeros(F * N, L, device=device)    # per-position log-prob when last masked
    decided_clean = torch.zeros(F, L, device=device)
    lp_clean = torch.zeros(F, K + 1)
    lp = torch.full((F * N + K * F * C * N, K + 1), torch.nan)
    rows, state = Rows(), TraceState()
    exp_buffer = None  # `HeadRead`'s, kept across forwards
    # the patch rows each step adds (fact f, site c, sample s in that order): copies of corrupted row f * N + s
    new = np.repeat(np.arange(F * N).reshape(F, 1, N), C, axis=1).reshape(-1)
    new_t, new_site = _tensor(new, x.device), np.tile(np.repeat(np.arange(C), N), F)
    stats = dict(rows_run=0, forwards=0, block_rows=0, block_batches={}, head_positions=0, min_block_rows=0,
                 min_block_tokens=0, min_block_rows_by_length={str(L): 0}, min_head_positions=0)
    # the joins first: at a block's output rows join before the resid splice there acts on them
    with Hooks(backbone, edit=joiners(blocks if reuse_layers else [], rows), raw=True), \
            Hooks(backbone, edit=_hook_fns(sites, rows, n_layers, bool((packed_site | assembled_site).any())),
                  state=state), \
            (row_tiles(blocks, tile, state) if tile is not None else nullcontext()), \
            denoising_steps(backbone, state) as at_step:
        for j in range(K + 1):
            if j < K:  # patch runs of step j start from the corrupted x_j: the prefix is shared
                x, decided = torch.cat([x, x[new_t]]), torch.cat([decided, decided[new_t]])
                fact, sample = np.concatenate([fact, fact[new]]), np.concatenate([sample, sample[new]])
                site = np.concatenate([site, new_site])
                at = np.concatenate([at, np.full(F * C * N, j)])
            at_step(j)
            # a fact whose answer is all committed, in its clean row and in every row of its own, reads
            # nothing more ("decided"). Its rows reveal the same number of tokens per step, but a row can
            # commit the mask token itself (the argmax does not exclude it, as LLaDA's sampler does not),
            # which leaves that position masked, read and revealed again at the next step
            masked_clean = x_clean == mask_id
            x_np = x.cpu().numpy()  # on the host once a step: the liveness below and the plan read it
            if readout == "decided":
                still = (x_np == mask_id).any(1)                                              # [rows]
                live = masked_clean.any(1).cpu().numpy() | (np.bincount(fact[still], minlength=F) > 0)
            else:
                live = np.ones(F, dtype=bool)
            if not live.any():  # nothing is read and nothing moves (the final step, always): every row keeps
                lp_clean[:, j] = summed(decided_clean, summed_at).cpu()  # the log-probs it decided (`read_out`, no mask)
                lp[:len(x), j] = summed(decided, None if summed_at is None else summed_at[_tensor(fact, device)]).cpu()
                if bar is not None:
                    bar.advance(F)
                continue
            corrupted = fact * N + sample  # each row's corrupted row (its index): what it shares a noise draw with
            run, share = _plan(x_np, corrupted, at, j, share_rows)
            live_run = live[fact[run]]
            distinct = run if share_rows else _plan(x_np, corrupted, at, j, True)[0]
            distinct = distinct[live[fact[distinct]]]
            splices = at[distinct] == j
            need = n_layers * (int(live.sum()) + int((~splices).sum())) + int((n_layers - below[site[distinct[splices]]]).sum())
            stats["min_block_rows"] += need
            stats["min_block_tokens"] += need * L
            stats["min_block_rows_by_length"][str(L)] += need
            # the head at the positions read: every distinct live row and each live fact's clean row
            n_read = (masked_clean if readout == "decided" else answer).sum(1).cpu().numpy()  # [F] (equal in a fact's rows)
            stats["min_head_positions"] += int(n_read[live].sum() + n_read[fact[distinct]].sum())
            now, run_site = at[run] == j, np.maximum(site[run], 0)
            skip = np.where(now, skip_of[run_site], 0)  # 0: from the embedding
            packs = now & packed_site[run_site]
            mixes = now & assembled_site[run_site]
            source = corrupted[run]  # the corrupted rows are run[0..F*N-1], so also their run index
            pos_run = torch.zeros(len(run), L, device=device)  # per-position log p(o_i | x_j)
            pos_clean = torch.zeros(F, L, device=device)
            gen_run, gen_clean = x[_tensor(run, x.device)], x_clean.clone()
            for items in _chunks(skip, fact[run], source, F * N, batch_size, live_run):
                xb, x_all, fr, where, clean_at, items_t, sizes = _layout(
                    rows, items, run, skip, packs, mixes, source, x, x_clean, fact, sample, site, at, j, table,
                    subject_np, is_mlp, N, n_layers, mask_id)
                masked = x_all == mask_id
                # "decided" reads each position while it is masked only; "aligned" every answer position
                read = masked if readout == "decided" else answer[fr]
                picked = logits_at(backbone, xb, read, masked_head=masked_head)  # [M, V]: logits at the read positions
                pos = torch.full(read.shape, torch.nan, device=device)
                exp_buffer = HeadRead.buffer_for(picked, exp_buffer)
                head = HeadRead(picked, exp_buffer)  # max, argmax and exp(l - max) once, for the read-out and the reveal
                pos[read] = head.logits.gather(-1, obj[fr][read][:, None]).squeeze(-1) - head.log_normaliser()
                if readout != "decided":
                    pos = pos.masked_fill(~answer[fr], 0.0)
                pos_run[items_t] = pos[where]
                have = clean_at >= 0
                pos_clean[have] = pos[clean_at[have]]
                if j < K:
                    same = read is masked  # "decided" reads the masked positions only
                    gen = reveal_masked(x_all, picked if same else picked[masked[read]], masked, budget[fr, j],
                                        remasking=REMASKING, head=head if same else None, screen=screen)
                    gen_run[items_t] = gen[where]
                    gen_clean[have] = gen[clean_at[have]]
                stats["rows_run"] += x_all.shape[0]
                stats["forwards"] += 1
                stats["block_rows"] += sum(sizes)
                for size in sizes:  # the batch of each block call (each tile), for benchmarks that rate it
                    for part in ([size] if tile is None else tile_sizes(size, tile)):
                        key = f"{L}x{part}"
                        stats["block_batches"][key] = stats["block_batches"].get(key, 0) + 1
                stats["head_positions"] += picked.shape[0] if masked_head else read.numel()
            score, decided_clean = read_out(pos_clean, masked_clean, decided_clean, readout, summed_at)
            lp_clean[:, j] = score.cpu()
            share_t = _tensor(share, x.device)
            score, decided = read_out(pos_run[share_t], x == mask_id, decided, readout,
                                      None if summed_at is None else summed_at[_tensor(fact, device)])
            lp[:len(x), j] = score.cpu()
            if j < K:
                x = gen_run[share_t]
                x_clean = gen_clean
            if bar is not None:
                bar.advance(F)
    patched = lp[F * N:].view(K, F, C, N, K + 1)
    return [dict(clean=lp_clean[f], corrupted=lp[f * N:(f + 1) * N], patched=patched[:, f], clean_ids=x_clean[f].cpu())
            for f in range(F)], stats


def _plan(x: np.ndarray, sample: np.ndarray, at: np.ndarray, step: int, share: bool = True):
    """Which rows to run at this step: (run [R] row indices, share [rows] index into run).

    A row with no splice ahead is, from here on, a deterministic function of (noise sample, x)
    (temperature 0, the same noise at every forward), so rows with equal (sample, x) have the same
    future: one of them is run and the others take its results. Typically a splice that changes no
    committed token folds its row back into the corrupted run right after the patched forward.
    Rows that splice at this step are always run. Arrays in numpy (`trace_facts`' bookkeeping).
    """
    n = x.shape[0]
    idx = np.arange(n)
    own = np.where((at == step) | (not share), idx, -1)  # a splicing row is its own group
    varies = (x != x[:1]).any(0)  # columns equal in every row (the prompt) tell no row apart
    group, first = _row_groups(np.concatenate([own[:, None], sample[:, None], x[:, varies]], 1))
    run = np.sort(first)
    share = np.searchsorted(run, first[group])
    return run, share


def _row_groups(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group id [n] of each row of key [n, m], equal rows sharing one; the first row [G] of each
    group): a stable lexicographic sort of the rows, so a group's rows are adjacent and its first
    row leads them."""
    n = key.shape[0]
    order = np.lexsort(key.T[::-1])  # stable; column 0 first
    ranked = key[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (ranked[1:] != ranked[:-1]).any(1)
    group = np.empty(n, dtype=np.int64)
    group[order] = np.cumsum(new) - 1
    return group, order[new]


def _chunks(skip: np.ndarray, fact: np.ndarray, source: np.ndarray, n_corrupted: int, batch_size: int,
            live: np.ndarray):
    """The run rows (indices into run) of each forward of one step, those `live` [R] only: all of
    them when they fit in batch_size with the clean rows, else chunks filled in turn, each counting
    the clean rows of its facts and the corrupted rows its joining rows copy (joining rows ordered
    by fact and noise sample, so a chunk's joining rows mostly copy the same few). skip, fact,
    source (the run index of the row's corrupted row, f * N + s): per run row; run rows
    0..n_corrupted-1 are the corrupted rows. Packed rows are not counted (a few per layer)."""
    joins = skip > 0
    key = source * (int(skip.max()) + 1) + skip
    rest, joining = np.flatnonzero(~joins & live), np.flatnonzero(joins & live)
    order = np.concatenate([rest, joining[np.argsort(key[joining], kind="stable")]])
    if len(np.unique(fact[order])) + len(order) <= batch_size:
        yield order
        return
    chunk, cleans, present, needed = [], set(), set(), set()
    for i, sk, f, src in zip(order.tolist(), skip[order].tolist(), fact[order].tolist(), source[order].tolist()):
        size = len(chunk) + 1 + len(cleans | {f}) + len((needed | ({src} if sk > 0 else set()))
                                                         - (present | ({i} if i < n_corrupted else set())))
        if chunk and size > batch_size:
            yield np.array(chunk, dtype=np.int64)
            chunk, cleans, present, needed = [], set(), set(), set()
        chunk.append(i)
        cleans.add(f)
        if sk > 0:
            needed.add(src)
        elif i < n_corrupted:
            present.add(i)
    yield np.array(chunk, dtype=np.int64)


def _layout(rows: Rows, items, run, skip, packs, mixes, source, x, x_clean, fact, sample, site, at, step: int, table,
            subject, is_mlp, n_samples: int, n_layers: int, mask_id: int):
    """The batch of one forward, and rows' hook settings for it. Returns (ids [B0, L] it starts
    from, ids [B, L] of the final batch, fact of each final row, where [len(items)]: each item's row
    in the final batch, clean_at [F]: each fact's clean row in it or -1, the rows each block computes).
    The bookkeeping arguments (items, run, skip, packs, mixes, source, fact, sample, site, at,
    subject, is_mlp) are numpy arrays; x, x_clean and table, and everything returned or set in rows
    but sizes, are tensors on the forward's device.

    Rows from the embedding: the clean rows of the items' facts, the items that skip nothing, then
    any corrupted row a joining item copies that is not among them (then the packed rows of layer 0).
    After block b the batch is regrown (`_regrow`): the packed rows of layer b leave it, the items
    that skip b + 1 blocks join as copies of their corrupted row (run row f * N + s for fact f,
    sample s: the corrupted rows lead their groups, so they are run[0..F*N-1]), and the packed rows
    of layer b + 1 join. A packed item (an attn / mlp splice at layer l, `packs`) joins after block
    l with its subject positions taken from a packed row: a row of L slots holding the subject
    tokens of several such items, which enters block l with their corrupted rows' inputs there, has
    its attention output set to the clean run's (attn; mlp: the corrupted row's) at each slot and
    its MLP output to the clean run's (mlp), and leaves after block l: the rest of a block acts on
    each position alone (`rows_can_pack`), so each slot's output is the item's own. An assembled
    item (an mlp splice at layer l > 0, `mixes`) has no packed row: its slot's output would be its
    corrupted row's input to block l plus that row's attention output, plus the clean run's MLP
    output, so those three are read (`_regrow` after block l - 1, the attn / mlp hooks of block l)
    and summed in the block's own order when the item joins after block l (`rows_can_assemble`).
    """
    device, N = x.device, n_samples
    F, L = x_clean.shape
    t = _Staging(device)  # t(a): the index array a as a tensor of the forward's device (on the CPU at once)

    s_items = skip[items]
    base, joining = items[s_items == 0], items[s_items > 0]
    facts_in = np.unique(fact[run[items]])
    clean_at = np.full(F, -1)
    clean_at[facts_in] = np.arange(len(facts_in))
    where = np.empty(len(run), dtype=np.int64)  # run index -> batch row
    first = len(facts_in)
    where[base] = np.arange(first, first + len(base))
    n_corr = F * N
    present = np.zeros(n_corr, dtype=bool)
    present[base[base < n_corr]] = True
    needed = np.zeros(n_corr, dtype=bool)
    needed[source[joining]] = True  # the corrupted (run) rows the joining rows copy
    extra = np.flatnonzero(needed & ~present)  # corrupted rows here only to be copied
    where[extra] = np.arange(first + len(base), first + len(base) + len(extra))
    start = run[np.concatenate([base, extra])]
    B_real = first + len(start)

    # the packed items of each layer: their (item, subject position) pairs, slot by slot
    slots = {}
    pk = joining[packs[joining]]
    pk_layer = skip[pk] - 1
    for l in np.unique(pk_layer).tolist():
        these = pk[pk_layer == l]
        r, pos = np.nonzero(subject[fact[run[these]]])  # each (item, subject position)
        k = np.arange(len(r))
        slots[l] = (these[r], pos, k // L, k % L, -(-len(r) // L))  # item, position, packed row, slot, rows
    rows.reset()

    def fills(l, top):  # the packed rows of layer l are rows top.. of the batch inside block l
        item, pos, prow, slot, n = slots[l]
        mod = is_mlp[site[run[item]]]
        clean_rows, corr_rows = clean_at[fact[run[item]]], where[source[item]]
        # the sources, clean and corrupted rows, are rows from the embedding (< B_real); the rows written, top..
        rows.fill[(l, "attn")] = ((top, top + n), t(top + prow), t(slot),
                                  t(np.where(mod, corr_rows, clean_rows)), t(pos), B_real, top)
        if mod.any():
            rows.fill[(l, "mlp")] = (None, t(top + prow[mod]), t(slot[mod]), t(clean_rows[mod]), t(pos[mod]), B_real, top)

    size, sizes, joined = B_real, [], []
    if 0 in slots:
        item, pos, prow, slot, n = slots[0]
        rows.fill[(None, "embed")] = (None, t(size + prow), t(slot), t(where[source[item]]), t(pos), B_real, size)
        fills(0, size)
        size += n
    for b in range(n_layers):
        sizes.append(size)  # rows block b computes
        dropped = slots[b][4] if b in slots else 0
        these = joining[skip[joining] == b + 1]
        if dropped:
            rows.drop[b] = dropped
        top = size - dropped
        if len(these):
            rows.join[b] = t(where[source[these]])
            where[these] = np.arange(top, top + len(these))
            joined.append(run[these])
            if b in slots:  # the packed items of layer b take their subject tokens from its packed rows
                item, pos, prow, slot, n = slots[b]
                rows.fix[b] = (t(_index_in(these, item)), t(pos), t(size - n + prow), t(slot))
            mixed = these[mixes[these]]
            if len(mixed):  # the assembled items of layer b: each (item, subject position)
                r, pos = np.nonzero(subject[fact[run[mixed]]])
                item = mixed[r]
                rows.mix[b] = (t(_index_in(these, item)), t(pos), t(where[source[item]]), t(clean_at[fact[run[item]]]))
            top += len(these)
        if b + 1 in slots:
            item, pos, prow, slot, n = slots[b + 1]
            rows.pack[b] = (n, t(prow), t(slot), t(where[source[item]]), t(pos))
            fills(b + 1, top)
            top += n
        size = top

    noise_idx = np.concatenate([facts_in * (N + 1), fact[start] * (N + 1) + sample[start] + 1])
    n0 = slots[0][4] if 0 in slots else 0  # the packed rows of layer 0: any ids (the embedding hook sets them), no noise
    noise_idx = np.concatenate([noise_idx, np.zeros(n0, dtype=noise_idx.dtype)])
    final = np.concatenate([start, *joined])  # the x row of each final row after the clean rows
    fr = np.concatenate([facts_in, fact[final]])  # fact of each final row
    splicing = items[(at[run[items]] == step) & ~packs[items] & ~mixes[items]]
    batch_rows, site_of = where[splicing], site[run[splicing]]
    rows.splice = {}
    for c in np.unique(site_of).tolist():
        spliced = batch_rows[site_of == c]
        row, positions = np.nonzero(subject[fr[spliced]])  # each (row, subject position)
        idx = spliced[row]
        rows.splice[int(c)] = (t(idx), t(clean_at[fr[idx]]), t(positions), first, first)  # the clean rows lead the batch
    out = t.send((t(facts_in), t(start), t(noise_idx), t(final), t(fr), t(where[items]), t(clean_at), t(items)))
    for name in ("fill", "join", "fix", "mix", "pack", "splice"):
        setattr(rows, name, t.send(getattr(rows, name)))
    facts_t, start_t, noise_t, final_t, fr_t, where_t, clean_at_t, items_t = out
    xb = torch.cat([x_clean[facts_t], x[start_t]])
    if n0:
        xb = torch.cat([xb, torch.full((n0, L), mask_id, dtype=xb.dtype, device=device)])
    rows.noise = table[noise_t]
    x_all = torch.cat([x_clean[facts_t], x[final_t]])  # the tokens of every final row
    return xb, x_all, fr_t, where_t, clean_at_t, items_t, sizes


class _Slot:
    """An index array's place in a `_Staging` batch, until it is sent."""
    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


class _Staging:
    """Index arrays for one forward's device. On a CPU, calling it gives the array's own tensor at
    once (`_tensor`). Elsewhere it gives a `_Slot`, and `send(obj)` returns obj (a tensor, slot,
    tuple, list or dict of them, other values kept) with every slot replaced by its tensor: the
    first `send` copies all the arrays staged so far to the device at once, as int64, through one
    pinned buffer and without waiting for the device (torch's pinned-memory allocator keeps the
    buffer until the copy is done); a copy from pageable memory would wait for every kernel queued
    before it. defer=True stages on a CPU too (the tests compare the two ways)."""

    def __init__(self, device: torch.device, defer: bool | None = None):
        self.device = device
        self.defer = device.type != "cpu" if defer is None else defer
        self.arrays: list[np.ndarray] = []
        self.sent: list[torch.Tensor] | None = None

    def __call__(self, a: np.ndarray):
        if not self.defer:
            return _tensor(a, self.device)
        if a.dtype.kind not in "iu" or a.ndim != 1:  # a bool array would index as a mask, and int64 as positions
            raise TypeError(f"trace engine: staged index arrays are flat integers, got {a.dtype} of shape {a.shape}")
        if self.sent is not None:
            raise RuntimeError("trace engine: an index array staged after the batch was sent")
        self.arrays.append(a)
        return _Slot(len(self.arrays) - 1)

    def send(self, obj):
        if not self.defer:
            return obj
        if self.sent is None:
            sizes = [len(a) for a in self.arrays]
            pinned = self.device.type == "cuda"
            buf = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=pinned)
            if sizes:
                np.concatenate(self.arrays, out=buf.numpy())
            dev = buf.to(self.device, non_blocking=pinned)
            self.sent = list(torch.split(dev, sizes))
        return self._put(obj)

    def _put(self, obj):
        if isinstance(obj, _Slot):
            return self.sent[obj.k]
        if isinstance(obj, (tuple, list)):
            return type(obj)(self._put(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self._put(v) for k, v in obj.items()}
        return obj


def _tensor(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A bookkeeping array as a tensor on the forward's device (sharing its memory on a CPU; integer
    arrays keep numpy's integer type, which torch indexes with)."""
    t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device)


def _index_in(these: np.ndarray, item: np.ndarray) -> np.ndarray:
    """The index in `these` (distinct) of each entry of `item` (all of which are in it)."""
    order = these.argsort()
    return order[np.searchsorted(these[order], item)]

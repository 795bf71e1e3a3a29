"""TopQ_q (paper Eq. multifact): keep, per token, only the q fact coefficients of largest magnitude.

For a token with fact coefficients c [F] (c = G U h), TopQ_q zeroes all but the q entries of largest
|c_z|, so at most q facts' deltas move that token; q = 0 is dense (every fact). Sparsifying limits
how many facts fire at once on one token, trading forget strength for utility.

`top_q` and `top_q_combine` take the coefficients c [N, F] already computed: scoring every fact of
every token costs N F H multiply-adds, as much as a whole forward of a small model at F = 10^4.
`TopQIndex` gives the same selection from the coefficient rows A [F, H] (c = x A^T) without the
floating-point product: an exact integer screen, a bound proven below, and floating-point scores for
the few facts the bound cannot rule out.
"""

from __future__ import annotations

from itertools import accumulate

import torch

INT8_MAX = 127
# scoring the screen's candidates (`TopQIndex._score`), costs per multiply-add against the dense product's
# (measured on a 2-core AVX-512 CPU, one thread, H = 128 / 1024 / 4096):
TOKEN_CHUNK = 32      # tokens whose candidates are scored together
PAIR_COST = 24        # a (token, fact) pair's gathered score: 20-33x
UNION_COST = 1.6      # the product of a chunk's tokens and all their candidate facts: 1.3-1.9x (smaller products) ...
CHUNK_COST = 1 << 20  # ... plus about 30 us per chunk, in multiply-adds at the dense product's rate


def largest(c: torch.Tensor, q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx [N, q], vals [N, q]): each row's q entries of largest |c|, and their values."""
    idx = c.abs().topk(q, dim=1).indices
    return idx, c.gather(1, idx)


def top_q(c: torch.Tensor, q: int) -> torch.Tensor:
    """c [N, F] with all but each row's q largest-|c| entries set to 0 (q = 0: c unchanged)."""
    if q == 0:
        return c
    idx, vals = largest(c, q)
    return torch.zeros_like(c).scatter_(1, idx, vals)


def top_q_combine(c: torch.Tensor, q: int, D: torch.Tensor) -> torch.Tensor:
    """TopQ_q(c) D without the dense [N, F] product: sum over each row's q kept facts of c_z d_z -> [N, H].

    Equal to top_q(c, q) @ D.
    """
    if q == 0:
        return c @ D
    return combine_selected(*largest(c, q), D)


def combine_selected(idx: torch.Tensor, vals: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """sum_j vals[n, j] D[idx[n, j]] -> [N, H]: each token's kept facts' deltas, weighted, in one
    `embedding_bag` (no [N, q, H] block of gathered rows: 3x faster than gathering and a batched
    product, measured at H = 128 and 1024)."""
    return torch.nn.functional.embedding_bag(idx, D, per_sample_weights=vals.to(D.dtype), mode="sum")


class TopQIndex:
    """Exact TopQ_q of c = x A^T for tokens x [N, H], coefficient rows A [F, H], built once per A.

    The screen. Facts are sorted by |a_z| and cut into blocks of `block` rows; block j is stored as
    int8, a_z ~ s_j Q_z with s_j = max |entries of the block| / 127, and with it n_j = max_z |a_z| and
    e_j = max_z |a_z - s_j Q_z| (Euclidean norms). A token is quantised the same way, x ~ s_x X. The
    integer products S = X Q^T are exact (int32), and c^_z = s_x s_j S_z approximates c_z with

        |c_z - c^_z| <= |x - s_x X| |a_z| + |s_x X| |a_z - s_j Q_z| <= b_j(x)
                     =  |x - s_x X| n_j + |s_x X| e_j              (Cauchy-Schwarz, twice)

    widened by the floating-point error of the scores themselves ((H + 8) eps |x| (n_j + e_j)), so
    that ||c~_z| - |c^_z|| <= b_j for the computed score c~_z of any fact z in block j.

    The selection. Each block's largest |c^| belongs to one of its facts, whose |c~| >= that - b_j;
    so lambda = the q-th largest over blocks of (max_j |c^| - b_j) is at most the q-th largest |c~|.
    A fact with |c^_z| + b_j < lambda has |c~_z| < lambda: it is not among the q largest and is never
    scored. The others are scored in floating point (b_j is about 1 % of |x| |a_z|: 8-15 candidates
    per token measured at H = 128 with 10^4 facts; 100-400 at H = 1024, where the scores' spread,
    about |x| |a_z| / sqrt(H), is narrower against the bound), and the q largest |c~| among them are
    exactly the q largest of all F (ties at the q-th value aside, where any choice is TopQ). Blocks
    make the screen's reductions [N, F / block], and give small coefficient rows a bound of their own
    size.

    The scoring. Tokens go in chunks of TOKEN_CHUNK. A chunk scores its (token, fact) candidate pairs
    one by one (gathered rows), or all its tokens against the union of their candidate facts in one
    product, whichever costs less by the measured rates above. The union can only add facts that are
    not a token's candidates, whose |c~| < lambda: they never enter its q largest. Tokens alike (the
    masked positions of a denoising sequence) share most candidates, so at H = 1024 the union is a few
    hundred facts against 100-400 pairs per token, and a product beats the gathers 3-6x.

    Costs per call: one int8 [N, H] x [H, F] product (about 5x faster than the float one on AVX512
    CPUs), two reductions over [N, F], and the candidates' scores. When scoring the candidates costs too much
    for the index to pay (keys so alike that the bound cannot separate them, or a large H, where the
    bound is looser), later calls of this index score every fact (`dense` turns True), and a call
    whose candidates would cost more than the dense scores finishes with those: the output is
    exact either way. CPU tensors only (torch._int_mm, or exact float64 products of the integers where
    _int_mm is wrong: torch 2.x gets H = 1 wrong).
    """

    def __init__(self, A: torch.Tensor, block: int = 32, scoring: str = "auto"):
        """scoring: "auto" (each chunk of tokens as costs less, and dense where the candidates cost
        more than scoring every fact), or "pairs" / "union" (every chunk so, never dense: for tests
        and benchmarks)."""
        if scoring not in ("auto", "pairs", "union"):
            raise ValueError(f"scoring must be 'auto', 'pairs' or 'union', got {scoring!r}")
        F, H = A.shape
        self.A, self.block, self.dense = A, int(block), False
        B = self.block
        order = A.norm(dim=1).argsort(descending=True, stable=True)
        self.n_blocks = nb = -(-F // B)
        pad = nb * B - F
        Ab = torch.cat([A.index_select(0, order), A.new_zeros(pad, H)]).double().view(nb, B, H)
        amax = Ab.abs().amax(dim=(1, 2))
        s = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))       # [nb]
        Q = torch.round(Ab / s[:, None, None]).clamp_(-INT8_MAX, INT8_MAX)
        self.err = (Ab - Q * s[:, None, None]).norm(dim=2).amax(1)              # e_j   [nb]
        self.norm = Ab.norm(dim=2).amax(1)                                      # n_j   [nb]
        self.scale = s
        self.Qt = Q.to(torch.int8).view(nb * B, H).T.contiguous()               # [H, nb B]
        self.fact = torch.cat([order, order.new_full((pad,), -1)])              # slot -> fact (-1: pad)
        # the scores' own rounding: a dot product of H terms in A's dtype, and a few more operations
        self.eps = (H + 8) * torch.finfo(A.dtype).eps
        self.candidates = 0  # (token, fact) pairs scored by the last call, every fact where it went dense (for benchmarks)
        self.union_chunks = 0  # chunks of tokens the last call scored by their union of candidates
        self.chunks = 0  # chunks of TOKEN_CHUNK tokens the last call cut its tokens into (0: it scored every fact)
        self.scoring = scoring
        self._S = None
        self.int8 = _int_mm_exact(self.Qt)

    def _products(self, X: torch.Tensor) -> torch.Tensor:
        """X Q^T [N, F] for integer-valued X [N, H], exactly: torch._int_mm (int32), or float64 products
        of the integers (exact below 2^53) where _int_mm is not to be trusted."""
        if not self.int8:
            return X.double() @ self.Qt.double()
        N = len(X)
        if self._S is None or len(self._S) < N:  # kept: a fresh [N, F] block per call is faulted in anew
            self._S = torch.empty(N, self.Qt.shape[1], dtype=torch.int32)
        return torch._int_mm(X.to(torch.int8), self.Qt, out=self._S[:N])

    def select(self, x: torch.Tensor, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(idx [N, q], c [N, q]): each token's q facts of largest |x . a_z| and their scores."""
        N, H = x.shape
        B, nb = self.block, self.n_blocks
        if self.dense or nb < q or not N:
            return self._dense(x, q)
        ax = x.abs().amax(1, keepdim=True)
        sx = torch.where(ax > 0, ax / INT8_MAX, torch.ones_like(ax))          # [N, 1]
        X = torch.round(x / sx).clamp_(-INT8_MAX, INT8_MAX)
        xq = X * sx
        ex = (x - xq).double().norm(dim=1, keepdim=True)
        nq = xq.double().norm(dim=1, keepdim=True)
        nx = x.double().norm(dim=1, keepdim=True)
        S = self._products(X).view(N, nb, B)                                   # exact integers
        M = torch.maximum(S.amax(2), S.amin(2).neg()).double()                 # max_j |S|   [N, nb]
        unit = sx.double() * self.scale                                        # c^ = unit S  [N, nb]
        bound = (ex * self.norm + nq * self.err) * (1 + 1e-9) + self.eps * nx * (self.norm + self.err)
        qth = (M * unit - bound).topk(q, dim=1).values[:, -1:]                 # <= q-th largest |c~|
        need = (qth - bound) / unit                                            # candidate: |S| >= need
        need = need - (1e-9 * need.abs() + 1e-9)
        cand = (M >= need).view(-1).nonzero().squeeze(1)                       # (token, block) pairs
        rows = S.view(N * nb, B).index_select(0, cand)                         # [P, B]
        # |S| >= need  <=>  |S| >= ceil(need), compared in S's own integers (no float copy of the rows)
        thr = need.view(-1).index_select(0, cand).ceil_().clamp_(0, 2**31 - 1).to(rows.dtype)
        hit = (rows.abs() >= thr[:, None]).view(-1).nonzero().squeeze(1)
        pair = cand.index_select(0, hit // B)
        tok = pair // nb
        fact = self.fact.index_select(0, (pair % nb) * B + hit % B)
        real = fact >= 0
        tok, fact = tok[real], fact[real]
        self.candidates = len(tok)
        count = torch.bincount(tok, minlength=N)
        if int(count.min()) < q:
            raise RuntimeError("TopQIndex: a token has fewer than q candidates (the screen's invariant broke)")
        return self._score(x, q, tok, fact, count)

    def _score(self, x, q, tok, fact, count):
        """(idx [N, q], c [N, q]) from the candidate pairs (tok sorted, fact; count [N] per token): each
        chunk of TOKEN_CHUNK tokens scores its pairs one by one, or its tokens against the union of their
        candidate facts in one product (a fact that is not a token's candidate has |c~| < lambda: never
        among its q largest), whichever the measured rates say costs less. The chunks' bookkeeping is a
        few numbers each, in Python (a torch call costs more than its work here)."""
        (N, H), F = x.shape, len(self.A)
        T, nch = TOKEN_CHUNK, -(-N // TOKEN_CHUNK)
        self.chunks = nch
        per_token = (count if N == nch * T else torch.cat([count, count.new_zeros(nch * T - N)])).view(nch, T)
        pairs, widest = per_token.sum(1).tolist(), per_token.amax(1).tolist()
        tokens = [T] * (nch - 1) + [N - T * (nch - 1)]
        cost = [PAIR_COST * H * p for p in pairs]                                 # multiply-adds at the dense rate
        by_union = [False] * nch
        # a chunk's union holds at least its widest token's candidates: where even that many cost more
        # than the pairs, no union is formed
        if self.scoring == "union" or (self.scoring == "auto" and any(
                UNION_COST * H * n * w + CHUNK_COST < c for n, w, c in zip(tokens, widest, cost))):
            keys = torch.unique(tok // T * F + fact)                            # each chunk's facts, chunk by chunk
            size = torch.bincount(keys // F, minlength=nch).tolist()
            union_cost = [UNION_COST * H * n * u + CHUNK_COST for n, u in zip(tokens, size)]
            by_union = [self.scoring == "union" or u < c for u, c in zip(union_cost, cost)]
            cost = [u if b else c for u, c, b in zip(union_cost, cost, by_union)]
        if self.scoring == "auto":
            total = sum(cost)
            if total > 0.6 * N * F * H:  # with the screen's own cost, the index no longer pays:
                self.dense = True         # later calls go dense
            if total > N * F * H:        # scoring the candidates would cost more than starting over
                return self._dense(x, q)
        self.union_chunks = sum(by_union)
        if not self.union_chunks:
            return _top_q_of_pairs(_pair_scores(x, self.A, tok, fact), tok, fact, count, q)
        idx = torch.empty(N, q, dtype=torch.long)
        vals = torch.empty(N, q, dtype=x.dtype)
        end = list(accumulate(size))
        for k in range(nch):
            if by_union[k]:
                facts = keys[end[k] - size[k]:end[k]] % F
                c = x[k * T:(k + 1) * T] @ self.A.index_select(0, facts).T             # [tokens, facts]
                top, vals[k * T:(k + 1) * T] = largest(c, q)
                idx[k * T:(k + 1) * T] = facts[top]
        if self.union_chunks < nch:                                              # the chunks scored pair by pair
            one_by_one = torch.tensor(by_union).logical_not_().repeat_interleave(torch.tensor(tokens))  # [N]
            keep = one_by_one.index_select(0, tok)
            tok, fact = tok[keep], fact[keep]
            local = (one_by_one.cumsum(0) - 1).index_select(0, tok)             # numbered among those tokens
            idx[one_by_one], vals[one_by_one] = _top_q_of_pairs(
                _pair_scores(x, self.A, tok, fact), local, fact, count[one_by_one], q)
        return idx, vals

    def combine(self, x: torch.Tensor, q: int, D: torch.Tensor) -> torch.Tensor:
        """TopQ_q(x A^T) D -> [N, H], equal to top_q_combine(x @ A.T, q, D)."""
        idx, vals = self.select(x, q)
        return combine_selected(idx, vals, D)

    def _dense(self, x, q):
        self.candidates, self.union_chunks, self.chunks = len(x) * len(self.A), 0, 0  # every fact scored, no chunks
        return largest(x @ self.A.T, q)


def _int_mm_exact(Qt: torch.Tensor) -> bool:
    """Whether torch._int_mm gives the exact products with Qt [H, F] (checked on a few random rows
    against int64 arithmetic). torch 2.x returns wrong values when H = 1, for one."""
    H = Qt.shape[0]
    if H < 2 or 127 * 127 * H >= 2**31 or not hasattr(torch, "_int_mm"):
        return False
    probe = torch.randint(-INT8_MAX, INT8_MAX + 1, (8, H), generator=torch.Generator().manual_seed(0),
                          dtype=torch.int8)
    try:
        got = torch._int_mm(probe, Qt)
    except RuntimeError:
        return False
    return torch.equal(got.long(), probe.long() @ Qt.long())


def _top_q_of_pairs(c: torch.Tensor, tok: torch.Tensor, fact: torch.Tensor, count: torch.Tensor,
                    q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx [n, q], c [n, q]): per token the q pairs of largest |c| among its own, for pairs p with
    token tok[p] in 0..n-1 (sorted), fact fact[p] and score c[p]; count [n]: each token's pairs (>= q)."""
    start = count.cumsum(0) - count
    pos = torch.arange(len(tok)) - start.index_select(0, tok)
    table = torch.full((len(count), int(count.max())), -1.0, dtype=c.dtype)
    table[tok, pos] = c.abs()
    at = start[:, None] + table.topk(q, dim=1).indices                          # [n, q] into the pairs
    return fact[at], c[at]


def _pair_scores(x: torch.Tensor, A: torch.Tensor, tok: torch.Tensor, fact: torch.Tensor,
                 max_elems: int = 1 << 17) -> torch.Tensor:
    """x[tok_p] . A[fact_p] for each pair p, in chunks of max_elems gathered entries (small blocks
    stay in the allocator's heap; P x H fresh memory at once would be faulted in page by page)."""
    H = x.shape[1]
    out = torch.empty(len(tok), dtype=x.dtype)
    step = max(1, max_elems // H)
    for s in range(0, len(tok), step):
        out[s:s + step] = torch.linalg.vecdot(x.index_select(0, tok[s:s + step]), A.index_select(0, fact[s:s + step]))
    return out

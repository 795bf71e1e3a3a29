"""The ridge solve of the edit memory (paper Eq. gram), in a key metric, with streaming block updates.

Facts z = 1..F have subject keys u_z (rows of U [F, H]) and target deltas d_z (rows of D [F, H]).
The memory maps a live residual h to the ridge-regression prediction of its delta:

    coefficients c(h) = G K (h - mu),   G = (K (U - mu)^T + lambda I)^-1,   K = (U - mu) C^-1

The paper's metric is mu = 0, C = I (K = U, c = G U h); the "whitened" metric measures keys against
the background mean mu and covariance C (whitening.py). Everything is float64 on CPU.

Two forms of one solution. The facts form solves the F x F system; the hidden form solves an H x H
one. Write P = C^-1 = L L^T (Cholesky) and Y = (U - mu) L, the keys in whitened coordinates, so that
K (U - mu)^T = Y Y^T. The push-through identity (Y Y^T + lambda I)^-1 Y = Y (Y^T Y + lambda I)^-1
turns every quantity of the facts form into one of the hidden form:

    A = G K = Y N^-1 L^T            N = Y^T Y + lambda I   [H, H]     coefficients c = (h - mu) A^T
    W = A^T D = L N^-1 Y^T D = L V  V = N^-1 Y^T D         [H, H]     the dense map  (h - mu) W
    G = (I - Y N^-1 Y^T) / lambda                                     (lambda > 0)

What is kept is whichever is smaller:
    facts form   (F <= H, or lambda = 0)   G [F, F], A [F, H], K [F, H], W [H, H]
    hidden form  (F > H and lambda > 0)    N^-1 [H, H], V [H, H], W [H, H]
plus the keys U and deltas D [F, H] in both: O(F^2 + F H) memory, or O(F H + H^2) with no F x F
matrix at all. An insert that takes F past H switches to the hidden form (one H x H solve of all
facts, O(F H^2 + H^3)); a removal that leaves F <= H / 2 switches back (one F x F solve, O(H^3));
the gap between the two thresholds keeps a memory near F = H from switching at every update.
In the hidden form A and G are not kept: `A` is computed on request (O(F H^2), cached until the
memory changes) for the hook's coefficients; `G` is computed on request for inspection only.

Updates, k facts in or r facts out, nothing re-solved:
  facts form: block inversion (Schur complement), O(F^2 k + F k H + k H^2).
  hidden form: Woodbury, the recursive least-squares update. For new whitened keys Y_k and deltas
  D_k, with Z = N^-1 Y_k^T [H, k] and T = (I + Y_k Z)^-1 [k, k],
      N^-1 <- N^-1 - Z T Z^T,   V <- V + Z T (D_k - Y_k V),   W <- W + (L Z) T (D_k - Y_k V),
  O(k H^2 + k^2 H + k^3); a removal is the same with the signs turned, T = (I - Y_r Z)^-1 (which is
  lambda G_rr, positive definite). When a block is so large that the update would cost more than
  solving again (k or r of the order of H), or a downdate is too ill-conditioned to trust, the
  hidden form is solved again from the kept keys instead; both give the same memory to round-off.

Lambda, the one convention: `lam` is relative to the key scale s = mean over facts of the keys'
squared norm in the metric (the Gram matrix's mean diagonal), lambda = lam * s. An absolute
lambda = 1 means nothing against residual norms of ~100 (no regularisation) and a great deal
against whitened keys, so a relative lam carries from model to model. s is measured on the facts
of the first insert, or given as `key_scale`, and fixed from then on (streaming inserts solve one
problem). The paper's absolute lambda is reachable by name: `lam_absolute` (then lambda = it).
"""

from __future__ import annotations

import math
import numbers

import torch

from timerome.common.checks import number
from timerome.engine.settings import EDIT
from timerome.errors import TimeromeError

DEFAULT_LAM = EDIT.lam  # relative: lambda = 8 x the mean squared key norm (README, "Operating point")
FACTS, HIDDEN = "facts", "hidden"


def check_lambda(lam, lam_absolute) -> None:
    for name, v in (("lam", lam), ("lam_absolute", lam_absolute)):
        if v is None and name == "lam_absolute":
            continue
        if isinstance(v, bool) or not (isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0):
            what = "the ridge lambda" + (", relative" if name == "lam" else "")
            raise TimeromeError(f"{name} (--{name.replace('_', '-')}: {what}) must be a finite number >= 0, got {v!r}")


class RidgeMemory:
    """The ridge solution of the facts inserted so far (module docstring), in the smaller form,
    updated in place. `form` says which form is kept; `U`, `D`, `A`, `G`, `W` read the same in both."""

    def __init__(self, hidden_size: int, *, mean: torch.Tensor | None = None, precision: torch.Tensor | None = None,
                 lam: float = DEFAULT_LAM, lam_absolute: float | None = None, key_scale: float | None = None):
        check_lambda(lam, lam_absolute)
        number(key_scale, "key_scale (the keys' mean squared norm)", lo=0, lo_open=True, none=True)
        self.hidden_size = H = int(hidden_size)
        self.mean = mean if mean is not None else torch.zeros(H, dtype=torch.float64)
        self._centred = mean is not None and bool(mean.any())  # else U - mu = U: no copy of the keys
        self.precision = precision  # C^-1; None = identity (the paper's metric)
        self._chol = None           # L with P = L L^T, made when the hidden form first needs it
        self.lam, self.lam_absolute = float(lam), None if lam_absolute is None else float(lam_absolute)
        self.key_scale = None if key_scale is None else float(key_scale)
        self.version = 0
        self.reset()

    @property
    def lam_value(self) -> float | None:
        """The lambda the solve uses (absolute); None until the key scale is known."""
        if self.lam_absolute is not None:
            return self.lam_absolute
        return None if self.key_scale is None else self.lam * self.key_scale

    @property
    def form(self) -> str:
        """"facts" (G of F x F kept) or "hidden" (N^-1 of H x H kept): module docstring."""
        return self._form

    def reset(self) -> None:
        H = self.hidden_size
        self.n, self._cap, self._fcap = 0, 0, 0
        z = torch.zeros(0, H, dtype=torch.float64)
        self._U, self._D = z, z.clone()
        self._drop_facts_form()
        self._Ninv = self._V = None
        self.W = torch.zeros(H, H, dtype=torch.float64)
        self._form = FACTS
        self._A_cache = None
        self.version += 1  # never back to an earlier number: caches keyed by version stay honest

    # the live views: the first n rows of the buffers
    U = property(lambda self: self._U[: self.n])
    D = property(lambda self: self._D[: self.n])

    @property
    def A(self) -> torch.Tensor:
        """The coefficient rows [F, H] (c = (h - mu) A^T); computed and cached in the hidden form."""
        if self._form == FACTS:
            return self._A[: self.n]
        if self._A_cache is None or self._A_cache[0] != self.version:
            M = self._Ninv if self.precision is None else self._L() @ self._Ninv @ self._L().T
            self._A_cache = (self.version, self.centred(self.U) @ M)        # Y N^-1 L^T = Uc (L N^-1 L^T)
        return self._A_cache[1]

    @property
    def G(self) -> torch.Tensor:
        """The ridge inverse [F, F]; in the hidden form built on request: solved afresh for F <= H
        (what save writes, to a backward error of round-off), else (I - Y N^-1 Y^T) / lambda."""
        if self._form == FACTS:
            return self._G[: self.n, : self.n]
        if self.n <= self.hidden_size:
            return self._facts_solve(self.U, self.D, self.lam_value)[0]
        Y = self.whitened(self.U)
        G = (Y @ self._Ninv @ Y.T).neg_()
        G.diagonal().add_(1.0)
        return _sym(G / self.lam_value)

    def balanced(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(T [H, H] or None for the identity, R [F, H]) with c(h) = ((h - mu) T) R^T: the coefficients as
        inner products in coordinates where neither side is stretched, for topq.TopQIndex, whose
        error bound |x| |a| is tight only for vectors of like shapes (raw residuals have a few huge
        directions; the coefficient rows A, through the inverse metric, are huge in the others).

        Hidden form: N^-1 = Lr Lr^T (Cholesky), T = L Lr, R = Y Lr; the rows' Gram matrix is then
        R^T R = Lr^T Y^T Y Lr = I - lambda Lr^T Lr, close to the identity. Facts form: T = L,
        R = G Y (= A L^-T), the key metric's whitening alone (L = I for the paper metric)."""
        if self._form == HIDDEN:
            T = self._to_raw(torch.linalg.cholesky(self._Ninv))
            return T, self.centred(self.U) @ T                             # Y Lr = Uc L Lr
        if self.precision is None:
            return None, self.A
        return self._L(), self.G @ self.whitened(self.U)

    def centred(self, U: torch.Tensor) -> torch.Tensor:
        """U - mu (U itself when mu = 0)."""
        return U - self.mean if self._centred else U

    def metric_keys(self, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, U - mu) for raw keys U [k, H]: the Gram entry of keys i, j is K_i . (U_j - mu)."""
        Uc = self.centred(U)
        return (Uc if self.precision is None else Uc @ self.precision), Uc

    def whitened(self, U: torch.Tensor) -> torch.Tensor:
        """Y = (U - mu) L for raw keys U [k, H]: Y Y^T = K (U - mu)^T, the same Gram matrix."""
        Uc = self.centred(U)
        return Uc if self.precision is None else Uc @ self._L()

    def scale_of(self, U: torch.Tensor) -> float:
        """Mean squared norm of keys U [k, H] in the metric: the Gram matrix's mean diagonal."""
        K, Uc = self.metric_keys(U)
        return float((K * Uc).sum(1).mean())

    def lam_over_keys(self) -> float:
        """lam_value over the stored keys' mean squared norm (`scale_of`): a fact alone keeps about 1 / (1 + this)
        of its update. The relative lambda (`lam`) where the key scale is the stored keys' own."""
        return self.lam_value / self.scale_of(self.U)

    def _scale_of_gram(self, S: torch.Tensor, k: int) -> float:
        """scale_of from S = Uc^T Uc of k keys: mean_i uc_i P uc_i^T = trace(P S) / k."""
        return float((S.trace() if self.precision is None else (S * self.precision).sum()) / k)

    def _gram(self, U, D) -> tuple[torch.Tensor, torch.Tensor]:
        """(Uc^T Uc, Uc^T D) [H, H] each: the only O(F H^2) work of a hidden-form solve."""
        Uc = self.centred(U)
        return Uc.T @ Uc, Uc.T @ D

    # ------------------------------------------------------------------ updates

    def insert(self, U_new: torch.Tensor, D_new: torch.Tensor) -> None:
        """Add k facts (module docstring: which form, which update); everything is computed before any write."""
        n, k, H = self.n, len(U_new), self.hidden_size
        gram = None  # a first insert of more than H facts goes straight to the hidden form: its Gram is needed anyway
        if self.key_scale is not None or self.lam_absolute is not None:
            scale = self.key_scale
        elif n == 0 and k > H:
            gram = self._gram(U_new, D_new)
            scale = self._scale_of_gram(gram[0], k)
        else:
            scale = self.scale_of(U_new)
        lam = self.lam_absolute if self.lam_absolute is not None else self.lam * scale
        if self._form == HIDDEN and _woodbury_pays(k, n + k, H):
            update = self._woodbury(U_new, D_new, lam, sign=1.0)
            self._commit_rows(U_new, D_new)
            update()
        elif self._form == HIDDEN or (n + k > H and lam > 0):
            if n == 0:
                state = self._hidden_from_gram(*(gram or self._gram(U_new, D_new)), lam)
            else:
                state = self._hidden_solve(torch.cat([self.U, U_new]), torch.cat([self.D, D_new]), lam)
            self._set_hidden(*state)                         # first: no facts-form room is made
            self._commit_rows(U_new, D_new)
        else:
            self._facts_insert(U_new, D_new, lam)
        self.key_scale = scale
        self.version += 1

    def _facts_insert(self, U_new, D_new, lam) -> None:
        """Grow G, A, W by k facts with the block inverse (Schur complement S of the new block)."""
        n, k = self.n, len(U_new)
        K_new, Uc_new = self.metric_keys(U_new)
        K, A, D, G = self._K[:n], self._A[:n], self._D[:n], self._G[:n, :n]
        B = K @ Uc_new.T                                     # Gram old x new [n, k]
        C = K_new @ Uc_new.T + lam * torch.eye(k, dtype=torch.float64)
        GB = G @ B                                           # [n, k]
        S = _sym(C - B.T @ GB)                               # Schur complement [k, k]
        S_inv = spd_inverse(S, lam)
        EK = K_new - B.T @ A                                 # E^T K, E = [-G B; I]   [k, H]
        ED = D_new - GB.T @ D                                # E^T D                  [k, H]
        SEK = S_inv @ EK
        W_add = EK.T @ (S_inv @ ED)                          # [H, H]
        # commit: nothing below can fail; in place, so an insert streams over G once
        self._commit_rows(U_new, D_new, facts=True)
        G_all = self._G
        GBS = GB @ S_inv                                     # [n, k]
        G_all[:n, :n].addmm_(GBS, GB.T)
        G_all[:n, n:n + k] = -GBS
        G_all[n:n + k, :n] = -GBS.T
        G_all[n:n + k, n:n + k] = S_inv
        self._A[:n].addmm_(GB, SEK, alpha=-1)
        self._A[n:n + k] = SEK
        self._K[n:n + k] = K_new
        self.W += W_add

    def delete(self, keep: torch.Tensor, drop: torch.Tensor) -> None:
        """Remove the facts at indices `drop` (sorted), keeping `keep` (sorted) in their order.

        Facts form: downdate G_kk - G_kr G_rr^-1 G_rk and the matching A and W, O(F^2 r + F r H),
        applied in place to the whole [n, n] block (the dropped rows and columns become zero),
        then the kept rows and columns are compacted to the front. Only what lies past the first
        dropped index moves, so removing the newest facts copies nothing. Hidden form: the Woodbury
        downdate (module docstring), O(r H^2), or a solve of the kept facts; back to the facts form
        when at most H / 2 facts are left.
        """
        n, m, H = self.n, len(keep), self.hidden_size
        lam = self.lam_value
        if self._form == HIDDEN:
            if m <= H // 2:
                state = self._facts_solve(self.U.index_select(0, keep), self.D.index_select(0, keep), lam)
                self._compact(keep, drop)
                self._set_facts(*state)
            else:
                update = None
                if _woodbury_pays(len(drop), m, H):
                    try:
                        update = self._woodbury(self.U.index_select(0, drop), self.D.index_select(0, drop), lam,
                                                sign=-1.0)
                    except TimeromeError:  # lambda G_rr too close to singular to downdate with: solve again
                        update = None
                state = None if update else self._hidden_solve(self.U.index_select(0, keep),
                                                               self.D.index_select(0, keep), lam)
                self._compact(keep, drop)
                if update:
                    update()
                else:
                    self._Ninv, self._V, self.W = state
            self.version += 1
            return
        G, A, D = self._G[:n, :n], self._A[:n], self._D[:n]
        G_r = G.index_select(0, drop)                        # [r, n]
        R = spd_inverse(_sym(G_r[:, drop]), lam)             # G_rr^-1
        A_r = A.index_select(0, drop)                        # [r, H]
        W_new = self.W - A_r.T @ (R @ (G_r @ D))             # validated before any write
        RG_r = R @ G_r                                       # [r, n]
        A.addmm_(G_r.T, R @ A_r, alpha=-1)
        G.addmm_(G_r.T, RG_r, alpha=-1)
        j0 = int(drop.min())
        moved = keep[j0:]                                    # kept indices past the first hole
        if len(moved):
            self._G[j0:m, :n] = G.index_select(0, moved)
            self._G[:m, j0:m] = self._G[:m, :n].index_select(1, moved)
            for buf in (self._K, self._A):
                buf[j0:m] = buf[:n].index_select(0, moved)
        self._compact(keep, drop)
        self.W = W_new
        self.version += 1

    def solution_error(self, U: torch.Tensor, G: torch.Tensor) -> float:
        """How far G is from solving the ridge problem of keys U: |G M - I| / (|G| |M|) (Frobenius
        norms), M = K Uc^T + lambda I. A computed inverse has a backward error of a few float64
        epsilons whatever M's conditioning (about 1e-16 here); a zeroed, scaled or hand-edited G is
        of order 1 (inf for a G of zeros)."""
        if not len(U):
            return 0.0
        K, Uc = self.metric_keys(U)
        lam = self.lam_absolute if self.lam_absolute is not None else self.lam * (
            self.key_scale if self.key_scale is not None else self.scale_of(U))
        eye = torch.eye(len(U), dtype=torch.float64)
        M = K @ Uc.T + lam * eye
        scale = float(torch.linalg.matrix_norm(G) * torch.linalg.matrix_norm(M))
        return float(torch.linalg.matrix_norm(G @ M - eye)) / scale if scale > 0 else math.inf

    def restore(self, U: torch.Tensor, D: torch.Tensor, G: torch.Tensor | None = None) -> None:
        """Set the state from saved U, D and, in the facts form, their G (A and W recomputed from
        them). Without G, or when the facts exceed the hidden size, the smaller form is solved from
        U and D (a saved memory of F > H facts holds no F x F matrix)."""
        n, H = len(U), self.hidden_size
        lam = self.lam_value
        self.reset()
        if n > H and lam:
            self._set_hidden(*self._hidden_solve(U, D, lam))
            self._commit_rows(U, D)
        else:
            if G is None:
                G, A, W, K = self._facts_solve(U, D, lam)
            else:
                K = self.metric_keys(U)[0]
                A = G @ K
                W = A.T @ D
            self._commit_rows(U, D)
            self._set_facts(G, A, W, K)
        self.version += 1

    def reserve(self, n: int) -> None:
        self._reserve(int(n))

    # ------------------------------------------------------------------ the two forms

    def _L(self) -> torch.Tensor:
        if self._chol is None:
            L, info = torch.linalg.cholesky_ex(self.precision)
            if int(info) != 0:
                raise TimeromeError("the key metric's precision matrix C^-1 is not positive definite: rebuild the "
                                    "background statistics with a larger shrinkage")
            self._chol = L
        return self._chol

    def _hidden_solve(self, U, D, lam) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N^-1, V, W) of facts U, D from scratch: N = Y^T Y + lambda I, 2 F H^2 + O(H^3) flops.

        With Y = (U - mu) L, Y^T Y = L^T (Uc^T Uc) L and Y^T D = L^T (Uc^T D): the two products over
        the facts are taken in raw coordinates, so the whitened metric costs no F H^2 product more."""
        return self._hidden_from_gram(*self._gram(U, D), lam)

    def _hidden_from_gram(self, S, R, lam) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N^-1, V, W) from S = Uc^T Uc and R = Uc^T D: O(H^3)."""
        if self.precision is not None:
            L = self._L()
            S, R = L.T @ S @ L, L.T @ R
        S.diagonal().add_(lam)
        Ninv = spd_inverse(_sym(S), lam)
        V = Ninv @ R
        W = V.clone() if self.precision is None else self._to_raw(V)  # its own storage: updated in place
        return Ninv, V, W

    def _woodbury(self, U_k, D_k, lam, sign: float):
        """The rank-k Woodbury update of N^-1 = (Y^T Y + lambda I)^-1, V = N^-1 Y^T D and W = L V for
        adding (sign +1) or removing (sign -1) the facts U_k, D_k (module docstring). Everything that
        can fail is computed here; the returned function applies the update in place (O(k H^2), no
        H x H allocation) and cannot fail."""
        Y_k = self.whitened(U_k)                             # [k, H]
        Z = self._Ninv @ Y_k.T                               # [H, k]
        M = Y_k @ Z
        M = torch.eye(len(U_k), dtype=torch.float64) + sign * M   # I + Y_k Z, or I - Y_k Z = lambda G_rr
        T = spd_inverse(_sym(M), lam)                        # symmetric: Z T Z^T stays symmetric to round-off
        TE = T @ (D_k - Y_k @ self._V)                       # [k, H]
        ZT, LZ = Z @ T, self._to_raw(Z)

        def apply():
            self._Ninv.addmm_(ZT, Z.T, alpha=-sign)
            self._V.addmm_(Z, TE, alpha=sign)
            self.W.addmm_(LZ, TE, alpha=sign)
        return apply

    def _facts_solve(self, U, D, lam) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(G, A, W, K) of facts U, D from scratch: the F x F system, O(F^2 H + F^3)."""
        K, Uc = self.metric_keys(U)
        M = K @ Uc.T
        M.diagonal().add_(lam)
        G = spd_inverse(_sym(M), lam)
        A = G @ K
        return G, A, A.T @ D, K

    def _to_raw(self, X: torch.Tensor) -> torch.Tensor:
        """L X: from whitened coordinates back to the raw residual's (identity for the paper metric)."""
        return X if self.precision is None else self._L() @ X

    def _set_hidden(self, Ninv, V, W) -> None:
        self._drop_facts_form()
        self._Ninv, self._V, self.W = Ninv, V, W
        self._form = HIDDEN

    def _set_facts(self, G, A, W, K=None) -> None:
        """Enter the facts form with G, A, W (and K) of the n facts now in U, D."""
        n = self.n
        self._form = FACTS
        self._Ninv = self._V = None
        self._reserve_facts(n)
        self._G[:n, :n], self._A[:n] = G, A
        self._K[:n] = K if K is not None else self.metric_keys(self.U)[0]
        self.W = W

    def _drop_facts_form(self) -> None:
        z = torch.zeros(0, self.hidden_size, dtype=torch.float64)
        self._K, self._A, self._G, self._fcap = z, z.clone(), torch.zeros(0, 0, dtype=torch.float64), 0

    # ------------------------------------------------------------------ buffers

    def _commit_rows(self, U_new, D_new, facts: bool = False) -> None:
        """Append rows to U, D (and make room in the facts-form buffers); n grows."""
        n, k = self.n, len(U_new)
        self._reserve(n + k)
        if facts:
            self._reserve_facts(n + k)
        self._U[n:n + k], self._D[n:n + k] = U_new, D_new
        self.n = n + k

    def _compact(self, keep, drop) -> None:
        """Move the kept rows of U, D to the front (only those past the first dropped index)."""
        m, j0 = len(keep), int(drop.min())
        moved = keep[j0:]
        if len(moved):
            for buf in (self._U, self._D):
                buf[j0:m] = buf[:self.n].index_select(0, moved)
        self.n = m

    def _reserve(self, n: int) -> None:
        """Capacity for n facts in U, D (doubling), so streaming inserts write in place; in the facts
        form also G, K, A, which are never given room for more than H facts unless asked to hold more."""
        if n > self._cap:
            cap, m = max(n, 2 * self._cap, 16), self.n
            self._U, self._D = _grown(self._U, m, cap), _grown(self._D, m, cap)
            self._cap = cap
        if self._form == FACTS:
            self._reserve_facts(min(n, max(self.hidden_size, self.n)))

    def _reserve_facts(self, n: int) -> None:
        if n <= self._fcap:
            return
        H, m = self.hidden_size, min(self.n, self._fcap)
        cap = max(n, min(max(2 * self._fcap, 16), max(H, n)))
        self._K, self._A = _grown(self._K, m, cap), _grown(self._A, m, cap)
        G = torch.zeros(cap, cap, dtype=torch.float64)
        G[:m, :m] = self._G[:m, :m]
        self._G, self._fcap = G, cap


def _grown(t: torch.Tensor, m: int, cap: int) -> torch.Tensor:
    """A [cap, H] buffer holding t's first m rows; the rest uninitialised (never read past n)."""
    out = t.new_empty(cap, t.shape[1])
    out[:m] = t[:m]
    return out


def _woodbury_pays(k: int, n: int, H: int) -> bool:
    """Whether a rank-k Woodbury update (about 15 k H^2 + k^3 flops) costs less than solving the
    hidden form of n facts again (about 3 n H^2 + 5 H^3)."""
    return 15 * k * H * H + k ** 3 < 3 * n * H * H + 5 * H ** 3


def _sym(M: torch.Tensor) -> torch.Tensor:
    return (M + M.T) / 2


def spd_inverse(S: torch.Tensor, lam: float | None) -> torch.Tensor:
    """Inverse of a symmetric positive-definite block; a clear error when it is (near) singular."""
    if S.numel() == 0:
        return S.clone()
    L, info = torch.linalg.cholesky_ex(S)
    piv = L.diagonal() ** 2 if int(info) == 0 else None
    scale = float(S.diagonal().abs().max())
    if piv is None or float(piv.min()) <= 1e-12 * max(scale, 1e-300):
        hint = ("with lambda 0 the keys must be linearly independent (duplicate facts, or more facts "
                "than hidden dimensions, make U U^T singular): use lam > 0" if not lam else
                f"lambda {lam:.4g} is too small for these keys' scale ({scale:.3g}): increase lam")
        raise TimeromeError(f"the ridge system is singular: {hint}")
    return _sym(torch.cholesky_inverse(L))

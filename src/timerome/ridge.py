"""The ridge solve of the edit memory (paper Eq. gram), in a key metric, with streaming block updates.

Facts z = 1..F have subject keys u_z (rows of U [F, H]) and target deltas d_z (rows of D [F, H]).
The memory maps a live residual h to the ridge-regression prediction of its delta:

    coefficients c(h) = G K (h - mu),   G = (K (U - mu)^T + lambda I)^-1,   K = (U - mu) C^-1

The paper's metric is mu = 0, C = I (K = U, c = G U h); the "whitened" metric measures keys against
the background mean mu and covariance C (whitening.py). What is kept (float64, CPU):
    G [F, F]   the ridge inverse
    A [F, H]   = G K        coefficients c = h A^T - A mu
    W [H, H]   = A^T D      the dense map  (h - mu) W   (cheaper than c D when H < 2F)
Inserting or removing k facts updates them by block inversion (Schur complement):
O(F^2 k + F k H + k H^2) instead of O(F^2 H + F^3) for a full solve.

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

from timerome.checks import number
from timerome.errors import TimeromeError

DEFAULT_LAM = 8.0  # relative: lambda = 8 x the mean squared key norm (README, "Operating point")


def check_lambda(lam, lam_absolute) -> None:
    for name, v in (("lam", lam), ("lam_absolute", lam_absolute)):
        if v is None and name == "lam_absolute":
            continue
        if isinstance(v, bool) or not (isinstance(v, numbers.Real) and math.isfinite(v) and v >= 0):
            raise TimeromeError(f"{name} (the ridge lambda{', relative' if name == 'lam' else ''}) must be a "
                                f"finite number >= 0, got {v!r}")


class RidgeMemory:
    """G, A, W of the facts inserted so far (module docstring), updated in place."""

    def __init__(self, hidden_size: int, *, mean: torch.Tensor | None = None, precision: torch.Tensor | None = None,
                 lam: float = DEFAULT_LAM, lam_absolute: float | None = None, key_scale: float | None = None):
        check_lambda(lam, lam_absolute)
        number(key_scale, "key_scale (the keys' mean squared norm)", lo=0, lo_open=True, none=True)
        self.hidden_size = H = int(hidden_size)
        self.mean = mean if mean is not None else torch.zeros(H, dtype=torch.float64)
        self.precision = precision  # C^-1; None = identity (the paper's metric)
        self.lam, self.lam_absolute = float(lam), None if lam_absolute is None else float(lam_absolute)
        self.key_scale = None if key_scale is None else float(key_scale)
        self.reset()

    @property
    def lam_value(self) -> float | None:
        """The lambda the solve uses (absolute); None until the key scale is known."""
        if self.lam_absolute is not None:
            return self.lam_absolute
        return None if self.key_scale is None else self.lam * self.key_scale

    def reset(self) -> None:
        H = self.hidden_size
        self.n, self._cap = 0, 0
        z = torch.zeros(0, H, dtype=torch.float64)
        self._U, self._K, self._D, self._A = z, z.clone(), z.clone(), z.clone()
        self._G = torch.zeros(0, 0, dtype=torch.float64)
        self.W = torch.zeros(H, H, dtype=torch.float64)
        self.version = 0

    # the live views: the first n rows of the buffers
    U = property(lambda self: self._U[: self.n])
    D = property(lambda self: self._D[: self.n])
    A = property(lambda self: self._A[: self.n])
    G = property(lambda self: self._G[: self.n, : self.n])

    def metric_keys(self, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, U - mu) for raw keys U [k, H]: the Gram entry of keys i, j is K_i . (U_j - mu)."""
        Uc = U - self.mean
        return (Uc if self.precision is None else Uc @ self.precision), Uc

    def scale_of(self, U: torch.Tensor) -> float:
        """Mean squared norm of keys U [k, H] in the metric: the Gram matrix's mean diagonal."""
        K, Uc = self.metric_keys(U)
        return float((K * Uc).sum(1).mean())

    # ------------------------------------------------------------------ updates

    def insert(self, U_new: torch.Tensor, D_new: torch.Tensor) -> None:
        """Grow G, A, W by k facts with the block inverse; everything is computed before any write."""
        scale = self.key_scale if self.key_scale is not None or self.lam_absolute is not None else self.scale_of(U_new)
        lam = self.lam_absolute if self.lam_absolute is not None else self.lam * scale
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
        self._reserve(n + k)
        G_all = self._G
        GBS = GB @ S_inv                                     # [n, k]
        G_all[:n, :n].addmm_(GBS, GB.T)
        G_all[:n, n:n + k] = -GBS
        G_all[n:n + k, :n] = -GBS.T
        G_all[n:n + k, n:n + k] = S_inv
        self._A[:n].addmm_(GB, SEK, alpha=-1)
        self._A[n:n + k] = SEK
        self.W += W_add
        self._U[n:n + k], self._K[n:n + k], self._D[n:n + k] = U_new, K_new, D_new
        self.n, self.key_scale = n + k, scale
        self.version += 1

    def delete(self, keep: torch.Tensor, drop: torch.Tensor) -> None:
        """Downdate: G_kk - G_kr G_rr^-1 G_rk, and the matching A and W; O(F^2 r + F r H).

        Applied in place to the whole [n, n] block (the dropped rows and columns become zero),
        then the kept rows and columns are compacted to the front. Only what lies past the first
        dropped index moves, so removing the newest facts copies nothing.
        """
        n, m = self.n, len(keep)
        G, A, D = self._G[:n, :n], self._A[:n], self._D[:n]
        G_r = G.index_select(0, drop)                        # [r, n]
        R = spd_inverse(_sym(G_r[:, drop]), self.lam_value)  # G_rr^-1
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
            for buf in (self._U, self._K, self._D, self._A):
                buf[j0:m] = buf[:n].index_select(0, moved)
        self.W = W_new
        self.n = m
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

    def restore(self, U: torch.Tensor, D: torch.Tensor, G: torch.Tensor) -> None:
        """Set the state from saved U, D, G (A and W recomputed from them)."""
        n = len(U)
        K, _ = self.metric_keys(U)
        self._reserve(n)
        self._U[:n], self._K[:n], self._D[:n], self._G[:n, :n] = U, K, D, G
        self._A[:n] = G @ K
        self.W = self._A[:n].T @ D
        self.n = n
        self.version += 1

    def reserve(self, n: int) -> None:
        self._reserve(int(n))

    def _reserve(self, n: int) -> None:
        """Capacity for n facts, doubling, so streaming inserts write in place (no O(F^2) copy each)."""
        if n <= self._cap:
            return
        cap, H, m = max(n, 2 * self._cap, 16), self.hidden_size, self.n
        grow = lambda t: torch.cat([t[:m], t.new_zeros(cap - m, H)])  # noqa: E731
        self._U, self._K, self._D, self._A = map(grow, (self._U, self._K, self._D, self._A))
        G = torch.zeros(cap, cap, dtype=torch.float64)
        G[:m, :m] = self._G[:m, :m]
        self._G, self._cap = G, cap


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

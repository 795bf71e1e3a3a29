"""TopQ_q (paper Eq. multifact): keep, per token, only the q fact coefficients of largest magnitude.

For a token with fact coefficients c [F] (c = G U h), TopQ_q zeroes all but the q entries of largest
|c_z|, so at most q facts' deltas move that token; q = 0 is dense (every fact). Sparsifying limits
how many facts fire at once on one token, trading forget strength for utility.
"""

from __future__ import annotations

import torch


def top_q(c: torch.Tensor, q: int) -> torch.Tensor:
    """c [N, F] with all but each row's q largest-|c| entries set to 0 (q = 0: c unchanged)."""
    if q == 0:
        return c
    idx = c.abs().topk(q, dim=1).indices
    return torch.zeros_like(c).scatter_(1, idx, c.gather(1, idx))


def top_q_combine(c: torch.Tensor, q: int, D: torch.Tensor, max_elems: int = 1 << 24) -> torch.Tensor:
    """TopQ_q(c) D without the dense [N, F] product: sum over each row's q kept facts of c_z d_z -> [N, H].

    Equal to top_q(c, q) @ D. Chunked over tokens so the gathered [chunk, q, H] block stays under
    max_elems elements.
    """
    if q == 0:
        return c @ D
    idx = c.abs().topk(q, dim=1).indices                       # [N, q]
    vals = c.gather(1, idx)
    N, H = len(c), D.shape[1]
    step = max(1, max_elems // (q * H))
    out = torch.empty(N, H, dtype=D.dtype, device=D.device)
    for s in range(0, N, step):
        v, i = vals[s:s + step], idx[s:s + step]
        rows = D.index_select(0, i.reshape(-1)).view(len(i), q, -1)  # [n, q, H]
        out[s:s + step] = torch.bmm(v[:, None, :], rows).squeeze(1)  # [n, 1, q] @ [n, q, H]
    return out

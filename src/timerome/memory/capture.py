"""Subject keys and target deltas of facts (paper Eqs. u, v_o, v_t, d; Algorithm 1, stage 3).

For each fact z = (subject s, prompt r, object o) and a target text t ("I don't know."), three
residuals at the coordinate (layer, point), read on clean inputs (no masks):

    u_z   = mean over subject tokens of h on [prompt | object]     (subject key)
    v_o^z = mean over object tokens  of h on [prompt | object]     (original value)
    v_t^z = mean over target tokens  of h on [prompt | target]     (target value)
    d_z   = v_t^z - v_o^z                                          (target delta)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from timerome.common.progress import progress_bar
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import (DEFAULT_TARGET, encode_fact, fact_list, pad_sequences, uses_leading_space,
                                      warn_unknown_subjects)
from timerome.engine.hooks import run_to
from timerome.errors import TimeromeError


@dataclass
class Captured:
    """Captured vectors, float64 CPU, one row per fact."""

    keys: torch.Tensor      # u   [F, H]
    v_orig: torch.Tensor    # v_o [F, H]
    v_target: torch.Tensor  # v_t [F, H]

    @property
    def deltas(self) -> torch.Tensor:  # d = v_t - v_o  [F, H]
        return self.v_target - self.v_orig


def capture_facts(backbone, facts, coordinate, *, target: str | None = DEFAULT_TARGET,
                  batch_size: int = 32) -> Captured:
    """u, v_o, v_t of every fact at `coordinate`, in batched forwards (2 sequences per fact).

    A fact's own `target` wins over the `target` argument. Sequences are sorted by length and
    right-padded, so a batch costs little more than its longest member; the forward stops at the
    coordinate's layer.
    """
    facts = fact_list(facts)
    coord = Coordinate.of(coordinate).on(backbone)
    if batch_size < 1:
        raise TimeromeError(f"batch_size must be >= 1, got {batch_size}")
    warn_unknown_subjects(backbone, facts)  # every memory and method that reads facts' keys reads them here
    seqs, pools = [], []  # pools[j]: two position lists whose means are taken on sequence j
    bpe = uses_leading_space(backbone)
    for i, f in enumerate(facts):
        it = encode_fact(backbone, f, i, target=target, bpe=bpe)
        if it.target_ids is None:
            raise TimeromeError("no target text: give target= or set each fact's target")
        prompt, subj = it.prompt_ids.tolist(), it.subject_pos.tolist()
        obj, tgt, P = it.object_ids.tolist(), it.target_ids.tolist(), len(it.prompt_ids)
        seqs += [prompt + obj, prompt + tgt]
        pools += [(subj, list(range(P, P + len(obj)))), (subj, list(range(P, P + len(tgt))))]
    pooled = _pooled_residuals(backbone, coord.site, seqs, pools, batch_size)  # [2F, 2, H]
    out = Captured(keys=pooled[0::2, 0], v_orig=pooled[0::2, 1], v_target=pooled[1::2, 1])
    bad = [f"fact {i}" for i in range(len(facts))
           if not all(torch.isfinite(t[i]).all() for t in (out.keys, out.v_orig, out.v_target))]
    if bad:
        raise TimeromeError(f"captured residuals are NaN/inf for {', '.join(bad[:5])}"
                            f"{' and more' if len(bad) > 5 else ''}: the model overflows at layer "
                            f"{coord.layer} {coord.point} (try float32)")
    return out


def _pooled_residuals(backbone, site, seqs, pools, batch_size) -> torch.Tensor:
    """For each sequence j and pool p: mean of h[j, pools[j][p]] -> float64 CPU [N, n_pools, H]."""
    order = sorted(range(len(seqs)), key=lambda j: -len(seqs[j]))
    out = torch.empty(len(seqs), len(pools[0]), backbone.hidden_size, dtype=torch.float64)
    starts = range(0, len(order), batch_size)
    # a bar only where there is something to wait for: many facts (one forward per batch)
    with torch.no_grad(), progress_bar("capturing facts", total=len(starts), enabled=len(starts) > 4) as bar:
        for start in starts:
            idx = order[start:start + batch_size]
            ids, real = pad_sequences([seqs[j] for j in idx], backbone)
            h = run_to(backbone, site, ids, real).float()  # [B, L, H]
            w = torch.zeros(len(idx), len(pools[0]), ids.shape[1])  # pooling weights [B, n_pools, L]
            for b, j in enumerate(idx):
                for p, pos in enumerate(pools[j]):
                    w[b, p, pos] = 1.0 / len(pos)
            out[idx] = torch.bmm(w.to(h.device), h).double().cpu()
            bar.advance()
    return out

"""Inference-time fact editing: the single-fact gated edit and the multi-fact low-rank memory.

Paper: "Single-fact gated edit", "Multi-fact low-rank edit memory", Algorithm 1 stage 3.

For each fact z = (subject s, prompt r, object o) and a target text t ("I don't know."), three
residuals are captured at the coordinate (layer, point) on clean inputs (no masks):
    u_z   = mean over subject tokens of h on [prompt | object]     (subject key)
    v_o^z = mean over object tokens  of h on [prompt | object]     (original value)
    v_t^z = mean over target tokens  of h on [prompt | target]     (target value)
    d_z   = v_t^z - v_o^z                                          (target delta)

Single fact (Eq. single):  h += alpha * clip(<u, h> / (|u|^2 + eps), 0, g_max) * d.
Many facts (Eq. multifact): h += alpha * TopQ_q(D^T G U h), G = (U U^T + lambda I)^-1,
added to every token at every denoising step (or only at step k*). This is kernel ridge
regression of the delta on the key: D^T G U = argmin_M sum_z |M u_z - d_z|^2 + lambda |M|_F^2.

Key metrics. "paper" is the equation above. "whitened" measures keys in the background
metric (see whitening.py): coefficients G' K (h - mu), K = (U - mu) C^-1,
G' = (K (U - mu)^T + lambda I)^-1. Both are the same ridge problem, the paper's with mu = 0, C = I.

What is kept (float64, CPU), with K the keys in the metric's raw-space form (K = U for "paper"):
    G [F, F]   the ridge inverse
    A [F, H]   = G K        : coefficients c = h A^T - A mu
    W [H, H]   = A^T D      : dense update  alpha (h - mu) W   (cheaper than c D when H < 2F)
All three are updated by block inversion (Schur complement) when facts are added or removed:
O(F^2 k + F k H + k H^2) for k facts instead of O(F^2 H + F^3) for a full solve.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from timerome.errors import TimeromeError
from timerome.hooks import Intervention, TraceState
from timerome.whitening import (DEFAULT_SHRINKAGE, ResidualStats, _forward_to, _pad, background_texts,
                                residual_stats)

DEFAULT_TARGET = "I don't know."
KEY_METRICS = ("paper", "whitened")
DEFAULT_KEY_METRIC = "whitened"  # the selectivity benchmark's winner on the embedded model
DEFAULT_ALPHA = 6.0  # with lam = H, embedded model: forget01 LP -7.4 nats, retain -0.2 (bench + report)
POINTS = ("resid", "attn", "mlp")
FORMAT = "timerome-edit-memory/1"


# ------------------------------------------------------------------------------ coordinate


@dataclass(frozen=True)
class Coordinate:
    """Where the edit acts: block `layer`, hook `point`; `step` k* or None (every denoising step)."""

    layer: int
    point: str = "resid"
    step: int | None = None

    def __post_init__(self):
        if self.point not in POINTS:
            raise TimeromeError(f"unknown hook point {self.point!r}; the edit acts at one of {', '.join(POINTS)}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, numbers.Integral):
            raise TimeromeError(f"layer must be an int, got {self.layer!r}")
        if self.step is not None and (not isinstance(self.step, numbers.Integral) or self.step < -1):
            raise TimeromeError(f"step must be None, -1 (every step) or a step index >= 0, got {self.step!r}")
        object.__setattr__(self, "layer", int(self.layer))  # numpy ints too, and JSON-safe
        object.__setattr__(self, "step", None if self.step in (None, -1) else int(self.step))

    @classmethod
    def of(cls, value, step: int | None = None) -> "Coordinate":
        """A Coordinate from a Coordinate, (layer, point) or (layer, point, step); `step` overrides."""
        if isinstance(value, Coordinate):
            c = value
        elif hasattr(value, "layer") and hasattr(value, "module"):
            # a tracing selection: its step is where the fact is readable, not where the edit must
            # act; the paper always edits at every step (k* = -1), so only layer and module are kept
            c = cls(int(value.layer), str(value.module))
        elif isinstance(value, (tuple, list)) and len(value) in (2, 3):
            c = cls(*value)
        else:
            raise TimeromeError(f"a coordinate is (layer, point) or (layer, point, step), got {value!r}")
        return c if step is None else dataclasses.replace(c, step=step)

    def on(self, backbone) -> "Coordinate":
        """Checked against the backbone, negative layers counted from the top."""
        if not -backbone.n_layers <= self.layer < backbone.n_layers:
            raise TimeromeError(f"layer {self.layer} out of range: the model has {backbone.n_layers} layers")
        return dataclasses.replace(self, layer=self.layer % backbone.n_layers)

    @property
    def site(self) -> tuple[int, str]:
        return self.layer, self.point


def default_coordinate(backbone) -> Coordinate:
    """The residual stream of the (lower) middle block, every step, when no trace picked one.

    On the embedded model tracing finds the resid TIE band at layers 0-1 and the paper installs
    at the band's upper end: (n_layers - 1) // 2 = 1 there, also the most selective layer.
    """
    return Coordinate((backbone.n_layers - 1) // 2, "resid")


# ------------------------------------------------------------------------------ capture


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
    facts = _fact_list(facts)
    coord = Coordinate.of(coordinate).on(backbone)
    if batch_size < 1:
        raise TimeromeError(f"batch_size must be >= 1, got {batch_size}")
    seqs, pools = [], []  # pools[j]: two position lists whose means are taken on sequence j
    bpe = _is_bpe(backbone)
    for i, f in enumerate(facts):
        prompt, subj = _prompt_ids(backbone, f, i)
        obj = _answer_ids(backbone, f.object, f"the object of {_name(f, i)}", bpe)
        tgt = _answer_ids(backbone, _target_of(f, target), f"the target of {_name(f, i)}", bpe)
        for ans in (obj, tgt):
            if len(prompt) + len(ans) > backbone.max_length:
                raise TimeromeError(f"{_name(f, i)}: prompt + answer is {len(prompt) + len(ans)} tokens, "
                                    f"over the model's context of {backbone.max_length}")
        P = len(prompt)
        seqs += [prompt + obj, prompt + tgt]
        pools += [(subj, list(range(P, P + len(obj)))), (subj, list(range(P, P + len(tgt))))]
    pooled = _pooled_residuals(backbone, coord.site, seqs, pools, batch_size)  # [2F, 2, H]
    out = Captured(keys=pooled[0::2, 0], v_orig=pooled[0::2, 1], v_target=pooled[1::2, 1])
    bad = [_name(f, i) for i, f in enumerate(facts)
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
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, real = _pad([seqs[j] for j in idx], backbone)
            h = _forward_to(backbone, site, ids, real).float()  # [B, L, H]
            w = torch.zeros(len(idx), len(pools[0]), ids.shape[1])  # pooling weights [B, n_pools, L]
            for b, j in enumerate(idx):
                for p, pos in enumerate(pools[j]):
                    w[b, p, pos] = 1.0 / len(pos)
            out[idx] = torch.bmm(w.to(h.device), h).double().cpu()
    return out


def _prompt_ids(backbone, fact, i) -> tuple[list[int], list[int]]:
    """Prompt token ids and the positions of the subject's tokens, found by character offsets."""
    prompt, subject = fact.prompt, fact.subject
    if not subject or not subject.strip():
        raise TimeromeError(f"{_name(fact, i)} has an empty subject")
    start = prompt.find(subject)
    if start < 0 and len(prompt.lower()) == len(prompt):
        start = prompt.lower().find(subject.lower())
    if start < 0:
        raise TimeromeError(f"{_name(fact, i)}: subject {subject!r} does not occur in its prompt {prompt!r}")
    end = start + len(subject)
    try:
        enc = backbone.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        pos = [j for j, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    except NotImplementedError:  # slow (Python) tokenizers have no offsets: match the token ids
        ids, pos = backbone.encode(prompt), _token_span(backbone, prompt, start, end)
    if not pos:
        raise TimeromeError(f"{_name(fact, i)}: no prompt token covers the subject {subject!r}")
    return ids, pos


def _token_span(backbone, prompt, start, end) -> list[int]:
    ids = backbone.encode(prompt)
    n_before, n_upto = len(backbone.encode(prompt[:start])), len(backbone.encode(prompt[:end]))
    return list(range(n_before, min(n_upto, len(ids))))


def _answer_ids(backbone, text, what, bpe: bool | None = None) -> list[int]:
    """Answer-side ids with train.encode_pairs' convention: BPE tokenizers get the leading space."""
    if not isinstance(text, str) or not text.strip():
        raise TimeromeError(f"{what} is empty")
    bpe = _is_bpe(backbone) if bpe is None else bpe
    ids = backbone.encode(" " + text.strip()) if bpe else backbone.encode(text)
    unk = getattr(backbone.tokenizer, "unk_token_id", None)
    if not ids or (unk is not None and unk in ids):
        raise TimeromeError(f"{what} ({text!r}) has words the model's vocabulary cannot encode")
    return ids


def _is_bpe(backbone) -> bool:
    # byte-level BPE vocabularies mark a leading space with "Ġ"; word-level ones split on spaces
    tok = backbone.tokenizer
    return bool(getattr(tok, "is_fast", False)) and "Ġ" in "".join(list(tok.get_vocab())[:2000])


def _target_of(fact, target) -> str:
    own = getattr(fact, "target", None)
    if own:
        return own
    if not target:
        raise TimeromeError("no target text: give target= or set each fact's target")
    return target


def _fact_list(facts) -> list:
    facts = list(facts) if facts is not None else []
    if not facts:
        raise TimeromeError("the fact list is empty: give at least one fact")
    for i, f in enumerate(facts):
        if not all(isinstance(getattr(f, k, None), str) for k in ("subject", "prompt", "object")):
            raise TimeromeError(f"fact {i} is not a Fact (needs string subject, prompt and object): {f!r}")
    return facts


def fact_id(fact) -> str:
    """The fact's own id, else a stable hash of (subject, prompt, object); a str is an id."""
    if isinstance(fact, str):
        return fact
    fid = getattr(fact, "fact_id", None)
    if fid:
        return str(fid)
    key = "\x1f".join((fact.subject, fact.prompt, fact.object))
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def _name(fact, i) -> str:
    return f"fact {i} ({fact_id(fact)})"


# ------------------------------------------------------------------------------ single-fact gate


def gated_delta(h: torch.Tensor, u: torch.Tensor, d: torch.Tensor, *, alpha: float = 1.0,
                g_max: float = 1.0, eps: float = 1e-6) -> torch.Tensor:
    """Eq. single: alpha * clip(<u, h> / (|u|^2 + eps), 0, g_max) * d, for h [..., H]; h's dtype."""
    dt = torch.float64 if h.dtype == torch.float64 else torch.float32
    u, d = u.to(h.device, dt), d.to(h.device, dt)
    gate = (h.to(dt) @ u / (u @ u + eps)).clamp(0.0, g_max)  # [...]: 0 unless h leans toward u
    return (alpha * gate[..., None] * d).to(h.dtype)


class GatedEdit:
    """One fact's gated edit at a coordinate, installed with `with edit.applied(backbone): ...`."""

    def __init__(self, u: torch.Tensor, d: torch.Tensor, coordinate, *, alpha: float = 1.0,
                 g_max: float = 1.0, eps: float = 1e-6):
        if u.shape != d.shape or u.dim() != 1:
            raise TimeromeError(f"u and d must be two vectors of the same size, got {tuple(u.shape)}, {tuple(d.shape)}")
        if not (torch.isfinite(u).all() and torch.isfinite(d).all()):
            raise TimeromeError("the key or delta has NaN/inf values")
        if g_max <= 0 or eps <= 0:
            raise TimeromeError(f"g_max and eps must be > 0, got {g_max}, {eps}")
        self.u, self.d = u.double().cpu(), d.double().cpu()
        self.coordinate = Coordinate.of(coordinate)
        self.alpha, self.g_max, self.eps = float(alpha), float(g_max), float(eps)

    @classmethod
    def from_fact(cls, backbone, fact, coordinate=None, *, target: str = DEFAULT_TARGET, **kw) -> "GatedEdit":
        coord = Coordinate.of(coordinate if coordinate is not None else default_coordinate(backbone)).on(backbone)
        cap = capture_facts(backbone, [fact], coord, target=target)
        return cls(cap.keys[0], cap.deltas[0], coord, **kw)

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        return gated_delta(h, self.u, self.d, alpha=self.alpha, g_max=self.g_max, eps=self.eps)

    @contextmanager
    def applied(self, backbone, state: TraceState | None = None):
        coord = self.coordinate.on(backbone)
        if backbone.hidden_size != len(self.u):
            raise TimeromeError(f"the edit has hidden size {len(self.u)}, the model {backbone.hidden_size}")

        def hook(h, st):
            if coord.step is not None and st.step != coord.step:
                return None
            return h + self.delta(h)

        with Intervention(backbone, {coord.site: hook}, state) as iv:
            yield iv.state


# ------------------------------------------------------------------------------ multi-fact memory


class EditMemory:
    """Multi-fact low-rank edit memory (Eq. multifact) at one coordinate of one backbone.

        memory = EditMemory(backbone).add(facts)      # or EditMemory(backbone, (layer, "resid"), alpha=..)
        with memory.applied(backbone) as state:
            out = generate(backbone, prompt, ..., state=state)   # state matters only with step=k*
        memory.save("forget.safetensors"); EditMemory.load("forget.safetensors", backbone)

    alpha, q, g_max and step may be changed at any time (they only act when the hook runs);
    lam, key_metric and the background statistics are fixed at construction.
    lam=None picks the scale of a typical key's squared norm in the metric: H for "whitened"
    (a whitened residual has E|z|^2 = H); 1.0 for "paper", whose scale is the model's own.
    A lam far below the keys' scale makes G amplify the small differences between keys of the
    same subject, and the update then fires on every token (see the selectivity benchmark).
    g_max (default None: exactly Eq. multifact) clips each fact coefficient to [0, g_max], the
    multi-fact analogue of the single-fact gate.
    """

    def __init__(self, backbone, coordinate=None, *, alpha: float = DEFAULT_ALPHA, lam: float | None = None, q: int = 0,
                 key_metric: str = DEFAULT_KEY_METRIC, g_max: float | None = None, step: int | None = None,
                 background=None, target: str = DEFAULT_TARGET, batch_size: int = 32,
                 shrinkage: float = DEFAULT_SHRINKAGE):
        if lam is None:  # the squared norm of a typical key in the metric: whitened residuals have E|z|^2 = H
            lam = float(backbone.hidden_size) if key_metric == "whitened" else 1.0
        if not (isinstance(lam, numbers.Real) and math.isfinite(lam) and lam >= 0):
            raise TimeromeError(f"lam (the ridge lambda) must be a finite number >= 0, got {lam!r}")
        if key_metric not in KEY_METRICS:
            raise TimeromeError(f"unknown key_metric {key_metric!r}; choose one of {', '.join(KEY_METRICS)}")
        coord = Coordinate.of(coordinate if coordinate is not None else default_coordinate(backbone), step)
        self.backbone = backbone
        self.coordinate = coord.on(backbone)
        self.hidden_size = backbone.hidden_size
        self.fingerprint = backbone.fingerprint()
        self.alpha, self.q, self.g_max = alpha, q, g_max
        self.target, self.batch_size = target, batch_size
        self._check_hyper()
        self._lam, self._key_metric = float(lam), key_metric
        self.stats = self._stats(backbone, background, batch_size, shrinkage) if key_metric == "whitened" else None
        H = self.hidden_size
        self._mu = self.stats.mean if self.stats is not None else torch.zeros(H, dtype=torch.float64)
        self._P = self.stats.precision() if self.stats is not None else None  # C^-1; None = identity
        self.reset()

    # ---------------------------------------------------------------- properties

    @property
    def lam(self) -> float:  # fixed: G was solved with it
        return self._lam

    @property
    def key_metric(self) -> str:  # fixed: the keys were measured in it
        return self._key_metric

    @property
    def step(self) -> int | None:
        return self.coordinate.step

    @step.setter
    def step(self, k: int | None):
        self.coordinate = Coordinate.of(self.coordinate, -1 if k is None else k)

    @property
    def facts(self) -> list:
        return list(self._facts)

    @property
    def fact_ids(self) -> list[str]:
        return list(self._ids)

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        c = self.coordinate
        return (f"EditMemory({self._n} facts at layer {c.layer} {c.point}, step={c.step}, "
                f"key_metric={self.key_metric}, alpha={self.alpha}, lam={self.lam}, q={self.q})")

    # ---------------------------------------------------------------- building

    def reset(self) -> "EditMemory":
        """Forget every fact (the background statistics stay)."""
        H = self.hidden_size
        self._n, self._cap, self._facts, self._ids = 0, 0, [], []
        z = torch.zeros(0, H, dtype=torch.float64)
        self._U, self._K, self._D, self._A = z, z.clone(), z.clone(), z.clone()
        self._G = torch.zeros(0, 0, dtype=torch.float64)
        self._W = torch.zeros(H, H, dtype=torch.float64)
        self._version = 0
        self._cache = {}
        return self

    def reserve(self, n: int) -> "EditMemory":
        """Pre-allocate room for n facts (streaming inserts then never reallocate)."""
        self._reserve(int(n))
        return self

    def add(self, facts) -> "EditMemory":
        """Capture the facts (batched) and insert them; on any error the memory is unchanged."""
        facts = _fact_list(facts)
        ids = [fact_id(f) for f in facts]
        self._check_new_ids(ids)
        cap = capture_facts(self.backbone, facts, self.coordinate, target=self.target, batch_size=self.batch_size)
        return self.add_vectors(cap.keys, cap.deltas, facts)

    def add_vectors(self, keys: torch.Tensor, deltas: torch.Tensor, facts) -> "EditMemory":
        """Insert precomputed keys u [k, H] and deltas d [k, H] for `facts` (a Fact or an id each).

        Block inversion: O(F^2 k + F k H + k H^2), no full re-solve.
        """
        facts = list(facts)
        U_new, D_new = _as_rows(keys, "keys", self.hidden_size), _as_rows(deltas, "deltas", self.hidden_size)
        if not (len(U_new) == len(D_new) == len(facts)) or not facts:
            raise TimeromeError(f"need as many keys, deltas and facts, at least one "
                                f"(got {len(U_new)}, {len(D_new)}, {len(facts)})")
        self._check_new_ids([fact_id(f) for f in facts])
        if not (torch.isfinite(U_new).all() and torch.isfinite(D_new).all()):
            raise TimeromeError("keys or deltas contain NaN/inf values")
        self._insert(U_new, D_new)
        self._facts += facts
        self._ids += [fact_id(f) for f in facts]
        return self

    def remove(self, fact_ids) -> "EditMemory":
        """Drop facts by id (downdate in O(F^2 r + F r H)); unknown ids raise, nothing removed."""
        fact_ids = [fact_ids] if isinstance(fact_ids, str) else [str(i) for i in fact_ids]
        have = {fid: j for j, fid in enumerate(self._ids)}
        missing = [i for i in fact_ids if i not in have]
        if missing:
            raise TimeromeError(f"no fact with id {', '.join(map(repr, missing[:5]))} in the memory")
        drop = sorted({have[i] for i in fact_ids})
        if not drop:
            return self
        if len(drop) == self._n:
            return self.reset()
        dropped = set(drop)
        keep = [j for j in range(self._n) if j not in dropped]
        self._delete(torch.tensor(keep), torch.tensor(drop))
        self._facts = [self._facts[j] for j in keep]
        self._ids = [self._ids[j] for j in keep]
        return self

    # ---------------------------------------------------------------- applying

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        """The update alpha * TopQ_q(coefficients) D for h [..., H], in h's dtype (float64 in, float64 math)."""
        self._check_ready()
        if h.shape[-1] != self.hidden_size:
            raise TimeromeError(f"h has hidden size {h.shape[-1]}, the memory {self.hidden_size}")
        return self._update(h, add=False)

    @contextmanager
    def applied(self, backbone, state: TraceState | None = None):
        """Install the edit hook on `backbone` for the `with` block; always removed after it.

        Yields the TraceState; with step=k* pass it to `generate(..., state=state)`.
        """
        self._check_backbone(backbone)
        self._check_ready()
        self._matrices(backbone.device, torch.float32)  # built now: nothing can fail mid-forward
        step = self.coordinate.step

        def hook(h, st):
            if step is not None and st.step != step:
                return None
            return self._update(h, add=True)

        with Intervention(backbone, {self.coordinate.site: hook}, state) as iv:
            yield iv.state

    def _update(self, h: torch.Tensor, add: bool) -> torch.Tensor:
        """alpha * TopQ_q(c) D for h [..., H] (plus h itself when add): float32 math, float64 for float64 h."""
        dt = torch.float64 if h.dtype == torch.float64 else torch.float32
        A, b, D, W, mu = self._matrices(h.device, dt)
        x = h.reshape(-1, self.hidden_size).to(dt)  # [N, H]
        a = float(self.alpha)
        if self.q == 0 and self.g_max is None and 2 * self._n >= self.hidden_size:
            # the dense map D^T G K folded into one [H, H] matrix: one fused kernel per forward
            y = x if mu is None else x - mu
            out = torch.addmm(x, y, W, alpha=a) if add else a * (y @ W)
        else:
            c = x @ A.T if b is None else torch.addmm(b, x, A.T, beta=-1)  # fact coefficients [N, F]
            if self.g_max is not None:
                c = c.clamp(0.0, self.g_max)
            if self.q:
                top = c.abs().topk(self.q, dim=1).indices  # [N, q]
                out = _sparse_combine(c.gather(1, top), top, D, a)
                out = out + x if add else out
            else:
                out = torch.addmm(x, c, D, alpha=a) if add else a * (c @ D)
        return out.to(h.dtype).view_as(h)

    def _matrices(self, device, dtype):
        """(A, A mu, D, W, mu) on device in dtype (the mu terms None for the paper metric); rebuilt
        only after the memory changed."""
        key = (str(device), dtype)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        n = self._n
        A, D = self._A[:n], self._D[:n]
        centred = self.key_metric == "whitened"
        mats = (A, A @ self._mu if centred else None, D, self._W, self._mu if centred else None)
        mats = tuple(None if t is None else t.to(device=device, dtype=dtype) for t in mats)
        self._cache = {k: v for k, v in self._cache.items() if v[0] == self._version}
        self._cache[key] = (self._version, mats)
        return mats

    # ---------------------------------------------------------------- saving

    def save(self, path) -> Path:
        """One safetensors file: U, D, G (+ mu, C) as float64 tensors; JSON metadata in its header."""
        from safetensors.torch import save_file

        n = self._n
        tensors = {"U": self._U[:n], "D": self._D[:n], "G": self._G[:n, :n]}
        if self.stats is not None:
            tensors |= {"mu": self.stats.mean, "cov": self.stats.cov}
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        meta = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "backbone": getattr(self.backbone, "name", ""),
            "hidden_size": self.hidden_size,
            "coordinate": dataclasses.asdict(self.coordinate),
            "hyper": {"alpha": float(self.alpha), "lam": self.lam, "q": int(self.q), "key_metric": self.key_metric,
                      "g_max": None if self.g_max is None else float(self.g_max), "target": self.target,
                      "batch_size": self.batch_size},
            "stats": None if self.stats is None else {"n_tokens": self.stats.n_tokens,
                                                      "shrinkage": self.stats.shrinkage},
            "facts": [_fact_to_dict(f) for f in self._facts],
            "sha256": _digest(tensors),
        }
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(p), metadata={"timerome": json.dumps(meta)})
        return p

    @classmethod
    def load(cls, path, backbone) -> "EditMemory":
        """Read a saved memory for `backbone`; another model's file or a damaged one raises."""
        tensors, meta = _read(path)
        if meta.get("fingerprint") != backbone.fingerprint():
            raise TimeromeError(
                f"{path} was built for another model ({meta.get('backbone') or 'unnamed'}, fingerprint "
                f"{meta.get('fingerprint')}); this model's fingerprint is {backbone.fingerprint()}")
        try:
            mem, facts = cls._from_meta(meta, tensors, backbone)
            U, D, G = tensors["U"], tensors["D"], tensors["G"]
        except (KeyError, TypeError, ValueError) as e:  # a header written by hand, or another version
            raise TimeromeError(f"{path} has incomplete metadata ({type(e).__name__}: {e})") from None
        H = mem.hidden_size
        if not (U.shape == D.shape == (len(facts), H) and G.shape == (len(facts), len(facts))):
            raise TimeromeError(f"{path} is inconsistent: {len(facts)} facts but tensors of shapes "
                                f"{tuple(U.shape)}, {tuple(D.shape)}, {tuple(G.shape)}")
        if facts:
            mem._restore(U, D, G)
            mem._facts, mem._ids = facts, [fact_id(f) for f in facts]
        return mem

    @classmethod
    def _from_meta(cls, meta: dict, tensors: dict, backbone) -> tuple["EditMemory", list]:
        """An empty memory with the saved coordinate, hyper-parameters and statistics, and the facts."""
        H, hyper = meta["hidden_size"], meta["hyper"]
        if H != backbone.hidden_size:
            raise TimeromeError(f"the memory has hidden size {H}, the model {backbone.hidden_size}")
        stats = None
        if hyper["key_metric"] == "whitened":
            c = meta["coordinate"]
            stats = ResidualStats(c["layer"], c["point"], tensors["mu"], tensors["cov"],
                                  meta["stats"]["n_tokens"], meta["stats"]["shrinkage"])
        mem = cls(backbone, Coordinate(**meta["coordinate"]), alpha=hyper["alpha"], lam=hyper["lam"],
                  q=hyper["q"], key_metric=hyper["key_metric"], g_max=hyper["g_max"], background=stats,
                  target=hyper["target"], batch_size=hyper["batch_size"])
        return mem, [_fact_from_dict(d) for d in meta["facts"]]

    # ---------------------------------------------------------------- internals: checks

    def _stats(self, backbone, background, batch_size, shrinkage) -> ResidualStats:
        if isinstance(background, ResidualStats):
            if (background.layer, background.point) != self.coordinate.site:
                raise TimeromeError(f"background statistics are for layer {background.layer} {background.point}, "
                                    f"the memory acts at layer {self.coordinate.layer} {self.coordinate.point}")
            if background.mean.shape != (self.hidden_size,):
                raise TimeromeError("background statistics have the wrong hidden size")
            return background
        texts = background_texts(backbone, background)
        return residual_stats(backbone, self.coordinate, texts, batch_size=batch_size, shrinkage=shrinkage)

    def _check_hyper(self):
        if not (isinstance(self.alpha, numbers.Real) and math.isfinite(self.alpha)):
            raise TimeromeError(f"alpha must be a finite number, got {self.alpha!r}")
        if isinstance(self.q, bool) or not isinstance(self.q, numbers.Integral) or self.q < 0:
            raise TimeromeError(f"q must be an int >= 0 (0 = dense), got {self.q!r}")
        if self.g_max is not None and not (isinstance(self.g_max, numbers.Real) and self.g_max > 0):
            raise TimeromeError(f"g_max must be None or > 0, got {self.g_max!r}")

    def _check_ready(self):
        self._check_hyper()
        if self._n == 0:
            raise TimeromeError("the edit memory is empty: add facts before applying it")
        if self.q > self._n:
            raise TimeromeError(f"q={self.q} exceeds the number of facts ({self._n}): TopQ cannot keep "
                                f"more facts than the memory holds")

    def _check_backbone(self, backbone):
        if backbone.hidden_size != self.hidden_size or backbone.fingerprint() != self.fingerprint:
            raise TimeromeError("this edit memory was built for another model "
                                f"(fingerprint {self.fingerprint}, this one {backbone.fingerprint()})")

    def _check_new_ids(self, ids):
        have, new = set(self._ids), set()
        for i in ids:
            if i in have or i in new:
                raise TimeromeError(f"fact id {i!r} is already in the memory (or repeated); remove it first")
            new.add(i)

    # ---------------------------------------------------------------- internals: linear algebra

    def _metric_keys(self, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, U - mu) for raw keys U [k, H]: the Gram entry of keys i, j is K_i . (U_j - mu)."""
        Uc = U - self._mu
        return (Uc if self._P is None else Uc @ self._P), Uc

    def _insert(self, U_new: torch.Tensor, D_new: torch.Tensor):
        """Grow G, A, W by k facts with the block inverse; everything is computed before any write."""
        n, k = self._n, len(U_new)
        K_new, Uc_new = self._metric_keys(U_new)
        K, A, D, G = self._K[:n], self._A[:n], self._D[:n], self._G[:n, :n]
        B = K @ Uc_new.T                                     # Gram old x new [n, k]
        C = K_new @ Uc_new.T + self.lam * torch.eye(k, dtype=torch.float64)
        GB = G @ B                                           # [n, k]
        S = _sym(C - B.T @ GB)                               # Schur complement [k, k]
        S_inv = _spd_inverse(S, self.lam)
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
        self._W += W_add
        self._U[n:n + k], self._K[n:n + k], self._D[n:n + k] = U_new, K_new, D_new
        self._n = n + k
        self._version += 1

    def _delete(self, keep: torch.Tensor, drop: torch.Tensor):
        """Downdate: G_kk - G_kr G_rr^-1 G_rk, and the matching A and W; O(F^2 r + F r H).

        Applied in place to the whole [n, n] block (the dropped rows and columns become zero),
        then the kept rows and columns are compacted to the front. Only what lies past the first
        dropped index moves, so removing the newest facts copies nothing.
        """
        n, m = self._n, len(keep)
        G, A, D = self._G[:n, :n], self._A[:n], self._D[:n]
        G_r = G.index_select(0, drop)                        # [r, n]
        R = _spd_inverse(_sym(G_r[:, drop]), self.lam)      # G_rr^-1
        A_r = A.index_select(0, drop)                        # [r, H]
        W_new = self._W - A_r.T @ (R @ (G_r @ D))            # validated before any write
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
        self._W = W_new
        self._n = m
        self._version += 1

    def _restore(self, U, D, G):
        """Set the state from saved U, D, G (A and W recomputed from them)."""
        n = len(U)
        K, _ = self._metric_keys(U)
        self._reserve(n)
        self._U[:n], self._K[:n], self._D[:n], self._G[:n, :n] = U, K, D, G
        self._A[:n] = G @ K
        self._W = self._A[:n].T @ D
        self._n = n
        self._version += 1

    def _reserve(self, n: int):
        """Capacity for n facts, doubling, so streaming inserts write in place (no O(F^2) copy each)."""
        if n <= self._cap:
            return
        cap, H, m = max(n, 2 * self._cap, 16), self.hidden_size, self._n
        grow = lambda t: torch.cat([t[:m], t.new_zeros(cap - m, H)])  # noqa: E731
        self._U, self._K, self._D, self._A = map(grow, (self._U, self._K, self._D, self._A))
        G = torch.zeros(cap, cap, dtype=torch.float64)
        G[:m, :m] = self._G[:m, :m]
        self._G, self._cap = G, cap


# ------------------------------------------------------------------------------ helpers


def _as_rows(x, what: str, H: int) -> torch.Tensor:
    t = torch.as_tensor(x).detach().to("cpu", torch.float64)
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2 or t.shape[1] != H:
        raise TimeromeError(f"{what} must be [facts, {H}], got shape {tuple(t.shape)}")
    return t


def _sparse_combine(vals: torch.Tensor, idx: torch.Tensor, D: torch.Tensor, alpha: float,
                    max_elems: int = 1 << 24) -> torch.Tensor:
    """alpha * sum_j vals[n, j] D[idx[n, j]] -> [N, H]: q rows per token instead of all F.

    Chunked over tokens so the gathered [chunk, q, H] block stays under max_elems elements.
    """
    N, q = vals.shape
    step = max(1, max_elems // (q * D.shape[1]))
    out = torch.empty(N, D.shape[1], dtype=D.dtype, device=D.device)
    for s in range(0, N, step):
        v, i = vals[s:s + step], idx[s:s + step]
        rows = D.index_select(0, i.reshape(-1)).view(len(i), q, -1)  # [n, q, H]
        out[s:s + step] = torch.bmm((alpha * v)[:, None, :], rows).squeeze(1)  # [n, 1, q] @ [n, q, H]
    return out


def _sym(M: torch.Tensor) -> torch.Tensor:
    return (M + M.T) / 2


def _spd_inverse(S: torch.Tensor, lam: float) -> torch.Tensor:
    """Inverse of a symmetric positive-definite block; a clear error when it is (near) singular."""
    if S.numel() == 0:
        return S.clone()
    L, info = torch.linalg.cholesky_ex(S)
    piv = L.diagonal() ** 2 if int(info) == 0 else None
    scale = float(S.diagonal().abs().max())
    if piv is None or float(piv.min()) <= 1e-12 * max(scale, 1e-300):
        hint = ("with lam=0 the keys must be linearly independent (duplicate facts, or more facts "
                "than hidden dimensions, make U U^T singular): use lam > 0" if lam == 0 else
                f"lam={lam} is too small for these keys' scale ({scale:.3g}): increase it")
        raise TimeromeError(f"the ridge system is singular: {hint}")
    return _sym(torch.cholesky_inverse(L))


def _fact_to_dict(f) -> dict:
    if isinstance(f, str):
        return {"fact_id": f}
    d = dataclasses.asdict(f) if dataclasses.is_dataclass(f) else dict(vars(f))
    d["fact_id"] = fact_id(f)
    return d


def _fact_from_dict(d: dict):
    if set(d) == {"fact_id"}:
        return d["fact_id"]  # a vector-only entry (added with add_vectors and an id)
    try:
        from timerome.data.facts import Fact

        return Fact(**d)
    except ImportError:  # facts.py absent: a plain record with the same fields
        return _PlainFact(**d)
    except TypeError as e:
        raise TimeromeError(f"a stored fact does not fit timerome.data.facts.Fact: {e}") from None


@dataclass(frozen=True)
class _PlainFact:
    subject: str
    prompt: str
    object: str
    target: str | None = None
    fact_id: str | None = None


def _digest(tensors: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _read(path) -> tuple[dict, dict]:
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise TimeromeError(f"edit memory file {p} does not exist")
    try:
        with safe_open(str(p), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises several types on a damaged file
        raise TimeromeError(f"{p} is truncated or not an edit memory file ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None
    try:
        meta = json.loads(header["timerome"])
    except (KeyError, json.JSONDecodeError):
        raise TimeromeError(f"{p} is a safetensors file but not a timerome edit memory") from None
    if meta.get("format") != FORMAT:
        raise TimeromeError(f"{p} has format {meta.get('format')!r}; this version reads {FORMAT!r}")
    if _digest(tensors) != meta.get("sha256"):
        raise TimeromeError(f"{p} is corrupt: its tensors do not match the checksum written with them")
    return tensors, meta

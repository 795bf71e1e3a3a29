"""3. The multi-fact low-rank edit memory (paper Eq. multifact), installed as a hook at every step.

    memory = EditMemory(backbone, (1, "resid")).add(facts)      # capture u, d; solve G
    with memory.applied(backbone) as state:
        out = generate(backbone, prompt, ..., state=state)       # h <- h + alpha TopQ_q(D^T G U h)
    memory.remove(["fact-3"]); memory.save("forget.safetensors")

The pieces, one file each: `capture.py` reads the subject keys u and target deltas d, `ridge.py`
solves the ridge system in the smaller of its two forms (F x F while F <= H, else H x H) and
interprets lambda, `topq.py` sparsifies (from TOPQ_INDEX_MIN_FACTS facts on with an exact screen
that does not score every fact), `whitening.py` measures the background statistics of the
"whitened" key metric, `cuda_graph.py` replays the q > 0 hook's kernels on a GPU. This object holds
them together with the coordinate and the hyper-parameters, and applies the update in `update`
(the line with alpha is in `_change`).

Key metrics: "paper" is Eq. multifact as written; "whitened" (the default) measures keys against
the background mean mu and covariance C, coefficients G' K (h - mu) with K = (U - mu) C^-1: far
more selective on the embedded model (README, "What we measured"). Both are the same ridge
problem, the paper's with mu = 0, C = I.
"""

from __future__ import annotations

import inspect
import math

import torch

from timerome.common.checks import integer, number, shown
from timerome.data.facts import asked
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import DEFAULT_TARGET, fact_id, fact_list
from timerome.engine.settings import EDIT
from timerome.errors import TimeromeError
from timerome.memory.base import (Memory, _as_rows, _fact_from_dict, _fact_to_dict, check_new_facts, fact_content,
                                   id_list, math_dtype)
from timerome.memory.capture import capture_facts
from timerome.memory.cuda_graph import GraphedCalls
from timerome.memory.ridge import DEFAULT_LAM, RidgeMemory, check_lambda
from timerome.memory.topq import TopQIndex, top_q_combine
from timerome.memory.whitening import DEFAULT_SHRINKAGE, ResidualStats, stats_at

KEY_METRICS = ("paper", "whitened")
DEFAULT_KEY_METRIC = EDIT.key_metric
DEFAULT_ALPHA = EDIT.alpha  # the paper's memory (engine/settings.py: EditSettings)
FORMAT = "timerome-edit-memory/2"
OLD_FORMATS = ("timerome-edit-memory/1",)  # lam was the absolute lambda there
# q > 0 with at least this many facts: the hook selects with topq.TopQIndex (exact, an int8 screen) instead of
# scoring every fact; below it the screen's fixed cost is more than the dense scores' (bench_edit_memory.py)
TOPQ_INDEX_MIN_FACTS = 1536  # embedded model, q = 4: index 1.31 ms vs 1.53 ms at 2000 facts, 1.18 vs 1.19 at 1500
TOPQ_INDEX_MAX_HIDDEN = 130_000  # int32 products of int8 vectors: 127^2 H < 2^31
# the hook replays from a CUDA graph while tokens x facts is at most this (64 MB of float32 scores): past it
# the GPU's own work outweighs the launches a graph saves, and each graph would hold its scores' memory
GRAPH_MAX_SCORES = 1 << 24
G_TOLERANCE = 1e-9  # ridge.solution_error a loaded memory may have (a solve and its updates give about 1e-16)


def default_coordinate(backbone) -> Coordinate:
    """The residual stream of the (lower) middle block, every step, when no trace picked one.

    On the embedded model tracing finds the resid TIE band at layers 0-1 and the paper installs
    at the band's upper end: (n_layers - 1) // 2 = 1 there.
    """
    return Coordinate((backbone.n_layers - 1) // 2, "resid")


def _empty_list(facts) -> bool:
    """An empty list (or tuple) of facts: `build` makes an empty memory of it, scaled on scale_facts."""
    return isinstance(facts, (list, tuple)) and not facts


class EditMemory(Memory):
    """Multi-fact low-rank edit memory (Eq. multifact) at one coordinate of one backbone.

    alpha, q and g_max may be changed at any time (they act when the hook runs); lam, lam_absolute,
    key_metric and the background statistics are fixed at construction (G is solved with them).
    lam is relative to the keys' scale (ridge.py: the one lambda convention); lam_absolute gives
    the paper's absolute lambda instead; key_scale fixes the scale up front (default: measured on
    the first facts added). g_max (default None: exactly Eq. multifact) clips each fact coefficient
    to [0, g_max], the multi-fact analogue of the single-fact gate. step: the coordinate's step
    (None: every denoising step, the paper's k* = -1).
    """

    FORMAT, OLD_FORMATS, KIND, WHAT = FORMAT, OLD_FORMATS, "edit", "edit memory"
    SCHEMA = {"U": (torch.float64, 2, True), "D": (torch.float64, 2, True),
              "G": (torch.float64, 2, False),  # written for F <= H facts only
              "mu": (torch.float64, 1, False), "cov": (torch.float64, 2, False)}
    OVERRIDABLE = ("alpha", "q")

    @classmethod
    def shown(cls, d: dict) -> list[tuple[str, str]]:
        h = d["hyper"]
        lam = (f"absolute {h.get('lam_absolute'):g}" if h.get("lam_absolute") is not None
               else f"relative {h.get('lam')} (lambda {h.get('lam_value') or 0:.4g})")
        return [("alpha", f"{h.get('alpha')}"), ("lambda", lam), ("q", f"{h.get('q')} (0 = dense)"),
                ("key metric", f"{h.get('key_metric')}{cls._background(d)}"),
                ("g_max", "none (coefficients not capped)" if h.get("g_max") is None else f"{h.get('g_max')}")]

    def __init__(self, backbone, coordinate=None, *, alpha: float = DEFAULT_ALPHA, lam: float = DEFAULT_LAM,
                 lam_absolute: float | None = None, key_scale: float | None = None, q: int = EDIT.q,
                 key_metric: str = DEFAULT_KEY_METRIC, g_max: float | None = None, step: int | None = None,
                 background=None, target: str = DEFAULT_TARGET, batch_size: int = 32,
                 shrinkage: float = DEFAULT_SHRINKAGE):
        check_lambda(lam, lam_absolute)
        if key_metric not in KEY_METRICS:
            raise TimeromeError(f"unknown key_metric {key_metric!r}; choose one of {', '.join(KEY_METRICS)}")
        coord = Coordinate.of(coordinate if coordinate is not None else default_coordinate(backbone), step)
        self._bind(backbone, coord)
        self.index_min_facts = TOPQ_INDEX_MIN_FACTS  # from this many facts on (q > 0, CPU) the top-q screens
        self.alpha, self.q, self.g_max = alpha, q, g_max
        self.target, self.batch_size = target, batch_size
        self._check_hyper()
        self.key_metric = key_metric
        self.stats = (stats_at(backbone, self.coordinate, background, shrinkage=shrinkage, batch_size=batch_size)
                      if key_metric == "whitened" else None)
        self.ridge = RidgeMemory(self.hidden_size, lam=lam, lam_absolute=lam_absolute, key_scale=key_scale,
                                 mean=None if self.stats is None else self.stats.mean,
                                 precision=None if self.stats is None else self.stats.precision())
        self._facts, self._ids, self._cache, self._held = [], [], {}, None
        self._graphed = GraphedCalls(self._updated)  # update's replays on a GPU (cuda_graph.py)

    # ---------------------------------------------------------------- properties

    lam = property(lambda self: self.ridge.lam)                    # relative (ridge.py)
    lam_absolute = property(lambda self: self.ridge.lam_absolute)  # the paper's convention, when given
    lam_value = property(lambda self: self.ridge.lam_value)        # the lambda G is solved with
    key_scale = property(lambda self: self.ridge.key_scale)
    facts = property(lambda self: list(self._facts))
    fact_ids = property(lambda self: list(self._ids))

    @property
    def step(self) -> int | None:
        return self.coordinate.step

    @step.setter
    def step(self, k: int | None):
        self.coordinate = Coordinate.of(self.coordinate, -1 if k is None else k)

    def __len__(self) -> int:
        return self.ridge.n

    def scale_probe(self) -> torch.Tensor:
        return self.ridge.U

    def scale_state(self) -> tuple:
        return self.alpha, self.q, self.g_max, self.ridge.version

    def __repr__(self) -> str:
        lam = f"lam_absolute={self.lam_absolute}" if self.lam_absolute is not None else f"lam={self.lam}"
        return (f"EditMemory({len(self)} facts at {self.coordinate}, key_metric={self.key_metric}, "
                f"alpha={self.alpha}, {lam}, q={self.q})")

    # ---------------------------------------------------------------- building

    def reset(self) -> "EditMemory":
        """Forget every fact (the background statistics and the key scale stay)."""
        self.ridge.reset()
        self._facts, self._ids, self._held = [], [], None
        return self

    def reserve(self, n: int) -> "EditMemory":
        """Pre-allocate room for n facts (streaming inserts then never reallocate)."""
        self.ridge.reserve(n)
        return self

    def scale_to(self, keys: torch.Tensor) -> "EditMemory":
        """Fix the key scale of the relative lambda from these keys [k, H] (before any fact is in),
        e.g. every fact a stream will bring, so that each insert solves the same ridge problem."""
        if len(self):
            raise TimeromeError("the key scale is fixed once facts are in the memory")
        scale = self.ridge.scale_of(_as_rows(keys, "keys", self.hidden_size))
        if not scale > 0:
            raise TimeromeError("the keys have zero norm in the key metric: the relative lambda scales with them "
                                "(give keys of some size, or lam_absolute=)")
        self.ridge.key_scale = scale
        return self

    @classmethod
    def build(cls, backbone, coordinate, facts, *, scale_facts=None, **settings) -> "EditMemory":
        """The one place a filled memory is made: the keys u and deltas d of `facts` captured in one
        batched pass, the relative lambda's scale fixed on those keys (on `scale_facts`' when `facts` is
        empty: an empty memory whose streaming inserts solve the same ridge problem as the full one),
        then G solved. `settings`: the constructor's (alpha, lam, q, key_metric, background, target, ...).
        The `timerome` method, `timerome edit` and the sequential experiment build theirs here."""
        known = sorted(set(inspect.signature(cls.__init__).parameters) - {"self", "backbone", "coordinate"})
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise TimeromeError(f"{cls.__name__}.build takes no setting {', '.join(unknown)}; its settings: "
                                f"{', '.join(known)}")
        # the facts checked before the constructor's minutes of whitening statistics
        facts = [] if _empty_list(facts) else fact_list(facts)
        scale = facts or fact_list(scale_facts, "scale_facts (the facts an empty memory's lambda is scaled on)")
        memory = cls(backbone, coordinate, **settings)
        cap = capture_facts(backbone, scale, memory.coordinate, target=memory.target, batch_size=memory.batch_size)
        memory.scale_to(cap.keys)
        if facts:
            memory.add_vectors(cap.keys, cap.deltas, facts)
        return memory

    def add(self, facts) -> "EditMemory":
        """Capture the facts (batched) and insert them; on any error the memory is unchanged."""
        facts = fact_list(facts)
        self._check_off()
        check_new_facts(self._held_conflicts(facts), facts, self.target)
        cap = capture_facts(self.backbone, facts, self.coordinate, target=self.target, batch_size=self.batch_size)
        return self.add_vectors(cap.keys, cap.deltas, facts)

    def add_vectors(self, keys: torch.Tensor, deltas: torch.Tensor, facts) -> "EditMemory":
        """Insert precomputed keys u [k, H] and deltas d [k, H] for `facts` (a Fact or an id each)."""
        facts = list(facts)
        U_new, D_new = _as_rows(keys, "keys", self.hidden_size), _as_rows(deltas, "deltas", self.hidden_size)
        if not (len(U_new) == len(D_new) == len(facts)) or not facts:
            raise TimeromeError(f"need as many keys, deltas and facts, at least one "
                                f"(got {len(U_new)}, {len(D_new)}, {len(facts)})")
        check_new_facts(self._held_conflicts(facts), facts, self.target)
        self.ridge.insert(U_new, D_new)
        self._facts += facts
        self._ids += [fact_id(f) for f in facts]
        self._index_facts(facts, +1)
        return self

    def _held_conflicts(self, new) -> list:
        """The held facts that `new` can collide with (the same content, the same id, or the same
        question of the same subject: `target_conflict`): all that check_new_facts / sort_new_facts
        look at (facts of one content in memory order), found through an index of the held facts kept
        up to date by add and remove, so an insert costs O(k), not O(F)."""
        held = self._held_index()
        hit = {}
        for f in new:
            content, question = fact_content(f, self.target), asked(f)
            for g in ((held["content"].get(content, []) if content is not None else []) + held["id"].get(fact_id(f), [])
                      + (held["asked"].get(question, []) if question is not None else [])):
                hit[id(g)] = g
        return list(hit.values())

    def _held_index(self) -> dict:
        """{content: [facts]}, {id: [facts]} of the held facts; rebuilt when the target or the facts
        changed behind its back."""
        held = self._held
        if held is None or held["target"] != self.target or held["n"] != len(self._facts):
            held = self._held = {"target": self.target, "content": {}, "id": {}, "asked": {}, "n": 0}
            self._index_facts(self._facts, +1)
        return held

    def _index_facts(self, facts, sign: int) -> None:
        held = self._held
        if held is None:
            return
        for f in facts:
            for table, key in ((held["content"], fact_content(f, held["target"])), (held["id"], fact_id(f)),
                               (held["asked"], asked(f))):
                if sign > 0:
                    table.setdefault(key, []).append(f)
                else:
                    same = table[key]
                    del same[next(i for i, g in enumerate(same) if g is f)]
                    if not same:
                        del table[key]
        held["n"] += sign * len(facts)

    def remove(self, fact_ids) -> "EditMemory":
        """Drop facts by id (a downdate, no re-solve); unknown ids raise and nothing is removed."""
        self._check_unapplied("remove facts outside it, where nothing it prepared is in use")
        fact_ids = id_list(fact_ids)
        if len(fact_ids) <= 8:  # a few: C-speed scans of the id list (the last of a repeated id, as the dict)
            backwards = self._ids[::-1]
            have = {fid: len(backwards) - 1 - backwards.index(fid) for fid in fact_ids if fid in backwards}
        else:
            have = {fid: j for j, fid in enumerate(self._ids)}
        missing = [i for i in fact_ids if i not in have]
        if missing:
            raise TimeromeError(f"no fact with id {', '.join(map(repr, missing[:5]))} in the memory")
        drop = sorted({have[i] for i in fact_ids})
        if not drop:
            return self
        if len(drop) == len(self):
            return self.reset()
        mask = torch.ones(len(self), dtype=torch.bool)
        mask[drop] = False
        self.ridge.delete(mask.nonzero().squeeze(1), torch.tensor(drop))
        self._index_facts([self._facts[j] for j in drop], -1)
        if len(drop) <= 8:
            for j in reversed(drop):
                del self._facts[j], self._ids[j]
        else:
            keep = mask.tolist()
            self._facts = [f for f, k in zip(self._facts, keep) if k]
            self._ids = [i for i, k in zip(self._ids, keep) if k]
        return self

    # ---------------------------------------------------------------- applying

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        """The update alpha * TopQ_q(D^T G U h) for h [..., H], in h's dtype (float64 math for float64 h)."""
        self._check_ready()
        if h.shape[-1] != self.hidden_size:
            raise TimeromeError(f"h has hidden size {h.shape[-1]}, the memory {self.hidden_size}")
        return self._change(self._rows(h)).to(h.dtype).view_as(h)

    def update(self, h: torch.Tensor) -> torch.Tensor:
        """Eq. multifact on a live residual h [..., H]: h + alpha * TopQ_q(D^T G U h)."""
        if not (h.shape[-1] == self.hidden_size and isinstance(self.q, int) and 0 <= self.q <= len(self) > 0
                and isinstance(self.alpha, (int, float)) and 0 <= self.alpha < math.inf):
            self._check_ready()  # a direct call (the hook was checked when applied): what is wrong, in delta's words
            if h.shape[-1] != self.hidden_size:
                raise TimeromeError(f"h has hidden size {h.shape[-1]}, the memory {self.hidden_size}")
        if self._plan(h.device) == "map":  # x + alpha (x - mu) W in one product-and-add (the hook's common case)
            x = self._rows(h)
            W, mu = self._matrices(x.device, x.dtype, "W", "mu")  # _change's map, alpha fused into the add:
            return torch.addmm(x, x if mu is None else x - mu, W, alpha=self.alpha).to(h.dtype).view_as(h)
        out = None
        if h.numel() // self.hidden_size * len(self) <= GRAPH_MAX_SCORES:
            # on a GPU, the same kernels replayed from a CUDA graph (one launch for a dozen: cuda_graph.py)
            state = (self.ridge.version, self.alpha, self.q, self.g_max, len(self))
            out = self._graphed(h, state, keep=self._cache.get((str(h.device), math_dtype(h))))
        return out if out is not None else self._updated(h)

    def _updated(self, h: torch.Tensor) -> torch.Tensor:
        """update's h + alpha * TopQ_q(c) D, computed op by op."""
        x = self._rows(h)
        return (x + self._change(x)).to(h.dtype).view_as(h)

    def _change(self, x: torch.Tensor) -> torch.Tensor:
        """alpha * TopQ_q(c) D for x [N, H], c the fact coefficients (ridge.py)."""
        plan = self._plan(x.device)
        if plan == "map":
            W, mu = self._matrices(x.device, x.dtype, "W", "mu")
            change = (x if mu is None else x - mu) @ W       # D^T G K folded into one [H, H] map
        elif plan == "index":
            index, T, muT, D = self._matrices(x.device, x.dtype, "index", "T", "muT", "D")
            y = x if T is None else x @ T if muT is None else torch.addmm(muT, x, T, alpha=1, beta=-1)
            change = index.combine(y, self.q, D)             # TopQ_q(c) D, c = y R^T (ridge.balanced)
        else:
            A, Amu, D = self._matrices(x.device, x.dtype, "A", "Amu", "D")
            c = x @ A.T if Amu is None else torch.addmm(Amu, x, A.T, beta=-1)  # fact coefficients [N, F]
            if self.g_max is not None:
                c = c.clamp(0.0, self.g_max)
            change = top_q_combine(c, self.q, D)             # TopQ_q(c) D  [N, H]
        return self.alpha * change                           # <- alpha multiplies the update here

    def _plan(self, device) -> str:
        """How the hook computes the update: "map" (q = 0, no g_max, 2F >= H: the [H, H] map W),
        "index" (q > 0, no g_max, at least index_min_facts facts, CPU: topq.TopQIndex, which does
        not score every fact) or "scores" (every fact's coefficient, then TopQ / g_max)."""
        if self.q == 0 and self.g_max is None and 2 * len(self) >= self.hidden_size:
            return "map"
        if (self.q and self.g_max is None and len(self) >= self.index_min_facts and torch.device(device).type == "cpu"
                and self.hidden_size <= TOPQ_INDEX_MAX_HIDDEN and not self._index_went_dense()):
            return "index"
        return "scores"

    def _index_went_dense(self) -> bool:
        """Whether this memory's index (as it stands) found screening dearer than scoring every fact:
        then the scores skip its H x H transform into the screen's coordinates (LLaDA-8B's shapes:
        297.6 ms against 180.8 ms for 10^4 facts, bench_edit_memory.py --parts scale8b)."""
        return any(v[0] == self.ridge.version and getattr(v[1].get("index"), "dense", False)
                   for v in self._cache.values())

    def _prepare(self, backbone) -> None:
        need = {"map": ("W", "mu"), "index": ("index", "T", "muT", "D"), "scores": ("A", "Amu", "D")}
        self._matrices(backbone.device, torch.float32, *need[self._plan(backbone.device)])

    def _matrices(self, device, dtype, *names):
        """The named tensors on device in dtype, each built on first use and kept until the memory
        changes: W, mu, A, Amu (= A mu), D, and for topq.TopQIndex the coordinates of ridge.balanced
        (c = ((x - mu) T) R^T): T, muT (= mu T) and index (of the rows R). mu, Amu and muT are None
        for the paper metric, T for the paper metric in the facts form."""
        r = self.ridge
        key = (str(device), dtype)
        hit = self._cache.get(key)
        if hit is None or hit[0] != r.version:
            self._cache = {k: v for k, v in self._cache.items() if v[0] == r.version}
            hit = self._cache[key] = (r.version, {})
        mats = hit[1]
        centred = self.key_metric == "whitened"
        for name in names:
            if name in mats:
                continue
            if name in ("index", "T", "muT"):
                T, R = r.balanced()
                mats["T"] = None if T is None else T.to(device=device, dtype=dtype)
                mats["muT"] = (r.mean @ T).to(device=device, dtype=dtype) if centred and T is not None else None
                mats["index"] = TopQIndex(R.to(device=device, dtype=dtype))
                continue
            t = {"W": lambda: r.W, "mu": lambda: r.mean if centred else None, "A": lambda: r.A, "D": lambda: r.D,
                 "Amu": lambda: r.A @ r.mean if centred else None}[name]()
            mats[name] = None if t is None else t.to(device=device, dtype=dtype)
        return tuple(mats[n] for n in names)

    # ---------------------------------------------------------------- saving

    def _tensors(self) -> dict:
        """U, D, G (+ mu, C) as float64 tensors. G (F x F) is written only for F <= H facts; a memory of
        more facts is solved again from U and D when loaded (ridge.py: the hidden form, O(F H^2)), so no
        file holds an F x F matrix it does not need."""
        r = self.ridge
        tensors = {"U": r.U, "D": r.D} | ({"G": r.G} if len(self) <= self.hidden_size else {})
        if self.stats is not None:
            tensors |= {"mu": self.stats.mean, "cov": self.stats.cov}
        return tensors

    def _header(self) -> dict:
        return {
            "hyper": {"alpha": float(self.alpha), "lam": self.lam, "lam_absolute": self.lam_absolute,
                      "key_scale": self.key_scale, "lam_value": self.lam_value, "q": int(self.q),
                      "key_metric": self.key_metric, "g_max": None if self.g_max is None else float(self.g_max),
                      "target": self.target, "batch_size": self.batch_size},
            "stats": None if self.stats is None else {"n_tokens": self.stats.n_tokens,
                                                      "shrinkage": self.stats.shrinkage},
            "facts": [_fact_to_dict(f) for f in self._facts],
        }

    @classmethod
    def _restore(cls, path, meta: dict, tensors: dict, backbone) -> "EditMemory":
        try:
            mem, facts = cls._from_meta(meta, tensors, backbone)
            U, D, G = tensors["U"], tensors["D"], tensors.get("G")
        except (KeyError, TypeError, ValueError) as e:  # a header written by hand, or another version
            raise TimeromeError(f"{path} has incomplete metadata ({type(e).__name__}: {e})") from None
        H = mem.hidden_size
        if G is None and len(facts) <= H:
            raise TimeromeError(f"{path} lacks the tensor G that a memory of {len(facts)} <= {H} facts holds")
        g_shape = None if G is None else tuple(G.shape)
        if not (U.shape == D.shape == (len(facts), H) and g_shape in (None, (len(facts), len(facts)))):
            raise TimeromeError(f"{path} is inconsistent: {len(facts)} facts but tensors of shapes "
                                f"{tuple(U.shape)}, {tuple(D.shape)}, {g_shape}")
        if facts and mem.key_scale is None and mem.lam_absolute is None:
            raise TimeromeError(f"{path} has incomplete metadata: {len(facts)} facts but no key_scale for its "
                                "relative lambda")
        error = mem.ridge.solution_error(U, G) if facts and G is not None else 0.0
        if not error <= G_TOLERANCE:
            raise TimeromeError(f"{path} is inconsistent: its G is not the ridge inverse of its keys (relative error "
                                f"{error:.3g}, where a saved memory's is about 1e-16): G or the keys were changed by "
                                "hand or damaged; rebuild the memory")
        if facts:
            mem.ridge.restore(U, D, G)
            mem._facts, mem._ids = facts, [fact_id(f) for f in facts]
        return mem

    @classmethod
    def _from_meta(cls, meta: dict, tensors: dict, backbone) -> tuple["EditMemory", list]:
        """An empty memory with the saved coordinate, hyper-parameters and statistics, and the facts."""
        hyper = dict(meta["hyper"])
        if meta["format"] in OLD_FORMATS:  # version 1 stored the absolute lambda as "lam"
            hyper.update(lam_absolute=hyper["lam"], lam=DEFAULT_LAM, key_scale=None)
        stats = None
        coord = Coordinate.of(meta["coordinate"])
        if hyper["key_metric"] == "whitened":
            stats = ResidualStats(coord.layer, coord.point, tensors["mu"], tensors["cov"],
                                  meta["stats"]["n_tokens"], meta["stats"]["shrinkage"])
        mem = cls(backbone, coord, alpha=hyper["alpha"], lam=hyper["lam"], lam_absolute=hyper["lam_absolute"],
                  key_scale=hyper["key_scale"], q=hyper["q"], key_metric=hyper["key_metric"], g_max=hyper["g_max"],
                  background=stats, target=hyper["target"], batch_size=hyper["batch_size"])
        return mem, [_fact_from_dict(d) for d in meta["facts"]]

    # ---------------------------------------------------------------- checks

    def _check_hyper(self):
        number(self.alpha, "alpha", lo=0)  # as the method and the CLI refuse it: a negative alpha adds the old answer
        integer(self.q, "q (--q: 0 = dense)", lo=0)
        number(self.g_max, "g_max", lo=0, lo_open=True, none=True)
        integer(self.batch_size, "batch_size", lo=1)
        if not isinstance(self.target, str) or not self.target.strip():
            raise TimeromeError(f"target must be a non-empty string, got {shown(self.target)}")

    def _check_ready(self):
        self._check_hyper()
        if len(self) == 0:
            raise TimeromeError("the edit memory is empty: add facts before applying it")
        if self.q > len(self):
            raise TimeromeError(f"q={self.q} exceeds the number of facts ({len(self)}): TopQ cannot keep "
                                f"more facts than the memory holds")



# ------------------------------------------------------------------------------ helpers

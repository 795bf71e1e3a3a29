"""A radius-gated codebook edit memory: forget the fact and only the fact (beyond the paper).

    memory = CodebookMemory(backbone, (0, "resid"), background=stats, calibration=retain_rows)
    memory.add(facts)                                        # keys, radii, deltas
    with memory.applied(backbone) as state:
        out = generate(backbone, prompt, ..., state=state)   # h <- h + alpha g(h) d, every step
    memory.remove(["fact-3"]); memory.save("forget.safetensors")

The paper's memory (edit_memory.py) gives every token a ridge coefficient c(h) = G K (h - mu):
small but nonzero on every retain token, and alpha amplifies it at every denoising step. This
memory follows GRACE's codebook instead. An entry is (key k_e, reach r_e, fact f_e); a token's
update is nonzero only when its residual lies inside some entry's radius, margin * r_e:

    x(h) = min_e |(h - k_e) L| / (margin r_e)       L L^T = C^-1, the background whitening
    g(h) = clamp((1 - x(h)) / (1 - inner), 0, 1)    1 within inner * radius, exactly 0 beyond it
    h   <- h + alpha g(h) d_{f(e*)}                 e* the entry that gives x(h)

Keys are read per subject token over the states the sampler visits (token_keys.py), and, with
object_keys, at every unmasked answer token of those states (the object's evidence in its own
context). The reach of an entry is the distance from its key to the nearest calibration token
(the retain corpus, in the same states): with margin < 1 every calibration token gets exactly
zero update, and so does any token no nearer to a key than they are. d_z is the paper's target
delta v_t - v_o (capture.py, "cloze") or the same averaged over partially masked states ("states").

Where the update goes (write): "tokens" adds it where the gate fires (the subject's tokens,
GRACE's way); "sequence" (the default) gives every token of a sequence that sequence's largest
gate and its entry's delta, so the delta d, read at the object's positions, is also written
where the object is produced (the masked answer), and only in sequences about a forget subject.

The subject-complete gate (complete=True) also asks that the whole subject stand in the token's
sequence: each entry knows which of its subject's tokens it is (its slot; object keys have none),
and a token's g is capped by min over the subject's slots of the largest g a token of that slot
gets in the same sequence. A name sharing one word with the forget subject then gets nothing.

Entries are independent (a reach depends on its key and the calibration tokens only), so
inserting facts appends rows and removing them drops rows: a streamed memory equals a memory
built in one batch. alpha, margin, inner and complete act when the hook runs and may change at
any time.
"""

from __future__ import annotations

import math
import numbers

import torch

from timerome.common.cache import cached_tensors
from timerome.common.checks import integer, is_int, number
from timerome.common.checks import seed as checked_seed
from timerome.data.rows import where_rows
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import DEFAULT_TARGET, fact_id, fact_list, warn_unknown_subjects
from timerome.errors import TimeromeError
from timerome.memory.base import (Memory, _as_rows, _fact_from_dict, _fact_to_dict, check_new_facts, id_list,
                                  math_dtype)
from timerome.memory.capture import capture_facts
from timerome.memory.token_keys import state_deltas, state_token_rows, state_tokens, subject_keys
from timerome.memory.whitening import DEFAULT_SHRINKAGE, ResidualStats, stats_at

DEFAULT_ALPHA = 8.0    # embedded and TOFU models at the traced layer (docs/selectivity.md)
DEFAULT_MARGIN = 0.8   # radius = 0.8 x the distance to the nearest calibration token
DEFAULT_INNER = 0.5    # full strength within half the radius
DEFAULT_STATES = 4     # states per fact the keys are read on (the first fully masked)
DEFAULT_COMPLETE = True   # fire only where every token of the subject stands in the sequence
DEFAULT_OBJECT_KEYS = True  # key the answer tokens of a fact's states as well as its subject's
CALIBRATION_STATES = 2
VALUES = ("cloze", "states")
WRITES = ("tokens", "sequence")
DEFAULT_WRITE = "sequence"  # the delta goes to every token of a sequence where the (whole) subject fires
FORMAT = "timerome-codebook-memory/1"
_CHUNK = 1 << 24       # [tokens, entries] distance block kept under this many elements
_CDIST_PAIRWISE = 25  # torch.cdist computes pairwise where both sides have at most this many rows
MIN_REACH = 1e-2       # x sqrt(H): an entry this close to a calibration token is dropped (it could never fire)


class CodebookMemory(Memory):
    """Radius-gated codebook memory (module docstring) at one coordinate of one backbone.

    background: the whitening statistics (ResidualStats at the coordinate, or texts for
    `whitening.background_texts`). calibration: what the radii are measured on, question/answer
    rows or texts (the retain corpus), or their residuals [N, H] at the coordinate; a loaded memory
    needs it only to insert more facts. values: "cloze" (the paper's d) or "states". object_keys:
    key every unmasked answer token of a fact's states too, not only its subject's tokens (the
    object's evidence: hardening against the answer shown in context).
    """

    FORMAT, KIND, WHAT = FORMAT, "codebook", "codebook memory"
    SCHEMA = {"keys": (torch.float64, 2, True), "reach": (torch.float64, 1, True),
              "owner": (torch.int64, 1, True), "slot": (torch.int64, 1, True),
              "deltas": (torch.float64, 2, True), "mu": (torch.float64, 1, True),
              "cov": (torch.float64, 2, True)}
    LOAD_OPTIONS = ("calibration",)
    OVERRIDABLE = ("alpha", "margin", "inner")
    # what `timerome memory show` says of a file without recorded rows (rows given in Python, or an older file)
    UNRECORDED = {"calibration": "not recorded (rows given in Python, or an older file): `memory add` reads the "
                                 "added facts' source's retain rows (a rewrite memory's embedded or counterfactual "
                                 "facts, or a file's on the embedded model: embedded:train) or --calibration",
                  "value_rows": "not recorded (the calibration rows, rows given in Python, or an older file): "
                                "`memory add` reads them as the method does (the embedded model's training rows, "
                                "else its calibration rows) or --value-rows"}
    pads = None       # end-of-text tokens after the answer in the key and calibration states (token_keys._states)
    last_pads = None  # with these counts, the memory also calibrates on last-step states (token_keys.answer_keys)

    def __init__(self, backbone, coordinate, *, background=None, calibration=None, alpha: float = DEFAULT_ALPHA,
                 margin: float = DEFAULT_MARGIN, inner: float = DEFAULT_INNER, n_states: int = DEFAULT_STATES,
                 complete: bool = DEFAULT_COMPLETE, values: str = "cloze", object_keys: bool = DEFAULT_OBJECT_KEYS,
                 write: str = DEFAULT_WRITE, target: str = DEFAULT_TARGET, seed: int = 0, batch_size: int = 32,
                 shrinkage: float = DEFAULT_SHRINKAGE, calibration_seed: int = 0):
        if values not in VALUES:
            raise TimeromeError(f"values must be one of {', '.join(VALUES)}, got {values!r}")
        integer(n_states, "n_states", lo=1)
        self._bind(backbone, Coordinate.of(coordinate))
        H = self.hidden_size
        self.alpha, self.margin, self.inner, self.complete, self.write = alpha, margin, inner, complete, write
        self._check_hyper()
        if not isinstance(object_keys, bool):
            raise TimeromeError(f"object_keys must be true or false, got {object_keys!r}")
        self.n_states, self.values, self.object_keys = int(n_states), values, object_keys
        self.target, self.seed = target, checked_seed(seed)
        self.batch_size = integer(batch_size, "batch_size", lo=1)
        # the seed of the calibration states and token values (`_calibration`): the method's trace_seed
        self.calibration_seed = checked_seed(calibration_seed, "calibration_seed")
        self.stats = stats_at(backbone, self.coordinate, background, shrinkage=shrinkage)
        self._white = torch.linalg.cholesky(self.stats.precision())  # z = (h - mu) L
        self._calib = None if calibration is None else self._calibration(calibration)
        self._keys = torch.zeros(0, H, dtype=torch.float64)
        self._reach = torch.zeros(0, dtype=torch.float64)
        self._owner = torch.zeros(0, dtype=torch.long)       # entry -> fact (its index in self._ids)
        self._slot = torch.zeros(0, dtype=torch.long)        # entry -> which subject token (-1: none)
        self._deltas = torch.zeros(0, H, dtype=torch.float64)  # fact slot -> d
        self._facts, self._ids, self._cache, self.version = [], [], {}, 0
        # the named rows its build read, recorded in its file (`data.rows.row_source`) so that `memory add`
        # reads the same ones: "calibration" (the radii; set by `timerome edit`), "value_rows" (a rewrite
        # memory's token values); rows given in Python as lists are not recorded
        self.sources: dict = {}
        # which of the calibration source's rows its build left out (indices; `timerome edit` sets them):
        # `memory add` reads the build's calibration states again from their cache (`CalibrationSubset`)
        self.calibration_left_out: list[int] | None = None

    @classmethod
    def described(cls, meta: dict, path) -> dict:
        return dict(super().described(meta, path), sources=read_sources(meta, path),
                    calibration_left_out=read_left_out(meta, path))

    @classmethod
    def shown(cls, d: dict) -> list[tuple[str, str]]:
        h = d["hyper"]
        return [("alpha", f"{h.get('alpha')}"), *cls._calibration_rows(d),
                ("entries", f"{d['tensors']['keys'][0]} keys{cls._background(d)}"),
                ("gate", f"subject-complete {h.get('complete')}, write {h.get('write')}, object keys "
                         f"{h.get('object_keys')}, values {h.get('values')}")]

    @classmethod
    def _calibration_rows(cls, d: dict) -> list[tuple[str, str]]:
        """The radius and the calibration rows it was measured on (as the file records them) of `shown`."""
        h, left_out = d["hyper"], d["calibration_left_out"]
        less = (f", less the {len(left_out)} of its rows that state a fact it was built with (`memory add` also "
                "leaves out the rows stating the facts it adds)"
                if left_out and d["sources"].get("calibration") else "")
        return [("radius", f"margin {h.get('margin')} x the distance to the nearest calibration token, full "
                           f"strength within {h.get('inner')}"),
                ("calibration", cls._source(d, "calibration") + less)]

    @classmethod
    def _source(cls, d: dict, key: str) -> str:
        """The rows its build read for `key`, as the file records them (`data.rows.row_source`)."""
        return where_rows(d["sources"][key]) if key in d["sources"] else cls.UNRECORDED[key]

    facts = property(lambda self: list(self._facts))
    fact_ids = property(lambda self: list(self._ids))
    keys = property(lambda self: self._keys.clone())
    reach = property(lambda self: self._reach.clone())      # distance to the nearest calibration token
    radii = property(lambda self: self.margin * self._reach)
    owners = property(lambda self: self._owner.clone())
    slots = property(lambda self: self._slot.clone())
    deltas = property(lambda self: self._deltas.clone())
    n_entries = property(lambda self: len(self._keys))

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return (f"CodebookMemory({len(self)} facts, {self.n_entries} entries at {self.coordinate}, "
                f"alpha={self.alpha}, margin={self.margin}, inner={self.inner}, complete={self.complete}, "
                f"object_keys={self.object_keys}, values={self.values})")

    # ---------------------------------------------------------------- building

    def add(self, facts) -> "CodebookMemory":
        """Read the facts' keys and deltas, measure each key's reach, insert; on error nothing changes."""
        facts = fact_list(facts)
        self._check_off()
        check_new_facts(self._facts, facts, self.target)
        warn_unknown_subjects(self.backbone, facts)  # read as <|unk|>, such subjects share keys (after the checks)
        keys, owner, slots = subject_keys(self.backbone, self.coordinate, facts, n_states=self.n_states,
                                          seed=self.seed, objects=self.object_keys, batch_size=self.batch_size)
        if self.values == "cloze":
            deltas = capture_facts(self.backbone, facts, self.coordinate, target=self.target,
                                   batch_size=self.batch_size).deltas
        else:
            deltas = state_deltas(self.backbone, self.coordinate, facts, target=self.target, seed=self.seed,
                                  batch_size=self.batch_size)
        return self.add_vectors(keys, owner, deltas, facts, slots)

    def add_vectors(self, keys, owner, deltas, facts, slots=None) -> "CodebookMemory":
        """Insert entries keys [E, H] owned by owner [E] (indices into `facts`), with slots [E]
        (which subject token each is; default 0), and one delta [F, H] per fact (a Fact or an id)."""
        facts = list(facts)
        K, D = _as_rows(keys, "keys", self.hidden_size), _as_rows(deltas, "deltas", self.hidden_size)
        owner = torch.as_tensor(owner, dtype=torch.long).reshape(-1)
        slots = torch.zeros_like(owner) if slots is None else torch.as_tensor(slots, dtype=torch.long).reshape(-1)
        if not facts or len(D) != len(facts) or len(owner) != len(K) or len(slots) != len(K):
            raise TimeromeError(f"need one delta per fact and one owner per key, at least one fact (got {len(facts)} "
                                f"facts, {len(D)} deltas, {len(K)} keys, {len(owner)} owners)")
        if len(owner) and not (0 <= int(owner.min()) and int(owner.max()) < len(facts)):
            raise TimeromeError(f"key owners must index the {len(facts)} facts given")
        check_new_facts(self._facts, facts, self.target)
        reach = self.reach_of(K)
        live = reach > MIN_REACH * math.sqrt(self.hidden_size)  # a key on a calibration token could never fire
        K, owner, slots, reach = K[live], owner[live], slots[live], reach[live]
        missing = sorted(set(range(len(facts))) - set(owner.tolist()))
        if missing:
            raise TimeromeError(f"facts {', '.join(fact_id(facts[i]) for i in missing[:5])} have no usable key: no "
                                "subject token was read, or every one equals a calibration token (does the "
                                "calibration corpus hold the forget rows?)")
        self._keys = torch.cat([self._keys, K])
        self._reach = torch.cat([self._reach, reach])
        self._owner = torch.cat([self._owner, owner + len(self._ids)])
        self._slot = torch.cat([self._slot, slots])
        self._deltas = torch.cat([self._deltas, D])
        self._facts += facts
        self._ids += [fact_id(f) for f in facts]
        self.version += 1
        return self

    def reach_of(self, keys: torch.Tensor) -> torch.Tensor:
        """[E] whitened distance from each raw key [E, H] to its nearest calibration token."""
        if self._calib is None:
            raise TimeromeError(f"the radius gate needs calibration tokens to insert facts: pass calibration= "
                                f"(the retain rows or texts) to the {type(self).__name__}, or to "
                                "timerome.load_memory(path, backbone, calibration=...)")
        return nearest_distance(self.whiten(_as_rows(keys, "keys", self.hidden_size)), self._calib)

    def remove(self, fact_ids) -> "CodebookMemory":
        """Drop facts (and their entries) by id; unknown ids raise and nothing is removed."""
        self._check_unapplied("remove facts outside it, where nothing it prepared is in use")
        fact_ids = id_list(fact_ids)
        missing = [i for i in fact_ids if i not in self._ids]
        if missing:
            raise TimeromeError(f"no fact with id {', '.join(map(repr, missing[:5]))} in the memory")
        drop = {self._ids.index(i) for i in fact_ids}
        keep = [j for j in range(len(self._ids)) if j not in drop]
        new_slot = torch.full((len(self._ids),), -1, dtype=torch.long)
        new_slot[keep] = torch.arange(len(keep))
        rows = new_slot[self._owner] >= 0
        self._keys, self._reach, self._slot = self._keys[rows], self._reach[rows], self._slot[rows]
        self._owner = new_slot[self._owner[rows]]
        self._deltas = self._deltas[keep]
        self._facts = [self._facts[j] for j in keep]
        self._ids = [self._ids[j] for j in keep]
        self.version += 1
        return self

    # ---------------------------------------------------------------- applying

    def whiten(self, h: torch.Tensor) -> torch.Tensor:
        """(h - mu) L for raw residuals h [..., H] (float64 math), row by row the same whatever other
        rows h holds (`rowwise_matmul`), so a streamed memory equals one built in one batch."""
        x = h.double() - self.stats.mean.to(h.device)
        return rowwise_matmul(x.reshape(-1, x.shape[-1]), self._white.to(h.device)).view_as(x)

    def gate(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g [N], nearest entry [N]) for residuals h [..., L, H] flattened to N tokens; g is exactly
        0 outside every radius (the entry index is then meaningless)."""
        self._check_ready()
        x = self._rows(h)
        return self._gate(x, self._matrices(h.device, x.dtype), _n_sequences(h))

    def _gate(self, x, m: dict, n_seq: int):
        g, e = self._token_gate(x, m)
        return (self._complete(g, e, m, n_seq) if self.complete else g), e

    def _token_gate(self, x, m: dict):
        """(g [N], nearest entry [N]) of each token on its own: before the subject-complete cap. The
        entry is looked up only where g > 0 (0 elsewhere, where it means nothing): the least ratio is
        what decides g, and most tokens lie outside every radius."""
        z = (x - m["mu"]) @ m["white"]
        step = max(1, _CHUNK // max(1, len(m["keys"])))
        best, entry = [], []
        for s in range(0, len(z), step):
            d = _distances(z[s:s + step], m)
            ratio = d.div(m["radius"]) if d.requires_grad else d.div_(m["radius"])  # one [tokens, entries] block
            v = ratio.amin(1)
            i = torch.zeros(len(v), dtype=torch.long, device=v.device)
            inside = (v < 1).nonzero().squeeze(1)  # g > 0 exactly here (inner < 1)
            if len(inside):
                i[inside] = ratio[inside].argmin(1)  # the first least, as min(1) gives it
            best.append(v), entry.append(i)
        ratio, e = torch.cat(best), torch.cat(entry)
        return ((1 - ratio) / (1 - self.inner)).clamp(0, 1), e

    def _complete(self, g, e, m: dict, n_seq: int) -> torch.Tensor:
        """g capped, per token, by how completely its subject stands in its sequence: the smallest
        over the subject's token slots of the largest gate a token of that slot gets there. A name
        that shares one word with the forget subject then gets no update."""
        group, slot, n_slots = m["group"][e], m["slot"][e], m["n_slots"]
        G, J = len(n_slots), int(n_slots.max())
        seq = torch.arange(n_seq, device=g.device).repeat_interleave(len(g) // n_seq)
        counted = (g > 0) & (slot >= 0)
        flat = ((seq * G + group) * J + slot.clamp(min=0))[counted]
        cover = g.new_zeros(n_seq * G * J).scatter_reduce(0, flat, g[counted], "amax").view(n_seq, G, J)
        unused = torch.arange(J, device=g.device) >= n_slots[:, None]          # [G, J]
        whole = cover.masked_fill(unused, 1.0).amin(-1)                          # [n_seq, G]
        return torch.minimum(g, whole[seq, group])

    def delta(self, h: torch.Tensor) -> torch.Tensor:
        """The update alpha g(h) d for residuals h [..., L, H] (exactly zero outside every radius)."""
        return self.update(h) - h

    def update(self, h: torch.Tensor) -> torch.Tensor:
        """h with alpha g d added where g > 0 (write "tokens": the tokens inside some radius;
        "sequence": every token of a sequence where one is); every other token keeps h's own value,
        bit for bit."""
        self._check_ready()
        out = self._edited(h)
        return h.clone() if out is None else out

    def _edited(self, h: torch.Tensor, positions: torch.Tensor | None = None,
                seen: dict | None = None) -> torch.Tensor | None:
        """The edited copy of h, or None when no token lies inside a radius (the hook then leaves h).

        The gate is a function of whole sequences (the subject-complete cap, write="sequence"). A
        forward that holds every position (positions None) leaves its per-token gates in `seen`; a
        partial forward of a cached sampler (positions: the absolute positions it holds) takes the
        other positions' gates from there, as the cache takes their keys and values from the last
        refresh, so the edit of a window token is the one a full forward would have made.
        """
        dt = math_dtype(h)
        x = h.reshape(-1, self.hidden_size)
        m, n_seq = self._matrices(h.device, dt), _n_sequences(h)
        g, e = self._token_gate(x.to(dt), m)
        window = None
        if seen is not None and positions is None:
            seen.update(g=g.view(n_seq, -1).clone(), e=e.view(n_seq, -1).clone())
        elif seen is not None and "g" in seen and seen["g"].shape[0] == n_seq and \
                int(positions.max()) < seen["g"].shape[1]:
            window = positions.to(g.device)
            G, E = seen["g"].clone(), seen["e"].clone()
            G[:, window], E[:, window] = g.view(n_seq, -1), e.view(n_seq, -1)
            g, e = G.reshape(-1), E.reshape(-1)
        if self.complete:
            g = self._complete(g, e, m, n_seq)
        if self.write == "sequence":  # each sequence's strongest gate, at every one of its tokens
            g, e = _spread_over_sequences(g, e, n_seq)
        if window is not None:  # back to the tokens this forward holds
            g, e = g.view(n_seq, -1)[:, window].reshape(-1), e.view(n_seq, -1)[:, window].reshape(-1)
        hit = (g > 0).nonzero().squeeze(1)
        if not len(hit):
            return None
        change = self.alpha * g[hit, None] * m["deltas"][m["owner"][e[hit]]]   # <- alpha multiplies the update here
        out = h.clone()
        out.view(-1, self.hidden_size)[hit] = (x[hit].to(dt) + change).to(h.dtype)
        return out

    def _prepare(self, backbone) -> None:
        self._matrices(backbone.device, torch.float32)

    def _edits(self) -> dict:
        seen: dict = {}  # the last full forward's per-token gates, for the partial forwards of a cache
        return {self.coordinate: lambda h, st: self._edited(h, st.positions, seen)}

    def _groups(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(group of each fact [F], token slots of each group [G]): facts about one subject form a
        group (a fact given by id alone is its own group)."""
        names = [getattr(f, "subject", None) or (f.get("subject") if isinstance(f, dict) else None) or fid
                 for f, fid in zip(self._facts, self._ids)]
        index = {n: i for i, n in enumerate(dict.fromkeys(names))}
        group = torch.tensor([index[n] for n in names], dtype=torch.long)
        n_slots = torch.ones(len(index), dtype=torch.long).scatter_reduce(
            0, group[self._owner], self._slot + 1, "amax")
        return group, n_slots

    def _matrices(self, device, dtype) -> dict:
        """What the hook uses, on device; rebuilt after any change to the entries or the margin."""
        key = (str(device), dtype, float(self.margin))
        hit = self._cache.get(key)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        group, n_slots = self._groups()
        m = {"mu": self.stats.mean, "white": self._white, "keys": self.whiten(self._keys),
             "radius": self.margin * self._reach, "deltas": self._deltas}
        m = {k: v.to(device=device, dtype=dtype) for k, v in m.items()}
        if len(m["keys"]) > _CDIST_PAIRWISE:  # the keys' half of the distance product (`_distances`);
            m["keys_aug"] = keys_half(m["keys"])  # the keys then a view of it: one copy of them held
            m["keys"] = m["keys_aug"][:, :self.hidden_size]
        m |= {"owner": self._owner, "slot": self._slot, "group": group[self._owner], "n_slots": n_slots}
        m = {k: v.to(device) for k, v in m.items()}
        self._cache = {k: v for k, v in self._cache.items() if v[0] == self.version}
        self._cache[key] = (self.version, m)
        return m

    # ---------------------------------------------------------------- saving

    def _tensors(self) -> dict:
        """keys, reach, owners, slots, deltas, mu, C."""
        return {"keys": self._keys, "reach": self._reach, "owner": self._owner, "slot": self._slot,
                "deltas": self._deltas, "mu": self.stats.mean, "cov": self.stats.cov}

    def _header(self) -> dict:
        return {
            "hyper": {"alpha": float(self.alpha), "margin": float(self.margin), "inner": float(self.inner),
                      "complete": self.complete, "write": self.write,
                      "n_states": self.n_states, "values": self.values, "object_keys": self.object_keys,
                      "target": self.target, "seed": self.seed,
                      "batch_size": self.batch_size, "calibration_seed": self.calibration_seed},
            "stats": {"n_tokens": self.stats.n_tokens, "shrinkage": self.stats.shrinkage},
            "facts": [_fact_to_dict(f) for f in self._facts],
            "sources": self.sources,
            **left_out_header(self),
        }

    @classmethod
    def _restore(cls, path, meta: dict, tensors: dict, backbone, calibration=None) -> "CodebookMemory":
        """`calibration` is needed only to insert more facts later."""
        try:
            coord, hyper, st = Coordinate.of(meta["coordinate"]), dict(meta["hyper"]), meta["stats"]
            stats = ResidualStats(coord.layer, coord.point, tensors["mu"], tensors["cov"], st["n_tokens"],
                                  st["shrinkage"])
            mem = cls(backbone, coord, background=stats, calibration=calibration, **hyper)
            facts = [_fact_from_dict(d) for d in meta["facts"]]
            keys, reach, owner, deltas = tensors["keys"], tensors["reach"], tensors["owner"], tensors["deltas"]
            slot = tensors["slot"]
        except (KeyError, TypeError, ValueError) as e:
            raise TimeromeError(f"{path} has incomplete metadata ({type(e).__name__}: {e})") from None
        H = mem.hidden_size
        ok = (keys.shape == (len(reach), H) and owner.shape == slot.shape == (len(reach),)
              and deltas.shape == (len(facts), H)
              and (not len(owner) or 0 <= int(owner.min()) <= int(owner.max()) < len(facts)))
        if not ok:
            raise TimeromeError(f"{path} is inconsistent: {len(facts)} facts, tensors of shapes {tuple(keys.shape)}, "
                                f"{tuple(reach.shape)}, {tuple(owner.shape)}, {tuple(deltas.shape)}")
        check_slots(path, slot, backbone)
        if len(reach) and not bool((reach > 0).all()):
            raise TimeromeError(f"{path} is inconsistent: {int((reach <= 0).sum())} of its entries have a radius <= 0, "
                                "which a saved codebook never holds (was it edited?)")
        mem._keys, mem._reach, mem._owner, mem._slot, mem._deltas = keys, reach, owner.long(), slot.long(), deltas
        mem._facts, mem._ids = facts, [fact_id(f) for f in facts]
        mem.sources, mem.calibration_left_out = read_sources(meta, path), read_left_out(meta, path)
        mem.version += 1
        return mem

    # ---------------------------------------------------------------- checks

    @property
    def calibration_states(self) -> int:
        """States per calibration row (the codebook's CALIBRATION_STATES; the rewrite memory reads its
        calibration on as many states as its keys)."""
        return CALIBRATION_STATES

    def _calibration(self, calibration) -> torch.Tensor:
        """Whitened calibration tokens [N, H] float32 from rows / texts or their raw residuals. Rows are
        read with the recipe the methods build a memory with (`calibration_residuals`, cached), so the
        radii of facts inserted into a saved memory are measured as its build measured its own; a
        `CalibrationSubset` as the states of its whole list hold them, its rows left out dropped."""
        if isinstance(calibration, torch.Tensor):
            h = _as_rows(calibration, "calibration residuals", self.hidden_size)
        else:
            texts = list(calibration)
            if not texts:
                raise TimeromeError("the calibration corpus is empty: give the retain rows or texts")
            subset = isinstance(calibration, CalibrationSubset)
            h = calibration_residuals(self.backbone, self.coordinate, calibration.whole if subset else texts,
                                      n_states=self.calibration_states, seed=self.calibration_seed, pads=self.pads,
                                      last_pads=self.last_pads, without=calibration.without if subset else ())
        return self.whiten(h).float()

    def _check_hyper(self):
        if not isinstance(self.complete, bool):
            raise TimeromeError(f"complete must be true or false, got {self.complete!r}")
        if self.write not in WRITES:
            raise TimeromeError(f"write must be one of {', '.join(WRITES)}, got {self.write!r}")
        for name, v in (("alpha", self.alpha), ("margin", self.margin), ("inner", self.inner)):
            if isinstance(v, bool) or not (isinstance(v, numbers.Real) and math.isfinite(v)):
                raise TimeromeError(f"{name} must be a finite number, got {v!r}")
        number(self.alpha, "alpha", lo=0)  # as the methods and the CLI refuse it
        if self.margin <= 0:
            raise TimeromeError(f"margin (the radius over the distance to the nearest calibration token) must be > 0, "
                                f"got {self.margin!r}")
        if not 0 <= self.inner < 1:
            raise TimeromeError(f"inner (the full-strength part of the radius) must lie in [0, 1), got {self.inner!r}")

    def _check_ready(self):
        self._check_hyper()
        if len(self) == 0:
            raise TimeromeError("the codebook memory is empty: add facts before applying it")

    def scale_probe(self) -> torch.Tensor | None:
        return self._keys

    def scale_state(self) -> tuple:
        return self.alpha, self.margin, self.inner, self.complete, self.write, self.version



def calibration_residuals(backbone, coordinate, rows, *, n_states: int = CALIBRATION_STATES, seed: int = 0,
                          pads=None, last_pads=None, without=()) -> torch.Tensor:
    """Residuals [N, H] of the calibration rows' states at the coordinate (`token_keys.state_tokens`;
    pads: end-of-text after the answers, last_pads: also the last-step states with these end-of-text
    counts), cached on disk by their inputs: the radii of a codebook or rewrite memory are measured
    against these, whether a method builds the memory or `memory add` inserts into a saved one.
    without: indices of rows whose tokens are dropped from the result (`token_keys.state_token_rows`),
    the cache still holding every row's."""
    site, rows = Coordinate.of(coordinate).site, list(rows)
    if without:
        h = calibration_residuals(backbone, coordinate, rows, n_states=n_states, seed=seed, pads=pads,
                                  last_pads=last_pads)
        owner = state_token_rows(backbone, rows, n_states=n_states, pads=pads, last_steps=last_pads or False)
        return h[~torch.isin(owner, torch.tensor(sorted(without), dtype=torch.long))]

    def make():
        return {"h": state_tokens(backbone, site, rows, n_states=n_states, seed=seed, pads=pads,
                                  last_steps=last_pads or False, progress="calibration residuals")}

    key = dict(kind="codebook-calibration", model=backbone.cache_id(), site=site, rows=rows,
               n_states=n_states, seed=seed, **({"pads": list(pads), "last_pads": list(last_pads or [])} if pads else {}))
    return cached_tensors("calibration", key, make)["h"]


class CalibrationSubset(list):
    """Calibration rows given as the rows of `whole` less those at the indices `without`: a memory reads
    their residuals as the states of `whole` hold them (its cache, `calibration_residuals`), dropping
    the tokens of the rows left out. `memory add` gives one: the rows its build read (cached), less
    every row stating a fact the memory holds, so an add draws no calibration state again. As a list
    it holds the rows kept (what the rewrite memory's answer watch and token values read)."""

    def __init__(self, whole, without=()):
        whole = list(whole)
        out = sorted({int(i) for i in without})
        if out and not 0 <= out[0] <= out[-1] < len(whole):
            raise TimeromeError(f"CalibrationSubset: row indices must lie in [0, {len(whole)}), got {out[0]}..{out[-1]}")
        gone = set(out)
        super().__init__(r for i, r in enumerate(whole) if i not in gone)
        self.whole, self.without = whole, tuple(out)


def left_out_header(memory) -> dict:
    """The header entry of a memory's `calibration_left_out` ({} when it has none)."""
    out = memory.calibration_left_out
    return {} if out is None else {"calibration_left_out": sorted({int(i) for i in out})}


def check_slots(path, slot: torch.Tensor, backbone) -> None:
    """A saved file's entry slots (which subject token each entry keys; -1: none) lie in the context: one that
    does not gave no update at all (-5) or asked for terabytes (1e11)."""
    if len(slot) and not (-1 <= int(slot.min()) and int(slot.max()) < backbone.max_length):
        raise TimeromeError(f"{path} is inconsistent: its 'slot' values (which subject token each entry keys; -1: "
                            f"none) must lie in -1..{backbone.max_length - 1}, got {int(slot.min())}.."
                            f"{int(slot.max())} (was it edited?)")


def read_left_out(meta: dict, path) -> list[int] | None:
    """The indices of the calibration source's rows a memory file's build left out (since stop 55;
    None where it does not say), else one TimeromeError."""
    out = meta.get("calibration_left_out")
    if out is None:
        return None
    if not (isinstance(out, list) and all(is_int(i) and i >= 0 for i in out)
            and out == sorted(set(out))):
        raise TimeromeError(f"{path} is inconsistent: its 'calibration_left_out' must be ascending row indices, "
                            f"got {out!r:.200}")
    return out


ROW_BLOCK = 64  # rows per matrix product in rowwise_matmul


def rowwise_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, H] @ w [H, K], each row's result independent of the other rows: every product is made
    on a zero-padded block of ROW_BLOCK rows, so BLAS always runs the same kernel with the same
    blocking (a plain x @ w rounds a row differently depending on how many rows come with it)."""
    out = []
    for s in range(0, len(x), ROW_BLOCK):
        part = x[s:s + ROW_BLOCK]
        block = part.new_zeros(ROW_BLOCK, x.shape[1])
        block[:len(part)] = part
        out.append((block @ w)[:len(part)])
    return torch.cat(out) if out else x.new_zeros(0, w.shape[1])


def nearest_distance(z: torch.Tensor, points: torch.Tensor, *, block: int = _CHUNK, queries: int = 512) -> torch.Tensor:
    """[N] float64 distance from each row of z [N, H] to its nearest row of points [M, H]: the least of
    the float64 distances sqrt(sum((z - p)^2)) over every point, bit for bit the same whatever rows z
    holds besides.

    A screen finds the points that can be nearest (`_candidates`: one matrix product per block of
    points, in float32, or in float64 where torch is set to round float32 products lower), and each
    of those is measured in float64. The screen's rounding depends on the shapes of its products; the
    points it keeps never miss the nearest. Queries go `queries` rows at a time against blocks of about
    `block` / `queries` points (a block of scores stays under `block` elements). Before stop 55 a
    cdist proposed 8 candidates per row, 4 times slower (`benchmarks/bench_edit_memory.py --parts reach`)
    and wrong where more than 8 points were as near as its float32 rounding (`tests/memory/
    test_codebook_memory.py`)."""
    if not len(points):
        raise TimeromeError("there is no calibration token to measure a radius against")
    if not (bool(torch.isfinite(z).all()) and bool(torch.isfinite(points).all())):
        raise TimeromeError("a radius cannot be measured from keys or calibration tokens that are NaN/inf")
    pts = points.to(z.device, torch.float32)
    norms, dt = _squared_norms(pts), torch.float64 if _reduced_float32_products(z.device) else torch.float32
    out = torch.empty(len(z), dtype=torch.float64, device=z.device)
    pairs = max(1, block // max(1, z.shape[1]))
    for a in range(0, len(z), queries):
        zq = z[a:a + queries].double()
        r, c = _candidates(zq, pts, block, norms, dt)
        best = torch.full((len(zq),), math.inf, dtype=torch.float64, device=z.device)
        for k in range(0, len(r), pairs):  # the float64 distances, `block` elements at a time
            rr, cc = r[k:k + pairs], c[k:k + pairs]
            best.scatter_reduce_(0, rr, (zq[rr] - pts[cc].double()).pow(2).sum(-1).sqrt(), "amin")
        out[a:a + len(zq)] = best
    return out


def _squared_norms(pts: torch.Tensor, rows: int = 1 << 16) -> torch.Tensor:
    """[M] float64 |p|^2 of each row of pts, `rows` rows at a time (no float64 copy of them all)."""
    return torch.cat([p.double().pow(2).sum(1) for p in pts.split(rows)]) if len(pts) else pts.new_zeros(0).double()


def _candidates(z: torch.Tensor, pts: torch.Tensor, block: int, norms: torch.Tensor | None = None,
                dt: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, point) pairs holding every point that can be nearest to each row of z [Q, H] (float64)
    among pts [M, H] (float32): a screen of the scores A(p) = c |p|^2 - 2 z.p, c = 1 - 2 k gamma, by
    one matrix product per block of points in the screen's dtype (float32; float64 where torch rounds
    float32 products lower, `_reduced_float32_products`). With E(p) = gamma (|p|^2 + 2 |z| |p|) <=
    gamma (2 |p|^2 + |z|^2) bounding the rounding of a score (a dot product of H terms: gamma = (H + 4) u
    / (1 - (H + 4) u), u the dtype's unit roundoff, covering the norms, the product, the sum and z's own
    rounding), each score gives a lower bound of the squared distance less |z|^2, s(p) >= A(p) - k gamma
    |z|^2, and the least score an upper bound of the least s, s(p*) <= A(p*) + (2 k + 2) gamma (|p*|^2 +
    |z|^2); a point whose lower bound exceeds that is not nearest. k = 4: a margin of 4 on the bound.
    norms: `_squared_norms(pts)`, dt: the screen's dtype (None: found here)."""
    if dt is None:
        dt = torch.float64 if _reduced_float32_products(z.device) else torch.float32
    norms = _squared_norms(pts) if norms is None else norms
    unit = 2.0 ** (-53 if dt == torch.float64 else -24)
    gamma = (z.shape[1] + 4) * unit / (1 - (z.shape[1] + 4) * unit)
    k = 4.0
    bias = ((1 - 2 * k * gamma) * norms).to(dt)
    zz = z.pow(2).sum(1)
    zs = z.to(dt)
    step = max(1, block // max(1, len(z)))
    upper = torch.full((len(z),), math.inf, dtype=torch.float64, device=z.device)
    rows, cols, vals = [], [], []
    for b in range(0, len(pts), step):
        A = torch.addmm(bias[b:b + step], zs, pts[b:b + step].to(dt).T, alpha=-2)
        least, at = A.min(1)
        upper = torch.minimum(upper, least.double() + (2 * k + 2) * gamma * (norms[b:b + step][at] + zz))
        r, c = (A <= _at_least(upper + k * gamma * zz, dt)[:, None]).nonzero(as_tuple=True)
        rows.append(r), cols.append(c + b), vals.append(A[r, c].double())
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    keep = v - k * gamma * zz[r] <= upper[r]  # those a block's upper bound kept that the final one rules out
    return r[keep], c[keep]


def _at_least(x: torch.Tensor, dt) -> torch.Tensor:
    """x (float64) in dtype dt, rounded up: the least value of dt >= x."""
    y = x.to(dt)
    return torch.where(y.double() < x, torch.nextafter(y, torch.full_like(y, math.inf)), y)


def _reduced_float32_products(device) -> bool:
    """Whether torch may compute float32 matrix products on `device` with fewer bits (TF32, bfloat16:
    `torch.backends.*.fp32_precision`, `torch.set_float32_matmul_precision`), which the screen's bound
    does not cover; a setting that cannot be read counts as reduced."""
    backends, cuda = torch.backends, torch.device(device).type == "cuda"
    matmul = backends.cuda.matmul if cuda else getattr(getattr(backends, "mkldnn", None), "matmul", None)
    named = [getattr(backends, "fp32_precision", None), getattr(matmul, "fp32_precision", None)]
    if any(n not in (None, "none", "ieee") for n in named) or (cuda and backends.cuda.matmul.allow_tf32):
        return True
    try:
        return torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:  # torch refuses to say where the legacy and the new settings were mixed
        return True


def _n_sequences(h: torch.Tensor) -> int:
    """How many sequences h [..., L, H] holds (1 for a single token [H] or a single sequence [L, H])."""
    return max(1, h.numel() // (h.shape[-1] * h.shape[-2])) if h.dim() >= 3 else 1


def keys_half(keys: torch.Tensor) -> torch.Tensor:
    """[E, H + 2] = [k, 1, |k|^2]: the keys' half of torch.cdist's distance product (`_distances`)."""
    n = keys.pow(2).sum(-1, keepdim=True)
    return torch.cat([keys, torch.ones_like(n), n], -1)


def _distances(z: torch.Tensor, m: dict) -> torch.Tensor:
    """torch.cdist(z, keys) [N, E], bit for bit (tested on the CPU), the hook's Euclidean distances. For
    more than 25 keys cdist forms one product of augmented rows, [-2z, |z|^2, 1] . [k, 1, |k|^2], and
    builds the keys' half at every call: on the few tokens of a generation's forward most of its time.
    Here that half is built once per memory version (`_matrices`: "keys_aug", `keys_half`) and the
    product is the same (in place where no gradient is asked for)."""
    aug = m.get("keys_aug")
    if aug is None:  # 25 keys or fewer: cdist's own choice between its pairwise and product paths
        return torch.cdist(z, m["keys"])
    n = z.pow(2).sum(-1, keepdim=True)
    d = torch.cat([z.mul(-2), n, torch.ones_like(n)], -1).matmul(aug.mT)
    return d.clamp_min(0).sqrt() if d.requires_grad else d.clamp_min_(0).sqrt_()


def _spread_over_sequences(g: torch.Tensor, e: torch.Tensor, n_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token of a sequence gets the sequence's largest gate and that token's entry."""
    G, E = g.view(n_seq, -1), e.view(n_seq, -1)
    best = G.argmax(1, keepdim=True)
    return G.gather(1, best).expand_as(G).reshape(-1), E.gather(1, best).expand_as(E).reshape(-1)


SOURCES = ("calibration", "value_rows")


def read_sources(meta: dict, path) -> dict:
    """The row sources a memory file records (`CodebookMemory.sources`; {} in a file from before they
    were recorded), each `data.rows.row_source`: {"rows": spec, "digest": text[, "tofu_dir": folder]};
    anything else is one TimeromeError."""
    sources = meta.get("sources") or {}
    ok = isinstance(sources, dict) and set(sources) <= set(SOURCES) and all(
        isinstance(v, dict) and {"rows", "digest"} <= set(v) <= {"rows", "digest", "tofu_dir"}
        and all(isinstance(x, str) and x for x in v.values()) for v in sources.values())
    if not ok:
        raise TimeromeError(f"{path} is inconsistent: its 'sources' must map {' / '.join(SOURCES)} to "
                            f"{{\"rows\": ..., \"digest\": ...[, \"tofu_dir\": ...]}}, got {sources!r:.200}")
    return {k: dict(v) for k, v in sources.items()}

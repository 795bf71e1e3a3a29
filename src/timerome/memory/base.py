"""What every edit memory shares: the file, the switch, the model it belongs to; each memory keeps only
what differs (its keys, its gate and its alpha line: `update` / `_edits`).

    the file     `save(path)`: one safetensors file, the tensors of `_tensors()` and a JSON header (format,
                 the model's fingerprint, hidden size, coordinate, then `_header()`: hyper-parameters,
                 facts, ..., and the tensors' checksum). `Memory.load(path, backbone, **options)`: the file
                 read and checked (`read_file`: format, checksum, header types, the tensors its format
                 registered), checked against the model (`check_for_model`), then `_restore`d. A memory
                 class registers its format(s) and their tensors by being defined (`KINDS`);
                 `memory_file.load_memory` finds the class of any saved file from its header.
    the switch   `applied(backbone, state)`: the model and the memory checked, what the hook reads built
                 now (`_prepare`: nothing fails mid-forward), `_edits()` installed with `Hooks` for the
                 `with` block; leaving the block is the undo. The one way to switch an edit on.
    the model    `_bind` sets the backbone, coordinate, hidden size and fingerprint once.

The fact and file helpers every memory uses live here too: a fact's content (`fact_content`,
`sort_new_facts`, `check_new_facts`), facts in a header, the checksum.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from timerome.common.cache import read_tensors, save_tensors, tensors_digest
from timerome.common.checks import big_int_path, finite_tensor, integer, is_token_ids, repeated, shown
from timerome.common.files import input_file, parse_json, path_arg
from timerome.data.facts import Fact, fact_field, target_conflict
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import fact_fields, fact_id, start_change
from timerome.backbones.backbone import model_arg
from timerome.engine.hooks import Hooks, TraceState, once_on
from timerome.errors import TimeromeError
from timerome.memory.scale import check_on_keys

# format -> the memory class that writes it (older formats it reads too); filled as each class is defined
KINDS: dict[str, type] = {}


# what a fingerprint mismatch may mean besides another checkpoint
OTHER_MODEL = ("; a fingerprint is of the weights as loaded, so the same checkpoint in another dtype counts as "
               "another model: load it as the memory was built (e.g. the same --dtype), or build the memory again")


def id_list(fact_ids) -> list[str]:
    """The ids a memory's `remove` takes: one id, or an iterable of them (each as a string)."""
    if isinstance(fact_ids, str):
        return [fact_ids]
    if fact_ids is None or isinstance(fact_ids, (bytes, dict)) or not hasattr(fact_ids, "__iter__"):
        raise TimeromeError(f"fact_ids must be a fact id or a list of them, got {shown(fact_ids)}")
    return [str(i) for i in fact_ids]


class Memory:
    """The base of every saved edit memory (see the module docstring). A subclass sets FORMAT (and
    OLD_FORMATS it still reads), KIND, WHAT (its name in messages), SCHEMA (its tensors: name ->
    (dtype, dimensions, required)), LOAD_OPTIONS (what `load` passes on to `_restore`), OVERRIDABLE
    (the settings a user may change on a loaded memory), and implements `_tensors`, `_header`,
    `_restore`, `_check_ready` and `_edits` (with `_prepare` when its hook reads prepared matrices)."""

    FORMAT = ""
    OLD_FORMATS: tuple = ()
    KIND = ""
    WHAT = "edit memory"
    SCHEMA: dict | None = None
    LOAD_OPTIONS: tuple = ()
    OVERRIDABLE: tuple = ("alpha",)
    READS_IDS = False  # its hooks read the token ids of each forward (Hooks(ids=True))
    SITE = "coordinate"  # what `timerome memory show` calls the place its hook reads

    @classmethod
    def described(cls, meta: dict, path) -> dict:
        """What a file of this kind holds beyond every memory's fields (`timerome memory show --json`), read
        from its header; a value the header gets wrong is one TimeromeError."""
        return dict(watch=False, sources={}, calibration_left_out=None)

    @classmethod
    def shown(cls, d: dict) -> list[tuple[str, str]]:
        """The (field, value) rows `timerome memory show` prints for this kind, from `described`'s and every
        memory's fields (d: the description: hyper, tensors, stats, site, sources, ...)."""
        return [("alpha", f"{d['hyper'].get('alpha')}")]

    @staticmethod
    def _background(d: dict) -> str:
        """' (N background tokens)': how many tokens its whitening statistics were read on, where it has them."""
        return f" ({d['stats']['n_tokens']} background tokens)" if d.get("stats") else ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        own = cls.__dict__
        if own.get("FORMAT"):
            formats = (own["FORMAT"], *own.get("OLD_FORMATS", ()))
            for fmt in formats:
                KINDS[fmt] = cls
            if own.get("SCHEMA") is not None:
                register_tensors(formats, own["SCHEMA"])

    @classmethod
    def formats(cls) -> tuple:
        return (cls.FORMAT, *cls.OLD_FORMATS)

    def _bind(self, backbone, coordinate: Coordinate) -> None:
        """The model and the place this memory belongs to, set once."""
        self.backbone = model_arg(backbone, f"{type(self).__name__}'s backbone")
        self.coordinate = coordinate.on(backbone)
        self.hidden_size = backbone.hidden_size
        self.fingerprint = backbone.fingerprint()
        self.causal = bool(getattr(backbone, "causal", False))  # the attention its keys were read under
        self.prompt_start = list(getattr(backbone, "prompt_start", []))  # the ids its prompts began with

    def _rows(self, h: torch.Tensor) -> torch.Tensor:
        """Residuals h [..., H] as rows [N, H] in the arithmetic of every memory's hook (`math_dtype`)."""
        return h.reshape(-1, self.hidden_size).to(math_dtype(h))

    # ---------------------------------------------------------------- the switch

    @contextmanager
    def applied(self, backbone, state: TraceState | None = None):
        """Install the edit on `backbone` for the `with` block; always removed after it (the undo).

        Yields the TraceState (a coordinate's step k* is set in it by every trajectory: `generate`,
        `tie.run_trajectory`; `hooks.denoising_steps`).
        """
        model_arg(backbone, "applied's backbone")
        self._check_backbone(backbone)
        self._check_ready()
        self._prepare(backbone)
        check_on_keys(self, backbone, f"this {self.WHAT}")  # an alpha that overflows the model: refused, not read
        with once_on(self, backbone), Hooks(backbone, edit=self._edits(), state=state, ids=self.READS_IDS) as hooks:
            yield hooks.state

    def _prepare(self, backbone) -> None:
        """Build what the hook reads on the backbone's device now, so nothing fails mid-forward."""

    def _edits(self) -> dict:
        """{site: fn(h, state)} the hooks install (h replaced by what fn returns, unchanged by None)."""
        return {self.coordinate: lambda h, _state: self.update(h)}

    def _check_backbone(self, backbone) -> None:
        if backbone.hidden_size != self.hidden_size or backbone.fingerprint() != self.fingerprint:
            raise TimeromeError(f"this {self.WHAT} was built for another model "
                                f"(fingerprint {self.fingerprint}, this one {backbone.fingerprint()}){OTHER_MODEL}")
        refuse_other_attention(f"this {self.WHAT}", self.causal, backbone)

    def _check_ready(self) -> None:
        raise NotImplementedError

    def scale_probe(self) -> torch.Tensor | None:
        """Its keys [n, H], where the update acts most (scale.py checks the update there), or None where the
        update is bounded by construction."""
        raise NotImplementedError

    def scale_state(self) -> tuple:
        """What the update's scale depends on, so a check passed is not repeated (scale.py)."""
        raise NotImplementedError

    def _check_unapplied(self, instead: str) -> None:
        """Refuse to change the facts while this memory edits its model (inside `applied`): what its hooks
        prepared, and what they remember of the tokens seen, is the memory before the change."""
        if id(self.backbone) in self.__dict__.get("_applied_on", ()):
            raise TimeromeError(f"this {self.WHAT} is applied to its model (inside its `applied` block): {instead}")

    def _check_off(self) -> None:
        """Refuse to read new facts' states while this memory edits its model: they would be the edited
        model's (`add`); or where its keys were read from prompts of another sequence start (a file saved
        before prompts began with the tokenizer's start): one memory would hold keys of two readings."""
        self._check_unapplied("add facts outside it, where the states read are the unedited model's")
        now = getattr(self.backbone, "prompt_start", [])
        change = start_change(getattr(self, "prompt_start", now), now)
        if change:
            raise TimeromeError(f"this {self.WHAT}'s keys were read from {change}: new facts would be read "
                                "otherwise; build the memory again")

    # ---------------------------------------------------------------- the file

    def save(self, path) -> Path:
        """One safetensors file: `_tensors()` and a JSON header (see the module docstring). An empty memory
        is refused (it edits nothing, and applying it is refused), as `timerome memory remove` refuses one."""
        path = path_arg(path, f"{self.WHAT}.save's path")
        if len(self) == 0:
            raise TimeromeError(f"this {self.WHAT} is empty: an empty memory edits nothing; add facts before saving it")
        tensors = {k: v.contiguous() for k, v in self._tensors().items()}
        meta = {"format": self.FORMAT, "fingerprint": self.fingerprint, "backbone": getattr(self.backbone, "name", ""),
                "hidden_size": self.hidden_size, "coordinate": self.coordinate.as_dict(), "causal": self.causal,
                "checkpoint": checkpoint_of(self.backbone), "prompt_start": self.prompt_start,
                **self._header(),
                "sha256": tensors_digest(tensors)}
        return save_tensors(path, tensors, metadata={"timerome": json.dumps(meta)})

    @classmethod
    def load(cls, path, backbone, **options):
        """Read a saved memory for `backbone`; another model's file or a damaged one raises. options:
        the class's LOAD_OPTIONS (a codebook's calibration rows, ...), needed only to insert facts later."""
        path = path_arg(path, f"{cls.WHAT}.load's path")
        unknown = sorted(set(options) - set(cls.LOAD_OPTIONS))
        if unknown:
            raise TimeromeError(f"{a_of(cls.WHAT)} takes no load option {', '.join(unknown)}")
        tensors, meta = read_file(path, formats=cls.formats(), what=cls.WHAT)
        check_for_model(path, meta, backbone)
        memory = cls._restore(path, meta, tensors, backbone, **options)
        twice = repeated(memory.fact_ids)  # `remove` of that id would remove them all; `add` never writes two
        if twice:
            raise TimeromeError(f"{path} is inconsistent: fact id {twice[0]!r} is held by "
                                f"{memory.fact_ids.count(twice[0])} facts (was it edited?)")
        memory.prompt_start = list(meta.get("prompt_start", []))  # what its keys were read with (check_for_model)
        return memory

    def _tensors(self) -> dict:
        raise NotImplementedError

    def _header(self) -> dict:
        """The header's fields after the coordinate, in their order (hyper-parameters, facts, ...)."""
        raise NotImplementedError

    @classmethod
    def _restore(cls, path, meta: dict, tensors: dict, backbone, **options):
        raise NotImplementedError


def math_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype a memory computes its update in for residuals h: float64 for float64, float32 for any
    other (a bfloat16 or float16 model's hook scores in float32, then hands back h's dtype)."""
    return torch.float64 if h.dtype == torch.float64 else torch.float32


def facts_to_header(facts) -> list[dict]:
    return [_fact_to_dict(f) for f in facts]


def _as_rows(x, what: str, H: int) -> torch.Tensor:
    t = torch.as_tensor(x).detach().to("cpu", torch.float64)
    if t.dim() == 1:
        t = t[None]
    if t.dim() != 2 or t.shape[1] != H:
        raise TimeromeError(f"{what} must be [facts, {H}], got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise TimeromeError(f"{what} hold non-finite values (NaN or infinity)")
    return t


def fact_content(fact, target: str):
    """What a fact is, which decides whether a memory holds it: (subject, prompt, object, target), the
    target being the fact's own or else the memory's `target`; None for a bare id (a vector-only
    entry, known by its id alone). Never its id or row number: two files number their rows alike."""
    if isinstance(fact, str):
        return None
    return (fact_field(fact, "subject"), fact_field(fact, "prompt"), fact_field(fact, "object"),
            fact_field(fact, "target") or target)


def sort_new_facts(held, new, target: str) -> tuple[list, list[tuple[str, str]], list[tuple[str, str]], list[int]]:
    """(facts to add, [(fact id, why it is skipped)], [(old id, new id)], their indices in `new`) for
    adding `new` to a memory holding `held`. A fact whose content (`fact_content`: subject, question,
    answer, target) a held fact or an earlier new one has is skipped, naming which; a new fact whose
    id another fact has is added as ID#digest-of-its-content (a rows file without fact_id numbers its
    rows 0, 1, ... like every other file). Two facts that ask one question with different targets
    are refused (`target_conflict`): either choice would be a guess."""
    conflict = target_conflict(new, target, held)
    if conflict:
        raise TimeromeError(conflict)
    have = {fact_content(f, target): (fact_id(f), True) for f in held if fact_content(f, target) is not None}
    taken = {fact_id(f) for f in held}
    add, skipped, renamed, kept = [], [], [], []
    for i, f in enumerate(new):
        key, fid = fact_content(f, target), fact_id(f)
        if key is not None and key in have:
            same, held_one = have[key]
            skipped.append((fid, ("already in the memory" + ("" if same == fid else f" as fact {same!r}")
                                  if held_one else f"repeats fact {same!r} given before it")))
            continue
        if fid in taken:
            if key is None:
                skipped.append((fid, "a fact with this id is already in the memory"))
                continue
            new_id = f"{fid}#{hashlib.sha1(repr(key).encode()).hexdigest()[:8]}"
            renamed.append((fid, new_id))
            f = (dataclasses.replace(f, fact_id=new_id) if dataclasses.is_dataclass(f)
                 else dict(f, fact_id=new_id) if isinstance(f, dict)
                 else Fact(*key[:3], target=getattr(f, "target", None), fact_id=new_id))
            fid = new_id
        if key is not None:
            have[key] = (fid, False)
        taken.add(fid)
        add.append(f)
        kept.append(i)
    return add, skipped, renamed, kept


def check_new_facts(held, new, target: str) -> None:
    """Refuse facts a memory holding `held` cannot take as they are: one whose content it already
    holds (under any id), one repeated among `new`, one whose id another fact has (name it anew, or
    use `sort_new_facts`, which skips and renames)."""
    _, skipped, renamed, _ = sort_new_facts(held, new, target)
    if skipped:
        fid, why = skipped[0]
        more = f" (and {len(skipped) - 1} more facts)" if len(skipped) > 1 else ""
        raise TimeromeError(f"fact {fid!r}: {why} (same subject, question, answer and target){more}; give each "
                            "fact once")
    if renamed:
        fid = renamed[0][0]
        raise TimeromeError(f"fact id {fid!r} is taken by another fact (different subject, question, answer or "
                            "target); give the new fact another fact_id")


def _fact_to_dict(f) -> dict:
    if isinstance(f, str):
        return {"fact_id": f}
    if isinstance(f, dict):  # a fact given as a dict: its Fact fields (another key would not load)
        _, subject, prompt, obj, target = fact_fields(f)
        d = dict(subject=subject, prompt=prompt, object=obj, target=target)
    else:
        d = dataclasses.asdict(f) if dataclasses.is_dataclass(f) else dict(vars(f))
    d["fact_id"] = fact_id(f)
    return d


def _fact_from_dict(d: dict):
    if set(d) == {"fact_id"}:
        return d["fact_id"]  # a vector-only entry (added with add_vectors and an id)
    try:
        return Fact(**d)
    except TypeError as e:
        raise TimeromeError(f"a stored fact does not fit timerome.data.facts.Fact: {e}") from None


# What a memory file of each format holds: tensor name -> (dtype, number of dimensions, required).
# Each memory kind registers its own (`register_tensors`); `read_file` checks every file against it.
TENSORS: dict[str, dict[str, tuple[torch.dtype, int, bool]]] = {}
# a format nobody registered: what timerome writes at all (float64 values, int64 indices)
WRITTEN_DTYPES = (torch.float64, torch.int64)


def register_tensors(formats, schema: dict) -> None:
    """Declare the tensors of memory files in `formats`: {name: (dtype, ndim, required)}."""
    for fmt in (formats,) if isinstance(formats, str) else formats:
        TENSORS[fmt] = dict(schema)


def read_file(path, formats=None, what: str = "edit memory") -> tuple[dict, dict]:
    """(tensors, metadata) of a memory file (`what`, in one of `formats`), checked before anything uses
    it: its format and checksum; its header (a JSON object with the fields every memory has, of
    their types, no NaN, no integer beyond 64 bits: `check_header`); its tensors (the names, dtypes
    and dimensions its format registered, every value finite)."""
    formats = tuple(formats) if formats is not None else tuple(KINDS)
    a_what = a_of(what)
    if Path(path).is_dir() and (Path(path) / "config.json").is_file():
        raise TimeromeError(f"{path} is a model folder (a method that changes weights saves one), not {a_what} "
                            "file: pass it as the model, -m / --model")
    p = input_file(path, f"{what} file")
    try:
        tensors, header = read_tensors(p)  # in one piece: a concurrent `memory add` renames its file into place
    except Exception as e:  # noqa: BLE001 - safetensors raises several types on a damaged file
        raise TimeromeError(f"{p} is truncated or not {a_what} file ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None
    if "timerome" not in header:
        raise TimeromeError(f"{p} is a safetensors file but not a timerome {what}")
    meta = parse_json(header["timerome"], f"the header of {p}")
    if not isinstance(meta, dict):
        raise TimeromeError(f"the header of {p} is a JSON {_json_kind(meta)}, not the object a timerome {what} "
                            "writes (was it edited by hand?)")
    if meta.get("format") not in formats:
        has = "no format field" if meta.get("format") is None else f"format {shown(meta.get('format'))}"
        raise TimeromeError(f"{p} has {has}; this version reads {formats[0]!r}")
    if tensors_digest(tensors) != meta.get("sha256"):
        raise TimeromeError(f"{p} is corrupt: its tensors do not match the checksum written with them")
    check_header(meta, p)
    check_tensors(tensors, TENSORS.get(meta["format"]), p, what)
    return tensors, meta


def check_header(meta: dict, p) -> None:
    """The fields every memory header has, of their types (one clear error instead of a crash later)."""
    where = big_int_path(meta)
    if where:
        raise TimeromeError(f"the header of {p}: {where} is an integer beyond 64 bits")

    def need(ok: bool, field: str, want: str):
        if not ok:
            raise TimeromeError(f"the header of {p}: {field} must be {want}, got {shown(meta.get(field))} "
                                "(was it edited by hand?)")

    for field in ("fingerprint", "sha256"):
        need(isinstance(meta.get(field), str), field, "a string")
    need(isinstance(meta.get("backbone", ""), str), "backbone", "a string")
    need(isinstance(meta.get("checkpoint", ""), str), "checkpoint", "a string")
    start = meta.get("prompt_start", [])
    need(is_token_ids(start), "prompt_start", "a list of token ids")
    need(isinstance(meta.get("hyper"), dict), "hyper", "an object of hyper-parameters")
    need(meta.get("stats") is None or isinstance(meta.get("stats"), dict), "stats", "null or an object")
    need(isinstance(meta.get("coordinate"), dict), "coordinate", "an object with layer, point and step")
    integer(meta.get("hidden_size"), f"the header of {p}: hidden_size", lo=1)
    Coordinate.of(meta["coordinate"])  # layer an int, a known point, a step
    facts = meta.get("facts")
    need(isinstance(facts, list), "facts", "a list of facts")
    for i, d in enumerate(facts):
        if not isinstance(d, dict) or not isinstance(d.get("fact_id"), str):
            raise TimeromeError(f"the header of {p}: fact {i} must be an object with a string fact_id, got {shown(d)}")
        if set(d) != {"fact_id"}:
            bad = [k for k in ("subject", "prompt", "object") if not isinstance(d.get(k), str)]
            if bad or not (d.get("target") is None or isinstance(d.get("target"), str)):
                raise TimeromeError(f"the header of {p}: fact {i} ({d['fact_id']!r}) needs subject, prompt and "
                                    f"object strings and a string or null target")


def check_tensors(tensors: dict, schema: dict | None, p, what: str) -> None:
    """Each tensor of the file is one its format declares, of its dtype and dimensions, and finite."""
    for name, t in tensors.items():
        if schema is None:
            if t.dtype not in WRITTEN_DTYPES:
                raise TimeromeError(f"{p}: tensor {name} is {str(t.dtype).removeprefix('torch.')}; timerome writes "
                                    "float64 and int64 only (was the file converted?)")
        elif name not in schema:
            raise TimeromeError(f"{p} has a tensor {name!r} that no {what} holds (it holds "
                                f"{', '.join(schema)}): was it edited by hand?")
        else:
            dtype, ndim, _ = schema[name]
            if t.dtype != dtype or t.dim() != ndim:
                raise TimeromeError(f"{p}: tensor {name} is {str(t.dtype).removeprefix('torch.')} with {t.dim()} "
                                    f"dimensions; {a_of(what)} stores it as {str(dtype).removeprefix('torch.')} with "
                                    f"{ndim} (was the file converted or edited?)")
        finite_tensor(t, f"{p}: tensor {name}")
    missing = [n for n, (_, _, required) in (schema or {}).items() if required and n not in tensors]
    if missing:
        raise TimeromeError(f"{p} lacks the tensor(s) {', '.join(missing)} that {a_of(what)} holds")


def checkpoint_of(backbone) -> str:
    """Where the backbone was loaded from, as an absolute path ("" when it was built in Python)."""
    where = (getattr(backbone, "info", None) or {}).get("checkpoint")
    return str(Path(where).resolve()) if where else ""


def refuse_other_attention(what: str, causal: bool, backbone) -> None:
    """The same weights read as the other kind of model (`--family` that makes an MDLM causal, or the
    reverse): the memory's keys are states of the other attention, refused."""
    if bool(getattr(backbone, "causal", False)) != causal:
        kind = lambda c: "an autoregressive (causal)" if c else "a masked diffusion (bidirectional)"  # noqa: E731
        raise TimeromeError(f"{what} was built with the model read as {kind(causal)} model, and this one reads the same "
                            f"weights as {kind(not causal)} model (--family): its keys are states of the other "
                            "attention; build it again on this model")


def check_for_model(path, meta: dict, backbone) -> Coordinate:
    """A memory file's model and coordinate against `backbone`: its fingerprint, hidden size and
    layer (save() writes 0..n-1: -1 or n in a header is a hand edit, never "the top layer")."""
    if not callable(getattr(backbone, "fingerprint", None)):
        raise TimeromeError(f"reading {path} needs the model it was built for (a Backbone: timerome.load_backbone()), "
                            f"got {'None' if backbone is None else 'a ' + type(backbone).__name__}")
    if meta.get("fingerprint") != backbone.fingerprint():
        where = f" at {meta['checkpoint']}" if meta.get("checkpoint") else ""
        raise TimeromeError(
            f"{path} was built for another model ({meta.get('backbone') or 'unnamed'}{where}, fingerprint "
            f"{meta.get('fingerprint')}); this model's fingerprint is {backbone.fingerprint()}{OTHER_MODEL}")
    if "causal" in meta:  # files saved before it was recorded: their fingerprint alone
        refuse_other_attention(str(path), bool(meta["causal"]), backbone)
    change = start_change(meta.get("prompt_start"), getattr(backbone, "prompt_start", []))
    if change:  # a file saved before prompts began with the tokenizer's sequence start has none
        warnings.warn(f"{path}'s keys were read from {change} (the tokenizer's sequence start, as the official "
                      "pipeline feeds it): the memory applies, but its keys come from another context; build it "
                      "again to match", stacklevel=3)
    if meta["hidden_size"] != backbone.hidden_size:
        raise TimeromeError(f"{path}: the memory has hidden size {meta['hidden_size']}, the model "
                            f"{backbone.hidden_size}")
    coord = Coordinate.of(meta["coordinate"])
    if not 0 <= coord.layer < backbone.n_layers:
        raise TimeromeError(f"{path}: the memory's layer {coord.layer} is outside 0..{backbone.n_layers - 1}, the "
                            "layers a saved memory names (was its header edited?)")
    return coord


def a_of(what: str) -> str:
    return ("an " if what[0] in "aeiou" else "a ") + what


def _json_kind(v) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(v), "null")

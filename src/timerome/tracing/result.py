"""TraceResult: the TIE heatmaps of a set of facts, and their file (safetensors + JSON); `TraceFile`,
what it shares with the positional trace's result (facts by index or id, the model check, the file)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from timerome.common.cache import read_tensors, save_tensors, tensors_digest, through_link, timerome_header, write_json
from timerome.common.checks import finite_tensor, integer, is_int, is_token_ids, number, shown
from timerome.common.files import input_file, output_file, path_arg, read_json
from timerome.engine.encoding import start_change
from timerome.engine.settings import TRACE
from timerome.errors import TimeromeError
from timerome.tracing.tie import NOISE_DRAWS, READ_POSITIONS, READOUTS, aggregate, later_steps


class TraceFile:
    """Facts by index or id, the model check and the file (tensors in .safetensors, the rest in the
    .json of the same name) of a trace result; `fact_ids` and `settings` are the subclass's fields."""

    fact_ids: list[str]
    settings: dict

    def fact_index(self, fact: int | str) -> int:
        if isinstance(fact, int) and not isinstance(fact, bool):
            if not -len(self.fact_ids) <= fact < len(self.fact_ids):
                raise TimeromeError(f"fact index {fact} out of range: the trace has {len(self.fact_ids)} facts")
            return fact % len(self.fact_ids)
        if fact not in self.fact_ids:
            raise TimeromeError(f"no fact {fact!r} in this trace (facts: {', '.join(self.fact_ids)})")
        return self.fact_ids.index(fact)

    def check_model(self, backbone, source="this trace") -> None:
        """Refuse a trace made on another model (its weights' fingerprint is in the settings; a
        trace saved before fingerprints were recorded is taken as it is); warn about one traced from
        prompts with another sequence start (`encoding.start_change`)."""
        made_on = self.settings.get("fingerprint")
        if made_on is not None and made_on != backbone.fingerprint():
            raise TimeromeError(f"{source} was traced on another model ({self.settings.get('model')}, fingerprint "
                                f"{made_on}); this model's fingerprint is {backbone.fingerprint()}: trace it first "
                                "(timerome trace --model ...)")
        recorded = self.settings.get("prompt_start")
        if recorded is not None and not is_token_ids(recorded):
            raise TimeromeError(f"{source}: settings.prompt_start must be a list of token ids, got {shown(recorded)} "
                                "(was its JSON edited by hand?)")
        change = start_change(recorded, getattr(backbone, "prompt_start", []))
        if made_on is not None and change:  # a trace saved before prompts began with the tokenizer's start has none
            warnings.warn(f"{source} was traced from {change} (the tokenizer's sequence start, as the official "
                          "pipeline feeds it): its heatmaps and coordinate come from another context; trace again "
                          "to match", stacklevel=3)
        outside = [l for l in getattr(self, "layers", []) if not 0 <= l < backbone.n_layers]
        if outside:
            raise TimeromeError(f"{source} traces layer {outside[0]}, outside this model's 0..{backbone.n_layers - 1} "
                                "(was its JSON edited?)")

    @staticmethod
    def write(path, tensors: dict, meta: dict, kind: str | None = None) -> Path:
        """tensors to PATH (.safetensors), meta to the same name with .json (with its `kind` when given);
        through a link, both beside its target (the pair stays together). Both name one stamp, a hash of
        the tensors (`pair_stamp`): each file is written atomically, but not the two together, and an
        interruption between the writes over an earlier trace left new tensors beside the old JSON. A folder
        is refused (`output_file`): its name with .safetensors and .json was written beside it."""
        output_file(path_arg(path, "the trace's save path"), "the trace file", "trace.safetensors")
        path = through_link(_tensor_path(path))
        stamp = pair_stamp(tensors)
        save_tensors(path, tensors, metadata={"format": "pt", "pair": stamp, **({"kind": kind} if kind else {})})
        write_json(meta_path(path), {**({"kind": kind} if kind else {}), **meta, "pair": stamp})
        return path

    @staticmethod
    def files(path, key: str = "trace") -> dict:
        """{key: PATH.safetensors, key_meta: PATH.json}: the two files a trace saved at path is (what
        `save` returned), named as the commands that write them list them."""
        path = _tensor_path(path)
        return {key: str(path), f"{key}_meta": str(meta_path(path))}

    @staticmethod
    def halves(path, what: str, json_what: str | None = None) -> tuple[Path, Path, object, dict]:
        """(the tensors' path, the JSON's path, the JSON, the tensors) of the trace saved at `path`, known for the
        halves of one save (`refuse_torn_pair`); any unreadable part is one TimeromeError naming `what`."""
        from safetensors import SafetensorError

        path, meta_file = _pair(path_arg(path, f"the {what}'s path"), what)
        meta = read_json(meta_file, json_what or f"the {what}'s JSON")  # strict: no NaN, one clear error
        try:
            tensors, header = read_tensors(path)
        except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
            raise TimeromeError(f"{path} is not a readable {what} ({type(e).__name__}: {str(e)[:120]})") from None
        refuse_torn_pair(header, meta, path, meta_file, what)
        return path, meta_file, meta, tensors

    @staticmethod
    def read(path, what: str, build):
        """build(tensors, meta) of the file at `path`; any unreadable part is one TimeromeError naming `what`."""
        path, _, meta, tensors = TraceFile.halves(path, what)
        try:
            return build(tensors, meta)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TimeromeError(f"{path} is not a readable {what} ({type(e).__name__}: {str(e)[:120]})") from None


@dataclass
class TraceResult(TraceFile):
    """TIE heatmaps of a set of facts (nats). Modules and layers index the middle axes.

    tie            [F, M, Ly, K]        TIE_bar(l, k, m) per fact (the heatmaps)
    tie_full       [F, M, Ly, K, K + 1] TIE(l, k, m, k'); NaN where k' <= k (not defined)
    clean_logp     [F, K + 1]           log p(o | x_k) of the clean run
    corrupted_logp [F, N, K + 1]        the same per noise sample of the corrupted run
    """

    tie: torch.Tensor
    tie_full: torch.Tensor
    clean_logp: torch.Tensor
    corrupted_logp: torch.Tensor
    fact_ids: list[str]
    modules: tuple[str, ...]
    layers: list[int]
    settings: dict
    facts: list[dict] = field(default_factory=list)  # per fact: tokens, subject positions, clean answer
    stats: dict = field(default_factory=dict)        # work done: rows run, batched forwards

    @property
    def steps(self) -> int:
        return self.tie.shape[-1]

    def mean(self) -> torch.Tensor:
        """TIE_bar averaged over facts: [M, Ly, K]."""
        return self.tie.mean(0)

    def only(self, modules) -> "TraceResult":
        """The same result restricted to `modules` (names of the trace's modules, or one name; in their
        order in the trace)."""
        modules = module_names(modules, self.modules, "the trace")
        keep = [i for i, m in enumerate(self.modules) if m in modules]
        return TraceResult(self.tie[:, keep], self.tie_full[:, keep], self.clean_logp, self.corrupted_logp,
                           self.fact_ids, tuple(self.modules[i] for i in keep), self.layers, self.settings,
                           self.facts, self.stats)

    def recorded_neighbours(self, path) -> tuple["TraceResult | None", float]:
        """The neighbour trace and beta this trace's coordinate was selected with (`timerome trace
        --neighbours --beta` saves the neighbours' trace beside it and names it in the settings), so
        that `edit --trace` picks the coordinate the trace printed; (None, 0.0) when none was."""
        name, beta = self.settings.get("neighbours_file"), self.settings.get("beta", TRACE.beta)
        if name is None:
            return None, 0.0
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".safetensors"):
            raise TimeromeError(f"{path}: settings.neighbours_file must be the name of a .safetensors file beside it, "
                                f"got {shown(name)} (was its JSON edited by hand?)")
        number(beta, f"{path}: settings.beta (was its JSON edited by hand?)", lo=0)
        other = through_link(trace_path(path)).parent / name  # beside the trace's file (a link's target)
        if not other.exists():
            raise TimeromeError(f"{path} chose its coordinate with beta {beta:g} against the neighbour facts' trace "
                                f"{other}, which is not there: keep the two together (as `timerome trace` wrote them), "
                                "or trace again")
        neighbours = TraceResult.load(other)
        recorded = self.settings.get("neighbours_pair")  # the stamp of the neighbours' trace it was selected with
        if recorded is not None and recorded != pair_stamp(neighbours.tensors()):
            raise TimeromeError(f"{path} chose its coordinate against another neighbour trace than {other} (a run "
                                "interrupted between writing the two, or a file copied in from another run): trace "
                                "again")
        return neighbours, float(beta)

    # ------------------------------------------------------------------ the file

    def tensors(self) -> dict:
        """The tensors a saved trace holds (its `pair_stamp` is a hash of them)."""
        return dict(tie=self.tie, tie_full=self.tie_full, clean_logp=self.clean_logp, corrupted_logp=self.corrupted_logp)

    def save(self, path: str | Path) -> Path:
        """Tensors to PATH (.safetensors), settings and facts to the same name with .json."""
        return self.write(path, self.tensors(), dict(fact_ids=self.fact_ids, modules=list(self.modules),
                                                     layers=self.layers, settings=self.settings, facts=self.facts,
                                                     stats=self.stats))

    @classmethod
    def load(cls, path: str | Path) -> "TraceResult":
        """Read a saved trace, checked before anything selects from it: its JSON (an object with
        fact_ids, modules, layers and settings of their types, no NaN), its tensors (float32 or
        float64, of the shapes those name, every TIE finite)."""
        path, meta_file, meta, t = cls.halves(path, "trace result", "the trace's JSON")
        if isinstance(meta, dict) and "kind" not in meta and "tie" not in t and "effect" in t:  # not read as TIE's
            raise TimeromeError(f"{meta_file} has no 'kind', and its tensors are a positional trace's (effect, "
                                "clean_p, corrupted_p), whose JSON says \"kind\": \"positional\" (was it edited by "
                                "hand?)")
        fact_ids, modules, layers, settings = _check_meta(meta, meta_file)
        if settings.get("readout") not in (None, *READOUTS):
            raise TimeromeError(f"{meta_file}: settings.readout must be one of {', '.join(READOUTS)}, got "
                                f"{shown(settings.get('readout'))} (was it edited by hand?)")
        _check_tensors(t, len(fact_ids), len(modules), len(layers), settings, path)
        return cls(t["tie"], t["tie_full"], t["clean_logp"], t["corrupted_logp"], fact_ids, tuple(modules), layers,
                   settings, list(meta.get("facts", [])), dict(meta.get("stats", {})))


def module_names(modules, traced, what: str) -> tuple[str, ...]:
    """`modules` (one name, or names) as a tuple, each one of `traced` (a misspelt name was left out, and
    one string was read as its letters or matched as a substring)."""
    modules = (modules,) if isinstance(modules, str) else modules
    if not hasattr(modules, "__iter__") or not modules or not all(isinstance(m, str) for m in modules):
        raise TimeromeError(f"modules must be names of {what}'s modules ({', '.join(traced)}), got {shown(modules)}")
    unknown = [m for m in modules if m not in traced]
    if unknown:
        raise TimeromeError(f"{what} covers modules {', '.join(traced)}, not {', '.join(map(repr, unknown))}")
    return tuple(modules)


def _check_meta(meta, where) -> tuple[list, list, list, dict]:
    from timerome.engine.coordinate import KNOWN_POINTS

    def need(ok: bool, field: str, want: str):
        if not ok:
            got = meta.get(field) if isinstance(meta, dict) else meta
            raise TimeromeError(f"{where}: {field} must be {want}, got {shown(got)} (was it edited by hand?)")

    need(isinstance(meta, dict), "the document", "a JSON object")
    ids, modules, layers, settings = (meta.get(k) for k in ("fact_ids", "modules", "layers", "settings"))
    need(isinstance(ids, list) and bool(ids) and all(isinstance(i, str) for i in ids), "fact_ids", "a list of strings")
    need(isinstance(modules, list) and bool(modules) and len(set(map(str, modules))) == len(modules)
         and all(m in KNOWN_POINTS for m in modules), "modules", f"distinct hook points ({', '.join(KNOWN_POINTS)})")
    need(isinstance(layers, list) and bool(layers) and len(set(map(str, layers))) == len(layers)
         and all(is_int(l) and l >= 0 for l in layers),
         "layers", "a list of distinct layer indices >= 0")
    need(len(set(ids)) == len(ids), "fact_ids", "distinct ids (a fact counted twice weighs twice in the mean)")
    need(isinstance(settings, dict), "settings", "an object")
    facts = meta.get("facts", [])
    need(isinstance(facts, list) and (not facts or len(facts) == len(ids)) and all(isinstance(f, dict) for f in facts),
         "facts", f"a list of the {len(ids)} facts its fact_ids name (each an object)")
    need(isinstance(meta.get("stats", {}), dict), "stats", "an object")
    integer(settings.get("n_samples", 1), f"{where}: settings.n_samples", lo=1)
    integer(settings.get("steps", 1), f"{where}: settings.steps", lo=1)
    number(settings.get("tau", 0.0), f"{where}: settings.tau", lo=0)
    number(settings.get("sigma", 0.0), f"{where}: settings.sigma", lo=0)
    if settings.get("noise", NOISE_DRAWS[0]) not in NOISE_DRAWS:  # absent: a file saved before the choice existed
        raise TimeromeError(f"{where}: settings.noise must be one of {', '.join(NOISE_DRAWS)}, got "
                            f"{shown(settings.get('noise'))} (was it edited by hand?)")
    if settings.get("read_positions", TRACE.read_positions) not in READ_POSITIONS:  # absent: the default
        raise TimeromeError(f"{where}: settings.read_positions must be one of {', '.join(READ_POSITIONS)}, got "
                            f"{shown(settings.get('read_positions'))} (was it edited by hand?)")
    return list(ids), list(modules), list(layers), dict(settings)


def check_stored(t: dict, want: dict, what: str, named: str, where) -> None:
    """The tensors of a saved trace, as its JSON implies them: each name of `want` present, float32 or
    float64 (a trace stores float32), of the shape want[name] (a size below 1 is never right: -1 stands
    for a size its tensors themselves lack). what: the kind of file, named: what its JSON names, both for
    the messages. `TraceResult.load` and `PositionalTrace.load` check their tensors here, then their values."""
    missing = [k for k in want if k not in t]
    if missing:
        raise TimeromeError(f"{where} lacks the tensor(s) {', '.join(missing)} of a {what}")
    for name in want:
        if t[name].dtype not in (torch.float32, torch.float64):
            raise TimeromeError(f"{where}: tensor {name} is {str(t[name].dtype).removeprefix('torch.')}; a {what} "
                                "stores float32 (was the file converted?)")
    for name, shape in want.items():
        if tuple(t[name].shape) != shape or min(shape) < 1:
            raise TimeromeError(f"{where}: tensor {name} has shape {tuple(t[name].shape)}, but its JSON names {named}, "
                                f"so it must be {shape} (the two files do not belong together, or one was edited)")


def _check_tensors(t: dict, F: int, M: int, Ly: int, settings: dict, where) -> None:
    """The four tensors, float32 / float64, of one consistent shape, the TIE finite where it is defined."""
    tie, corrupted = t.get("tie"), t.get("corrupted_logp")
    K = tie.shape[-1] if tie is not None and tie.dim() == 4 else -1
    N = settings.get("n_samples", corrupted.shape[1] if corrupted is not None and corrupted.dim() == 3 else -1)
    check_stored(t, dict(tie=(F, M, Ly, K), tie_full=(F, M, Ly, K, K + 1), clean_logp=(F, K + 1),
                         corrupted_logp=(F, N, K + 1)),
                 "trace result", f"{F} facts, {M} modules, {Ly} layers and {N} noise samples", where)
    if "steps" in settings and settings["steps"] != K:
        raise TimeromeError(f"{where}: its settings say {settings['steps']} steps, its tensors hold {K}")
    finite_tensor(tie, f"{where}: tensor tie")
    finite_tensor(t["tie_full"][..., later_steps(K)], f"{where}: tensor tie_full (where k' > k)")
    finite_tensor(t["clean_logp"], f"{where}: tensor clean_logp")
    finite_tensor(t["corrupted_logp"], f"{where}: tensor corrupted_logp")
    if "tau" in settings:  # selection ranks `tie`: it must be what its own tie_full and tau give
        agg = aggregate(t["tie_full"].double(), float(settings["tau"]))
        if not torch.allclose(tie.double(), agg, rtol=1e-4, atol=1e-6):
            gap = float((tie.double() - agg).abs().max())
            raise TimeromeError(f"{where}: tensor tie is not its tie_full aggregated with its tau {settings['tau']:g} "
                                f"(they differ by up to {gap:.3g}): one of them was edited; trace again")


TRACE_FILES = ("trace.safetensors", "positional.safetensors")  # what `timerome trace` writes in its folder


def trace_path(path) -> Path:
    """A saved trace's .safetensors path: the path (with .safetensors for a bare name or its .json),
    or, for a folder `timerome trace` wrote, the one trace file in it."""
    p = Path(path)
    if p.is_dir():
        found = [p / n for n in TRACE_FILES if (p / n).exists()]
        if not found:
            raise TimeromeError(f"{p} is a folder with no trace in it (`timerome trace` writes {' or '.join(TRACE_FILES)})")
        if len(found) > 1:
            raise TimeromeError(f"{p} holds {' and '.join(f.name for f in found)}: give the one to use")
        return found[0]
    tensors = _tensor_path(p)
    if tensors != p and p.is_file() and not tensors.exists():  # a .json or a bare name given: say it, not the other
        raise TimeromeError(f"{p} is not a trace: a trace is a .safetensors file with its .json beside it, and "
                            f"there is no {tensors.name} beside {p.name}")
    return tensors


def meta_path(path) -> Path:
    """The .json beside a trace's .safetensors (`trace_path`'s answer): the half of the pair that holds
    the fact ids, modules, layers and settings; beside a link's target, where `write` puts it."""
    return through_link(path).with_suffix(".json")


def pair_stamp(tensors: dict) -> str:
    """A hash of a trace's tensors (names, dtypes, shapes, bytes): the stamp its two files both name, so
    that the halves of one save are known for one (and the JSON stays editable by hand)."""
    return tensors_digest(tensors)[:16]


class TornPair(TimeromeError):
    """The two files of a saved trace are of two different saves."""


def refuse_torn_pair(header: dict, meta, path, meta_file, what: str) -> None:
    """Refuse tensors whose stamp is not the one the JSON beside them names (a save interrupted between
    its two writes over an earlier one); a pair saved before stamps were written is taken as it is."""
    stamp = header.get("pair")
    if stamp is not None and isinstance(meta, dict) and meta.get("pair") != stamp:
        raise TornPair(f"{path} and {meta_file.name} are of two different saves (their stamps differ: a run "
                       f"interrupted between its two writes over an earlier {what}?): trace again")


def _pair(path, what: str) -> tuple[Path, Path]:
    """(tensors, JSON) of the saved trace at path (`trace_path`), both there and the tensors a regular
    file (a pipe's read would block); else one TimeromeError naming `what`."""
    given, path = Path(path), trace_path(path)
    meta_file = meta_path(path)
    if not path.exists():  # the path as given, then what was looked for, then the traces beside it (review 79)
        near = sorted(p.name for p in path.parent.glob("*.safetensors") if meta_path(p).exists()) \
            if path.parent.is_dir() else []
        raise TimeromeError(f"no {what} at {given}" + (f" (nor {path.name})" if path != given else "")
                            + ": the file does not exist; " + (f"{path.parent} holds {', '.join(near[:4])}" if near else
                                                              "give the .safetensors file `timerome trace` wrote, or "
                                                              "its folder"))
    if not meta_file.exists():
        kind = _saved_kind(path)
        if kind and "memory" in kind:  # the other .safetensors a user holds: say what it is
            raise TimeromeError(f"{path} is an edit memory ({kind}), not a {what}: give the trace.safetensors that "
                                "`timerome trace` wrote (a memory is read by generate / eval --edit and timerome memory)")
        raise TimeromeError(f"{path} has no {meta_file.name} beside it: a {what} is the pair of files "
                            "`timerome trace` writes")
    input_file(path, what)
    return path, meta_file


def _saved_kind(path) -> str | None:
    """The format a timerome .safetensors file names in its header ("timerome-edit-memory/2", ...), or None."""
    return timerome_header(path).get("format")


def _tensor_path(path) -> Path:
    path = Path(path)
    if path.suffix == ".safetensors":
        return path
    return path.with_suffix(".safetensors") if path.suffix == ".json" else path.with_name(path.name + ".safetensors")

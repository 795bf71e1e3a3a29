"""TraceResult: the TIE heatmaps of a set of facts, and their file (safetensors + JSON); `TraceFile`,
what it shares with the positional trace's result (facts by index or id, the model check, the file)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from timerome.cache import save_tensors, write_json
from timerome.errors import TimeromeError


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
        trace saved before fingerprints were recorded is taken as it is)."""
        made_on = self.settings.get("fingerprint")
        if made_on is not None and made_on != backbone.fingerprint():
            raise TimeromeError(f"{source} was traced on another model ({self.settings.get('model')}, fingerprint "
                                f"{made_on}); this model's fingerprint is {backbone.fingerprint()}: trace it first "
                                "(timerome trace --model ...)")

    @staticmethod
    def write(path, tensors: dict, meta: dict, kind: str | None = None) -> Path:
        """tensors to PATH (.safetensors), meta to the same name with .json (with its `kind` when given)."""
        path = _tensor_path(path)
        save_tensors(path, tensors, metadata={"format": "pt", **({"kind": kind} if kind else {})})
        write_json(path.with_suffix(".json"), {**({"kind": kind} if kind else {}), **meta})
        return path

    @staticmethod
    def read(path, what: str, build):
        """build(tensors, meta) of the file at `path`; any unreadable part is one TimeromeError naming `what`."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = _tensor_path(path)
        meta_path = path.with_suffix(".json")
        if not path.exists() or not meta_path.exists():
            raise TimeromeError(f"a {what} is {path} plus {meta_path.name}; one of them is missing")
        try:
            return build(load_file(str(path)), json.loads(meta_path.read_text(encoding="utf-8")))
        except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
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
        """The same result restricted to `modules` (in their order in the trace)."""
        keep = [i for i, m in enumerate(self.modules) if m in modules]
        if not keep:
            raise TimeromeError(f"the trace covers modules {self.modules}, none of {tuple(modules)}")
        return TraceResult(self.tie[:, keep], self.tie_full[:, keep], self.clean_logp, self.corrupted_logp,
                           self.fact_ids, tuple(self.modules[i] for i in keep), self.layers, self.settings,
                           self.facts, self.stats)

    # ------------------------------------------------------------------ the file

    def save(self, path: str | Path) -> Path:
        """Tensors to PATH (.safetensors), settings and facts to the same name with .json."""
        return self.write(path, dict(tie=self.tie, tie_full=self.tie_full, clean_logp=self.clean_logp,
                                     corrupted_logp=self.corrupted_logp),
                          dict(fact_ids=self.fact_ids, modules=list(self.modules), layers=self.layers,
                               settings=self.settings, facts=self.facts, stats=self.stats))

    @classmethod
    def load(cls, path: str | Path) -> "TraceResult":
        return cls.read(path, "trace result", lambda t, meta: cls(
            t["tie"], t["tie_full"], t["clean_logp"], t["corrupted_logp"], list(meta["fact_ids"]),
            tuple(meta["modules"]), list(meta["layers"]), dict(meta["settings"]), list(meta.get("facts", [])),
            dict(meta.get("stats", {}))))


def _tensor_path(path) -> Path:
    path = Path(path)
    if path.suffix == ".safetensors":
        return path
    return path.with_suffix(".safetensors") if path.suffix == ".json" else path.with_name(path.name + ".safetensors")

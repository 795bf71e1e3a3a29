"""TraceResult: the TIE heatmaps of a set of facts, and their file (safetensors + JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from timerome.cache import save_tensors, write_json
from timerome.errors import TimeromeError


@dataclass
class TraceResult:
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
        path = _tensor_path(path)
        save_tensors(path, dict(tie=self.tie, tie_full=self.tie_full, clean_logp=self.clean_logp,
                                corrupted_logp=self.corrupted_logp), metadata={"format": "pt"})
        write_json(path.with_suffix(".json"), dict(fact_ids=self.fact_ids, modules=list(self.modules),
                                                   layers=self.layers, settings=self.settings, facts=self.facts,
                                                   stats=self.stats))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TraceResult":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = _tensor_path(path)
        meta_path = path.with_suffix(".json")
        if not path.exists() or not meta_path.exists():
            raise TimeromeError(f"a trace result is {path} plus {meta_path.name}; one of them is missing")
        try:
            t = load_file(str(path))
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            return cls(t["tie"], t["tie_full"], t["clean_logp"], t["corrupted_logp"], list(meta["fact_ids"]),
                       tuple(meta["modules"]), list(meta["layers"]), dict(meta["settings"]),
                       list(meta.get("facts", [])), dict(meta.get("stats", {})))
        except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
            raise TimeromeError(f"{path} is not a readable trace result ({type(e).__name__}: {str(e)[:120]})") from None


def _tensor_path(path) -> Path:
    path = Path(path)
    if path.suffix == ".safetensors":
        return path
    return path.with_suffix(".safetensors") if path.suffix == ".json" else path.with_name(path.name + ".safetensors")

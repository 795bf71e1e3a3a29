"""Which family a config.json describes: by its keys and architectures, not by model_type alone.

LLaDA-MoE releases say `model_type: "llada"` like dense LLaDA; their keys (`hidden_size`,
`num_experts`, ...) and `architectures: ["LLaDAMoEModelLM"]` tell them apart. A family is a
candidate when the config has all of its `keys` and none of its `without` keys, and at least one
piece of evidence points to it (model_type, an architecture, marker keys); the candidate with the
most evidence wins, a tie is an error. One tie is settled by the mask token: a Llama config is
DiffuLLaMA's (an MDLM) or an autoregressive Llama's, and only an MDLM declares a mask token
(config.json's `mask_token_id` or the tokenizer's), so `mask_declared` (asked only then) decides.
"""

from __future__ import annotations

from typing import Callable

from timerome.backbones.families import FAMILIES, Family, get_family
from timerome.common.checks import shown
from timerome.errors import TimeromeError

# the signature keys detection reads besides the structure keys: (is the value of the right type, what it must be)
SIGNATURE_TYPES = {
    "model_type": (lambda v: isinstance(v, str), "a string (the model's type)"),
    "architectures": (lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
                      "a list of class names"),
}


def _fits(fam: Family, config: dict) -> list[str]:
    """What keeps the config from being this family's structure ([] when it fits)."""
    problems = []
    missing = [k for k in fam.keys if k not in config]
    if missing:
        problems.append(f"needs key(s) {', '.join(missing)}")
    extra = [k for k in fam.without if k in config]
    if extra:
        problems.append(f"must not have {', '.join(extra)}")
    return problems


def _evidence(fam: Family, config: dict) -> list[str]:
    ev = []
    mt = config.get("model_type")
    if mt in fam.model_types:
        ev.append(f"model_type {mt!r}")
    arch = [a for a in config.get("architectures") or [] if a in fam.architectures]
    if arch:
        ev.append(f"architectures {arch}")
    marks = [k for k in fam.markers if k in config]
    if marks:
        ev.append(f"marker keys {', '.join(marks)}")
    return ev


def describe_config(config: dict) -> str:
    """One line on what a config looks like, for error messages."""
    keys = [k for k in ("d_model", "hidden_size", "num_experts", "codebook_size", "mask_token_id") if k in config]
    return (f"model_type {config.get('model_type')!r}, architectures {config.get('architectures')}, "
            f"keys {', '.join(keys) or '(none of d_model / hidden_size)'}")


def _by_mask(scored: list, mask_declared: Callable[[], bool] | None) -> list:
    """The candidates tied at the top, settled by the mask token when they differ in kind only
    (a diffusion family and a causal one): an MDLM declares a mask token, an AR model does not."""
    top = [t for t in scored if t[0] == scored[0][0]]
    kinds = {t[1].causal for t in top}
    if len(top) < 2 or len(kinds) < 2 or mask_declared is None:
        return scored
    declared = bool(mask_declared())
    keep = [t for t in top if t[1].causal != declared]
    if len(keep) != 1:
        return scored
    n, fam, ev = keep[0]
    why = "a mask token is declared: a masked diffusion LM" if declared else \
        "no mask token declared (config.json, tokenizer): an autoregressive LM"
    return [(n + 1, fam, ev + [why])] + [t for t in scored if t[1] is not fam]


def detect_family(config: dict, family: str | None = None, *,
                  mask_declared: Callable[[], bool] | None = None) -> tuple[Family, list[str]]:
    """(family, evidence) for a config.json; `family` overrides detection only when it fits.
    mask_declared: whether the checkpoint declares a mask token (called only to settle a tie
    between a diffusion family and a causal one)."""
    for key, (ok, want) in SIGNATURE_TYPES.items():
        if config.get(key) is not None and not ok(config[key]):
            raise TimeromeError(f"config.json: {key} must be {want} or null, got {shown(config[key])}")
    scored = []
    for fam in FAMILIES.values():
        if not _fits(fam, config):
            ev = _evidence(fam, config)
            if ev:
                scored.append((len(ev), fam, ev))
    scored.sort(key=lambda t: -t[0])
    scored = _by_mask(scored, mask_declared) if scored else scored
    best = scored[0] if scored else None
    if family is None:
        if best and len(scored) > 1 and scored[1][0] == best[0]:
            raise TimeromeError(
                f"config.json fits several families ({best[1].name}: {'; '.join(best[2])} / "
                f"{scored[1][1].name}: {'; '.join(scored[1][2])}); pass family= to choose")
        if best is None:
            raise TimeromeError(
                f"cannot tell the backbone family from config.json ({describe_config(config)}); "
                f"pass family= one of {', '.join(sorted(FAMILIES))}")
        return best[1], best[2] + [f"structure keys {', '.join(best[1].keys)} present"]

    fam = get_family(family)
    problems = _fits(fam, config)
    looks = f"it looks like {best[1].name} ({'; '.join(best[2])})" if best else describe_config(config)
    if problems:
        raise TimeromeError(f"family={fam.name!r} does not fit this config.json: {fam.name} "
                            f"{' and '.join(problems)}; {looks}")
    ev = _evidence(fam, config)
    if best is not None and best[1] is not fam and not ev:
        raise TimeromeError(f"family={fam.name!r} does not match this config.json: {looks}")
    return fam, [f"family={fam.name!r} given"] + ev + [f"structure keys {', '.join(fam.keys)} present"]

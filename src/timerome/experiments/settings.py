"""An experiment's settings, checked against its defaults before any work: a setting has the kind
of value its default has (an integer where the default counts something, a list of numbers where
it lists alphas, ...), so `"n_mc": 2.5` or `"n_mc": "lots"` is refused with its name before a
model loads, never after a trace has run.
"""

from __future__ import annotations

import json
import numbers

from timerome.common.checks import big_int_path, is_int, is_real, nonfinite_path, repeated
from timerome.data.whp import COMPLETIONS as WHP_COMPLETIONS
from timerome.data.whp import TRIVIA as WHP_TRIVIA
from timerome.data.wmdp import MIXED as WMDP_MIXED
from timerome.data.wmdp import SUBJECTS as WMDP_SUBJECTS
from timerome.errors import TimeromeError
from timerome.metrics.membership import REFERENCE_WANT, reference_ok
from timerome.metrics.robustness import RELEARN_WANT, relearn_ok

# settings that count something (>= 1); those also allowed to be null (= all of them)
COUNT_SETTINGS = {"n_mc", "n_retain", "n_world", "n_facts", "n_eval_forget", "every", "traj_steps", "sizes",
                  # null by default (all rows, or the method's / benchmark's own): a count when given
                  "eval_forget", "n_knowmem", "n_verbmem", "n_privleak", "n_trivia", "n_completions", "n_wmdp",
                  "gen_length", "grad_steps", "answer_tokens", "mia_groups", "knowmem_tokens", "verbmem_tokens",
                  "completion_tokens"}
ALL_IF_NULL = {"n_retain", "n_world", "n_eval_forget", "retain_authors", "splits", "methods", "paper_point"}


def _method_entry(m) -> bool:
    """A method name, or {"method": NAME, "config": {...}} with no other key (a misspelt "config" ran the
    method at its defaults, under its name)."""
    if isinstance(m, str):
        return True
    return (isinstance(m, dict) and isinstance(m.get("method"), str) and set(m) <= {"method", "config"}
            and isinstance(m.get("config") or {}, dict))


# list settings that may be given empty (no rows beyond the grid); any other list given empty is refused where its
# default lists something (it would run nothing, or crash, or fall back to the default without a word)
EMPTY_OK = {"extra", "unmitigated", "compare", "points"}  # points []: utility's no_edit alone
# lists an experiment checks itself, in its own words: given empty (pareto's alphas, npo_sweep's axes), an item
# given twice (alphas, retain authors by name or index, frontiers, methods above)
OWN_EMPTY_CHECKS = {"alphas", "lr", "beta", "retain_w", "methods", "frontiers"}
OWN_REPEAT_CHECKS = {"alphas", "retain_authors", "methods", "frontiers",
                     "references"}  # one item per model: two models may share a reference, or have none
EXTRACTION_KEYS = {"requests", "target", "n_retain", "n_world", "settings", "attacks"}


def _extraction(v) -> bool:
    """Robustness's extraction: false, or an object of overrides, each of its own kind ({}: the defaults)."""
    if v is False:
        return True
    if not isinstance(v, dict) or not set(v) <= EXTRACTION_KEYS:
        return False
    names = [v.get(k) for k in ("settings", "attacks") if v.get(k) is not None]  # null: all of them
    counts = [v.get(k) for k in ("n_retain", "n_world") if v.get(k) is not None]
    return (all(isinstance(x, (list, tuple)) and x and all(isinstance(s, str) for s in x) for x in names)
            and all(is_int(c) and c >= 1 for c in counts)
            and (v.get("target") is None or (isinstance(v["target"], str) and bool(v["target"].strip())))
            and (v.get("requests") is None or isinstance(v["requests"], str)))


def _sweep_entry(e) -> bool:
    """npo_sweep's extra / unmitigated: {"method": NAME, setting: value, ...} (the method's settings flat)."""
    return isinstance(e, dict) and isinstance(e.get("method"), str) and bool(e["method"].strip())


# settings whose default says little (null, {}): what they must be
SPECIAL = {
    "methods": ("a list of method names or {\"method\": NAME, \"config\": {...}} objects (no other key)",
                lambda v: isinstance(v, (list, tuple)) and bool(v) and all(_method_entry(m) for m in v)),
    "splits": ("a list of evaluation splits (forget, retain, real_authors, world_facts)",
               lambda v: isinstance(v, (list, tuple)) and bool(v)
               and set(v) <= {"forget", "retain", "real_authors", "world_facts"}),
    "extraction": ("false (no extraction cells) or an object with any of requests (a spec), target (a non-empty "
                   "text), n_retain, n_world (integers >= 1), settings, attacks (non-empty lists of names; null: "
                   "all); {} is the defaults", _extraction),
    "compare": ("a list of {\"method\": NAME, \"config\": {...}} objects (no other key) or method names",
                lambda v: isinstance(v, (list, tuple)) and all(_method_entry(m) for m in v)),
    "extra": ("a list of {\"method\": NAME, ...its settings} objects", lambda v: isinstance(v, (list, tuple))
              and all(_sweep_entry(e) for e in v)),
    "unmitigated": ("a list of {\"method\": NAME, ...its settings} objects", lambda v: isinstance(v, (list, tuple))
                    and all(_sweep_entry(e) for e in v)),
    "collapse": ("a number > 0 (nats of retain lost that count as a collapse)", lambda v: is_real(v) and v > 0),
    "forget_from": ("a non-empty list of probes and / or passages", lambda v: isinstance(v, (list, tuple)) and bool(v)
                    and set(v) <= {"probes", "passages"}),
    "mia_k": ("a number in (0, 1] (the share of lowest-probability tokens Min-K% reads)",
              lambda v: is_real(v) and 0 < v <= 1),
    "models": ("a non-empty list of checkpoints (folders, .gguf files or Hub ids)",
               lambda v: isinstance(v, (list, tuple)) and bool(v) and all(isinstance(m, str) and m.strip() for m in v)),
    "num_fewshot": ("an integer >= 0 (or null: each task's own)", lambda v: is_int(v) and v >= 0),
    "limit": ("a number > 0 (examples per task; below 1, lm-eval's share of them) or null",
              lambda v: is_real(v) and v > 0 and (v < 1 or float(v).is_integer())),
    "relearn": (RELEARN_WANT, relearn_ok),
    "wmdp_subject": (f"one of {', '.join((*WMDP_SUBJECTS, WMDP_MIXED))}",
                     lambda v: isinstance(v, str) and v in (*WMDP_SUBJECTS, WMDP_MIXED)),
    "whp_trivia": (f"one of {', '.join(WHP_TRIVIA)}", lambda v: isinstance(v, str) and v in WHP_TRIVIA),
    "whp_prompts": (f"one of {', '.join(WHP_COMPLETIONS)}", lambda v: isinstance(v, str) and v in WHP_COMPLETIONS),
    "frontiers": ("a non-empty list of timerome settings objects without alpha or q (the sweep sets them)",
                  lambda v: isinstance(v, (list, tuple)) and bool(v)
                  and all(isinstance(f, dict) and not {"alpha", "q"} & set(f) for f in v)),
    "privleak_reference": ("an object {\"books\": AUC, \"news\": AUC} (either or both; each the retrained "
                           f"model's privacy-leak AUC, {REFERENCE_WANT})",
                           lambda v: isinstance(v, dict) and set(v) <= {"books", "news"}
                           and all(reference_ok(x) for x in v.values())),
    "targets": ("null (every RWKU target), an integer >= 1 (the first so many) or a list of target names",
                lambda v: (is_int(v) and v >= 1) or (isinstance(v, (list, tuple)) and bool(v)
                                                     and all(isinstance(t, str) and t.strip() for t in v))),
    "reference": ("an object with any of epochs, n_authors, batch_size (integers >= 1)",
                  lambda v: isinstance(v, dict) and set(v) <= {"epochs", "n_authors", "batch_size"}
                  and all(is_int(x) and x >= 1 for x in v.values())),
}


def check_settings(name: str, cfg: dict, defaults: dict) -> None:
    """Every experiment setting has the kind of value its default has (counts >= 1), before any work;
    no number anywhere in them (a method's options included) is NaN, infinite or beyond 64 bits."""
    where = nonfinite_path(cfg) or big_int_path(cfg)
    if where:
        raise TimeromeError(f"experiment {name!r}: setting {where} is NaN, infinite or an integer beyond 64 bits, "
                            "which no computation can use; give a finite number")
    for key, value in cfg.items():
        default = defaults.get(key)
        if value is None and (default is None or key in ALL_IF_NULL):
            continue
        want, ok = SPECIAL.get(key, (_kind(key, default), lambda v: _fits(key, default, v)))
        if want and not ok(value):
            raise TimeromeError(f"experiment {name!r}: setting {key} must be {want}, got {value!r}")
    names = [m for m in cfg.get("methods") or () if isinstance(m, str)]  # every experiment with a methods list
    twice = repeated(names)
    if twice:  # its rows run once and are reported once (or twice under one label): the list said twice
        raise TimeromeError(f"experiment {name!r}: methods names {', '.join(twice)} twice: give each once")
    for key, value in cfg.items():  # any list: each item once, and empty only where that means "none beyond"
        if not isinstance(value, (list, tuple)):
            continue
        if not value and key not in EMPTY_OK | OWN_EMPTY_CHECKS and isinstance(defaults.get(key), (list, tuple)) \
                and defaults[key]:
            raise TimeromeError(f"experiment {name!r}: setting {key} is empty, so it would run nothing (or fall back "
                                "to its default without a word): give at least one item, or leave it out")
        twice = [] if key in OWN_REPEAT_CHECKS else repeated(json.dumps(v, sort_keys=True, default=str) for v in value)
        if twice:  # a cell computed once and a row reported once (or twice under one label)
            raise TimeromeError(f"experiment {name!r}: setting {key} gives {twice[0]} twice: give each item once")


def _kind(key: str, default) -> str:
    if key in COUNT_SETTINGS:
        return "a list of integers >= 1" if isinstance(default, (list, tuple)) else "an integer >= 1"
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, numbers.Integral):
        return "an integer >= 0"
    if isinstance(default, numbers.Real):
        return "a number"
    if isinstance(default, str):
        return "a string"
    if isinstance(default, (list, tuple)):
        return "a list" + (" of numbers" if default and is_real(default[0]) else
                           " of objects" if default and isinstance(default[0], dict) else "")
    if isinstance(default, dict):
        return "an object"
    return ""


def _fits(key: str, default, value) -> bool:
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):  # empty is fine: no extra rows, no sweep points
            return False
        if key in COUNT_SETTINGS:
            return all(is_int(v) and v >= 1 for v in value)
        if default and is_real(default[0]):
            return all(is_real(v) for v in value)
        return not (default and isinstance(default[0], dict)) or all(isinstance(v, dict) for v in value)
    if key in COUNT_SETTINGS:
        return is_int(value) and value >= 1
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, numbers.Integral):
        return is_int(value) and value >= 0
    if isinstance(default, numbers.Real):
        return is_real(value)
    return isinstance(value, type(default))


# ------------------------------------------------------------------------------ a setting read by nothing
# An experiment may declare UNREAD_WHEN = {setting: rule}, rule(cfg) -> why nothing reads the setting under
# these settings, or None; a setting the user gave (an override) that a rule finds unread is refused.

def needs(flag: str):
    """Read only while the true/false setting `flag` is true (rouge, mia, privleak)."""
    return lambda cfg: None if cfg.get(flag) else f"{flag} is false"


def needs_benchmark(*names: str):
    """Read only where the benchmarks setting has one of `names`."""
    listed = " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"
    return lambda cfg: (None if set(names) & set(cfg.get("benchmarks") or ()) else
                        f"the benchmarks setting leaves out {listed}")


def all_of(*rules):
    """Read only where every rule reads it: the first reason that it is not."""
    return lambda cfg: next((why for why in (rule(cfg) for rule in rules) if why), None)


def unread_settings(cfg: dict, given, rules: dict, quick: dict | None = None) -> dict[str, str]:
    """{setting of `given` (the overrides): why nothing reads it under cfg} by `rules` (an experiment's
    UNREAD_WHEN); quick: the --quick subset in force, named where it set the reason."""
    out = {}
    for key in given:
        why = rules[key](cfg) if key in rules else None
        if why:
            set_by_quick = any(k not in given and k in why.split() for k in quick or {})
            out[key] = f"{why}, as --quick sets it" if set_by_quick else why
    return out


def refuse_unread_settings(name: str, unread: dict[str, str]) -> None:
    """Refuse the settings `unread_settings` found read by nothing, before any work."""
    if unread:
        it = "it" if len(unread) == 1 else "them"
        raise TimeromeError(f"experiment {name!r}: nothing reads "
                            + "; ".join(f"{key} ({why})" for key, why in unread.items()) + f": leave {it} out")

"""The data of an experiment cell: a data spec -> evaluation rows by split and the ForgetTask.

A spec is a small dict (part of every cell's cache key), so a cell names its data without
holding it; `resolve_data` turns it into rows, checked against the model's context.
"""

from __future__ import annotations

import warnings

from timerome.common.checks import repeated
from timerome.data.benchmark import warn_unknown_rows
from timerome.data.facts import TOFU_BLOCK, facts_from_rows
from timerome.data.requests import load_requests
from timerome.data.rows import spread
from timerome.data.task import ForgetTask, shared_rows
from timerome.data.tofu import FULL_OFFSET, SPLITS, load_split
from timerome.engine.settings import EDIT, LOCALITY
from timerome.errors import TimeromeError
from timerome.evaluation.evaluator import fits


SPEC_KEYS = {"forget", "first", "last", "eval_forget", "n_retain", "n_world", "retain_authors", "splits", "validation"}
EVAL_SPLITS = ("forget", "retain", "real_authors", "world_facts")
SIZED = {"n_retain": ("retain",), "retain_authors": ("retain",), "n_world": ("real_authors", "world_facts")}


def refuse_unfilled_target(specs, target: str | None, where: str) -> None:
    """Refuse a target other than the default that no request of `specs` reads (each names its own):
    one target given to several request sources is read where any of them names none."""
    if not target or target == EDIT.target:
        return
    if all(r.fact.target for spec in specs for r in load_requests(spec)[0]):
        raise TimeromeError(f"{where}: the target {target!r} fills requests that name no target, and every request "
                            f"of {', '.join(map(str, specs))} names its own: leave the target out")


def _size_read(key: str):
    """rule(cfg) -> why nothing reads the size `key` (SIZED) under cfg's splits, or None: one rule for every caller."""
    return lambda cfg: (None if cfg.get("splits") is None or set(SIZED[key]) & set(cfg["splits"]) else
                        f"the splits leave out {' and '.join(SIZED[key])}")


def refuse_unread_sizes(splits, given: dict, where: str) -> None:
    """Refuse sizes of evaluation splits that `splits` leaves out (read by nothing): `given` {the size's
    name as the user wrote it: its SIZED key}, where: who took them ("experiment 'canonical'", "eval")."""
    if splits is None:
        return
    unread = [shown for shown, key in given.items() if _size_read(key)({"splits": splits})]
    if unread:
        it = "it" if len(unread) == 1 else "them"
        raise TimeromeError(f"{where}: {', '.join(unread)} size{'s' if len(unread) == 1 else ''} a split the "
                            f"evaluation leaves out (splits: {', '.join(splits)}), so nothing reads {it}: leave {it} "
                            "out, or add the split")


# an experiment's UNREAD_WHEN for the sizes of its data spec (canonical, pareto: experiments.settings)
SIZES_UNREAD_WHEN = {key: _size_read(key) for key in SIZED}


def without_unread_sizes(spec: dict) -> dict:
    """`spec` less the sizes (SIZED) of splits its `splits` leave out: for callers that fill every size with
    its default, whose spec `resolve_data` would otherwise refuse as given and read by nothing."""
    return {k: v for k, v in spec.items() if k not in SIZED or not _size_read(k)(spec)}


def resolve_data(spec: dict, source, backbone) -> tuple[dict, ForgetTask]:
    """(evaluation rows by split, ForgetTask) of a data spec; rows that do not fit the context go.

    spec keys: forget (split, default forget01), first / last (keep that many forget rows from the
    start / end), eval_forget (evaluate a spread of that many forget rows), n_retain / n_world
    (spreads of retain_perturbed and of the real-author / world-fact splits), retain_authors (whose
    retain rows are evaluated: `retain_of_authors`), splits (which evaluation splits), validation
    (the split whose facts are traced, default the forget facts).
    """
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:  # a misspelt key (n_retian) read as absent ran the default silently
        raise TimeromeError(f"the data spec has no key {', '.join(map(repr, unknown))}; its keys: {', '.join(sorted(SPEC_KEYS))}")
    splits = spec.get("splits")
    if splits is not None and (isinstance(splits, (str, bytes)) or not set(splits) <= set(EVAL_SPLITS)):
        raise TimeromeError(f"the data spec's splits must be a list of {', '.join(EVAL_SPLITS)}, got {splits!r}")
    # a size is in the spec where it was given (callers that fill defaults drop the unread: without_unread_sizes)
    refuse_unread_sizes(splits, {k: k for k in SIZED if spec.get(k) is not None}, "the data spec")
    forget = spec.get("forget", "forget01")
    rows = load_split(forget, source)
    lo, hi, offset = 0, len(rows), FULL_OFFSET.get(forget, 0)
    beyond = [(k, spec[k]) for k in ("first", "last") if spec.get(k) is not None and int(spec[k]) > len(rows)]
    if beyond:  # capped without a word, while the report named the count asked for
        k, n = beyond[0]
        raise TimeromeError(f"the forget split {forget} has {len(rows)} rows, and {n} of them were asked for ({k} "
                            f"{n}: an experiment's n_facts or sizes): give at most {len(rows)}")
    if spec.get("first") is not None:
        hi = min(hi, int(spec["first"]))
    if spec.get("last") is not None:
        lo = max(0, hi - int(spec["last"]))
    task_rows = rows[lo:hi]
    facts, _ = facts_from_rows(task_rows, offset=offset + lo)
    perturbed = f"{forget}_perturbed"
    shown = load_split(perturbed, source)[lo:hi] if perturbed in SPLITS else task_rows
    retain = load_split("retain_perturbed", source)
    out = {"forget": spread(shown, spec.get("eval_forget")),
           "retain": spread(retain_of_authors(retain, spec.get("retain_authors")),
                            spec.get("n_retain", LOCALITY.n_retain)),
           "real_authors": spread(load_split("real_authors_perturbed", source), spec.get("n_world", LOCALITY.n_world)),
           "world_facts": spread(load_split("world_facts_perturbed", source), spec.get("n_world", LOCALITY.n_world))}
    if shared_rows(task_rows, retain):
        raise TimeromeError(f"the forget rows ({forget}, {len(task_rows)} rows) overlap the retain rows: "
                            "forget fewer rows")
    for name in ("real_authors", "world_facts"):  # the locality columns would score the rows being forgotten
        if name in spec.get("splits", out) and shared_rows(task_rows, out[name]):
            raise TimeromeError(f"the forget rows ({forget}) are the {name} rows the evaluation scores as "
                                f"locality: forget another split, or leave {name} out of splits")
    kept = {k: [r for r in v if fits(backbone, r)] for k, v in out.items() if k in spec.get("splits", out)}
    dropped = [f"{k} {len(out[k]) - len(v)} of {len(out[k])}" for k, v in kept.items() if len(v) < len(out[k])]
    if dropped:  # never silently: the counts say how many rows each split lost
        warnings.warn(f"rows longer than the model's context of {backbone.max_length} tokens are not scored: "
                      + ", ".join(dropped), stacklevel=2)
    out = kept
    warn_unknown_rows(backbone, out)
    if "forget" in out and not shown:
        raise TimeromeError(f"the {forget} split holds no row" + (f" from row {lo} to {hi}" if (lo, hi) != (0, len(rows))
                                                                   else "") + ": there is nothing to evaluate")
    if not out.get("forget", [None]):
        raise TimeromeError(f"no {forget} row fits the model's context of {backbone.max_length} tokens")
    validation = None
    if spec.get("validation"):
        validation, _ = facts_from_rows(load_split(spec["validation"], source),
                                        offset=FULL_OFFSET.get(spec["validation"], 0))
    return out, ForgetTask(task_rows, facts, list(retain), validation=validation)


def retain_of_authors(rows: list[dict], authors) -> list[dict]:
    """The retain rows of the chosen authors, in file order.

    authors: None (every author), k (the first k authors: what a model trained on a TOFU subset
    such as `from_scratch.tofu_subset` saw), or a list of author indices (0-based) or names. An
    author is a row's `author` field, else a block of TOFU's 20 consecutive rows.
    """
    if authors is None:
        return rows
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.get("author") or f"TOFU author {i // TOFU_BLOCK}", []).append(r)
    names = list(groups)
    if isinstance(authors, int) and not isinstance(authors, bool):
        if not 1 <= authors <= len(names):
            raise TimeromeError(f"retain_authors (--retain-authors) {authors}: give 1..{len(names)} (the retain split "
                                f"has {len(names)} authors)")
        chosen = names[:authors]
    elif isinstance(authors, (list, tuple)) and authors:
        chosen = []
        for a in authors:
            if isinstance(a, int) and not isinstance(a, bool) and 0 <= a < len(names):
                chosen.append(names[a])
            elif isinstance(a, str) and a in groups:
                chosen.append(a)
            else:
                raise TimeromeError(f"retain_authors: {a!r} is neither an author index in 0..{len(names) - 1} "
                                    f"nor an author name of the retain split")
    else:
        raise TimeromeError(f"retain_authors must be null, a number of authors or a list of author indices or "
                            f"names, got {authors!r}")
    twice = repeated(chosen)
    if twice:  # [0, 0] read as one author: the list said two
        raise TimeromeError(f"retain_authors names {', '.join(map(repr, twice))} twice (by index or name): give each "
                            "author once")
    return [r for name in chosen for r in groups[name]]

"""One way to name a QA set on the command line: 'embedded:SPLIT', 'tofu:SPLIT', 'real-facts' (the
real facts of `data/real_facts.py`, with their counterfactual targets) or a file."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from timerome.common.checks import integer
from timerome.common.cache import digest
from timerome.data.facts import facts_from_rows
from timerome.data.tofu import ENV_DIR as TOFU_ENV
from timerome.data.tofu import FULL_OFFSET, load_split, normalise_row, read_rows
from timerome.data.tofu import HUB_ID as TOFU_HUB
from timerome.errors import TimeromeError


def reads_tofu(spec) -> bool:
    """Whether a row source reads a TOFU folder: it is a 'tofu:SPLIT'."""
    return isinstance(spec, str) and spec.startswith("tofu:")


def tofu_folder(spec, tofu_dir):
    """`tofu_dir` where `spec` reads it (`reads_tofu`), else None: for a caller that passes one folder
    to each of several row sources (the forget set's and the calibration rows' may differ)."""
    return tofu_dir if reads_tofu(spec) else None


def tofu_dir_read(tofu_dir, *specs, option: str = "tofu_dir") -> None:
    """Refuse a TOFU folder where nothing reads it: none of `specs` (the row sources given, or a file
    records) is a 'tofu:SPLIT'. A misspelt or wrong folder taken without a word leaves the user
    believing it was read. option: how the folder was given ("--tofu-dir" on the command line)."""
    if tofu_dir is not None and not any(reads_tofu(s) for s in specs):
        named = f"{option} {tofu_dir}" if option.startswith("-") else f"{option}={str(tofu_dir)!r}"
        raise TimeromeError(f"{named} is read only for 'tofu:SPLIT' rows, and nothing here names one: "
                            "leave it out (or name the rows as tofu:SPLIT)")


def load_rows(spec: str, *, tofu_dir: str | None = None) -> list[dict]:
    """The question/answer rows a spec names (module docstring); `tofu_dir` is the TOFU folder of a
    'tofu:SPLIT' (else $TIMEROME_TOFU_DIR, else the Hub id), refused for any other spec."""
    from timerome.data import real_facts

    tofu_dir_read(tofu_dir, spec)
    if spec == real_facts.NAME:
        return real_facts.real_rows()[0]
    if spec.startswith("embedded:"):
        return load_split(spec.split(":", 1)[1], "embedded")
    if spec.startswith("tofu:"):
        return load_split(spec.split(":", 1)[1], tofu_dir)
    path = Path(spec)
    if not path.exists():
        raise TimeromeError(f"{spec!r} is neither 'embedded:SPLIT', 'tofu:SPLIT', 'real-facts' nor an existing file (a "
                            "JSON or JSON Lines file of question / answer rows: docs/cli.md, \"Your own model on your "
                            "own text\")")
    # TOFU's reader and its field names (question/answer, or prompt/response as some copies write them):
    # a file loads as --data FILE exactly as it does as a split of a --tofu-dir
    return [normalise_row(r, path, i) for i, r in enumerate(read_rows(path, "rows file"))]


def row_spec(spec: str, *, tofu_dir: str | None = None) -> dict:
    """Where the rows `spec` names are (`load_rows`), as a memory file records it: {"rows": the spec, a
    file as its absolute path} and, for 'tofu:SPLIT', {"tofu_dir": the TOFU folder it reads (`tofu_dir`,
    else $TIMEROME_TOFU_DIR, else the Hub id), a folder as its absolute path}. Nothing is read."""
    from timerome.data import real_facts

    if spec.startswith("tofu:"):
        folder = tofu_dir or os.environ.get(TOFU_ENV) or TOFU_HUB
        return {"rows": spec, "tofu_dir": str(Path(folder).resolve()) if Path(folder).is_dir() else str(folder)}
    named = spec == real_facts.NAME or spec.startswith("embedded:")
    return {"rows": spec if named else str(Path(spec).resolve())}


def row_source(spec: str, rows: list | None = None, *, tofu_dir: str | None = None) -> dict:
    """What a memory file records of the rows `spec` names, so that a later `memory add` reads the same
    ones: `row_spec` and "digest", a hash of the rows (`rows` if given: those loaded already)."""
    rows = load_rows(spec, tofu_dir=tofu_dir) if rows is None else rows
    return {**row_spec(spec, tofu_dir=tofu_dir), "digest": digest(rows, versioned=False)}


def where_rows(record: dict) -> str:
    """A recorded row source (`row_spec` / `row_source`) in words: its spec, a TOFU split with its folder."""
    folder = record.get("tofu_dir")
    return f"{record['rows']} (in {folder})" if folder else record["rows"]


def recorded_rows(record: dict, what: str, remedy: str, *, tofu_dir: str | None = None,
                  stacklevel: int = 2) -> list[dict]:
    """The rows of a row source a memory file recorded (`row_source`), loaded again, with a warning
    where they are no longer the rows recorded. A 'tofu:SPLIT' is read in the folder recorded, else
    (that folder cannot be read here) in `tofu_dir` (the command's --tofu-dir), with a warning. Rows
    that cannot be read are one TimeromeError saying `what` was done on them ("the radii of F were
    measured") and the `remedy` (how to give them). stacklevel: the warnings' (from the caller's
    caller by default)."""
    spec, where = record["rows"], where_rows(record)
    folders = [record.get("tofu_dir")]
    if spec.startswith("tofu:") and tofu_dir and (row_spec(spec, tofu_dir=tofu_dir)
                                                  != row_spec(spec, tofu_dir=folders[0])):
        folders.append(tofu_dir)
    for i, folder in enumerate(folders):
        try:
            rows = load_rows(spec, tofu_dir=folder)
            break
        except TimeromeError as e:
            if i == len(folders) - 1:
                raise TimeromeError(f"{what} on {where}, which cannot be read here ({e}): {remedy}") from None
    if i:
        warnings.warn(f"{what} on {where}, which cannot be read here: read in {tofu_dir} instead",
                      stacklevel=stacklevel + 1)
    if digest(rows, versioned=False) != record.get("digest"):
        warnings.warn(f"{where} has changed since {what} on it: its rows are read as they are now",
                      stacklevel=stacklevel + 1)
    return rows


def load_facts(spec: str, *, tofu_dir: str | None = None, limit: int | None = None):
    """(facts, skipped) for a QA set named as in `load_rows`; skipped lists (row, reason), never guessed."""
    rows = load_rows(spec, tofu_dir=tofu_dir)
    split = spec.split(":", 1)[1] if spec.startswith("tofu:") else ""
    facts, skipped = facts_from_rows(rows, offset=FULL_OFFSET.get(split, 0))
    if not facts:
        raise TimeromeError(f"no usable fact in {spec!r}: " + "; ".join(f"row {i}: {why}" for i, why in skipped[:5]))
    return (facts if integer(limit, "limit", lo=1, none=True) is None else facts[:limit]), skipped


def spread(rows: list, n: int | None) -> list:
    """n rows evenly spaced over the list (all of them when n is None or larger); deterministic,
    so every method and seed sees the same rows and cache keys stay stable."""
    if n is None or integer(n, "the number of rows to take", lo=0) >= len(rows):
        return list(rows)
    idx = np.linspace(0, len(rows) - 1, n).round().astype(int)
    return [rows[i] for i in idx]

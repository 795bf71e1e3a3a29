"""One way to name a QA set on the command line: 'embedded:SPLIT', 'tofu:SPLIT', 'real-facts' (the
real facts of `data/real_facts.py`, with their counterfactual targets) or a file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from timerome.common.cache import digest
from timerome.common.files import read_text
from timerome.data.facts import facts_from_rows
from timerome.data.tofu import FULL_OFFSET, load_split
from timerome.errors import TimeromeError


def load_rows(spec: str, *, tofu_dir: str | None = None) -> list[dict]:
    from timerome.data import real_facts

    if spec == real_facts.NAME:
        return real_facts.real_rows()[0]
    if spec.startswith("embedded:"):
        return load_split(spec.split(":", 1)[1], "embedded")
    if spec.startswith("tofu:"):
        return load_split(spec.split(":", 1)[1], tofu_dir)
    path = Path(spec)
    if not path.exists():
        raise TimeromeError(f"{spec!r} is neither 'embedded:SPLIT', 'tofu:SPLIT', 'real-facts' nor an existing file")
    text = read_text(path, "rows file").strip()
    try:
        rows = json.loads(text) if text.startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
    except json.JSONDecodeError as e:
        raise TimeromeError(f"{path} is not JSON or JSON Lines: {e}") from None
    rows = [r for part in rows for r in (part if isinstance(part, list) else [part])]
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not all(isinstance(r.get(k), str) and r[k].strip() for k in ("question", "answer")):
            raise TimeromeError(f"{path} row {i} needs non-empty 'question' and 'answer' text fields")
    return rows


def row_source(spec: str, rows: list | None = None, *, tofu_dir: str | None = None) -> dict:
    """What a memory file records of the rows `spec` names (`load_rows`), so that a later `memory add`
    reads the same ones: {"rows": the spec (a file as its absolute path), "digest": a hash of the rows
    (`rows` if given: those loaded already)}."""
    from timerome.data import real_facts

    named = spec == real_facts.NAME or spec.startswith(("embedded:", "tofu:"))
    rows = load_rows(spec, tofu_dir=tofu_dir) if rows is None else rows
    return {"rows": spec if named else str(Path(spec).resolve()), "digest": digest(rows)}


def recorded_rows(record: dict, what: str, remedy: str, *,
                  tofu_dir: str | None = None) -> tuple[list[dict], str | None]:
    """(rows, warning) of a row source a memory file recorded (`row_source`): loaded again, with a
    warning where they are no longer the rows recorded; rows that cannot be read are one
    TimeromeError saying `what` was done on them ("the radii of F were measured") and the `remedy`
    (how to give them)."""
    spec = record["rows"]
    try:
        rows = load_rows(spec, tofu_dir=tofu_dir)
    except TimeromeError as e:
        raise TimeromeError(f"{what} on {spec}, which cannot be read here ({e}): {remedy}") from None
    changed = None if digest(rows) == record.get("digest") else (
        f"{spec} has changed since {what} on it: its rows are read as they are now")
    return rows, changed


def load_facts(spec: str, *, tofu_dir: str | None = None, limit: int | None = None):
    """(facts, skipped) for a QA set named as in `load_rows`; skipped lists (row, reason), never guessed."""
    rows = load_rows(spec, tofu_dir=tofu_dir)
    split = spec.split(":", 1)[1] if spec.startswith("tofu:") else ""
    facts, skipped = facts_from_rows(rows, offset=FULL_OFFSET.get(split, 0))
    if not facts:
        raise TimeromeError(f"no usable fact in {spec!r}: " + "; ".join(f"row {i}: {why}" for i, why in skipped[:5]))
    return (facts[:limit] if limit else facts), skipped


def spread(rows: list, n: int | None) -> list:
    """n rows evenly spaced over the list (all of them when n is None or larger); deterministic,
    so every method and seed sees the same rows and cache keys stay stable."""
    if n is None or n >= len(rows):
        return list(rows)
    idx = np.linspace(0, len(rows) - 1, n).round().astype(int)
    return [rows[i] for i in idx]

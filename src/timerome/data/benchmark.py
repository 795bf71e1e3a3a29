"""Benchmark files beyond TOFU (MUSE, WHP, WMDP, RWKU): finding them, reading them, and saying
which rows could not be used.

Every loader returns a `Loaded`: the usable rows, every row left out with the reason (a row is
never dropped silently), where the rows came from and in which layout. A benchmark directory is
either the benchmark's own folder (e.g. `.../data/muse`) or a folder holding one subfolder per
benchmark (`.../data` with `muse/`, `whp/`, `wmdp/`, `rwku/`); None reads $TIMEROME_BENCH_DIR,
else the Hub for the benchmarks published there (MUSE, WMDP), through the optional `datasets`.

`entity_subject` gives a QA row without an annotated subject the named entity its question is
about (the subject TimeROME's edit keys on); `unknown_share` measures how much of a benchmark's
text a model's vocabulary cannot encode (the embedded model knows 819 words, so benchmark numbers
on it mean nothing, and the experiments say so).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from timerome.data.tofu import read_rows
from timerome.errors import TimeromeError

ENV_DIR = "TIMEROME_BENCH_DIR"


@dataclass
class Loaded:
    """Rows of one benchmark split; `skipped` lists (row index in the file, reason)."""

    name: str
    rows: list[dict]
    skipped: list[tuple[int, str]] = field(default_factory=list)
    source: str = ""
    layout: str = ""
    repeated: int = 0  # rows equal to an earlier one, kept as the file has them (each counts in a mean)

    def note(self) -> str:
        """One line: how many rows were read, and which were left out and why."""
        text = f"{self.name}: {len(self.rows)} rows"
        if self.layout:
            text += f" ({self.layout})"
        if self.repeated:
            text += f"; {repeats_words(self.repeated)}"
        if self.skipped:
            text += f"; {len(self.skipped)} skipped: " + "; ".join(f"row {i}: {why}" for i, why in self.skipped[:3])
            text += " ..." if len(self.skipped) > 3 else ""
        return text

    def info(self) -> dict:
        return dict(name=self.name, rows=len(self.rows), skipped=[list(s) for s in self.skipped],
                    source=self.source, layout=self.layout, repeated=self.repeated)


def repeats_words(n: int) -> str:
    """How a file's exact repeats are said, in the load's warning and the reports' notes alike."""
    return (f"{n} {'repeats' if n == 1 else 'repeat'} an earlier row exactly (kept, as the file has them: a repeat "
            "that is scored counts again)")


# ------------------------------------------------------------------------------ where the files are


# the folders of a benchmark directory (the layout docs/benchmarks.md gives)
BENCHMARK_FOLDERS = ("muse", "whp", "wmdp", "rwku", "tofu")


def check_folder(path, what: str = "the benchmark folder") -> Path:
    """`path` if it is a folder; else one error saying whether it is a file or not there (a relative path: read from
    the current folder, which the message names). The one check of --bench-data, bench_dir= and $TIMEROME_BENCH_DIR."""
    p = Path(path)
    if p.is_dir():
        return p
    state = "is a file, not a folder" if p.exists() else "does not exist" + (
        "" if p.is_absolute() else f" (a relative path, read from {Path.cwd()})")
    raise TimeromeError(f"{what} {p} {state}: pass the folder holding muse/, whp/, wmdp/, rwku/ (or one of them)")


def bench_dir(source, name: str) -> Path | None:
    """The local folder of benchmark `name`, or None when the rows should come from the Hub.

    source: a directory (the benchmark's own, or one holding `name/`), None ($TIMEROME_BENCH_DIR,
    else the Hub) or "hub". A folder without `name/` is read as the benchmark's own unless it is
    plainly another's (named after another benchmark, or holding other benchmarks' folders but not
    this one): its files would be missing under a misleading name.
    """
    if source is None:
        if os.environ.get(ENV_DIR):
            source = check_folder(os.environ[ENV_DIR], f"${ENV_DIR}")
        source = source or "hub"
    if source == "hub":
        return None
    root = check_folder(source, "benchmark directory")
    if (root / name).is_dir():
        return root / name
    others = [b for b in BENCHMARK_FOLDERS if b != name]
    hint = f"pass the folder holding {name}/ or the {name} folder itself"
    if root.name.lower() in others:
        raise TimeromeError(f"benchmark directory {root} is the {root.name} folder, not {name}'s: {hint}")
    held = [b for b in others if (root / b).is_dir()]
    if held:
        raise TimeromeError(f"benchmark directory {root} holds {'/, '.join(held)}/ but no {name}/: {hint}")
    return root


# benchmarks with no Hub copy, read from a local folder only: their name and what the folder holds
LOCAL_ONLY = {"whp": ("WHP", "hp_trivia_1239.jsonl, evaluation_prompts.json"),
              "rwku": ("RWKU", "<id>_<Target> folders")}


def local_only(name: str) -> str:
    """The one message for a benchmark in LOCAL_ONLY asked for without a folder (the loaders, experiments, eval)."""
    label, holds = LOCAL_ONLY[name]
    return f"{label} is read from a local folder only (of {holds}): pass --bench-data DIR (or set ${ENV_DIR})"


def local_dir(source, name: str) -> Path:
    """`bench_dir` of a benchmark in LOCAL_ONLY: the Hub is refused (`local_only`)."""
    d = bench_dir(source, name)
    if d is None:
        raise TimeromeError(local_only(name))
    return d


def find_file(directory: Path, candidates: tuple[str, ...], what: str) -> Path:
    """The first of `candidates` (paths relative to `directory`) that exists; else one clear error."""
    for c in candidates:
        if (directory / c).is_file():
            return directory / c
    where = directory / Path(candidates[0]).parent
    have = sorted(p.name for p in where.glob("*")) if where.is_dir() else []
    raise TimeromeError(f"{what}: {directory / candidates[0]} is missing; files in {where}: "
                        f"{', '.join(have) or 'none'}")


def read_file(path: Path, what: str = "benchmark file") -> list:
    """Rows of a JSON array or JSON Lines file (TOFU's reader: one format rule for every benchmark)."""
    try:
        return read_rows(Path(path), what)
    except OSError as e:
        raise TimeromeError(f"cannot read {path}: {e.strerror or e}") from None


def from_hub(hub_id: str, config: str | None, split: str) -> list[dict]:
    """Rows of a Hub dataset split through `datasets` (optional), or one clear error."""
    from timerome.data.hub import load_split

    return load_split(hub_id, config, split, f"pass a local benchmark directory (--bench-data, or set ${ENV_DIR})")


def keep(name: str, raw: list, check: Callable, source: str, layout: str = "") -> Loaded:
    """Run check(row) -> (clean row, None) or (None, reason) over raw rows; nothing goes unreported."""
    rows, skipped = [], []
    for i, r in enumerate(raw):
        row, why = check(r)
        if row is None:
            skipped.append((i, why))
        else:
            rows.append(row)
    repeated = len(rows) - len({json.dumps(r, sort_keys=True, default=str) for r in rows})
    out = Loaded(name, rows, skipped, source, layout, repeated)
    if skipped or repeated:
        warnings.warn(out.note(), stacklevel=3)
    if not rows:
        raise TimeromeError(f"{name} ({source}) has no usable row: " + "; ".join(
            f"row {i}: {why}" for i, why in skipped[:3]))
    return out


def text_fields(row, names: tuple[str, ...]) -> tuple[dict | None, str | None]:
    """(row, None) when row is an object with a non-empty string under every name, else (None, reason)."""
    if not isinstance(row, dict):
        return None, f"not an object but a {type(row).__name__}"
    missing = [n for n in names if not isinstance(row.get(n), str) or not row[n].strip()]
    if missing:
        return None, f"no {' / '.join(missing)} text"
    return dict(row), None


# ------------------------------------------------------------------------------ subjects


_WORD = r"(?:[A-Z][\w'’.-]*\w|[A-Z])"
_CAPITALISED = re.compile(rf"{_WORD}(?:(?:\s+(?:of|the|de|van|von|al))*\s+{_WORD})*")
# capitalised because they start the question, not because they name something
_FUNCTION_WORDS = {"What", "Which", "Who", "Whom", "Whose", "When", "Where", "Why", "How", "In", "On", "At",
                   "The", "A", "An", "According", "During", "After", "Before", "Is", "Was", "Did", "Does",
                   "Do", "Are", "Were", "Can", "Could", "Name", "For", "From", "To", "By", "With", "If", "I"}


def entities(question: str) -> list[str]:
    """Runs of capitalised words in a question, leading function words taken off
    ("What is the name of Harry Potter's owl?" -> ["Harry Potter"])."""
    out = []
    for m in _CAPITALISED.finditer(question):
        words = re.sub(r"['’]s$", "", m.group(0)).split()
        while words and words[0] in _FUNCTION_WORDS:
            words = words[1:]
        if words and len(words[0]) > 1 or len(words) > 1:  # "F." of "F. tularensis" alone names nothing
            out.append(" ".join(words))
    return out


def entity_subject(rows: list[dict], field_name: str = "question") -> list[str | None]:
    """Per row, the named entity of its question that recurs most across the rows (the longest on
    ties), so facts about one entity share one subject key; None where a question names nothing."""
    found = [entities(r.get(field_name) or "") for r in rows]
    counts = Counter(e for es in found for e in set(es))
    return [max(es, key=lambda e: (counts[e], len(e))) if es else None for es in found]


# ------------------------------------------------------------------------------ vocabulary


UNKNOWN_WARNING = 0.05  # above this share of unknown tokens an evaluation's numbers mean little


def warn_unknown_rows(backbone, rows: dict, per_split: int = 20) -> None:
    """Warn where more than UNKNOWN_WARNING of the tokens of the rows to evaluate ({split: rows}, the first
    `per_split` of each) are the model's unknown token: their scores then mean little. Said on loading the rows
    (the CLI, an experiment) and on evaluating them (the Python API): one line of code and one text, so it is
    said once for one set of rows."""
    texts = [f"{r.get('question', '')} {r.get('answer', '')}" for v in rows.values() for r in list(v)[:per_split]
             if isinstance(r, dict)]
    share = unknown_share(backbone, texts)
    if share > UNKNOWN_WARNING:
        warnings.warn(f"{share:.0%} of the evaluated rows' tokens are unknown to the model's vocabulary "
                      f"({backbone.vocab_size} tokens): their log-probabilities mean little; evaluate a model that "
                      "was trained on this data (--model DIR)", stacklevel=1)


def unknown_share(backbone, texts: list[str], limit: int = 200) -> float:
    """Share of tokens the model's tokenizer maps to its unknown token (0 for byte-level BPE),
    over the first `limit` texts."""
    unk = getattr(backbone.tokenizer, "unk_token_id", None)
    if unk is None:
        return 0.0
    total = hits = 0
    for t in texts[:limit]:
        ids = backbone.encode(t)
        total += len(ids)
        hits += sum(i == unk for i in ids)
    return hits / total if total else 0.0

"""TOFU splits from a local directory in the Hub layout, from the Hub, or from the embedded corpus."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

from timerome.common.checks import shown
from timerome.common.files import read_json_documents
from timerome.data.corpus import known_subjects, make_corpus, training_rows
from timerome.errors import TimeromeError

BASE = ["forget01", "forget05", "forget10", "retain90", "retain95", "retain99", "holdout01",
        "holdout05", "holdout10", "full", "real_authors", "world_facts"]
PERTURBED = ["forget01_perturbed", "forget05_perturbed", "forget10_perturbed", "retain_perturbed",
             "real_authors_perturbed", "world_facts_perturbed"]
SPLITS = BASE + PERTURBED
# the embedded corpus only: what the embedded model learnt (every row it was trained on), the
# refusal rows of invented people, and held-out invented names (corpus.py)
EMBEDDED_SPLITS = ["train", "unknown_train", "unknown"]
HUB_ID = "locuslab/TOFU"
ENV_DIR = "TIMEROME_TOFU_DIR"
EMBEDDED = "embedded"
# where each author split starts in TOFU's full.json (4000 rows): facts_from_rows needs it to find
# the 20-row author blocks (forget01 = full[3960:])
FULL_OFFSET = {"forget01": 3960, "forget05": 3800, "forget10": 3600, "forget01_perturbed": 3960,
               "forget05_perturbed": 3800, "forget10_perturbed": 3600, "retain_perturbed": 0,
               "retain90": 0, "retain95": 0, "retain99": 0, "full": 0}


def load_split(name: str, source: str | Path | None = None) -> list[dict]:
    """Rows of a TOFU split, each with `question`/`answer` (plus the perturbed fields where present).

    source: a local directory of <split>.json files (Hub layout), "embedded" for the built-in
    corpus, or the Hub id "locuslab/TOFU"; None reads $TIMEROME_TOFU_DIR, else uses the Hub.
    """
    if source is None:
        source = os.environ.get(ENV_DIR) or HUB_ID
    if source == EMBEDDED and name in EMBEDDED_SPLITS:
        corpus = _embedded()
        return copy.deepcopy(training_rows(corpus) if name == "train" else corpus[name])
    if name not in SPLITS:
        extra = f" (the embedded corpus also has {', '.join(EMBEDDED_SPLITS)})" if source == EMBEDDED else ""
        raise TimeromeError(f"unknown TOFU split {name!r}; valid splits: {', '.join(SPLITS)}{extra}")
    if source == EMBEDDED:
        return copy.deepcopy(_embedded()[name])  # callers may edit rows freely
    if source == HUB_ID and not Path(HUB_ID).is_dir():
        return _from_hub(name)
    return _from_dir(Path(source), name)


@functools.lru_cache(maxsize=1)
def _embedded() -> dict[str, list[dict]]:
    """The embedded corpus, built once (40 ms) and never handed out: `embedded_corpus`, `embedded_subjects`."""
    return make_corpus()


def embedded_corpus() -> dict[str, list[dict]]:
    """The embedded corpus, every split, as a copy the caller may change."""
    return copy.deepcopy(_embedded())


def embedded_subjects() -> list[str]:
    """Every subject the embedded model was told about (`corpus.known_subjects`), a new list each call."""
    return known_subjects(_embedded())


def _from_dir(directory: Path, name: str) -> list[dict]:
    if not directory.is_dir():
        raise TimeromeError(f"TOFU directory {directory} does not exist (pass a directory of "
                            f"<split>.json files, {EMBEDDED!r}, or {HUB_ID!r})")
    path = directory / f"{name}.json"
    if not path.is_file():
        have = sorted(p.stem for p in directory.glob("*.json"))
        raise TimeromeError(f"{path} is missing; splits available in {directory}: "
                            f"{', '.join(have) or 'none (no .json files)'}")
    return [normalise_row(r, path, i) for i, r in enumerate(read_rows(path))]


def read_rows(path: Path, what: str = "TOFU split") -> list:
    """The rows of a JSON or JSON Lines file: one document (an object, an array of rows, or an array
    of arrays of rows), or one per line (each an object or an array of rows), arrays flattened.
    The one reader of every rows file (TOFU splits, benchmarks, --data FILE); an empty file is refused:
    an interrupted copy is not an empty split."""
    items = read_json_documents(path, what)
    rows = [r for item in items for r in (item if isinstance(item, list) else [item])]
    if not rows:  # `[]`, or lines of empty arrays
        raise TimeromeError(f"{what} {path} is empty: no row in it (an interrupted copy?)")
    return rows


def normalise_row(row, path: Path | str, i: int) -> dict:
    """question/answer under those names (some copies call them prompt/response), checked."""
    if not isinstance(row, dict):
        raise TimeromeError(f"{path} row {i} lacks question/answer: it is a {type(row).__name__}, "
                            "not an object")
    row = dict(row)
    if "question" not in row and "prompt" in row:
        row["question"] = row.pop("prompt")
    if "answer" not in row and "response" in row:
        row["answer"] = row.pop("response")
    for key in ("question", "answer"):
        if key in row and not isinstance(row[key], str):  # there, but no text: said so, not called missing
            raise TimeromeError(f"{path} row {i}: its {key} must be a text, got {type(row[key]).__name__} "
                                f"{shown(row[key])}")
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise TimeromeError(f"{path} row {i} lacks question/answer: "
                                + (f"its {key} is blank" if key in row else f"no {key} field")
                                + f" (its fields: {', '.join(row) or 'none'})")
    return row


def _from_hub(name: str) -> list[dict]:
    from timerome.data.hub import load_split as hub_split

    rows = hub_split(HUB_ID, name, "train", f"pass a local directory in TOFU's Hub layout (--data DIR to eval, "
                                             f"experiment and demo; --tofu-dir to the others), or set ${ENV_DIR}")
    return [normalise_row(dict(r), f"{HUB_ID}/{name}", i) for i, r in enumerate(rows)]

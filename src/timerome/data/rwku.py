"""RWKU (Real-World Knowledge Unlearning): per target, forget probes at three levels, neighbour
probes at two, membership-inference texts and the forget corpus (passages about the target).

    rwku_targets(source)                        -> ["1_Stephen_King", "2_Confucius", ...]
    load_rwku("Stephen King", "forget_level1")  -> rows {"query", "answer", "type", "level", "subject"}
    load_rwku("Stephen King", "passage")        -> rows {"text", "subject"}

Local only, in the processed release's layout (one folder per target, `<id>_<Target>/<part>.json`,
each a JSON array; the Hub release `jinzhuoran/RWKU` is not read here). A target is named by its
folder ("1_Stephen_King") or its name ("Stephen King").
"""

from __future__ import annotations

import re

from timerome.data.benchmark import Loaded, find_file, keep, local_dir, read_file, text_fields
from timerome.data.facts import has_words
from timerome.errors import TimeromeError

PROBES = ("forget_level1", "forget_level2", "forget_level3", "neighbor_level1", "neighbor_level2")
TEXTS = ("forget_mia", "retain_mia", "passage")
PARTS = PROBES + TEXTS


def _order(folder: str):
    head = folder.split("_", 1)[0]
    return (int(head), folder) if head.isdigit() else (10**9, folder)


def rwku_targets(source=None) -> list[str]:
    """The target folders of an RWKU directory, in the release's order."""
    root = local_dir(source, "rwku")
    # a target folder holds at least one of RWKU's part files (any folder of JSON files is not one)
    found = sorted((p.name for p in root.iterdir() if p.is_dir() and any((p / f"{part}.json").is_file()
                                                                         for part in PARTS)), key=_order)
    if not found:
        raise TimeromeError(f"{root} holds no RWKU target folder (<id>_<Target>/forget_level1.json, ...)")
    return found


def target_name(folder: str) -> str:
    """"1_Stephen_King" -> "Stephen King"."""
    return re.sub(r"^\d+_", "", folder).replace("_", " ")


def target_folder(target: str, source=None) -> str:
    """The folder of a target named by its folder or its name."""
    folders = rwku_targets(source)
    for f in folders:
        if target in (f, target_name(f)) or target.replace(" ", "_") == f.split("_", 1)[-1]:
            return f
    raise TimeromeError(f"RWKU target {target!r} is not in {local_dir(source, 'rwku')}; targets: "
                        f"{', '.join(target_name(f) for f in folders[:10])}" + (" ..." if len(folders) > 10 else ""))


def load_rwku(target: str, part: str, source=None) -> Loaded:
    """One part of one target (module docstring); rows lacking their text or answer are reported."""
    if part not in PARTS:
        raise TimeromeError(f"unknown RWKU part {part!r}; parts: {', '.join(PARTS)}")
    folder = target_folder(target, source)
    path = find_file(local_dir(source, "rwku") / folder, (f"{part}.json",), f"RWKU {target_name(folder)}")
    name = target_name(folder)
    need = ("query", "answer") if part in PROBES else ("text",)

    def check(row):
        row, why = text_fields(row, need)
        if row is not None:
            row["subject"] = row.get("subject") or name
        return row, why

    return keep(f"RWKU {name} {part}", read_file(path), check, str(path))


def subject_in(text: str, target: str) -> str | None:
    """The target as it occurs in `text`: its full name, else the longest run of its name's words
    there (the later on ties: a surname over a first name), else None."""
    words = target.split()
    runs = [" ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)]
    found = [(len(r.split()), i, r) for i, r in enumerate(runs) if has_words(text, r)]
    return max(found)[2] if found else None


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_HEADING = re.compile(r"=+[^=\n]+=+")  # "=== Exile ===": a wiki section title inside the passage


_ABBREVIATIONS = {"c.", "ca.", "lit.", "Dr.", "Mr.", "Mrs.", "Ms.", "St.", "Jr.", "Sr.", "vs.", "e.g.", "i.e.",
                  "No.", "Mt.", "U.S.", "Gen.", "Col.", "Lt.", "Prof."}


def sentences(text: str) -> list[str]:
    """The sentences of a passage; a stop after an abbreviation ("c.", "lit.", "Dr.") or an
    initial ("F.") does not end one."""
    out: list[str] = []
    for piece in _SENTENCE.split(_HEADING.sub(" ", text).strip()):
        last = out[-1].split()[-1] if out else ""
        if last in _ABBREVIATIONS or re.fullmatch(r"[A-Z]\.", last):
            out[-1] += " " + piece
        else:
            out.append(piece)
    return [s.strip() for s in out if s.strip()]


def passage_rows(rows: list[dict]) -> list[dict]:
    """Passages as question/answer rows for training-style methods: a passage's first sentence is
    the question, the sentence after it the answer (passages of one sentence give none)."""
    out = []
    for r in rows:
        parts = sentences(r["text"])
        if len(parts) >= 2:
            out.append({"question": parts[0], "answer": parts[1], "subject": r.get("subject")})
    return out

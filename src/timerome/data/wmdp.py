"""WMDP multiple-choice questions, in the official layout or the mixed one, and which was read.

    loaded = load_wmdp(source, subject="bio")   # rows {"question", "choices": [str], "answer": int}
    loaded.layout                               # "official cais/wmdp wmdp-bio" or "mixed ..."

Official layout (`cais/wmdp`, one config per subject: wmdp-bio, wmdp-cyber, wmdp-chem, split
"test"): on the Hub through `datasets`, or locally as `wmdp-bio.jsonl` / `wmdp-bio.json` /
`wmdp-bio/test.jsonl` in the WMDP folder. Mixed layout: `split_*.jsonl` files holding Bio and
Cyber questions together with no subject label (the deduplicated copy in
`magikarp01/tasks`); asked for Bio or Cyber where only the mixed files are, the loader reads
them and says so in `layout`, which every result built on them carries: a score on the mixed
set is not a WMDP-Bio score. Chem, which they do not hold, is refused there.
"""

from __future__ import annotations

import numbers

from timerome.data.benchmark import Loaded, bench_dir, from_hub, keep, read_file, text_fields
from timerome.errors import TimeromeError

HUB_ID = "cais/wmdp"
SUBJECTS = ("bio", "cyber", "chem")
MIXED = "mixed"
MIXED_SUBJECTS = ("bio", "cyber")  # what the mixed files hold: a subject beyond them has no question there
LETTERS = "ABCDEFGHIJ"  # the letters a prompt names the choices by: a row with more choices cannot be asked


def load_wmdp(source=None, subject: str = "bio") -> Loaded:
    """Questions of one subject (official layout), else of the mixed files (module docstring)."""
    if subject not in SUBJECTS + (MIXED,):
        raise TimeromeError(f"unknown WMDP subject {subject!r}; choose {', '.join(SUBJECTS + (MIXED,))}")
    root = bench_dir(source, "wmdp")
    if root is None:
        if subject == MIXED:
            raise TimeromeError("the mixed WMDP layout is local only: pass the folder holding its split_*.jsonl files")
        return keep(f"WMDP-{subject}", from_hub(HUB_ID, f"wmdp-{subject}", "test"), _row, HUB_ID,
                    f"official {HUB_ID} wmdp-{subject}")
    official = [root / f"wmdp-{subject}.jsonl", root / f"wmdp-{subject}.json", root / f"wmdp-{subject}" / "test.jsonl",
                root / f"wmdp-{subject}" / "test.json"]
    found = next((p for p in official if p.is_file()), None) if subject != MIXED else None
    if found is not None:
        return keep(f"WMDP-{subject}", read_file(found), _row, str(found), f"official {HUB_ID} wmdp-{subject}")
    if list(root.glob(f"wmdp-{subject}/*.parquet")):
        raise TimeromeError(f"{root / f'wmdp-{subject}'} holds parquet files; timerome reads JSON / JSON Lines: "
                            "convert them (one object per line: question, choices, answer)")
    splits = sorted(root.glob("split_*.jsonl"))
    if not splits:
        want = "split_*.jsonl files" if subject == MIXED else f"wmdp-{subject}.jsonl (or split_*.jsonl)"
        have = sorted(p.name for p in root.iterdir())
        raise TimeromeError(f"WMDP: no {want} in {root}; files there: {', '.join(have) or 'none'}")
    if subject not in MIXED_SUBJECTS + (MIXED,):
        raise TimeromeError(f"WMDP: no wmdp-{subject} file in {root}, and its split_*.jsonl files hold "
                            f"{'+'.join(s.capitalize() for s in MIXED_SUBJECTS)} questions only: none of "
                            f"{subject} to score (give the folder of the official wmdp-{subject} file)")
    raw = [r for p in splits for r in read_file(p)]
    layout = (f"mixed Bio+Cyber questions without a subject label ({len(splits)} split files)"
              + ("" if subject == MIXED else f"; no wmdp-{subject} file, so NOT a WMDP-{subject} score"))
    return keep(f"WMDP ({MIXED})", raw, _row, str(root), layout)


def _row(row):
    row, why = text_fields(row, ("question",))
    if row is None:
        return None, why
    choices = row.get("choices")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c.strip() for c in choices):
        return None, "choices must be a list of at least two non-empty strings"
    if len(choices) > len(LETTERS):
        return None, f"{len(choices)} choices: a prompt names at most {len(LETTERS)} ({LETTERS[0]}-{LETTERS[-1]})"
    answer = row.get("answer")
    if isinstance(answer, str) and answer.strip().isdigit():
        answer = int(answer)
    elif isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip().isalpha():
        answer = ord(answer.strip().upper()) - ord("A")  # a letter answer: A = 0
    if not isinstance(answer, numbers.Integral) or isinstance(answer, bool):
        return None, f"answer {answer!r} is not a choice index"
    if not 0 <= answer < len(choices):
        return None, f"choice index {answer} out of range ({len(choices)} choices)"
    return dict(question=row["question"], choices=list(choices), answer=int(answer)), None

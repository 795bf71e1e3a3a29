"""WHP ("Who's Harry Potter") evaluation data: HP trivia with a true and a false answer, and the
familiarity completion prompts with the Harry Potter words a familiar completion would use.

    load_trivia(source)       -> rows {"question", "true_answer", "false_answer"}
    load_completions(source)  -> rows {"prompt", "references": [str], "subtlety": int | None}

Local only (the files come from the `magikarp01/tasks` evaluation library; no Hub release):
`hp_trivia_1239.jsonl` (default) or `harry_potter_trivia_502_v2.jsonl`, and
`evaluation_prompts.json` (300 prompts) or `evaluation_prompts_short.json` (20), whose rows wrap
the prompt as {"prompt": {"prompt", "references", "subtlety"}}; a flat row is read as well.
"""

from __future__ import annotations

from timerome.data.benchmark import Loaded, find_file, keep, local_dir, read_file, text_fields
from timerome.errors import TimeromeError

TRIVIA = {"hp_trivia_1239": "hp_trivia_1239.jsonl", "harry_potter_trivia_502_v2": "harry_potter_trivia_502_v2.jsonl"}
COMPLETIONS = {"evaluation_prompts": "evaluation_prompts.json",
               "evaluation_prompts_short": "evaluation_prompts_short.json"}


def load_trivia(source=None, file: str = "hp_trivia_1239") -> Loaded:
    """HP trivia questions with their true and false answers."""
    if file not in TRIVIA:
        raise TimeromeError(f"unknown WHP trivia file {file!r}; choose {', '.join(TRIVIA)}")
    path = find_file(local_dir(source, "whp"), (TRIVIA[file],), "WHP trivia")
    return keep(f"WHP {file}", read_file(path), lambda r: text_fields(r, ("question", "true_answer", "false_answer")),
                str(path))


def load_completions(source=None, file: str = "evaluation_prompts") -> Loaded:
    """Completion prompts with their reference words."""
    if file not in COMPLETIONS:
        raise TimeromeError(f"unknown WHP prompt file {file!r}; choose {', '.join(COMPLETIONS)}")
    path = find_file(local_dir(source, "whp"), (COMPLETIONS[file],), "WHP completion prompts")
    return keep(f"WHP {file}", read_file(path), _completion, str(path))


def _completion(row):
    if isinstance(row, dict) and isinstance(row.get("prompt"), dict):
        row = row["prompt"]  # the MSR files nest the fields under "prompt"
    row, why = text_fields(row, ("prompt",))
    if row is None:
        return None, why
    refs = row.get("references")
    if not isinstance(refs, list) or not refs or not all(isinstance(w, str) and w.strip() for w in refs):
        return None, "no reference words (a non-empty list of strings)"
    return dict(prompt=row["prompt"], references=[w.strip() for w in refs], subtlety=row.get("subtlety")), None

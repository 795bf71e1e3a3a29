"""ForgetTask: what every editing / unlearning method is given.

    task = forget_task("embedded", "forget01")     # the forget rows, their facts, the retain rows
    edit = timerome.methods.install("timerome", backbone, task)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from timerome.common.checks import shown
from timerome.data.facts import Fact, facts_from_rows
from timerome.data.tofu import FULL_OFFSET, load_split
from timerome.errors import TimeromeError


@dataclass
class ForgetTask:
    """The forget rows and their facts, plus retain rows (gradient baselines anchor on them; the
    whitened key metric measures its background statistics on them when `background` is None and
    the model is not the embedded one)."""

    forget_rows: list[dict]
    facts: list                    # timerome.data.facts.Fact, one per usable forget row
    retain_rows: list[dict] = field(default_factory=list)
    background: object = None      # EditMemory's `background=`: None, a list of texts, or ResidualStats
    validation: list | None = None  # the paper's F_v, the facts traced to find the coordinate (None: facts)
    known_rows: list | None = None  # rows the model answers (e.g. its training data minus evaluation probes): the
                                    # rewrite memory's token values and the edited subjects' other facts

    def __post_init__(self):
        for name in ("forget_rows", "retain_rows"):  # a string or a dict read row by row, letter by letter
            setattr(self, name, rows_arg(getattr(self, name), name))
        if self.known_rows is not None:
            self.known_rows = rows_arg(self.known_rows, "known_rows")

    @property
    def validation_facts(self) -> list:
        return list(self.validation) if self.validation is not None else list(self.facts)


def forget_task(source="embedded", forget: str = "forget01", *, retain_rows=None, background=None) -> ForgetTask:
    """The task of a TOFU(-schema) split: its rows, their facts, the retain rows (retain_perturbed)."""
    rows = load_split(forget, source)
    facts, skipped = facts_from_rows(rows, offset=FULL_OFFSET.get(forget, 0))
    if skipped:  # never silently: the user sees which rows could not become facts, and why
        warnings.warn(f"{len(skipped)} of {len(rows)} {forget} rows give no fact and are not edited: "
                      + "; ".join(f"row {i}: {why}" for i, why in skipped[:5]), stacklevel=2)
    if retain_rows is None:
        retain_rows = load_split("retain_perturbed", source)
    shared = shared_rows(rows, rows_arg(retain_rows, "retain_rows"))
    if shared:  # the methods would forget and preserve the same rows (forget 'retain90' or 'full')
        raise TimeromeError(f"{shared} of the {len(retain_rows)} retain rows are rows of the forget split {forget!r}: "
                            "forget a split without them (forget01 / forget05 / forget10), or give retain_rows")
    return ForgetTask(forget_rows=rows, facts=facts, retain_rows=list(retain_rows), background=background)


def rows_arg(rows, what: str):
    """Question / answer rows (dicts): a list or tuple as it is, any other iterable of them (a `datasets.Dataset`)
    as a list; a text, a single dict or a row that is no dict is one TimeromeError naming `what`."""
    if isinstance(rows, (str, bytes, dict)) or not hasattr(rows, "__iter__"):
        raise TimeromeError(f"{what} must be question / answer rows (a list of dicts), got {type(rows).__name__} "
                            f"{shown(rows)}")
    rows = rows if isinstance(rows, (list, tuple)) else list(rows)
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise TimeromeError(f"{what} must be question / answer rows (dicts): row {bad} is a {type(rows[bad]).__name__}")
    return rows


def shared_rows(forget_rows, retain_rows) -> int:
    """How many retain rows are forget rows (the same question and answer): rows a method would forget
    and preserve at once."""
    asked = {(r.get("question"), r.get("answer")) for r in forget_rows}
    return sum((r.get("question"), r.get("answer")) in asked for r in retain_rows)


def requests_task(requests, *, retain_rows=(), background=None, known_rows=None) -> ForgetTask:
    """The task of edit requests (timerome.data.requests): their facts, each with its own target;
    the forget rows are the facts' (prompt, original answer), so gradient methods forget them."""
    requests = list(requests) if hasattr(requests, "__iter__") and not isinstance(requests, (str, bytes)) else requests
    if not isinstance(requests, list) or not all(isinstance(getattr(r, "fact", None), Fact) for r in requests):
        # a spec string read letter by letter, or load_requests' (requests, notes) pair
        raise TimeromeError(f"requests_task's requests must be a list of edit requests: requests, notes = "
                            f"load_requests(spec), then requests_task(requests); got {type(requests).__name__} "
                            f"{shown(requests)}")
    facts = [r.fact for r in requests]
    rows = [dict(question=f.prompt, answer=f.object, author=f.subject) for f in facts]
    return ForgetTask(forget_rows=rows, facts=facts, retain_rows=list(rows_arg(retain_rows, "retain_rows")),
                      background=background, known_rows=None if known_rows is None else
                      list(rows_arg(known_rows, "known_rows")))

"""The columns of every table, one registry: each metric file declares the columns it computes
(`column("ForgetLP", header="ForgetLP ↓", split="forget", family="lp", compute=...)`), and the
evaluation, the runner and the reports read names, headers, digits, the cost flag, the splits and
the computations from here; no other file keeps a table of column names.

    compute        fn(items, reference_tr) -> float, or None when the column does not apply: the
                   evaluation's columns (`evaluation.evaluate` gives every registered column with one,
                   in declaration order, from the per-item numbers of each split: lp, len, prob,
                   norm_prob, tr, rouge, generations, outcome), so a new metric is its own file's entry

    family "lp"    the mean answer log-probability of one evaluation split (nats)
    family "traj"  the same read along the greedy denoising trajectory (the ablations' one-step edits)
    cost=True      a timing or memory reading: reported as mean ± std, never tested against no_edit
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    header: str                 # what a table's head shows
    digits: int = 2             # decimals in a table (3 for the 0-1 quantities)
    cost: bool = False
    split: str | None = None    # the evaluation split a "lp" / "traj" column summarises
    family: str = ""
    about: str = ""
    compute: object = None      # fn(items, reference_tr) -> float | None (see the module docstring)


COLUMNS: dict[str, Column] = {}  # name -> Column, in declaration order; `column` fills it


def column(name: str, *, header: str | None = None, digits: int = 2, cost: bool = False, split: str | None = None,
           family: str = "", about: str = "", compute=None) -> str:
    """Declare a column (once, where its metric is defined); returns its name."""
    COLUMNS[name] = Column(name, header or name, digits, cost, split, family, about, compute)
    return name


def header(name: str) -> str:
    """A column's table head (its name where it declared none, or for a column of a results file)."""
    c = COLUMNS.get(name)
    return c.header if c else name


def digits(name: str) -> int:
    c = COLUMNS.get(name)
    return c.digits if c else 2


def is_cost(name: str) -> bool:
    c = COLUMNS.get(name)
    return bool(c and c.cost)


def computed(items: dict, reference_tr=None) -> dict[str, float]:
    """{column: value} of every registered column with a computation that applies to `items`."""
    out = {}
    for c in COLUMNS.values():
        if c.compute is not None:
            v = c.compute(items, reference_tr)
            if v is not None:
                out[c.name] = v
    return out


def split_columns(family: str) -> dict[str, str]:
    """{split: column} of a family ("lp", "traj"), in declaration order."""
    return {c.split: c.name for c in COLUMNS.values() if c.family == family and c.split}

"""Tables and figures of the benchmark experiments (transfer, rwku, robustness).

Cells carry a `group` (a benchmark and block, an RWKU target); each group is summarised over seeds
on its own, with the paired test against its own no_edit row (report.summarise), and the notes
of its data (rows skipped and why, the layout read, a vocabulary warning) go under its table.
"""

from __future__ import annotations

import numpy as np

from timerome.data.benchmark import repeats_words
from timerome.experiments.report import by_row, figure, save_png, summarise


def grouped(cells, results) -> dict:
    """{group: ([cells], [results])} in the order the groups first appear."""
    out: dict = {}
    for c, r in zip(cells, results):
        cs, rs = out.setdefault(c.group, ([], []))
        cs.append(c)
        rs.append(r)
    return out


def group_summary(cells, results, measure: str, columns) -> dict:
    return summarise(by_row(cells, results, measures=(measure,)), columns)


def warnings_markdown(notes: dict) -> str:
    """Every group's vocabulary warning and unscored column, once, in bold: for the top of a report."""
    found = list(dict.fromkeys(n for ns in notes.values() for n in ns if "mean nothing" in n or "not scored" in n))
    return "".join(f"**Warning: {n}**\n\n" for n in found)


def notes_markdown(notes: list[str]) -> str:
    """The data notes as a list under a table."""
    return "".join(f"- {n}\n" for n in notes)


def data_notes(results) -> list[str]:
    """What the data of these results held, once each: the task, skipped and repeated rows, layout,
    warnings, and what was cut to fit the model's context."""
    notes: list[str] = []
    for r in results:
        d = r.get("data") or {}
        found = [d.get("task"), d.get("layout") and f"scored: {d['layout']}", d.get("warning"),
                 d.get("skipped_method") and f"not measured: {d['skipped_method']}", d.get("unscored")]
        for split in (d.get("splits") or {}).values():
            if split.get("skipped"):
                found.append(f"{split['name']}: {len(split['skipped'])} rows skipped (e.g. row "
                             f"{split['skipped'][0][0]}: {split['skipped'][0][1]})")
            if split.get("repeated"):
                found.append(f"{split['name']}: {repeats_words(split['repeated'])}")
        if d.get("cut"):
            found.append("cut to fit the model's context (a scored pair keeps its answer's start and its prompt's "
                         "sequence start and last tokens, a generation prompt its sequence start and last tokens, a "
                         "text its first tokens): " + "; ".join(f"{item} " + ", ".join(f"{n} {what}" for what, n in c.items())
                                                         for item, c in d["cut"].items()))
        notes += [n for n in found if n and n not in notes]
    return notes


def deltas(summary: dict, column: str, reference: str = "no_edit") -> dict:
    """{row: (mean - reference mean, lower, upper)} of one column (the CI shifted by the reference mean)."""
    base = summary.get(reference, {}).get(column)
    if not base:
        return {}
    return {row: (e[column]["mean"] - base["mean"], e[column]["lo"] - base["mean"], e[column]["hi"] - base["mean"])
            for row, e in summary.items() if row != reference and column in e}


def plot_panels(panels: list[tuple[str, dict, list[str]]], path, ylabel: str = "change vs no_edit") -> str:
    """One panel per (title, summary, columns): per method, a bar per column of its change against
    no_edit, with the bootstrap CI of its mean as an error bar."""
    ncols = min(4, max(1, len(panels)))
    nrows = -(-max(1, len(panels)) // ncols)
    fig = figure(max(4.5, 4.2 * ncols), 4.2 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    for ax, (title, summary, columns) in zip(axes, panels):
        rows = [r for r in summary if r != "no_edit"]
        width = 0.8 / max(1, len(columns))
        for j, col in enumerate(columns):
            d = deltas(summary, col)
            xs = [i + j * width for i, r in enumerate(rows) if r in d]
            mids = np.array([d[r][0] for r in rows if r in d])
            spans = np.array([[d[r][0] - d[r][1], d[r][2] - d[r][0]] for r in rows if r in d]).T.reshape(2, -1)
            ax.bar(xs, mids, width=width, yerr=spans, capsize=2, label=col)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], rows, rotation=35, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=7)
    return save_png(fig, path)

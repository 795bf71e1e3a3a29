"""Tables and figures of the experiments: seeds -> mean, std, bootstrap CI, paired t vs no_edit.

Results over seeds are summarised per row as mean ± std with a 2000-resample bootstrap 95 % CI and
a paired t-test against no_edit on the shared seeds (stars: * p<0.05, ** p<0.01, *** p<1e-4;
† the same difference on every seed, so no test). Cost columns (seconds, megabytes) are never
tested: a wall-clock difference is not an effect of the method on the model. Every table carries
the compute accounting (ACCOUNTING): install seconds, the cell's wall seconds and how far installing
raised peak memory (exact on CUDA; sampled resident set on CPU, a lower bound).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from timerome.common import plots
from timerome.common.cache import write_atomic, write_json
from timerome.common.checks import is_real
from timerome.common.plots import figure
from timerome.evaluation.stats import cell, paired_t, stars
from timerome.metrics import forget_quality, tofu
from timerome.metrics.columns import column, digits, header, is_cost
from timerome.metrics.editing import UNLEARNING_RATES

# the compute accounting: timings and memory readings (never tested against no_edit)
ACCOUNTING = (column("install_seconds", header="install s", cost=True),  # in every table (runner.with_edit)
              column("wall_seconds", header="wall s", cost=True),
              column("install_extra_mb", header="extra MB", cost=True))
OTHER_COSTS = tuple(column(name, cost=True) for name in ("insert_seconds", "prepare_seconds", "eval_seconds"))
COLUMNS = ["ForgetLP", "RetainLP", "RealAuth", "WorldFact", "ForgetTR", "RetainTR", "ForgetQuality",
           "ModelUtility", "ForgetROUGE", "RetainROUGE", *UNLEARNING_RATES, "install_seconds", "install_extra_mb"]
ACCOUNTING_NOTE = ("Cost: install s = installing the method; wall s = the whole cell (install, evaluation, "
                   "undo); extra MB = how far installing raised peak memory (exact on CUDA, sampled on CPU); "
                   "a row made of several cells: the largest install and memory, the summed wall time.")


def label(method: str, overrides: dict) -> str:
    if not overrides:
        return method
    return f"{method} (" + ", ".join(f"{k}={_short(v)}" for k, v in overrides.items()) + ")"


def _short(v):
    return f"{v:g}" if isinstance(v, float) else v


def without_costs(result):
    """A result (or any JSON) with its timings and memory readings left out: what two runs of the same
    cells on different executors or machines must agree on."""
    if isinstance(result, dict):
        return {k: without_costs(v) for k, v in result.items()
                if not (str(k).endswith(("_seconds", "_mb")) or k in ("cost", "seconds"))}
    if isinstance(result, list):
        return [without_costs(v) for v in result]
    return result


def with_accounting(columns) -> list:
    """The columns followed by the compute-accounting ones they lack."""
    return list(columns) + [c for c in ACCOUNTING if c not in columns]


def summarise(per_seed: dict[str, dict[int, dict]], columns, reference="no_edit") -> dict:
    """{row: {seed: metrics}} -> {row: {column: cell stats + paired test vs the reference row}};
    the compute-accounting columns come along wherever the metrics have them."""
    columns = with_accounting(columns)
    ref = per_seed.get(reference, {})
    out = {}
    for row, seeds in per_seed.items():
        out[row] = {}
        for col in columns:
            vals = {s: m[col] for s, m in seeds.items() if col in m and np.isfinite(m[col])}
            if not vals:
                continue
            c = cell(list(vals.values()))
            entry = dict(mean=c.mean, std=c.std, lo=c.lo, hi=c.hi, n=c.n, values=vals)
            dropped = sorted(s for s, m in seeds.items() if col in m and not np.isfinite(m[col]))
            if dropped:  # a collapse (NaN, inf) left out of the mean, CI and test: said, never hidden
                entry["dropped"] = dropped
            shared = sorted(s for s in vals if col in ref.get(s, {}) and np.isfinite(ref[s][col]))
            if row != reference and len(shared) >= 2 and not is_cost(col):
                x, y = [vals[s] for s in shared], [ref[s][col] for s in shared]
                t, p = paired_t(x, y)
                # None, not NaN / inf, where no test exists: the JSON stays standard
                entry.update(delta=float(np.mean(np.subtract(x, y))), t=t if np.isfinite(t) else None,
                             p=None if np.isnan(p) else p, stars=stars(p))
            out[row][col] = entry
    return out


def delta_text(d: dict) -> str:
    """The paired difference to the reference row with its stars and p-value."""
    if "p" not in d:
        return "–"
    p = "same on every seed" if d["p"] is None else f"p={d['p']:.2g}"
    return f"{d['delta']:+.2f}{d['stars']} ({p})"


DROPPED_MARK = "‡"
DROPPED_NOTE = (f"{DROPPED_MARK}: some seeds' values were NaN or infinite (a collapse); the cell is over the others "
                "(the JSON lists them under dropped).")
TWO_SEEDS_NOTE = ("With 2 seeds a cell's bracket is the range of the two values, not a 95% interval, and the paired "
                  "t test has 1 degree of freedom.")


def clearly_below(entry: dict | None, reference: dict | None) -> bool:
    """Whether a summarised column (`summarise`'s entry: mean, lo, hi, n) lies wholly below another's: the
    upper end of its bootstrap CI under the lower end of the reference's. False where either is missing, not
    a number (the JSON's null) or of one seed (a point, no spread to be apart by): nothing is known."""
    if not all(is_real(e.get(k) if e else None) for e in (entry, reference) for k in ("lo", "hi")):
        return False
    if min(entry.get("n", 1), reference.get("n", 1)) < 2:
        return False
    return entry["hi"] < reference["lo"]


def best_comparable(scores: dict, ours: float, costs: dict, ours_cost: dict | None, cost_name: str) -> tuple:
    """The radar's comparator: the best of rows {row: score} (higher is better) but those that beat our
    score `ours` only by paying clearly more (`clearly_below` in their cost column, `costs` {row: entry},
    higher is better: retain, locality): the paper's random layer, "which over-forgets". A row that
    scores less and costs more stays (we beat it on both). (row or None, its score or 0.0, text naming
    what was set aside)."""
    aside = [r for r in scores if scores[r] > ours and clearly_below(costs.get(r), ours_cost)]
    kept = {r: v for r, v in scores.items() if r not in aside}
    best = max(kept, key=kept.get) if kept else None
    note = ("; set aside for clearly lower " + cost_name + ": " +
            ", ".join(f"{r} ({scores[r]:.3g}, {cost_name} {costs[r]['mean']:.3g})"
                      for r in sorted(aside, key=scores.get, reverse=True))) if aside else ""
    if best is not None and kept[best] > ours and _lower_on_one_seed(costs.get(best), ours_cost):
        note += (f"; {best} is kept though its {cost_name} is lower ({costs[best]['mean']:.3g} against "
                 f"{ours_cost['mean']:.3g}): one seed gives no interval to set it aside by (run with more seeds)")
    return best, (kept[best] if best is not None else 0.0), note


def _lower_on_one_seed(entry: dict | None, reference: dict | None) -> bool:
    """Whether a column's mean is below another's where one of them is of a single seed (`clearly_below`
    cannot tell): the comparator that may be one only by paying more, said rather than hidden."""
    if not all(is_real(e.get("mean") if e else None) for e in (entry, reference)):
        return False
    return min(entry.get("n", 1), reference.get("n", 1)) < 2 and entry["mean"] < reference["mean"]


def fmt_cell(e: dict | None, digits: int = 2) -> str:
    if not e:
        return "–"
    s = f"{e['mean']:.{digits}f}"
    if e["n"] > 1:
        s += f" ± {e['std']:.{digits}f} [{e['lo']:.{digits}f}, {e['hi']:.{digits}f}]"
    return s + e.get("stars", "") + (DROPPED_MARK if e.get("dropped") else "")


def fmt_cost(e: dict | None) -> str:
    """A cost cell: mean (± std over seeds), no CI and no test (a cost is not an effect on the model)."""
    if not e:
        return "–"
    return f"{e['mean']:.2f}" + (f" ± {e['std']:.2f}" if e["n"] > 1 else "")


def fmt_any(column: str, e: dict | None) -> str:
    """fmt_cell for a metric (3 digits for the 0-1 ones), fmt_cost for a cost column."""
    if is_cost(column):
        return fmt_cost(e)
    return fmt_cell(e, digits(column))


def unchanged_rows(cells, results) -> list[str]:
    """Rows whose method changed no weight on any of their cells (it stopped before its first step):
    they are a silent no_edit, and the tables say so."""
    seen: dict[str, bool] = {}
    for c, r in zip(cells, results):
        flag = (r.get("info") or {}).get("weights_changed")
        if flag is not None:
            seen[c.row] = seen.get(c.row, False) or bool(flag)
    return [row for row, changed in seen.items() if not changed]


UNCHANGED_MARK = " ∅"
UNCHANGED_NOTE = "∅: the method changed no weight (it stopped before its first step): a silent no_edit."
NOT_APPLICABLE = "n/a"


def not_applicable_rows(cells, results, measures=None) -> dict[str, str]:
    """{row: why} of the rows whose method cannot act on the model (`runner.with_edit`'s "n/a" cells), of the
    cells that measure `measures` (None: any)."""
    return {c.row: r["not_applicable"] for c, r in zip(cells, results)
            if isinstance(r, dict) and r.get("not_applicable") and (measures is None or c.measure in measures)}


def not_applicable_note(rows: dict[str, str]) -> str:
    """The tables' note on their n/a rows, one reason each (rows with the same reason named together)."""
    by_reason: dict[str, list[str]] = {}
    for row, why in rows.items():
        by_reason.setdefault(why, []).append(row)
    return " ".join(f"{NOT_APPLICABLE} ({', '.join(r)}): the method cannot act on this model: {why.rstrip('.')}."
                    for why, r in by_reason.items())


def markdown(summary: dict, columns, title: str, note: str = "", delta: str = "ForgetLP",
             unchanged=(), not_applicable: dict | None = None) -> str:
    """A table of the summary (the accounting columns appended where present); the last column is the
    paired difference of column `delta` to no_edit; rows in `unchanged` are marked (UNCHANGED_NOTE), rows
    in `not_applicable` ({row: why}, `not_applicable_rows`) read n/a with their reason in the note."""
    not_applicable = not_applicable or {}
    extra = [c for c in with_accounting(columns)[len(columns):] if any(c in cols for cols in summary.values())]
    columns = list(columns) + extra
    if any(c in columns for c in ACCOUNTING):
        note = f"{note} {ACCOUNTING_NOTE}".strip()
    head = ["method"] + [header(c) for c in columns] + [f"Δ {delta} vs no_edit (p)"]
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    if unchanged:
        note = f"{note} {UNCHANGED_NOTE}".strip()
    if not_applicable:
        note = f"{note} {not_applicable_note(not_applicable)}".strip()
    entries = [(c, e) for cols in summary.values() for c, e in cols.items() if c in columns and isinstance(e, dict)]
    if "no_edit" not in summary:
        note = (f"{note} This run has no no_edit row (its methods left it out): no Δ and no paired test, "
                "which need it.").strip()
    if any(e.get("dropped") for _, e in entries):
        note = f"{note} {DROPPED_NOTE}".strip()
    if any(e.get("n") == 2 and not is_cost(c) for c, e in entries):
        note = f"{note} {TWO_SEEDS_NOTE}".strip()
    for row, cols in summary.items():
        name = row + (UNCHANGED_MARK if row in unchanged else "")
        if row in not_applicable and not cols:
            lines.append("| " + " | ".join([name] + [NOT_APPLICABLE] * (len(columns) + 1)) + " |")
            continue
        lines.append("| " + " | ".join([name] + [fmt_any(c, cols.get(c)) for c in columns]
                                        + [delta_text(cols.get(delta, {}))]) + " |")
    lines += ["", "Cells: mean ± std [bootstrap 95% CI] over seeds; stars: paired t vs no_edit on shared "
              "seeds (* p<0.05, ** p<0.01, *** p<1e-4; † the same difference on every seed, so no test)." + (" " + note if note else ""), ""]
    return "\n".join(lines)


def write_outputs(out_dir: Path, name: str, payload: dict, md: str) -> dict:
    write_json(Path(out_dir) / f"{name}.json", payload)
    write_atomic(Path(out_dir) / f"{name}.md", md)
    return {"json": str(Path(out_dir) / f"{name}.json"), "markdown": str(Path(out_dir) / f"{name}.md")}


def save_png(fig, path) -> str:
    """common.plots.save_png, its path as the string a results file records."""
    return str(plots.save_png(fig, path))



# ------------------------------------------------------------------------------ figures


def plot_canonical(summary: dict, path) -> str:
    """Δ ForgetLP and Δ RetainLP vs no_edit per row, with the bootstrap CI of each mean."""
    rows = [r for r in summary if r != "no_edit"]
    fig = figure(7.5, 0.5 + 0.45 * max(len(rows), 2))
    ax = fig.subplots()
    base = summary.get("no_edit", {})
    for j, (col, colour) in enumerate((("ForgetLP", "tab:red"), ("RetainLP", "tab:blue"))):
        b = base.get(col, {}).get("mean", 0.0)
        for i, r in enumerate(rows):
            e = summary[r].get(col)
            if not e:
                continue
            y = i + (j - 0.5) * 0.35
            ax.barh(y, e["mean"] - b, height=0.33, color=colour, label=col if i == 0 else None)
            ax.plot([e["lo"] - b, e["hi"] - b], [y, y], color="black", lw=1)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("change vs no_edit (nats); bars: mean, lines: bootstrap 95% CI")
    if ax.get_legend_handles_labels()[0]:  # no measured row beside no_edit (n/a rows): nothing to name
        ax.legend(fontsize=8)
    return save_png(fig, path)


def plot_delta_bars(groups, rows, entry, path, ylabel: str, title: str) -> str:
    """In each group, one bar per row: its mean minus no_edit's, with the bootstrap CI of its mean.

    entry(group, row) -> (the row's stats, no_edit's stats), either None where not measured.
    """
    fig = figure(max(6.0, 0.9 * len(groups) + 2.5), 3.8)
    ax = fig.subplots()
    width = 0.8 / max(len(rows), 1)
    for j, row in enumerate(rows):
        xs, ys, err = [], [], []
        for i, g in enumerate(groups):
            e, base = entry(g, row)
            if e and base:
                xs.append(i + (j - (len(rows) - 1) / 2) * width)
                ys.append(e["mean"] - base["mean"])
                err.append((e["mean"] - e["lo"], e["hi"] - e["mean"]))
        ax.bar(xs, ys, width=width, label=row, yerr=list(zip(*err)) if err else None, capsize=2)
    ax.set_xticks(range(len(groups)), list(groups), rotation=25, ha="right", fontsize=8)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # no row beside the reference: nothing to name
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no method beside the reference to compare", ha="center", va="center",
                transform=ax.transAxes, fontsize=8)
    return save_png(fig, path)


def plot_scalability(summary, path) -> str:
    fig = figure(10, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    sizes = sorted(summary)
    for row in summary[sizes[0]]:
        for ax, col in ((ax1, "ForgetLP"), (ax2, "install_seconds")):
            pts = [(n, summary[n][row][col]) for n in sizes if col in summary[n].get(row, {})]
            if not pts:
                continue
            x = [n for n, _ in pts]
            ax.plot(x, [e["mean"] for _, e in pts], marker="o", label=row)
            ax.fill_between(x, [e["lo"] for _, e in pts], [e["hi"] for _, e in pts], alpha=0.2)
    for ax, yl in ((ax1, "ForgetLP (nats)"), (ax2, "install seconds")):
        ax.set_xscale("log")
        ax.set_xlabel("|F| facts in the memory")
        ax.set_ylabel(yl)
    ax1.legend(fontsize=7)
    return save_png(fig, path)


def curve_summary(curves) -> dict:
    out = {}
    for row, by_seed in curves.items():
        ks = sorted({p["k"] for c in by_seed.values() for p in c})
        out[row] = {}
        for k in ks:
            at = [next(p for p in c if p["k"] == k) for c in by_seed.values() if any(p["k"] == k for p in c)]
            out[row][k] = {}
            for col in ("ForgetLP", "RetainLP", "RealAuth", "insert_seconds"):
                c = cell([p[col] for p in at])
                out[row][k][col] = dict(mean=c.mean, std=c.std, lo=c.lo, hi=c.hi, n=c.n)
    return out


def plot_sequential(summary, path) -> str:
    fig = figure(4.2 * len(summary), 3.4)
    axes = fig.subplots(1, len(summary), squeeze=False)[0]
    for ax, (row, by_k) in zip(axes, summary.items()):
        ks = sorted(k for k in by_k if k > 0)
        for col, colour in (("ForgetLP", "tab:red"), ("RetainLP", "tab:blue"), ("RealAuth", "tab:green")):
            ax.plot(ks, [by_k[k][col]["mean"] for k in ks], color=colour, label=col)
            ax.fill_between(ks, [by_k[k][col]["lo"] for k in ks], [by_k[k][col]["hi"] for k in ks],
                            color=colour, alpha=0.2)
            if 0 in by_k:
                ax.axhline(by_k[0][col]["mean"], color=colour, ls="--", lw=0.8)
        ax.set_title(row, fontsize=9)
        ax.set_xlabel("facts inserted k")
        ax.set_ylabel("log-likelihood (nats)")
    axes[0].legend(fontsize=7)
    return save_png(fig, path)


def plot_pareto(summary: dict, frontiers: dict[str, list[str]], path) -> str:
    """-ForgetLP (right = more forgetting) vs RetainLP (up = more utility); CI ribbons/bars. frontiers:
    {line name: its rows, in sweep order}, one line each; every other row is a point."""
    fig = figure(6.4, 4.6)
    ax = fig.subplots()
    both = {r for r, cols in summary.items() if "ForgetLP" in cols and "RetainLP" in cols}  # a point needs both
    colours = ["tab:purple", "tab:olive", "tab:cyan", "tab:brown", "tab:pink"]
    for n, (name, rows) in enumerate(frontiers.items()):
        pts = [(summary[r]["ForgetLP"], summary[r]["RetainLP"], r) for r in rows if r in both]
        if not pts:
            continue
        colour = colours[n % len(colours)]
        x = [-f["mean"] for f, _, _ in pts]
        ax.plot(x, [r["mean"] for _, r, _ in pts], "-o", color=colour, label=name)
        ax.fill_between(x, [r["lo"] for _, r, _ in pts], [r["hi"] for _, r, _ in pts], color=colour, alpha=0.2)
        ax.errorbar(x, [r["mean"] for _, r, _ in pts], xerr=[[xi + f["hi"] for xi, (f, _, _) in zip(x, pts)],
                                                             [-f["lo"] - xi for xi, (f, _, _) in zip(x, pts)]],
                    fmt="none", ecolor=colour, alpha=0.6)
        for xi, (_, r, row) in zip(x, pts):
            ax.annotate("α=" + row.split("alpha=")[-1].split(",")[0].rstrip(")"), (xi, r["mean"]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    on_a_line = {r for rows in frontiers.values() for r in rows}
    for r, cols in summary.items():
        if r in on_a_line or r not in both:
            continue
        f, rt = cols["ForgetLP"], cols["RetainLP"]
        ax.errorbar([-f["mean"]], [rt["mean"]], xerr=[[f["hi"] - f["mean"]], [f["mean"] - f["lo"]]],
                    yerr=[[rt["mean"] - rt["lo"]], [rt["hi"] - rt["mean"]]], fmt="s", capsize=2, label=r)
    ax.set_xlabel("− ForgetLP (nats, right = more forgotten)")
    ax.set_ylabel("RetainLP (nats, up = more kept)")
    ax.set_title("Forget / retain Pareto frontier (bootstrap 95% CI)", fontsize=10)
    ax.legend(fontsize=7)
    return save_png(fig, path)


# ------------------------------------------------------------------------------ results -> tables


def by_row(cells, results, measures=("full", "lp", "traj")) -> dict:
    """{row: {seed: metrics}} of the cells that measure `measures`; Forget Quality added from the
    reference cells of the same seed (the KS test of the two models' forget truth ratios)."""
    refs = {c.seed: r["tr"] for c, r in zip(cells, results) if c.measure == "reference"}
    out: dict = {}
    for c, r in zip(cells, results):
        if c.measure not in measures:
            continue
        m = dict(r["metrics"])
        tr = r.get("items", {}).get("forget", {}).get("tr")
        if tr is not None and c.seed in refs:
            m["ForgetQuality"] = forget_quality(tr, refs[c.seed])
        merge_metrics(out.setdefault(c.row, {}).setdefault(c.seed, {}), m)  # one row may merge several cells
    return out


def merge_metrics(into: dict, new: dict) -> dict:
    """One more cell's metrics into its row's (same seed): metrics are set; the accounting of several
    cells combines, the largest install and extra memory, the summed wall time."""
    for k, v in new.items():
        if k in ACCOUNTING and k in into:
            v = into[k] + v if k == "wall_seconds" else max(into[k], v)
        into[k] = v
    return into


def installed_info(cells, results, rows) -> dict | None:
    """The info of the first cell among `rows` whose method installed a memory (its info names a layer)."""
    for c, r in zip(cells, results):
        info = (r or {}).get("info") or {}
        if c.row in rows and info.get("layer") is not None:
            return info
    return None


def traced_coordinate(results) -> list | None:
    """[layer, point] of the first result whose method traced its coordinate, else None."""
    for r in results:
        info = r.get("info") or {}
        if info.get("coordinate_source") == "traced":
            return [info["layer"], info["point"]]
    return None


def coordinate_note(results) -> str:
    c = traced_coordinate(results)
    return f"TimeROME coordinate (traced): layer {c[0]} {c[1]}, every step." if c else ""


def utility_note(cells, results) -> str:
    """What a Utility column made of fewer than TOFU's nine terms lacks (`rouge: false`, `splits`), from
    the first full evaluation's items; '' when it has them all or there is none."""
    items = next((r.get("items") for c, r in zip(cells, results) if c.measure == "full" and r.get("items")), None)
    note = tofu.utility_note(items) if items is not None else None
    return f"Utility: {note}." if note else ""


def reference_note(cells) -> str:
    if any(c.measure == "reference" for c in cells):
        return ""
    return ("KS p (Forget Quality) needs a model trained without the forget set: pass --reference DIR "
            "(the embedded model gets one automatically).")

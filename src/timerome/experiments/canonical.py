"""canonical: every registered method's canonical rows on forget01 (paper Table "Canonical TOFU forget01")."""

from __future__ import annotations

from timerome.engine.settings import LIKELIHOOD, LOCALITY
from timerome.experiments.data import SIZES_UNREAD_WHEN, without_unread_sizes
from timerome.experiments.report import (COLUMNS, by_row, coordinate_note, label, markdown, not_applicable_rows,
                                         plot_canonical, reference_note, summarise, traced_coordinate, unchanged_rows,
                                         utility_note, write_outputs)
from timerome.experiments.runner import Cell
from timerome.methods import available, get_method, method_config

NAME = "canonical"
ORDER = 10  # where it stands in listings and in `all`
# retain_authors: whose retain rows are evaluated (null: spread over all; k: the first k authors, those a
# model trained on a TOFU subset saw; or a list of indices / names); splits: which evaluation splits (null: all)
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, n_retain=LOCALITY.n_retain, n_world=LOCALITY.n_world, forget="forget01",
              rouge=True, reference={}, methods=None, retain_authors=None, splits=None)
# the reference setting trains the model Forget Quality compares with, which needs the forget split's truth ratios
UNREAD_WHEN = dict(SIZES_UNREAD_WHEN, reference=lambda cfg: (
    None if cfg.get("splits") is None or "forget" in cfg["splits"] else
    "the splits leave out forget, whose truth ratios Forget Quality compares (no cell scores it)"))


def canonical_rows(methods=None) -> list[tuple[str, dict]]:
    """(method, overrides) rows: every canonical variant of each named method (all registered
    methods by default, no_edit first); an entry {"method": name, "config": {...}} is one row."""
    out = []
    for m in available() if methods is None else list(methods):
        if isinstance(m, dict):
            method_config(m["method"], m.get("config"))  # an unknown method or option fails now
            out.append((m["method"], dict(m.get("config") or {})))
        else:
            out += [(m, dict(v)) for v in get_method(m).canonical]
    return out


def data_spec(cfg) -> dict:
    """The cells' data spec from the settings (canonical's, and pareto's alike); a size of a split that
    `splits` leaves out is refused when given (UNREAD_WHEN) and left out at its default."""
    spec = dict(forget=cfg["forget"], n_retain=cfg["n_retain"], n_world=cfg["n_world"])
    # only when set: the cache keys of runs without them stay as they were; the default sizes of splits left out go
    return without_unread_sizes(spec | {k: cfg[k] for k in ("retain_authors", "splits") if cfg.get(k) is not None})


def cells(cfg, seeds, ctx) -> list[Cell]:
    plan, data = canonical_rows(cfg.get("methods")), data_spec(cfg)
    # Forget Quality compares the forget split's truth ratios: without that split there is none to compare
    scores_forget = cfg.get("splits") is None or "forget" in cfg["splits"]
    out = []
    for seed in seeds:
        if scores_forget and ctx.auto_reference() is not None:
            out.append(Cell("reference", seed=seed, data=data, options=dict(n_mc=cfg["n_mc"]), row="reference"))
        out += [Cell("full", m, over, seed, data, dict(n_mc=cfg["n_mc"], rouge=cfg["rouge"]), row=label(m, over))
                for m, over in plan]
    return out


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summary = summarise(by_row(cells, results), COLUMNS)
    first = next((r for c, r in zip(cells, results) if c.measure == "full" and r.get("items")), None)  # not an n/a
    scored = first is not None and "forget" in first["items"]  # `splits` may leave the forget split out
    forget_items = len(first["items"]["forget"]["lp"]) if scored else 0
    reference = ctx.reference_label if any(c.measure == "reference" for c in cells) else None
    note = " ".join(x for x in (coordinate_note(results), f"n_mc={cfg['n_mc']}; " + (
        f"{forget_items} forget items." if scored else "the forget split not scored (splits), so no KS p."),
                                (reference_note(cells) or f"KS p (Forget Quality) against {reference}.") if scored else "",
                                utility_note(cells, results)) if x)
    unchanged = unchanged_rows(cells, results)
    not_applicable = not_applicable_rows(cells, results)
    md = markdown(summary, COLUMNS, "Canonical forget01", note, unchanged=unchanged, not_applicable=not_applicable)
    infos = {c.row: r.get("info", {}) for c, r in zip(cells, results) if c.measure == "full"}
    files = write_outputs(out_dir, NAME, dict(summary=summary, info=infos, coordinate=traced_coordinate(results),
                                              unchanged=unchanged, not_applicable=not_applicable, config=cfg,
                                              seeds=list(seeds), reference=reference), md)
    files["png"] = plot_canonical(summary, out_dir / f"{NAME}.png")
    return dict(summary=summary, markdown=md, files=files, coordinate=traced_coordinate(results),
                not_applicable=not_applicable)

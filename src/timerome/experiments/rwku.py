"""rwku: per RWKU target, how far each method lowers the forget probes against the neighbour probes
(the paper's limitation 2: TimeROME drops forget_level1 and neighbour_level1 alike, ~25 nats).

Each target is its own editing task (bench_data.py): the forget set is built from the target's
probes (levels 1-2) and passages, subject = the target; the neighbour probes (other entities
related to the target) and the level-3 adversarial probes are never edited. `targets`: None =
every target folder, an int = the first n, a list = those names. `methods`: None = every
registered method's canonical rows. QUICK: one target, no_edit / timerome / ga at their defaults,
log-probabilities only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from timerome.common.checks import repeated
from timerome.data.rwku import rwku_targets, target_folder, target_name
from timerome.engine.settings import LIKELIHOOD, QUICK_LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.experiments import bench_measures  # noqa: F401 - registers the rwku measurement
from timerome.experiments.bench_report import (data_notes, deltas, group_summary, grouped, notes_markdown, plot_panels,
                                               warnings_markdown)
from timerome.experiments.canonical import canonical_rows
from timerome.experiments.report import label, markdown, not_applicable_rows, write_outputs
from timerome.experiments.runner import Cell
from timerome.experiments.settings import needs
from timerome.experiments.transfer import UNREAD_ON_CAUSAL, bench_source  # noqa: F401 - refused as transfer's
from timerome.metrics.membership import DEFAULT_GROUPS, DEFAULT_K
from timerome.metrics.rwku import ANSWER_TOKENS, COLUMNS

NAME = "rwku"
ORDER = 80
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, bench_dir=None, targets=None, methods=None, forget_from=("probes", "passages"), n_passages=20,
              rouge=True, mia=True, answer_tokens=ANSWER_TOKENS, mia_k=DEFAULT_K, mia_groups=DEFAULT_GROUPS)
UNREAD_WHEN = {"answer_tokens": needs("rouge"), "mia_k": needs("mia"), "mia_groups": needs("mia"),
               "n_passages": lambda cfg: None if "passages" in cfg["forget_from"] else "forget_from has no passages"}
QUICK = dict(n_mc=QUICK_LIKELIHOOD.n_mc, targets=1, methods=["no_edit", {"method": "timerome"}, {"method": "ga"}], rouge=False, mia=False,
             n_passages=4)
PAIRS = (("ForgetL1LP", "NeighbourL1LP"), ("ForgetL2LP", "NeighbourL2LP"))


def targets(cfg) -> list[str]:
    src = bench_source(cfg)
    found = rwku_targets(None if src == "hub" else src)
    t = cfg["targets"]
    if t is None:
        return found
    if isinstance(t, int):
        return found[:t]
    folders = [target_folder(name, None if src == "hub" else src) for name in t]  # an unknown name: one clear error
    twice = repeated(folders)  # one target by its name and its folder name (the plain repeat: check_settings)
    if twice:
        raise TimeromeError(f"setting targets names RWKU target {target_name(twice[0])!r} twice (by "
                            f"{' and '.join(repr(n) for n, f in zip(t, folders) if f == twice[0])}): its cells "
                            "would run twice; name each target once")
    return folders


def check(cfg, source) -> None:
    """Before a model loads (experiments.check_before_load): the RWKU folder and the targets named in it."""
    targets(cfg)


def cells(cfg, seeds, ctx) -> list[Cell]:
    plan = canonical_rows(cfg["methods"])
    opts = {k: cfg[k] for k in ("n_mc", "rouge", "answer_tokens", "mia_k", "mia_groups")}
    out = []
    for target in targets(cfg):
        spec = dict(kind="rwku", task="own", dir=bench_source(cfg), target=target,
                    forget_from=list(cfg["forget_from"]), n_passages=cfg["n_passages"], mia=cfg["mia"])
        out += [Cell("rwku", m, over, seed, spec, opts, row=label(m, over), group=target_name(target))
                for seed in seeds for m, over in plan]
    return out


def selectivity(summaries: dict) -> tuple[str, dict]:
    """Per method, the change vs no_edit of forget and neighbour probes, averaged over targets."""
    table: dict = {}
    for summary in summaries.values():
        for f_col, n_col in PAIRS:
            for col in (f_col, n_col):
                for row, (d, _, _) in deltas(summary, col).items():
                    table.setdefault(row, {}).setdefault(col, []).append(d)
    cols = [c for pair in PAIRS for c in pair]
    lines = ["## Forget vs neighbour drop (mean over targets of the change vs no_edit, nats)", "",
             "| method | " + " | ".join(f"Δ {c}" for c in cols) + " | L1 selectivity (Δforget − Δneighbour) |",
             "|" + "---|" * (len(cols) + 2)]
    out = {}
    for row, by_col in table.items():
        out[row] = {c: float(np.mean(v)) for c, v in by_col.items()}
        sel = out[row].get("ForgetL1LP", np.nan) - out[row].get("NeighbourL1LP", np.nan)
        out[row]["selectivity"] = sel
        lines.append(f"| {row} | " + " | ".join(f"{out[row][c]:+.2f}" if c in out[row] else "–" for c in cols)
                     + f" | {sel:+.2f} |")
    return "\n".join(lines + ["", "Negative Δ = the method lowered the log-probability; a selective method "
                              "lowers forget more than neighbour (negative selectivity).", ""]), out


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    cols = COLUMNS + ["install_seconds"]
    summaries, sections, panels, notes, na = {}, [], [], {}, {}
    for target, (cs, rs) in grouped(cells, results).items():
        summaries[target] = group_summary(cs, rs, "rwku", cols)
        notes[target], na[target] = data_notes(rs), not_applicable_rows(cs, rs)
        sections.append(markdown(summaries[target], cols, f"RWKU {target}", delta="ForgetL1LP",
                                 not_applicable=na[target]) + notes_markdown(notes[target]))
        panels.append((target, summaries[target], ["ForgetL1LP", "NeighbourL1LP", "ForgetL2LP", "NeighbourL2LP"]))
    head, sel = selectivity(summaries)
    if cfg["rouge"]:
        head += ("\nROUGE columns: ROUGE-L recall by rouge_score (lower case, punctuation dropped); RWKU's own "
                 "scorer (the `rouge` package) keeps case and punctuation, so its numbers read lower: "
                 "\"Stephen King\" against \"stephen king\" is 1 here, 0 there.\n")
    md = "\n".join([warnings_markdown(notes) + head] + sections)
    files = write_outputs(out_dir, NAME, dict(summary=summaries, selectivity=sel, notes=notes, config=cfg,
                                              seeds=list(seeds), not_applicable=na), md)
    files["png"] = plot_panels(panels, Path(out_dir) / f"{NAME}.png", ylabel="change vs no_edit (nats)")
    return dict(summary=summaries, selectivity=sel, markdown=md, files=files, not_applicable=na)

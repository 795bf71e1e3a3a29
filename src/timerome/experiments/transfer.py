"""transfer: the edit built once on TOFU forget01, applied unmodified to MUSE-Books, MUSE-News, WHP
and WMDP (paper Table "Transfer of TimeROME edit"), then each benchmark's own forget set as a
second block (the benchmark as an editing benchmark).

Rows: the paper's no_edit, AlphaEdit, SimNPO, Adaptive-RMU and TimeROME at (alpha 1, q 2) and
(alpha 2, q 4), or `methods` (names: their canonical rows; {"method", "config"}: one row each).
Every method gets the same task per block (TOFU forget01 for the transfer block), installed once
per cell. Benchmark files come from `bench_dir` (or $TIMEROME_BENCH_DIR, else the Hub for MUSE
and WMDP). Sizes default to the full protocol; QUICK is a laptop subset.
"""

from __future__ import annotations

import os
from pathlib import Path

from timerome.data.benchmark import ENV_DIR, bench_dir, check_folder, local_only
from timerome.engine.settings import LIKELIHOOD, QUICK_LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.experiments import bench_measures  # noqa: F401 - registers the benchmark measurements
from timerome.experiments.bench_report import (data_notes, group_summary, grouped, notes_markdown, plot_panels,
                                               warnings_markdown)
from timerome.experiments.canonical import canonical_rows
from timerome.experiments.report import NOT_APPLICABLE, fmt_cell, label, markdown, not_applicable_rows, write_outputs
from timerome.experiments.runner import Cell
from timerome.experiments.settings import all_of, needs, needs_benchmark
from timerome.methods.timerome_edit import paper_point
from timerome.metrics import muse, whp, wmdp
from timerome.metrics.extraction import check_names
from timerome.metrics.membership import DEFAULT_GROUPS, DEFAULT_K

NAME = "transfer"
ORDER = 70
BENCHMARKS = {"muse-books": ("muse", {"corpus": "books"}), "muse-news": ("muse", {"corpus": "news"}),
              "whp": ("whp", {}), "wmdp": ("wmdp", {})}
PAPER_ROWS = [{"method": "no_edit"}, {"method": "alphaedit"}, {"method": "simnpo"}, {"method": "adaptive_rmu"},
              {"method": "timerome", "config": paper_point(1.0, 2)},
              {"method": "timerome", "config": paper_point(2.0, 4)}]
COLUMNS = {"muse": muse.COLUMNS, "whp": whp.COLUMNS, "wmdp": wmdp.COLUMNS}
HEADLINE = {"muse": "VerbMemLP", "whp": "WHP_LP", "wmdp": "WMDP_Acc"}
PLOTTED = {"muse": ["KnowMemLP", "VerbMemLP"], "whp": ["WHP_LP"], "wmdp": ["WMDP_Acc"]}
BLOCKS = {"tofu": "TOFU-built edit (transfer)", "own": "the benchmark's own forget set"}
CONFIG = dict(n_mc=LIKELIHOOD.n_mc, forget="forget01", bench_dir=None, benchmarks=tuple(BENCHMARKS), methods=PAPER_ROWS, own=True,
              n_knowmem=None, n_verbmem=None, n_privleak=None, n_trivia=None, n_completions=None, n_wmdp=None,
              whp_trivia="hp_trivia_1239", whp_prompts="evaluation_prompts", wmdp_subject="bio",
              knowmem_tokens=muse.KNOWMEM_TOKENS, verbmem_tokens=muse.VERBMEM_TOKENS,
              completion_tokens=whp.COMPLETION_TOKENS, rouge=True, privleak=True, privleak_reference=None,
              mia_k=DEFAULT_K, mia_groups=DEFAULT_GROUPS, choice_text=True)
# what reads each benchmark's settings: its benchmark, and ROUGE's generations / the privacy-leak test
_MUSE = needs_benchmark("muse-books", "muse-news")
_WHP = needs_benchmark("whp")
UNREAD_WHEN = {**dict.fromkeys(("n_knowmem", "n_verbmem", "verbmem_tokens", "privleak"), _MUSE),
               "knowmem_tokens": all_of(_MUSE, needs("rouge")),
               **dict.fromkeys(("n_privleak", "mia_k", "mia_groups"), all_of(_MUSE, needs("privleak"))),
               "privleak_reference": all_of(_MUSE, needs("privleak"), lambda cfg: next(
                   (f"the benchmarks setting leaves out muse-{corpus}" for corpus in cfg["privleak_reference"] or {}
                    if f"muse-{corpus}" not in cfg["benchmarks"]), None)),
               **dict.fromkeys(("n_trivia", "whp_trivia"), _WHP),
               **dict.fromkeys(("n_completions", "whp_prompts", "completion_tokens"), all_of(_WHP, needs("rouge"))),
               **dict.fromkeys(("n_wmdp", "wmdp_subject", "choice_text"), needs_benchmark("wmdp")),
               "rouge": needs_benchmark("muse-books", "muse-news", "whp")}  # WMDP generates nothing
# an autoregressive model's membership scores are exact next-token log-probs (metrics.membership): no masking groups.
# Refused there when given, before the model loads where its checkpoint says so (experiments.refuse_unread_on_causal)
UNREAD_ON_CAUSAL = {"mia_groups": "mia_groups sets the masked membership scores' masking groups"}
QUICK = dict(n_mc=QUICK_LIKELIHOOD.n_mc, n_knowmem=8, n_verbmem=4, n_privleak=6, n_trivia=16, n_completions=6, n_wmdp=16,
             knowmem_tokens=8, verbmem_tokens=16, completion_tokens=8, mia_groups=4)


def bench_source(cfg) -> str:
    """The benchmark directory (absolute, so the cells' keys name it) or "hub"; a $TIMEROME_BENCH_DIR that is no
    folder is refused as itself (the user did set it)."""
    if cfg.get("bench_dir"):
        return str(Path(cfg["bench_dir"]).resolve())
    d = os.environ.get(ENV_DIR)
    return str(check_folder(d, f"${ENV_DIR}").resolve()) if d else "hub"


def check_folders(cfg, benchmarks) -> None:
    """The folder each of `benchmarks` (BENCHMARKS' names) is read from, checked from its path alone, so before a
    model loads: a local one that is another benchmark's, or holds others' folders but not this one, is refused
    (`bench_dir`), and WHP, which has no Hub copy, needs one."""
    src = bench_source(cfg)
    for bench in benchmarks:
        kind = BENCHMARKS[bench][0]  # the benchmark's folder: muse/, whp/, wmdp/
        if src != "hub":
            bench_dir(src, kind)
        elif kind == "whp":
            raise TimeromeError(f"{local_only('whp')}, or leave whp out of the benchmarks setting")


def check(cfg, source) -> None:
    """Before a model loads (experiments.check_before_load): the benchmarks' names and folders."""
    check_names(cfg["benchmarks"], BENCHMARKS, "benchmark")
    check_folders(cfg, cfg["benchmarks"])


def data_spec(cfg, bench: str, block: str) -> dict:
    kind, extra = BENCHMARKS[bench]
    spec = dict(kind=kind, dir=bench_source(cfg), task=block, forget=cfg["forget"], **extra)
    if kind == "muse":
        spec.update(n_knowmem=cfg["n_knowmem"], n_verbmem=cfg["n_verbmem"], n_privleak=cfg["n_privleak"],
                    privleak=cfg["privleak"])
    elif kind == "whp":
        spec.update(trivia=cfg["whp_trivia"], n_trivia=cfg["n_trivia"])
        if cfg["rouge"]:  # the completions are generated: with rouge off nothing reads them, so none is loaded
            spec.update(prompts=cfg["whp_prompts"], n_completions=cfg["n_completions"])
        else:
            spec.update(completions=False)
    else:
        spec.update(subject=cfg["wmdp_subject"], n_wmdp=cfg["n_wmdp"])
    return spec


def options(cfg) -> dict:
    keys = ("n_mc", "rouge", "knowmem_tokens", "verbmem_tokens", "completion_tokens", "mia_k", "mia_groups",
            "privleak_reference", "choice_text")
    return {k: cfg[k] for k in keys}


def cells(cfg, seeds, ctx) -> list[Cell]:
    check(cfg, None)  # where the cells are built without run_experiment's checks before the load
    plan = canonical_rows(cfg["methods"])
    out = []
    for bench in cfg["benchmarks"]:
        for block in ("tofu", "own") if cfg["own"] else ("tofu",):
            spec = data_spec(cfg, bench, block)
            out += [Cell(spec["kind"], m, over, seed, spec, options(cfg), row=label(m, over), group=f"{bench}|{block}")
                    for seed in seeds for m, over in plan]
    return out


def paper_table(summaries: dict, na: dict | None = None) -> str:
    """The paper's layout: Bench | Method | knowmem | verbmem | WHP-logp | WMDP acc (transfer block); na:
    {group: {row: why}}, the methods that cannot act on the model (n/a, the reason under each group's table)."""
    lines = ["## Transfer table (paper layout, TOFU-built edit)", "",
             "| bench | method | knowmem LP ↓ | verbmem LP ↓ | WHP-logp ↓ | WMDP acc ↓ |",
             "|---|---|---|---|---|---|"]
    for group, summary in summaries.items():
        bench, block = group.split("|")
        if block != "tofu":
            continue
        for row, cols in summary.items():
            if row in (na or {}).get(group, {}) and not cols:
                lines.append(f"| {bench} | {row} | " + " | ".join([NOT_APPLICABLE] * 4) + " |")
                continue
            cells_ = [fmt_cell(cols.get(c)) for c in ("KnowMemLP", "VerbMemLP", "WHP_LP")]
            cells_.append(fmt_cell(cols.get("WMDP_Acc"), 3))
            lines.append(f"| {bench} | {row} | " + " | ".join(cells_) + " |")
    return "\n".join(lines + [""])


def report(cfg, seeds, cells, results, ctx, out_dir) -> dict:
    summaries, sections, panels, notes, na = {}, [], [], {}, {}
    for group, (cs, rs) in grouped(cells, results).items():
        kind = cs[0].measure
        cols = COLUMNS[kind] + ["install_seconds"]
        summaries[group] = group_summary(cs, rs, kind, cols)
        bench, block = group.split("|")
        notes[group], na[group] = data_notes(rs), not_applicable_rows(cs, rs)
        sections.append(markdown(summaries[group], cols, f"{bench}: {BLOCKS[block]}", delta=HEADLINE[kind],
                                 not_applicable=na[group]) + notes_markdown(notes[group]))
        panels.append((f"{bench} ({block})", summaries[group], PLOTTED[kind]))
    md = "\n".join([warnings_markdown(notes) + paper_table(summaries, na)] + sections)
    files = write_outputs(out_dir, NAME, dict(summary=summaries, notes=notes, config=cfg, seeds=list(seeds),
                                              not_applicable=na), md)
    files["png"] = plot_panels(panels, Path(out_dir) / f"{NAME}.png")
    return dict(summary=summaries, markdown=md, files=files, not_applicable=na)

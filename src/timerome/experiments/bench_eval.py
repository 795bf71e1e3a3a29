"""One benchmark scored outside an experiment: a model as it is, or with a saved edit memory applied
while scoring (`timerome eval --bench`). The rows are the transfer / rwku experiments' data specs
(`bench_data`, task "none": no method is given a task), the scores their measurements'
(`bench_measures.bench_scores`), so a saved memory reads what the experiment's installed method reads.
"""

from __future__ import annotations

import os
import time
import warnings
from contextlib import nullcontext

from timerome.common.checks import integer
from timerome.common.checks import seed as check_seed
from timerome.data.benchmark import check_folder, local_only
from timerome.data.rwku import rwku_targets, target_folder
from timerome.engine.hooks import refuse_one_step
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError
from timerome.experiments.bench_measures import bench_scores
from timerome.experiments.bench_report import data_notes
from timerome.experiments.runner import Context
from timerome.experiments.transfer import BENCHMARKS, CONFIG, bench_source, check_folders, data_spec
from timerome.memory.memory_file import load_memory
from timerome.metrics.membership import REFERENCE_WANT, check_reference
from timerome.methods.registry import Edit

BENCHES = (*BENCHMARKS, "rwku")  # the transfer / rwku experiments' names


def parse_bench(bench) -> tuple[str, str]:
    """(name, choice) of "NAME[:CHOICE]", a benchmark of BENCHES (a choice for wmdp and rwku only)."""
    from timerome.data.wmdp import MIXED, SUBJECTS

    name, colon, choice = str(bench).partition(":")
    choice = choice.strip()  # "rwku: Stephen King" names Stephen King
    if name in BENCHES and colon and not choice:  # "wmdp:" read as plain wmdp would hide a slip
        raise TimeromeError(f"{bench!r} names an empty part: give the benchmark alone ({name})"
                            + (f" or {name}:{'SUBJECT' if name == 'wmdp' else 'TARGET'}" if name in ("wmdp", "rwku") else ""))
    if name in BENCHES and choice and name not in ("wmdp", "rwku"):
        raise TimeromeError(f"{name} names no part (only wmdp:SUBJECT and rwku:TARGET do), got {bench!r}")
    if name not in BENCHES:
        raise TimeromeError(f"a benchmark is one of {', '.join(BENCHES)} (wmdp:SUBJECT, rwku:TARGET), got {bench!r}")
    if name == "wmdp" and choice and choice not in (*SUBJECTS, MIXED):  # before a model loads (a target needs the data)
        raise TimeromeError(f"unknown WMDP subject {choice!r}: wmdp:{', wmdp:'.join((*SUBJECTS, MIXED))}")
    return name, choice


def refuse_unread_rouge(bench, rouge: bool, flag: str) -> None:
    """Refuse rouge off (`flag`: how the caller wrote it) for a benchmark that generates nothing (WMDP)."""
    name, _ = parse_bench(bench)
    if not rouge and name == "wmdp":
        raise TimeromeError(f"{flag}: WMDP is scored by its choices' likelihoods and generates nothing, so nothing "
                            "reads it; leave it out")


def refuse_unread_reference(bench, reference, flag: str) -> None:
    """Refuse a PrivLeak reference AUC (`flag`: how the caller wrote it) that is not one, or that a
    benchmark other than MUSE's (the only one with PrivLeak) would not read."""
    if reference is None:
        return
    name, _ = parse_bench(bench)
    if name not in ("muse-books", "muse-news"):
        raise TimeromeError(f"{flag}: only MUSE (muse-books, muse-news) reports PrivLeak; {name} would not read it")
    try:
        check_reference(reference)
    except TimeromeError:
        raise TimeromeError(f"{flag} must be {REFERENCE_WANT}; got {reference!r}") from None


def bench_folder(bench, bench_data=None) -> str:
    """The folder `bench` is read from (absolute; "hub": MUSE's and WMDP's Hub copies), checked from the paths
    alone, so before a model loads: not a folder; another benchmark's folder, or one holding others' folders but
    not this one's (`transfer.check_folders`); WHP without one; an RWKU target the folder does not hold."""
    name, choice = parse_bench(bench)
    if bench_data is not None:
        check_folder(bench_data)
    folder = bench_source({"bench_dir": bench_data})
    if name == "rwku":
        source = None if folder == "hub" else folder
        target_folder(choice, source) if choice else rwku_targets(source)
    elif name == "whp" and folder == "hub":
        raise TimeromeError(local_only("whp"))
    else:
        check_folders({"bench_dir": None if folder == "hub" else folder}, [name])
    return folder


def load_benchmark(backbone, bench: str, *, bench_data=None, limit: int | None = None, rouge: bool = True) -> dict:
    """The rows `evaluate_benchmark` scores: bench one of BENCHES, "wmdp:SUBJECT" or "rwku:TARGET"
    (default wmdp:bio, the first RWKU target); bench_data the folder holding muse/, whp/, wmdp/,
    rwku/ (None: $TIMEROME_BENCH_DIR, else the Hub for MUSE and WMDP); limit: at most so many rows of
    each scored split (None: all, the full protocol); rouge=False: only what is scored without generating
    (WHP's completion prompts are not loaded). {"splits", "info", "spec", "bench"}."""
    name, choice = parse_bench(bench)
    if not isinstance(rouge, bool):  # "no" would read as true
        raise TimeromeError(f"rouge must be True or False, got {rouge!r}")
    refuse_unread_rouge(bench, rouge, "rouge=False")
    integer(limit, "the row limit", lo=1, none=True)
    folder = bench_folder(bench, bench_data)  # an absolute folder, or "hub"
    if name == "rwku":
        target = choice or rwku_targets(None if folder == "hub" else folder)[0]
        spec = dict(kind="rwku", task="none", dir=folder, target=target, n_probes=limit, forget_from=[], mia=True)
    else:
        sizes = dict.fromkeys(("n_knowmem", "n_verbmem", "n_privleak", "n_trivia", "n_completions", "n_wmdp"), limit)
        cfg = dict(CONFIG, bench_dir=None if folder == "hub" else folder, **sizes, rouge=rouge,
                   wmdp_subject=choice or CONFIG["wmdp_subject"])
        spec = {k: v for k, v in data_spec(cfg, name, "none").items() if k != "forget"}
    with warnings.catch_warnings():  # what the data holds is said once, in the result's notes
        warnings.simplefilter("ignore")
        rows, _ = Context(backbone, progress=False).data(spec)
    label = f"rwku:{rows['info']['target']}" if name == "rwku" else f"wmdp:{spec['subject']}" if name == "wmdp" else name
    return dict(rows, spec=spec, bench=label)


def evaluate_benchmark(backbone, bench, *, edit=None, bench_data=None, limit: int | None = None,
                       n_mc: int = LIKELIHOOD.n_mc, seed: int = 0, rouge: bool = True, progress: bool = False,
                       privleak_reference: float | None = None) -> dict:
    """A benchmark's own metrics (the transfer / rwku experiments' columns) for the model as it is, or
    with `edit` applied while scoring: an edit memory, or its file (a saved memory; nothing is installed),
    or a method installed on this model (`timerome.methods.install`; the caller undoes it).
    bench: a name (`load_benchmark`, with bench_data and limit) or the rows load_benchmark returned.
    rouge=False: log-probabilities and choices only (no generation). privleak_reference (MUSE only): the
    Min-K% AUC of a model retrained without the forget set, which turns the raw AUC into MUSE's PrivLeak
    (`metrics.membership`). -> {"metrics", "notes" (what the
    data held, and why a column is missing), "n_items", "items", "data", "seconds"}."""
    integer(n_mc, "n_mc", lo=1)
    check_seed(seed, "seed")
    if not isinstance(rouge, bool):  # "no" would read as true
        raise TimeromeError(f"rouge must be True or False, got {rouge!r}")
    if isinstance(bench, dict):
        if not {"splits", "info", "spec", "bench"} <= set(bench):
            raise TimeromeError("bench must be a benchmark's name or the rows load_benchmark returned")
        if bench_data is not None or limit is not None:
            raise TimeromeError("bench_data and limit choose rows to load; these rows are loaded already")
    if isinstance(bench, dict):  # a name is checked as load_benchmark loads it
        refuse_unread_rouge(bench["bench"], rouge, "rouge=False")
    refuse_unread_reference(bench["bench"] if isinstance(bench, dict) else bench, privleak_reference,
                            "privleak_reference")
    if isinstance(bench, dict) and rouge and bench["spec"].get("completions") is False:
        raise TimeromeError("these rows were loaded with rouge=False (no WHP completion prompts), so there is nothing "
                            "to generate: pass rouge=False here too, or load them with rouge=True")
    rows = bench if isinstance(bench, dict) else load_benchmark(backbone, bench, bench_data=bench_data, limit=limit,
                                                                rouge=rouge)
    if isinstance(edit, (str, os.PathLike)):
        edit = load_memory(edit, backbone)
    if edit is None:
        active = nullcontext()
    elif hasattr(edit, "applied"):  # an edit memory: its hooks while scoring
        refuse_one_step(getattr(edit.coordinate, "step", None), "the edit", "these metrics read",
                        "build it for every step (step=None)", causal=getattr(backbone, "causal", False))
        active = edit.applied(backbone)
    elif isinstance(edit, Edit):  # a method installed on this model (`timerome.methods.install`)
        active = edit.active()
    else:
        raise TimeromeError(f"edit must be an edit memory, its file or an installed method, got {type(edit).__name__}")
    t0 = time.perf_counter()
    with active:
        options = dict(n_mc=n_mc, rouge=rouge)
        if privleak_reference is not None:  # the corpus of these rows reads it
            options["privleak_reference"] = dict.fromkeys(("books", "news"), float(privleak_reference))
        out = bench_scores(rows["spec"]["kind"], backbone, rows, options, seed, progress)
    return dict(out, notes=data_notes([out]), n_items={k: len(v) for k, v in rows["splits"].items()},
                seconds=time.perf_counter() - t0, bench=rows["bench"], spec=rows["spec"])

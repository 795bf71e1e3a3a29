"""`timerome eval`: the paper's metrics for a model directory, or a saved edit memory on it, on the
splits the canonical experiment evaluates; nothing is traced, captured or rebuilt."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from timerome.cli.app import (ModelChoice, app, console, err_console, friendly, model_options,
                              print_json)
from timerome.common.checks import repeated
from timerome.data.benchmark import check_folder
from timerome.engine.settings import EDIT, LIKELIHOOD, LOCALITY
from timerome.errors import TimeromeError
from timerome.memory.scale import check_on_prompts


def metric_table(metrics: dict, fmt: str) -> Table:
    """One row per metric, NaN shown as "–"."""
    t = Table()
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in metrics.items():
        t.add_row(k, "–" if v != v else fmt.format(v))
    return t


def unchanged(memory) -> str:
    """The Unchanged warning, with the knobs of the edit scored: a memory's, or a weight edit's."""
    why = ("an edit at another coordinate, a small alpha, or subjects it has no key for?" if memory is not None else
           "a weight edit at another layer, too few optimisation steps, or a clamp that kept it small?")
    return ("Unchanged: every answer with the edit is the unedited model's, so it did nothing here, whatever its "
            f"log-probabilities ({why})")
FLAG = {"requests": "--requests", "bench": "--bench"}  # the modes other than TOFU's, by the flag that chooses them
# the modes each mode-specific option applies to (tofu: neither --requests nor --bench)
MODES = {**dict.fromkeys(("--target", "--base", "--gen-length"), {"requests"}),
         **dict.fromkeys(("--data", "--forget", "--retain-authors", "--splits", "--reference", "--cache",
                          "--threshold", "--refresh-every"), {"tofu"}),
         **dict.fromkeys(("--n-retain", "--n-world"), {"tofu", "requests"}),
         "--no-rouge": {"tofu", "bench"}, **dict.fromkeys(("--bench-data", "--limit", "--privleak-reference"), {"bench"})}


def _saved_memory(bb, edit, also: str = ""):
    """--edit's memory for these metrics, read right after the model loads (before the rows, whose warnings
    never precede its errors): one of a single denoising step refused (they read likelihoods). Its update is
    checked on the rows' prompts once they are read (`check_on_prompts`)."""
    from timerome.engine.hooks import refuse_one_step
    from timerome.memory.memory_file import load_memory

    memory = load_memory(edit, bb)
    ways = [also] if also else []  # what else reads it, each command its own
    ways += [] if bb.causal else ["read it along the trajectory (the ablations' Traj columns)"]
    ways.append("build it for every step (edit without --step)")
    refuse_one_step(memory.coordinate.step, str(edit), "these metrics read",
                    ", ".join(ways[:-1]) + (", or " if len(ways) > 2 else " or " if ways[:-1] else "") + ways[-1],
                    causal=bb.causal)
    return memory


def print_notes(metrics: dict, columns: dict, lines=()) -> None:
    """A column's note as "–" when the column is absent or NaN (why), "note" beside a number (what it
    means); then the notes of no column."""
    for k, why in columns.items():
        value = metrics.get(k, float("nan"))
        err_console.print(f"[yellow]{k}[/] {'–' if value != value else 'note'}: {escape(why)}", soft_wrap=True)
    for n in lines:
        err_console.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)


def fewer_rows(given: dict, counts: dict) -> list[str]:
    """Notes for the sizes given (`given`: {flag: value}) above the rows there are (`counts`: {split: rows
    evaluated}): a size is cut to its split's rows, said, not silently (as `trace --n-facts` says it)."""
    splits = {"--n-retain": ("retain",), "--n-world": ("real_authors", "world_facts")}
    out = []
    for flag, value in given.items():
        short = [f"{k} {counts[k]}" for k in splits.get(flag, ()) if k in counts and counts[k] < value]
        if short:
            out.append(f"{flag} {value}: there are fewer rows ({', '.join(short)}): all of them are evaluated")
    return out


def exact_likelihood(bb, n_mc: int | None, seed: int = 0) -> list[str]:
    """The note that a --n-mc given (n_mc: None where it was not) does nothing on an autoregressive model (its
    likelihood is exact), and a --seed other than 0 nothing either (the seed draws only the likelihood's masks:
    the answers are greedy), or none (the default --n-mc, unread there, is not named: review 91)."""
    given = ([f"--n-mc {n_mc}"] if n_mc is not None else []) + (
        [f"--seed {seed} (which draws only those masks; the answers are greedy)"] if seed else [])
    if not getattr(bb, "causal", False) or not given:
        return []
    return [f"{bb.name} is autoregressive: its likelihood is exact (one forward per answer, no masks), so "
            f"{' and '.join(given)} change{'s' if len(given) == 1 else ''} nothing"]


@app.command("eval")
@friendly
@model_options
def eval_cmd(edit: Optional[Path] = typer.Option(None, "--edit", help="an edit memory file, applied while evaluating"),
             model: ModelChoice = None,
             data: Optional[str] = typer.Option(None, help="'embedded' (the default), 'tofu' ($TIMEROME_TOFU_DIR) or a "
                                                          "TOFU directory"),
             forget: Optional[str] = typer.Option(None, help="the forget split (default forget01)"),
             n_retain: Optional[int] = typer.Option(None, help=f"retain rows evaluated, spread over the chosen authors "
                                                               f"(default {LOCALITY.n_retain}; with --requests: their "
                                                               "locality rows, 0 for none)"),
             retain_authors: Optional[int] = typer.Option(
                 None, help="only the first K retain authors (those a model trained on a TOFU subset saw)"),
             n_world: Optional[int] = typer.Option(None, help="real-author and world-fact rows evaluated, each (default "
                                                              f"{LOCALITY.n_world}; with --requests: their locality "
                                                              "rows, 0 for none)"),
             splits: Optional[str] = typer.Option(None, help="comma-separated subset of forget,retain,real_authors,"
                                                              "world_facts (default: all)"),
             n_mc: Optional[int] = typer.Option(None, help="Monte-Carlo masks per answer likelihood (default "
                                                           f"{LIKELIHOOD.n_mc}; an autoregressive model's is exact)"),
             seed: int = 0,
             rouge: bool = typer.Option(True, help="generate answers for ROUGE-L (slower)"),
             reference: Optional[str] = typer.Option(
                 None, help="a model never trained on the forget set, for Forget Quality (KS p); 'auto' trains "
                            "the embedded model's own reference once"),
             as_json: bool = typer.Option(False, "--json", help="print the metrics as JSON"),
             cache: Optional[str] = typer.Option(None, help="ROUGE generations: approximate KV cache, prefix or dual"),
             threshold: Optional[float] = typer.Option(None, help="ROUGE generations: reveal every position whose "
                                                                   "confidence is >= this"),
             refresh_every: Optional[int] = typer.Option(None, help="with --cache: also refresh it every N steps"),
             requests: Optional[str] = typer.Option(
                 None, "--requests", "-r", help="score edit requests instead (efficacy, generalisation, locality, "
                                               "fluency, portability, refusal / leak / confabulation / gibberish): a "
                                               "CounterFact / zsRE / MQuAKE / EasyEdit / timerome file, or "
                                               "'counterfactual:SPLIT' / 'embedded:SPLIT'"),
             target: str = typer.Option(EDIT.target, help="with --requests: the target of requests that name none"),
             base: Optional[str] = typer.Option(None, help="with --requests: the unedited model the answers are "
                                                           "compared with (default: the model without --edit; for a "
                                                           "model folder `timerome edit` wrote, the model it edited)"),
             gen_length: Optional[int] = typer.Option(None, help="with --requests: answer length budget (default: "
                                                                 "the longest expected answer + 4, at least 8; at "
                                                                 "least 16 on an autoregressive model)"),
             bench: Optional[str] = typer.Option(
                 None, "--bench", help="score a benchmark instead, with its own metrics: muse-books, muse-news, whp, wmdp or rwku"
                                       + " (wmdp:SUBJECT, rwku:TARGET to choose; default wmdp:bio, the first "
                                         "RWKU target)"),
             bench_data: Optional[Path] = typer.Option(None, "--bench-data", help="with --bench: the folder of the "
                                                       "benchmark data (muse/, whp/, wmdp/, rwku/; default "
                                                       "$TIMEROME_BENCH_DIR, else the Hub for MUSE and WMDP)"),
             limit: Optional[int] = typer.Option(None, help="with --bench: at most N rows of each scored split "
                                                            "(default: all, the full protocol)"),
             privleak_reference: Optional[float] = typer.Option(
                 None, "--privleak-reference", help="with --bench muse-books / muse-news: the Min-K% AUC of a model "
                                                    "retrained without the forget set (in [0, 1)), to report MUSE's "
                                                    "PrivLeak beside the raw AUC")):
    """Evaluate a model (and optionally a saved edit memory on it) with the paper's metrics, edit
    requests with the editing metrics (--requests), or a benchmark with its own (--bench)."""
    from timerome.engine.sampler import check_fast_options, refuse_diffusion_options
    from timerome.evaluation.evaluator import evaluate, reference_truth_ratios
    from timerome.experiments import resolve_source
    from timerome.experiments.data import refuse_unread_sizes, without_unread_sizes
    from timerome.experiments.runner import Context
    from timerome.methods import InferenceEdit

    # each mode's own options; one given to another mode is refused, not ignored
    if requests is not None and bench is not None:
        raise TimeromeError("--requests and --bench are two kinds of evaluation: give one")
    mode = "requests" if requests is not None else "bench" if bench is not None else "tofu"
    given = {"--target": None if target == EDIT.target else target, "--base": base, "--gen-length": gen_length,
             "--data": data, "--forget": forget, "--retain-authors": retain_authors, "--splits": splits,
             "--reference": reference, "--cache": cache, "--threshold": threshold, "--refresh-every": refresh_every,
             "--no-rouge": None if rouge else True, "--n-retain": n_retain, "--n-world": n_world,
             "--bench-data": bench_data, "--limit": limit, "--privleak-reference": privleak_reference}
    wrong = [k for k, v in given.items() if v is not None and mode not in MODES[k]]
    if wrong:
        modes = MODES[wrong[0]]
        where = (f"with {' or '.join(FLAG[m] for m in modes)}" if "tofu" not in modes
                 else f"without {' or '.join(FLAG[m] for m in FLAG if m not in modes)}")
        raise TimeromeError(f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} only {where}")
    n_mc_given, n_mc = n_mc, LIKELIHOOD.n_mc if n_mc is None else n_mc  # given: named in a note where unread
    if requests is not None:
        return _edit_eval(model, edit, requests, target, base, gen_length, n_retain, n_world, n_mc, seed, as_json,
                          n_mc_given)
    if bench is not None:
        return _bench_eval(model, edit, bench, bench_data, limit, n_mc, seed, rouge, as_json, privleak_reference,
                           n_mc_given)
    data = "embedded" if data is None else data
    forget_given, forget = forget is not None, "forget01" if forget is None else forget
    sized = {flag: key for flag, key, v in (("--n-retain", "n_retain", n_retain), ("--retain-authors",
             "retain_authors", retain_authors), ("--n-world", "n_world", n_world)) if v is not None}  # given
    n_retain = LOCALITY.n_retain if n_retain is None else n_retain
    n_world = LOCALITY.n_world if n_world is None else n_world
    spec = dict(forget=forget, n_retain=n_retain, n_world=n_world)
    if retain_authors is not None:
        spec["retain_authors"] = retain_authors
    if splits is not None:
        spec["splits"] = [s.strip() for s in splits.split(",") if s.strip()]
    for name, value in (("--n-mc", n_mc), ("--n-retain", n_retain), ("--n-world", n_world)):
        if value < 1:
            raise TimeromeError(f"{name} must be at least 1, got {value}")
    sampler = dict(cache=None if cache in (None, "none") else cache, threshold=threshold, refresh_every=refresh_every)
    check_fast_options(**sampler)
    unread = [k for k, v in (("--cache", sampler["cache"]), ("--threshold", threshold),
                             ("--refresh-every", refresh_every)) if v is not None]
    if unread and not rouge:
        raise TimeromeError(f"{', '.join(unread)} set{'s' if len(unread) == 1 else ''} how ROUGE's answers are "
                            "generated; with --no-rouge none is generated")
    unknown = set(spec.get("splits", [])) - {"forget", "retain", "real_authors", "world_facts"}
    if unknown or spec.get("splits") == []:
        raise TimeromeError(f"--splits takes forget, retain, real_authors and world_facts, got {splits!r}")
    twice = repeated(spec.get("splits", []))
    if twice:  # one split evaluated once: the list said twice
        raise TimeromeError(f"--splits names {twice[0]} twice: give each split once")
    refuse_unread_sizes(spec.get("splits"), sized, "eval")  # a size of a split it leaves out: read by nothing
    spec = without_unread_sizes(spec)  # the default sizes of the splits left out go too
    if reference is not None and "forget" not in spec.get("splits", ["forget"]):
        raise TimeromeError("--reference scores Forget Quality, which reads the forget split: add forget to --splits")
    if forget_given and "forget" not in spec.get("splits", ["forget"]):  # as --n-retain beside --splits forget
        raise TimeromeError(f"--forget {forget} names the forget split, which --splits leaves out: add forget to "
                            "--splits, or leave --forget out")
    source = resolve_source(data)
    bb = model.load()
    # an autoregressive model: before any work or warning
    refuse_diffusion_options(bb, cache=sampler["cache"], threshold=threshold, refresh_every=refresh_every)
    if sampler["cache"] is not None:
        bb.kv_cache()  # a family without the cache fails before any work or warning
    memory = None if edit is None else _saved_memory(
        bb, edit, "compare its answers (timerome generate --edit, or eval --requests)")
    ctx = Context(bb, source, reference=None if reference in (None, "auto") else reference, model_path=model.model)
    rows, _ = ctx.data(spec)
    memory_edit = None
    if edit is not None:
        check_on_prompts(bb, memory, [bb.encode_prompt(r["question"]) for r in rows.get("forget", [])[:4]], edit)
        memory_edit = InferenceEdit(method="memory", config={}, context=lambda: memory.applied(bb), memory=memory)
    ref_tr = None
    if reference is not None and "forget" in rows:
        if ctx.auto_reference() is None:
            raise TimeromeError("--reference auto only knows the embedded model's reference; pass a model "
                                "directory trained without the forget set")
        ref_tr = reference_truth_ratios(ctx.reference_backbone(), rows["forget"], n_mc=n_mc, seed=seed)
        if ctx.reference_is_model():
            err_console.print(f"[yellow]note:[/] --reference {escape(reference)} is the model being evaluated: Forget "
                              "Quality needs a model trained without the forget set", soft_wrap=True)
    result = evaluate(bb, rows, n_mc=n_mc, seed=seed, edit=memory_edit, rouge=rouge, reference_tr=ref_tr,
                      progress=True, sampler=sampler)
    exact = exact_likelihood(bb, n_mc_given, seed)
    fewer = fewer_rows({f: v for f, v in (("--n-retain", n_retain), ("--n-world", n_world)) if f in sized},
                       {k: len(v) for k, v in rows.items()})
    notes = dict(result["notes"], **({"n_mc": exact[0]} if exact else {}), **({"sizes": fewer} if fewer else {}))
    summary = dict(model=str(model.model or "embedded"), edit=str(edit) if edit else None, data=dict(spec, source=data),
                   n_items={k: len(v) for k, v in rows.items()}, metrics=result["metrics"], notes=notes,
                   seconds=result["cost"]["eval_seconds"], n_mc=n_mc, seed=seed,
                   reference=ctx.reference_label if ref_tr is not None else None,
                   sampler={k: v for k, v in sampler.items() if v is not None})
    if as_json:  # the notes on stderr, as without --json (docs/cli.md); the JSON holds them too
        print_notes(result["metrics"], result["notes"], exact + fewer)
        print_json(summary)
        return
    drawn = "exact likelihood" if bb.causal else f"n_mc {n_mc}, seed {seed}"  # an AR model's: no masks to draw
    title = f"{summary['model']}" + (f" with {edit}" if edit else "") + f" on {data}:{forget} ({drawn})"
    console.print(escape(title), soft_wrap=True)
    console.print(metric_table(result["metrics"], "{:.4g}"))
    console.print("items: " + ", ".join(f"{k} {n}" for k, n in summary["n_items"].items())
                  + f"; {summary['seconds']:.1f}s", soft_wrap=True)
    print_notes(result["metrics"], result["notes"], exact + fewer)


def _edit_eval(model, edit, requests, target, base, gen_length, n_retain, n_world, n_mc, seed, as_json,
               n_mc_given=None) -> None:
    """`timerome eval --requests`: the editing metrics of --edit (or of -m against --base)."""
    from timerome.backbones import load_backbone
    from timerome.backbones.loading import model_place
    from timerome.cli.model import EDITED_FROM, edited_from
    from timerome.data.requests import load_requests
    from timerome.memory.memory_file import load_memory
    from timerome.metrics.editing import edit_scores, outcome

    if gen_length is not None and gen_length < 1:
        raise TimeromeError(f"--gen-length must be at least 1, got {gen_length}")
    sized = [k for k, v in (("--n-retain", n_retain), ("--n-world", n_world)) if v is not None]  # given, even at the default
    n_retain = LOCALITY.n_retain if n_retain is None else n_retain
    n_world = LOCALITY.n_world if n_world is None else n_world
    for name, value in (("--n-retain", n_retain), ("--n-world", n_world)):
        if value < 0:
            raise TimeromeError(f"{name} must be >= 0, got {value}")
    reqs, notes = load_requests(requests, target=target, must_fill=target != EDIT.target)  # --target given
    recorded = edited_from(model.model)  # what an edited model's folder says it came from, read before any load
    if edit is None and base is not None and model_place(base) == model_place(model.model):
        raise TimeromeError(f"--base {base} is the model being scored (there is no --edit): its locality would be 1 "
                            "by construction; give the unedited model, or leave --base out")
    bb = model.load()
    locality, known, probes = _probe_rows(bb, requests, reqs, recorded, n_retain, n_world)
    if known is None and sized:  # refused, not ignored: only the embedded corpus has these rows here
        raise TimeromeError(f"{' and '.join(sized)} size the embedded corpus's retain / real-author / world-fact "
                            f"locality rows, which probe only the embedded model, a model edited from it, or "
                            f"requests about its subjects; not {model.model} on {requests} (the requests' own "
                            "probes measure locality)")
    for n in notes:  # after every refusal: a note never precedes an error
        err_console.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)
    memory = load_memory(edit, bb) if edit is not None else None
    if memory is not None:
        check_on_prompts(bb, memory, [bb.encode_prompt(r.fact.prompt) for r in reqs[:4]], edit)  # as eval --edit does
        held = held_requests_notes(memory, reqs, str(edit))
        for n in held:
            err_console.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)
        notes = notes + held
    unedited = base
    if base is None and edit is None and recorded is not None:  # an edited model's folder: against its source
        unedited = model_place(recorded["source_model"])
        err_console.print(f"[yellow]note:[/] {escape(str(model.model))} was edited by {escape(str(recorded.get('method')))}"
                          f" from {escape(unedited)} ({EDITED_FROM}): its answers are compared with that model's "
                          "(--base to choose another)", soft_wrap=True)
    baseline = None
    if unedited is not None:
        other = load_backbone(unedited, recorded.get("family") if base is None and recorded else None,
                              dtype=model.dtype, device=str(bb.device), trust_remote_code=model.trust_remote_code)
        baseline = edit_scores(other, reqs, None, locality=locality, known_subjects=known, gen_length=gen_length,
                               n_mc=n_mc, seed=seed, lp=False, progress=True)["baseline"]
    result = edit_scores(bb, reqs, memory, locality=locality, gen_length=gen_length, n_mc=n_mc, seed=seed,
                         known_subjects=known, baseline=baseline, progress=True)
    exact = exact_likelihood(bb, n_mc_given, seed)
    fewer = fewer_rows({f: v for f, v in (("--n-retain", n_retain), ("--n-world", n_world)) if f in sized},
                       {k: len(v) for k, v in locality.items()})
    summary = dict(model=str(model.model or "embedded"), edit=str(edit) if edit else None, base=unedited,
                   requests=requests, n_requests=len(reqs), n_locality={k: len(v) for k, v in locality.items()},
                   gen_length=result["gen_length"],
                   metrics=result["metrics"],
                   notes=notes + [probes] + fewer + [f"{k}: {why}" for k, why in result["notes"].items()] + exact
                   + ([unchanged(memory)] if result["metrics"].get("Unchanged") == 1 else []),
                   # each prompt's answers, its request's id, and the outcome the rates count (review 93)
                   answers=[dict(fact_id=reqs[i].fact_id, prompt=p, answer=a0, answer_with_edit=a1,
                                 target=reqs[i].fact.target, outcome=outcome(a1, reqs[i], known))
                            for i, p, a0, a1 in zip(result["items"]["prompt"]["request"],
                                                    result["items"]["prompt"]["prompt"],
                                                    result["items"]["prompt"]["plain"],
                                                    result["items"]["prompt"]["edited"])],
                   # every other probe's answers, by kind (paraphrase, neighbours, ...): what each metric read
                   probe_answers={kind: [dict(fact_id=reqs[i].fact_id if i >= 0 else None,  # -1: a locality row
                                              prompt=p, answer=a0, answer_with_edit=a1)
                                         for i, p, a0, a1 in zip(it["request"], it["prompt"], it["plain"],
                                                                 it["edited"])]
                                  for kind, it in result["items"].items() if kind != "prompt" and it["prompt"]})
    def notes_and_warning():  # on stderr, with --json too (docs/cli.md)
        print_notes(result["metrics"], result["notes"], exact)
        for n in [probes] + fewer:  # which probes Locality read, and sizes above the rows there are
            err_console.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)
        if result["metrics"].get("Unchanged") == 1:
            err_console.print(f"[yellow]warning:[/] {escape(unchanged(memory))}", soft_wrap=True)

    if as_json:
        notes_and_warning()
        print_json(summary)
        return
    who = f"{summary['model']}" + (f" with {edit}" if edit else "") + (f" against {unedited}" if unedited else "")
    console.print(escape(f"{who} on {len(reqs)} edit requests from {requests} (greedy, gen_length "
                         f"{result['gen_length']}, " + ("exact likelihood)" if bb.causal else f"n_mc {n_mc}, seed {seed})")),
                  soft_wrap=True)
    console.print(metric_table(result["metrics"], "{:.3f}"))
    notes_and_warning()
    shown = Table(title="first answers")
    for col in ("prompt", "answer", "answer with edit", "target", "outcome"):
        shown.add_column(col, overflow="fold")
    for a in summary["answers"][:5]:
        shown.add_row(*(escape(str(a[k])) for k in ("prompt", "answer", "answer_with_edit", "target", "outcome")))
    console.print(shown)


def held_requests_notes(memory, reqs, name: str) -> list[str]:
    """Notes on requests the memory does not hold (Efficacy then counts facts it never saw) and on those
    it holds with another target (it says its own, the request reads another); none for a memory whose
    facts are known by id alone."""
    from timerome.evaluation.evaluator import held_questions

    held = held_questions(memory)
    if not held:
        return []
    asked = [r for r in reqs if r.fact.prompt in held]
    out = []
    if len(asked) < len(reqs):
        out.append(f"{name} holds {len(memory.facts)} facts; {len(asked)} of the {len(reqs)} requests ask one of "
                   "them, and the metrics count the others too")
    other = [r.fact_id for r in asked if held[r.fact.prompt] != r.fact.target]
    if other:
        out.append(f"{len(other)} requests ask a question {name} holds with another target "
                   f"({', '.join(map(repr, other[:3]))}{', ...' if len(other) > 3 else ''}): the memory says its own "
                   "target, and Efficacy reads the request's")
    return out


LOCALITY_WORDS = {"retain": "retain", "real_authors": "real-author", "world_facts": "world-fact"}


def _probe_rows(bb, requests: str, reqs, recorded, n_retain: int, n_world: int):
    """({name: rows whose answers must not change}, the subjects the model knows or None, in words which):
    the embedded corpus's rows and subjects where they probe this model on these requests (the API's AUTO
    rule, `metrics.editing.embedded_probe_rows`); else nothing beyond the requests' own probes."""
    from timerome.metrics.editing import embedded_probe_rows

    locality, known, why = embedded_probe_rows(bb, requests, reqs, n_retain=n_retain, n_world=n_world,
                                               edited_from_embedded=_edited_from_embedded(recorded))
    if why is None:
        return {}, None, ("Locality reads the requests' own probes only, and Confabulation counts every other "
                          "answer (neither the model nor the requests are the embedded corpus's)")
    read = [LOCALITY_WORDS[k] for k, rows in locality.items() if rows]  # --n-retain 0 / --n-world 0: none of those
    also = (f"Locality also reads the embedded corpus's {' / '.join(read)} rows, and " if read else
            "Locality reads the requests' own probes only (--n-retain 0, --n-world 0), and ")
    return locality, known, f"{also}Confabulation only answers naming another of its subjects ({why})"


def _edited_from_embedded(recorded) -> bool:
    """Whether an edited model's record (EDITED_FROM) leads back to the embedded model: its source is the embedded
    model (None, or its folder by any path), or an edited model whose own record does (a chain of edits)."""
    from timerome.backbones.loading import model_place
    from timerome.cli.model import edited_from

    seen = set()
    while recorded is not None:
        source = recorded.get("source_model")
        if source in (None, "default", "embedded") or model_place(source) == model_place(None):
            return True
        if source in seen or not Path(source).is_dir():
            return False
        seen.add(source)
        try:
            recorded = edited_from(source)
        except TimeromeError:  # an unreadable record further back: not known to be the embedded model's
            return False
    return False


def _bench_eval(model, edit, bench, bench_data, limit, n_mc, seed, rouge, as_json, privleak_reference=None,
                n_mc_given=None) -> None:
    """`timerome eval --bench`: a benchmark's own metrics for the model, with --edit's memory applied
    while scoring (`bench_eval.evaluate_benchmark`); nothing is installed or traced."""
    from timerome.experiments.bench_eval import (bench_folder, evaluate_benchmark, load_benchmark, refuse_unread_reference,
                                                 refuse_unread_rouge)

    refuse_unread_rouge(bench, rouge, "--no-rouge")  # the name, and the options below, before the model loads
    refuse_unread_reference(bench, privleak_reference, "--privleak-reference")
    if limit is not None and limit < 1:
        raise TimeromeError(f"--limit must be at least 1, got {limit}")
    if n_mc < 1:
        raise TimeromeError(f"--n-mc must be at least 1, got {n_mc}")
    if bench_data is not None:
        check_folder(bench_data, "--bench-data")
    bench_folder(bench, bench_data)  # the folder's other refusals, from its path alone
    bb = model.load()
    memory = None if edit is None else _saved_memory(bb, edit)
    rows = load_benchmark(bb, bench, bench_data=bench_data, limit=limit, rouge=rouge)
    if edit is not None:
        check_on_prompts(bb, memory, [bb.encode_prompt(r[k]) for split in rows["splits"].values() for r in split[:2]
                                      for k in ("question", "prompt", "text") if isinstance(r.get(k), str)][:4], edit)
    result = evaluate_benchmark(bb, rows, edit=memory, n_mc=n_mc, seed=seed, rouge=rouge, progress=True,
                                privleak_reference=privleak_reference)
    summary = dict(model=str(model.model or "embedded"), edit=str(edit) if edit else None, bench=result["bench"],
                   data=result["spec"], n_items=result["n_items"], metrics=result["metrics"],
                   notes=result["notes"] + exact_likelihood(bb, n_mc_given, seed), seconds=result["seconds"], n_mc=n_mc, seed=seed,
                   rouge=rouge, privleak_reference=privleak_reference)
    if as_json:  # the notes on stderr, as without --json (docs/cli.md); the JSON holds them too
        print_notes(result["metrics"], {}, summary["notes"])
        print_json(summary)
        return
    title = (f"{summary['model']}" + (f" with {edit}" if edit else "")
             + f" on {result['bench']} (n_mc {n_mc}, seed {seed})")
    console.print(escape(title), soft_wrap=True)
    console.print(metric_table(result["metrics"], "{:.4g}"))
    console.print("items: " + ", ".join(f"{k} {n}" for k, n in summary["n_items"].items())
                  + f"; {result['seconds']:.1f}s", soft_wrap=True)
    print_notes(result["metrics"], {}, summary["notes"])

"""`timerome memory show|add|remove|merge`: saved edit memories, changed with the streaming insert and
remove of `EditMemory` (block updates of G, no re-solve from scratch) and written back atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from timerome.cli.app import (ModelChoice, OneLineUsageErrors, RequestsOpt, TofuOpt, app, console, edit_facts,
                              err_console, friendly, model_options, print_json, said_by_model, spare_rows,
                              tofu_dir_read)
from timerome.common.files import output_file
from timerome.errors import TimeromeError

memory_app = typer.Typer(cls=OneLineUsageErrors, no_args_is_help=True, help="Inspect and change saved edit memories.")
app.add_typer(memory_app, name="memory")

OutOpt = typer.Option(None, "--out", "-o", help="where to write the result (default: FILE itself, replaced atomically)")
NoWaitOpt = typer.Option(False, "--no-wait", help="if another process is changing the file, stop at once (default: "
                                                  "wait for it, then change what it wrote)")


def describe(path) -> dict:
    """What a memory file holds, from its header (no model needed; the checksum is verified): every memory's
    fields and its kind's own (`Memory.described`)."""
    from timerome.memory.memory_file import memory_class, read_memory_file

    tensors, meta = read_memory_file(path)
    cls = memory_class(meta)
    return dict(file=str(path), kind=cls.KIND, format=meta.get("format"), backbone=meta.get("backbone"),
                checkpoint=meta.get("checkpoint") or None, prompt_start=meta.get("prompt_start", []),
                fingerprint=meta.get("fingerprint"), hidden_size=meta.get("hidden_size"),
                coordinate=meta.get("coordinate"), site=meta.get("site"), hyper=dict(meta.get("hyper") or {}),
                stats=meta.get("stats"), n_facts=len(meta.get("facts") or []), facts=list(meta.get("facts") or []),
                **cls.described(meta, path), tensors={k: list(v.shape) for k, v in tensors.items()})


@memory_app.command("show")
@friendly
def show(file: Path = typer.Argument(..., help="an edit memory file"),
         all_facts: bool = typer.Option(False, "--all", help="list every fact (default: the first 20)"),
         as_json: bool = typer.Option(False, "--json", help="print the description as JSON (every fact)")):
    """The coordinate, hyper-parameters, facts and backbone fingerprint of a saved memory."""
    from timerome.memory.memory_file import memory_class

    if all_facts and as_json:  # refused, not ignored
        raise TimeromeError("--json lists every fact already: --all shortens nothing there; leave it out")
    d = describe(file)
    if as_json:
        print_json(d)
        return
    c, h, cls = d["coordinate"] or {}, d["hyper"], memory_class(d)
    t = Table(title=f"{d['kind']} memory {file}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    step = "every step" if c.get("step") is None else f"step {c.get('step')} only"
    where = f" at {d['checkpoint']}" if d.get("checkpoint") else ""
    for k, v in (("backbone", f"{d['backbone'] or 'unnamed'}{where} (fingerprint {d['fingerprint']}, hidden "
                              f"{d['hidden_size']})"),
                 (cls.SITE, f"layer {c.get('layer')} {c.get('point')}, {step}"),
                 *cls.shown(d), ("target", _targets(d)), ("facts", str(d["n_facts"])), ("format", str(d["format"]))):
        t.add_row(k, escape(v))
    console.print(t)
    ft = Table(title="facts")
    cols = ("fact_id", "subject", "prompt", "object", "target")
    for col in cols:
        ft.add_column(col, overflow="fold")
    shown = d["facts"] if all_facts else d["facts"][:20]
    for f in shown:
        ft.add_row(*(escape(str(f.get(k, h.get("target") if k == "target" else ""))) for k in cols))
    console.print(ft)
    if len(shown) < d["n_facts"]:
        console.print(f"... and {d['n_facts'] - len(shown)} more facts (--all lists them)")


def _targets(d: dict) -> str:
    """The memory's target: one for every fact, or how many facts carry their own (the facts table lists them)."""
    default = d["hyper"].get("target")
    own = {f.get("target") for f in d["facts"] if f.get("target") is not None}
    if not own or own == {default}:
        return repr(default)
    return f"per fact ({len(own)} distinct; {default!r} for a fact without one)"


@memory_app.command("add")
@friendly
@model_options
def add(file: Path = typer.Argument(..., help="an edit memory file"),
        model: ModelChoice = None,
        data: Optional[str] = typer.Option(None, "--data", "-d", help="the facts to add when no --requests: "
                                           "'embedded:SPLIT', 'tofu:SPLIT' or a JSON/JSONL file of rows "
                                           "(default: embedded:forget01)"),
        requests: Optional[str] = RequestsOpt, tofu_dir: Optional[str] = TofuOpt,
        out: Optional[Path] = OutOpt,
        calibration: Optional[str] = typer.Option(
            None, help="a codebook / rewrite memory: the rows its radii must spare (default: those the file says "
                       "its build measured them on; a file that does not say: the retain_perturbed split of the "
                       "source, a rewrite memory's embedded or counterfactual facts embedded:train)"),
        value_rows: Optional[str] = typer.Option(
            None, "--value-rows", help="a rewrite memory: the rows its new token values are read on (default: "
                                       "those the file says its build read them on, else as its method reads them)"),
        no_wait: bool = NoWaitOpt,
        as_json: bool = typer.Option(False, "--json", help="print the result as JSON")):
    """Insert facts (--data, or --requests with their own targets) into a saved memory (a block
    update of G, same lambda scale; a codebook / rewrite memory appends their entries, radii
    measured on --calibration). A fact without a target of its own gets the memory's target. A
    fact the memory holds (same subject, question, answer and target) is skipped, whatever its id
    (where every fact is, nothing is written: an error, exit 2, so a script sees that nothing changed);
    a new fact whose id another fact holds is added under a new id; a note names both."""
    from timerome.data.rows import load_rows, tofu_folder
    from timerome.memory.base import check_for_model, fact_content, sort_new_facts
    from timerome.memory.memory_file import changing, file_class, kinds_taking, load_memory, read_memory_file
    from timerome.methods import get_method

    if requests is not None and data is not None:
        raise TimeromeError("give the facts to add once: --requests FILE or --data SPLIT, not both")
    dest = output_file(out or file, inputs={"--requests file": requests, "--data file": data,
                                            "--calibration file": calibration, "--value-rows file": value_rows})
    cls = file_class(file)
    kind, calibrated = cls.KIND, "calibration" in cls.LOAD_OPTIONS  # a codebook / rewrite memory: radii to measure
    for option, value in (("calibration", calibration), ("value_rows", value_rows)):  # what its loader reads
        if value is not None and option not in cls.LOAD_OPTIONS:
            raise TimeromeError(f"--{option.replace('_', '-')} applies to {' and '.join(kinds_taking(option))} "
                                f"memories; {file} is a {'ridge edit' if kind == 'edit' else kind} memory")
    _, meta = read_memory_file(file)
    recorded_specs = [s["rows"] for s in cls.described(meta, file)["sources"].values()]
    tofu_dir_read(tofu_dir, requests, data, calibration, value_rows, *recorded_specs)
    default_target = (meta.get("hyper") or {}).get("target") or "I don't know."
    bb = model.load()
    check_for_model(file, meta, bb)  # another model's memory: refused before the facts are read (and warned about)
    facts, source = edit_facts(bb, requests, data, tofu_dir, default_target)
    stated = list(facts)  # the facts whose rows state the facts added: as given, and as the memory holds them
    gated = get_method(kind).gated if calibrated else None  # a codebook / rewrite file: its method's build
    if gated is not None and gated.said_facts:
        # each as the rewrite memory holds it (`said_facts`), but one the file holds as given (a file written
        # before stop 57), which is skipped below; a target it cannot say is refused before the model is asked
        held_given = {fact_content(f, default_target) for f in (_header_facts(meta) or [])}
        ask = [i for i, f in enumerate(facts) if fact_content(f, default_target) not in held_given]
        if ask:
            if gated.check_target is not None:
                gated.check_target(bb, [facts[i] for i in ask], default_target)
            held = _header_facts(meta)
            if held is not None:  # a conflict with a held fact: refused before the model is asked (and its note)
                sort_new_facts(held, [facts[i] for i in ask], default_target)
            said, more = said_by_model(bb, [facts[i] for i in ask])
            facts = list(facts)
            for i, f in zip(ask, said):
                facts[i] = f
            stated += more[len(ask):]
    nothing_new = TimeromeError(f"every fact of {source} is already in {file} (same subject, question, answer and "
                                "target): nothing to add")
    with changing(dest, wait=not no_wait):  # read, change and write as one: a concurrent add waits, nothing is lost
        meta = read_memory_file(file)[1]  # the file as it is now, under the lock
        held = _header_facts(meta)
        if held is not None and not sort_new_facts(held, facts, default_target)[0]:  # a conflict raises here:
            raise nothing_new  # both before the minutes a codebook / rewrite memory spends on its calibration rows
        rows = values = spec = None
        sources = cls.described(meta, file)["sources"]
        if calibrated:  # the radii's rows: those its build read (the file says which), unless given
            recorded = sources.get("calibration")
            spec, spec_rows, as_built = _calibration(file, recorded, calibration, tofu_dir)
            rows = _build_states(meta, file, recorded, spec_rows, (held or []) + stated) if as_built else None
            if rows is None:
                spec, rows = spare_rows(bb, kind, source, spec, tofu_dir, stated, rows=spec_rows)
            if recorded is None and calibration is None:
                err_console.print(f"[yellow]note:[/] {escape(str(file))} does not say which rows its radii were "
                                  f"measured on: the added facts' radii are measured on {escape(spec)} "
                                  "(--calibration to choose)", soft_wrap=True)
        if value_rows is not None:
            values = load_rows(value_rows, tofu_dir=tofu_folder(value_rows, tofu_dir))
            _other_rows(sources.get("value_rows"), value_rows, tofu_dir,
                        f"the token values of {file} were read", "the added facts' token values are read", values)
        memory = load_memory(file, bb, calibration=rows, value_rows=values)  # values: as its build read them
        new, skipped, renamed, _ = sort_new_facts(memory.facts, facts, memory.target)
        if not new:
            raise nothing_new
        _notes(skipped, renamed, source, str(file))
        before = len(memory)
        if gated is not None and gated.said_facts:
            memory.add(new, said=True)  # said above
        else:
            memory.add(new)
        saved = memory.save(dest)
    _done(saved, memory, f"added {len(memory) - before} facts", as_json,
          skipped=[dict(fact_id=i, why=w) for i, w in skipped], renamed=dict(renamed),
          **({} if spec is None else {"calibration": spec}))


def _calibration(file, recorded: dict | None, given: str | None, tofu_dir) -> tuple[str | None, list | None, bool]:
    """(spec, rows, as built) of the calibration a `memory add` reads: `given` and its rows where it names
    other rows than the file records (with a note), else the rows the file records, read here
    (`data.rows.recorded_rows`: a warning where they have changed since; as built: True), else (given,
    None, False) where the file records none (`spare_rows` reads `given`, or its default)."""
    from timerome.data.rows import recorded_rows

    if recorded is None:
        return given, None, False
    other = None if given is None else _other_rows(recorded, given, tofu_dir, f"the radii of {file} were measured",
                                                   "the added facts' radii are measured")
    if other is not None:
        return given, other, False
    folder = ", or the TOFU folder with --tofu-dir" if recorded["rows"].startswith("tofu:") else ""
    return recorded["rows"], recorded_rows(recorded, f"the radii of {file} were measured",
                                           f"give those rows again (--calibration{folder})", tofu_dir=tofu_dir), True


def _other_rows(recorded: dict | None, given: str, tofu_dir, built: str, added: str, rows: list | None = None):
    """The rows given to `memory add` where they are not those the file says its build read (with a note;
    `rows`: them, read already), else None."""
    from timerome.data.rows import load_rows, row_spec, tofu_folder, where_rows

    if recorded is None:
        return None
    asked = row_spec(given, tofu_dir=tofu_dir)
    if asked == {k: v for k, v in recorded.items() if k != "digest"}:
        return None
    if rows is None:  # rows that cannot be read: their error alone, never after this note
        rows = load_rows(given, tofu_dir=tofu_folder(given, tofu_dir))
    err_console.print(f"[yellow]note:[/] {escape(built)} on {escape(where_rows(recorded))}; {escape(added)} on "
                      f"{escape(where_rows(asked))}, as asked", soft_wrap=True)
    return rows


def _build_states(meta: dict, file, recorded: dict | None, rows: list | None, facts: list):
    """The calibration of a `memory add` where the file says which of the recorded rows its build left
    out and they are the rows recorded (`codebook_memory.CalibrationSubset`): the rows its build read,
    whose states are cached, less every row stating a fact the memory will hold, as a build of them all
    leaves out (rows stating a fact removed since the build stay left out); None otherwise
    (`spare_rows` then reads the rows less those stating the facts added)."""
    from timerome.common.cache import digest
    from timerome.data.facts import qa_rows
    from timerome.memory.codebook_memory import CalibrationSubset, read_left_out
    from timerome.methods.codebook import stating

    left_out = read_left_out(meta, file)
    if rows is None or left_out is None or digest(rows, versioned=False) != recorded.get("digest"):
        return None
    if left_out and left_out[-1] >= len(rows):
        raise TimeromeError(f"{file} is inconsistent: its build left out row {left_out[-1]} of {len(rows)}")
    gone = set(left_out)
    whole = [r for i, r in enumerate(rows) if i not in gone]
    said = stating(whole, qa_rows(facts))  # a fact known by its id alone states no row
    return CalibrationSubset(whole, [i for i, s in enumerate(said) if s])


def _header_facts(meta: dict) -> list | None:
    """The facts a memory file's header lists (None where they cannot be read: its loader says why)."""
    from timerome.memory.base import _fact_from_dict

    try:
        return [_fact_from_dict(d) for d in meta.get("facts", [])]
    except (TimeromeError, TypeError, AttributeError):
        return None


def _notes(skipped, renamed, source: str, into: str) -> None:
    """Notes naming every fact skipped, and why, and every fact added under a new id."""
    held = [(i, why) for i, why in skipped if why.startswith("already")]
    again = [(i, why) for i, why in skipped if not why.startswith("already")]
    show = lambda s: f"{s[0]!r}" + s[1].removeprefix("already in the memory")  # noqa: E731 - "'0' as fact 'x'"
    for items, what in (
            (held, f"{len(held)} facts of {source} are already in {into} (same subject, question, answer and "
                   "target) and are kept as they are"),
            (again, f"{len(again)} facts of {source} repeat an earlier one and are left out"),
            (renamed, f"{len(renamed)} facts of {source} have ids that other facts in {into} hold and are added "
                      "under new ids")):
        if items:
            fmt = (lambda r: f"{r[0]!r} -> {r[1]!r}") if items is renamed else (show if items is held else  # noqa: E731
                                                                               lambda s: f"{s[0]!r} ({s[1]})")
            err_console.print(f"[yellow]note:[/] {escape(what)}: {escape(_listed(items, fmt))}", soft_wrap=True)


def _listed(items, show, n: int = 10) -> str:
    """The first n items shown, and how many more (--json lists them all)."""
    text = "; ".join(show(x) for x in items[:n])
    return text + (f"; and {len(items) - n} more (--json lists them all)" if len(items) > n else "")


@memory_app.command("remove")
@friendly
@model_options
def remove(file: Path = typer.Argument(..., help="an edit memory file"),
           fact_ids: Optional[list[str]] = typer.Argument(None, help="ids of the facts to remove (`memory show`)"),
           subject: Optional[list[str]] = typer.Option(None, "--subject", help="remove every fact of this subject"),
           model: ModelChoice = None, out: Optional[Path] = OutOpt, no_wait: bool = NoWaitOpt,
           as_json: bool = typer.Option(False, "--json", help="print the result as JSON")):
    """Remove facts from a saved memory (a downdate of G, no re-solve)."""
    from timerome.memory.memory_file import changing, load_memory

    from timerome.common.checks import repeated

    if not fact_ids and not subject:
        raise TimeromeError("name the facts to remove: fact ids (see `timerome memory show FILE`) or --subject")
    for given, what in ((fact_ids or [], "fact id"), (subject or [], "--subject")):
        twice = repeated(given)
        if twice:  # the class of every "given twice" refusal (stop 78): a slip, never a second removal
            raise TimeromeError(f"{what} {twice[0]!r} is given twice: give each once")
    dest = output_file(out or file)
    bb = model.load()
    with changing(dest, wait=not no_wait):
        memory = load_memory(file, bb)
        ids = list(fact_ids or [])
        for s in subject or []:
            of = [fid for fid, f in zip(memory.fact_ids, memory.facts) if getattr(f, "subject", None) == s]
            if not of:
                import difflib

                held = sorted({f.subject for f in memory.facts if isinstance(getattr(f, "subject", None), str)})
                near = difflib.get_close_matches(s, held, n=1)
                raise TimeromeError(f"no fact of subject {s!r} in {file}" + (f" (did you mean {near[0]!r}?)" if near else
                                    "") + f"; `timerome memory show {file} --all` lists its subjects")
            ids += of
        ids = list(dict.fromkeys(ids))
        if set(memory.fact_ids) <= set(ids):
            raise TimeromeError(f"that removes every fact of {file}: an empty memory edits nothing; delete the file "
                                "instead")
        left = len(set(memory.fact_ids) - set(ids))
        if getattr(memory, "q", 0) > left:  # TopQ keeps q facts per token: the file could not be applied
            raise TimeromeError(f"that leaves {left} facts in {file}, fewer than its q={memory.q} (TopQ keeps q facts "
                                "per token, so the memory could not be applied): remove fewer, or build it again with "
                                f"--q {left} or less")
        memory.remove(ids)
        saved = memory.save(dest)
    _done(saved, memory, f"removed {len(ids)} facts", as_json, removed=ids)


@memory_app.command("merge")
@friendly
@model_options
def merge(files: list[Path] = typer.Argument(..., help="two or more edit memory files of one model and coordinate"),
          out: Path = typer.Option(..., "--out", "-o", help="the merged memory file"),
          model: ModelChoice = None, no_wait: bool = NoWaitOpt,
          as_json: bool = typer.Option(False, "--json", help="print the result as JSON")):
    """Merge memories of the same model, coordinate, key metric and background statistics into one
    (the others' facts inserted into the first; the first's hyper-parameters and lambda scale)."""
    from timerome.engine.encoding import start_change
    from timerome.memory.base import sort_new_facts
    from timerome.memory.edit_memory import EditMemory
    from timerome.memory.memory_file import changing, file_kind

    from timerome.common.checks import repeated

    if len(files) < 2:
        raise TimeromeError("merge needs at least two memory files")
    twice = repeated(str(Path(f).resolve()) for f in files)
    if twice:  # its facts would all be skipped as held: "merged 2 memories" with nothing added
        raise TimeromeError(f"{twice[0]} is given twice: a memory merged with itself adds nothing; give each file once")
    for f in files:
        kind = file_kind(f)
        if kind != "edit":
            raise TimeromeError(f"{f} is a {kind} memory: its entries' radii depend on the calibration corpus, so "
                                f"{kind} memories do not merge; `timerome memory add` the other's facts to it instead")
    dest = output_file(out)
    bb = model.load()
    skips, renames = [], {}  # every file's skipped facts (and why) and renamed ids, for --json
    with changing(dest, wait=not no_wait):  # -o may be one of the inputs: read and write it as one
        first = EditMemory.load(files[0], bb)
        for f in files[1:]:
            other = EditMemory.load(f, bb)
            _check_mergeable(first, other, files[0], f)
            change = start_change(other.prompt_start, first.prompt_start, versus=f"{files[0]}'s prompts")
            if change:
                raise TimeromeError(f"{f}'s keys were read from {change}: one memory would hold keys of two "
                                    "readings; build the older one again")
            for name in ("alpha", "q", "g_max", "lam", "lam_absolute"):
                if getattr(other, name) != getattr(first, name):
                    err_console.print(f"[yellow]note:[/] {escape(str(f))} has {name} {getattr(other, name)}; the "
                                      f"merged memory keeps {files[0]}'s {getattr(first, name)}", soft_wrap=True)
            if other.lam == first.lam and other.lam_value != first.lam_value:  # one relative lambda, two key scales
                err_console.print(f"[yellow]note:[/] {escape(str(f))} solves with lambda {other.lam_value:.4g} (its "
                                  f"relative {other.lam} of its own keys' scale); its facts join {files[0]}'s solve, "
                                  f"lambda {first.lam_value:.4g}", soft_wrap=True)
            new, skipped, renamed, kept = sort_new_facts(first.facts, other.facts, first.target)
            _notes(skipped, renamed, str(f), str(files[0]))
            skips += [dict(file=str(f), fact_id=i, why=w) for i, w in skipped]
            if renamed:
                renames.setdefault(str(f), {}).update(renamed)
            if new:
                first.add_vectors(other.ridge.U[kept], other.ridge.D[kept], new)
        saved = first.save(dest)
    _done(saved, first, f"merged {len(files)} memories", as_json, skipped=skips, renamed=renames)


def _check_mergeable(a, b, fa, fb) -> None:
    import torch

    if a.coordinate != b.coordinate:
        raise TimeromeError(f"{fb} edits at {b.coordinate}, {fa} at {a.coordinate}: only memories at one "
                            "coordinate merge")
    if a.key_metric != b.key_metric or a.target != b.target:
        raise TimeromeError(f"{fb} and {fa} differ in key metric or target ({b.key_metric}, {b.target!r} vs "
                            f"{a.key_metric}, {a.target!r}): they do not merge")
    if a.stats is not None and not (torch.equal(a.stats.mean, b.stats.mean) and torch.equal(a.stats.cov, b.stats.cov)):
        raise TimeromeError(f"{fb} measured its whitening statistics on another background corpus than {fa}: "
                            "their keys live in different metrics and do not merge; rebuild one with the other's "
                            "--background")


def _done(path, memory, what: str, as_json: bool, **extra) -> None:
    if as_json:
        print_json(dict(file=str(path), n_facts=len(memory), fact_ids=memory.fact_ids,
                        coordinate=memory.coordinate.as_dict(), **extra))
        return
    console.print(f"{what}: {len(memory)} facts at {memory.coordinate} -> {path}", soft_wrap=True)

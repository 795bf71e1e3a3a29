"""The typer app, its error handler and the options every command that loads a model shares."""

from __future__ import annotations

import inspect
import math
import sys
import warnings
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from timerome.common.cache import json_text
from timerome.errors import Interrupted, TimeromeError

# click's exceptions as typer raises them (typer may vendor its own click: the `click` package's differ)
clickx = sys.modules[typer.BadParameter.__module__]
NO_ARGS_HELP = getattr(clickx, "NoArgsIsHelpError", ())
console = Console()                # results
err_console = Console(stderr=True)  # errors, warnings, notes: stdout stays clean for --json


class OneLineUsageErrors(TyperGroup):
    """Usage errors (an unknown option, a missing argument, a value of the wrong type) as one red line
    and exit code 2, like every other input error, instead of click's boxed message."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        plain_flags(self)
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except NO_ARGS_HELP as e:  # `timerome` alone: the help, as usual
            e.show()
            sys.exit(e.exit_code)
        except clickx.ClickException as e:
            where = getattr(e, "ctx", None)
            path = where.command_path if where is not None else "timerome"
            say_error(f"{path}: {e.format_message()} (see `{path} --help`)")
            sys.exit(2 if isinstance(e, clickx.UsageError) else e.exit_code)
        except typer.Abort:
            err_console.print("[bold yellow]aborted[/]")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        twice = repeated_option(cmd, rest) if cmd is not None else None
        if twice:  # click keeps the last value without a word: the first one would be dropped silently
            raise clickx.UsageError(f"{twice} given twice: give it once (the second would replace the first "
                                    "without a word)", type(ctx)(cmd, info_name=name, parent=ctx))
        empty = empty_path_option(cmd, rest) if cmd is not None else None
        if empty:  # Path("") is ".": an empty --out would otherwise write into the current folder
            raise clickx.UsageError(f"{empty}: the path is empty: give one", type(ctx)(cmd, info_name=name, parent=ctx))
        return name, cmd, rest


def plain_flags(command) -> None:
    """No type beside an on/off flag in --help: typer 0.29 writes `--json <bool>`, which reads as a flag that takes a
    value (`--json true` then names a checkpoint `true`). Every option of `command` and its subcommands, once."""
    helps = command.get_help_option(command.context_class(command))  # --help itself (made once, kept by the command)
    for p in (*getattr(command, "params", ()), *([helps] if helps is not None else [])):
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        plain_flags(sub)


def given_options(command, args):
    """(name as written, option, its value or None for a flag) for each option of `command` in args, in
    order. Arguments after `--` are values, not options, and so is the value after any option that takes
    one: `--out --json` gives --out the value "--json"."""
    options = {}
    for p in getattr(command, "params", ()):
        if getattr(p, "param_type_name", "") == "option":
            options.update(dict.fromkeys([*p.opts, *p.secondary_opts], p))
    pending = None  # (name, option) waiting for its value in the next argument
    for a in args:
        if pending is not None:
            yield (*pending, a)
            pending = None
            continue
        if a == "--":
            return
        name, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        p = options.get(name)
        if p is None:
            continue
        if p.is_flag or p.count:
            yield name, p, None
        elif eq:
            yield name, p, value
        else:
            pending = (name, p)


def repeated_option(command, args) -> str | None:
    """The first option of `command` that takes one value and appears twice in args (or a flag given both
    ways, --rouge and --no-rouge), as written the second time; None when none does. A repeatable option
    may repeat (it is how it is used); the same flag twice changes nothing and passes."""
    seen: dict = {}  # id(option) -> its value's side: for a flag whether it was the "off" spelling
    for name, p, _ in given_options(command, args):
        if p.multiple or p.count:
            continue
        side = name in p.secondary_opts if p.is_flag else None
        if id(p) in seen and not (p.is_flag and seen[id(p)] == side):
            return name
        seen.setdefault(id(p), side)
    return None


# text options that name a checkpoint, a folder or a rows source (their text may be a spec, so not typed as a path):
# empty, they read as the default model (-m "", --base ""), the current folder (--tofu-dir "") or nothing at all
NAMES_A_PATH = {"--model", "--reference", "--base", "--background", "--calibration", "--neighbours", "--tofu-dir"}


def empty_path_option(command, args) -> str | None:
    """The first option of `command` typed as a path, or in NAMES_A_PATH, that is given an empty value (`--out ""`,
    `--out=`), as written; None when none is. The command would see Path(""), which is "." (the current folder)."""
    for name, p, value in given_options(command, args):
        descriptor = getattr(p, "type_descriptor", None)
        path = getattr(descriptor, "annotation", None) is Path or NAMES_A_PATH & set(p.opts)
        if value is not None and not value.strip() and path:
            return name
    return None


app = typer.Typer(cls=OneLineUsageErrors, add_completion=False, no_args_is_help=True,
                  help="Find where a masked diffusion LM stores a fact, then make it forget it at inference time.")

ModelOpt = typer.Option(None, "--model", "-m", help="checkpoint directory or .gguf file (default: the embedded model)")
FamilyOpt = typer.Option(None, "--family", help="backbone family (default: from config.json)")
RemoteOpt = typer.Option(False, "--trust-remote-code", help="run the checkpoint's own modelling code")
DeviceOpt = typer.Option("cpu", "--device", help="torch device: cpu, cuda, cuda:1, mps")
DtypeOpt = typer.Option(None, "--dtype", help="float32 (default), bfloat16 or float16")
DataOpt = typer.Option("embedded:forget01", "--data", "-d",
                       help="facts: 'embedded:SPLIT', 'tofu:SPLIT' (with --tofu-dir), 'real-facts' (34 real facts a "
                            "small pretrained model knows, docs/ar-contrast.md) or a JSON/JSONL file of question/answer "
                            "rows (with 'author' or 'subject' where the subject is not a TOFU author)")
TofuOpt = typer.Option(None, "--tofu-dir", help="local TOFU directory in the Hub layout")


def _debug() -> bool:
    """$TIMEROME_DEBUG on (a bad value was refused when the command started: read here without raising)."""
    from timerome.common.environment import switch

    return switch("TIMEROME_DEBUG", strict=False)


def say_error(message: str) -> None:
    """One red line on stderr, never wrapped (a log line stays one line)."""
    err_console.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}", soft_wrap=True, highlight=False)


def friendly(fn):
    """A TimeromeError or a file-system error -> one red line and exit code 2; Ctrl-C -> one line
    saying what was kept and how to resume (exit 130); anything else is a bug in timerome: one
    line naming it (exit 1), the traceback only with $TIMEROME_DEBUG set."""

    @wraps(fn)
    def inner(*a, **k):
        try:
            _check_numbers(fn, k)
            return fn(*a, **k)
        except (typer.Exit, typer.Abort, clickx.ClickException):
            raise
        except Interrupted as e:
            err_console.print(f"[bold yellow]interrupted:[/] {escape(' '.join(str(e).split()))}", soft_wrap=True,
                              highlight=False)
            raise typer.Exit(130)
        except TimeromeError as e:
            say_error(str(e))
            raise typer.Exit(2)
        except KeyboardInterrupt:
            err_console.print("[bold yellow]interrupted[/] (Ctrl-C) before anything resumable was saved",
                              soft_wrap=True)
            raise typer.Exit(130)
        except OSError as e:  # an unwritable output folder, a full disk, a vanished file
            where = f" ({e.filename})" if e.filename else ""
            say_error(f"{e.strerror or e}{where}")
            raise typer.Exit(2)
        except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback on request
            if _debug():
                raise
            say_error(f"internal error {type(e).__name__}: {str(e)[:300]} (a bug in timerome: rerun with "
                      "TIMEROME_DEBUG=1 for the traceback and report it)")
            raise typer.Exit(1)

    return inner


def _check_numbers(fn, values: dict) -> None:
    """Every number option of every command, before the command runs: a float must be finite (typer
    reads "nan" and "inf"), an int must fit in 64 bits (`--seed 99999999999999999999` would overflow
    every generator), and a --seed must be one (checks.seed: the same range for every command, and
    named as the option; `edit --seed -1` went through). The class is refused here once; each command
    checks its own ranges."""
    from timerome.common.checks import INT64, shown
    from timerome.common.checks import seed as check_seed

    params = inspect.signature(fn).parameters
    for name, v in values.items():
        bad_float = isinstance(v, float) and not math.isfinite(v)
        bad_int = isinstance(v, int) and not isinstance(v, bool) and abs(v) >= INT64
        decls = getattr(params[name].default, "param_decls", None) if name in params else None
        flag = next((d for d in decls or () if d.startswith("--")), "--" + name.replace("_", "-"))
        if bad_float or bad_int:
            want = "a finite number" if bad_float else "an integer below 2**63"
            raise TimeromeError(f"{flag} must be {want}, got {shown(v)}")
        if name == "seed" and v is not None:
            check_seed(v, flag)


@app.callback()
@friendly
def _options(threads: Optional[int] = typer.Option(
        None, "--threads", help="CPU threads torch may use (default: $TIMEROME_THREADS, else half the free cores, "
                                "at least 1; see docs/cli.md)"),
             insist: bool = typer.Option(
                 False, "--insist", help="run work whose estimated size timerome refuses as absurd (more model "
                                         "forwards than 1e8, or more memory than is free; also $TIMEROME_INSIST=1)")):
    import torch

    from timerome.common import allocator, environment
    from timerome.common.checks import set_insist
    from timerome.common.threads import choose_threads

    environment.check()  # a variable's bad value: one line before any work (`TIMEROME_INSIST=no` was on)
    set_insist(insist)
    n, _ = choose_threads(threads)
    torch.set_num_threads(n)
    if allocator.wanted():  # freed activations stay in the process between forwards (allocator.py)
        allocator.keep_freed_memory()
    warnings.showwarning = OneLineWarnings()


class OneLineWarnings:
    """Python warnings on the command line as one yellow line (no source line: that is for developers;
    TIMEROME_DEBUG=1 keeps Python's format), each text once per command: Python's own once-per-place
    filter forgets what it said whenever a library changes the filters (`warnings.catch_warnings`), so
    the same warning could come twice in one run."""

    def __init__(self):
        self.said: set[tuple[str, type]] = set()

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        if _debug():
            sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
            return
        text = " ".join(str(message).split())
        if (text, category) in self.said:
            return
        self.said.add((text, category))
        origin = "" if category is UserWarning else f" ({category.__name__})"
        err_console.print(f"[yellow]warning:[/] {escape(text)}{origin}", soft_wrap=True)


def print_json(obj) -> None:
    """A command's result as standard JSON on stdout (--json; NaN and inf become null)."""
    typer.echo(json_text(obj), nl=False)


def print_markdown(md: str) -> None:
    """A report's Markdown rendered as tables on a terminal (as wide as the table needs, so no column
    is cut); elsewhere (a log, a pipe) the Markdown itself, which is a table there and is never cut."""
    from rich.markdown import Markdown

    if not console.is_terminal:
        console.print(md, markup=False, highlight=False, soft_wrap=True)
        return
    need = max((len(line) for line in md.splitlines() if line.startswith("|")), default=0)
    Console(width=max(console.width, min(need, 400))).print(Markdown(md))


@dataclass(frozen=True)
class ModelChoice:
    """The model a command works on, as its options name it."""

    model: str | None = None
    family: str | None = None
    trust_remote_code: bool = False
    device: str = "cpu"
    dtype: str | None = None

    def load(self):
        return self.loader()(self.model)

    def loader(self):
        """checkpoint -> Backbone with these options (how xbackbone's models load): a functools.partial of
        load_backbone, so that a check before the load knows the family it forces (`experiments.loader_family`)."""
        import functools

        from timerome.backbones import load_backbone
        from timerome.backbones.loading import RUNS_ON

        kind = str(self.device).split(":", 1)[0]
        if kind == "meta":  # the API loads there (shapes, no numbers: for tests); a command would fail at its first use
            raise TimeromeError(f"--device {self.device}: timerome runs on {', '.join(RUNS_ON)} (cuda:N), not meta")
        return functools.partial(load_backbone, family=self.family, dtype=self.dtype, device=self.device,
                                 trust_remote_code=self.trust_remote_code)


_MODEL_OPTIONS = (("model", Optional[str], ModelOpt), ("family", Optional[str], FamilyOpt),
                  ("trust_remote_code", bool, RemoteOpt), ("device", str, DeviceOpt), ("dtype", Optional[str], DtypeOpt))


def model_options(fn):
    """Give a command --model, --family, --trust-remote-code, --device and --dtype; the function's
    `model` parameter receives them as one ModelChoice (typer reads the rewritten signature)."""
    names = [n for n, _, _ in _MODEL_OPTIONS]

    @wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, model=ModelChoice(**{n: kwargs.pop(n) for n in names}), **kwargs)

    own = [p for p in inspect.signature(fn).parameters.values() if p.name != "model"]
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for n, ann, opt in _MODEL_OPTIONS]
    inner.__signature__ = inspect.Signature(own + extra)
    inner.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "model"} | {
        n: ann for n, ann, _ in _MODEL_OPTIONS}
    return inner


def load_facts(data: str, tofu_dir, limit=None, backbone=None):
    """Facts of a QA set; every row that gives no fact is shown, never dropped silently, and
    subjects the model's vocabulary cannot read are named (they would all be one <unk>). tofu_dir:
    the command's --tofu-dir (read where `data` is a 'tofu:SPLIT')."""
    from timerome.data.rows import load_facts as load
    from timerome.data.rows import tofu_folder
    from timerome.engine.encoding import warn_unknown_subjects

    facts, skipped = load(data, tofu_dir=tofu_folder(data, tofu_dir), limit=limit)
    if backbone is not None:
        warn_unknown_subjects(backbone, facts)  # a Python warning: the trace's own is then the same one, shown once
    for i, why in skipped[:10]:
        err_console.print(f"[yellow]skipped row {i}:[/] {escape(why)}", soft_wrap=True)
    if len(skipped) > 10:
        err_console.print(f"[yellow]... and {len(skipped) - 10} more rows skipped[/]")
    return facts


def calibration_spec(bb, method: str, source: str, calibration: str | None) -> str:
    """The rows an edit must leave alone, named (`data.rows.load_rows`): --calibration, else the
    retain_perturbed split of the facts' source ('embedded' or 'tofu'; counterfactual requests, and a
    file's facts on the embedded model, are the embedded corpus's; a gated memory there: the rows its
    `GatedBuild.embedded_rows` names, e.g. the rewrite memory's, every row the model learnt)."""
    from timerome.methods.registry import IN_PLACE_OF_BACKGROUND, get_method

    if calibration is not None:
        return calibration
    origin = source.split(":", 1)[0] if ":" in source else None
    if origin == "counterfactual" or (origin not in ("embedded", "tofu") and bb.embedded):
        origin = "embedded"
    if origin not in ("embedded", "tofu"):
        instead = (" or texts for its key statistics with --background (a text file, a JSON/JSONL rows file, a "
                   "'tofu:SPLIT' spec, or 'real-facts': 34 rows of world knowledge, the rows stating an edited fact "
                   "left out)"
                   if get_method(method).retain == IN_PLACE_OF_BACKGROUND else "")
        raise TimeromeError(f"{method} needs the rows the edit must leave alone: pass --calibration (e.g. a file "
                            f"of retain question/answer rows){instead}")
    gated = get_method(method).gated  # a gated memory may read rows of its own on the embedded corpus
    own = gated.embedded_rows if gated is not None and origin == "embedded" else None
    return own or f"{origin}:retain_perturbed"


def spare_rows(bb, method: str, source: str, calibration: str | None, tofu_dir, facts,
               rows: list | None = None) -> tuple[str, list[dict]]:
    """(spec, rows) an edit must leave alone (codebook / rewrite radii, the rewrite memory's token
    values where the model is not the embedded one (`methods.rewrite.known_rows`), the training-time
    methods' retain rows): those `calibration_spec` names (`rows`: its rows, read already), minus
    every row stating an edited fact."""
    from timerome.data.facts import qa_rows
    from timerome.data.rows import load_rows, tofu_folder
    from timerome.data.task import ForgetTask
    from timerome.methods.codebook import calibration_rows

    calibration = calibration_spec(bb, method, source, calibration)
    task = ForgetTask(forget_rows=qa_rows(facts), facts=[],
                      retain_rows=load_rows(calibration, tofu_dir=tofu_folder(calibration, tofu_dir))
                      if rows is None else rows)
    return calibration, calibration_rows(task, {})


def tofu_dir_read(tofu_dir, *specs) -> None:
    """data.rows.tofu_dir_read for the command line's --tofu-dir."""
    from timerome.data.rows import tofu_dir_read as refuse_unread

    refuse_unread(tofu_dir, *specs, option="--tofu-dir")


def edit_facts(bb, requests: str | None, data: str | None, tofu_dir, target: str, target_given: bool = False):
    """(facts, source spec) to edit: from --requests (each with its own target, `target` for the
    others; the reader's notes are printed; a target the user gave, refused where every request names
    its own), or from --data (every fact gets `target`)."""
    from dataclasses import replace

    if requests is not None:
        from timerome.data.requests import load_requests
        from timerome.data.rows import tofu_folder

        reqs, notes = load_requests(requests, target=target, tofu_dir=tofu_folder(requests, tofu_dir),
                                    must_fill=target_given)
        for n in notes:
            err_console.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)
        return [r.fact for r in reqs], requests
    data = data or "embedded:forget01"
    return [f if f.target else replace(f, target=target) for f in load_facts(data, tofu_dir, backbone=bb)], data


def said_by_model(bb, facts) -> tuple[list, list]:
    """(a rewrite memory's facts as it holds them, the facts whose rows state them): the first as
    `rewrite_memory.said_facts` gives them (the model's own answer as the object where it says the
    request's inside one), with a note where any changed; the second the facts as given, plus each
    changed one as said (a row stating either states the fact)."""
    from timerome.memory.rewrite_memory import said_facts

    out = said_facts(bb, facts)
    changed = [(a, b) for a, b in zip(facts, out) if a is not b]
    if changed:
        a, b = changed[0]
        err_console.print(f"[yellow]note:[/] the model says the answer of {len(changed)} of {len(out)} facts inside an "
                          f"answer of its own, which the rewrite memory keys instead (e.g. {escape(repr(a.object))} "
                          f"in {escape(repr(b.object))})", soft_wrap=True)
    return out, list(facts) + [b for _, b in changed]


RequestsOpt = typer.Option(None, "--requests", "-r",
                           help="edit requests: a CounterFact / zsRE / MQuAKE / EasyEdit / timerome JSON or JSONL "
                                "file, or 'counterfactual:SPLIT' / 'embedded:SPLIT' / 'real-facts' (each request may "
                                "carry its "
                                "own target; the others take --target with `edit`, the memory's own target with `memory add`)")


def parse_seeds(text: str) -> tuple[int, ...]:
    from timerome.common.checks import seeds

    try:
        values = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise TimeromeError(f"--seeds takes comma-separated integers, got {text[:80]!r}") from None
    return seeds(values, "--seeds")


def config_arg(text: str | None, what: str) -> dict:
    """--config: inline JSON (text starting with { or [) or a JSON file, holding a JSON object of `what`."""
    from pathlib import Path

    from timerome.common.files import parse_json, read_json

    if text is None:
        return {}
    if text.lstrip().startswith(("{", "[")):
        value = parse_json(text, "--config")
    elif not Path(text).exists():
        raise TimeromeError(f"config {text} does not exist, and is not inline JSON (an object: '{{\"alpha\": 2}}')")
    else:
        value = read_json(Path(text), "config")
    if not isinstance(value, dict):
        raise TimeromeError(f"config {text[:80]} must hold a JSON object of {what}, got a {type(value).__name__}")
    return value


def warn_unknown_words(bb, text: str, what: str) -> None:
    """A yellow line when `text` has words the model cannot read: they would silently be <unk>."""
    from timerome.engine.encoding import unknown_words

    words = unknown_words(bb, text)
    if words:
        shown = ", ".join(repr(w) for w in dict.fromkeys(words))
        err_console.print(f"[yellow]warning:[/] {escape(what)} has words the model's vocabulary does not know "
                          f"({escape(shown)}); the model reads each as {bb.tokenizer.unk_token!r}", soft_wrap=True)

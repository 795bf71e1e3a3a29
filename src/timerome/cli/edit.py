"""`timerome edit` (and `timerome forget`, the same command for a forget set): build an edit from a
forget set or from edit requests, and save it.

A memory method (timerome, codebook, rewrite, random_layer) saves a memory file; a method that
changes weights (rome, memit, alphaedit, unke, ga, npo, ...) saves the edited checkpoint as a model
folder, which every command then takes with -m.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from timerome.cli.app import (ModelChoice, RequestsOpt, TofuOpt, app, calibration_spec, config_arg, console,
                              edit_facts, err_console, friendly, model_options, print_json, said_by_model, spare_rows,
                              tofu_dir_read)
from timerome.common.checks import shown
from timerome.common.files import output_file, output_folder
from timerome.errors import TimeromeError
from timerome.memory.edit_memory import KEY_METRICS
from timerome.memory.scale import check_on_keys
from timerome.methods.timerome_edit import DEFAULTS

# the paper's ridge memory: the method whose settings are this command's own options (--alpha, --lam, --q,
# --key-metric, ...); a gated memory (codebook, rewrite) is built as its `GatedBuild` says, any other method
# through the registry's install
RIDGE = "timerome"


@app.command()
@friendly
@model_options
def edit(out: Path = typer.Option(Path("forget.safetensors"), "--out", "-o",
                                  help="memory file to write (a folder for a method that changes weights)"),
         model: ModelChoice = None,
         method: str = typer.Option("timerome", help="any method of `timerome methods`: 'timerome' (the paper's "
                                                     "ridge memory), 'codebook', 'rewrite' (a memory file), or a "
                                                     "weight-changing one (the edited model, as a folder)"),
         requests: Optional[str] = RequestsOpt,
         calibration: Optional[str] = typer.Option(
             None, help="the rows the edit must leave alone ('embedded:SPLIT', 'tofu:SPLIT' or a JSON/JSONL file): "
                        "codebook / rewrite radii, retain rows of the training-time methods, and the key statistics "
                        "of ROME / MEMIT / AlphaEdit / UnKE where no --background is given (default: the "
                        "retain_perturbed split of the source; rewrite with embedded or counterfactual facts: "
                        "embedded:train)"),
         data: Optional[str] = typer.Option(None, "--data", "-d", help="the forget set when no --requests: "
                                            "'embedded:SPLIT', 'tofu:SPLIT' (with --tofu-dir), 'real-facts' or a "
                                            "JSON/JSONL file of question/answer rows (default: embedded:forget01)"),
         tofu_dir: Optional[str] = TofuOpt,
         layer: Optional[int] = typer.Option(None, help="coordinate layer, 0-based, negative from the top (-1: the "
                                                        "last) (default: --trace's best, else the model's default; "
                                                        "rewrite: its gate one block below the write site)"),
         module: Optional[str] = typer.Option(None, help="hook point: resid (the paper's m*, the default), attn "
                                                          "or mlp"),
         trace_file: Optional[Path] = typer.Option(None, "--trace", help="a trace.safetensors (TIE) or positional.safetensors "
                                                   "(timerome trace --positional), or the folder timerome trace wrote: "
                                                   "edit at its best layer for --module"),
         step: Optional[int] = typer.Option(None, help="edit only at this denoising step, counted from 0 (default, "
                                                       "or -1: every step, the paper's k* = -1; an autoregressive "
                                                       "model: only as it writes token k of the answer); such an "
                                                       "edit acts in generations, never in a likelihood"),
         alpha: Optional[float] = typer.Option(None, help="edit strength (default: the method's own; `timerome methods` "
                                                          "lists every default)"),
         lam: Optional[float] = typer.Option(None, help=f"ridge lambda, relative to the mean squared key norm "
                                                        f"(default {DEFAULTS['lam']:g})"),
         lam_absolute: Optional[float] = typer.Option(
             None, "--lam-absolute", help="the absolute ridge lambda instead of --lam (the paper's convention)"),
         q: Optional[int] = typer.Option(None, help=f"top-q sparsity over facts (0: dense; default {DEFAULTS['q']})"),
         key_metric: Optional[str] = typer.Option(None, help="'whitened' (default) or 'paper'"),
         target: str = typer.Option(DEFAULTS["target"], help="what the edited model should say instead (for facts "
                                                             "without a target of their own)"),
         background: Optional[str] = typer.Option(
             None, help="texts for the key statistics: the whitening of the ridge / codebook / rewrite keys, and "
                        "ROME / MEMIT / AlphaEdit / UnKE's second moments; a text file (one text per line), a "
                        "JSON/JSONL rows file, 'embedded:SPLIT' / 'tofu:SPLIT' (with --tofu-dir), or 'real-facts' "
                        "(English prose and the real facts' texts: the default with --data real-facts)"),
         config: Optional[str] = typer.Option(None, "--config", "-c", help="method settings to override, inline JSON "
                                              "or a JSON file (`timerome methods` lists each method's)"),
         seed: Optional[int] = typer.Option(None, help="seed of the method's random draws (default 0; refused for "
                                                       "the methods that draw nothing: timerome, act_steer, "
                                                       "random_layer at a given coordinate)"),
         as_json: bool = typer.Option(False, "--json", help="print what was built as JSON")):
    """Build an edit from a forget set or edit requests and save it (a memory file, or the edited model).

    The settings are the method's (the demo's and the experiments'), so an edit built here behaves
    as the evaluated one does.
    """
    from timerome.backbones import HOOK_POINTS
    from timerome.data.rows import tofu_folder
    from timerome.data.task import ForgetTask
    from timerome.engine.coordinate import Coordinate
    from timerome.memory.base import sort_new_facts
    from timerome.memory.edit_memory import default_coordinate
    from timerome.memory.whitening import background_texts
    from timerome.methods import available, get_method, method_config
    from timerome.methods.registry import draws_nothing
    from timerome.methods.timerome_edit import build_memory, select
    from timerome.tracing.positional_trace import PositionalTrace, is_positional, select_positional
    from timerome.tracing.result import TraceResult, trace_path

    if method not in available():
        raise TimeromeError(f"unknown --method {method!r}; choose one of {', '.join(available())}")
    # the API's rules under the flags' names (it says "step", "key_metric")
    if step is not None and step < -1:
        raise TimeromeError(f"--step must be -1 (every step) or a step index >= 0, got {step}")
    if key_metric is not None and key_metric not in KEY_METRICS:
        raise TimeromeError(f"unknown --key-metric {key_metric!r}; choose one of {', '.join(KEY_METRICS)}")
    overrides = _config(config)
    g_max, checked = None, None  # checked: the method's config as -c gives it, once checked
    entry = get_method(method)  # its registry entry: defaults, kind, gated build, model check
    if entry.kind != "weights" and not entry.saves:  # before the model loads (review 93: after its install)
        raise TimeromeError(unsaved(method))
    gated = entry.gated
    if overrides and method == RIDGE:  # its settings as options, or the same through --config (not both)
        _not_for_edit(overrides)  # what `edit` itself never reads, before the method's own checks
        checked = method_config(RIDGE, overrides)  # unknown names and bad values, in the method's words
        given = dict(alpha=alpha, lam=lam, lam_absolute=lam_absolute, q=q, key_metric=key_metric, module=module,
                     step=step)
        got = _timerome_config(overrides, given, target, DEFAULTS["target"])
        alpha, lam, lam_absolute, q, key_metric, module, step = (got[k] for k in given)
        target, g_max = got["target"], got["g_max"]
    if "coordinates" in entry.defaults and overrides.get("coordinates", "traced") != "traced":
        raise TimeromeError(f"timerome edit builds one {method} memory at one coordinate (--layer or --trace); "
                            f"--config coordinates {shown(overrides['coordinates'])} builds one per traced layer: use "
                            f"the API's install(\"{method}\", ...) or an experiment's config")
    if method != RIDGE and "target" in overrides:  # one target: -c's fills the requests that name none, too
        if target != DEFAULTS["target"]:
            raise TimeromeError("--target and -c's 'target' both give the target: give it once")
        target = overrides["target"]
    if method != RIDGE:  # its settings, in the method's words, before the model loads (a target included)
        checked = method_config(method, {**overrides, "target": target} if "target" in entry.defaults
                                and "target" not in overrides else overrides)
        if "target" not in entry.defaults and target != DEFAULTS["target"]:  # refused, not ignored
            raise TimeromeError(f"{method} takes no target: it forgets the facts' answers, it does not write another "
                                "(leave --target out, or use a method with one: timerome methods)")
    if seed is not None and draws_nothing(method, method_config(method, {}) if checked is None else checked):
        raise TimeromeError(f"--method {method} draws nothing at random when it builds with these settings, so --seed "
                            "would change nothing"
                            + (" (the noise of its trace is `timerome trace --seed`; pass the trace with --trace)"
                               if method == RIDGE else "") + ": leave --seed out")
    seed = 0 if seed is None else seed
    _check_options(method, {"--lam": lam, "--lam-absolute": lam_absolute, "--q": q, "--key-metric": key_metric,
                            "--layer": layer, "--module": module, "--trace": trace_file, "--step": step})
    if lam is not None and lam_absolute is not None:
        raise TimeromeError("give the ridge lambda once: --lam (relative to the keys' scale) or --lam-absolute")
    if trace_file is not None and layer is not None:
        raise TimeromeError("--layer and --trace both choose the layer: give one (--trace edits at the trace's best "
                            "layer for --module)")
    module = "resid" if module is None else module
    lam, q, key_metric = (DEFAULTS[k] if v is None else v
                          for k, v in (("lam", lam), ("q", q), ("key_metric", key_metric)))
    _refuse_unread_inputs(method, overrides, key_metric, background, calibration)
    background = _own_background(method, overrides, key_metric, background, calibration, data)
    if requests is not None and data is not None:
        raise TimeromeError("give the facts to edit once: --requests FILE or --data SPLIT, not both")
    tofu_dir_read(tofu_dir, requests, data, calibration, background)
    if module not in HOOK_POINTS:
        raise TimeromeError(f"--module must be one of {', '.join(HOOK_POINTS)}, got {module!r}")
    if not target.strip():
        raise TimeromeError("--target is empty: give the text the edited model should say instead")
    weights = entry.kind == "weights"
    if weights and out.suffix in (".safetensors", ".json"):
        raise TimeromeError(f"{method} changes the model's weights: it saves the edited model as a folder; --out "
                            f"{out} names a file (give a folder, e.g. --out {out.with_suffix('')})")
    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    given = {"--requests file": requests, "--data file": data, "--trace file": trace_file, "--calibration file":
             calibration, "--background file": background, "--config file": config,
             "model folder (-m, or the embedded model's)": model.model or DEFAULT_MODEL_DIR}
    # before minutes of work, and never over a file the user gave
    output_folder(out, "--out", inputs=given) if weights else output_file(out, inputs=given)
    target_given = target != DEFAULTS["target"] or "target" in overrides
    # requests need no model: their target is checked before it loads (--data's subjects are checked against it)
    read = edit_facts(None, requests, data, tofu_dir, target, target_given) if requests is not None else None
    bb = model.load()
    if gated is not None and gated.refuse_model is not None:  # the kind of model: before the facts and rows are read
        gated.refuse_model(bb)
    check_model = entry.model_check  # settings this model leaves unread: before the facts are read
    if check_model is not None:
        check_model(bb.family, checked if checked is not None else method_config(method, {}))
    facts, source = read or edit_facts(bb, requests, data, tofu_dir, target, target_given)
    facts, repeated, _, _ = sort_new_facts([], facts, target)  # a row given twice is one fact, not two
    if repeated:
        listed = "; ".join(f"{i!r} ({why})" for i, why in repeated[:10]) + ("; ..." if len(repeated) > 10 else "")
        err_console.print(f"[yellow]note:[/] {len(repeated)} facts of {escape(source)} repeat an earlier one and are "
                          f"left out: {escape(listed)}", soft_wrap=True)
    texts = background_texts(bb, background, tofu_dir=tofu_folder(background, tofu_dir)) if background else None
    if method != RIDGE and gated is None:
        return _any_method(bb, method, out, facts, source, calibration, tofu_dir, texts, overrides, alpha, target,
                           seed, as_json, model)
    given_trace = trace_file
    trace_file = trace_path(trace_file) if trace_file is not None else None  # a folder `timerome trace` wrote: its trace
    if trace_file is not None and is_positional(trace_file):
        # ROME's choice for the hook point we edit: its largest mean effect at the last subject token
        positional = PositionalTrace.load(trace_file)
        positional.check_model(bb, trace_file)
        layer = select_positional(positional, (module,)).layer
    elif trace_file is not None:
        # the best layer for the hook point we edit, as the timerome method selects it (m* = resid)
        traced = TraceResult.load(given_trace)  # a missing file said as the user typed it (and what was looked for)
        traced.check_model(bb, trace_file)
        neighbours, beta = traced.recorded_neighbours(trace_file)  # `trace --neighbours --beta`: the penalty it chose with
        if neighbours is not None:
            neighbours.check_model(bb, f"the neighbour trace beside {trace_file}")
        layer = select(traced, (module,), neighbours, beta).layer
    elif layer is not None and not -bb.n_layers <= layer < bb.n_layers:
        raise TimeromeError(f"--layer must lie in 0..{bb.n_layers - 1} (or -{bb.n_layers}..-1, counted from the "
                            f"top, as the API reads it), got {layer}")
    elif layer is not None:
        layer %= bb.n_layers  # -1: the last layer, as Coordinate.on reads it
    if layer is None and gated is not None and gated.default_layer is not None:
        layer = gated.default_layer(bb)  # the method's own default, as the API and the experiments place it
    untraced = layer is None  # no --trace, no --layer: the middle block's residual, said below (review 91)
    coordinate = Coordinate(default_coordinate(bb).layer if layer is None else layer, module, step)
    if gated is not None:
        return _gated(bb, method, out, facts, coordinate, source, tofu_dir, texts, calibration, alpha, target,
                      as_json, model, seed, overrides)
    if q > len(facts):
        raise TimeromeError(f"--q {q} exceeds the {len(facts)} facts of {source}: TopQ keeps at most all of them")
    alpha = DEFAULTS["alpha"] if alpha is None else alpha
    config = method_config(RIDGE, dict(alpha=alpha, lam=lam, lam_absolute=lam_absolute, q=q,
                                       key_metric=key_metric, target=target, step=step, g_max=g_max))
    task = ForgetTask(forget_rows=[], facts=facts, background=texts)
    memory = build_memory(bb, task, config, coordinate)
    check_on_keys(memory, bb, "the memory built")  # an alpha that overflows the model: refused before any warning
    ratio = memory.ridge.lam_over_keys()
    if ratio > 1000:  # a fact's own coefficient is about 1 / (1 + ratio): the ridge term swamps the keys
        err_console.print(f"[yellow]warning:[/] lambda {memory.lam_value:.3g} is {ratio:.3g} times the keys' mean "
                          f"squared norm: each fact keeps about 1/{1 + ratio:.3g} of its update (1/"
                          f"{1 + DEFAULTS['lam']:g} at the default --lam {DEFAULTS['lam']:g}, which is relative to "
                          "that norm), so the memory changes (almost) nothing", soft_wrap=True)
    memory.save(out)
    _zero_alpha(alpha)  # after every check and the write: a warning never precedes an error
    notes = _ridge_notes(bb, untraced, memory.coordinate)
    for note in notes:  # on stderr, with --json too (where the JSON holds them as well)
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if as_json:
        print_json(dict(file=str(out), n_facts=len(memory), coordinate=memory.coordinate.as_dict(),
                        key_metric=memory.key_metric, alpha=memory.alpha, lam=memory.lam, lam_value=memory.lam_value,
                        q=memory.q, fact_ids=memory.fact_ids, notes=notes))
        return
    console.print(f"edit memory of {len(memory)} facts at {memory.coordinate}: {memory.key_metric} keys, alpha "
                  f"{memory.alpha:g}, lambda {memory.lam_value:.4g}, q {memory.q} -> {out}", soft_wrap=True)
    console.print(f"try it: {_try_it(model, out, facts)}", soft_wrap=True)


def _ridge_notes(bb, untraced: bool, coordinate) -> list[str]:
    """What a user of the paper's memory should know before trusting it here: a site that no trace chose, and
    (measured) that on an autoregressive model it moves likelihoods but seldom what the model says."""
    notes = []
    if untraced and not bb.embedded:  # the embedded model's middle block is where its trace points (layer 1)
        notes.append(f"no --trace or --layer: the memory sits at layer {coordinate.layer} {coordinate.point}, the "
                     "middle block's default, not a traced site (`timerome trace"
                     + (" --positional" if bb.causal else "") + "` finds one; pass it with --trace)")
    if bb.causal:
        notes.append("on an autoregressive model this memory moves likelihoods but seldom what the model says "
                     "(docs/ar-contrast.md: at the positional trace's sites it made SmolLM2-135M say none of the 34 "
                     "real facts' targets); rome / memit write a fact into the weights (MEMIT said 32 of 34)")
    return notes


def _zero_alpha(alpha) -> None:
    """--alpha 0 builds a memory that changes nothing: said once it is written (a negative alpha is refused)."""
    if alpha is not None and alpha == 0:
        err_console.print("[yellow]warning:[/] --alpha 0: the memory will change nothing", soft_wrap=True)


# what an unlearning user looks for first: the same command, by the field's word, for a forget set
def forget(*args, **kwargs):
    return edit(*args, requests=None, **kwargs)


_edit_signature = inspect.signature(edit)
_FORGET_DATA = typer.Option(None, "--data", "-d", help="the forget set: 'embedded:SPLIT', 'tofu:SPLIT' (with "
                            "--tofu-dir) or a JSON/JSONL file of question/answer rows (default: embedded:forget01)")
forget.__signature__ = _edit_signature.replace(  # typer reads it: edit's options, less --requests
    parameters=[p.replace(default=_FORGET_DATA) if p.name == "data" else p
                for p in _edit_signature.parameters.values() if p.name != "requests"])
forget.__annotations__ = {k: v for k, v in edit.__annotations__.items() if k != "requests"}
app.command("forget", help="Make the model forget a forget set (--data, default embedded:forget01) with any method "
                           "(--method: timerome by default, or ga, npo, rmu, ...) and save the edit: `timerome edit` "
                           "without --requests, with the same options and defaults.")(forget)


# the options each kind of method reads; any other given is refused, not ignored
RIDGE_ONLY = ("--lam", "--lam-absolute", "--q", "--key-metric")
COORDINATE = ("--layer", "--module", "--trace", "--step")


def _check_options(method: str, given: dict) -> None:
    """Refuse the options `method` does not read (the ridge memory's lambda, q and key metric for every
    other method; the coordinate for the methods that choose their own), naming them."""
    from timerome.methods import get_method

    gated = get_method(method).gated
    unused = () if method == RIDGE else RIDGE_ONLY + (() if gated.step else ("--step",)) if gated else \
        RIDGE_ONLY + COORDINATE
    bad = [k for k in unused if given.get(k) is not None]
    if not bad:
        return
    takes = (f"--alpha, --layer, --module, --trace{', --step' if gated.step else ' (it acts at every step)'}"
             if gated else "its settings through --config (`timerome methods` lists them)")
    raise TimeromeError(f"--method {method} does not read {', '.join(bad)}; it takes {takes}")


# timerome's settings that choose its own trace, which `timerome edit` does not run (it edits at --trace's
# best layer, --layer, or the model's default)
TRACE_SETTINGS = ("trace_facts", "trace_steps", "trace_samples", "trace_modules", "select_modules", "trace_seed",
                  "trace_kind", "trace_read_positions")


def _not_for_edit(overrides: dict) -> None:
    """Refuse the timerome settings `timerome edit` does not read through --config: its own trace's and the
    coordinate (options of their own)."""
    trace = [k for k in TRACE_SETTINGS if k in overrides]
    if trace:
        raise TimeromeError(f"--config {', '.join(trace)}: the method's own trace, which `timerome edit` does not "
                            "run; trace with `timerome trace` (--n-facts, --steps, --n-samples, --seed, "
                            "--read-positions) and pass --trace")
    if "coordinate" in overrides:
        raise TimeromeError("--config coordinate: give the coordinate as --layer, --module and --step (or --trace)")


def _refuse_unread_inputs(method: str, overrides: dict, key_metric: str, background, calibration) -> None:
    """--background and --calibration where the method, with these settings, reads no such texts or rows
    (`Method.background`, `Method.retain`): refused before the model loads, never ignored."""
    from timerome.methods import method_config
    from timerome.methods.registry import reads_background, reads_retain

    config = method_config(method, {"key_metric": key_metric} if method == RIDGE else overrides)
    if background is not None and not reads_background(method, config):
        raise TimeromeError("--background gives the texts that whiten the keys, and --key-metric paper keeps them "
                            "raw: leave --background out" if method == RIDGE else
                            f"--background is read by nothing here: {method} with these settings reads no background "
                            "texts (the whitened memories do, and ROME-style key statistics without stats_texts): "
                            "leave it out")
    # the ridge memory `edit` builds whitens on --background alone (no rows); the others, where they read rows
    if calibration is not None and (method == RIDGE or not reads_retain(method, config)):
        raise TimeromeError(f"--calibration gives the rows an edit must leave alone, and {method} here reads none "
                            "(the codebook and rewrite memories, ROME-style statistics off the embedded model and "
                            "the training-time methods' retain terms do): leave it out")
    if calibration is not None and not reads_retain(method, config, background_given=background is not None):
        raise TimeromeError(f"--calibration and --background both give the texts of {method}'s key statistics, which "
                            "reads the rows only in place of background texts: give --background alone (or, off the "
                            "embedded model, --calibration alone)")


def _own_background(method: str, overrides: dict, key_metric: str, background, calibration, data):
    """--data real-facts brings its own texts for the key statistics (English prose and the facts' texts), as
    `real_fact_task` gives them to the API: the background where none is given and the method reads one."""
    from timerome.data.real_facts import NAME as REAL_FACTS
    from timerome.methods import method_config
    from timerome.methods.registry import reads_background

    if background is not None or calibration is not None or data != REAL_FACTS:
        return background
    config = method_config(method, {"key_metric": key_metric} if method == RIDGE else overrides)
    return REAL_FACTS if reads_background(method, config) else None


def _timerome_config(overrides: dict, given: dict, target: str, default_target: str) -> dict:
    """The timerome method's --config settings merged with its options (`given`, None where not given;
    target and g_max besides): a setting given both ways is refused (`_not_for_edit` has refused those
    `edit` does not use)."""
    overrides = {k: v for k, v in overrides.items() if v is not None}  # null: the default, as leaving it out
    both = [k for k, v in given.items() if v is not None and k in overrides]
    if "target" in overrides and target != default_target:
        both.append("target")
    if both:
        raise TimeromeError(f"{', '.join(both)} given twice, as an option and in --config: give each once")
    out = {k: overrides.get(k, v) for k, v in given.items()}
    out["target"] = overrides.get("target") or target
    out["g_max"] = overrides.get("g_max")
    return out


def _config(text: str | None) -> dict:
    """--config: inline JSON or a JSON file, an object of method settings."""
    return config_arg(text, "method settings")


def _gated(bb, method, out, facts, coordinate, source, tofu_dir, texts, calibration, alpha, target, as_json, model,
           seed, overrides):
    """`timerome edit --method codebook | rewrite`: the method's memory at the coordinate, its radii
    measured on the calibration rows, minus the edited ones (the rewrite memory's token values: on the
    rows `methods.rewrite.known_rows` names, these rows but on the embedded model); the file records
    the calibration spec (`sources`), which `memory add` reads again.
    overrides: --config's settings (margin, inner, n_states, ...); one an option also sets is refused."""
    from timerome.data.facts import qa_rows
    from timerome.data.rows import load_rows, row_source, tofu_folder
    from timerome.data.task import ForgetTask
    from timerome.methods import get_method, method_config
    from timerome.methods.codebook import stating

    spec = calibration_spec(bb, method, source, calibration)
    folder = tofu_folder(spec, tofu_dir)
    rows = load_rows(spec, tofu_dir=folder)
    read = row_source(spec, rows, tofu_dir=folder)  # recorded in the file, for `memory add` (cli/memory.py)
    gated = get_method(method).gated
    over = dict(target=target, coordinate=[coordinate.layer, coordinate.point])
    if gated.step:  # one that acts at every step was refused --step (`_check_options`)
        over["step"] = coordinate.step
    if alpha is not None:
        over["alpha"] = alpha
    both = sorted(set(overrides) & (set(over) | {"calibration"}))
    if both:
        raise TimeromeError(f"--config sets {', '.join(both)}, which the options set too: give each once "
                            "(as an option)")
    config = method_config(method, {**overrides, **over})
    n_given, stated = len(facts), list(facts)  # stated: the facts whose rows state an edited fact
    if gated.check_target is not None:  # after every other refusal, before the model is asked anything
        gated.check_target(bb, facts, config.get("target") or target)
    if gated.said_facts:  # it asks the model each question
        facts, stated = said_by_model(bb, facts)
    spec, spare = spare_rows(bb, method, source, spec, tofu_dir, stated, rows=rows)
    forget = qa_rows(stated)  # those of the facts as given first
    task = ForgetTask(forget_rows=forget[:n_given], facts=facts, retain_rows=spare, background=texts)
    memory = gated.build(bb, task, config, coordinate, facts, seed)
    memory.sources["calibration"] = read
    # the rows of the spec it left out: `memory add` reads the states of the rest again from their cache
    memory.calibration_left_out = [i for i, said in enumerate(stating(rows, forget)) if said]
    if len(rows) - len(memory.calibration_left_out) != len(spare):
        raise RuntimeError("timerome edit: the calibration rows left out do not account for the rows spared")
    check_on_keys(memory, bb, "the memory built")  # an alpha that overflows the model: refused before the write
    memory.save(out)
    _zero_alpha(alpha)  # after every check and the write: a warning never precedes an error
    if as_json:
        print_json(dict(file=str(out), method=method, n_facts=len(memory), n_entries=memory.n_entries,
                        coordinate=memory.coordinate.as_dict(), alpha=memory.alpha, margin=memory.margin,
                        inner=memory.inner, calibration=spec, fact_ids=memory.fact_ids))
        return
    console.print(f"{method} memory of {len(memory)} facts ({memory.n_entries} entries) at {memory.coordinate}: "
                  f"alpha {memory.alpha:g}, margin {memory.margin:g}, radii from {spec} -> {out}", soft_wrap=True)
    console.print(f"try it: {_try_it(model, out, facts)}", soft_wrap=True)


def unsaved(method: str) -> str:
    """Why `timerome edit` cannot save `method`'s edit, and where to evaluate it instead."""
    return (f"{method} changes the model through hooks that are not a memory timerome can save; evaluate it in "
            f"place with `timerome experiment editing --methods {method}`")


def _any_method(bb, method, out, facts, source, calibration, tofu_dir, texts, overrides, alpha, target, seed,
                as_json, model):
    """Any other registered method: installed through the registry on the facts; a memory is saved
    as a memory file, changed weights as a model folder."""
    from timerome.cli.model import record_source, save_backbone
    from timerome.data.facts import qa_rows
    from timerome.data.task import ForgetTask
    from timerome.methods import get_method, install, method_config
    from timerome.methods.registry import reads_retain, recorded_config

    entry = get_method(method)
    kind = entry.kind
    over = dict(overrides)
    if alpha is not None:
        over["alpha"] = alpha
    if "target" in entry.defaults:
        over.setdefault("target", target)
    config = method_config(method, over)
    # the rows it must leave alone, where it reads any (a method that reads none needs none given)
    read = reads_retain(method, config, background_given=texts is not None, embedded=bb.embedded)
    if calibration is not None and not read:  # the embedded model's own training rows stand in (the rest: refused)
        raise TimeromeError(f"--calibration is read by nothing here: on the embedded model {method}'s key statistics "
                            "come from the rows it was trained on (give texts of your own with --background): "
                            "leave it out")
    spec, spare = spare_rows(bb, method, source, calibration, tofu_dir, facts) if read else (None, [])
    forget = qa_rows(facts)
    task = ForgetTask(forget_rows=forget, facts=facts, retain_rows=spare, background=texts)
    edit = install(method, bb, task, config, seed=seed, progress=True)
    if (edit.info or {}).get("diverged_at_step"):
        err_console.print(f"[yellow]note:[/] {method} diverged: its loss was {edit.info['diverged_loss']} at gradient "
                          f"step {edit.info['diverged_at_step']}, so training stopped with the weights of step "
                          f"{edit.info['steps_run']}; lower lr for a smaller change", soft_wrap=True)
    config = recorded_config(config, facts)  # each fact says its own target: recorded and printed as none
    if bb.causal and entry.model_check is not None:  # the cloze-state counts it left unread: recorded as none
        from timerome.methods._locate import CLOZE_STATE_KEYS  # (review 91: the record said n_states 2)

        config = {k: None if k in CLOZE_STATE_KEYS else v for k, v in config.items()}
    if kind == "weights":
        save_backbone(bb, out)
        record_source(out, model, method, len(facts), source, config=config, seed=seed)
        rows = f", retain rows {spec}" if spec is not None else ""  # none read: none named
        what, name = f"the model edited by {method} ({len(facts)} facts{rows})", "model folder"
        try_it = f"timerome generate -m {out} \"{facts[0].prompt}\""
    else:
        memory = getattr(edit, "memory", None)
        if memory is None or not hasattr(memory, "save"):
            raise TimeromeError(unsaved(method))
        if isinstance(memory, list):
            raise TimeromeError(f"{method} built {len(memory)} memories (one per coordinate); save needs one")
        check_on_keys(memory, bb, "the memory built")  # an alpha that overflows the model: refused before the write
        memory.save(out)
        _zero_alpha(alpha)
        what, name = f"{method} memory of {len(memory)} facts at {memory.coordinate}", "memory file"
        try_it = _try_it(model, out, facts)
    if as_json:
        print_json(dict(method=method, out=str(out), kind=name, n_facts=len(facts), config=config, info=edit.info,
                        install_seconds=edit.install_seconds))
        return
    console.print(f"{what} -> {out} ({edit.install_seconds:.1f}s)", soft_wrap=True)
    console.print(f"try it: {try_it}", soft_wrap=True)


def _try_it(model, out, facts) -> str:
    """The command that answers an edited question with the new memory (on the same model)."""
    where = f" -m {model.model}" if model.model else ""
    return f"timerome generate{where} --edit {out} \"{facts[0].prompt}\""

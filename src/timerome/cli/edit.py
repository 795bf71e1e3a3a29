"""`timerome edit`: build an edit memory from a forget set and save it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from timerome.cli.app import (DataOpt, ModelChoice, TofuOpt, app, codebook_calibration, console, err_console,
                              friendly, load_facts as _facts, model_options, print_json)
from timerome.errors import TimeromeError
from timerome.files import output_file
from timerome.methods.timerome_edit import DEFAULTS


@app.command()
@friendly
@model_options
def edit(out: Path = typer.Option(Path("forget.safetensors"), "--out", "-o", help="memory file to write"),
         model: ModelChoice = None,
         method: str = typer.Option("timerome", help="'timerome' (the paper's ridge memory) or 'codebook' (the "
                                                     "radius-gated codebook memory, docs/selectivity.md)"),
         calibration: Optional[str] = typer.Option(
             None, help="codebook: the rows its radii must spare ('embedded:SPLIT', 'tofu:SPLIT' or a JSON/JSONL "
                        "file; default: the retain_perturbed split of --data's source)"),
         data: str = DataOpt, tofu_dir: Optional[str] = TofuOpt,
         layer: Optional[int] = typer.Option(None, help="coordinate layer (default: --trace's best, else the model's default)"),
         module: str = typer.Option("resid", help="hook point: resid (the paper's m*), attn or mlp"),
         trace_file: Optional[Path] = typer.Option(None, "--trace", help="a trace.safetensors (TIE) or positional.safetensors "
                                                   "(timerome trace --positional): edit at its best layer for --module"),
         step: Optional[int] = typer.Option(None, help="edit only at this denoising step (default: every step)"),
         alpha: Optional[float] = typer.Option(None, help="edit strength (default: the method's, 4 for timerome, "
                                                          "8 for codebook)"),
         lam: float = typer.Option(DEFAULTS["lam"], help="ridge lambda, relative to the mean squared key norm"),
         lam_absolute: Optional[float] = typer.Option(
             None, "--lam-absolute", help="the absolute ridge lambda instead of --lam (the paper's convention)"),
         q: int = typer.Option(DEFAULTS["q"], help="top-q sparsity over facts (0: dense)"),
         key_metric: str = typer.Option(DEFAULTS["key_metric"], help="'whitened' (default) or 'paper'"),
         target: str = typer.Option(DEFAULTS["target"], help="what the edited model should say instead"),
         background: Optional[str] = typer.Option(
             None, help="whitening statistics corpus: a text file (one text per line), a JSON/JSONL rows file, "
                        "or 'embedded:SPLIT' / 'tofu:SPLIT' (with --tofu-dir)"),
         as_json: bool = typer.Option(False, "--json", help="print what was built as JSON")):
    """Build an edit memory from a forget set and save it (safetensors + JSON).

    The settings are the `timerome` method's (the demo's and the canonical table's), so a memory
    built here behaves as the evaluated one does.
    """
    from timerome.backbones import HOOK_POINTS
    from timerome.coordinate import Coordinate
    from timerome.edit_memory import default_coordinate
    from timerome.methods import method_config
    from timerome.methods.timerome_edit import build_memory, select
    from timerome.positional_trace import PositionalTrace, is_positional, select_positional
    from timerome.task import ForgetTask
    from timerome.trace_result import TraceResult
    from timerome.whitening import background_texts

    if alpha is not None and alpha <= 0:
        err_console.print(f"[yellow]warning:[/] --alpha {alpha:g}: " + ("the memory will change nothing" if alpha == 0
                          else "a negative alpha pushes away from the target, the reverse of the edit"), soft_wrap=True)

    if method not in ("timerome", "codebook"):
        raise TimeromeError(f"--method must be 'timerome' or 'codebook', got {method!r}")
    if calibration is not None and method != "codebook":
        raise TimeromeError("--calibration applies to --method codebook only")
    if module not in HOOK_POINTS:
        raise TimeromeError(f"--module must be one of {', '.join(HOOK_POINTS)}, got {module!r}")
    if not target.strip():
        raise TimeromeError("--target is empty: give the text the edited model should say instead")
    output_file(out, "--out")  # before minutes of work
    bb = model.load()
    facts = _facts(data, tofu_dir, backbone=bb)
    texts = background_texts(bb, background, tofu_dir=tofu_dir) if background else None
    if trace_file is not None and is_positional(trace_file):
        # ROME's choice for the hook point we edit: its largest mean effect at the last subject token
        positional = PositionalTrace.load(trace_file)
        positional.check_model(bb, trace_file)
        layer = select_positional(positional, (module,)).layer
    elif trace_file is not None:
        # the best layer for the hook point we edit, as the timerome method selects it (m* = resid)
        traced = TraceResult.load(trace_file)
        traced.check_model(bb, trace_file)
        layer = select(traced, (module,)).layer
    elif layer is not None and not 0 <= layer < bb.n_layers:
        raise TimeromeError(f"--layer must lie in 0..{bb.n_layers - 1}, got {layer}")
    coordinate = Coordinate(default_coordinate(bb).layer if layer is None else layer, module, step)
    if method == "codebook":
        return _codebook(bb, out, facts, coordinate, data, tofu_dir, texts, calibration, alpha, target, as_json,
                         model)
    if q > len(facts):
        raise TimeromeError(f"--q {q} exceeds the {len(facts)} facts of {data}: TopQ keeps at most all of them")
    alpha = DEFAULTS["alpha"] if alpha is None else alpha
    config = method_config("timerome", dict(alpha=alpha, lam=lam, lam_absolute=lam_absolute, q=q,
                                            key_metric=key_metric, target=target, step=step))
    task = ForgetTask(forget_rows=[], facts=facts, background=texts)
    memory = build_memory(bb, task, config, coordinate)
    memory.save(out)
    if as_json:
        print_json(dict(file=str(out), n_facts=len(memory), coordinate=memory.coordinate.as_dict(),
                        key_metric=memory.key_metric, alpha=memory.alpha, lam=memory.lam, lam_value=memory.lam_value,
                        q=memory.q, fact_ids=memory.fact_ids))
        return
    console.print(f"edit memory of {len(memory)} facts at {memory.coordinate}: {memory.key_metric} keys, alpha "
                  f"{memory.alpha:g}, lambda {memory.lam_value:.4g}, q {memory.q} -> {out}", soft_wrap=True)
    console.print(f"try it: {_try_it(model, out, facts)}", soft_wrap=True)


def _codebook(bb, out, facts, coordinate, data, tofu_dir, texts, calibration, alpha, target, as_json, model):
    """`timerome edit --method codebook`: the codebook method's memory at the coordinate, its radii
    measured on the calibration rows (minus the forget rows)."""
    from timerome.methods import method_config
    from timerome.methods.codebook import build
    from timerome.task import ForgetTask

    calibration, spare = codebook_calibration(data, calibration, tofu_dir)
    over = dict(target=target, coordinate=[coordinate.layer, coordinate.point], step=coordinate.step)
    if alpha is not None:
        over["alpha"] = alpha
    config = method_config("codebook", over)
    task = ForgetTask(forget_rows=[], facts=facts, retain_rows=spare, background=texts)
    memory = build(bb, task, config, coordinate, facts)
    memory.save(out)
    if as_json:
        print_json(dict(file=str(out), method="codebook", n_facts=len(memory), n_entries=memory.n_entries,
                        coordinate=memory.coordinate.as_dict(), alpha=memory.alpha, margin=memory.margin,
                        inner=memory.inner, calibration=calibration, fact_ids=memory.fact_ids))
        return
    console.print(f"codebook memory of {len(memory)} facts ({memory.n_entries} entries) at {memory.coordinate}: "
                  f"alpha {memory.alpha:g}, margin {memory.margin:g}, radii from {calibration} -> {out}",
                  soft_wrap=True)
    console.print(f"try it: {_try_it(model, out, facts)}", soft_wrap=True)


def _try_it(model, out, facts) -> str:
    """The command that answers a forget question with the new memory (on the same model)."""
    where = f" -m {model.model}" if model.model else ""
    return f"timerome generate{where} --edit {out} \"{facts[0].prompt}\""

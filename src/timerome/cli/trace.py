"""`timerome trace`: TIE heatmaps and the selected coordinate; `--positional`: ROME's positional trace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from timerome.cli.app import DataOpt, ModelChoice, TofuOpt, app, console, err_console, friendly
from timerome.cli.app import load_facts as _facts
from timerome.cli.app import model_options, print_json, tofu_dir_read
from timerome.common.cache import write_json
from timerome.common.checks import integer, number
from timerome.common.files import drop_earlier, output_folder, refuse_inputs_among
from timerome.engine.settings import TRACE
from timerome.errors import TimeromeError
from timerome.tracing.positional_trace import BATCH_SIZE, N_SAMPLES, WINDOW, check_room
from timerome.tracing.tie import NOISE_DRAWS, READ_POSITIONS


@app.command("trace")
@friendly
@model_options
def trace_cmd(out: Path = typer.Option(Path("timerome-trace"), "--out", "-o", help="output folder"),
              model: ModelChoice = None,
              data: str = DataOpt, tofu_dir: Optional[str] = TofuOpt,
              n_facts: int = typer.Option(TRACE.n_facts, help="facts traced (the paper's validation set is 8)"),
              steps: Optional[int] = typer.Option(None, help=f"denoising steps K (default {TRACE.steps})"),
              n_samples: Optional[int] = typer.Option(None, help=f"noise samples per fact (default: {TRACE.n_samples} "
                                                                  f"for TIE, ROME's {N_SAMPLES} with --positional)"),
              sigma: Optional[float] = typer.Option(None, help="noise scale (default: 3 x std of subject embeddings)"),
              tau: Optional[float] = typer.Option(None, help="temporal decay of the TIE aggregation (default "
                                                             f"{TRACE.tau:g})"),
              beta: float = typer.Option(TRACE.beta, help="neighbour penalty (with --neighbours)"),
              neighbours: Optional[str] = typer.Option(None, help="neighbour facts, named like --data"),
              readout: Optional[str] = typer.Option(None, help=f"'decided' or 'aligned' (default '{TRACE.readout}'; "
                                                              "see timerome.tracing.tie)"),
              read_positions: Optional[str] = typer.Option(
                  None, help="answer positions log p(object) sums: 'all' (default) or 'no_subject', every one but "
                             "where the answer repeats the subject's name (timerome.tracing.tie.READ_POSITIONS)"),
              per_fact: bool = typer.Option(False, help="also draw one heatmap per fact"),
              positional: bool = typer.Option(False, "--positional", help="ROME's positional causal trace (token x "
                                              "layer, one forward; any backbone, autoregressive ones too) instead of TIE"),
              window: Optional[int] = typer.Option(None, help="--positional: attn / mlp layers restored together "
                                                               f"(default ROME's {WINDOW})"),
              compare: bool = typer.Option(False, "--compare", help="--positional on an MDLM: also trace TIE on the "
                                           "same facts and draw heatmap_compare.png"),
              seed: int = 0,
              noise: str = typer.Option(TRACE.noise, help="how the noise is drawn: 'in_order' (one generator, fact "
                                                          "after fact) or 'per_fact' (each fact its own, whatever it "
                                                          "is traced with; timerome.tracing.tie.NOISE_DRAWS)"),
              batch_size: Optional[int] = typer.Option(None, help="most rows per forward, a memory knob (default "
                                                                  f"{TRACE.batch_size}, {BATCH_SIZE} with --positional)"),
              as_json: bool = typer.Option(False, "--json", help="print the selection as JSON")):
    """Diffusion-time causal trace: TIE heatmaps and the selected (layer, step, module); with
    --positional, ROME's positional trace and the layer ROME would edit."""
    from timerome.tracing.causal_trace import refuse_causal, trace
    from timerome.tracing.heatmaps import plot_heatmaps, plot_per_fact
    from timerome.tracing.result import pair_stamp
    from timerome.tracing.selection import per_fact_best, runner_up, select_coordinate

    if n_facts < 1:
        raise TimeromeError(f"--n-facts must be >= 1, got {n_facts}")
    if compare and not positional:
        raise TimeromeError("--compare draws the positional trace beside TIE: add --positional")
    if window is not None and not positional:
        raise TimeromeError("--window is the positional trace's: add --positional")
    # the TIE trace's: with --positional, --compare's
    tie_only = {"--steps": steps, "--tau": tau, "--readout": readout, "--read-positions": read_positions}
    unread = [k for k, v in ({"--beta": beta or None, "--neighbours": neighbours} if positional else {}).items()
              if v is not None] + [k for k, v in tie_only.items() if v is not None and positional and not compare]
    if unread:
        comparable = set(unread) <= set(tie_only)  # --compare runs TIE beside it; nothing selects with neighbours
        raise TimeromeError(f"{', '.join(unread)} {'sets' if len(unread) == 1 else 'set'} the TIE trace"
                            + (", which --positional runs only with --compare" if comparable
                               else " and its selection, which the positional trace does not read"))
    steps, tau, readout = (TRACE.steps if steps is None else steps, TRACE.tau if tau is None else tau,
                           TRACE.readout if readout is None else readout)
    # the API's bounds, named as the command line names them (the API said "n_samples", "window", ...: review 79)
    integer(steps, "--steps", lo=1)
    number(tau, "--tau (the decay of the later steps' weights; 0: equal weights)", lo=0)
    for value, flag, lo in ((n_samples, "--n-samples", 1), (window, "--window", 1),
                            (batch_size, "--batch-size (one row is the clean run)", 2)):
        if value is not None:  # unset: the default of the trace run
            integer(value, flag, lo=lo)
    if positional and batch_size is not None:  # before the load: the API's check, under the flags' names
        check_room(batch_size, N_SAMPLES if n_samples is None else n_samples, ("--batch-size", "--n-samples"))
    number(beta, "--beta (the neighbour penalty)", lo=0)  # before the traces, not after them
    if beta and not neighbours:
        raise TimeromeError("--beta penalises the sites that matter for neighbour facts: add --neighbours")
    if neighbours and not beta:  # a second trace nothing would read
        raise TimeromeError("--neighbours traces neighbour facts for --beta's penalty, and --beta is 0: nothing would "
                            "read their trace; give --beta above 0 (e.g. --beta 0.5), or leave --neighbours out")
    if sigma is not None and sigma <= 0:  # the API runs 0 (every TIE 0, a check of the engine); a trace to read, not
        raise TimeromeError(f"--sigma must be > 0, got {sigma:g}" + (": the noise scale 0 corrupts nothing, so every "
                            "TIE is 0 and no coordinate can be selected" if sigma == 0 else ""))
    window = WINDOW if window is None else window
    if noise not in NOISE_DRAWS:
        raise TimeromeError(f"--noise must be one of {', '.join(NOISE_DRAWS)}, got {noise!r}")
    read_positions = TRACE.read_positions if read_positions is None else read_positions
    if read_positions not in READ_POSITIONS:
        raise TimeromeError(f"--read-positions must be one of {', '.join(READ_POSITIONS)}, got {read_positions!r}")
    tofu_dir_read(tofu_dir, data, neighbours)
    output_folder(out)  # a bad folder refused before minutes of tracing (it is made when the results are written)
    inputs = {"--data": data, "--neighbours": neighbours}
    refuse_inputs_among(_earlier_outputs(out), inputs)  # a file this run writes or removes there: refused now
    bb = model.load()
    if compare and bb.causal:  # before the positional trace: TIE, drawn beside it, cannot follow
        raise TimeromeError(f"--compare draws TIE beside the positional trace, and TIE follows a denoising "
                            f"trajectory, which the autoregressive {bb.family.name} model has not: leave --compare "
                            "out (the positional trace alone runs)")
    if not positional:
        refuse_causal(bb)
    facts = _facts(data, tofu_dir, n_facts)  # subjects the vocabulary does not know: the trace itself warns
    if len(facts) < n_facts:  # never silently fewer than asked
        err_console.print(f"[yellow]note:[/] {escape(str(data))} gives {len(facts)} facts: all of them are traced "
                          f"(--n-facts {n_facts})", soft_wrap=True)
    if positional:
        return _positional(bb, facts, out, N_SAMPLES if n_samples is None else n_samples, sigma, window, seed,
                           batch_size, per_fact, compare, steps, tau, readout, as_json, noise, read_positions)
    n_samples = TRACE.n_samples if n_samples is None else n_samples
    kw = dict(steps=steps, n_samples=n_samples, sigma=sigma, tau=tau, seed=seed, noise=noise,
              batch_size=TRACE.batch_size if batch_size is None else batch_size, readout=readout,
              read_positions=read_positions)
    result = trace(bb, facts, **kw)
    other = None
    if neighbours:
        # the same noise scale as the facts' trace (sigma_rule "from trace (...)"): the penalty compares like with like
        other = trace(bb, _facts(neighbours, tofu_dir, n_facts), **{**kw, "sigma": result})
    best, top = select_coordinate(result, other, beta)
    # what `timerome edit --trace` and the timerome method edit: the best residual-stream cell (m* = resid)
    edit_modules = ("resid",) if "resid" in result.modules else None
    chosen = select_coordinate(result, other, beta, modules=edit_modules).best
    penalised = other is not None and beta > 0
    near = {}  # the neighbours' files
    _drop_earlier_outputs(out, _writes("trace", len(result.fact_ids), per_fact, neighbours=penalised), inputs)
    if penalised:  # `timerome edit --trace` selects as this did: the neighbours' trace beside it, named in its settings
        # (written first, its stamp in the trace's settings: a run stopped between the two leaves a pair refused)
        near = other.files(other.save(out / "neighbours.safetensors"), "neighbours")
        result.settings = dict(result.settings, beta=float(beta), neighbours=str(neighbours),
                               neighbours_file="neighbours.safetensors", neighbours_pair=pair_stamp(other.tensors()))
    path = result.save(out / "trace.safetensors")
    # every file written: the trace is the pair (tensors, JSON) that `timerome edit --trace` reads
    files = dict(result.files(path),  # heatmap.png: the name the demo writes
                 heatmaps=str(plot_heatmaps(result, out / "heatmap.png", selected=chosen)), **near)
    if per_fact:
        plot_per_fact(result, out / "per_fact")
        files["per_fact"] = str(out / "per_fact")
    files["selection"] = str(out / "selection.json")
    second = runner_up(result, chosen, other, beta, modules=edit_modules)
    sel = dict(best=best.as_dict(), edit=chosen.edit_dict(), top=[c.as_dict() for c in top],
               per_fact=[c.as_dict() for c in per_fact_best(result)], beta=beta, runner_up=second)
    write_json(out / "selection.json", sel)
    notes = []  # on stderr with --json too (its runner_up holds them as fields): a note is never only in the JSON
    lead = None if second is None else (f"it leads the runner-up, layer {second['layer']} {second['module']} step "
                                        f"{second['step']} ({second['score']:.3f}), by {second['margin']:.3f}")
    if second is not None and second["tie"]:
        notes.append(f"layer {chosen.layer} {chosen.module} ties with the runner-up, layer {second['layer']} "
                     f"{second['module']} step {second['step']} (both {second['score']:.3f}): the order of the cells "
                     "chose it, not the trace; trace more facts or more --n-samples to tell them apart")
    elif second is not None and second["margin_se"] == second["margin_se"] and second["within_noise"]:
        notes.append(f"{lead}, within the trace's noise (standard error "
                     f"{second['margin_se']:.3f} over {len(result.fact_ids)} facts): another --seed, another order "
                     "of the facts or other facts may choose the runner-up; trace more facts or more --n-samples to "
                     "tell them apart")
    if as_json:
        for note in notes:
            err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
        print_json(dict(sel, files=files))
        return
    objective = "mean |TIE|" + (f" - {beta:g} x neighbours' mean |TIE|" if other is not None else "")
    unscored = (", the subject's repeat in each answer not scored (--read-positions no_subject)"
                if read_positions == "no_subject" else "")
    t = Table(title=f"top coordinates: {objective} over {len(result.fact_ids)} facts (nats){unscored}")
    for c in ("rank", "layer", "step", "module", objective, ""):
        t.add_column(c)
    for i, c in enumerate(top[:5]):
        mark = "edited (boxed in the heatmap)" if c == chosen else ""
        t.add_row(str(i + 1), str(c.layer), str(c.step), c.module, f"{c.score:.3f}", mark)
    console.print(t)
    console.print(f"edit coordinate: layer {chosen.layer} {chosen.module}, every step ({objective} "
                  f"{chosen.score:.3f} at step {chosen.step}); `timerome edit --trace` uses it")
    for note in notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if second is not None and not notes:
        if second["margin_se"] != second["margin_se"]:
            console.print(f"{lead} (one fact: no spread to compare it with)")
        else:
            console.print(f"{lead} (standard error {second['margin_se']:.3f} over {len(result.fact_ids)} facts)")
    console.print(f"wrote {', '.join(files.values())}")


def _positional(bb, facts, out, n_samples, sigma, window, seed, batch_size, per_fact, compare, steps, tau, readout,
                as_json, noise, read_positions):
    """`timerome trace --positional`: ROME's trace, its figure, ROME's choice (the MLP at the last subject
    token) and the residual stream's, and with --compare the TIE of the same facts beside it."""
    from timerome.tracing.causal_trace import trace
    from timerome.tracing.heatmaps import plot_compare, plot_positional
    from timerome.tracing.positional_trace import CATEGORIES, positional_trace, select_positional

    result = positional_trace(bb, facts, n_samples=n_samples, sigma=sigma, window=window, seed=seed,
                              batch_size=BATCH_SIZE if batch_size is None else batch_size, noise=noise)
    _drop_earlier_outputs(out, _writes("positional", len(result.fact_ids), per_fact, compare=compare))  # inputs:
    # refused before the load
    path = result.save(out / "positional.safetensors")
    files = dict(result.files(path), heatmaps=str(plot_positional(result, out / "heatmap.png")))
    if per_fact:
        for i in range(len(result.fact_ids)):
            plot_positional(result, out / "per_fact" / f"heatmap-{i}.png", fact=i)
        files["per_fact"] = str(out / "per_fact")
    choices = {m: select_positional(result, (m,)) for m in result.modules}
    files["selection"] = str(out / "selection.json")
    if compare:
        tie = trace(bb, facts, steps=steps, n_samples=n_samples, sigma=result, tau=tau, seed=seed,  # its sigma; its
                    readout=readout, batch_size=TRACE.batch_size if batch_size is None else batch_size,  # warnings
                    noise=noise, read_positions=read_positions)  # said by the positional trace are not said again
        tie_path = tie.save(out / "trace.safetensors")
        files["compare"] = str(plot_compare(result, tie, out / "heatmap_compare.png"))
        files.update(tie.files(tie_path, "tie_trace"))
    mean = result.mean()
    table = {m: {c: mean[i, :, j].tolist() for j, c in enumerate(CATEGORIES)} for i, m in enumerate(result.modules)}
    sel = dict(kind="positional", edit=choices.get("mlp", next(iter(choices.values()))).as_dict(),
               per_module={m: c.as_dict() for m, c in choices.items()}, layers=result.layers, mean_by_category=table,
               clean_p=result.clean_p.tolist())
    write_json(out / "selection.json", sel)
    notes = _nothing_to_restore(result)
    for note in notes:  # on stderr with --json too, and in its JSON
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if as_json:
        print_json(dict(sel, files=files, notes=notes))
        return
    t = Table(title=f"positional trace (ROME) over {len(result.fact_ids)} facts: largest mean effect at the last "
                    "subject token, p(o_1) restored - corrupted")
    for c in ("module", "layer", "effect", ""):
        t.add_column(c)
    for m, c in choices.items():
        t.add_row(m, str(c.layer), f"{c.effect:.3f}", "ROME edits here" if m == "mlp" else "")
    console.print(t)
    last = CATEGORIES.index("last token")
    for i, m in enumerate(result.modules):
        row = mean[i, :, last]
        console.print(f"{m}: largest effect at the last token at layer {result.layers[int(row.nan_to_num(-1).argmax())]} "
                      f"({float(row.nan_to_num(-1).max()):.3f})", soft_wrap=True)
    console.print(f"wrote {', '.join(files.values())}", soft_wrap=True)


SMALL_TOTAL_EFFECT = 0.01  # p(o_1) clean - corrupted below which a positional trace has nothing to restore


def _nothing_to_restore(result) -> list[str]:
    """A note where the noise barely moves p(o_1) (mean clean - mean corrupted < SMALL_TOTAL_EFFECT): every
    restored effect is then about zero, and the largest of them, "ROME edits here", marks no site (review 91: a
    random model's trace chose a layer of effect 0.000 without a word)."""
    clean, corrupted = float(result.clean_p.mean()), float(result.corrupted_p.mean())
    if clean - corrupted >= SMALL_TOTAL_EFFECT:
        return []
    return [f"the noise barely changes p(o_1) (clean {clean:.3g}, corrupted {corrupted:.3g}, mean over "
            f"{len(result.fact_ids)} facts): there is nothing to restore, so the layers chosen mark no site; a model "
            "that gives these objects a higher p(o_1) (one that knows the facts, or answers that start with the "
            "object) traces meaningfully"]


PER_FACT = re.compile(r"heatmap-\d+\.png")  # per_fact/heatmap-<index>.png


def _writes(kind: str, n_facts: int, per_fact: bool, *, neighbours: bool = False, compare: bool = False) -> set[str]:
    """The files (relative to --out) a run of `timerome trace` writes: `kind` "trace" or "positional"."""
    names = {f"{kind}.safetensors", f"{kind}.json", "heatmap.png", "selection.json"}
    if neighbours:
        names |= {"neighbours.safetensors", "neighbours.json"}
    if compare:
        names |= {"trace.safetensors", "trace.json", "heatmap_compare.png"}
    if per_fact:
        names |= {f"per_fact/heatmap-{i}.png" for i in range(n_facts)}
    return names


# every file `timerome trace` writes in its --out but the per-fact heatmaps (PER_FACT), whatever the run: a run's
# files are one set, never mixed with an earlier run's
OUTPUT_FILES = tuple(sorted(_writes("trace", 0, False, neighbours=True) | _writes("positional", 0, False, compare=True)))


def _earlier_outputs(out: Path) -> list[Path]:
    """The files of --out an earlier run of `timerome trace` wrote (what `_drop_earlier_outputs` removes); a
    per_fact that is a symbolic link is left alone (its target is not ours to clear)."""
    old = [out / n for n in OUTPUT_FILES]
    if (out / "per_fact").is_dir() and not (out / "per_fact").is_symlink():
        old += [f for f in (out / "per_fact").iterdir() if PER_FACT.fullmatch(f.name)]
    return old


def _drop_earlier_outputs(out: Path, writes: set[str], inputs: dict | None = None) -> None:
    """Remove an earlier run's files from --out (`common.files.drop_earlier`: only the names this command
    writes): a run stopped between its writes left the earlier selection or heatmaps beside the new trace,
    as if they were this trace's; a TIE run over a positional one (or back) left two traces for
    `edit --trace` to choose between; a run without --neighbours left the earlier neighbours' trace; fewer
    facts left earlier per-fact heatmaps."""
    drop_earlier(out, _earlier_outputs(out), writes, inputs)

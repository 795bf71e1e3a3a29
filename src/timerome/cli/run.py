"""`timerome demo` and `timerome experiment`: the pipeline end to end, and the paper's experiments."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Optional

import typer

from timerome.cli.app import (ModelChoice, app, config_arg, console, err_console, friendly, model_options, parse_seeds,
                              print_json, print_markdown)
from timerome.common.checks import repeated
from timerome.data.benchmark import check_folder
from timerome.errors import TimeromeError


def experiment_names() -> list[str]:
    """The experiments' names in their ORDER, read from the package's files without importing them
    (importing every experiment costs almost a second at each command's start): what the help lists.
    `timerome.experiments.EXPERIMENTS` imports them and is what runs; a test keeps the two equal."""
    import ast
    from importlib.resources import files

    found = []
    for f in files("timerome.experiments").iterdir():
        if not f.name.endswith(".py"):
            continue
        values, defs = {}, set()
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                values |= {t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Assign):
                defs |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.FunctionDef):
                defs.add(node.name)
        if "NAME" in values and {"CONFIG", "cells", "report"} <= defs:
            found.append((values.get("ORDER", 1000), values["NAME"]))
    return [name for _, name in sorted(found)]


@app.command()
@friendly
@model_options
def demo(out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default: timerome-demo-DATE)"),
         model: ModelChoice = None,
         data: str = typer.Option("embedded", help="'embedded', 'tofu' ($TIMEROME_TOFU_DIR or the Hub) or a TOFU directory"),
         reference: Optional[str] = typer.Option(None, help="a checkpoint that never saw the forget set (Forget Quality)"),
         seeds: Optional[str] = typer.Option(None, help="comma-separated seeds (default: 0,1,2; with --quick 0,1)"),
         quick: bool = typer.Option(False, help="a reduced run that exercises every step (numbers mean little)"),
         as_json: bool = typer.Option(False, "--json", help="print the summary as JSON (the rest goes to stderr)")):
    """The main job: trace -> select -> edit -> evaluate, canonical table, heatmaps and Pareto plot."""
    from timerome.common.files import output_folder
    from timerome.demo import run_demo

    seed_list = None if seeds is None else parse_seeds(seeds)  # None: the demo's own (run_demo: quick or not)
    if out is not None:
        output_folder(out, "--out")  # a file in the way, refused before minutes of work
    # with --json the demo's own report goes to stderr: stdout holds the JSON alone
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        result = run_demo(out, model.model, data, seeds=seed_list, reference=reference, quick=quick,
                          backbone=model.load())
    if as_json:
        print_json({**_written(result),  # everything demo.md shows, then the paths
                    **{k: result.get(k) for k in ("summary", "coordinate", "files", "seconds", "phases", "out_dir")}})


def _written(result: dict) -> dict:
    """The JSON an experiment wrote beside its report (every table and note the report shows), or {}."""
    from timerome.common.files import read_json

    path = (result.get("files") or {}).get("json")
    if not path or not Path(path).is_file():
        return {}
    saved = read_json(path, "the experiment's JSON", finite=False)  # what it wrote, as it wrote it
    return saved if isinstance(saved, dict) else {}


@app.command()
@friendly
@model_options
def experiment(name: str = typer.Argument(..., help=", ".join(experiment_names()) + " or all"),
               out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default: timerome-runs/NAME)"),
               model: ModelChoice = None,
               data: str = typer.Option("embedded", help="'embedded', 'tofu' or a TOFU directory"),
               config: Optional[str] = typer.Option(None, "--config", "-c", help="settings to override: a JSON file, or "
                                                                   "inline JSON such as '{\"n_mc\": 8}'"),
               seeds: Optional[str] = typer.Option(None, help="comma-separated seeds (default: 0,1,2)"),
               reference: Optional[str] = typer.Option(None, help="a checkpoint that never saw the forget set"),
               methods: Optional[str] = typer.Option(None, help="comma-separated method names (experiments with a "
                                                                "methods setting)"),
               models: Optional[str] = typer.Option(None, help="xbackbone: comma-separated checkpoint directories"),
               executor: str = typer.Option("local", help="who computes the cells: local or ray"),
               ray_address: Optional[str] = typer.Option(None, help="with --executor ray: 'auto' (a running cluster) "
                                                                    "or ray://HOST:PORT; default a local instance"),
               bench_data: Optional[Path] = typer.Option(None, "--bench-data", help="folder of the benchmark data "
                                                         "(muse/, whp/, wmdp/, rwku/) for transfer and rwku "
                                                         "(default: $TIMEROME_BENCH_DIR, else the Hub)"),
               quick: bool = typer.Option(False, help="the experiment's laptop subset (fewer rows, methods, samples)"),
               fresh: bool = typer.Option(False, help="recompute every cell instead of resuming"),
               no_wait: bool = typer.Option(False, "--no-wait", help="if another run holds --out, stop at once "
                                                                     "(default: wait for it)"),
               as_json: bool = typer.Option(False, "--json", help="print the summaries as JSON")):
    """Run a paper-style experiment (resumable); writes JSON, Markdown tables and PNG plots."""
    from timerome.common.files import output_folder
    from timerome.experiments import CONFIGS, EXPERIMENTS, QUICK, experiment_config, make_executor, run_experiment

    if out is not None:
        output_folder(out, "--out")  # a file in the way, refused before minutes of work
    reads_outputs = getattr(EXPERIMENTS.get(name), "READS_OUTPUTS", False)
    if reads_outputs and (model.model is not None or reference is not None or seeds is not None
                          or data != "embedded" or fresh or executor != "local" or ray_address is not None):
        raise TimeromeError(f"experiment {name!r} draws the other experiments' outputs and computes no cell: -m / "
                            "--reference / --seeds / --data / --fresh / --executor / --ray-address are read by "
                            "nothing; leave them out")
    if models is not None and model.model is not None:
        raise TimeromeError("--models names every checkpoint xbackbone runs; -m / --model beside it is read by nothing")
    overrides = config_arg(config, "experiment settings")
    for flag, text, key in (("--methods", methods, "methods"), ("--models", models, "models")):
        if text is None:
            continue
        if key in overrides:  # the option replaced the setting unread (unchecked, too)
            raise TimeromeError(f"{flag} and -c's {key!r} both give the {key}: give them once")
        names = [m.strip() for m in text.split(",") if m.strip()]
        if not names:
            raise TimeromeError(f"{flag} is empty: give comma-separated names, or leave it out for the experiment's own")
        if len(names) < len(text.split(",")):  # "a,,b": a name left out between the commas
            raise TimeromeError(f"{flag} {text!r} has an empty name between its commas: give each name once")
        twice = repeated(names)
        if twice:  # run once, reported once: the list said twice
            raise TimeromeError(f"{flag} names {', '.join(twice)} twice: give each once")
        overrides[key] = names
    if bench_data is not None:
        takes = [n for n, c in CONFIGS.items() if "bench_dir" in c]
        if name != "all" and name in CONFIGS and "bench_dir" not in CONFIGS[name]:
            raise TimeromeError(f"--bench-data applies only to {' and '.join(takes)}; experiment {name!r} reads no "
                                "benchmark")
        check_folder(bench_data, "--bench-data")
        if "bench_dir" in overrides:
            raise TimeromeError("--bench-data and -c's 'bench_dir' both give the benchmark folder: give it once")
        overrides["bench_dir"] = str(bench_data)
    shrunk = ", ".join(n for n, q in QUICK.items() if q)  # the experiments with a --quick subset
    if name != "all":
        experiment_config(name, overrides, quick)  # the name and every setting, checked before a model loads
        if quick and not QUICK.get(name):  # never start the full protocol when a quick run was asked for
            shrink = ("it computes nothing itself (it draws the other experiments' outputs): leave --quick out"
                      if reads_outputs else
                      "shrink it with settings instead, e.g. " + ("-c '{\"n_mc\": 4}' " if "n_mc" in CONFIGS[name] else "")
                      + "--seeds 0")
            raise TimeromeError(f"experiment {name!r} has no --quick subset (those with one: {shrunk}); {shrink}")
    elif quick:
        full = [n for n, m in EXPERIMENTS.items() if getattr(m, "IN_ALL", True) and not QUICK.get(n)]
        err_console.print(f"[yellow]note:[/] --quick shrinks only {shrunk}; {', '.join(full)} run their full "
                          "protocol", soft_wrap=True)
    seed_list = None if seeds is None else parse_seeds(seeds)  # None: the experiment's own (0, 1, 2)
    run_on = make_executor(executor, ray_address)
    result = run_experiment(name, model.model, data, seed_list, out, resume=not fresh, overrides=overrides,
                            reference=reference, executor=run_on,
                            load=model.loader(), quick=quick,
                            wait=not no_wait)
    results = result if name == "all" else {name: result}
    if as_json:  # everything the report shows: the JSON file it wrote (tables, notes, the run), then the paths
        print_json({n: {**_written(r), **{k: r.get(k) for k in ("summary", "coordinate", "files", "seconds", "out_dir")}}
                    for n, r in results.items()})
        return
    for n, r in results.items():
        if r.get("markdown"):
            print_markdown(r["markdown"])
        console.print(f"[green]{n}[/]: {r['seconds']:.0f}s, outputs in {r['out_dir']}")

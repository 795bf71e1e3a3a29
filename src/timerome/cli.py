"""The `timerome` command line."""

from __future__ import annotations

import json
import sys
from functools import wraps
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from timerome.errors import TimeromeError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find where a masked diffusion LM stores a fact, then make it forget it at inference time.")
console = Console()

ModelOpt = typer.Option(None, "--model", "-m", help="checkpoint directory (default: the embedded model)")
FamilyOpt = typer.Option(None, "--family", help="backbone family (default: from config.json)")
RemoteOpt = typer.Option(False, "--trust-remote-code", help="run the checkpoint's own modelling code")
DeviceOpt = typer.Option("cpu", "--device", help="torch device: cpu, cuda, cuda:1, mps")
DtypeOpt = typer.Option(None, "--dtype", help="float32 (default), bfloat16 or float16")


def friendly(fn):
    """TimeromeError or a file-system error -> one red line and exit code 2, never a traceback."""

    @wraps(fn)
    def inner(*a, **k):
        try:
            return fn(*a, **k)
        except TimeromeError as e:
            console.print(f"[bold red]error:[/] {e}")
            raise typer.Exit(2)
        except OSError as e:  # an unwritable output folder, a full disk, a vanished file
            where = f" ({e.filename})" if e.filename else ""
            console.print(f"[bold red]error:[/] {e.strerror or e}{where}")
            raise typer.Exit(2)

    return inner


@app.callback()
@friendly
def _options(threads: Optional[int] = typer.Option(
        None, "--threads", help="CPU threads torch may use (default: torch's own choice, one per core)")):
    # a shared machine or several jobs at once: fewer threads than cores avoids oversubscription
    if threads is not None:
        if threads < 1:
            raise TimeromeError(f"--threads must be at least 1, got {threads}")
        import torch

        torch.set_num_threads(threads)


def _load(model, family=None, trust_remote_code=False, dtype=None, device="cpu"):
    from timerome.backbones import load_backbone

    return load_backbone(model, family, dtype=dtype, device=device, trust_remote_code=trust_remote_code)


@app.command()
@friendly
def info(checkpoint: Optional[str] = typer.Argument(None, help="checkpoint directory (same as --model)"),
         model: Optional[str] = ModelOpt, family: Optional[str] = FamilyOpt,
         trust_remote_code: bool = RemoteOpt,
         device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
         as_json: bool = typer.Option(False, "--json", help="print the description as JSON")):
    """Show a backbone's family (and why), tokenizer, special ids, hook points and refused config flags."""
    from timerome.backbones.describe import describe, describe_refusal, summary_rows
    from timerome.backbones.flags import RefusedConfig

    if checkpoint and model and checkpoint != model:
        raise TimeromeError(f"two checkpoints given ({checkpoint} and --model {model}); pass one")
    model = checkpoint or model
    try:
        bb = _load(model, family, trust_remote_code, dtype, device)
        d = describe(bb)
    except RefusedConfig as e:
        d = describe_refusal(e)
        if as_json:
            typer.echo(json.dumps(d, indent=2))
            raise typer.Exit(2)
        _print_rows(d["family"], summary_rows(d))
        raise
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    _print_rows(str(bb), summary_rows(d))
    t = Table(title="hook points")
    t.add_column("point")
    t.add_column("module path (layer 0)")
    for p, path in d["hook_points"].items():
        t.add_row(p, path)
    console.print(t)


def _print_rows(title: str, rows) -> None:
    t = Table(title=title, show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


@app.command("build-default")
@friendly
def build_default_cmd(out: Path = typer.Option(None, help="output directory (default: the package's assets)"),
                      check: bool = typer.Option(False, help="rebuild into a temporary folder and compare bytes with the shipped weights")):
    """Rebuild the embedded default model bit-for-bit (under 5 minutes on 2 idle CPU cores)."""
    import tempfile

    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.default_model import build_default, weights_sha256

    if check:
        with tempfile.TemporaryDirectory() as tmp:
            info = build_default(tmp)
            shipped = weights_sha256(DEFAULT_MODEL_DIR)
            same = info["sha256"] == shipped
            console.print(f"rebuilt sha256 {info['sha256']}\nshipped sha256 {shipped}\n"
                          + ("[green]identical[/]" if same else "[red]DIFFERENT[/]"))
            raise typer.Exit(0 if same else 1)
    info = build_default(out or DEFAULT_MODEL_DIR)
    console.print_json(json.dumps(info))


@app.command()
@friendly
def train(data: str = typer.Option("embedded:full", help="'embedded:SPLIT', 'tofu:SPLIT' (local dir from --tofu-dir) or a JSON/JSONL file of question/answer rows"),
          out: Path = typer.Option(..., help="directory to save the fine-tuned checkpoint"),
          model: Optional[str] = ModelOpt, family: Optional[str] = FamilyOpt,
          trust_remote_code: bool = RemoteOpt,
          device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
          epochs: int = 10, lr: float = 1e-4, batch_size: int = 16,
          lora_r: int = typer.Option(0, help="LoRA rank (0 = full fine-tuning; the paper uses 128)"),
          tofu_dir: Optional[str] = typer.Option(None, help="local TOFU directory (Hub layout)"),
          seed: int = 0):
    """Fine-tune a backbone on question/answer pairs with the MDLM objective."""
    from timerome.data.rows import load_rows
    from timerome.train import TrainConfig
    from timerome.train import train as run_train

    bb = _load(model, family, trust_remote_code, dtype, device)
    rows = load_rows(data, tofu_dir=tofu_dir)
    log = run_train(bb, rows, TrainConfig(epochs=epochs, lr=lr, batch_size=batch_size, lora_r=lora_r, seed=seed))
    save_backbone(bb, out)
    console.print(f"trained {len(rows)} rows for {epochs} epochs in {log['seconds']:.1f}s; "
                  f"final loss {sum(log['loss'][-10:]) / len(log['loss'][-10:]):.3f}; saved to {out}")


def save_backbone(bb, out: Path) -> None:
    from timerome.backbones.llada_model import save_model

    out = Path(out)
    if hasattr(bb.model, "cfg"):
        save_model(bb.model, out)
    else:
        bb.model.save_pretrained(str(out), safe_serialization=True)
        cfg = json.loads((out / "config.json").read_text())
        cfg["model_type"] = bb.config.get("model_type", cfg.get("model_type"))
        cfg.setdefault("mask_token_id", bb.mask_id)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    bb.tokenizer.save_pretrained(str(out))


@app.command()
@friendly
def generate(prompt: list[str] = typer.Argument(..., help="one or more prompts"),
             model: Optional[str] = ModelOpt, family: Optional[str] = FamilyOpt,
             trust_remote_code: bool = RemoteOpt,
             device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
             steps: int = 8, gen_length: int = 8, block_length: int = 8,
             temperature: float = 0.0, remasking: str = "low_confidence", seed: int = 0,
             edit: Optional[Path] = typer.Option(None, "--edit", help="an edit memory file: answer with and without it")):
    """Answer prompts with the denoising sampler (optionally with an edit memory side by side)."""
    import torch

    from timerome.sampler import generate as gen

    bb = _load(model, family, trust_remote_code, dtype, device)
    memory = None
    if edit is not None:
        from timerome.edit_memory import EditMemory

        memory = EditMemory.load(edit, bb)
        k = memory.coordinate.step
        if k is not None and not 0 <= k < steps:
            raise TimeromeError(f"{edit} edits only at denoising step {k}, which a {steps}-step run never "
                                f"reaches: pass --steps {k + 1} or more")
    t = Table(show_lines=True)
    t.add_column("prompt")
    t.add_column("answer")
    if memory is not None:
        t.add_column("answer with edit")
    def shown(ids):
        text = bb.decode(ids)
        end = bb.family.answer_end
        # cut at the first end mark after some content: an edited answer may open with one
        words = next((i for i, ch in enumerate(text) if ch.isalnum()), len(text))
        cut = text.find(end, words) if end else -1
        return text[: cut + len(end)] if cut >= 0 else text

    for p in prompt:
        ids = torch.tensor([bb.encode(p)], device=bb.device)
        kw = dict(steps=steps, gen_length=gen_length, block_length=block_length, temperature=temperature,
                  remasking=remasking, generator=torch.Generator(device=bb.device).manual_seed(seed))
        with torch.no_grad():
            plain = shown(gen(bb, ids, **kw)[0, ids.shape[1]:])
            row = [p, plain]
            if memory is not None:
                kw["generator"] = torch.Generator(device=bb.device).manual_seed(seed)
                with memory.applied(bb) as state:  # the state tells a step-k* edit which step it is
                    row.append(shown(gen(bb, ids, state=state, **kw)[0, ids.shape[1]:]))
        t.add_row(*row)
    console.print(t)


DataOpt = typer.Option("embedded:forget01", "--data", "-d",
                       help="facts: 'embedded:SPLIT', 'tofu:SPLIT' (with --tofu-dir) or a JSON/JSONL file of "
                            "question/answer rows (with 'author' or 'subject' where the subject is not a TOFU author)")
TofuOpt = typer.Option(None, "--tofu-dir", help="local TOFU directory in the Hub layout")


def _facts(data: str, tofu_dir, limit=None):
    from timerome.data.rows import load_facts

    facts, skipped = load_facts(data, tofu_dir=tofu_dir, limit=limit)
    for i, why in skipped[:10]:
        console.print(f"[yellow]skipped row {i}:[/] {why}")
    if len(skipped) > 10:
        console.print(f"[yellow]... and {len(skipped) - 10} more rows skipped[/]")
    return facts


@app.command("trace")
@friendly
def trace_cmd(out: Path = typer.Option(Path("timerome-trace"), "--out", "-o", help="output folder"),
              model: Optional[str] = ModelOpt, family: Optional[str] = FamilyOpt,
              trust_remote_code: bool = RemoteOpt,
              device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
              data: str = DataOpt, tofu_dir: Optional[str] = TofuOpt,
              n_facts: int = typer.Option(8, help="facts traced (the paper's validation set is 8)"),
              steps: int = typer.Option(8, help="denoising steps K"),
              n_samples: int = typer.Option(5, help="noise samples per fact"),
              sigma: Optional[float] = typer.Option(None, help="noise scale (default: 3 x std of subject embeddings)"),
              tau: float = typer.Option(1.0, help="temporal decay of the TIE aggregation"),
              beta: float = typer.Option(0.0, help="neighbour penalty (with --neighbours)"),
              neighbours: Optional[str] = typer.Option(None, help="neighbour facts, named like --data"),
              readout: str = typer.Option("decided", help="'decided' or 'aligned' (see timerome.tracing)"),
              per_fact: bool = typer.Option(False, help="also draw one heatmap per fact"),
              seed: int = 0, batch_size: int = 256):
    """Diffusion-time causal trace: TIE heatmaps and the selected (layer, step, module)."""
    from timerome.heatmaps import plot_heatmaps, plot_per_fact
    from timerome.selection import per_fact_best, select_coordinate
    from timerome.tracing import trace

    if n_facts < 1:
        raise TimeromeError(f"--n-facts must be >= 1, got {n_facts}")
    out.mkdir(parents=True, exist_ok=True)  # fail on a bad folder before minutes of tracing
    bb = _load(model, family, trust_remote_code, dtype, device)
    facts = _facts(data, tofu_dir, n_facts)
    kw = dict(steps=steps, n_samples=n_samples, sigma=sigma, tau=tau, seed=seed, batch_size=batch_size,
              readout=readout)
    result = trace(bb, facts, **kw)
    other = None
    if neighbours:
        # the same noise scale as the facts' trace: the penalty compares like with like
        other = trace(bb, _facts(neighbours, tofu_dir, n_facts), **{**kw, "sigma": result.settings["sigma"]})
    best, top = select_coordinate(result, other, beta)
    result.save(out / "trace.safetensors")
    png = plot_heatmaps(result, out / "heatmaps.png")
    if per_fact:
        plot_per_fact(result, out / "per_fact")
    sel = dict(best=best.as_dict(), top=[c.as_dict() for c in top],
               per_fact=[c.as_dict() for c in per_fact_best(result)], beta=beta)
    (out / "selection.json").write_text(json.dumps(sel, indent=2) + "\n")
    t = Table(title=f"top coordinates (mean |TIE| over {len(result.fact_ids)} facts, nats)")
    for c in ("rank", "layer", "step", "module", "score"):
        t.add_column(c)
    for i, c in enumerate(top[:5]):
        d = c.as_dict()
        t.add_row(str(i + 1), str(d["layer"]), str(d["step"]), d["module"], f"{d['score']:+.3f}")
    console.print(t)
    console.print(f"wrote {out / 'trace.safetensors'}, {png}, {out / 'selection.json'}")


@app.command()
@friendly
def edit(out: Path = typer.Option(Path("forget.safetensors"), "--out", "-o", help="memory file to write"),
         model: Optional[str] = ModelOpt, family: Optional[str] = FamilyOpt,
         trust_remote_code: bool = RemoteOpt,
         device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
         data: str = DataOpt, tofu_dir: Optional[str] = TofuOpt,
         layer: Optional[int] = typer.Option(None, help="coordinate layer (default: --trace's best, else the model's default)"),
         module: str = typer.Option("resid", help="hook point: resid (the paper's m*), attn or mlp"),
         trace_file: Optional[Path] = typer.Option(None, "--trace", help="a trace.safetensors: edit at its best layer for --module"),
         step: Optional[int] = typer.Option(None, help="edit only at this denoising step (default: every step)"),
         alpha: float = typer.Option(4.0, help="edit strength (the timerome method's default)"),
         lam: float = typer.Option(8.0, help="ridge lambda, relative to the mean squared key norm (see --absolute-lam)"),
         absolute_lam: bool = typer.Option(False, help="take --lam as the absolute ridge lambda (the paper's convention)"),
         q: int = typer.Option(0, help="top-q sparsity over facts (0: dense)"),
         key_metric: str = typer.Option("whitened", help="'whitened' (default) or 'paper'"),
         target: str = typer.Option("I don't know.", help="what the edited model should say instead"),
         background: Optional[Path] = typer.Option(None, help="text file (one text per line) for the whitening statistics")):
    """Build an edit memory from a forget set and save it (safetensors + JSON).

    The settings are the `timerome` method's (the demo's and the canonical table's), so a memory
    built here behaves as the evaluated one does.
    """
    from timerome.methods import ForgetTask, method_config
    from timerome.methods.timerome_edit import build_memory

    bb = _load(model, family, trust_remote_code, dtype, device)
    facts = _facts(data, tofu_dir)
    from timerome.backbones import HOOK_POINTS

    if module not in HOOK_POINTS:
        raise TimeromeError(f"--module must be one of {', '.join(HOOK_POINTS)}, got {module!r}")
    if trace_file is not None:
        from timerome.methods.timerome_edit import select
        from timerome.tracing import TraceResult

        # the best layer for the hook point we edit, as the timerome method selects it (m* = resid)
        coordinate = (select(TraceResult.load(trace_file), (module,)).layer, module)
    elif layer is not None:
        if not 0 <= layer < bb.n_layers:
            raise TimeromeError(f"--layer must lie in 0..{bb.n_layers - 1}, got {layer}")
        coordinate = (layer, module)
    else:
        from timerome.edit_memory import default_coordinate

        coordinate = (default_coordinate(bb).layer, module)
    bg = None
    if background is not None:
        from timerome.whitening import read_texts

        bg = read_texts(background)
    if q > len(facts):
        raise TimeromeError(f"--q {q} exceeds the {len(facts)} facts of {data}: TopQ keeps at most all of them")
    config = method_config("timerome", dict(alpha=alpha, lam=lam, q=q, key_metric=key_metric,
                                            target=target, step=step,
                                            lam_mode="absolute" if absolute_lam else "relative"))
    task = ForgetTask(forget_rows=[], facts=facts, background=bg)
    memory = build_memory(bb, task, config, coordinate)
    memory.save(out)
    c = memory.coordinate
    console.print(f"edit memory of {len(memory)} facts at layer {c.layer} {c.point} "
                  f"({memory.key_metric}, alpha {memory.alpha:g}, lambda {memory.lam:.4g}, q {memory.q}) -> {out}")
    console.print(f"try it: timerome generate --edit {out} \"{facts[0].prompt}\"")


@app.command()
@friendly
def demo(out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default: timerome-demo-DATE)"),
         model: Optional[str] = ModelOpt,
         data: str = typer.Option("embedded", help="'embedded', 'tofu' ($TIMEROME_TOFU_DIR or the Hub) or a TOFU directory"),
         reference: Optional[str] = typer.Option(None, help="a checkpoint that never saw the forget set (Forget Quality)"),
         seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
         quick: bool = typer.Option(False, help="a reduced run that exercises every step (numbers mean little)"),
         device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """The main job: trace -> select -> edit -> evaluate, canonical table, heatmaps and Pareto plot."""
    from timerome.demo import run_demo

    seed_list = _seeds(seeds)
    run_demo(out, model, data, seeds=seed_list, reference=reference, quick=quick,
             backbone=_load(model, None, False, dtype, device))


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise TimeromeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise TimeromeError("give at least one seed")
    return seeds


@app.command()
@friendly
def experiment(name: str = typer.Argument(..., help="canonical, scalability, sequential, pareto, ablations or all"),
               out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default: timerome-runs/NAME)"),
               model: Optional[str] = ModelOpt,
               data: str = typer.Option("embedded", help="'embedded', 'tofu' or a TOFU directory"),
               config: Optional[Path] = typer.Option(None, "--config", "-c", help="JSON file of settings to override"),
               seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
               reference: Optional[str] = typer.Option(None, help="a checkpoint that never saw the forget set"),
               methods: Optional[str] = typer.Option(None, help="canonical only: comma-separated method names"),
               fresh: bool = typer.Option(False, help="recompute every cell instead of resuming"),
               device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt):
    """Run a paper-style experiment (resumable); writes JSON, Markdown tables and PNG plots."""
    from timerome.experiments import EXPERIMENTS, run_experiment

    if name != "all" and name not in EXPERIMENTS:  # before loading a model that may take minutes
        raise TimeromeError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} or all")
    overrides = {}
    if config is not None:
        try:
            overrides = json.loads(Path(config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise TimeromeError(f"cannot read config {config}: {e}") from None
        if not isinstance(overrides, dict):
            raise TimeromeError(f"config {config} must hold a JSON object of settings")
    if methods:
        overrides["methods"] = [m.strip() for m in methods.split(",") if m.strip()]
    seed_list = _seeds(seeds)
    result = run_experiment(name, model, data, seed_list, out, resume=not fresh, overrides=overrides,
                            reference=reference, backbone=_load(model, None, False, dtype, device))
    results = result if name == "all" else {name: result}
    for n, r in results.items():
        md = Path(r["out_dir"]) / f"{n}.md"
        if md.exists():
            console.print(md.read_text())
        console.print(f"[green]{n}[/]: {r['seconds']:.0f}s, outputs in {r['out_dir']}")


@app.command("methods")
def methods_cmd():
    """List the registered methods and their default settings."""
    from timerome.methods import available, method_config

    t = Table(title="methods")
    t.add_column("name")
    t.add_column("defaults")
    for m in available():
        t.add_row(m, json.dumps(method_config(m), default=str))
    console.print(t)


def main():  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

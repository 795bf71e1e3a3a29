"""`timerome trace`: TIE heatmaps and the selected coordinate."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from timerome.cli.app import (DataOpt, ModelChoice, TofuOpt, app, console, friendly, load_facts as _facts, model_options,
                              print_json)
from timerome.cache import write_json
from timerome.errors import TimeromeError
from timerome.files import output_folder


@app.command("trace")
@friendly
@model_options
def trace_cmd(out: Path = typer.Option(Path("timerome-trace"), "--out", "-o", help="output folder"),
              model: ModelChoice = None,
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
              seed: int = 0, batch_size: int = 256,
              as_json: bool = typer.Option(False, "--json", help="print the selection as JSON")):
    """Diffusion-time causal trace: TIE heatmaps and the selected (layer, step, module)."""
    from timerome.heatmaps import plot_heatmaps, plot_per_fact
    from timerome.selection import per_fact_best, select_coordinate
    from timerome.tracing import trace

    if n_facts < 1:
        raise TimeromeError(f"--n-facts must be >= 1, got {n_facts}")
    output_folder(out).mkdir(parents=True, exist_ok=True)  # fail on a bad folder before minutes of tracing
    bb = model.load()
    facts = _facts(data, tofu_dir, n_facts, backbone=bb)
    kw = dict(steps=steps, n_samples=n_samples, sigma=sigma, tau=tau, seed=seed, batch_size=batch_size,
              readout=readout)
    result = trace(bb, facts, **kw)
    other = None
    if neighbours:
        # the same noise scale as the facts' trace: the penalty compares like with like
        other = trace(bb, _facts(neighbours, tofu_dir, n_facts, backbone=bb), **{**kw, "sigma": result.settings["sigma"]})
    best, top = select_coordinate(result, other, beta)
    # what `timerome edit --trace` and the timerome method edit: the best residual-stream cell (m* = resid)
    chosen = select_coordinate(result, other, beta, modules=("resid",)).best if "resid" in result.modules else best
    result.save(out / "trace.safetensors")
    png = plot_heatmaps(result, out / "heatmap.png", selected=chosen)  # the name the demo writes
    if per_fact:
        plot_per_fact(result, out / "per_fact")
    sel = dict(best=best.as_dict(), edit=chosen.as_dict(), top=[c.as_dict() for c in top],
               per_fact=[c.as_dict() for c in per_fact_best(result)], beta=beta)
    write_json(out / "selection.json", sel)
    if as_json:
        print_json(dict(sel, files=dict(trace=str(out / "trace.safetensors"), heatmaps=str(png),
                                        selection=str(out / "selection.json"))))
        return
    objective = "mean |TIE|" + (f" - {beta:g} x neighbours' mean |TIE|" if other is not None else "")
    t = Table(title=f"top coordinates: {objective} over {len(result.fact_ids)} facts (nats)")
    for c in ("rank", "layer", "step", "module", objective, ""):
        t.add_column(c)
    for i, c in enumerate(top[:5]):
        mark = "edited (boxed in the heatmap)" if c == chosen else ""
        t.add_row(str(i + 1), str(c.layer), str(c.step), c.module, f"{c.score:.3f}", mark)
    console.print(t)
    console.print(f"edit coordinate: layer {chosen.layer} {chosen.module}, every step ({objective} "
                  f"{chosen.score:.3f} at step {chosen.step}); `timerome edit --trace` uses it")
    console.print(f"wrote {out / 'trace.safetensors'}, {png}, {out / 'selection.json'}")

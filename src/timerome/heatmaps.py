"""TIE heatmaps as PNG: layer x denoising step, one panel per module, side by side (paper figure).

Drawn with matplotlib's Agg canvas directly (no pyplot state, works headless). The panels share
one symmetric colour scale, because TIE is signed and the modules are compared against each other
(attn / mlp alone are usually much weaker than resid). The outlined cell is the selected
coordinate (`selection.select_coordinate`: the largest mean |TIE| over facts; for one fact, its
largest |TIE|), or the `selected` candidate given: the same one the trace command prints and edits.
The same result gives the same PNG bytes (no timestamp, no version string in the file).
"""

from __future__ import annotations

from pathlib import Path

from timerome.errors import TimeromeError
from timerome.selection import per_fact_best, select_coordinate

TITLES = {"resid": "residual stream", "attn": "attention output", "mlp": "MLP output"}


def plot_heatmaps(result, path: str | Path, *, fact: int | str | None = None, title: str | None = None,
                  dpi: int = 110, selected=None) -> Path:
    """Write the heatmaps of the mean over facts (fact=None) or of one fact (index or id) to path;
    `selected` (a selection.Candidate) is outlined, by default the selection's best."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    if fact is None:
        data, what = result.mean(), f"mean over {len(result.fact_ids)} facts"
        selected = selected or select_coordinate(result).best
    else:
        i = result.fact_index(fact)
        data, what = result.tie[i], f"fact {result.fact_ids[i]}"
        selected = selected or per_fact_best(result)[i]
    data = data.float().numpy()  # [M, Ly, K]
    M, Ly, K = data.shape
    vmax = float(abs(data).max()) or 1.0  # all-zero maps still get a valid scale
    box_m, box_l = result.modules.index(selected.module), result.layers.index(selected.layer)
    fig = Figure(figsize=(2.2 + 2.6 * M, 1.6 + 0.32 * max(Ly, 4)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, M, squeeze=False)[0]
    for m, ax in enumerate(axes):
        im = ax.imshow(data[m], origin="lower", aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax,
                       interpolation="nearest")
        ax.set_title(TITLES.get(result.modules[m], result.modules[m]), fontsize=10)
        ax.set_xlabel("denoising step k")
        ax.set_xticks(range(K))
        ax.set_yticks(range(Ly), [str(l) for l in result.layers])
        if m == 0:
            ax.set_ylabel("layer")
        if m == box_m:
            ax.add_patch(Rectangle((selected.step - 0.5, box_l - 0.5), 1, 1, fill=False, lw=1.5, ec="black"))
    fig.colorbar(im, ax=list(axes), label="TIE (nats)")
    s = result.settings
    fig.suptitle(title or f"diffusion-time TIE, {what}  (sigma={s.get('sigma', float('nan')):.3g}, "
                 f"tau={s.get('tau')}, {s.get('n_samples')} noise samples)\nbox: layer {selected.layer} "
                 f"{selected.module} step {selected.step}, {'mean ' if fact is None else ''}|TIE| "
                 f"{selected.mean_abs_tie:.3g} nats", fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": None})
    return path


def plot_per_fact(result, directory: str | Path, *, dpi: int = 110) -> list[Path]:
    """One PNG per fact, named heatmap-<index>.png, in directory."""
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise TimeromeError(f"{d} is a file; give a directory for the per-fact heatmaps")
    return [plot_heatmaps(result, d / f"heatmap-{i}.png", fact=i, dpi=dpi) for i in range(len(result.fact_ids))]

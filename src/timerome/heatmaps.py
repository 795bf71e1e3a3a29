"""TIE heatmaps as PNG: layer x denoising step, one panel per module, side by side (paper figure).

Drawn with matplotlib's Agg canvas directly (no pyplot state, works headless). The panels share
one symmetric colour scale, because TIE is signed and the modules are compared against each other
(attn / mlp alone are usually much weaker than resid). The cell with the largest |TIE| is outlined.
The same result gives the same PNG bytes (no timestamp, no version string in the file).
"""

from __future__ import annotations

from pathlib import Path

from timerome.errors import TimeromeError

TITLES = {"resid": "residual stream", "attn": "attention output", "mlp": "MLP output"}


def plot_heatmaps(result, path: str | Path, *, fact: int | str | None = None, title: str | None = None,
                  dpi: int = 110) -> Path:
    """Write the heatmaps of the mean over facts (fact=None) or of one fact (index or id) to path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    if fact is None:
        data, what = result.mean(), f"mean over {len(result.fact_ids)} facts"
    else:
        i = result.fact_index(fact)
        data, what = result.tie[i], f"fact {result.fact_ids[i]}"
    data = data.float().numpy()  # [M, Ly, K]
    M, Ly, K = data.shape
    vmax = float(abs(data).max()) or 1.0  # all-zero maps still get a valid scale
    best = divmod(int(abs(data).argmax()), Ly * K)
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
        if m == best[0]:
            li, k = divmod(best[1], K)
            ax.add_patch(Rectangle((k - 0.5, li - 0.5), 1, 1, fill=False, lw=1.5, ec="black"))
    fig.colorbar(im, ax=list(axes), label="TIE (nats)")
    s = result.settings
    fig.suptitle(title or f"diffusion-time TIE, {what}  (sigma={s.get('sigma', float('nan')):.3g}, "
                 f"tau={s.get('tau')}, {s.get('n_samples')} noise samples)", fontsize=10)
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

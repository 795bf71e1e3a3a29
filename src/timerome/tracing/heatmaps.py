"""TIE heatmaps as PNG: layer x denoising step, one panel per module, side by side (paper figure);
the positional trace's as ROME draws them (token x layer, one panel per module); and the two side
by side on the same facts (`plot_compare`, the paper's Figure "heatmap_compare").

Drawn with matplotlib's Agg canvas directly (no pyplot state, works headless). The panels of a row
share one colour scale (symmetric for the signed TIE), because the modules are compared against
each other (attn / mlp alone are usually much weaker than resid); the mean over facts adds a row of
mean |TIE|, the quantity selection ranks. The outlined cell is the selected
coordinate (`selection.select_coordinate`: the largest mean |TIE| over facts; for one fact, its
largest |TIE|), or the `selected` candidate given: the same one the trace command prints and edits.
The same result gives the same PNG bytes (no timestamp, no version string in the file).
"""

from __future__ import annotations

from pathlib import Path

import torch

from timerome.common.plots import DPI, figure, save_png
from timerome.engine.coordinate import Coordinate
from timerome.errors import TimeromeError
from timerome.tracing.selection import _candidate, per_fact_best, select_coordinate, trace_arg

TITLES = {"resid": "residual stream", "attn": "attention output", "mlp": "MLP output"}
ROME_CMAPS = {"resid": "Purples", "mlp": "Greens", "attn": "Reds"}  # ROME's figure colours per module


def plot_heatmaps(result, path: str | Path, *, fact: int | str | None = None, title: str | None = None,
                  dpi: int = DPI, selected=None) -> Path:
    """Write the heatmaps of the mean over facts (fact=None) or of one fact (index or id) to path;
    `selected` (a selection.Candidate) is outlined, by default the selection's best. result: a
    TraceResult, or the path of a saved one (`TraceResult.load`).

    The mean over facts has two rows: the signed mean TIE_bar (the paper's figure) and the mean
    |TIE_bar| that selection ranks (a cell whose facts disagree in sign is pale in the first and may
    be the box: the second shows why). One fact has one row, its signed TIE_bar, boxed at its largest
    |TIE_bar|."""
    from matplotlib.patches import Rectangle

    result = trace_arg(result, "plot_heatmaps's result", load=True)
    if fact is None:
        data, what = result.mean(), f"mean over {len(result.fact_ids)} facts"
        ranked = result.tie.abs().mean(0)
    else:
        i = result.fact_index(fact)
        data, what, ranked = result.tie[i], f"fact {result.fact_ids[i]}", None
    magnitude = data.abs() if ranked is None else ranked  # what the box's number is
    if selected is None:
        selected = select_coordinate(result).best if fact is None else per_fact_best(result)[i]
    elif isinstance(selected, Coordinate):  # a Coordinate (not the Candidate select_coordinate gives): its cell
        selected = _cell(result, selected, data, magnitude)
    else:
        _check_selected(result, selected, magnitude)
    if Path(path).is_dir():
        raise TimeromeError(f"{path} is a folder: give the heatmap's file name (e.g. {Path(path) / 'heatmap.png'})")
    rows = [(data.float().numpy(), "RdBu_r", "mean TIE (nats)" if fact is None else "TIE (nats)", True)]
    if ranked is not None:
        rows.append((ranked.float().numpy(), "Purples", "mean |TIE| (nats),\nwhat selection ranks", False))
    M, Ly, K = rows[0][0].shape
    box_m, box_l = result.modules.index(selected.module), result.layers.index(selected.layer)
    fig = figure(2.2 + 2.6 * M, (1.6 + 0.32 * max(Ly, 4)) * (1 + 0.8 * (len(rows) - 1)))
    grid = fig.subplots(len(rows), M, squeeze=False)
    for r, (values, cmap, label, signed) in enumerate(rows):
        vmax = float(abs(values).max()) or 1.0  # all-zero maps still get a valid scale
        for m, ax in enumerate(grid[r]):
            im = ax.imshow(values[m], origin="lower", aspect="auto", cmap=cmap, vmin=-vmax if signed else 0.0,
                           vmax=vmax, interpolation="nearest")
            if r == 0:
                ax.set_title(TITLES.get(result.modules[m], result.modules[m]), fontsize=10)
            if r == len(rows) - 1:
                ax.set_xlabel("denoising step k")
            ax.set_xticks(range(K))
            ax.set_yticks(range(Ly), [str(l) for l in result.layers])
            if m == 0:
                ax.set_ylabel("layer")
            if m == box_m:
                ax.add_patch(Rectangle((selected.step - 0.5, box_l - 0.5), 1, 1, fill=False, lw=1.5, ec="black"))
        fig.colorbar(im, ax=list(grid[r]), label=label)
    s = result.settings
    penalty = (f" - {s['beta']:g} x neighbours' = {selected.score:.3g}"
               if fact is None and selected.neighbour_abs_tie and s.get("beta") else "")
    unscored = ", the subject's repeat in the answer not scored" if s.get("read_positions") == "no_subject" else ""
    fig.suptitle(title or f"diffusion-time TIE, {what}  (sigma={s.get('sigma', float('nan')):.3g}, "
                 f"tau={s.get('tau')}, {s.get('n_samples')} noise samples{unscored})\nbox: layer {selected.layer} "
                 f"{selected.module} step {selected.step}, {'mean ' if fact is None else ''}|TIE| "
                 f"{selected.mean_abs_tie:.3g} nats{penalty}", fontsize=10)
    return save_png(fig, path, dpi)


def _check_selected(result, selected, magnitude) -> None:
    """A Candidate to outline must be a cell of this trace whose |TIE| is this trace's there (a candidate
    of another trace would put its box and its number on this one's heatmap)."""
    M, Ly, K = magnitude.shape
    if not (hasattr(selected, "coordinate") and selected.module in result.modules and selected.layer in result.layers
            and isinstance(selected.step, int) and 0 <= selected.step < K):
        raise TimeromeError(f"selected must be a cell of this trace (a Candidate of select_coordinate on it, or a "
                            f"Coordinate with a step), got {selected!r}")
    at = (result.modules.index(selected.module), result.layers.index(selected.layer), selected.step)
    drawn = float(magnitude[at])
    if abs(drawn - selected.mean_abs_tie) > 1e-4 * max(1.0, abs(drawn)):
        raise TimeromeError(f"selected's |TIE| {selected.mean_abs_tie:.4g} is not this trace's {drawn:.4g} at layer "
                            f"{selected.layer} {selected.module} step {selected.step}: it was selected on another trace")


def _cell(result, c: Coordinate, data, magnitude):
    """The Candidate of the trace's cell at Coordinate c (a layer, module and step it traced)."""
    M, Ly, K = data.shape
    if c.step is None or c.point not in result.modules or c.layer not in result.layers or not 0 <= c.step < K:
        raise TimeromeError(f"selected {c} is not a cell of this trace (modules {', '.join(result.modules)}, layers "
                            f"{result.layers[0]}..{result.layers[-1]}, steps 0..{K - 1}; a step is needed)")
    flat = (result.modules.index(c.point) * Ly + result.layers.index(c.layer)) * K + c.step
    return _candidate(result, flat, data, magnitude, torch.zeros_like(data))


def plot_per_fact(result, directory: str | Path, *, dpi: int = DPI) -> list[Path]:
    """One PNG per fact, named heatmap-<index>.png, in directory (result: a TraceResult or a saved one's path)."""
    result = trace_arg(result, "plot_per_fact's result", load=True)
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise TimeromeError(f"{d} is a file; give a directory for the per-fact heatmaps")
    return [plot_heatmaps(result, d / f"heatmap-{i}.png", fact=i, dpi=dpi) for i in range(len(result.fact_ids))]


def _positional_panels(fig, axes, result, fact, rows_label: bool = True) -> None:
    """ROME's drawing: one panel per module, rows = tokens (one fact) or ROME's six categories
    (the mean over facts), columns = layers; each panel its own scale from 0 (or its minimum)."""
    if fact is None:
        data, labels = result.mean().float().numpy(), list(result.CATEGORIES)  # [M, Ly, 6]
    else:
        i = result.fact_index(fact)
        info = result.facts[i]
        P = info["prompt_length"]
        subject = set(info["subject_positions"])
        data = result.effect[i, :, :, :P].float().numpy()
        labels = [f"{tok!r}{'*' if t in subject else ''}" for t, tok in enumerate(info["tokens"])]
    import numpy as np

    for m, ax in enumerate(axes):
        panel = data[m].T  # [rows, Ly]
        lo = min(0.0, float(np.nanmin(panel))) if np.isfinite(panel).any() else 0.0
        hi = float(np.nanmax(panel)) if np.isfinite(panel).any() else 1.0
        im = ax.imshow(panel, aspect="auto", cmap=ROME_CMAPS.get(result.modules[m], "Greys"), vmin=lo,
                       vmax=max(hi, lo + 1e-6), interpolation="nearest")
        mod = result.modules[m]
        win = "" if mod == "resid" else f", window {result.settings.get('window')}"
        ax.set_title(f"restoring {TITLES.get(mod, mod)}{win}", fontsize=9)
        ax.set_xlabel("layer")
        step = max(1, len(result.layers) // 10)
        ax.set_xticks(range(0, len(result.layers), step), [str(l) for l in result.layers[::step]])
        ax.set_yticks(range(len(labels)), labels if (rows_label or m == 0) else [""] * len(labels), fontsize=7)
        fig.colorbar(im, ax=ax, label="p(o) restored - corrupted", shrink=0.8)


def plot_positional(result, path: str | Path, *, fact: int | str | None = None, title: str | None = None,
                    dpi: int = DPI) -> Path:
    """ROME's causal-trace figure of a positional trace: the mean over facts by ROME's six token
    categories (fact=None), or one fact's tokens (subject tokens starred)."""
    M = len(result.modules)
    rows = 6 if fact is None else result.facts[result.fact_index(fact)]["prompt_length"]
    fig = figure(1.6 + 3.4 * M, 1.4 + 0.28 * max(rows, 5))
    axes = fig.subplots(1, M, squeeze=False)[0]
    _positional_panels(fig, axes, result, fact, rows_label=False)
    s = result.settings
    what = f"mean over {len(result.fact_ids)} facts" if fact is None else f"fact {result.fact_ids[result.fact_index(fact)]}"
    fig.suptitle(title or f"positional causal trace (ROME), {what}: {s.get('model')} "
                 f"({'autoregressive' if s.get('causal') else 'MDLM, answer fully masked'}; sigma={s.get('sigma', 0):.3g}, "
                 f"{s.get('n_samples')} noise samples)", fontsize=9)
    return save_png(fig, path, dpi)


def plot_compare(positional, tie_result, path: str | Path, *, dpi: int = DPI) -> Path:
    """The paper's Figure "heatmap_compare": the positional trace (ROME's protocol, top row) beside the
    diffusion-time TIE (bottom row) of the same facts on the same model, one panel per module."""
    if positional.fact_ids != tie_result.fact_ids:
        raise TimeromeError("plot_compare needs the two traces of the same facts (their fact ids differ)")
    M = max(len(positional.modules), len(tie_result.modules))
    fig = figure(1.6 + 3.4 * M, 6.4)
    top, bottom = fig.subfigures(2, 1)
    _positional_panels(top, top.subplots(1, len(positional.modules), squeeze=False)[0], positional, None, False)
    top.suptitle("positional trace (ROME): p(o_1) restored - corrupted, one forward", fontsize=9)
    data = tie_result.mean().float().numpy()  # [M, Ly, K]
    vmax = float(abs(data).max()) or 1.0
    axes = bottom.subplots(1, len(tie_result.modules), squeeze=False)[0]
    for m, ax in enumerate(axes):
        im = ax.imshow(data[m], origin="lower", aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax,
                       interpolation="nearest")
        ax.set_title(TITLES.get(tie_result.modules[m], tie_result.modules[m]), fontsize=9)
        ax.set_xlabel("denoising step k")
        ax.set_yticks(range(len(tie_result.layers)), [str(l) for l in tie_result.layers])
        if m == 0:
            ax.set_ylabel("layer")
    bottom.colorbar(im, ax=list(axes), label="TIE (nats)", shrink=0.8)
    bottom.suptitle("diffusion-time TIE (this toolkit): mean over facts", fontsize=9)
    fig.suptitle(f"{positional.settings.get('model')}: {len(positional.fact_ids)} facts", fontsize=10)
    return save_png(fig, path, dpi)

"""The figures every plot draws on: matplotlib's object interface (no pyplot state), PNG files with no
software stamp (the same bytes for the same figure)."""

from __future__ import annotations

from pathlib import Path

DPI = 110


def figure(w: float, h: float):
    """A w x h inch figure with constrained layout, drawn by Agg (no window, no global figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path, dpi: int = DPI) -> Path:
    """fig as a PNG at path (its folder made), without matplotlib's version in the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": None})
    return path

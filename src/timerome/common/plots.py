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


PNG_SIDE = 2**16  # the most pixels a side of an image matplotlib's Agg canvas and PNG writer take


def save_png(fig, path, dpi: int = DPI) -> Path:
    """fig as a PNG at path (its folder made), without matplotlib's version in the file. A dpi that is no
    positive number, or that makes a side of PNG_SIDE pixels or more, is one TimeromeError."""
    from timerome.common.checks import number
    from timerome.common.files import path_arg
    from timerome.errors import TimeromeError

    path = path_arg(path, "the figure's path")
    number(dpi, "dpi (the figure's dots per inch)", lo=0, lo_open=True)
    w, h = (float(x) * dpi for x in fig.get_size_inches())
    if max(w, h) >= PNG_SIDE:
        raise TimeromeError(f"dpi {dpi} makes a {w:.0f} x {h:.0f} pixel image, beyond the {PNG_SIDE} pixels a side "
                            f"an image takes: give a smaller dpi (default {DPI})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": None})
    return path

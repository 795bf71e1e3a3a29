"""timerome: diffusion-time causal tracing and inference-time edit memory for masked diffusion LMs.

The pipeline, one import each:  trace -> select_coordinate -> EditMemory -> evaluate (run_demo).
"""

from importlib import import_module

from timerome.backbones import Backbone, load_backbone
from timerome.coordinate import Coordinate
from timerome.errors import TimeromeError
from timerome.hooks import Hooks, Intervention, TraceState

__version__ = "0.1.0"

# name -> module; imported on first use so that `import timerome` stays light (no matplotlib, scipy)
_LAZY = {
    "generate": "timerome.sampler", "log_likelihood": "timerome.likelihood",
    "trace": "timerome.tracing", "TraceResult": "timerome.trace_result",
    "select_coordinate": "timerome.selection", "per_fact_best": "timerome.selection",
    "plot_heatmaps": "timerome.heatmaps",
    "EditMemory": "timerome.edit_memory", "GatedEdit": "timerome.gated_edit",
    "forget_task": "timerome.task", "ForgetTask": "timerome.task", "requests_task": "timerome.task",
    "load_requests": "timerome.data.requests", "RewriteMemory": "timerome.rewrite_memory",
    "CodebookMemory": "timerome.codebook_memory",
    "evaluate": "timerome.evaluation", "run_experiment": "timerome.experiments", "run_demo": "timerome.demo",
}

__all__ = ["Backbone", "load_backbone", "Coordinate", "TimeromeError", "Hooks", "Intervention", "TraceState",
           "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'timerome' has no attribute {name!r}")

"""timerome: diffusion-time causal tracing and inference-time edit memory for masked diffusion LMs.

The pipeline, one import each:  trace -> select_coordinate -> EditMemory -> evaluate (run_demo).
"""

from importlib import import_module

__version__ = "0.1.0"

# name -> module; imported on first use so that `import timerome` stays light (no torch until a name is
# used: the `timerome` command's entry, __main__.main, answers a Ctrl-C during its imports in one line)
_LAZY = {
    "Backbone": "timerome.backbones", "load_backbone": "timerome.backbones",
    "Coordinate": "timerome.engine.coordinate", "TimeromeError": "timerome.errors",
    "Hooks": "timerome.engine.hooks", "Intervention": "timerome.engine.hooks", "TraceState": "timerome.engine.hooks",
    "generate": "timerome.engine.sampler", "log_likelihood": "timerome.engine.likelihood",
    "trace": "timerome.tracing.causal_trace", "TraceResult": "timerome.tracing.result",
    "select_coordinate": "timerome.tracing.selection", "per_fact_best": "timerome.tracing.selection",
    "runner_up": "timerome.tracing.selection",
    "plot_heatmaps": "timerome.tracing.heatmaps",
    "EditMemory": "timerome.memory.edit_memory", "GatedEdit": "timerome.memory.gated_edit",
    "forget_task": "timerome.data.task", "ForgetTask": "timerome.data.task", "requests_task": "timerome.data.task",
    "load_requests": "timerome.data.requests", "RewriteMemory": "timerome.memory.rewrite_memory",
    "CodebookMemory": "timerome.memory.codebook_memory",
    "evaluate": "timerome.evaluation.evaluator", "eval_rows": "timerome.evaluation.evaluator",
    "reference_truth_ratios": "timerome.evaluation.evaluator", "load_memory": "timerome.memory.memory_file",
    "evaluate_benchmark": "timerome.experiments.bench_eval", "load_benchmark": "timerome.experiments.bench_eval",
    "run_experiment": "timerome.experiments", "run_demo": "timerome.demo",
    "keep_freed_memory": "timerome.common.allocator",
}

__all__ = ["__version__", *_LAZY]


def __dir__():  # the lazy names too: tab completion and dir() list what `timerome.X` gives
    return sorted({*globals(), *_LAZY})


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'timerome' has no attribute {name!r}")
